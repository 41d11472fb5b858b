//! One request's span, from what its end already gathered for the access
//! log (`accesslog::line::Line`, built once in `proxy/response/access.rs`)
//! and the instants its phases ended at ([`Timeline`]). Pure: no clock is
//! read here, so the tests give the times.
//!
//! Attribute names follow OpenTelemetry's semantic conventions where one
//! exists (HTTP: `http.request.method`, `url.path`,
//! `http.response.status_code`; GenAI: `gen_ai.request.model`,
//! `gen_ai.usage.input_tokens`, `…output_tokens`,
//! `gen_ai.usage.cache_read.input_tokens`), and are the gateway's own,
//! under `llm_gateway.`, for what none names (the route, the peer, the
//! placement, the session's hash). Like the access log, a span carries the
//! session's hash and the key's owner, never the session id or the key.

use super::proto::{self, span::Event, span::SpanKind, status::StatusCode, KeyValue, Span};
use crate::accesslog::line::Line;
use crate::trace_context::TraceContext;
use std::time::{Duration, Instant};

/// When each phase of a request ended, as far as it got; recorded only for
/// a request whose span is exported (`RequestCtx::phases`).
#[derive(Debug, Clone, Copy)]
pub struct Timeline {
    /// The request's head arrived (the span's start).
    pub started: Instant,
    /// Its body was read whole.
    pub body_read: Option<Instant>,
    /// The load gates let it through.
    pub gated: Option<Instant>,
    /// A peer was chosen and a slot reserved (after any queue wait).
    pub placed: Option<Instant>,
    /// Pingora was asked to connect to the peer (the last attempt's).
    pub connecting: Option<Instant>,
    /// The head went to the engine: connected (or a pooled connection
    /// reused).
    pub sent: Option<Instant>,
    /// The engine's response head arrived.
    pub engine_head: Option<Instant>,
    /// The first content frame (the first token).
    pub first_token: Option<Instant>,
    /// The last content frame.
    pub last_token: Option<Instant>,
    /// The request ended (the span's end).
    pub ended: Instant,
    /// `ended` on the system clock, in nanoseconds since the Unix epoch:
    /// the anchor every instant above is told from.
    pub ended_unix_nanos: u64,
}

impl Timeline {
    /// `at` on the system clock, in nanoseconds since the Unix epoch.
    fn unix_nanos(&self, at: Instant) -> u64 {
        let before_end = self.ended.saturating_duration_since(at).as_nanos();
        self.ended_unix_nanos
            .saturating_sub(u64::try_from(before_end).unwrap_or(u64::MAX))
    }
}

/// The span of a request: kind SERVER, the gateway's own span of the trace
/// (`trace.span_id`), a child of the client's span when the trace was
/// continued. `trace_state` is the client's `tracestate`, kept with its
/// trace.
pub fn build(line: &Line, trace: &TraceContext, trace_state: &str, times: &Timeline) -> Span {
    let mut attributes = Vec::with_capacity(28);
    push_request(&mut attributes, line);
    push_genai(&mut attributes, line);
    let decode_rate = decode_rate(line, times);
    if let Some(ttft) = line.ttft_ms {
        attributes.push(proto::double("llm_gateway.ttft_ms", ttft));
    }
    if let Some(rate) = decode_rate {
        attributes.push(proto::double("llm_gateway.decode_tokens_per_second", rate));
    }
    let server_error = line.status >= 500 || line.error == Some("stream_cut");
    let status = proto::Status {
        code: (if server_error {
            StatusCode::Error
        } else {
            StatusCode::Unset
        }) as i32,
        message: if server_error {
            line.error.unwrap_or_default().to_string()
        } else {
            String::new()
        },
    };
    // W3C flags in the low byte; then that the parent's remoteness is
    // known (0x100) and whether it is remote (0x200): a continued trace's
    // parent is the client's span.
    let remote = if trace.continued() { 0x300 } else { 0x100 };
    Span {
        trace_id: trace.trace_id.to_be_bytes().to_vec(),
        span_id: trace.span_id.to_be_bytes().to_vec(),
        trace_state: trace_state.to_string(),
        parent_span_id: trace
            .parent_id
            .map_or_else(Vec::new, |p| p.to_be_bytes().to_vec()),
        flags: u32::from(trace.flags) | remote,
        name: match line.route {
            // As HTTP's conventions name a server span: the method and a
            // route of few values, never the path itself.
            Some(route) => {
                let mut name = String::with_capacity(line.method.len() + 1 + route.len());
                name.push_str(line.method);
                name.push(' ');
                name.push_str(route);
                name
            }
            None => line.method.to_string(),
        },
        kind: SpanKind::Server as i32,
        start_time_unix_nano: times.unix_nanos(times.started),
        end_time_unix_nano: times.ended_unix_nanos,
        attributes,
        events: events(line, times, decode_rate),
        status: Some(status),
        ..Default::default()
    }
}

