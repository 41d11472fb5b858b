//! Prometheus metrics (prefix `llm_gateway_`).
//!
//! Counters are bumped on the request path. Gauges that mirror runtime state
//! (in-flight, readiness, session bindings) are filled from the registry at
//! scrape time instead, so the hot path pays nothing for them and a peer that
//! leaves the config leaves the output too.
//!
//! Labels carry route and peer *names* only, never a session id or a key.

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
    TextEncoder,
};
use std::sync::LazyLock;

pub struct Metrics {
    registry: Registry,
    pub requests: IntCounterVec,
    pub request_duration: HistogramVec,
    pub reloads: IntCounterVec,
    pub in_flight: IntGaugeVec,
    pub peer_ready: IntGaugeVec,
    pub session_bindings: IntGaugeVec,
    pub placements: IntCounterVec,
    pub prompt_tokens: IntCounterVec,
    pub cached_prompt_tokens: IntCounterVec,
    pub completion_tokens: IntCounterVec,
    pub ttft: HistogramVec,
    pub queue_wait: HistogramVec,
    pub ttft_by_pool: HistogramVec,
    pub load_rejections: IntCounterVec,
    pub decode_rate: HistogramVec,
    pub api_keys_configured: IntGauge,
    pub watching: IntGauge,
    pub auth: IntCounterVec,
    pub rejections: IntCounterVec,
    pub bodylog_frames: IntCounterVec,
    pub prefix_rewrites: IntCounterVec,
    pub session_store_up: IntGauge,
    pub session_store_errors: IntCounterVec,
    pub session_store_wait: HistogramVec,
    pub session_store_ops: IntCounterVec,
}

fn counter(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), labels).expect("static metric definition");
    registry
        .register(Box::new(c.clone()))
        .expect("metric registered once");
    c
}

fn gauge(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    let g = IntGaugeVec::new(Opts::new(name, help), labels).expect("static metric definition");
    registry
        .register(Box::new(g.clone()))
        .expect("metric registered once");
    g
}

fn histogram(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
    buckets: Vec<f64>,
) -> HistogramVec {
    let h = HistogramVec::new(HistogramOpts::new(name, help).buckets(buckets), labels)
        .expect("static metric definition");
    registry
        .register(Box::new(h.clone()))
        .expect("metric registered once");
    h
}

/// The seed's buckets plus its overflow bucket (twice the last bound).
fn with_overflow(bounds: &[f64]) -> Vec<f64> {
    let mut out = bounds.to_vec();
    out.extend(bounds.last().map(|b| b * 2.0));
    out
}

