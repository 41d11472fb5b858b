//! Measurement: TTFT and decode-rate samples from the streams the
//! gateway proxies, per pool and peer.

mod common;

use common::http;
use common::*;
use serde_json::json;
use std::sync::atomic::Ordering;

const CHAT: &str = "/chat/v1/chat/completions";

fn stream(gw: &Gateway, tokens: u32, frame_ms: u32) -> http::Response {
    let body = json!({"model": "sim-model", "stream": true,
                      "stream_options": {"include_usage": true},
                      "messages": [{"role": "user", "content": "measure me"}]});
    http::post_json(
        gw.addr,
        CHAT,
        &[
            ("x-sim-max-tokens", &tokens.to_string()),
            ("x-sim-frame-delay-ms", &frame_ms.to_string()),
        ],
        &body,
    )
}

fn samples(gw: &Gateway, metric: &str) -> f64 {
    gw.metric(metric, &["route=\"chat\"", "pool=\"_\""])
}

#[test]
fn streams_feed_ttft_and_decode_rate_and_nothing_else_does() {
    let cluster = engines(1);
    let gw = Gateway::start(&[("chat", route_yaml(&ports(&cluster), ""))]);
    let ttft = "llm_gateway_ttft_seconds_count";
    let tps = "llm_gateway_decode_tokens_per_second_count";

    // 20 tokens, 40 ms apart: 0.76 s of decode, so both are sampled.
    assert_eq!(stream(&gw, 20, 40).status(), 200);
    wait_for("the first samples", DEADLINE, || {
        (samples(&gw, ttft) == 1.0 && samples(&gw, tps) == 1.0).then_some(())
    });

    // 15 tokens: a TTFT sample, but too few tokens for a decode rate.
    assert_eq!(stream(&gw, 15, 40).status(), 200);
    wait_for("the second TTFT sample", DEADLINE, || {
        (samples(&gw, ttft) == 2.0).then_some(())
    });
    assert_eq!(samples(&gw, tps), 1.0);

    // A non-stream answer and an engine error are no samples at all.
    let plain = http::post_json(gw.addr, CHAT, &[], &chat_body("s", "x", false));
    assert_eq!(plain.status(), 200);
    cluster.engines[0]
        .faults
        .fail_next
        .store(1, Ordering::Relaxed);
    assert_eq!(stream(&gw, 20, 40).status(), 500);
    // Control: one more good stream is counted, so the two above were seen
    // (and left out) before it.
    assert_eq!(stream(&gw, 20, 40).status(), 200);
    wait_for("the third samples", DEADLINE, || {
        (samples(&gw, ttft) == 3.0 && samples(&gw, tps) == 2.0).then_some(())
    });

    let status = http::get(gw.addr, "/chat/_ttft_status").json();
    let pool = status["series"]
        .as_array()
        .and_then(|s| {
            s.iter()
                .find(|x| x["scope"] == "pool" && x["name"] == "_")
                .cloned()
        })
        .expect("the pool's series");
    assert_eq!(pool["ttft_window_samples"], 3, "{status}");
    assert_eq!(pool["tps_window_samples"], 2, "{status}");
    assert!(
        pool["ttft_ewma_ms"].is_null(),
        "no EWMA before the window closes: {status}"
    );
    assert_eq!(status["nousage"], 0);
}

/// A prompt the engine has never seen, so nothing of it is cached.
fn fresh_prompt(n: usize) -> serde_json::Value {
    json!({"model": "sim-model", "stream": true,
           "stream_options": {"include_usage": true},
           "messages": [{"role": "user", "content": format!("{n} {}", "unseen words ".repeat(60))}]})
}

