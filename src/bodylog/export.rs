//! The listener's `/metrics`: what the OpenResty gateway's exporter derived from the
//! records, counted as each record is written (so the numbers are exactly
//! those of the files): requests, tokens (prompt, cached, completion) and
//! latency histograms by route, model, owner and status.
//!
//! The model is whatever clients put in their bodies, so distinct models
//! are capped per route ([`MAX_MODELS_PER_ROUTE`], then `other`) and every
//! label value is cut to [`MAX_LABEL_BYTES`].

use super::record::Summary;
use parking_lot::Mutex;
use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry, TextEncoder,
};
use std::collections::{HashMap, HashSet};

pub const MAX_MODELS_PER_ROUTE: usize = 200;
pub const MAX_LABEL_BYTES: usize = 128;
const LABELS: [&str; 4] = ["route", "model", "owner", "status"];

pub struct Exporter {
    registry: Registry,
    requests: IntCounterVec,
    prompt_tokens: IntCounterVec,
    cached_tokens: IntCounterVec,
    completion_tokens: IntCounterVec,
    duration: HistogramVec,
    first_chunk: HistogramVec,
    records: IntCounterVec,
    models: Mutex<HashMap<String, HashSet<String>>>,
}

impl Default for Exporter {
    fn default() -> Self {
        Self::new()
    }
}

impl Exporter {
    pub fn new() -> Self {
        let registry = Registry::new();
        let counter = |name: &str, help: &str, labels: &[&str]| {
            let c = IntCounterVec::new(Opts::new(name, help), labels)
                .expect("static metric definition");
            registry
                .register(Box::new(c.clone()))
                .expect("metric registered once");
            c
        };
        let latency = vec![
            0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
        ];
        let histogram = |name: &str, help: &str| {
            let h = HistogramVec::new(
                HistogramOpts::new(name, help).buckets(latency.clone()),
                &LABELS,
            )
            .expect("static metric definition");
            registry
                .register(Box::new(h.clone()))
                .expect("metric registered once");
            h
        };
        Exporter {
            requests: counter("llm_bodylog_requests_total", "Requests recorded", &LABELS),
            prompt_tokens: counter(
                "llm_bodylog_prompt_tokens_total",
                "Prompt tokens of the recorded requests",
                &LABELS,
            ),
            cached_tokens: counter(
                "llm_bodylog_cached_tokens_total",
                "Prompt tokens served from the engine's prefix cache",
                &LABELS,
            ),
            completion_tokens: counter(
                "llm_bodylog_completion_tokens_total",
                "Completion tokens of the recorded requests",
                &LABELS,
            ),
            duration: histogram(
                "llm_bodylog_request_duration_seconds",
                "Request time as the gateway measured it (rt)",
            ),
            first_chunk: histogram(
                "llm_bodylog_first_chunk_seconds",
                "Request start to the first response body chunk from the engine",
            ),
            records: counter(
                "llm_bodylog_records_total",
                "Frames received: written as a record, or bad (not a frame, meta not JSON)",
                &["result"],
            ),
            models: Mutex::new(HashMap::new()),
            registry,
        }
    }

    /// Counts one written record.
    pub fn observe(&self, s: &Summary) {
        let model = self.model_label(&s.route, &s.model);
        let labels = [cut(&s.route), model.as_str(), cut(&s.owner), cut(&s.status)];
        self.requests.with_label_values(&labels).inc();
        self.prompt_tokens
            .with_label_values(&labels)
            .inc_by(s.prompt_tokens);
        self.cached_tokens
            .with_label_values(&labels)
            .inc_by(s.cached_tokens);
        self.completion_tokens
            .with_label_values(&labels)
            .inc_by(s.completion_tokens);
        if let Some(rt) = s.rt {
            self.duration.with_label_values(&labels).observe(rt);
        }
        if let Some(t) = s.first_chunk_t {
            self.first_chunk.with_label_values(&labels).observe(t);
        }
        self.records.with_label_values(&["written"]).inc();
    }

    pub fn bad_frame(&self) {
        self.records.with_label_values(&["bad"]).inc();
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        // Encoding our own registry into a Vec cannot fail.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        out
    }

    fn model_label(&self, route: &str, model: &str) -> String {
        let model = cut(model);
        let mut models = self.models.lock();
        let seen = models.entry(cut(route).to_string()).or_default();
        if seen.contains(model) {
            return model.to_string();
        }
        if seen.len() >= MAX_MODELS_PER_ROUTE {
            return "other".into();
        }
        seen.insert(model.to_string());
        model.to_string()
    }
}

fn cut(value: &str) -> &str {
    if value.len() <= MAX_LABEL_BYTES {
        return value;
    }
    let end = (0..=MAX_LABEL_BYTES)
        .rev()
        .find(|&i| value.is_char_boundary(i))
        .unwrap_or(0);
    &value[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(model: &str, prompt: u64) -> Summary {
        Summary {
            route: "r".into(),
            model: model.into(),
            owner: "alice".into(),
            status: "200".into(),
            rt: Some(0.2),
            first_chunk_t: Some(0.1),
            prompt_tokens: prompt,
            cached_tokens: 1,
            completion_tokens: 2,
        }
    }

    fn sample(text: &str, line_start: &str) -> f64 {
        text.lines()
            .find(|l| l.starts_with(line_start))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    }

    #[test]
    fn counts_by_route_model_owner_status() {
        let e = Exporter::new();
        e.observe(&summary("m", 10));
        e.observe(&summary("m", 5));
        e.bad_frame();
        let text = String::from_utf8(e.encode()).unwrap();
        let labels = r#"{model="m",owner="alice",route="r",status="200"}"#;
        assert_eq!(
            sample(&text, &format!("llm_bodylog_requests_total{labels}")),
            2.0
        );
        assert_eq!(
            sample(&text, &format!("llm_bodylog_prompt_tokens_total{labels}")),
            15.0
        );
        assert_eq!(
            sample(&text, &format!("llm_bodylog_cached_tokens_total{labels}")),
            2.0
        );
        assert_eq!(
            sample(
                &text,
                &format!("llm_bodylog_completion_tokens_total{labels}")
            ),
            4.0
        );
        assert_eq!(
            sample(
                &text,
                &format!("llm_bodylog_request_duration_seconds_count{labels}")
            ),
            2.0
        );
        assert_eq!(
            sample(&text, "llm_bodylog_records_total{result=\"bad\"}"),
            1.0
        );
        assert_eq!(
            sample(&text, "llm_bodylog_records_total{result=\"written\"}"),
            2.0
        );
    }

    #[test]
    fn client_chosen_models_are_capped_per_route() {
        let e = Exporter::new();
        for i in 0..MAX_MODELS_PER_ROUTE + 5 {
            e.observe(&summary(&format!("m{i}"), 1));
        }
        e.observe(&summary("m0", 1));
        let text = String::from_utf8(e.encode()).unwrap();
        let other =
            r#"llm_bodylog_requests_total{model="other",owner="alice",route="r",status="200"}"#;
        assert_eq!(sample(&text, other), 5.0);
        let first =
            r#"llm_bodylog_requests_total{model="m0",owner="alice",route="r",status="200"}"#;
        assert_eq!(sample(&text, first), 2.0, "a known model keeps its label");
        assert_eq!(cut(&"é".repeat(100)).len(), MAX_LABEL_BYTES);
    }
}
