//! Sessions stick where their cache is, move when their
//! peer goes away and stay moved, limits answer 429/503, pools and tiers,
//! and no raw session id leaks.

mod common;

use common::http::{self, Conn, Upload};
use common::*;
use serde_json::json;
use std::sync::atomic::Ordering;
use std::time::Duration;

const CHAT: &str = "/chat/v1/chat/completions";

/// A conversation turn: the whole history so far, as agents send it.
fn turn_body(history: &[String]) -> serde_json::Value {
    let messages: Vec<_> = history
        .iter()
        .enumerate()
        .map(|(i, m)| json!({"role": if i % 2 == 0 {"user"} else {"assistant"}, "content": m}))
        .collect();
    json!({"model": "sim-model", "max_tokens": 4, "messages": messages})
}

fn long_text(tag: &str, tokens: usize) -> String {
    (0..tokens).map(|i| format!("{tag}{i:04} ")).collect()
}

fn peer_of(r: &http::Response) -> String {
    r.header("x-routed-peer").unwrap_or("?").to_string()
}

#[test]
fn session_sticks_across_turns_and_its_cache_hits_grow() {
    let cluster = engines(3);
    let gw = Gateway::start(&[("chat", route_yaml(&ports(&cluster), ""))]);
    let mut history = vec![long_text("sys", 300)];
    let mut peers = Vec::new();
    let mut cached = Vec::new();
    for turn in 0..4 {
        let r = http::post_json(
            gw.addr,
            CHAT,
            &[("x-session-id", "conv-stick")],
            &turn_body(&history),
        );
        assert_eq!(r.status(), 200, "{}", r.text());
        assert_eq!(
            r.header("x-routed-mode"),
            Some(if turn == 0 { "new" } else { "sticky" })
        );
        assert_eq!(r.header("x-routed-source"), Some("header:x-session-id"));
        peers.push(peer_of(&r));
        cached.push(
            r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap(),
        );
        history.push(format!("answer {turn}"));
        history.push(long_text(&format!("t{turn}-"), 200));
    }
    assert!(
        peers.iter().all(|p| p == &peers[0]),
        "one peer for the whole conversation: {peers:?}"
    );
    assert_eq!(cached[0], 0, "first turn is cold");
    assert!(
        cached.windows(2).all(|w| w[1] > w[0]),
        "cache hits grow each turn: {cached:?}"
    );
    // The gateway counted the same usage, when it logged each request (just
    // after the client had the response).
    let expected = cached.iter().sum::<u64>() as f64;
    wait_for("the gateway's cached-token counter", DEADLINE, || {
        let counted = gw.metric(
            "llm_gateway_cached_prompt_tokens_total",
            &["route=\"chat\""],
        );
        (counted == expected).then_some(())
    });
    assert!(gw.metric("llm_gateway_placements_total", &["kind=\"sticky\""]) >= 3.0);
    // One conversation, one remembered binding.
    let sessions = http::get(gw.addr, "/chat/_sessions").json();
    assert_eq!(sessions["total"], 1);
}

#[test]
fn streamed_usage_is_counted_and_ttft_observed() {
    let cluster = engines(1);
    let gw = Gateway::start(&[("chat", route_yaml(&ports(&cluster), ""))]);
    let body = json!({"model": "m", "stream": true, "stream_options": {"include_usage": true}, "max_tokens": 3,
                      "messages": [{"role": "user", "content": long_text("u", 100)}]});
    let r = http::post_json(gw.addr, CHAT, &[], &body);
    assert_eq!(r.status(), 200);
    // Counted when the request is logged, just after the client has the response.
    wait_for("token counters", DEADLINE, || {
        let done = gw.metric("llm_gateway_completion_tokens_total", &["route=\"chat\""]) == 3.0;
        done.then_some(())
    });
    assert!(gw.metric("llm_gateway_prompt_tokens_total", &["route=\"chat\""]) > 0.0);
    assert_eq!(
        gw.metric("llm_gateway_completion_tokens_total", &["route=\"chat\""]),
        3.0
    );
    assert_eq!(
        gw.metric(
            "llm_gateway_time_to_first_token_seconds_count",
            &["route=\"chat\""]
        ),
        1.0
    );
}

#[test]
fn peer_taken_down_moves_its_sessions_and_they_stay_moved() {
    let cluster = engines(2);
    let route = route_yaml(
        &ports(&cluster),
        "health:\n  interval: 100ms\n  ban_ttl: 1h\n",
    );
    let gw = Gateway::start(&[("chat", route)]);
    let body = turn_body(&[long_text("a", 50)]);
    let first = http::post_json(gw.addr, CHAT, &[("x-session-id", "conv-move")], &body);
    let home = peer_of(&first);
    let home_idx: usize = home[1..].parse().unwrap();
    let other = format!("e{}", 1 - home_idx);

    cluster.engines[home_idx]
        .faults
        .health_down
        .store(true, Ordering::Relaxed);
    wait_for(
        "the home peer to be banned by a probe",
        Duration::from_secs(2),
        || {
            let st = http::get(gw.addr, "/chat/_health_status").json();
            let p = st["peers"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["name"] == home.as_str())
                .cloned()
                .unwrap();
            (p["ready"] == false).then_some(())
        },
    );
    let moved = http::post_json(gw.addr, CHAT, &[("x-session-id", "conv-move")], &body);
    assert_eq!(peer_of(&moved), other);
    assert_eq!(moved.header("x-routed-mode"), Some("migrated"));
    assert_eq!(
        gw.metric(
            "llm_gateway_placements_total",
            &["kind=\"migrated\"", "reason=\"not_ready\""]
        ),
        1.0
    );

    // The home peer comes back (control: it is ready again) ...
    cluster.engines[home_idx]
        .faults
        .health_down
        .store(false, Ordering::Relaxed);
    wait_for(
        "the home peer to be ready again",
        Duration::from_secs(2),
        || {
            let st = http::get(gw.addr, "/chat/_health_status").json();
            let ready = st["peers"]
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p["name"] == home.as_str() && p["ready"] == true);
            ready.then_some(())
        },
    );
    // ... and the session stays where its cache now is.
    let after = http::post_json(gw.addr, CHAT, &[("x-session-id", "conv-move")], &body);
    assert_eq!(peer_of(&after), other);
    assert_eq!(after.header("x-routed-mode"), Some("sticky"));
}

