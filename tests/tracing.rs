//! OpenTelemetry spans over OTLP/HTTP, through the real binary: a test
//! collector (a small HTTP server here, decoding the protobuf with the
//! gateway's own prost types) receives the span of a streamed request with
//! its attributes and phases, and nothing of the raw session id or key;
//! the engine is told the same trace; sampling by ratio for the traces the
//! gateway starts, by the client's flag for the ones it continues; nothing
//! without `tracing:`; and a collector that never answers costs spans
//! (dropped, counted), never a request.

mod common;

use common::canned::{canned_route, Canned};
use common::traced::{
    chat, header_of, keys_env, sse_engine, traceparent_fields, CLIENT_SPAN, TRACE_ID,
};
use common::*;
use llm_gateway::otlp::proto::{any_value::Value, ExportTraceServiceRequest, Message, Span};
use parking_lot::Mutex;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;

const CHAT: &str = "/chat/v1/chat/completions";
/// One export as the collector received it.
struct Export {
    path: String,
    content_type: Option<String>,
    body: Vec<u8>,
}

/// A test OTLP/HTTP receiver: answers each POST 200 (keeping the
/// connection), or, stalled, reads the request and never answers.
struct Collector {
    port: u16,
    exports: Arc<Mutex<Vec<Export>>>,
    connections: Arc<Mutex<usize>>,
}

impl Collector {
    fn start(stalled: bool) -> Collector {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind collector");
        let port = listener.local_addr().expect("addr").port();
        let exports = Arc::new(Mutex::new(Vec::new()));
        let connections = Arc::new(Mutex::new(0));
        let (got, count) = (Arc::clone(&exports), Arc::clone(&connections));
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                *count.lock() += 1;
                let got = Arc::clone(&got);
                std::thread::spawn(move || serve(stream, &got, stalled));
            }
        });
        Collector {
            port,
            exports,
            connections,
        }
    }

    fn config(&self, extra: &str) -> String {
        self.config_every("20ms", extra)
    }

    /// `tracing:` to this collector, a batch going at least every `interval`.
    fn config_every(&self, interval: &str, extra: &str) -> String {
        format!(
            "tracing:\n  endpoint: http://127.0.0.1:{}/v1/traces\n  export_interval: {interval}\n{extra}",
            self.port
        )
    }

    /// Every span received so far, in order.
    fn spans(&self) -> Vec<Span> {
        self.exports
            .lock()
            .iter()
            .flat_map(|e| {
                let request = ExportTraceServiceRequest::decode(e.body.as_slice())
                    .expect("an ExportTraceServiceRequest");
                request
                    .resource_spans
                    .into_iter()
                    .flat_map(|r| r.scope_spans)
                    .flat_map(|s| s.spans)
            })
            .collect()
    }

    fn wait_spans(&self, n: usize) -> Vec<Span> {
        wait_for(&format!("{n} span(s) at the collector"), DEADLINE, || {
            let spans = self.spans();
            (spans.len() >= n).then_some(spans)
        })
    }
}

/// Reads requests off one connection; answers each unless `stalled`.
fn serve(stream: TcpStream, got: &Mutex<Vec<Export>>, stalled: bool) {
    let Ok(mut writer) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    loop {
        let mut request_line = String::new();
        if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
            return;
        }
        let path = request_line
            .split_whitespace()
            .nth(1)
            .unwrap_or_default()
            .to_string();
        let (mut length, mut content_type) = (0usize, None);
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some((name, value)) = line.split_once(':') {
                match name.trim().to_ascii_lowercase().as_str() {
                    "content-length" => length = value.trim().parse().unwrap_or(0),
                    "content-type" => content_type = Some(value.trim().to_string()),
                    _ => {}
                }
            }
        }
        let mut body = vec![0; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        if stalled {
            // Hold the connection open, unanswered, until the gateway
            // gives up on it.
            let mut rest = Vec::new();
            let _ = reader.read_to_end(&mut rest);
            return;
        }
        got.lock().push(Export {
            path,
            content_type,
            body,
        });
        let answer =
            "HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n";
        if writer.write_all(answer.as_bytes()).is_err() {
            return;
        }
    }
}

