//! The remaining read-only endpoints: `/_route_opts` (the option
//! catalog with the values in effect), `/_cluster_avg` (in-flight per pool
//! over 5 minutes), `/_route_inspect` (where a request would go, changing
//! nothing: POST with a body, GET with the headers alone), and the methods
//! every read endpoint serves.

mod common;

use common::http;
use common::*;
use serde_json::{json, Value};

/// The option `key` under `section`, by its key or by the flat spelling it
/// had before `protection:`.
fn option<'a>(opts: &'a Value, section: &str, key: &str) -> &'a Value {
    opts[section]
        .as_array()
        .and_then(|list| {
            list.iter()
                .find(|o| o["key"] == key || o["formerly"] == key)
        })
        .unwrap_or_else(|| panic!("{key} not under {section}: {opts}"))
}

#[test]
fn route_opts_shows_each_option_with_its_value_and_whether_the_route_set_it() {
    let cluster = engines(2);
    let extra = "ttft_limit_ms: 12000\ntps_limit_tps: 5\nadaptive_cc: true\nttft_window: 5s\n";
    let gw = Gateway::start(&[("chat", route_yaml(&ports(&cluster), extra))]);
    let opts = http::get(gw.addr, "/chat/_route_opts").json();
    let ttft = option(&opts, "options", "ttft_limit_ms");
    assert_eq!(
        (&ttft["value"], &ttft["default"], &ttft["set_by_route"]),
        (&json!(12000.0), &json!("30000"), &json!(true))
    );
    let mode = option(&opts, "options", "balancing.mode");
    assert_eq!(
        (&mode["value"], &mode["set_by_route"]),
        (&json!("load_aware"), &json!(false)),
        "a default is told apart from a value the route wrote"
    );
    assert!(mode["choices"].as_array().is_some_and(|c| c.len() == 4));
    // Engine internals are under `advanced`, not among the tunables.
    let window = option(&opts, "advanced", "ttft_window");
    assert_eq!(
        (&window["value"], &window["set_by_route"]),
        (&json!("5s"), &json!(true))
    );
    assert!(opts["options"]
        .as_array()
        .is_some_and(|o| o.iter().all(|x| x["key"] != "ttft_window")));
    // Derived: the adaptive bounds of the pool (two peers × 64 slots).
    let derived = &opts["derived"]["adaptive_cc"][0];
    assert_eq!(
        (&derived["static_max"], &derived["floor"], &derived["start"]),
        (&json!(128.0), &json!(51.0), &json!(51.0)),
        "{opts}"
    );
}

#[test]
fn cluster_avg_reports_each_pools_in_flight_over_the_last_minutes() {
    let cluster = engines(1);
    let gw = Gateway::start(&[("chat", route_yaml(&ports(&cluster), ""))]);
    let pool = || http::get(gw.addr, "/chat/_cluster_avg").json()["pools"][0].clone();
    let idle = wait_for("a first idle sample", DEADLINE, || {
        let p = pool();
        p["avg_in_flight_5m"].as_f64().map(|_| p)
    });
    assert_eq!(idle["avg_in_flight_5m"], 0.0, "{idle}");
    // Two held streams: the average rises above zero while they run.
    let held: Vec<_> = (0..2)
        .map(|_| hold_stream(&gw, "/chat/v1/chat/completions", "avg", &[]))
        .collect();
    let busy = wait_for("the held streams in the average", DEADLINE, || {
        let p = pool();
        (p["avg_in_flight_5m"].as_f64()? > 0.0).then_some(p)
    });
    assert_eq!(busy["in_flight"], 2.0, "{busy}");
    assert_eq!(busy["limit"], 64.0);
    assert!(busy["buckets"].as_array().is_some_and(|b| !b.is_empty()));
    cluster.engines[0].open_gate("avg");
    drop(held);
}