#[test]
fn concurrency_limit_is_429_and_no_ready_peer_is_503() {
    let cluster = engines(1);
    let route = format!(
        "peers:\n  - {{name: only, host: 127.0.0.1, port: {}, max_concurrency: 1}}\nhealth:\n  interval: 100ms\n  ban_ttl: 1h\n",
        cluster.engines[0].port()
    );
    let gw = Gateway::start(&[("chat", route)]);
    let mut held = Conn::open(gw.addr);
    let stream =
        json!({"model": "m", "stream": true, "messages": [{"role": "user", "content": "x"}]});
    held.send(
        "POST",
        CHAT,
        &[("Content-Type", "application/json"), ("x-sim-gate", "full")],
        stream.to_string().as_bytes(),
        Upload::Length,
    );
    assert_eq!(held.read_head().status, 200);
    held.read_chunk().expect("first frame");

    let r = http::post_json(gw.addr, CHAT, &[], &chat_body("s", "x", false));
    assert_eq!(r.status(), 429, "{}", r.text());
    assert_eq!(r.header("retry-after"), Some("1"));
    let e = &r.json()["error"];
    assert_eq!(e["type"], "concurrency_limit");
    assert_eq!(
        (
            e["limit"].as_u64(),
            e["in_flight"].as_u64(),
            e["healthy_peers"].as_u64()
        ),
        (Some(1), Some(1), Some(1))
    );

    // Control: once the stream ends, the same request is admitted.
    cluster.engines[0].open_gate("full");
    while let Ok(Some(_)) = held.read_chunk() {}
    gw.wait_idle();
    assert_eq!(
        http::post_json(gw.addr, CHAT, &[], &chat_body("s", "x", false)).status(),
        200
    );

    cluster.engines[0]
        .faults
        .health_down
        .store(true, Ordering::Relaxed);
    let r = wait_for(
        "503 once the only peer is banned",
        Duration::from_secs(2),
        || {
            let r = http::post_json(gw.addr, CHAT, &[], &chat_body("s", "x", false));
            (r.status() != 200).then_some(r)
        },
    );
    assert_eq!(r.status(), 503, "{}", r.text());
    assert_eq!(r.header("retry-after"), Some("5"));
    assert_eq!(r.json()["error"]["type"], "no_healthy_upstream");
    gw.wait_idle();
}

#[test]
fn a_busy_probe_answer_does_not_ban() {
    let cluster = engines(2);
    let gw = Gateway::start(&[(
        "chat",
        route_yaml(
            &ports(&cluster),
            "health:\n  interval: 50ms\n  ban_ttl: 1h\n",
        ),
    )]);
    cluster.engines[0]
        .faults
        .health_status
        .store(429, Ordering::Relaxed);
    cluster.engines[1]
        .faults
        .health_status
        .store(500, Ordering::Relaxed);
    // Control: the 500 peer gets banned, proving probes ran meanwhile.
    wait_for(
        "the failing peer to be banned",
        Duration::from_secs(2),
        || {
            let st = http::get(gw.addr, "/chat/_health_status").json();
            (st["peers"][1]["ready"] == false).then_some(())
        },
    );
    let st = http::get(gw.addr, "/chat/_health_status").json();
    assert_eq!(st["peers"][0]["ready"], true, "429 means busy, not dead");
}

/// `peer`'s entry in `/chat/_health_status`.
fn health_of(gw: &Gateway, peer: &str) -> serde_json::Value {
    let st = http::get(gw.addr, "/chat/_health_status").json();
    st["peers"]
        .as_array()
        .and_then(|peers| peers.iter().find(|p| p["name"] == peer).cloned())
        .unwrap_or_else(|| panic!("no peer {peer} in {st}"))
}

fn health_checks(cluster: &SimCluster, i: usize) -> u64 {
    cluster.engines[i]
        .stats
        .health_checks
        .load(Ordering::SeqCst)
}

/// A probe that gets no answer within `health.timeout` counts the engine
/// busy, not down (the OpenResty gateway's rule: banning a peer too loaded
/// to answer its probe removes capacity exactly when it is needed). Both
/// engines answer their probe 503; e0 answers it past the timeout, e1 in
/// time. The controls: e1 is banned, and e0 is banned too once its 503
/// comes in time.
#[test]
fn a_probe_that_times_out_counts_the_engine_busy_not_down() {
    let cluster = engines(2);
    for engine in &cluster.engines {
        engine.faults.health_status.store(503, Ordering::SeqCst);
    }
    cluster.engines[0]
        .faults
        .health_delay_ms
        .store(2000, Ordering::SeqCst);
    cluster.engines[1]
        .faults
        .health_delay_ms
        .store(50, Ordering::SeqCst);
    let gw = Gateway::start(&[(
        "chat",
        route_yaml(
            &ports(&cluster),
            "health:\n  interval: 100ms\n  timeout: 400ms\n  ban_ttl: 1h\n",
        ),
    )]);
    let down = wait_for("e1's late-but-in-time 503 to ban it", DEADLINE, || {
        let e1 = health_of(&gw, "e1");
        (e1["ready"] == false).then_some(e1)
    });
    assert_eq!(down["last_probe"], "down", "{down}");
    let busy = wait_for("e0's probes to time out", DEADLINE, || {
        let e0 = health_of(&gw, "e0");
        (e0["last_probe"] == "busy" && health_checks(&cluster, 0) >= 2).then_some(e0)
    });
    assert_eq!(busy["ready"], true, "a timeout is busy, not down: {busy}");
    assert_eq!(busy["failing"], false, "{busy}");
    // Still taking traffic: every request goes to e0, the one left.
    for n in 0..3 {
        let r = http::post_json(gw.addr, CHAT, &[], &chat_body(&format!("s{n}"), "x", false));
        assert_eq!(r.status(), 200, "{}", r.text());
        assert_eq!(peer_of(&r), "e0");
    }
    // Control: the same 503 from e0, now in time, bans it.
    cluster.engines[0]
        .faults
        .health_delay_ms
        .store(0, Ordering::SeqCst);
    let e0 = wait_for("e0's in-time 503 to ban it", DEADLINE, || {
        let e0 = health_of(&gw, "e0");
        (e0["ready"] == false).then_some(e0)
    });
    assert_eq!(e0["last_probe"], "down", "{e0}");
}

