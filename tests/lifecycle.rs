//! Hot reload (SIGHUP), graceful shutdown (SIGTERM) and `check`.

mod common;

use common::http::{self, Conn, Upload};
use common::*;
use serde_json::json;
use std::process::Command;
use std::time::Duration;

fn start_gated_stream(gw: &Gateway, route: &str, gate: &str) -> (Conn, String) {
    start_gated_stream_with(gw, route, gate, &[])
}

fn start_gated_stream_with(
    gw: &Gateway,
    route: &str,
    gate: &str,
    headers: &[(&str, &str)],
) -> (Conn, String) {
    let mut conn = Conn::open(gw.addr);
    let body = json!({"model": "sim-model", "stream": true, "max_tokens": 6,
                      "messages": [{"role": "user", "content": "long answer"}]});
    let mut all = vec![("Content-Type", "application/json"), ("x-sim-gate", gate)];
    all.extend_from_slice(headers);
    conn.send(
        "POST",
        &format!("/{route}/v1/chat/completions"),
        &all,
        body.to_string().as_bytes(),
        Upload::Length,
    );
    let head = conn.read_head();
    assert_eq!(head.status, 200);
    let peer = head
        .header("x-routed-peer")
        .expect("routed peer")
        .to_string();
    conn.read_chunk().expect("first frame").expect("data");
    (conn, peer)
}

/// Reads the rest of a stream; true when it ended with [DONE] and the last chunk.
fn finish_stream(conn: &mut Conn) -> bool {
    let mut rest = Vec::new();
    loop {
        match conn.read_chunk() {
            Ok(Some(c)) => rest.extend_from_slice(&c),
            Ok(None) => return String::from_utf8_lossy(&rest).contains("data: [DONE]"),
            Err(_) => return false,
        }
    }
}

fn chat(gw: &Gateway, route: &str) -> http::Response {
    http::post_json(
        gw.addr,
        &format!("/{route}/v1/chat/completions"),
        &[],
        &chat_body("s", "hi", false),
    )
}

#[test]
fn sighup_adds_changes_removes_and_survives_a_broken_file() {
    let a = engines(1);
    let b = engines(1);
    let gw = Gateway::start(&[("chat", route_yaml(&ports(&a), ""))]);
    let pid = gw.pid();

    // A stream in flight on engine A across every reload below.
    let (mut stream, peer) = start_gated_stream(&gw, "chat", "hold");
    assert_eq!(peer, "e0");

    // Add: a new file is served after SIGHUP (and not before: control).
    assert_eq!(chat(&gw, "extra").status(), 404);
    gw.write_route("extra", &route_yaml(&ports(&b), ""));
    gw.reload();
    assert_eq!(chat(&gw, "extra").status(), 200);

    // Change: chat moves to engine B; the peer that stays keeps its runtime
    // state (the in-flight stream on the old peer is still counted).
    let before_b = b.engines[0]
        .stats
        .requests
        .load(std::sync::atomic::Ordering::Relaxed);
    gw.write_route("chat", &format!(
        "peers:\n  - {{name: e0, host: 127.0.0.1, port: {}}}\n  - {{name: nb, host: 127.0.0.1, port: {}, max_concurrency: 1000}}\n",
        a.engines[0].port(), b.engines[0].port()
    ));
    gw.reload();
    assert_eq!(
        gw.metric("llm_gateway_in_flight", &["route=\"chat\"", "peer=\"e0\""]),
        1.0,
        "state carried over"
    );
    let r = chat(&gw, "chat");
    assert_eq!(r.status(), 200);
    // e0 has 1 in flight, nb has 0: least-loaded goes to nb.
    assert_eq!(r.header("x-routed-peer"), Some("nb"));
    assert!(
        b.engines[0]
            .stats
            .requests
            .load(std::sync::atomic::Ordering::Relaxed)
            > before_b
    );

    // Break: invalid file keeps the previous version, logs file and line, counts an error.
    let errors_before = gw.metric("llm_gateway_reloads_total", &["result=\"error\""]);
    gw.write_route(
        "chat",
        "peers:\n  - {name: x, host: h, port: 1}\nbalancing:\n  mode: hash\n  bogus_key: 1\n",
    );
    gw.reload();
    assert_eq!(
        gw.metric("llm_gateway_reloads_total", &["result=\"error\""]),
        errors_before + 1.0
    );
    let log = gw.log();
    assert!(
        log.contains("chat.yaml:5"),
        "error names file and line:\n{log}"
    );
    assert_eq!(
        chat(&gw, "chat").header("x-routed-peer"),
        Some("nb"),
        "previous version still serves"
    );
    // A broken NEW file stays absent.
    gw.write_route("broken", "peers: [");
    gw.reload();
    assert_eq!(chat(&gw, "broken").status(), 404);

    // Remove: answers 404 after SIGHUP.
    gw.remove_route("extra");
    gw.reload();
    assert_eq!(chat(&gw, "extra").status(), 404);
    assert!(gw.metric("llm_gateway_reloads_total", &["result=\"ok\""]) >= 3.0);

    // The stream that was in flight the whole time finishes intact on engine A.
    a.engines[0].open_gate("hold");
    assert!(
        finish_stream(&mut stream),
        "stream in flight across reloads finished intact"
    );
    assert_eq!(gw.pid(), pid, "same process throughout");
    gw.wait_idle();
}