/// The `traceparent` fields of every request the engine received.
fn engine_traces(engine: &Canned) -> Vec<[String; 4]> {
    engine
        .heads
        .lock()
        .iter()
        .map(|head| traceparent_fields(&header_of(head, "traceparent").expect("a traceparent")))
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn attr<'a>(span: &'a Span, key: &str) -> Option<&'a Value> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref()?.value.as_ref())
}

fn text<'a>(span: &'a Span, key: &str) -> Option<&'a str> {
    match attr(span, key) {
        Some(Value::StringValue(s)) => Some(s),
        _ => None,
    }
}

fn int(span: &Span, key: &str) -> Option<i64> {
    match attr(span, key) {
        Some(Value::IntValue(v)) => Some(*v),
        _ => None,
    }
}

#[test]
fn a_streamed_request_exports_its_span_with_the_genai_attributes_and_no_secret() {
    let engine = sse_engine();
    let collector = Collector::start(false);
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::start_configured(
        &[("chat", canned_route(engine.port(), ""))],
        collector.config("  service_name: gw-under-test\n"),
        keys_env(dir.path()),
    );
    let incoming = format!("00-{TRACE_ID}-{CLIENT_SPAN}-01");
    let r = chat(
        &gw,
        &format!("{CHAT}?api_key=sk-test-1"),
        &[
            ("Authorization", "Bearer sk-test-1"),
            ("x-session-id", "raw-session-77"),
            ("x-request-id", "req-span-1"),
            ("traceparent", &incoming),
            ("tracestate", "vendor=abc"),
        ],
    );
    let span = collector.wait_spans(1).remove(0);

    // The engine continues the same trace under the gateway's span.
    let [_, trace, parent, flags] = engine_traces(&engine).remove(0);
    assert_eq!((trace.as_str(), flags.as_str()), (TRACE_ID, "01"));
    assert_eq!(hex(&span.trace_id), TRACE_ID);
    assert_eq!(
        hex(&span.span_id),
        parent,
        "the engine's parent is this span"
    );
    assert_eq!(hex(&span.parent_span_id), CLIENT_SPAN);
    assert_eq!(span.trace_state, "vendor=abc");
    assert_eq!(span.kind, 2, "SERVER");
    assert_eq!(span.name, "POST chat");
    assert!(span.start_time_unix_nano < span.end_time_unix_nano);

    assert_eq!(text(&span, "gen_ai.request.model"), Some("m"));
    assert_eq!(int(&span, "gen_ai.usage.input_tokens"), Some(11));
    assert_eq!(int(&span, "gen_ai.usage.output_tokens"), Some(1));
    assert_eq!(int(&span, "gen_ai.usage.cache_read.input_tokens"), Some(3));
    assert_eq!(text(&span, "http.request.method"), Some("POST"));
    assert_eq!(text(&span, "url.path"), Some(CHAT), "without the query");
    assert_eq!(int(&span, "http.response.status_code"), Some(200));
    assert_eq!(text(&span, "llm_gateway.route"), Some("chat"));
    assert_eq!(text(&span, "llm_gateway.peer"), Some("canned"));
    assert_eq!(text(&span, "llm_gateway.request_id"), Some("req-span-1"));
    assert_eq!(
        text(&span, "llm_gateway.routed_mode"),
        r.header("x-routed-mode")
    );
    assert_eq!(
        text(&span, "llm_gateway.session.hash"),
        r.header("x-routed-session"),
        "the hash, as X-Routed-Session shows it"
    );
    assert_eq!(text(&span, "llm_gateway.key_owner"), Some("alice"));
    assert!(
        matches!(attr(&span, "llm_gateway.ttft_ms"), Some(Value::DoubleValue(t)) if *t > 0.0),
        "{:?}",
        attr(&span, "llm_gateway.ttft_ms")
    );
    let events: Vec<&str> = span.events.iter().map(|e| e.name.as_str()).collect();
    for phase in [
        "body_read",
        "gates_passed",
        "placed",
        "upstream_sent",
        "engine_head",
        "first_token",
        "stream_end",
    ] {
        assert!(events.contains(&phase), "{phase} in {events:?}");
    }
    assert!(
        span.events
            .iter()
            .all(|e| (span.start_time_unix_nano..=span.end_time_unix_nano)
                .contains(&e.time_unix_nano))
    );

    // The export itself: OTLP/HTTP's path and media type, the resource's
    // service name, and no raw session id or key anywhere in its bytes.
    let exports = collector.exports.lock();
    assert_eq!(exports[0].path, "/v1/traces");
    assert_eq!(
        exports[0].content_type.as_deref(),
        Some("application/x-protobuf")
    );
    let request = ExportTraceServiceRequest::decode(exports[0].body.as_slice()).unwrap();
    let service = request.resource_spans[0]
        .resource
        .as_ref()
        .and_then(|r| r.attributes.iter().find(|kv| kv.key == "service.name"))
        .and_then(|kv| kv.value.clone()?.value);
    assert_eq!(service, Some(Value::StringValue("gw-under-test".into())));
    for export in exports.iter() {
        let bytes = String::from_utf8_lossy(&export.body);
        for secret in ["raw-session-77", "sk-test-1"] {
            assert!(!bytes.contains(secret), "{secret} in an export");
        }
    }
    drop(exports);
    // Control: the engine did get the raw id and the key (in the query).
    let head = engine.heads.lock().remove(0);
    for secret in ["raw-session-77", "sk-test-1"] {
        assert!(head.contains(secret), "{secret} not sent: {head}");
    }
    wait_for("the span counted as exported", DEADLINE, || {
        (gw.metric("llm_gateway_trace_spans_total", &["result=\"exported\""]) == 1.0).then_some(())
    });
}

