//! Request ids, W3C trace context and the access log, through the real
//! binary: what the engine receives (`x-request-id`, a `traceparent` that
//! continues the client's trace under the gateway's own span), what every
//! answer carries (the gateway's own JSON errors too), and the access
//! log's line per request (off unless configured; no raw session id or key).

mod common;

use common::canned::{canned_route, Canned};
use common::http::{self, Conn};
use common::traced::{
    chat, header_of, keys_env, sse_engine, traceparent_fields as fields, CLIENT_SPAN, TRACE_ID,
};
use common::*;
use serde_json::Value;
use std::path::{Path, PathBuf};

const CHAT: &str = "/chat/v1/chat/completions";
/// The last head the engine received.
fn last_head(engine: &Canned) -> String {
    engine
        .heads
        .lock()
        .last()
        .cloned()
        .expect("the engine got a request")
}

#[test]
fn the_engine_gets_the_request_id_and_the_clients_trace_under_a_new_span() {
    let engine = sse_engine();
    let gw = Gateway::start(&[("chat", canned_route(engine.port(), ""))]);
    let incoming = format!("00-{TRACE_ID}-{CLIENT_SPAN}-01");
    let r = chat(
        &gw,
        CHAT,
        &[
            ("x-request-id", "client-req-42"),
            ("traceparent", &incoming),
            ("tracestate", "vendor=abc"),
        ],
    );
    assert_eq!(r.header("x-request-id"), Some("client-req-42"));
    let head = last_head(&engine);
    assert_eq!(
        header_of(&head, "x-request-id").as_deref(),
        Some("client-req-42"),
        "{head}"
    );
    let sent = header_of(&head, "traceparent").expect("a traceparent");
    let [_, trace, parent, flags] = fields(&sent);
    assert_eq!(trace, TRACE_ID, "the same trace");
    assert_ne!(
        parent, CLIENT_SPAN,
        "the gateway's span is the engine's parent"
    );
    assert_eq!(flags, "01");
    assert_eq!(
        header_of(&head, "tracestate").as_deref(),
        Some("vendor=abc")
    );

    // A request with neither gets an id made here, the same on the engine
    // and on the answer, and by default no trace; a `tracestate` alone is
    // not a trace and passes.
    let r = chat(&gw, CHAT, &[("tracestate", "vendor=alone")]);
    let head = last_head(&engine);
    let made = r.header("x-request-id").expect("an id made by the gateway");
    assert_eq!(made.len(), 36, "a UUID: {made}");
    assert_eq!(header_of(&head, "x-request-id").as_deref(), Some(made));
    assert_eq!(header_of(&head, "traceparent"), None, "{head}");
    assert_eq!(
        header_of(&head, "tracestate").as_deref(),
        Some("vendor=alone")
    );

    // Control: with `trace_context: start` the same request gets a fresh
    // trace, and the lone `tracestate` does not join it.
    let start = Gateway::start_configured(
        &[("chat", canned_route(engine.port(), ""))],
        "trace_context: start\n".into(),
        vec![],
    );
    chat(&start, CHAT, &[("tracestate", "vendor=alone")]);
    let head = last_head(&engine);
    let [_, trace, _, flags] =
        fields(&header_of(&head, "traceparent").expect("a fresh traceparent"));
    assert_ne!(trace, TRACE_ID);
    assert_eq!(flags, "01", "sampled, so the engine's spans are kept");
    assert_eq!(header_of(&head, "tracestate"), None, "{head}");
}

#[test]
fn an_invalid_traceparent_or_request_id_is_replaced_not_passed_on() {
    let engine = sse_engine();
    let gw = Gateway::start_configured(
        &[("chat", canned_route(engine.port(), ""))],
        "trace_context: start\n".into(),
        vec![],
    );
    let spaced = "has a space";
    let r = chat(
        &gw,
        CHAT,
        &[
            ("x-request-id", spaced),
            ("traceparent", &format!("ff-{TRACE_ID}-{CLIENT_SPAN}-01")),
            ("tracestate", "vendor=abc"),
        ],
    );
    let head = last_head(&engine);
    let id = r.header("x-request-id").expect("an id");
    assert_ne!(id, spaced);
    assert_eq!(header_of(&head, "x-request-id").as_deref(), Some(id));
    let [_, trace, _, _] = fields(&header_of(&head, "traceparent").expect("replaced"));
    assert_ne!(trace, TRACE_ID, "a new trace, not the invalid one's");
    assert_eq!(
        header_of(&head, "tracestate"),
        None,
        "the old trace's state goes with it"
    );
}