#[test]
fn route_inspect_says_where_a_request_would_go_and_a_real_one_goes_there() {
    let cluster = engines(3);
    let gw = Gateway::start(&[("chat", route_yaml(&ports(&cluster), ""))]);
    let body = chat_body("inspect-me", "hello", false);
    let inspect = |body: &Value| http::post_json(gw.addr, "/chat/_route_inspect", &[], body);
    let seen = inspect(&body);
    assert_eq!(seen.status(), 200, "{}", seen.text());
    let seen = seen.json();
    assert_eq!(
        seen["session"]["source"], "body:metadata.session_id",
        "{seen}"
    );
    assert!(
        !seen.to_string().contains("inspect-me"),
        "only the hash: {seen}"
    );
    assert_eq!(seen["transforms"]["cch_strip"]["on"], false, "{seen}");
    let predicted = seen["placement"]["decision"]["peer"].clone();
    assert!(predicted.is_string(), "{seen}");
    // Inspecting changed nothing: no session was bound.
    let sessions = http::get(gw.addr, "/chat/_sessions").json();
    assert_eq!(sessions["total"], 0, "{sessions}");
    // The real request lands where the inspection said.
    let real = http::post_json(gw.addr, "/chat/v1/chat/completions", &[], &body);
    assert_eq!(real.status(), 200);
    assert_eq!(real.header("x-routed-peer"), predicted.as_str());
    // Control: the same session, now bound, is reported as sticking there.
    let again = inspect(&body).json();
    assert_eq!(again["placement"]["decision"]["peer"], predicted);
    assert_ne!(
        again["placement"]["decision"]["kind"],
        seen["placement"]["decision"]["kind"]
    );
    // Not JSON: a clear 400; DELETE: 405.
    let bad = http::Conn::open(gw.addr).request(
        "POST",
        "/chat/_route_inspect",
        &[("content-type", "application/json")],
        b"[1, 2",
    );
    assert_eq!(bad.status(), 400, "{}", bad.text());
    let r = http::request(gw.addr, "DELETE", "/chat/_route_inspect", &[], b"");
    assert_eq!(r.status(), 405, "{}", r.text());
    assert_eq!(r.header("allow"), Some("GET, HEAD, POST"));
}

/// `GET /_route_inspect`, read-only as the OpenResty gateway lists it: what
/// the route would do with the headers alone (the session a header names,
/// where it would go, the estimates), no body read, nothing remembered.
/// The control: POST still takes a body, whose own session GET cannot see.
#[test]
fn route_inspect_on_get_looks_at_the_headers_alone() {
    let cluster = engines(3);
    let p = ports(&cluster);
    let pools = format!(
        "{}peers_by_model:\n  llama: [e0]\n  qwen: [e1, e2]\n",
        route_yaml(&p, "")
    );
    let gw = Gateway::start(&[("chat", route_yaml(&p, "")), ("pools", pools)]);
    let get =
        |path: &str, headers: &[(&str, &str)]| http::request(gw.addr, "GET", path, headers, b"");
    let named = [("x-session-id", "agent-7")];

    let seen = get("/chat/_route_inspect", &named);
    assert_eq!(seen.status(), 200, "{}", seen.text());
    let seen = seen.json();
    assert_eq!(seen["looked_at"], "headers", "{seen}");
    assert_eq!(seen["session"]["source"], "header:x-session-id", "{seen}");
    assert!(
        !seen.to_string().contains("agent-7"),
        "only the hash: {seen}"
    );
    let peers = seen["estimates"]["peers"].as_array().map_or(0, Vec::len);
    assert_eq!(peers, 3, "an estimate for each engine: {seen}");
    let predicted = seen["placement"]["decision"]["peer"].clone();
    assert!(predicted.is_string(), "{seen}");
    let sessions = http::get(gw.addr, "/chat/_sessions").json();
    assert_eq!(sessions["total"], 0, "inspecting bound nothing: {sessions}");

    // A real request with that header lands where the look said.
    let body = json!({"model": "sim-model", "messages": [{"role": "user", "content": "hi"}]});
    let real = http::post_json(gw.addr, "/chat/v1/chat/completions", &named, &body);
    assert_eq!(real.status(), 200, "{}", real.text());
    assert_eq!(real.header("x-routed-peer"), predicted.as_str());
    assert_eq!(
        real.header("x-routed-session"),
        seen["session"]["hash"].as_str()
    );

    // Control: POST looks at the body too, and finds the body's own session,
    // which the headers alone do not carry.
    let with_body = http::post_json(
        gw.addr,
        "/chat/_route_inspect",
        &[],
        &chat_body("in-the-body", "hello", false),
    );
    assert_eq!(with_body.status(), 200, "{}", with_body.text());
    let with_body = with_body.json();
    assert_eq!(with_body["looked_at"], "headers and body");
    assert_eq!(
        with_body["session"]["source"], "body:metadata.session_id",
        "{with_body}"
    );
    let bare = get("/chat/_route_inspect", &[]).json();
    assert!(bare["session"].is_null(), "{bare}");
    assert!(
        bare["placement"]["why"]
            .as_str()
            .is_some_and(|w| w.contains("no session id")),
        "{bare}"
    );

    // HEAD answers as GET does; a model pool is named in the query.
    let mut conn = http::Conn::open(gw.addr);
    conn.send(
        "HEAD",
        "/chat/_route_inspect",
        &named,
        b"",
        http::Upload::Length,
    );
    assert_eq!(conn.read_head().status, 200);
    let qwen = get("/pools/_route_inspect?model=qwen", &named).json();
    assert_eq!(qwen["pool"], json!(["e1", "e2"]), "{qwen}");
    assert_eq!(qwen["model"], "qwen");
    let none = get("/pools/_route_inspect", &named);
    assert_eq!(none.status(), 400, "{}", none.text());
    assert!(none.text().contains("?model="), "{}", none.text());
}