impl Metrics {
    fn new() -> Self {
        let registry = Registry::new();
        let latency_buckets = vec![
            0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
        ];
        let api_keys_configured = IntGauge::new(
            "llm_gateway_api_keys_configured",
            "1 when a readable API key file with at least one key is loaded",
        )
        .expect("static metric definition");
        registry
            .register(Box::new(api_keys_configured.clone()))
            .expect("metric registered once");
        let watching = IntGauge::new(
            "llm_gateway_config_watch_active",
            "1 while routes_dir and the key files are watched for changes (watch: true and the watcher started)",
        )
        .expect("static metric definition");
        registry
            .register(Box::new(watching.clone()))
            .expect("metric registered once");
        Metrics {
            requests: counter(
                &registry,
                "llm_gateway_requests_total",
                "Requests answered, by route, peer (\"-\" when none was chosen) and status code",
                &["route", "peer", "code"],
            ),
            request_duration: histogram(
                &registry,
                "llm_gateway_request_duration_seconds",
                "Time from request start to the last response byte",
                &["route"],
                latency_buckets.clone(),
            ),
            reloads: counter(
                &registry,
                "llm_gateway_reloads_total",
                "Route and key reloads by trigger (start, signal, watch); result=error counts reloads in which at least one file was rejected",
                &["trigger", "result"],
            ),
            in_flight: gauge(
                &registry,
                "llm_gateway_in_flight",
                "Requests in flight through this gateway",
                &["route", "peer"],
            ),
            peer_ready: gauge(
                &registry,
                "llm_gateway_peer_ready",
                "1 when the peer is ready (not banned)",
                &["route", "peer"],
            ),
            session_bindings: gauge(
                &registry,
                "llm_gateway_session_bindings",
                "Sessions remembered on each peer (used within idle_timeout)",
                &["route", "peer"],
            ),
            placements: counter(
                &registry,
                "llm_gateway_placements_total",
                "Placement decisions by kind (new, sticky, spill, migrated, ...) and reason",
                &["route", "peer", "kind", "reason"],
            ),
            prompt_tokens: counter(
                &registry,
                "llm_gateway_prompt_tokens_total",
                "Prompt tokens reported by engines in usage",
                &["route", "peer"],
            ),
            cached_prompt_tokens: counter(
                &registry,
                "llm_gateway_cached_prompt_tokens_total",
                "Prompt tokens the engine served from its prefix cache",
                &["route", "peer"],
            ),
            completion_tokens: counter(
                &registry,
                "llm_gateway_completion_tokens_total",
                "Completion tokens reported by engines in usage",
                &["route", "peer"],
            ),
            ttft: histogram(
                &registry,
                "llm_gateway_time_to_first_token_seconds",
                "Time from request start to the first streamed content event",
                &["route"],
                latency_buckets,
            ),
            queue_wait: histogram(
                &registry,
                "llm_gateway_queue_wait_seconds",
                "Time a request waited in its route's admission queue (placed or refused after it)",
                &["route"],
                vec![0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0],
            ),
            ttft_by_pool: histogram(
                &registry,
                "llm_gateway_ttft_seconds",
                "Time from sending a request upstream to its first content frame (2xx streams)",
                &["route", "pool", "peer"],
                with_overflow(crate::protect::window::TTFT_MS_BUCKETS)
                    .into_iter()
                    .map(|ms| ms / 1000.0)
                    .collect(),
            ),
            decode_rate: histogram(
                &registry,
                "llm_gateway_decode_tokens_per_second",
                "Completion tokens per second from first to last content frame (2xx streams, 16+ tokens, 0.5 s+ of decode)",
                &["route", "pool", "peer"],
                with_overflow(crate::protect::window::TPS_BUCKETS),
            ),
            load_rejections: counter(
                &registry,
                "llm_gateway_load_rejections_total",
                "Requests refused by a load gate (concurrency, session_prio, ttft, tps)",
                &["route", "gate"],
            ),
            auth: counter(
                &registry,
                "llm_gateway_auth_total",
                "API key checks by result (ok, missing, invalid) and key owner (\"-\" unless ok)",
                &["route", "owner", "result"],
            ),
            rejections: counter(
                &registry,
                "llm_gateway_rejected_by_rule_total",
                "Requests refused by a content reject rule",
                &["route", "rule"],
            ),
            bodylog_frames: counter(
                &registry,
                "llm_gateway_bodylog_frames_total",
                "Body-log frames: sent to the listener, dropped (queue full), or error (write failed)",
                &["result"],
            ),
            prefix_rewrites: counter(
                &registry,
                "llm_gateway_prefix_rewrites_total",
                "Request bodies changed by a prefix-stability transform (cch_strip, kimi_normalize)",
                &["route", "transform"],
            ),
            session_store_up: {
                let g = IntGauge::new(
                    "llm_gateway_session_store_up",
                    "1 while the shared session store (Redis) answers; 0 while requests are placed from the local table",
                )
                .expect("static metric definition");
                registry
                    .register(Box::new(g.clone()))
                    .expect("metric registered once");
                g
            },
            session_store_errors: counter(
                &registry,
                "llm_gateway_session_store_errors_total",
                "Shared session store commands that failed or timed out, by operation",
                &["op"],
            ),
            session_store_wait: histogram(
                &registry,
                "llm_gateway_session_store_wait_seconds",
                "Time a request waited on the shared session store before placement (0 when its binding was agreed within the last second)",
                &["route"],
                vec![
                    0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5,
                    0.005, 0.01, 0.02, 0.05, 0.1,
                ],
            ),
            session_store_ops: counter(
                &registry,
                "llm_gateway_session_store_ops_total",
                "Commands (or pipelines) sent to the shared session store, by operation",
                &["op"],
            ),
            api_keys_configured,
            watching,
            registry,
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(16 * 1024);
        // Encoding our own registry into a Vec cannot fail.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        out
    }
}

/// The process-wide metrics.
pub fn metrics() -> &'static Metrics {
    static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);
    &METRICS
}