#[test]
fn trace_context_continue_and_off() {
    let engine = sse_engine();
    let route = canned_route(engine.port(), "");
    let incoming = format!("00-{TRACE_ID}-{CLIENT_SPAN}-00");
    let cont = Gateway::start_configured(
        &[("chat", route.clone())],
        "trace_context: continue\n".into(),
        vec![],
    );
    chat(&cont, CHAT, &[]);
    assert_eq!(
        header_of(&last_head(&engine), "traceparent"),
        None,
        "no trace to continue"
    );
    // An invalid one is taken off, its state with it.
    chat(
        &cont,
        CHAT,
        &[
            ("traceparent", &format!("ff-{TRACE_ID}-{CLIENT_SPAN}-01")),
            ("tracestate", "vendor=abc"),
        ],
    );
    let head = last_head(&engine);
    assert_eq!(header_of(&head, "traceparent"), None, "{head}");
    assert_eq!(header_of(&head, "tracestate"), None, "{head}");
    chat(&cont, CHAT, &[("traceparent", &incoming)]);
    let [_, trace, parent, flags] = fields(&header_of(&last_head(&engine), "traceparent").unwrap());
    assert_eq!(
        (trace.as_str(), flags.as_str()),
        (TRACE_ID, "00"),
        "continued, unsampled kept"
    );
    assert_ne!(parent, CLIENT_SPAN);

    let off = Gateway::start_configured(&[("chat", route)], "trace_context: off\n".into(), vec![]);
    chat(&off, CHAT, &[("traceparent", &incoming)]);
    let head = last_head(&engine);
    assert_eq!(header_of(&head, "traceparent"), Some(incoming), "untouched");
    assert!(
        header_of(&head, "x-request-id").is_some(),
        "the id still goes"
    );
}

#[test]
fn the_gateways_own_errors_carry_the_request_id() {
    let cluster = engines(1);
    let one_slot = format!(
        "peers:\n  - {{name: e0, host: 127.0.0.1, port: {}, max_concurrency: 1}}\n",
        cluster.engines[0].port()
    );
    let dead = free_port();
    let gw = Gateway::start(&[("chat", one_slot), ("dead", canned_route(dead, ""))]);
    let _held = hold_stream(&gw, CHAT, "ids", &[("x-session-id", "holder")]);
    let body = chat_body("newcomer", "x", false);
    let refused = http::post_json(gw.addr, CHAT, &[("x-request-id", "r-429")], &body);
    assert_eq!(refused.status(), 429, "{}", refused.text());
    assert_eq!(refused.header("x-routed-mode"), Some("local"));
    assert_eq!(refused.header("x-request-id"), Some("r-429"));
    // After a failed upstream attempt (`fail_to_proxy`).
    let failed = http::post_json(
        gw.addr,
        "/dead/v1/chat/completions",
        &[("x-request-id", "r-5xx")],
        &body,
    );
    assert!(failed.status() >= 500, "{}", failed.text());
    assert!(failed.json()["error"]["type"].is_string());
    assert_eq!(failed.header("x-request-id"), Some("r-5xx"));
    // With no route at all, and with an id made here.
    let missing = http::get(gw.addr, "/nowhere/v1/models");
    assert_eq!(missing.status(), 404);
    assert_eq!(missing.header("x-request-id").map(str::len), Some(36));
    cluster.engines[0].open_gate("ids");
}

fn access_log_config(path: &Path) -> String {
    format!("access_log: {{path: {}}}\n", path.display())
}

fn lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

/// The access log's lines once there are `n`.
fn wait_lines(path: &Path, n: usize) -> Vec<Value> {
    wait_for("access-log lines", DEADLINE, || {
        let found = lines(path);
        (found.len() >= n).then_some(found)
    })
}