#[test]
fn sigterm_drains_streams_then_exits_zero() {
    let cluster = engines(1);
    let mut gw = Gateway::start_with(
        &[("chat", route_yaml(&ports(&cluster), ""))],
        GatewayOptions {
            grace_period: "30s",
            ..Default::default()
        },
    );
    let (mut stream, _) = start_gated_stream(&gw, "chat", "drain");
    gw.signal("TERM");
    // Draining: health turns 503 (the admin listener outlives the drain)
    // and new connections stop being accepted.
    wait_for("health to report draining", DEADLINE, || {
        let r = http::try_get(gw.admin, "/healthz").expect("the admin listener answers");
        (r.status() == 503).then_some(())
    });
    wait_for("listener to stop accepting", DEADLINE, || {
        std::net::TcpStream::connect(gw.addr).is_err().then_some(())
    });
    // Control for "the process waits": it is still alive while the stream runs.
    assert_eq!(
        gw.wait_exit(Duration::from_millis(300)),
        None,
        "must not exit with a stream in flight"
    );
    cluster.engines[0].open_gate("drain");
    assert!(
        finish_stream(&mut stream),
        "in-flight stream finished intact during drain"
    );
    // Exits 0 as soon as nothing is in flight, well before the 30 s grace period.
    assert_eq!(
        gw.wait_exit(Duration::from_secs(10)),
        Some(0),
        "{}",
        gw.log()
    );
}

/// `/healthz` as the admin listener answers it: status and the requests
/// in flight; None once nothing answers.
fn health(gw: &Gateway) -> Option<(u16, u64)> {
    let r = http::try_get(gw.admin, "/healthz")?;
    let in_flight = r.json()["in_flight"]
        .as_u64()
        .unwrap_or_else(|| panic!("/healthz names its in-flight count: {}", r.text()));
    Some((r.status(), in_flight))
}