/// A peer's own `probe_path` is what its probe asks, not the route's
/// `health.probe_path`: engines whose health check is at `/ready` (and
/// `/health` a 404), e0 with `probe_path: /ready`, e1 on the route's
/// default. The control: e1, probed at `/health`, is banned.
#[test]
fn a_peers_own_probe_path_is_the_one_probed() {
    let cluster = spawn_engines(
        2,
        0,
        EngineConfig {
            health_path: "/ready".into(),
            ..EngineConfig::default()
        },
    )
    .expect("simulated engines");
    let p = ports(&cluster);
    let route = format!(
        "peers:\n  - {{name: e0, host: 127.0.0.1, port: {}, probe_path: /ready}}\n  - {{name: e1, host: 127.0.0.1, port: {}}}\nhealth:\n  interval: 100ms\n  ban_ttl: 1h\n",
        p[0], p[1]
    );
    let gw = Gateway::start(&[("chat", route)]);
    let e1 = wait_for("e1, probed at /health, to be banned", DEADLINE, || {
        let e1 = health_of(&gw, "e1");
        (e1["ready"] == false).then_some(e1)
    });
    assert_eq!(
        (&e1["last_probe"], &e1["probe_path"]),
        (&json!("down"), &json!("/health")),
        "{e1}"
    );
    let e0 = wait_for("e0's probes at /ready", DEADLINE, || {
        let e0 = health_of(&gw, "e0");
        (e0["last_probe"] == "ready" && health_checks(&cluster, 0) >= 2).then_some(e0)
    });
    assert_eq!(
        (&e0["ready"], &e0["probe_path"]),
        (&json!(true), &json!("/ready")),
        "{e0}"
    );
    assert_eq!(
        health_checks(&cluster, 1),
        0,
        "e1 was never asked at /ready"
    );
}

#[test]
fn model_pools_and_gateway_answered_model_list() {
    let cluster = engines(3);
    let p = ports(&cluster);
    let route = format!(
        "{}peers_by_model:\n  llama: [e0]\n  qwen: [e1, e2]\n",
        route_yaml(&p, "")
    );
    let gw = Gateway::start(&[("chat", route)]);
    let models = http::get(gw.addr, "/chat/v1/models").json();
    let ids: Vec<&str> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec!["llama", "qwen"]);
    for _ in 0..4 {
        let r = http::post_json(
            gw.addr,
            CHAT,
            &[],
            &json!({"model": "llama", "messages": [{"role": "user", "content": "x"}]}),
        );
        assert_eq!(peer_of(&r), "e0");
        let r = http::post_json(
            gw.addr,
            CHAT,
            &[],
            &json!({"model": "qwen", "messages": [{"role": "user", "content": "x"}]}),
        );
        assert!(["e1", "e2"].contains(&peer_of(&r).as_str()));
    }
    let r = http::post_json(
        gw.addr,
        CHAT,
        &[],
        &json!({"model": "gpt-9", "messages": []}),
    );
    assert_eq!(r.status(), 400);
    assert_eq!(r.json()["error"]["type"], "unknown_model");
    assert_eq!(r.json()["error"]["supported"], json!(["llama", "qwen"]));
    let r = http::post_json(gw.addr, CHAT, &[], &json!({"messages": []}));
    assert_eq!(r.status(), 400);
}

#[test]
fn tiers_prefer_primary_and_fall_back() {
    let cluster = engines(2);
    let route = format!(
        "peers:\n  - {{name: primary, host: 127.0.0.1, port: {}, priority: 0, max_concurrency: 1}}\n  - {{name: backup, host: 127.0.0.1, port: {}, priority: 1}}\nhealth:\n  interval: 100ms\n  ban_ttl: 1h\n",
        cluster.engines[0].port(),
        cluster.engines[1].port()
    );
    let overflow = route.replace(
        "health:",
        "balancing:\n  cross_tier_fallback: true\nhealth:",
    );
    let gw = Gateway::start(&[("chat", route), ("spill", overflow)]);
    for _ in 0..3 {
        let r = http::post_json(gw.addr, CHAT, &[], &chat_body("s", "x", false));
        assert_eq!(peer_of(&r), "primary");
    }
    // Fill the primary (max_concurrency 1) of each route with a held stream.
    let hold = |route: &str| {
        let mut held = Conn::open(gw.addr);
        let stream =
            json!({"model": "m", "stream": true, "messages": [{"role": "user", "content": "x"}]});
        held.send(
            "POST",
            &format!("/{route}/v1/chat/completions"),
            &[("Content-Type", "application/json"), ("x-sim-gate", "t")],
            stream.to_string().as_bytes(),
            Upload::Length,
        );
        let head = held.read_head();
        assert_eq!(head.status, 200);
        assert_eq!(head.header("x-routed-peer"), Some("primary"));
        held.read_chunk().expect("first frame");
        held
    };
    let mut held = [hold("chat"), hold("spill")];
    // Primary full: without cross_tier_fallback → 429; with it → backup.
    assert_eq!(
        http::post_json(gw.addr, CHAT, &[], &chat_body("s", "x", false)).status(),
        429
    );
    let r = http::post_json(
        gw.addr,
        "/spill/v1/chat/completions",
        &[],
        &chat_body("s", "x", false),
    );
    assert_eq!(r.status(), 200);
    assert_eq!(peer_of(&r), "backup");
    cluster.engines[0].open_gate("t");
    for h in held.iter_mut() {
        while let Ok(Some(_)) = h.read_chunk() {}
    }
    gw.wait_idle();
    // Primary down: traffic moves to the next tier.
    cluster.engines[0]
        .faults
        .health_down
        .store(true, Ordering::Relaxed);
    let r = wait_for("traffic on the backup tier", Duration::from_secs(2), || {
        let r = http::post_json(gw.addr, CHAT, &[], &chat_body("s", "x", false));
        (peer_of(&r) == "backup").then_some(r)
    });
    assert_eq!(r.status(), 200);
}

