//! Fair share and priority classes through the binary. One engine with one
//! slot and a queue: a held stream fills it, requests wait, and each time
//! the slot frees exactly one waiter is placed; the order they are placed
//! in is read off which connection gets its response head (each placed
//! request then holds the slot on its own gate until the test opens it).

mod common;

use common::http::{self, Conn, Head};
use common::*;
use serde_json::{json, Value};
use std::time::Duration;

const CHAT: &str = "/chat/v1/chat/completions";
const FAIRNESS_ID: &str = "x-gateway-inference-fairness-id";
const PRIORITY: &str = "x-gateway-priority";

fn one_slot_route(cluster: &SimCluster, extra: &str) -> String {
    format!(
        "peers:\n  - {{name: e0, host: 127.0.0.1, port: {}, max_concurrency: 1}}\nqueue_timeout: 60s\n{extra}",
        cluster.engines[0].port()
    )
}

/// A streamed request of `tenant` (in `class`, if given) that holds its
/// slot until `gate` opens; not waited for.
fn send(gw: &Gateway, tenant: &str, session: &str, gate: &str, class: Option<&str>) -> Conn {
    let mut headers = vec![("x-session-id", session), (FAIRNESS_ID, tenant)];
    if let Some(c) = class {
        headers.push((PRIORITY, c));
    }
    send_gated(gw, CHAT, gate, &headers)
}

fn waiting(gw: &Gateway) -> u64 {
    let state = http::get(gw.addr, "/chat/_route_state").json();
    let q = &state["queue"];
    q["waiting_warm"].as_u64().unwrap_or(0) + q["waiting_new"].as_u64().unwrap_or(0)
}

fn wait_waiting(gw: &Gateway, n: u64) {
    wait_for(&format!("{n} request(s) queued"), DEADLINE, || {
        (waiting(gw) == n).then_some(())
    });
}

/// Reads a placed request's stream to its end.
fn finish(conn: &mut Conn, head: &Head) {
    conn.set_read_timeout(Duration::from_secs(20));
    assert_eq!(head.status, 200);
    conn.read_body(head).expect("the stream to its end");
}

/// Fills the slot, queues `waiters` ((tenant, class) each, in this
/// order), frees the slot and returns the waiters' indices in the order
/// they were placed. `check` sees the gateway with every waiter queued.
fn placement_order(
    route_extra: &str,
    tenants_file: Option<&str>,
    waiters: &[(&str, Option<&str>)],
    check: impl FnOnce(&Gateway),
) -> Vec<usize> {
    let cluster = engines(1);
    let dir = tempfile::tempdir().expect("tempdir");
    let mut opts = GatewayOptions::default();
    if let Some(text) = tenants_file {
        let path = dir.path().join("tenants.yaml");
        std::fs::write(&path, text).expect("tenants file");
        opts.extra_config = format!("tenants_file: {}\n", path.display());
    }
    let gw = Gateway::start_with(&[("chat", one_slot_route(&cluster, route_extra))], opts);
    let mut held = send(&gw, waiters[0].0, "held", "held", None);
    let held_head = held.read_head();
    let mut pending: Vec<(usize, Conn)> = Vec::new();
    for (i, (tenant, class)) in waiters.iter().enumerate() {
        let conn = send(&gw, tenant, &format!("s{i}"), &format!("g{i}"), *class);
        pending.push((i, conn));
        // Queued one by one, so the arrival order is the list's.
        wait_waiting(&gw, i as u64 + 1);
    }
    check(&gw);
    cluster.engines[0].open_gate("held");
    finish(&mut held, &held_head);
    let mut order = Vec::new();
    while !pending.is_empty() {
        // Exactly one waiter has the slot: the one whose head arrives.
        let (at, head) = wait_for("the next waiter placed", DEADLINE, || {
            pending.iter_mut().enumerate().find_map(|(at, (_, conn))| {
                conn.set_read_timeout(Duration::from_millis(5));
                conn.try_read_head().ok().map(|head| (at, head))
            })
        });
        let (i, mut conn) = pending.remove(at);
        order.push(i);
        assert_eq!(waiting(&gw), pending.len() as u64, "one placed at a time");
        cluster.engines[0].open_gate(&format!("g{i}"));
        finish(&mut conn, &head);
    }
    order
}