/// The admin listener serves through a drain, until the process exits:
/// `/healthz` answers 503 with the count of requests still in flight,
/// falling as the streams the drain waits for are released, and `/metrics`
/// and the dashboard can be scraped meanwhile; the main listener refuses
/// new connections from the start.
#[test]
fn the_admin_listener_serves_through_the_drain_with_the_count_falling() {
    const STREAMS: u64 = 3;
    let cluster = engines(1);
    let mut gw = Gateway::start_with(
        &[("chat", route_yaml(&ports(&cluster), ""))],
        GatewayOptions {
            grace_period: "30s",
            ..Default::default()
        },
    );
    // Control: 200 while serving, and the count is the requests' own.
    assert_eq!(health(&gw), Some((200, 0)));
    let gates: Vec<String> = (0..STREAMS).map(|i| format!("drain-{i}")).collect();
    let mut streams: Vec<Conn> = gates
        .iter()
        .map(|gate| start_gated_stream(&gw, "chat", gate).0)
        .collect();
    assert_eq!(health(&gw), Some((200, STREAMS)));

    gw.signal("TERM");
    wait_for("health to report draining", DEADLINE, || {
        let (status, in_flight) = health(&gw).expect("the admin listener answers");
        (status == 503).then_some(in_flight)
    });
    let r = http::get(gw.admin, "/healthz");
    assert_eq!(
        r.json(),
        json!({"status": "draining", "in_flight": STREAMS}),
        "{}",
        r.text()
    );
    wait_for("listener to stop accepting", DEADLINE, || {
        std::net::TcpStream::connect(gw.addr).is_err().then_some(())
    });
    // Mid-drain: the main listener refuses, the admin listener serves.
    let metrics = http::get(gw.admin, "/metrics");
    assert_eq!(metrics.status(), 200);
    assert_eq!(
        metric_sum(&metrics.text(), "llm_gateway_in_flight", &[]),
        STREAMS as f64
    );
    assert_eq!(http::get(gw.admin, "/dashboard.json").status(), 200);

    // Each release takes one off the count; every answer on the way is a
    // 503 and the count never rises.
    let mut last = STREAMS;
    for (i, (gate, stream)) in gates.iter().zip(&mut streams).enumerate() {
        cluster.engines[0].open_gate(gate);
        assert!(finish_stream(stream), "stream {i} finished intact");
        let left = STREAMS - 1 - i as u64;
        if left == 0 {
            break;
        }
        wait_for(&format!("health to count {left}"), DEADLINE, || {
            let (status, in_flight) = health(&gw).expect("the admin listener answers");
            assert_eq!(status, 503, "still draining");
            assert!(
                in_flight <= last,
                "the count rose: {in_flight} after {last}"
            );
            last = in_flight;
            (in_flight == left).then_some(())
        });
        assert_eq!(
            http::get(gw.admin, "/metrics").status(),
            200,
            "scraped mid-drain"
        );
    }
    // The last one out: the process exits as soon as the count reaches 0,
    // so a probe meets a count of 1 (the request is logged after its last
    // byte), of 0, or no listener.
    wait_for(
        "the admin listener to go with the process",
        DEADLINE,
        || match health(&gw) {
            None => Some(()),
            Some((status, in_flight)) => {
                assert_eq!(status, 503, "still draining");
                assert!(in_flight <= last.min(1), "the count rose: {in_flight}");
                last = in_flight;
                None
            }
        },
    );
    assert_eq!(
        gw.wait_exit(Duration::from_secs(10)),
        Some(0),
        "{}",
        gw.log()
    );
}