#[test]
fn a_line_per_request_with_its_fields_and_no_raw_session_id_or_key() {
    let engine = sse_engine();
    let dir = tempfile::tempdir().unwrap();
    let log_path: PathBuf = dir.path().join("access.log");
    let gw = Gateway::start_configured(
        &[("chat", canned_route(engine.port(), ""))],
        access_log_config(&log_path),
        keys_env(dir.path()),
    );
    let incoming = format!("00-{TRACE_ID}-{CLIENT_SPAN}-01");
    let r = chat(
        &gw,
        &format!("{CHAT}?api_key=sk-test-1"),
        &[
            ("Authorization", "Bearer sk-test-1"),
            ("x-session-id", "raw-session-77"),
            ("x-request-id", "req-line-1"),
            ("traceparent", &incoming),
        ],
    );
    let line = wait_lines(&log_path, 1).remove(0);
    let text = std::fs::read_to_string(&log_path).unwrap();
    for secret in ["raw-session-77", "sk-test-1"] {
        assert!(!text.contains(secret), "{secret} in the access log: {text}");
    }
    let hash = r.header("x-routed-session").expect("the session's hash");
    assert_eq!(
        line["session"], hash,
        "the hash, as X-Routed-Session shows it"
    );
    assert_eq!(line["session_source"], "header:x-session-id");
    assert_eq!(line["request_id"], "req-line-1");
    assert_eq!(line["trace_id"], TRACE_ID);
    assert_eq!(line["method"], "POST");
    assert_eq!(line["path"], CHAT, "without the query");
    assert_eq!(line["route"], "chat");
    assert_eq!(line["status"], 200);
    assert_eq!(line["peer"], "canned");
    assert_eq!(line["peer_addr"], format!("127.0.0.1:{}", engine.port()));
    assert_eq!(line["mode"], r.header("x-routed-mode").expect("mode"));
    assert_eq!(line["owner"], "alice");
    assert_eq!(line["model"], "m");
    assert_eq!(
        (
            &line["prompt_tokens"],
            &line["cached_tokens"],
            &line["completion_tokens"]
        ),
        (&Value::from(11), &Value::from(3), &Value::from(1))
    );
    let (ttft, total) = (
        line["ttft_ms"].as_f64().unwrap(),
        line["duration_ms"].as_f64().unwrap(),
    );
    assert!(0.0 < ttft && ttft <= total, "{ttft} {total}");
    assert_eq!(line["bytes_out"], r.body.len());
    assert_eq!(line["retries"], 0);
    assert!(line["error"].is_null());
    assert!(
        line["time"].as_str().is_some_and(|t| t.ends_with('Z')),
        "{}",
        line["time"]
    );
    // Control: the engine did get the raw id, and the key (in the query).
    let head = last_head(&engine);
    for secret in ["raw-session-77", "sk-test-1"] {
        assert!(head.contains(secret), "{secret} not sent: {head}");
    }

    // A refusal has its line too, with the error's type.
    let refused = Conn::open(gw.addr).request("POST", CHAT, &[("x-request-id", "req-401")], b"{}");
    assert_eq!(refused.status(), 401);
    let refusal = wait_lines(&log_path, 2).remove(1);
    assert_eq!(
        (
            &refusal["request_id"],
            &refusal["status"],
            &refusal["mode"],
            &refusal["error"]
        ),
        (
            &Value::from("req-401"),
            &Value::from(401),
            &Value::from("local"),
            &Value::from("unauthorized")
        )
    );
    // The writer counts a batch after its flush: the lines can be read
    // before the count moves.
    wait_for("both lines counted as written", DEADLINE, || {
        (gw.metric(
            "llm_gateway_access_log_lines_total",
            &["result=\"written\""],
        ) == 2.0)
            .then_some(())
    });
}

#[test]
fn the_access_log_is_off_by_default() {
    let engine = sse_engine();
    let off = Gateway::start(&[("chat", canned_route(engine.port(), ""))]);
    chat(&off, CHAT, &[]);
    off.wait_idle();
    assert_eq!(off.metric("llm_gateway_access_log_lines_total", &[]), 0.0);
    assert!(!off.log().contains("\"request_id\""), "{}", off.log());

    // Control: the same request with it on is written and counted.
    let dir = tempfile::tempdir().unwrap();
    let log_path = dir.path().join("access.log");
    let on = Gateway::start_configured(
        &[("chat", canned_route(engine.port(), ""))],
        access_log_config(&log_path),
        vec![],
    );
    let r = chat(&on, CHAT, &[]);
    let line = wait_lines(&log_path, 1).remove(0);
    assert_eq!(line["request_id"], r.header("x-request-id").expect("id"));
    wait_for("the written line counted", DEADLINE, || {
        (on.metric(
            "llm_gateway_access_log_lines_total",
            &["result=\"written\""],
        ) == 1.0)
            .then_some(())
    });
}

#[test]
fn sighup_opens_the_access_log_again_after_a_rotation() {
    let engine = sse_engine();
    let dir = tempfile::tempdir().unwrap();
    let log_path = dir.path().join("access.log");
    let gw = Gateway::start_configured(
        &[("chat", canned_route(engine.port(), ""))],
        access_log_config(&log_path),
        vec![],
    );
    chat(&gw, CHAT, &[("x-request-id", "before")]);
    wait_lines(&log_path, 1);
    let rotated = dir.path().join("access.log.1");
    std::fs::rename(&log_path, &rotated).unwrap();
    gw.reload();
    wait_for("the file opened again", DEADLINE, || {
        log_path.exists().then_some(())
    });
    chat(&gw, CHAT, &[("x-request-id", "after")]);
    let after = wait_lines(&log_path, 1);
    assert_eq!(after[0]["request_id"], "after");
    let before = lines(&rotated);
    assert_eq!(
        (before.len(), &before[0]["request_id"]),
        (1, &Value::from("before"))
    );
}