/// HTTP's and the gateway's attributes of the exchange.
fn push_request(out: &mut Vec<KeyValue>, line: &Line) {
    out.push(proto::text("http.request.method", line.method));
    out.push(proto::text("url.path", line.path.as_ref()));
    if line.status != 0 {
        out.push(proto::int(
            "http.response.status_code",
            i64::from(line.status),
        ));
    }
    out.push(proto::int(
        "http.response.body.size",
        i64::try_from(line.bytes_out).unwrap_or(i64::MAX),
    ));
    out.push(proto::text("llm_gateway.request_id", line.request_id));
    out.push(proto::text("llm_gateway.routed_mode", line.mode));
    let optional = [
        ("llm_gateway.route", line.route),
        ("llm_gateway.peer", line.peer),
        ("llm_gateway.peer.address", line.peer_addr.as_deref()),
        ("llm_gateway.placement_reason", line.reason),
        ("llm_gateway.session.hash", line.session.as_deref()),
        ("llm_gateway.session.source", line.session_source),
        ("llm_gateway.key_owner", line.owner.as_deref()),
        ("error.type", line.error),
    ];
    for (key, value) in optional {
        if let Some(value) = value {
            out.push(proto::text(key, value));
        }
    }
    if let Some(queue) = line.queue_ms {
        out.push(proto::double("llm_gateway.queue_ms", queue));
    }
    if line.retries > 0 {
        out.push(proto::int("llm_gateway.retries", i64::from(line.retries)));
    }
}

/// OpenTelemetry's GenAI attributes: the model asked for and the usage the
/// engine reported.
fn push_genai(out: &mut Vec<KeyValue>, line: &Line) {
    if let Some(model) = line.model {
        out.push(proto::text("gen_ai.request.model", model));
    }
    let usage = [
        ("gen_ai.usage.input_tokens", line.prompt_tokens),
        ("gen_ai.usage.output_tokens", line.completion_tokens),
        ("gen_ai.usage.cache_read.input_tokens", line.cached_tokens),
    ];
    for (key, tokens) in usage {
        if let Some(tokens) = tokens {
            out.push(proto::int(key, i64::try_from(tokens).unwrap_or(i64::MAX)));
        }
    }
}

/// Output tokens a second from the first token to the last, when the
/// stream had both and the engine reported its output.
fn decode_rate(line: &Line, times: &Timeline) -> Option<f64> {
    let (first, last) = (times.first_token?, times.last_token?);
    let decode = last.saturating_duration_since(first);
    let tokens = line.completion_tokens?;
    (decode > Duration::ZERO && tokens > 1).then(|| (tokens - 1) as f64 / decode.as_secs_f64())
}