/// A session id in the headers binds any endpoint's request, not only the
/// chat endpoints whose body the gateway reads (control: without one, the
/// same request is placed by load alone).
#[test]
fn a_header_session_binds_endpoints_whose_body_is_not_read() {
    let cluster = engines(2);
    let gw = Gateway::start(&[("chat", route_yaml(&ports(&cluster), ""))]);
    let body = json!({"model": "m", "input": "x"});
    for (turn, mode) in ["new", "sticky"].into_iter().enumerate() {
        let r = http::post_json(
            gw.addr,
            "/chat/v1/embeddings",
            &[("x-session-id", "embed-1")],
            &body,
        );
        assert_eq!(r.header("x-routed-mode"), Some(mode), "turn {turn}");
        assert_eq!(r.header("x-routed-source"), Some("header:x-session-id"));
    }
    let r = http::post_json(gw.addr, "/chat/v1/embeddings", &[], &body);
    assert_eq!(r.header("x-routed-mode"), Some("least_conn"));
    assert_eq!(r.header("x-routed-source"), None);
}

/// The headers agent clients send unasked that name their session bind it
/// with nothing else in the request: the Codex CLI's `session-id`, and
/// `session_id` from its earlier versions (one session for one value,
/// whichever of the two carries it). The requests are Codex's Responses
/// calls with content recognition off, so a session can only come from the
/// header; the control: the same request without it has none.
#[test]
fn agent_clients_own_session_headers_bind_a_session() {
    let cluster = engines(2);
    let extra = "balancing:\n  session_affinity:\n    content: off\n";
    let gw = Gateway::start(&[("chat", route_yaml(&ports(&cluster), extra))]);
    let body = json!({"model": "sim-model", "instructions": "You are Codex.",
                      "input": [{"role": "user", "content": [{"type": "input_text", "text": "fix it"}]}],
                      "stream": false});
    let responses = |headers: &[(&str, &str)]| {
        let r = http::post_json(gw.addr, "/chat/v1/responses", headers, &body);
        assert_eq!(r.status(), 200, "{}", r.text());
        r
    };
    let mut bound = Vec::new();
    for header in ["session-id", "session_id"] {
        for (turn, mode) in ["new", "sticky"].into_iter().enumerate() {
            let r = responses(&[(header, "019a-codex-thread")]);
            assert_eq!(
                r.header("x-routed-source"),
                Some(format!("header:{header}").as_str()),
                "{header} turn {turn}"
            );
            let want = if header == "session_id" {
                "sticky"
            } else {
                mode
            };
            assert_eq!(
                r.header("x-routed-mode"),
                Some(want),
                "{header} turn {turn}"
            );
            bound.push(r.header("x-routed-session").map(str::to_string));
        }
    }
    assert!(bound[0].is_some());
    assert!(
        bound.iter().all(|s| *s == bound[0]),
        "one value, one session: {bound:?}"
    );
    let sessions = http::get(gw.addr, "/chat/_sessions").json();
    assert_eq!(sessions["total"], 1, "{sessions}");
    // Control: without the header, no session at all.
    let r = responses(&[]);
    assert_eq!(r.header("x-routed-session"), None);
    assert_eq!(r.header("x-routed-source"), None);
    assert_eq!(r.header("x-routed-mode"), Some("least_conn"));
    // Codex's other ids are not read as sessions either.
    let r = responses(&[
        ("conversation_id", "019a-codex-thread"),
        ("thread-id", "t-1"),
    ]);
    assert_eq!(r.header("x-routed-session"), None);
}

#[test]
fn hash_and_least_conn_modes() {
    let cluster = engines(3);
    let p = ports(&cluster);
    let gw = Gateway::start(&[
        ("h", route_yaml(&p, "balancing:\n  mode: hash\n")),
        ("lc", route_yaml(&p, "balancing:\n  mode: least_conn\n")),
    ]);
    let mut homes = std::collections::HashSet::new();
    for i in 0..12 {
        let sid = format!("hash-{}", i % 4);
        let r = http::post_json(
            gw.addr,
            "/h/v1/chat/completions",
            &[("x-session-id", &sid)],
            &chat_body(&sid, "x", false),
        );
        assert_eq!(r.header("x-routed-mode"), Some("hash"));
        homes.insert((sid, peer_of(&r)));
    }
    assert_eq!(
        homes.len(),
        4,
        "each session has exactly one home: {homes:?}"
    );
    let r = http::post_json(
        gw.addr,
        "/lc/v1/chat/completions",
        &[("x-session-id", "s")],
        &chat_body("s", "x", false),
    );
    assert_eq!(r.header("x-routed-mode"), Some("least_conn"));
    // No session id: least-connections in every mode.
    let r = http::post_json(
        gw.addr,
        "/h/v1/chat/completions",
        &[],
        &json!({"model": "m", "messages": []}),
    );
    assert_eq!(r.header("x-routed-mode"), Some("least_conn"));
    assert_eq!(r.header("x-routed-session"), None);
}