#[test]
fn a_pool_over_its_ttft_limit_lets_five_probes_through_and_refuses_the_rest() {
    // 1 ms of prefill per token: a ~200-token prompt starts in ~200 ms.
    let cluster = spawn_engines(
        1,
        0,
        EngineConfig {
            prefill_us_per_token: 1_000,
            ..EngineConfig::default()
        },
    )
    .expect("engine");
    // The window outlasts the three warm-up streams, so none of them is a probe.
    let gates = "ttft_limit_ms: 50\nttft_window: 4s\nprobes: 5\nprobe_window: 60s\n";
    let gw = Gateway::start(&[
        ("chat", route_yaml(&ports(&cluster), gates)),
        (
            "calm",
            route_yaml(
                &ports(&cluster),
                "ttft_limit_ms: 1000000\nttft_window: 300ms\n",
            ),
        ),
    ]);
    let send = |route: &str, n: usize| {
        http::post_json(
            gw.addr,
            &format!("/{route}/v1/chat/completions"),
            &[],
            &fresh_prompt(n),
        )
    };
    for n in 0..3 {
        assert_eq!(send("chat", n).status(), 200);
        assert_eq!(send("calm", 100 + n).status(), 200);
    }
    wait_for("the TTFT EWMA to appear", DEADLINE, || {
        let s = http::get(gw.addr, "/chat/_ttft_status").json();
        s["series"]
            .as_array()?
            .iter()
            .any(|x| x["scope"] == "pool" && x["ttft_ewma_ms"].is_number())
            .then_some(())
    });
    let mut passed = 0;
    let mut refused = Vec::new();
    for n in 0..12 {
        let r = send("chat", 1_000 + n);
        match r.status() {
            200 => passed += 1,
            429 => refused.push(r),
            other => panic!("unexpected {other}: {}", r.text()),
        }
    }
    assert_eq!((passed, refused.len()), (5, 7));
    let body = refused[0].json();
    assert_eq!(body["error"]["type"], "ttft_limit");
    assert_eq!(body["error"]["metric"], "p80");
    assert_eq!(body["error"]["limit"], 50.0);
    assert!(
        body["error"]["ewma"].as_f64().is_some_and(|v| v >= 50.0),
        "{body}"
    );
    assert_eq!(refused[0].header("retry-after"), Some("1"));
    assert_eq!(
        gw.metric("llm_gateway_load_rejections_total", &["gate=\"ttft\""]),
        7.0
    );
    // Control: a route whose limit is far above the same TTFT lets all through.
    wait_for("the calm route's EWMA", DEADLINE, || {
        let s = http::get(gw.addr, "/calm/_ttft_status").json();
        s["series"]
            .as_array()?
            .iter()
            .any(|x| x["scope"] == "pool" && x["ttft_ewma_ms"].is_number())
            .then_some(())
    });
    for n in 0..12 {
        assert_eq!(send("calm", 2_000 + n).status(), 200);
    }
}

fn hold_slot(gw: &Gateway, gate: &str) -> common::http::Conn {
    hold_stream(gw, CHAT, gate, &[])
}

fn toggle(gw: &Gateway, query: &str) -> u16 {
    let mut conn = common::http::Conn::open(gw.addr);
    conn.request(
        "POST",
        &format!("/chat/_rate_limit_toggle?{query}"),
        &[],
        b"",
    )
    .status()
}

fn rate_limit(gw: &Gateway) -> serde_json::Value {
    http::get(gw.addr, "/chat/_rate_limit_status").json()["rate_limit"].clone()
}

#[test]
fn the_rate_limit_switch_lets_load_429s_through_counts_them_and_layers_runtime_over_route_over_gateway(
) {
    let cluster = engines(1);
    let one_slot = format!(
        "peers:\n  - {{name: e0, host: 127.0.0.1, port: {}, max_concurrency: 1}}\n",
        cluster.engines[0].port()
    );
    let gw = Gateway::start_with(
        &[("chat", one_slot.clone())],
        GatewayOptions {
            extra_config: "load_rate_limit: false\n".into(),
            ..Default::default()
        },
    );
    let _held = hold_slot(&gw, "rl");
    let second = || http::post_json(gw.addr, CHAT, &[], &chat_body("s", "x", false));

    // The gateway-wide default is off: the request goes past the limit.
    assert_eq!(rate_limit(&gw)["source"], "gateway");
    assert_eq!(second().status(), 200);
    assert_eq!(rate_limit(&gw)["trips_while_off"]["concurrency"], 1);

    // The runtime toggle beats it: on limits again (control).
    assert_eq!(toggle(&gw, "on=1"), 200);
    assert_eq!(rate_limit(&gw)["source"], "runtime");
    let refused = second();
    assert_eq!(refused.status(), 429);
    assert_eq!(refused.json()["error"]["type"], "concurrency_limit");
    let status = http::get(gw.addr, "/chat/_429_status").json();
    assert_eq!(status["by_reason"]["concurrency"], 1, "{status}");
    assert_eq!(status["total"], 1);

    // It survives a reload; a route option sits between the two.
    gw.write_route("chat", &format!("{one_slot}load_rate_limit: true\n"));
    gw.reload();
    assert_eq!(rate_limit(&gw)["source"], "runtime");
    assert_eq!(toggle(&gw, "on=0"), 200);
    assert_eq!(second().status(), 200, "runtime off beats the route's on");
    assert_eq!(toggle(&gw, "reset=1"), 200);
    assert_eq!(rate_limit(&gw)["source"], "route");
    assert_eq!(second().status(), 429);

    // Trips while off never reach the real counters; reset=1 zeroes them.
    let status = http::get(gw.addr, "/chat/_429_status").json();
    assert_eq!(status["by_reason"]["concurrency"], 2, "{status}");
    assert_eq!(status["rate_limit"]["trips_while_off"]["concurrency"], 2);
    let _ = http::get(gw.addr, "/chat/_429_status?reset=1");
    let status = http::get(gw.addr, "/chat/_429_status").json();
    assert_eq!(status["total"], 0, "{status}");
    cluster.engines[0].open_gate("rl");
}