/// An event at each phase's end that the request reached, in order.
fn events(line: &Line, times: &Timeline, decode_rate: Option<f64>) -> Vec<Event> {
    let ms = |from: Instant, to: Instant| {
        crate::accesslog::line::millis(to.saturating_duration_since(from))
    };
    let mut out = Vec::with_capacity(7);
    let mut at = |name: &str, when: Option<Instant>, attributes: Vec<KeyValue>| {
        if let Some(when) = when {
            out.push(Event {
                time_unix_nano: times.unix_nanos(when),
                name: name.to_string(),
                attributes,
                ..Default::default()
            });
        }
    };
    at("body_read", times.body_read, Vec::new());
    at("gates_passed", times.gated, Vec::new());
    let queue = line
        .queue_ms
        .map(|q| vec![proto::double("llm_gateway.queue_ms", q)]);
    at("placed", times.placed, queue.unwrap_or_default());
    let connect = times
        .connecting
        .zip(times.sent)
        .map(|(from, to)| vec![proto::double("llm_gateway.connect_ms", ms(from, to))]);
    at("upstream_sent", times.sent, connect.unwrap_or_default());
    at("engine_head", times.engine_head, Vec::new());
    let ttft = line
        .ttft_ms
        .map(|t| vec![proto::double("llm_gateway.ttft_ms", t)]);
    at("first_token", times.first_token, ttft.unwrap_or_default());
    let rate = decode_rate.map(|r| vec![proto::double("llm_gateway.decode_tokens_per_second", r)]);
    at("stream_end", times.last_token, rate.unwrap_or_default());
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::any_value::Value;

    fn line() -> Line<'static> {
        Line {
            time: String::new(),
            request_id: "req-1",
            trace_id: None,
            method: "POST",
            path: "/chat/v1/chat/completions".into(),
            route: Some("chat"),
            status: 200,
            peer: Some("e0"),
            peer_addr: Some("10.0.0.1:8000".into()),
            mode: "sticky",
            reason: Some("bound"),
            session: Some("00000000000000ff".into()),
            session_source: Some("header:x-session-id"),
            owner: Some("alice".into()),
            model: Some("m"),
            prompt_tokens: Some(11),
            cached_tokens: Some(3),
            completion_tokens: Some(21),
            ttft_ms: Some(50.0),
            duration_ms: 1050.0,
            queue_ms: Some(5.0),
            bytes_out: 10,
            retries: 0,
            error: None,
        }
    }

    fn times(start: Instant) -> Timeline {
        let at = |ms: u64| Some(start + Duration::from_millis(ms));
        Timeline {
            started: start,
            body_read: at(1),
            gated: at(2),
            placed: at(7),
            connecting: at(8),
            sent: at(10),
            engine_head: at(20),
            first_token: at(50),
            last_token: at(1050),
            ended: start + Duration::from_millis(1050),
            ended_unix_nanos: 1_000_000_000_000,
        }
    }

    fn attr<'a>(span: &'a Span, key: &str) -> Option<&'a Value> {
        span.attributes
            .iter()
            .find(|kv| kv.key == key)
            .and_then(|kv| kv.value.as_ref()?.value.as_ref())
    }

    #[test]
    fn a_continued_requests_span_carries_its_trace_attributes_and_phases() {
        let trace = TraceContext {
            trace_id: 0x4bf92f3577b34da6a3ce929d0e0e4736,
            parent_id: Some(0x00f067aa0ba902b7),
            span_id: 0x1122334455667788,
            flags: 1,
        };
        let start = Instant::now();
        let span = build(&line(), &trace, "vendor=abc", &times(start));
        assert_eq!(hex(&span.trace_id), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(hex(&span.span_id), "1122334455667788");
        assert_eq!(hex(&span.parent_span_id), "00f067aa0ba902b7");
        assert_eq!(span.trace_state, "vendor=abc");
        assert_eq!(span.flags, 0x301, "sampled, with a remote parent");
        assert_eq!(span.kind, SpanKind::Server as i32);
        assert_eq!(span.name, "POST chat");
        assert_eq!(
            (span.start_time_unix_nano, span.end_time_unix_nano),
            (1_000_000_000_000 - 1_050_000_000, 1_000_000_000_000)
        );
        let int = |k: &str| match attr(&span, k) {
            Some(Value::IntValue(v)) => Some(*v),
            _ => None,
        };
        let text = |k: &str| match attr(&span, k) {
            Some(Value::StringValue(v)) => Some(v.as_str()),
            _ => None,
        };
        assert_eq!(int("gen_ai.usage.input_tokens"), Some(11));
        assert_eq!(int("gen_ai.usage.output_tokens"), Some(21));
        assert_eq!(int("gen_ai.usage.cache_read.input_tokens"), Some(3));
        assert_eq!(int("http.response.status_code"), Some(200));
        assert_eq!(text("gen_ai.request.model"), Some("m"));
        assert_eq!(text("url.path"), Some("/chat/v1/chat/completions"));
        assert_eq!(text("llm_gateway.session.hash"), Some("00000000000000ff"));
        assert_eq!(text("llm_gateway.key_owner"), Some("alice"));
        assert_eq!(text("llm_gateway.placement_reason"), Some("bound"));
        assert_eq!(text("llm_gateway.routed_mode"), Some("sticky"));
        assert_eq!(attr(&span, "error.type"), None);
        // 20 tokens after the first, over one second.
        assert_eq!(
            attr(&span, "llm_gateway.decode_tokens_per_second"),
            Some(&Value::DoubleValue(20.0))
        );
        let names: Vec<&str> = span.events.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "body_read",
                "gates_passed",
                "placed",
                "upstream_sent",
                "engine_head",
                "first_token",
                "stream_end"
            ]
        );
        let times: Vec<u64> = span.events.iter().map(|e| e.time_unix_nano).collect();
        assert!(times.windows(2).all(|w| w[0] <= w[1]), "{times:?}");
        assert_eq!(
            span.events[5].time_unix_nano,
            span.start_time_unix_nano + 50_000_000
        );
        assert_eq!(span.status.map(|s| s.code), Some(StatusCode::Unset as i32));
    }

    #[test]
    fn a_started_trace_has_no_parent_and_a_local_failure_is_an_error() {
        let trace = TraceContext {
            trace_id: 7,
            parent_id: None,
            span_id: 9,
            flags: 1,
        };
        let mut failed = line();
        failed.status = 503;
        failed.error = Some("no_healthy_upstream");
        failed.route = None;
        let start = Instant::now();
        let mut t = times(start);
        (t.sent, t.engine_head, t.first_token, t.last_token) = (None, None, None, None);
        let span = build(&failed, &trace, "", &t);
        assert!(span.parent_span_id.is_empty());
        assert_eq!(span.flags, 0x101);
        assert_eq!(span.name, "POST");
        let status = span.status.clone().expect("a status");
        assert_eq!(
            (status.code, status.message.as_str()),
            (StatusCode::Error as i32, "no_healthy_upstream")
        );
        assert_eq!(
            attr(&span, "error.type"),
            Some(&Value::StringValue("no_healthy_upstream".into()))
        );
        assert!(span.events.iter().all(|e| e.name != "first_token"));
        assert_eq!(attr(&span, "llm_gateway.decode_tokens_per_second"), None);
    }

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }
}