#[test]
fn raw_session_id_never_reaches_logs_metrics_or_debug_endpoints() {
    let cluster = engines(2);
    let secret = "SECRET-sess-7f3a9c";
    let gw = Gateway::start_with(
        &[("chat", route_yaml(&ports(&cluster), ""))],
        GatewayOptions {
            env: vec![("RUST_LOG".into(), "debug".into())],
            ..Default::default()
        },
    );
    let header = http::post_json(
        gw.addr,
        CHAT,
        &[("x-session-id", secret)],
        &chat_body("other", "x", false),
    );
    let body_sid = http::post_json(
        gw.addr,
        CHAT,
        &[],
        &json!({"model": "m", "user": secret, "messages": []}),
    );
    assert_eq!(header.status(), 200);
    let hex = header
        .header("x-routed-session")
        .expect("hashed id")
        .to_string();
    assert_eq!(
        hex,
        llm_gateway::hash::hex16(llm_gateway::hash::stable_hash64(secret.as_bytes()))
    );
    assert_eq!(
        body_sid.header("x-routed-session"),
        Some(hex.as_str()),
        "same id, same hash from the body"
    );
    assert_eq!(body_sid.header("x-routed-source"), Some("body:user"));

    let debug = http::get(gw.addr, &format!("/chat/_route_debug?sid={secret}")).text();
    // Control: the debug endpoint does report this session, by its hash.
    assert!(debug.contains(&hex), "{debug}");
    let mut seen = vec![("route_debug", debug)];
    for path in [
        "/chat/_route_state",
        "/chat/_sessions",
        "/chat/_health_status",
        "/chat/_active_conns",
    ] {
        seen.push((path, http::get(gw.addr, path).text()));
    }
    seen.push(("metrics", http::get(gw.admin, "/metrics").text()));
    seen.push(("routes", http::get(gw.admin, "/_routes").text()));
    seen.push(("log", gw.log()));
    for (what, text) in &seen {
        let leaks: Vec<&str> = text
            .lines()
            .filter(|l| l.contains(secret))
            .take(3)
            .collect();
        assert!(
            leaks.is_empty(),
            "raw session id leaked into {what}: {leaks:?}"
        );
    }
    // Control: the value did travel (the engine got it), so the search above
    // would have found it had the gateway copied it anywhere.
    let at_engine = cluster
        .engines
        .iter()
        .flat_map(|e| e.stats.recorded.lock().clone())
        .any(|r| {
            r.headers.iter().any(|(_, v)| v == secret)
                || String::from_utf8_lossy(&r.body).contains(secret)
        });
    assert!(at_engine);
    assert!(gw.log().contains("DEBUG"), "debug logging was on");
}

#[test]
fn invalid_affinity_is_rejected_on_reload_and_deprecated_key_warns() {
    let cluster = engines(1);
    let p = ports(&cluster);
    let gw = Gateway::start(&[("chat", route_yaml(&p, ""))]);
    let errors = gw.metric("llm_gateway_reloads_total", &["result=\"error\""]);
    gw.write_route(
        "chat",
        &route_yaml(
            &p,
            "balancing:\n  mode: least_conn\n  session_affinity:\n    headers: [x-a]\n",
        ),
    );
    gw.reload();
    assert_eq!(
        gw.metric("llm_gateway_reloads_total", &["result=\"error\""]),
        errors + 1.0
    );
    let state = http::get(gw.addr, "/chat/_route_state").json();
    assert_eq!(state["mode"], "load_aware", "previous version kept");
    gw.write_route(
        "chat",
        &route_yaml(&p, "balancing:\n  max_load_percent: 125\n"),
    );
    gw.reload();
    assert!(gw.log().contains("max_load_percent is deprecated"));
    assert_eq!(
        http::post_json(gw.addr, CHAT, &[], &chat_body("s", "x", false)).status(),
        200
    );
}

#[test]
fn engine_metrics_are_scraped_and_reported() {
    let cluster = engines(2);
    let gw = Gateway::start(&[(
        "chat",
        route_yaml(&ports(&cluster), "engine_metrics:\n  interval: 100ms\n"),
    )]);
    let state = wait_for("fresh engine metrics", Duration::from_secs(3), || {
        let s = http::get(gw.addr, "/chat/_route_state").json();
        (s["peers"][0]["engine"]["fresh"] == true && s["peers"][1]["engine"]["fresh"] == true)
            .then_some(s)
    });
    assert_eq!(state["peers"][0]["engine"]["waiting"], 0);
    assert_eq!(state["peers"][0]["kv_full"], false);
    // Control: with scraping off there is nothing to report, even after
    // three scrape intervals of the first gateway have passed.
    let gw2 = Gateway::start(&[(
        "chat",
        route_yaml(&ports(&cluster), "engine_metrics: false\n"),
    )]);
    std::thread::sleep(Duration::from_millis(300));
    let s = http::get(gw2.addr, "/chat/_route_state").json();
    assert!(s["peers"][0]["engine"].is_null());
}

/// Waits until a probe has banned (or readmitted) `peer` of route `route`.
fn wait_ready(gw: &Gateway, route: &str, peer: &str, ready: bool) {
    wait_for(
        "the peer's readiness to change",
        Duration::from_secs(5),
        || {
            let st = http::get(gw.addr, &format!("/{route}/_health_status")).json();
            st["peers"]
                .as_array()?
                .iter()
                .any(|p| p["name"] == peer && p["ready"] == ready)
                .then_some(())
        },
    );
}

/// Fails the probes of peer `eN` and waits until the route has banned it.
fn take_down(gw: &Gateway, cluster: &SimCluster, route: &str, peer: &str) {
    let index: usize = peer[1..].parse().expect("peers are named eN");
    cluster.engines[index]
        .faults
        .health_down
        .store(true, Ordering::Relaxed);
    wait_ready(gw, route, peer, false);
}