/// Many long streams in flight at SIGTERM all finish intact,
/// new connections are refused meanwhile, and the exit is 0 within the
/// grace period.
#[test]
fn sigterm_with_50_streams_in_flight_finishes_every_one_then_exits_zero() {
    const STREAMS: usize = 50;
    let cluster = spawn_engines(
        1,
        0,
        EngineConfig {
            max_running: 64,
            ..EngineConfig::default()
        },
    )
    .expect("engine");
    let route = format!(
        "peers:\n  - {{name: e0, host: 127.0.0.1, port: {}, max_concurrency: 100}}\n",
        cluster.engines[0].port()
    );
    let mut gw = Gateway::start_with(
        &[("chat", route)],
        GatewayOptions {
            grace_period: "20s",
            ..Default::default()
        },
    );
    let mut streams: Vec<Conn> = (0..STREAMS)
        .map(|_| {
            let long = [("x-sim-max-tokens", "40"), ("x-sim-frame-delay-ms", "25")];
            start_gated_stream_with(&gw, "chat", "drain-50", &long).0
        })
        .collect();
    assert_eq!(gw.in_flight_total(), STREAMS as f64);
    gw.signal("TERM");
    let draining = std::time::Instant::now();
    wait_for("listener to stop accepting", DEADLINE, || {
        std::net::TcpStream::connect(gw.addr).is_err().then_some(())
    });
    // Control for "it waits for them": alive while all 50 are held.
    assert_eq!(gw.wait_exit(Duration::from_millis(300)), None);
    // Long streams: 40 more frames each, 25 ms apart, once released.
    cluster.engines[0].open_gate("drain-50");
    let finished = std::thread::scope(|s| {
        let readers: Vec<_> = streams
            .iter_mut()
            .map(|c| s.spawn(move || finish_stream(c)))
            .collect();
        readers
            .into_iter()
            .map(|r| r.join().unwrap_or(false))
            .filter(|&intact| intact)
            .count()
    });
    assert_eq!(finished, STREAMS, "every stream finished intact");
    assert_eq!(
        gw.wait_exit(Duration::from_secs(10)),
        Some(0),
        "{}",
        gw.log()
    );
    assert!(
        draining.elapsed() < Duration::from_secs(20),
        "within the grace period: {:?}",
        draining.elapsed()
    );
    assert!(gw.log().contains("drained after"), "{}", gw.log());
}

/// A stream longer than the grace period is cut when it ends (no
/// clean end for its client), the exit is still 0, and the log says so; a
/// short stream drained beside it finishes intact (control).
#[test]
fn sigterm_cuts_a_stream_longer_than_the_grace_period_and_still_exits_cleanly() {
    let cluster = engines(1);
    let mut gw = Gateway::start_with(
        &[("chat", route_yaml(&ports(&cluster), ""))],
        GatewayOptions {
            grace_period: "2s",
            ..Default::default()
        },
    );
    let (mut short, _) = start_gated_stream(&gw, "chat", "short");
    let (mut long, _) = start_gated_stream(&gw, "chat", "never");
    gw.signal("TERM");
    let draining = std::time::Instant::now();
    wait_for("listener to stop accepting", DEADLINE, || {
        std::net::TcpStream::connect(gw.addr).is_err().then_some(())
    });
    cluster.engines[0].open_gate("short");
    assert!(
        finish_stream(&mut short),
        "the short stream finished intact"
    );
    assert!(
        !finish_stream(&mut long),
        "the long stream is cut, not ended"
    );
    let cut_after = draining.elapsed();
    assert!(
        cut_after >= Duration::from_millis(1900),
        "not cut before the grace period: {cut_after:?}"
    );
    assert!(
        cut_after < Duration::from_millis(3500),
        "cut at the grace period, not long after: {cut_after:?}"
    );
    assert_eq!(
        gw.wait_exit(Duration::from_secs(10)),
        Some(0),
        "{}",
        gw.log()
    );
    let log = gw.log();
    assert!(
        log.contains("grace period over with 1 request(s) still running"),
        "{log}"
    );
    assert!(!log.contains("panicked"), "{log}");
}

fn check(dir: &std::path::Path) -> (bool, String) {
    let out = Command::new(common::gateway_bin())
        .args(["check", "--config"])
        .arg(dir.join("gateway.yaml"))
        .output()
        .expect("run check");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// A config directory for `check`: gateway.yaml pointing at an empty routes/.
fn check_dir() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let routes = dir.path().join("routes");
    std::fs::create_dir_all(&routes).unwrap();
    std::fs::write(
        dir.path().join("gateway.yaml"),
        format!("routes_dir: {}\n", routes.display()),
    )
    .unwrap();
    (dir, routes)
}

