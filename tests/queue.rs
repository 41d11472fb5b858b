//! The admission queue through the real binary. A request that no
//! engine can take waits for room (`queue_timeout`) and is placed when a slot
//! frees; without a queue the same request is refused at once.

mod common;

use common::http::{self, Conn, Upload};
use common::*;
use serde_json::json;
use std::time::Duration;

const CHAT: &str = "/chat/v1/chat/completions";

/// One engine with a single slot, so one held stream fills the route.
fn one_slot_route(cluster: &SimCluster, extra: &str) -> String {
    format!(
        "peers:\n  - {{name: e0, host: 127.0.0.1, port: {}, max_concurrency: 1}}\n{extra}",
        cluster.engines[0].port()
    )
}

/// A stream that holds the route's only slot until `gate` opens.
fn hold_slot(gw: &Gateway, session: &str, gate: &str) -> Conn {
    hold_stream(gw, CHAT, gate, &[("x-session-id", session)])
}

/// Sends a request without waiting for its answer.
fn send(gw: &Gateway, session: &str, gate: Option<&str>) -> Conn {
    let mut conn = Conn::open(gw.addr);
    let mut headers = vec![
        ("content-type", "application/json"),
        ("x-session-id", session),
    ];
    if let Some(g) = gate {
        headers.push(("x-sim-gate", g));
    }
    let body = json!({"model": "sim-model", "stream": gate.is_some(), "max_tokens": 2,
                      "messages": [{"role": "user", "content": "wait for me"}]});
    conn.send(
        "POST",
        CHAT,
        &headers,
        body.to_string().as_bytes(),
        Upload::Length,
    );
    conn
}

fn queue(gw: &Gateway) -> (u64, u64) {
    let state = http::get(gw.addr, "/chat/_route_state").json();
    let q = &state["queue"];
    (
        q["waiting_warm"].as_u64().unwrap_or(0),
        q["waiting_new"].as_u64().unwrap_or(0),
    )
}

fn wait_queue(gw: &Gateway, want: (u64, u64)) {
    wait_for("the queue to hold what is expected", DEADLINE, || {
        (queue(gw) == want).then_some(())
    });
}

#[test]
fn a_full_route_queues_and_places_when_a_slot_frees() {
    let cluster = engines(1);
    let gw = Gateway::start(&[("chat", one_slot_route(&cluster, "queue_timeout: 20s\n"))]);
    let mut held = hold_slot(&gw, "holder", "q1");
    let mut waiting = send(&gw, "newcomer", None);
    wait_queue(&gw, (0, 1));
    cluster.engines[0].open_gate("q1");
    let _ = held.read_body(&http::Head {
        status: 200,
        headers: vec![("transfer-encoding".into(), "chunked".into())],
    });
    let r = waiting.read_response();
    assert_eq!(r.status(), 200, "{}", r.text());
    let queued: u64 = r
        .header("x-routed-queued-ms")
        .and_then(|v| v.parse().ok())
        .expect("the wait is reported");
    assert!(queued > 0, "queued {queued} ms");
    assert_eq!(queue(&gw), (0, 0));
    assert_eq!(gw.metric("llm_gateway_queue_wait_seconds_count", &[]), 1.0);
}

#[test]
fn without_a_queue_the_same_request_is_refused_at_once() {
    let cluster = engines(1);
    let gw = Gateway::start(&[("chat", one_slot_route(&cluster, ""))]);
    let _held = hold_slot(&gw, "holder", "q2");
    let r = send(&gw, "newcomer", None).read_response();
    assert_eq!(r.status(), 429);
    assert_eq!(r.json()["error"]["type"], "concurrency_limit");
    assert!(r.header("x-routed-queued-ms").is_none());
    cluster.engines[0].open_gate("q2");
}

#[test]
fn a_queued_request_times_out_into_the_429_it_would_have_had() {
    let cluster = engines(1);
    let gw = Gateway::start(&[("chat", one_slot_route(&cluster, "queue_timeout: 300ms\n"))]);
    let _held = hold_slot(&gw, "holder", "q3");
    let r = send(&gw, "newcomer", None).read_response();
    assert_eq!(r.status(), 429);
    assert_eq!(r.json()["error"]["type"], "concurrency_limit");
    assert_eq!(r.header("retry-after"), Some("1"));
    let queued: u64 = r
        .header("x-routed-queued-ms")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    assert!(queued >= 300, "waited the whole timeout: {queued} ms");
    assert_eq!(queue(&gw), (0, 0));
    cluster.engines[0].open_gate("q3");
}

#[test]
fn a_client_that_hangs_up_while_queued_leaves_the_queue_at_once() {
    let cluster = engines(1);
    let gw = Gateway::start(&[("chat", one_slot_route(&cluster, "queue_timeout: 60s\n"))]);
    let _held = hold_slot(&gw, "holder", "q4");
    let waiting = send(&gw, "newcomer", None);
    // Control: while connected it holds its place.
    wait_queue(&gw, (0, 1));
    drop(waiting);
    wait_queue(&gw, (0, 0));
    cluster.engines[0].open_gate("q4");
}

#[test]
fn warm_turns_are_placed_before_new_sessions() {
    let cluster = engines(1);
    let gw = Gateway::start(&[("chat", one_slot_route(&cluster, "queue_timeout: 60s\n"))]);
    // "warm" has a turn behind it, so it is bound to the engine.
    let first = http::post_json(
        gw.addr,
        CHAT,
        &[("x-session-id", "warm")],
        &chat_body("warm", "one", false),
    );
    assert_eq!(first.status(), 200);
    let mut held = hold_slot(&gw, "holder", "q5");
    // The new session queues first, the warm turn after it.
    let _new = send(&gw, "cold", Some("q6"));
    wait_queue(&gw, (0, 1));
    let mut warm = send(&gw, "warm", Some("q6"));
    wait_queue(&gw, (1, 1));
    cluster.engines[0].open_gate("q5");
    let _ = held.read_chunk();
    // The warm turn took the freed slot; the new session still waits.
    assert_eq!(warm.read_head().status, 200);
    wait_queue(&gw, (0, 1));
    cluster.engines[0].open_gate("q6");
}

#[test]
fn a_reload_keeps_queued_requests_and_sigterm_answers_them() {
    let cluster = engines(1);
    let route = one_slot_route(&cluster, "queue_timeout: 60s\n");
    let mut gw = Gateway::start(&[("chat", route.clone())]);
    let mut held = hold_slot(&gw, "holder", "q7");
    let mut through_reload = send(&gw, "reloaded", None);
    wait_queue(&gw, (0, 1));
    // SIGHUP with a changed file: the queued request keeps its place and is
    // placed when the slot frees.
    gw.write_route("chat", &format!("{route}routed_headers: true\n"));
    gw.reload();
    cluster.engines[0].open_gate("q7");
    let _ = held.read_chunk();
    assert_eq!(through_reload.read_response().status(), 200);

    // SIGTERM: a request still queued is answered, not dropped.
    let _held = hold_slot(&gw, "holder-2", "q8");
    let mut at_shutdown = send(&gw, "shutdown", None);
    wait_queue(&gw, (0, 1));
    gw.signal("TERM");
    let r = at_shutdown.read_response();
    assert_eq!(r.status(), 429, "{}", r.text());
    cluster.engines[0].open_gate("q8");
    assert_eq!(gw.wait_exit(Duration::from_secs(20)), Some(0));
}