#[test]
fn hash_mode_labels_a_session_whose_home_is_down_hash_fallback() {
    let cluster = engines(3);
    let extra = "balancing:\n  mode: hash\nhealth:\n  interval: 100ms\n  ban_ttl: 1h\n";
    let gw = Gateway::start(&[("h", route_yaml(&ports(&cluster), extra))]);
    let send = || {
        http::post_json(
            gw.addr,
            "/h/v1/chat/completions",
            &[("x-session-id", "hash-home")],
            &chat_body("hash-home", "x", false),
        )
    };
    // Control: with its home ready, the session is at home, mode `hash`.
    let first = send();
    assert_eq!(first.header("x-routed-mode"), Some("hash"));
    let home = peer_of(&first);
    take_down(&gw, &cluster, "h", &home);

    let moved = send();
    assert_ne!(peer_of(&moved), home);
    assert_eq!(moved.header("x-routed-mode"), Some("hash_fallback"));
    assert_eq!(
        gw.metric(
            "llm_gateway_placements_total",
            &["kind=\"hash_fallback\"", "reason=\"not_ready\""]
        ),
        1.0
    );
    // The explanation names the home as down, not as gone from the config.
    let debug = http::get(gw.addr, "/h/_route_debug?sid=hash-home").json();
    assert_eq!(debug["decision"]["kind"], "hash_fallback", "{debug}");
}

#[test]
fn route_debug_calls_a_banned_peer_not_ready() {
    let cluster = engines(2);
    let extra = "health:\n  interval: 100ms\n  ban_ttl: 1h\n";
    let gw = Gateway::start(&[("chat", route_yaml(&ports(&cluster), extra))]);
    let first = http::post_json(
        gw.addr,
        CHAT,
        &[("x-session-id", "dbg")],
        &chat_body("dbg", "x", false),
    );
    let home = peer_of(&first);
    take_down(&gw, &cluster, "chat", &home);
    let debug = http::get(gw.addr, "/chat/_route_debug?sid=dbg").json();
    let why = debug["why"].as_str().unwrap_or_default();
    assert!(why.contains("is not ready"), "{debug}");
    assert!(!why.contains("no longer configured"), "{debug}");
}

/// Where each peer's KV capacity comes from, end to end: a vLLM that
/// publishes it (`metrics`), a llama.cpp that publishes its context in
/// `/props` (`props`), the route file (`configured`), and a vLLM that keeps
/// it to itself, whose capacity is learned from its KV-usage gauge against
/// the prompts in flight there (`learned`), unknown until traffic teaches it.
#[test]
fn kv_capacity_comes_from_metrics_props_the_route_or_is_learned() {
    use llm_gateway_sim::{spawn_engines_with, EngineConfig, Profile, StepCost};
    // Slow enough steps that the held streams below stay in the engine's
    // batch for the whole test: 10 ms a token.
    let slow = StepCost {
        base_us: 10_000.0,
        per_token_us: 1.0,
        per_seq_us: 0.0,
        per_context_token_us: 0.0,
    };
    let vllm = |publish| EngineConfig {
        profile: Profile::Vllm,
        kv_capacity_tokens: 40_000,
        publish_kv_capacity: publish,
        step_cost: slow,
        ..EngineConfig::default()
    };
    let llama = EngineConfig {
        profile: Profile::Llamacpp,
        max_running: 4,
        kv_capacity_tokens: 32_768,
        ..EngineConfig::default()
    };
    let cluster =
        spawn_engines_with(vec![vllm(true), llama, vllm(true), vllm(false)], 0).expect("engines");
    let p = ports(&cluster);
    let peer = |i: usize, extra: &str| {
        format!(
            "  - {{name: e{i}, host: 127.0.0.1, port: {}, max_concurrency: 64{extra}}}\n",
            p[i]
        )
    };
    let route = format!(
        "peers:\n{}{}{}engine_metrics:\n  interval: 100ms\n",
        peer(0, ""),
        peer(1, ""),
        peer(2, ", kv_capacity_tokens: 12345"),
    );
    let blind = format!(
        "peers:\n{}engine_metrics:\n  interval: 100ms\n",
        peer(3, "")
    );
    let gw = Gateway::start(&[("chat", route), ("blind", blind)]);
    let source = |route: &str, i: usize| {
        let s = http::get(gw.addr, &format!("/{route}/_route_state")).json();
        let p = &s["peers"][i];
        (
            p["kv_capacity_tokens"].as_u64(),
            p["kv_capacity_source"].clone(),
        )
    };
    wait_for("published capacities", Duration::from_secs(5), || {
        (source("chat", 0).0.is_some() && source("chat", 1).0.is_some()).then_some(())
    });
    assert_eq!(source("chat", 0), (Some(40_000), json!("metrics")));
    assert_eq!(
        source("chat", 1),
        (Some(32_768), json!("props")),
        "4 slots of 8192"
    );
    assert_eq!(
        source("chat", 2),
        (Some(12_345), json!("configured")),
        "the route file wins over the engine's own 40000"
    );
    // The control for learning: scraped for a while with nothing in
    // flight, the silent engine's capacity is still unknown.
    std::thread::sleep(Duration::from_millis(800));
    assert_eq!(source("blind", 0), (None, serde_json::Value::Null));

    // Three long streams of ~4000-token prompts: about 12k of its 40k tokens.
    let held: Vec<http::Conn> = (0..3)
        .map(|n| {
            let mut conn = http::Conn::open(gw.addr);
            let body = json!({"model": "sim-model", "stream": true, "max_tokens": 5000,
                "messages": [{"role": "user", "content": format!("{n} {}", "x".repeat(16_000))}]});
            conn.send(
                "POST",
                "/blind/v1/chat/completions",
                &[("content-type", "application/json")],
                body.to_string().as_bytes(),
                http::Upload::Length,
            );
            assert_eq!(conn.read_head().status, 200);
            conn
        })
        .collect();
    let (tokens, learned) = wait_for("a learned capacity", Duration::from_secs(10), || {
        let (tokens, source) = source("blind", 0);
        Some((tokens?, source))
    });
    assert_eq!(learned, json!("learned"));
    assert!(
        (30_000..=52_000).contains(&tokens),
        "learned {tokens}, the engine has 40000"
    );
    drop(held);
}