#[test]
fn without_tracing_nothing_is_exported_and_with_it_the_same_requests_are() {
    let engine = sse_engine();
    let collector = Collector::start(false);
    let off = Gateway::start(&[("chat", canned_route(engine.port(), ""))]);
    for _ in 0..3 {
        chat(&off, CHAT, &[]);
    }
    off.wait_idle();
    assert_eq!(off.metric("llm_gateway_trace_spans_total", &[]), 0.0);
    // No exporter: no trace started either (`trace_context: continue`).
    assert!(engine
        .heads
        .lock()
        .iter()
        .all(|h| header_of(h, "traceparent").is_none()));

    // Control: the same requests with `tracing:` are exported, each under
    // a trace started here and sent to the engine.
    engine.heads.lock().clear();
    let on = Gateway::start_configured(
        &[("chat", canned_route(engine.port(), ""))],
        collector.config(""),
        vec![],
    );
    for _ in 0..3 {
        chat(&on, CHAT, &[]);
    }
    let spans = collector.wait_spans(3);
    let mut exported: Vec<String> = spans.iter().map(|s| hex(&s.trace_id)).collect();
    let mut told: Vec<String> = engine_traces(&engine)
        .into_iter()
        .map(|[_, trace, _, flags]| {
            assert_eq!(flags, "01");
            trace
        })
        .collect();
    exported.sort();
    told.sort();
    assert_eq!(exported, told);
    assert!(spans.iter().all(|s| s.parent_span_id.is_empty()));
    // And the off gateway sent nothing all along: every export came from
    // the second one.
    assert_eq!(collector.spans().len(), 3);
}