#[test]
fn check_reports_file_line_and_reason() {
    let (dir, routes) = check_dir();
    let good = "peers:\n  - {name: a, host: 127.0.0.1, port: 8000}\n";
    std::fs::write(routes.join("good.yaml"), good).unwrap();
    let (ok, text) = check(dir.path());
    assert!(ok, "valid config passes: {text}");

    let cases = [
        ("unknown key", "peers:\n  - {name: a, host: h, port: 1}\nbalancng: {}\n", "bad.yaml:3", "balancng"),
        ("wrong type", "peers:\n  - {name: a, host: h, port: 1, max_concurrency: lots}\n", "bad.yaml:2", "invalid type"),
        ("pool of unknown peers", "peers_by_model: {m: [a]}\n", "bad.yaml:1", "unknown peer"),
        ("port range", "peers:\n  - {name: a, host: h, port: 1}\n  - {name: b, host: h, port: 99999}\n", "bad.yaml:3", "out of range"),
        ("duplicate peer", "peers:\n  - {name: a, host: h, port: 1}\n  - {name: a, host: h, port: 2}\n", "bad.yaml:3", "duplicate"),
        ("affinity needs mode", "peers:\n  - {name: a, host: h, port: 1}\nbalancing:\n  mode: least_conn\n  session_affinity: {headers: [x-a]}\n", "bad.yaml:5", "requires mode"),
    ];
    for (what, body, location, reason) in cases {
        std::fs::write(routes.join("bad.yaml"), body).unwrap();
        let (ok, text) = check(dir.path());
        assert!(!ok, "{what}: check must fail");
        assert!(text.contains(location), "{what}: {text}");
        assert!(text.contains(reason), "{what}: {text}");
    }
    std::fs::write(dir.path().join("gateway.yaml"), "listen: nowhere\n").unwrap();
    let (ok, text) = check(dir.path());
    assert!(!ok && text.contains("gateway.yaml:1"), "{text}");
}

#[test]
fn check_warns_on_a_flat_protection_key_with_its_place_under_protection() {
    let (dir, routes) = check_dir();
    let peers = "peers:\n  - {name: a, host: 127.0.0.1, port: 8000}\n";
    std::fs::write(
        routes.join("r.yaml"),
        format!("{peers}protection:\n  ttft: {{limit_ms: 9000}}\n"),
    )
    .unwrap();
    let (ok, text) = check(dir.path());
    assert!(
        ok && !text.contains("warning"),
        "the nested form is quiet: {text}"
    );
    std::fs::write(
        routes.join("r.yaml"),
        format!("{peers}ttft_limit_ms: 9000\n"),
    )
    .unwrap();
    let (ok, text) = check(dir.path());
    assert!(ok, "a flat key still loads: {text}");
    assert!(
        text.contains("warning: ")
            && text.contains("r.yaml: ttft_limit_ms (line 3) is deprecated: write it as protection.ttft.limit_ms"),
        "{text}"
    );
}

/// A route with no peers loads, as the OpenResty gateway's does, and
/// answers 503 until a reload gives it one; `check` warns that it has none.
/// Control: the same route with a peer serves at once.
#[test]
fn an_empty_route_answers_503_until_a_reload_gives_it_a_peer() {
    let cluster = engines(1);
    let with_peer = route_yaml(&ports(&cluster), "");
    let gw = Gateway::start(&[
        ("empty", "peers: []\n".into()),
        ("bare", "health: {interval: 1s}\n".into()),
        ("full", with_peer.clone()),
    ]);
    for route in ["empty", "bare"] {
        let r = chat(&gw, route);
        assert_eq!(r.status(), 503, "{route}: {}", r.text());
        assert_eq!(r.header("retry-after"), Some("5"));
        let error = &r.json()["error"];
        assert_eq!(error["type"], "no_healthy_upstream", "{error}");
        assert!(
            error["message"]
                .as_str()
                .is_some_and(|m| m.contains("no peers")),
            "{error}"
        );
    }
    let log = gw.log();
    assert!(
        log.contains("empty.yaml: the route has no peers"),
        "warned at load:\n{log}"
    );
    assert_eq!(chat(&gw, "full").status(), 200, "control: a peer serves");
    // Its read endpoints and the dashboard answer as for any route.
    for endpoint in [
        "_route_state",
        "_health_status",
        "_route_opts",
        "_tps_status",
        "_cluster_avg",
        "_sessions",
    ] {
        let r = http::get(gw.addr, &format!("/empty/{endpoint}"));
        assert_eq!(r.status(), 200, "{endpoint}: {}", r.text());
    }
    assert_eq!(http::get(gw.admin, "/dashboard.json").status(), 200);

    gw.write_route("empty", &with_peer);
    gw.reload();
    let r = chat(&gw, "empty");
    assert_eq!(r.status(), 200, "{}", r.text());

    let (dir, routes) = check_dir();
    std::fs::write(routes.join("empty.yaml"), "peers: []\n").unwrap();
    let (ok, text) = check(dir.path());
    assert!(ok, "a warning, not an error: {text}");
    assert!(
        text.contains("warning: ") && text.contains("empty.yaml: the route has no peers"),
        "{text}"
    );
    assert!(text.contains("ok: route empty (0 peers listed)"), "{text}");
    // Control: a route with a peer gets no such warning.
    std::fs::write(routes.join("empty.yaml"), &with_peer).unwrap();
    let (ok, text) = check(dir.path());
    assert!(ok && !text.contains("no peers"), "{text}");
}