/// `/_tenants`' queue of route `chat`: (tenant, queued) by name.
fn queued_by_tenant(gw: &Gateway) -> Vec<(String, u64)> {
    let status = http::get(gw.addr, "/_tenants").json();
    let queues = status["queues"].as_array().cloned().unwrap_or_default();
    let chat = queues
        .iter()
        .find(|q| q["route"] == "chat")
        .cloned()
        .unwrap_or(Value::Null);
    chat["tenants"]
        .as_array()
        .map(|ts| {
            ts.iter()
                .map(|t| {
                    (
                        t["name"].as_str().unwrap_or("").to_string(),
                        t["queued"].as_u64().unwrap_or(0),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

const FLOOD: [(&str, Option<&str>); 5] = [
    ("noisy", None),
    ("noisy", None),
    ("noisy", None),
    ("noisy", None),
    ("quiet", None),
];

#[test]
fn a_flood_from_one_tenant_does_not_starve_another() {
    let order = placement_order("", None, &FLOOD, |gw| {
        assert_eq!(
            queued_by_tenant(gw),
            [("noisy".to_string(), 4), ("quiet".to_string(), 1)],
            "/_tenants shows each tenant's queued requests"
        );
    });
    // The quiet tenant, queued last behind four of the noisy one's, is
    // placed first: the noisy one was just served (the held stream).
    assert_eq!(order, [4, 0, 1, 2, 3]);
}

#[test]
fn without_fair_share_the_same_flood_goes_first() {
    // The control: the route opts out, and the queue is in arrival order.
    let order = placement_order("fair_share: false\n", None, &FLOOD, |gw| {
        assert_eq!(queued_by_tenant(gw), [], "no fair queue to show");
    });
    assert_eq!(order, [0, 1, 2, 3, 4], "quiet waits for the whole flood");
}

#[test]
fn a_higher_class_is_placed_before_earlier_lower_ones() {
    let waiters = [
        ("team", Some("batch")),
        ("team", Some("batch")),
        ("team", Some("interactive")),
    ];
    let order = placement_order("", None, &waiters, |_| {});
    assert_eq!(order, [2, 0, 1]);
    // Control: the same requests in one class go in arrival order.
    let same = [
        ("team", Some("batch")),
        ("team", Some("batch")),
        ("team", Some("batch")),
    ];
    assert_eq!(placement_order("", None, &same, |_| {}), [0, 1, 2]);
}

#[test]
fn a_class_the_tenant_may_not_ask_for_is_refused_with_a_403() {
    let cluster = engines(1);
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("tenants.yaml");
    std::fs::write(
        &path,
        "tenants:\n  free:\n    allowed_classes: [standard, batch]\n",
    )
    .expect("tenants file");
    let opts = GatewayOptions {
        extra_config: format!("tenants_file: {}\n", path.display()),
        ..GatewayOptions::default()
    };
    let gw = Gateway::start_with(&[("chat", route_yaml(&ports(&cluster), ""))], opts);
    let ask = |tenant: &str, class: Option<&str>| {
        let mut headers = vec![(FAIRNESS_ID, tenant)];
        if let Some(c) = class {
            headers.push((PRIORITY, c));
        }
        http::post_json(gw.addr, CHAT, &headers, &chat_body("s", "hello", false))
    };
    let r = ask("free", Some("interactive"));
    assert_eq!(r.status(), 403, "{}", r.text());
    let error = &r.json()["error"];
    assert_eq!(error["type"], "priority_class_not_allowed");
    assert_eq!(error["class"], "interactive");
    assert_eq!(error["allowed_classes"], json!(["standard", "batch"]));
    let message = error["message"].as_str().unwrap_or("");
    assert!(
        message.contains("not among the classes it may ask for") && message.contains("batch"),
        "{message}"
    );
    // Not a class at all: refused for every tenant.
    let r = ask("paid", Some("urgent"));
    assert_eq!(r.status(), 403);
    assert!(r.text().contains("is not a priority class"), "{}", r.text());
    // Controls: an allowed class, no header, and another tenant asking
    // for interactive all pass.
    assert_eq!(ask("free", Some("batch")).status(), 200);
    assert_eq!(ask("free", None).status(), 200);
    assert_eq!(ask("paid", Some("interactive")).status(), 200);
}

#[test]
fn a_lower_class_keeps_its_minimum_share_of_the_releases() {
    // One batch request queued first, then ten interactive ones.
    let mut waiters = vec![("team", Some("batch"))];
    waiters.extend([("team", Some("interactive")); 10]);
    // At the default share (0.1) batch has earned its turn after nine
    // releases to interactive.
    let order = placement_order("", None, &waiters, |_| {});
    assert_eq!(order, [1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 10]);
    // Control: the tenants file sets no minimum share, and batch waits for
    // every interactive request.
    let strict = placement_order("", Some("class_min_share: 0\n"), &waiters, |_| {});
    assert_eq!(strict, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 0]);
}

// The fair hold: no queue configured, one engine whose prompts awaiting
// their first token are held there by the simulator's prefill gates.

/// A hold of 2 prompts, unless `extra` sets its own.
fn hold_route(cluster: &SimCluster, extra: &str) -> String {
    let depth = if extra.contains("fair_hold_depth") {
        ""
    } else {
        "fair_hold_depth: 2\n"
    };
    format!(
        "peers:\n  - {{name: e0, host: 127.0.0.1, port: {}}}\n{depth}{extra}",
        cluster.engines[0].port()
    )
}

/// A request of `tenant` whose first token waits for `gate` on the
/// engine; not waited for.
fn send_before_first_token(
    gw: &Gateway,
    tenant: &str,
    session: &str,
    gate: &str,
    stream: bool,
) -> Conn {
    let mut conn = Conn::open(gw.addr);
    let body = chat_body(session, "hold", stream);
    conn.send(
        "POST",
        CHAT,
        &[
            ("content-type", "application/json"),
            ("x-session-id", session),
            (FAIRNESS_ID, tenant),
            ("x-sim-prefill-gate", gate),
        ],
        body.to_string().as_bytes(),
        http::Upload::Length,
    );
    conn
}

/// A request of `tenant` answered in full.
fn served(gw: &Gateway, tenant: &str, session: &str) {
    let r = http::post_json(
        gw.addr,
        CHAT,
        &[("x-session-id", session), (FAIRNESS_ID, tenant)],
        &chat_body(session, "hello", true),
    );
    assert_eq!(r.status(), 200, "{}", r.text());
}

/// Route `chat`'s engine e0: (in flight, awaiting their first token).
fn on_engine(gw: &Gateway) -> (u64, u64) {
    let state = http::get(gw.addr, "/chat/_route_state").json();
    let peer = &state["peers"][0];
    (
        peer["in_flight"].as_u64().unwrap_or(0),
        peer["awaiting_first_token"].as_u64().unwrap_or(0),
    )
}

fn wait_on_engine(gw: &Gateway, in_flight: u64, awaiting: u64) {
    wait_for(
        &format!("{in_flight} in flight, {awaiting} awaiting their first token"),
        DEADLINE,
        || (on_engine(gw) == (in_flight, awaiting)).then_some(()),
    );
}

/// Two noisy prompts on the engine before their first token, then three
/// more noisy requests and a quiet one. The noisy tenant was served twice
/// before, the quiet one once.
fn contended(route_extra: &str) -> (Gateway, SimCluster, Vec<Conn>) {
    let cluster = engines(1);
    let gw = Gateway::start(&[("chat", hold_route(&cluster, route_extra))]);
    served(&gw, "noisy", "n-a");
    served(&gw, "noisy", "n-b");
    served(&gw, "quiet", "q-a");
    let mut conns = vec![
        send_before_first_token(&gw, "noisy", "n0", "p0", true),
        send_before_first_token(&gw, "noisy", "n1", "p1", true),
    ];
    wait_on_engine(&gw, 2, 2);
    for i in 2..5 {
        let id = format!("n{i}");
        conns.push(send_before_first_token(&gw, "noisy", &id, &id, true));
    }
    conns.push(send_before_first_token(&gw, "quiet", "q0", "q0", true));
    (gw, cluster, conns)
}

#[test]
fn a_busy_engine_shared_by_two_tenants_takes_the_quiet_one_among_the_first() {
    let (gw, cluster, _conns) = contended("");
    // Held at the gateway, not sent into the engine's own queue.
    wait_waiting(&gw, 4);
    assert_eq!(on_engine(&gw), (2, 2));
    assert_eq!(
        queued_by_tenant(&gw),
        [("noisy".to_string(), 3), ("quiet".to_string(), 1)]
    );
    // Each first token makes room for one more prompt. The quiet tenant
    // started waiting level with the noisy one (no credit banked for its
    // quiet spell), so it has one of the first two, though it came after
    // all three of the noisy one's.
    cluster.engines[0].open_gate("p0");
    wait_waiting(&gw, 3);
    assert_eq!(on_engine(&gw).1, 2, "one released for the one started");
    cluster.engines[0].open_gate("p1");
    wait_waiting(&gw, 2);
    assert_eq!(
        queued_by_tenant(&gw),
        [("noisy".to_string(), 2), ("quiet".to_string(), 0)]
    );
}

#[test]
fn without_the_hold_the_busy_engine_gets_every_request_in_arrival_order() {
    // Control: the same requests with the hold off go straight to the
    // engine, the quiet one behind the noisy ones in its queue.
    let (gw, _cluster, _conns) = contended("fair_hold_depth: 0\n");
    wait_on_engine(&gw, 6, 6);
    assert_eq!(waiting(&gw), 0);
    // And so with fair share off.
    let (gw, _cluster, _conns) = contended("fair_share: false\n");
    wait_on_engine(&gw, 6, 6);
    assert_eq!(waiting(&gw), 0);
}

#[test]
fn one_tenant_alone_is_never_held() {
    // The hold is for tenants sharing: a single tenant's requests all go
    // to the busy engine, as they did before fair share.
    let cluster = engines(1);
    let gw = Gateway::start(&[("chat", hold_route(&cluster, ""))]);
    let _conns: Vec<Conn> = (0..4)
        .map(|i| send_before_first_token(&gw, "solo", &format!("s{i}"), &format!("p{i}"), true))
        .collect();
    wait_on_engine(&gw, 4, 4);
    assert_eq!(waiting(&gw), 0);
}

#[test]
fn a_held_request_goes_on_when_its_hold_times_out() {
    let (gw, _cluster, _conns) = contended("fair_hold_timeout: 1s\n");
    // Held at first (the control is the hold test above), then sent on
    // though the engine still has two prompts ahead: a hold never refuses.
    wait_on_engine(&gw, 6, 6);
    assert_eq!(waiting(&gw), 0);
}

#[test]
fn responses_not_streamed_are_not_prompts_awaiting_prefill() {
    // Two noisy requests not streamed are on the engine before their first
    // token: they do not count towards the hold, as a whole response's
    // first token comes with its last.
    let cluster = engines(1);
    let gw = Gateway::start(&[("chat", hold_route(&cluster, ""))]);
    served(&gw, "noisy", "n-a");
    let _whole: Vec<Conn> = (0..2)
        .map(|i| send_before_first_token(&gw, "noisy", &format!("w{i}"), &format!("w{i}"), false))
        .collect();
    wait_on_engine(&gw, 2, 0);
    let _quiet = send_before_first_token(&gw, "quiet", "q0", "q0", true);
    wait_on_engine(&gw, 3, 1);
    assert_eq!(waiting(&gw), 0, "the quiet request was not held");
}