#[test]
fn sampling_zero_exports_only_the_traces_a_client_sampled_and_one_exports_all() {
    let engine = sse_engine();
    let collector = Collector::start(false);
    let never = Gateway::start_configured(
        &[("chat", canned_route(engine.port(), ""))],
        collector.config("  sampling_ratio: 0.0\n"),
        vec![],
    );
    for _ in 0..5 {
        chat(&never, CHAT, &[]);
    }
    // The engine is told the traces are not sampled, so that it records
    // none of what the gateway does not.
    assert!(engine_traces(&engine).iter().all(|[_, _, _, f]| f == "00"));
    // A client's sampled trace is recorded whatever the ratio (parent
    // based); queued after the five, it arrives after any of theirs would.
    let incoming = format!("00-{TRACE_ID}-{CLIENT_SPAN}-01");
    chat(&never, CHAT, &[("traceparent", &incoming)]);
    let spans = collector.wait_spans(1);
    assert_eq!(
        spans.iter().map(|s| hex(&s.trace_id)).collect::<Vec<_>>(),
        [TRACE_ID],
        "only the client's sampled trace"
    );
    wait_for("the one span counted", DEADLINE, || {
        (never.metric("llm_gateway_trace_spans_total", &["result=\"exported\""]) == 1.0)
            .then_some(())
    });
    // And a client's unsampled trace is not recorded at ratio 1.
    engine.heads.lock().clear();
    let always = Gateway::start_configured(
        &[("chat", canned_route(engine.port(), ""))],
        collector.config("  sampling_ratio: 1.0\n"),
        vec![],
    );
    chat(
        &always,
        CHAT,
        &[("traceparent", &format!("00-{TRACE_ID}-{CLIENT_SPAN}-00"))],
    );
    for _ in 0..3 {
        chat(&always, CHAT, &[]);
    }
    let spans = collector.wait_spans(4);
    let later: Vec<&Span> = spans[1..].iter().collect();
    assert_eq!(
        later.len(),
        3,
        "the three started here, not the unsampled one"
    );
    assert!(later.iter().all(|s| hex(&s.trace_id) != TRACE_ID));
    assert!(engine_traces(&engine)[1..]
        .iter()
        .all(|[_, _, _, f]| f == "01"));
}

#[test]
fn a_stalled_collector_drops_and_counts_spans_while_every_request_is_answered() {
    let engine = sse_engine();
    let collector = Collector::start(true);
    let gw = Gateway::start_configured(
        &[("chat", canned_route(engine.port(), ""))],
        collector.config("  queue_spans: 2\n  batch_spans: 1\n  timeout: 60s\n"),
        vec![],
    );
    let started = std::time::Instant::now();
    for _ in 0..8 {
        chat(&gw, CHAT, &[]);
    }
    // One span held by the unanswered export, two queued, the rest dropped.
    let dropped = wait_for("spans dropped", DEADLINE, || {
        let d = gw.metric("llm_gateway_trace_spans_total", &["result=\"dropped\""]);
        (d >= 5.0).then_some(d)
    });
    assert!(dropped <= 6.0, "{dropped}");
    assert_eq!(
        gw.metric("llm_gateway_trace_spans_total", &["result=\"exported\""]),
        0.0
    );
    assert!(
        started.elapsed() < std::time::Duration::from_secs(15),
        "the requests waited: {:?}",
        started.elapsed()
    );
    // Control: the exporter did reach the collector, which holds it.
    assert!(*collector.connections.lock() >= 1);
    assert!(collector.exports.lock().is_empty());
}

#[test]
fn the_drain_sends_the_queued_spans_at_once_before_the_process_exits() {
    let engine = sse_engine();
    let collector = Collector::start(false);
    // A batch that would wait ten minutes to fill.
    let mut gw = Gateway::start_configured(
        &[("chat", canned_route(engine.port(), ""))],
        collector.config_every("10m", ""),
        vec![],
    );
    chat(&gw, CHAT, &[("x-request-id", "last-before-exit")]);
    gw.wait_idle();
    assert!(collector.spans().is_empty(), "the batch is still waiting");
    gw.signal("TERM");
    assert_eq!(gw.wait_exit(DEADLINE), Some(0), "{}", gw.log());
    // Exited, with the span delivered: the drain did not wait for the
    // interval, and the process waited for the export.
    let spans = collector.spans();
    assert_eq!(spans.len(), 1, "{}", gw.log());
    assert_eq!(
        text(&spans[0], "llm_gateway.request_id"),
        Some("last-before-exit")
    );
}