#[test]
fn route_inspect_with_no_ready_peer_is_a_clear_503() {
    let cluster = engines(1);
    let port = cluster.engines[0].port();
    let gw = Gateway::start(&[(
        "chat",
        route_yaml(&[port], "health: {interval: 100ms, ban_ttl: 60s}\n"),
    )]);
    cluster.engines[0]
        .faults
        .health_down
        .store(true, std::sync::atomic::Ordering::Relaxed);
    wait_for("the peer to be banned", DEADLINE, || {
        let r = http::post_json(
            gw.addr,
            "/chat/_route_inspect",
            &[],
            &chat_body("s", "x", false),
        );
        (r.status() == 503).then_some(r)
    });
    let r = http::post_json(
        gw.addr,
        "/chat/_route_inspect",
        &[],
        &chat_body("s", "x", false),
    );
    assert_eq!(
        r.json()["error"]["type"],
        "no_healthy_upstream",
        "{}",
        r.text()
    );
}

#[test]
fn route_opts_are_the_same_for_flat_protection_keys_and_the_protection_section() {
    let cluster = engines(1);
    let flat = "ttft_limit_ms: 12000\ntps_window: 7s\nsession_prio: true\nrt_limit_factor: 1.5\n";
    let nested = "protection:\n  ttft: {limit_ms: 12000}\n  tps: {window: 7s}\n  session_prio: {enabled: true, rt_limit_factor: 1.5}\n";
    let other = "protection:\n  ttft: {limit_ms: 12001}\n  tps: {window: 7s}\n  session_prio: {enabled: true, rt_limit_factor: 1.5}\n";
    let gw = Gateway::start(&[
        ("flat", route_yaml(&ports(&cluster), flat)),
        ("nested", route_yaml(&ports(&cluster), nested)),
        ("other", route_yaml(&ports(&cluster), other)),
    ]);
    let opts = |route: &str| {
        let mut v = http::get(gw.addr, &format!("/{route}/_route_opts")).json();
        v.as_object_mut().expect("an object").remove("route");
        v
    };
    let (flat, nested) = (opts("flat"), opts("nested"));
    assert_eq!(flat, nested);
    let limit = option(&nested, "options", "protection.ttft.limit_ms");
    assert_eq!(
        (&limit["value"], &limit["set_by_route"], &limit["formerly"]),
        (&json!(12000.0), &json!(true), &json!("ttft_limit_ms"))
    );
    // Control: one value apart shows.
    assert_ne!(opts("other"), nested);
    // The flat file loads with a notice naming the new place; the nested does not.
    let log = gw.log();
    assert!(
        log.contains("flat.yaml: ttft_limit_ms (line")
            && log.contains("is deprecated: write it as protection.ttft.limit_ms"),
        "{log}"
    );
    assert!(!log.contains("nested.yaml: "), "{log}");
}