/// A request counts as awaiting its first token on its peer until the
/// engine's first content frame, and not after: what a new session's
/// placement weighs as prefill work ahead of it.
#[test]
fn a_request_awaits_its_first_token_until_the_first_frame() {
    let cluster = engines(1);
    let gw = Gateway::start(&[("chat", route_yaml(&ports(&cluster), ""))]);
    let peer = || http::get(gw.addr, "/chat/_route_state").json()["peers"][0].clone();
    let awaiting = || peer()["awaiting_first_token"].clone();
    assert_eq!(awaiting(), json!(0));
    // Held after its first frame: decoding, not awaiting.
    let decoding = hold_stream(&gw, CHAT, "after-first", &[]);
    assert_eq!(awaiting(), json!(0));
    // Held before it (a long time to first token): awaiting.
    let mut slow = http::Conn::open(gw.addr);
    let body = json!({"model": "sim-model", "stream": true, "max_tokens": 2,
                      "messages": [{"role": "user", "content": "slow"}]});
    slow.send(
        "POST",
        CHAT,
        &[
            ("content-type", "application/json"),
            ("x-sim-ttft-ms", "60000"),
            ("x-session-id", "a-new-one"),
        ],
        body.to_string().as_bytes(),
        http::Upload::Length,
    );
    wait_for("the slow request in flight", Duration::from_secs(5), || {
        (awaiting() == json!(1)).then_some(())
    });
    // A new session's first turn is cold: its prompt is prefill ahead of
    // the engine. (The held stream above is past its first token.)
    assert!(peer()["cold_prefill_tokens"]
        .as_u64()
        .is_some_and(|n| n > 0));
    // It leaves the count when it ends without a token (the client goes).
    drop(slow);
    wait_for("the count back to 0", Duration::from_secs(5), || {
        (awaiting() == json!(0) && peer()["cold_prefill_tokens"] == json!(0)).then_some(())
    });
    cluster.engines[0].open_gate("after-first");
    drop(decoding);
}

/// A warm turn whose engine is at its slot limit waits for that engine as
/// long as its cold prefill elsewhere would take, then overflows. The
/// engines prefill at 0.2 ms a token, so after three cold turns the gateway
/// knows a turn of ~10k tokens costs ~2 s cold: a slot that frees while it
/// waits keeps the turn home (before, it went cold to the other engine at
/// once); the control, a slot that never frees, sends it across after about
/// those 2 s. No admission queue on the route: the wait is the warm turn's
/// own.
#[test]
fn a_warm_turn_waits_for_its_full_engine_while_that_beats_going_cold() {
    let slow_prefill = llm_gateway_sim::EngineConfig {
        prefill_us_per_token: 200,
        ..Default::default()
    };
    let cluster = llm_gateway_sim::spawn_engines(2, 0, slow_prefill).expect("simulated engines");
    let ports = ports(&cluster);
    let route = format!(
        "peers:\n  - {{name: e0, host: 127.0.0.1, port: {}, max_concurrency: 1}}\n  \
- {{name: e1, host: 127.0.0.1, port: {}, max_concurrency: 1}}\n",
        ports[0], ports[1]
    );
    let gw = Gateway::start(&[("chat", route)]);
    // What a cold turn costs, learned from three new sessions.
    for i in 0..3 {
        let body = turn_body(&[long_text(&format!("warmup{i}-"), 300)]);
        let sid = format!("warmup-{i}");
        let r = http::post_json(gw.addr, CHAT, &[("x-session-id", &sid)], &stream_of(body));
        assert_eq!(r.status(), 200, "{}", r.text());
    }
    let turn = |sid: &str| {
        let body = turn_body(&[long_text(sid, 3_000)]);
        http::post_json(gw.addr, CHAT, &[("x-session-id", sid)], &stream_of(body))
    };
    // The session's first turn holds its engine's one slot.
    let (held, home) = hold_session(&gw, "conv-wait", "wait-gate");
    let second = std::thread::scope(|s| {
        let waiting = s.spawn(|| turn("conv-wait"));
        // The slot frees once the turn is seen waiting for it.
        wait_for("the warm turn waiting", DEADLINE, || {
            let state = http::get(gw.addr, "/chat/_route_state").json();
            (state["queue"]["waiting_warm"] == 1).then_some(())
        });
        cluster
            .engines
            .iter()
            .for_each(|e| e.open_gate("wait-gate"));
        waiting.join().expect("turn")
    });
    drop(held);
    assert_eq!(second.status(), 200, "{}", second.text());
    assert_eq!(peer_of(&second), home, "waited for its own engine");
    assert_eq!(second.header("x-routed-mode"), Some("sticky"));

    // The control: the slot never frees in time, so the turn goes cold
    // elsewhere once waiting has cost what the move does.
    let (held, home) = hold_session(&gw, "conv-gone", "never");
    let started = std::time::Instant::now();
    let moved = turn("conv-gone");
    let waited = started.elapsed();
    assert_eq!(moved.status(), 200, "{}", moved.text());
    assert_ne!(peer_of(&moved), home);
    assert_eq!(moved.header("x-routed-mode"), Some("overflow"));
    assert!(
        waited >= Duration::from_secs(1),
        "overflowed after {waited:?}, not at once"
    );
    cluster.engines.iter().for_each(|e| e.open_gate("never"));
    drop(held);
}

fn stream_of(mut body: serde_json::Value) -> serde_json::Value {
    body["stream"] = json!(true);
    body
}

/// A stream of session `sid` that its engine holds until `gate` opens, and
/// the engine it is on.
fn hold_session(gw: &Gateway, sid: &str, gate: &str) -> (Conn, String) {
    let (conn, head) = hold_stream_with_head(gw, CHAT, gate, &[("x-session-id", sid)]);
    let peer = head.header("x-routed-peer").unwrap_or("?").to_string();
    (conn, peer)
}