fn adaptive_pool(gw: &Gateway) -> serde_json::Value {
    let s = http::get(gw.addr, "/chat/_tps_status").json();
    s["adaptive_cc"]["pools"][0].clone()
}

#[test]
fn a_slow_decode_shrinks_the_adaptive_limit_to_its_floor_and_the_floor_refuses() {
    let cluster = engines(1);
    // Decode at ~25 tok/s against a floor of 1000: overloaded on every tick.
    let route = format!(
        "peers:\n  - {{name: e0, host: 127.0.0.1, port: {}, max_concurrency: 10}}\n\
         tps_limit_tps: 1000\ntps_window: 100ms\nadaptive_cc: true\nadaptive_cc_init_frac: 1.0\n",
        cluster.engines[0].port()
    );
    let gw = Gateway::start(&[("chat", route)]);
    let start = adaptive_pool(&gw);
    assert_eq!(
        (start["min"].as_f64(), start["init"].as_f64()),
        (Some(4.0), Some(10.0))
    );
    assert_eq!(start["limit"], 10.0);
    // Slow streams keep the decode-rate EWMA low.
    let stream = || {
        http::post_json(
            gw.addr,
            CHAT,
            &[("x-sim-max-tokens", "20"), ("x-sim-frame-delay-ms", "40")],
            &json!({"model": "sim-model", "stream": true, "stream_options": {"include_usage": true},
                "messages": [{"role": "user", "content": "slow"}]}),
        )
    };
    wait_for(
        "the limit to reach its floor",
        std::time::Duration::from_secs(60),
        || {
            assert_eq!(stream().status(), 200);
            (adaptive_pool(&gw)["limit"] == 4.0).then_some(())
        },
    );
    assert_eq!(adaptive_pool(&gw)["last_step"], "overload");
    // At the floor, four held streams fill the pool and a fifth is refused.
    let held: Vec<_> = (0..4).map(|_| hold_slot(&gw, "floor")).collect();
    let refused = http::post_json(gw.addr, CHAT, &[], &chat_body("s", "x", false));
    assert_eq!(refused.status(), 429, "{}", refused.text());
    assert_eq!(refused.json()["error"]["adaptive_cc"], 4.0);
    // Control: the decode rate never caused a TPS 429 on this adaptive route.
    assert_eq!(
        gw.metric("llm_gateway_load_rejections_total", &["gate=\"tps\""]),
        0.0
    );
    cluster.engines[0].open_gate("floor");
    drop(held);
}

fn turn_header(turn: u64) -> String {
    format!(r#"{{"session_id":"agent-1","turn":{turn}}}"#)
}

fn hold_on(gw: &Gateway, route: &str, gate: &str, turn: u64) -> common::http::Conn {
    let header = turn_header(turn);
    let path = format!("/{route}/v1/chat/completions");
    hold_stream(gw, &path, gate, &[("x-phanrouter-session", &header)])
}

#[test]
fn under_load_turn_one_is_refused_first_while_a_warm_turn_is_admitted() {
    // Room to run every held stream at once.
    let cluster = spawn_engines(
        1,
        0,
        EngineConfig {
            max_running: 32,
            ..EngineConfig::default()
        },
    )
    .expect("engine");
    let route = |extra: &str| {
        format!(
            "peers:\n  - {{name: e0, host: 127.0.0.1, port: {}, max_concurrency: 7}}\n{extra}",
            cluster.engines[0].port()
        )
    };
    let gw = Gateway::start(&[
        ("prio", route("session_prio: true\n")),
        ("plain", route("")),
    ]);
    let ask = |name: &str, turn: u64| {
        http::post_json(
            gw.addr,
            &format!("/{name}/v1/chat/completions"),
            &[("x-phanrouter-session", &turn_header(turn))],
            &chat_body("s", "x", false),
        )
    };
    // Six of seven slots busy: at limit 7 turn 1's ceiling is ceil(7 × 0.85) = 6.
    let _prio_held: Vec<_> = (0..6).map(|_| hold_on(&gw, "prio", "busy", 3)).collect();
    let first = ask("prio", 1);
    assert_eq!(first.status(), 429, "{}", first.text());
    assert_eq!(first.json()["error"]["session_prio_ceiling"], 6.0);
    assert_eq!(ask("prio", 3).status(), 200, "a warm turn still fits");
    let status = http::get(gw.addr, "/prio/_session_status").json();
    assert_eq!(status["buckets"][0]["rejections"], 1, "{status}");
    assert_eq!(status["buckets"][1]["admits"], 7, "{status}");
    // Control: the same load on a route without the feature admits turn 1.
    let _plain_held: Vec<_> = (0..6).map(|_| hold_on(&gw, "plain", "busy", 3)).collect();
    assert_eq!(ask("plain", 1).status(), 200);
    cluster.engines[0].open_gate("busy");
}