/// Every read endpoint's path, as the 404 for an unknown one lists them
/// (`ENDPOINTS`, without their queries), and the gateway-wide
/// `/_bodylog_status`: a read endpoint added later is in the test below
/// without being named in it.
fn read_endpoints() -> Vec<String> {
    let mut paths: Vec<String> = llm_gateway::route_endpoints::ENDPOINTS
        .iter()
        .filter(|e| !e.starts_with("POST "))
        .map(|e| format!("/chat{}", e.split(['?', '[']).next().unwrap_or(e)))
        .collect();
    // "/_ttft_status" and the others are listed one by one.
    assert!(paths.len() >= 13, "{paths:?}");
    paths.push("/_bodylog_status".into());
    paths
}

#[test]
fn every_read_endpoint_answers_405_to_a_method_it_does_not_serve() {
    let cluster = engines(1);
    let gw = Gateway::start(&[("chat", route_yaml(&ports(&cluster), ""))]);
    let r = http::request(gw.addr, "DELETE", "/chat/_route_debug", &[], b"");
    assert_eq!(r.status(), 405, "{}", r.text());
    for path in read_endpoints() {
        // Control: the endpoint is there, and reads with GET and HEAD.
        let r = http::get(gw.addr, &path);
        assert_eq!(r.status(), 200, "GET {path}: {}", r.text());
        let mut conn = http::Conn::open(gw.addr);
        conn.send("HEAD", &path, &[], b"", http::Upload::Length);
        assert_eq!(conn.read_head().status, 200, "HEAD {path}");
        for method in ["DELETE", "OPTIONS", "BREW", "POST", "PUT", "PATCH"] {
            let r = http::request(gw.addr, method, &path, &[], b"");
            assert_eq!(r.status(), 405, "{method} {path}: {}", r.text());
            assert_eq!(r.json()["error"]["type"], "method_not_allowed");
            assert_eq!(r.header("allow"), Some("GET, HEAD"), "{method} {path}");
        }
    }
    // An unknown endpoint is still a 404 whatever the method.
    let r = http::request(gw.addr, "DELETE", "/chat/_nothing_here", &[], b"");
    assert_eq!(r.status(), 404, "{}", r.text());
}

/// The admin listener's endpoints are read endpoints too: any other method
/// is a 405 naming GET and HEAD. The control: GET reads each; an unknown
/// admin path is still a 404 whatever the method.
#[test]
fn admin_endpoints_answer_405_to_a_method_they_do_not_serve() {
    let cluster = engines(1);
    let gw = Gateway::start(&[("chat", route_yaml(&ports(&cluster), ""))]);
    for path in [
        "/healthz",
        "/metrics",
        "/_routes",
        "/dashboard",
        "/dashboard.json",
    ] {
        assert_eq!(http::get(gw.admin, path).status(), 200, "GET {path}");
        for method in ["DELETE", "POST", "PUT", "BREW"] {
            let r = http::request(gw.admin, method, path, &[], b"");
            assert_eq!(r.status(), 405, "{method} {path}: {}", r.text());
            assert_eq!(r.json()["error"]["type"], "method_not_allowed");
            assert_eq!(r.header("allow"), Some("GET, HEAD"), "{method} {path}");
        }
    }
    assert_eq!(
        http::request(gw.admin, "DELETE", "/nothing", &[], b"").status(),
        404
    );
}