/// The OpenResty gateway's names for options this gateway keeps elsewhere
/// load, take effect and are warned about with their new key; the inline
/// key table, which has no exact equivalent, says what is closest.
/// Control: a key neither gateway knows is still refused with its line.
#[test]
fn the_openresty_option_names_load_take_effect_and_warn_naming_the_new_key() {
    let cluster = engines(1);
    let old_names = format!(
        "{}health_check_interval: 7\nhealth_ban_ttl: 90\nhealth_probe_path: /v1/models\n\
         cross_tier_fallback: true\napi_keys: {{sk-inline-one: alice, sk-inline-two: bob}}\n",
        route_yaml(&ports(&cluster), "")
    );
    let gw = Gateway::start(&[("chat", old_names.clone())]);
    let health = http::get(gw.addr, "/chat/_health_status").json();
    let probe = &health["probe"];
    assert_eq!(
        (
            &probe["interval_ms"],
            &probe["ban_ttl_ms"],
            &probe["probe_path"]
        ),
        (&json!(7000), &json!(90000), &json!("/v1/models")),
        "{health}"
    );
    assert_eq!(health["_meta"]["key_file_scope"], "route", "{health}");
    assert_eq!(health["_meta"]["keys"], 2, "{health}");
    let opts = http::get(gw.addr, "/chat/_route_opts").json();
    let fallback = opts["options"]
        .as_array()
        .and_then(|o| {
            o.iter()
                .find(|x| x["key"] == "balancing.cross_tier_fallback")
                .cloned()
        })
        .expect("cross_tier_fallback");
    assert_eq!(
        (
            &fallback["value"],
            &fallback["set_by_route"],
            &fallback["formerly"]
        ),
        (&json!(true), &json!(true), &json!("cross_tier_fallback")),
        "{fallback}"
    );
    // The inline keys are the route's keys: none is refused, one of them
    // is let in (the shared key file is missing: open without them).
    assert_eq!(chat(&gw, "chat").status(), 401);
    let keyed = http::post_json(
        gw.addr,
        "/chat/v1/chat/completions",
        &[("authorization", "Bearer sk-inline-two")],
        &chat_body("s", "hi", false),
    );
    assert_eq!(keyed.status(), 200, "{}", keyed.text());
    let log = gw.log();
    for (old, line, new) in [
        ("health_check_interval", 3, "health.interval"),
        ("health_ban_ttl", 4, "health.ban_ttl"),
        ("health_probe_path", 5, "health.probe_path"),
        ("cross_tier_fallback", 6, "balancing.cross_tier_fallback"),
        ("api_keys", 7, "api_keys_file"),
    ] {
        let notice = format!("chat.yaml: {old} (line {line}) is deprecated: write it as {new}");
        assert!(log.contains(&notice), "{notice}:\n{log}");
    }
    assert!(
        log.contains("no exact equivalent"),
        "the inexact ones say so:\n{log}"
    );

    // Control: a misspelt key is refused with its line; the route keeps
    // its last good version.
    gw.write_route("chat", &format!("{old_names}health_check_intervals: 5\n"));
    gw.reload();
    assert!(gw.log().contains("chat.yaml:8"), "{}", gw.log());
    assert_eq!(
        http::get(gw.addr, "/chat/_health_status").json()["probe"]["interval_ms"],
        7000
    );
}