/// Mode `hash` needs nothing shared: two gateways that met the same three
/// engines in different orders (one configured with all three, the other
/// grown to them one reload at a time, in reverse) send every session to
/// the same engine. The control: the sessions do spread over the engines,
/// so agreeing is not trivial.
#[test]
fn hash_mode_agrees_across_replicas_whatever_their_reload_history() {
    let cluster = engines(3);
    let p = ports(&cluster);
    let hash = "balancing:\n  mode: hash\n";
    let one_go = Gateway::start(&[("h", route_yaml(&p, hash))]);
    let grown = Gateway::start(&[("h", route_yaml(&p[2..], hash))]);
    for n in [1, 0] {
        grown.write_route("h", &route_yaml(&p[n..], hash));
        grown.reload();
    }
    let path = "/h/v1/chat/completions";
    let mut engines_used = std::collections::HashSet::new();
    for i in 0..30 {
        let sid = format!("agree-{i}");
        let body = chat_body(&sid, "hi", false);
        let a = http::post_json(one_go.addr, path, &[("x-session-id", &sid)], &body);
        let b = http::post_json(grown.addr, path, &[("x-session-id", &sid)], &body);
        assert_eq!((a.status(), b.status()), (200, 200));
        assert_eq!(peer_of(&a), peer_of(&b), "session {sid}");
        engines_used.insert(peer_of(&a));
    }
    assert_eq!(engines_used.len(), 3, "spread over {engines_used:?}");
}

/// `/_route_state` shows the placement model's estimate on each ready
/// engine and what it has learned of each engine's speed; `/_route_inspect`
/// the estimate for the request it is handed: on the session's engine its
/// context is cached, elsewhere it would be prefilled whole.
#[test]
fn the_model_shows_each_engines_estimate_and_learns_from_the_answers() {
    let cluster = engines(3);
    let gw = Gateway::start(&[("chat", route_yaml(&ports(&cluster), ""))]);
    let state = http::get(gw.addr, "/chat/_route_state").json();
    let model = &state["placement_model"];
    let peers = model["peers"].as_array().expect("an estimate per peer");
    assert_eq!(peers.len(), 3, "{model}");
    for e in peers {
        assert_eq!(e["speed"], "assumed", "nothing timed yet: {e}");
        assert!(e["expected_ms"].as_f64().is_some_and(|ms| ms > 0.0), "{e}");
    }
    // Cold conversations, streamed: each engine's first tokens and decode
    // teach it its speeds.
    for n in 0..12 {
        let body = json!({
            "model": "sim-model", "max_tokens": 16, "stream": true,
            "messages": [{"role": "user", "content": long_text(&format!("c{n}-"), 600)}],
        });
        let sid = format!("learn-{n}");
        let r = http::post_json(gw.addr, CHAT, &[("x-session-id", &sid)], &body);
        assert_eq!(r.status(), 200, "{}", r.text());
    }
    let timed = wait_for("an engine timed from its answers", DEADLINE, || {
        let state = http::get(gw.addr, "/chat/_route_state").json();
        let timed: Vec<serde_json::Value> = state["peers"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|p| p["speed"]["prefill_us_per_token"].as_f64().is_some())
            .cloned()
            .collect();
        (!timed.is_empty()).then_some(timed)
    });
    assert!(timed[0]["speed"]["tpot_us"].as_f64().is_some(), "{timed:?}");
    // A bound session's next turn: cached on its engine only.
    let history = vec![long_text("home-", 800)];
    let first = http::post_json(
        gw.addr,
        CHAT,
        &[("x-session-id", "inspected")],
        &turn_body(&history),
    );
    assert_eq!(first.status(), 200, "{}", first.text());
    let home = peer_of(&first);
    let mut next = history.clone();
    next.push("answer".into());
    next.push("and now?".into());
    let inspect = http::post_json(
        gw.addr,
        "/chat/_route_inspect",
        &[("x-session-id", "inspected")],
        &turn_body(&next),
    )
    .json();
    let estimates = inspect["estimates"]["peers"].as_array().expect("estimates");
    assert_eq!(estimates.len(), 3, "{inspect}");
    for e in estimates {
        let cached = e["cached_tokens"].as_u64().expect("cached tokens");
        if e["peer"] == home.as_str() {
            assert!(cached > 0, "its home holds its context: {e}");
        } else {
            assert_eq!(cached, 0, "nothing of it elsewhere: {e}");
            assert!(e["uncached_tokens"].as_u64() > Some(500), "{e}");
        }
    }
}

/// An engine's prefill speed is learned from a cold prompt's first token,
/// not when its stream ends: three new sessions' streams are held open
/// after their first frames, and the engine is timed while they are.
/// (Before, a slow engine's answers took so long to end that it stayed
/// "assumed" as fast as the others for half a minute, and drew new
/// sessions cold.)
#[test]
fn a_cold_prompts_first_token_times_its_engine_before_its_stream_ends() {
    let cluster = engines(1);
    let gw = Gateway::start(&[("chat", route_yaml(&ports(&cluster), ""))]);
    let speed = || http::get(gw.addr, "/chat/_route_state").json()["peers"][0]["speed"].clone();
    assert!(speed()["prefill_us_per_token"].is_null(), "{}", speed());
    let held: Vec<Conn> = (0..3)
        .map(|n| {
            let mut conn = Conn::open(gw.addr);
            let body = json!({"model": "sim-model", "stream": true, "max_tokens": 4,
                              "messages": [{"role": "user", "content": long_text(&format!("s{n}-"), 600)}]});
            let sid = format!("cold-{n}");
            conn.send(
                "POST",
                CHAT,
                &[
                    ("content-type", "application/json"),
                    ("x-sim-gate", "held"),
                    ("x-session-id", &sid),
                ],
                body.to_string().as_bytes(),
                Upload::Length,
            );
            assert_eq!(conn.read_head().status, 200);
            conn.read_chunk().expect("first frame").expect("data");
            conn
        })
        .collect();
    let learned = wait_for("the engine timed", DEADLINE, || {
        let s = speed();
        s["prefill_us_per_token"].as_f64().map(|_| s)
    });
    // Still held: no stream has ended, so no end taught it.
    assert_eq!(
        http::get(gw.addr, "/chat/_route_state").json()["peers"][0]["in_flight"],
        json!(3),
        "{learned}"
    );
    cluster.engines[0].open_gate("held");
    drop(held);
}