#[test]
fn check_refuses_a_reject_rule_that_a_load_would_drop() {
    let (dir, routes) = check_dir();
    let route = |pattern: &str| {
        format!(
            "peers:\n  - {{name: a, host: 127.0.0.1, port: 8000}}\nreject_rules:\n  - name: no-foo\n    when: {{field: model, op: match, value: \"{pattern}\"}}\n"
        )
    };
    // Control: the same rule with a valid pattern passes.
    std::fs::write(routes.join("r.yaml"), route("^foo")).unwrap();
    let (ok, text) = check(dir.path());
    assert!(ok, "a valid rule passes: {text}");

    std::fs::write(routes.join("r.yaml"), route("(unclosed")).unwrap();
    let (ok, text) = check(dir.path());
    assert!(!ok, "a bad regex must fail check: {text}");
    assert!(text.contains("r.yaml"), "names the file: {text}");
    assert!(text.contains("no-foo"), "names the rule: {text}");
    assert!(text.contains("regex"), "says why: {text}");
}

#[test]
fn idle_client_connections_close_after_client_idle_timeout_while_a_busy_one_stays() {
    let cluster = engines(1);
    let gw = Gateway::start_with(
        &[("chat", route_yaml(&ports(&cluster), ""))],
        GatewayOptions {
            extra_config: "client_idle_timeout: 1s\n".into(),
            ..Default::default()
        },
    );
    // A stream that stays busy (held at a gate) for longer than the timeout.
    let (mut busy, _) = start_gated_stream(&gw, "chat", "idle-test");

    let mut proxied = Conn::open(gw.addr);
    let r = proxied.request(
        "POST",
        "/chat/v1/chat/completions",
        &[("content-type", "application/json")],
        chat_body("s", "hi", false).to_string().as_bytes(),
    );
    assert_eq!(r.status(), 200);
    let mut local = Conn::open(gw.addr);
    assert_eq!(
        local.request("GET", "/nope/v1/models", &[], b"").status(),
        404
    );

    for conn in [&mut proxied, &mut local] {
        conn.set_read_timeout(Duration::from_secs(10));
        assert!(conn.is_closed(), "an idle connection is closed");
    }
    // Control: the busy connection was not cut, and its stream ends cleanly.
    cluster.engines[0].open_gate("idle-test");
    assert!(finish_stream(&mut busy), "the busy stream finished intact");
}

/// CI once saw a test fail before its gateway was up: the admin port the
/// harness had picked free was taken by another test's listener, which
/// reset the health probe. The harness now starts the gateway again on
/// fresh ports; here the first admin port is held on purpose.
#[test]
fn a_gateway_whose_admin_port_is_taken_comes_up_on_fresh_ports() {
    let holder = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a port to hold");
    let taken = holder.local_addr().expect("held address").port();
    let routes = [("r", route_yaml(&[free_port()], ""))];
    let gw = Gateway::start_with(
        &routes,
        GatewayOptions {
            first_admin_port: Some(taken),
            ..GatewayOptions::default()
        },
    );
    assert_eq!(gw.starts, 2, "the first start met the held port");
    assert_ne!(gw.admin.port(), taken);
    assert_eq!(http::get(gw.admin, "/healthz").status(), 200);
    assert!(
        !gw.log().contains(" is in use"),
        "the gateway answering is the one started on fresh ports:\n{}",
        gw.log()
    );
    drop(holder);
    // Control: on free ports the first start is the one that answers.
    assert_eq!(Gateway::start(&routes).starts, 1);
}
