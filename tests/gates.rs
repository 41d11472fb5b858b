//! The gates end to end: the fold (P80, not the mean), per-model
//! limits, toggles, the EWMA's TTL, runtime overrides and metric tables,
//! the decode-rate sample rules, adaptive growth, session priority's
//! hysteresis and its byte-identical off state. Streams set their own TTFT
//! (`x-sim-ttft-ms`) and decode rate (`x-sim-frame-delay-ms`); the checks
//! that must not move an EWMA use non-stream requests, which are gated but
//! never sampled.

mod common;

use common::http;
use common::*;
use serde_json::{json, Value};
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// A stream whose first token comes `ttft_ms` after the request, then
/// `tokens` tokens `frame_ms` apart, with a usage frame.
fn stream(gw: &Gateway, route: &str, model: &str, ttft_ms: u64, tokens: u32, frame_ms: u32) -> u16 {
    stream_with(gw, route, model, ttft_ms, tokens, frame_ms, &[], true)
}

#[allow(clippy::too_many_arguments)]
fn stream_with(
    gw: &Gateway,
    route: &str,
    model: &str,
    ttft_ms: u64,
    tokens: u32,
    frame_ms: u32,
    extra: &[(&str, &str)],
    usage: bool,
) -> u16 {
    let mut body = json!({"model": model, "stream": true,
                          "messages": [{"role": "user", "content": "gate me"}]});
    if usage {
        body["stream_options"] = json!({"include_usage": true});
    }
    let (ttft, tokens, frame) = (
        ttft_ms.to_string(),
        tokens.to_string(),
        frame_ms.to_string(),
    );
    let mut headers = vec![
        ("x-sim-ttft-ms", ttft.as_str()),
        ("x-sim-max-tokens", tokens.as_str()),
        ("x-sim-frame-delay-ms", frame.as_str()),
    ];
    headers.extend_from_slice(extra);
    let r = http::post_json(
        gw.addr,
        &format!("/{route}/v1/chat/completions"),
        &headers,
        &body,
    );
    if r.status() == 200 {
        assert!(r.text().contains("data: [DONE]"), "a whole stream");
    }
    r.status()
}

/// A gated but unsampled request: it meets the gates and leaves the EWMAs
/// as they are.
fn ask(gw: &Gateway, route: &str, model: &str) -> http::Response {
    let body = json!({"model": model, "messages": [{"role": "user", "content": "x"}]});
    http::post_json(
        gw.addr,
        &format!("/{route}/v1/chat/completions"),
        &[],
        &body,
    )
}

fn status(gw: &Gateway, route: &str) -> Value {
    http::get(gw.addr, &format!("/{route}/_ttft_status")).json()
}

fn pool_series(status: &Value, pool: &str) -> Option<Value> {
    status["series"]
        .as_array()?
        .iter()
        .find(|s| s["scope"] == "pool" && s["name"] == pool)
        .cloned()
}

fn wait_ewma(gw: &Gateway, route: &str, pool: &str, key: &str) -> f64 {
    wait_for(&format!("{route}/{pool} {key}"), DEADLINE, || {
        pool_series(&status(gw, route), pool)?[key].as_f64()
    })
}

fn post(gw: &Gateway, path: &str) -> http::Response {
    http::Conn::open(gw.addr).request("POST", path, &[], b"")
}

/// Runs `n` copies of `f` at once and returns their results.
fn parallel<T: Send>(n: usize, f: impl Fn(usize) -> T + Sync) -> Vec<T> {
    std::thread::scope(|s| {
        let f = &f;
        let handles: Vec<_> = (0..n).map(|i| s.spawn(move || f(i))).collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("thread"))
            .collect()
    })
}

#[test]
fn the_window_folds_to_its_p80_not_the_mean_and_buckets_each_sample() {
    let cluster = engines(1);
    let gw = Gateway::start(&[("chat", route_yaml(&ports(&cluster), "ttft_window: 3s\n"))]);
    // 7 × 100 ms and 3 × 800 ms, all in one window: P80 800, mean 310.
    let codes = parallel(10, |i| {
        let ttft = if i < 7 { 100 } else { 800 };
        stream(&gw, "chat", "sim-model", ttft, 2, 1)
    });
    assert!(codes.iter().all(|&c| c == 200), "{codes:?}");
    let open = pool_series(&status(&gw, "chat"), "_").expect("series");
    if open["ttft_window_samples"] == 10 {
        assert!(
            open["ttft_ewma_ms"].is_null(),
            "no EWMA while the window is open: {open}"
        );
    }
    let ewma = wait_ewma(&gw, "chat", "_", "ttft_ewma_ms");
    assert!(
        (800.0..900.0).contains(&ewma),
        "P80 of the window, got {ewma}"
    );
    let series = pool_series(&status(&gw, "chat"), "_").expect("series");
    let hist = series["ttft_histogram_ms"].as_array().expect("histogram");
    let count = |le: f64| {
        hist.iter()
            .find(|b| b["le"] == le)
            .map(|b| b["count"].clone())
    };
    assert_eq!(count(250.0), Some(json!(7)), "{series}");
    assert_eq!(count(1000.0), Some(json!(3)), "{series}");
    assert_eq!(
        gw.metric(
            "llm_gateway_ttft_seconds_bucket",
            &["pool=\"_\"", "le=\"0.25\""]
        ),
        7.0
    );
}

#[test]
fn per_model_limits_are_isolated_and_the_toggles_turn_the_gate_off_and_on() {
    let cluster = engines(2);
    let p = ports(&cluster);
    let route = format!(
        "peers:\n  - {{name: slow, host: 127.0.0.1, port: {}}}\n  - {{name: fast, host: 127.0.0.1, port: {}}}\n\
         peers_by_model: {{slow-model: [slow], fast-model: [fast]}}\n\
         ttft_limit_ms: 100000\nttft_limit_by_model: {{slow-model: 100}}\n\
         ttft_window: 300ms\nprobes: 0\n",
        p[0], p[1]
    );
    let gw = Gateway::start(&[("chat", route)]);
    // The same 300 ms TTFT in both pools.
    for model in ["slow-model", "fast-model"] {
        assert_eq!(stream(&gw, "chat", model, 300, 2, 1), 200);
    }
    wait_ewma(&gw, "chat", "slow-model", "ttft_ewma_ms");
    wait_ewma(&gw, "chat", "fast-model", "ttft_ewma_ms");
    let refused = ask(&gw, "chat", "slow-model");
    assert_eq!(refused.status(), 429, "{}", refused.text());
    let err = &refused.json()["error"];
    assert_eq!(
        (
            &err["type"],
            &err["model"],
            &err["limit"],
            &err["limit_source"]
        ),
        (
            &json!("ttft_limit"),
            &json!("slow-model"),
            &json!(100.0),
            &json!("model")
        )
    );
    assert_eq!(
        ask(&gw, "chat", "fast-model").status(),
        200,
        "its own limit"
    );

    // `_ttft_429_toggle` off: no 429, but still measured.
    assert_eq!(post(&gw, "/chat/_ttft_429_toggle?on=0").status(), 200);
    assert_eq!(ask(&gw, "chat", "slow-model").status(), 200);
    let before = gw.metric("llm_gateway_ttft_seconds_count", &["pool=\"slow-model\""]);
    assert_eq!(stream(&gw, "chat", "slow-model", 300, 2, 1), 200);
    wait_for("the sample while shedding is off", DEADLINE, || {
        (gw.metric("llm_gateway_ttft_seconds_count", &["pool=\"slow-model\""]) > before)
            .then_some(())
    });
    assert_eq!(post(&gw, "/chat/_ttft_429_toggle?reset=1").status(), 200);
    assert_eq!(
        ask(&gw, "chat", "slow-model").status(),
        429,
        "control: on again"
    );

    // `_ttft_toggle` off lets everything through; on limits again.
    assert_eq!(post(&gw, "/chat/_ttft_toggle?on=0").status(), 200);
    assert_eq!(ask(&gw, "chat", "slow-model").status(), 200);
    assert_eq!(status(&gw, "chat")["switches"]["ttft"]["source"], "runtime");
    assert_eq!(post(&gw, "/chat/_ttft_toggle?on=1").status(), 200);
    assert_eq!(ask(&gw, "chat", "slow-model").status(), 429);
}

#[test]
fn a_gap_shorter_than_the_ttl_keeps_the_ewma_and_a_longer_one_expires_it() {
    let cluster = engines(1);
    let gates = "ttft_limit_ms: 100\nttft_window: 200ms\newma_ttl: 3s\nprobes: 0\n";
    let gw = Gateway::start(&[("chat", route_yaml(&ports(&cluster), gates))]);
    assert_eq!(stream(&gw, "chat", "sim-model", 300, 2, 1), 200);
    let sampled = Instant::now();
    wait_ewma(&gw, "chat", "_", "ttft_ewma_ms");
    // Well inside the TTL: kept, and it still sheds.
    assert_eq!(ask(&gw, "chat", "sim-model").status(), 429);
    assert!(sampled.elapsed() < Duration::from_secs(3));
    wait_for("the EWMA to expire", DEADLINE, || {
        pool_series(&status(&gw, "chat"), "_")?["ttft_ewma_ms"]
            .is_null()
            .then_some(())
    });
    assert!(
        sampled.elapsed() >= Duration::from_secs(3),
        "expired before its TTL: {:?}",
        sampled.elapsed()
    );
    assert_eq!(ask(&gw, "chat", "sim-model").status(), 200, "fail-open");
}

#[test]
fn an_override_moves_the_threshold_until_cleared_or_expired_and_a_metric_table_beats_it() {
    let cluster = engines(1);
    let gates = "ttft_window: 200ms\nprobes: 0\n";
    let table = "ttft_window: 200ms\nprobes: 0\n\
                 ttft_metrics:\n  - {metric: p80, threshold: 100000}\n  - {metric: avg, threshold: 200000}\n";
    let gw = Gateway::start(&[
        ("chat", route_yaml(&ports(&cluster), gates)),
        ("table", route_yaml(&ports(&cluster), table)),
    ]);
    for route in ["chat", "table"] {
        assert_eq!(stream(&gw, route, "sim-model", 300, 2, 1), 200);
        wait_ewma(&gw, route, "_", "ttft_ewma_ms");
    }
    // The static 30 s limit lets 300 ms through; an override of 100 ms does not.
    assert_eq!(ask(&gw, "chat", "sim-model").status(), 200);
    let set = post(&gw, "/chat/_ttft_limit?ms=100");
    assert_eq!(set.status(), 200, "{}", set.text());
    assert_eq!(set.json()["state"]["source"], "runtime");
    assert!(set.json()["state"]["override"]["expires_in_s"]
        .as_u64()
        .is_some_and(|s| (7_190..=7_200).contains(&s)));
    let refused = ask(&gw, "chat", "sim-model");
    assert_eq!(refused.status(), 429);
    assert_eq!(refused.json()["error"]["limit_source"], "runtime");
    // Cleared: the static limit again.
    assert_eq!(post(&gw, "/chat/_ttft_limit?reset=1").status(), 200);
    assert_eq!(ask(&gw, "chat", "sim-model").status(), 200);
    // With a TTL it lapses by itself.
    assert_eq!(post(&gw, "/chat/_ttft_limit?ms=100&ttl=1s").status(), 200);
    assert_eq!(ask(&gw, "chat", "sim-model").status(), 429);
    wait_for("the override to lapse", DEADLINE, || {
        (ask(&gw, "chat", "sim-model").status() == 200).then_some(())
    });
    assert_eq!(
        status(&gw, "chat")["limits"]["ttft"]["source"],
        "route",
        "an expired override is gone from the status too"
    );
    // Bad values are refused; a toggle source off loopback is refused.
    assert_eq!(post(&gw, "/chat/_ttft_limit?ms=-5").status(), 400);
    assert_eq!(post(&gw, "/chat/_ttft_limit?ms=5&ttl=soon").status(), 400);
    let mut remote = http::Conn::open_from("127.0.0.2".parse::<IpAddr>().unwrap(), gw.addr);
    assert_eq!(
        remote
            .request("POST", "/chat/_ttft_limit?ms=100", &[], b"")
            .status(),
        403
    );
    assert_eq!(
        ask(&gw, "chat", "sim-model").status(),
        200,
        "the refused call set nothing"
    );

    // A declared metric table beats the override.
    assert_eq!(post(&gw, "/table/_ttft_limit?ms=100").status(), 200);
    assert_eq!(ask(&gw, "table", "sim-model").status(), 200);
    let limits = status(&gw, "table")["limits"]["ttft"].clone();
    assert_eq!(limits["source"], "metric_table", "{limits}");
    let s = pool_series(&status(&gw, "table"), "_").expect("series");
    assert!(s["ttft_ewmas_ms"]["avg"].is_number(), "{s}");
}

#[test]
fn a_metric_table_trips_on_its_own_entry_and_names_it() {
    let cluster = engines(1);
    // The P80 entry is far off; the mean's threshold is below 300 ms.
    let table = "ttft_window: 200ms\nprobes: 0\n\
                 ttft_metrics:\n  - {metric: p80, threshold: 100000}\n  - {metric: avg, threshold: 100}\n";
    let gw = Gateway::start(&[("table", route_yaml(&ports(&cluster), table))]);
    assert_eq!(stream(&gw, "table", "sim-model", 300, 2, 1), 200);
    wait_ewma(&gw, "table", "_", "ttft_ewma_ms");
    let refused = ask(&gw, "table", "sim-model");
    assert_eq!(refused.status(), 429, "{}", refused.text());
    let err = &refused.json()["error"];
    assert_eq!(
        (&err["metric"], &err["limit"]),
        (&json!("avg"), &json!(100.0))
    );
    assert_eq!(err["limit_source"], "metric_table");
}

fn tps_samples(gw: &Gateway) -> f64 {
    gw.metric(
        "llm_gateway_decode_tokens_per_second_count",
        &["pool=\"_\""],
    )
}

#[test]
fn decode_rate_samples_need_16_tokens_and_half_a_second_and_take_the_last_count() {
    let cluster = engines(1);
    let gw = Gateway::start(&[("chat", route_yaml(&ports(&cluster), "tps_window: 200ms\n"))]);
    let ttft = "llm_gateway_ttft_seconds_count";
    let streams_seen = |n: f64| {
        wait_for("the stream's TTFT sample", DEADLINE, || {
            (gw.metric(ttft, &["pool=\"_\""]) >= n).then_some(())
        })
    };
    // 15 tokens 40 ms apart (0.56 s of decode): too few tokens.
    assert_eq!(stream(&gw, "chat", "sim-model", 0, 15, 40), 200);
    streams_seen(1.0);
    assert_eq!(tps_samples(&gw), 0.0);
    // 16 tokens 40 ms apart (0.6 s): sampled.
    assert_eq!(stream(&gw, "chat", "sim-model", 0, 16, 40), 200);
    wait_for("the 16-token sample", DEADLINE, || {
        (tps_samples(&gw) == 1.0).then_some(())
    });
    // 40 tokens 10 ms apart (0.39 s): too short a decode.
    assert_eq!(stream(&gw, "chat", "sim-model", 0, 40, 10), 200);
    streams_seen(3.0);
    assert_eq!(tps_samples(&gw), 1.0);
    // A decoy usage frame claiming 1 token comes first; the last says 20.
    let decoy = [("x-sim-decoy-usage", "1")];
    assert_eq!(
        stream_with(&gw, "chat", "sim-model", 0, 20, 40, &decoy, true),
        200
    );
    wait_for("the sample despite the decoy", DEADLINE, || {
        (tps_samples(&gw) == 2.0).then_some(())
    });
    // No usage frame at all: content frames are counted, and the stream is
    // counted as `nousage`.
    assert_eq!(
        stream_with(&gw, "chat", "sim-model", 0, 20, 40, &[], false),
        200
    );
    wait_for("the frame-counted sample", DEADLINE, || {
        (tps_samples(&gw) == 3.0).then_some(())
    });
    assert_eq!(status(&gw, "chat")["nousage"], 1);
    // 20 tokens over 19 × 40 ms ≈ 26 tok/s; a decoy taken at its word
    // would have given no sample, and 1 token would be far lower.
    let ewma = wait_ewma(&gw, "chat", "_", "tps_ewma");
    assert!((15.0..30.0).contains(&ewma), "{ewma}");
}

#[test]
fn a_decode_rate_under_its_floor_sheds_and_its_override_and_toggles_lift_it() {
    let cluster = engines(1);
    let gates = "tps_limit_tps: 1000\nadaptive_cc: false\ntps_window: 200ms\nprobes: 0\n";
    let gw = Gateway::start(&[("chat", route_yaml(&ports(&cluster), gates))]);
    assert_eq!(stream(&gw, "chat", "sim-model", 0, 20, 40), 200);
    wait_ewma(&gw, "chat", "_", "tps_ewma");
    let refused = ask(&gw, "chat", "sim-model");
    assert_eq!(refused.status(), 429, "{}", refused.text());
    let err = &refused.json()["error"];
    assert_eq!(
        (&err["type"], &err["metric"], &err["limit"]),
        (&json!("tps_limit"), &json!("p20"), &json!(1000.0))
    );
    // An override lowers the floor under the measured rate.
    assert_eq!(post(&gw, "/chat/_tps_limit?tps=1").status(), 200);
    assert_eq!(ask(&gw, "chat", "sim-model").status(), 200);
    assert_eq!(post(&gw, "/chat/_tps_limit?reset=1").status(), 200);
    assert_eq!(
        ask(&gw, "chat", "sim-model").status(),
        429,
        "control: the floor again"
    );
    // `_tps_429_toggle` off: measured, never shed; `_tps_toggle` off: out.
    assert_eq!(post(&gw, "/chat/_tps_429_toggle?on=0").status(), 200);
    assert_eq!(ask(&gw, "chat", "sim-model").status(), 200);
    assert_eq!(post(&gw, "/chat/_tps_429_toggle?reset=1").status(), 200);
    assert_eq!(post(&gw, "/chat/_tps_toggle?on=0").status(), 200);
    assert_eq!(ask(&gw, "chat", "sim-model").status(), 200);
    assert_eq!(post(&gw, "/chat/_tps_toggle?reset=1").status(), 200);
    assert_eq!(ask(&gw, "chat", "sim-model").status(), 429);
    // The master switch off: no 429, the trip counted apart.
    assert_eq!(post(&gw, "/chat/_rate_limit_toggle?on=0").status(), 200);
    assert_eq!(ask(&gw, "chat", "sim-model").status(), 200);
    let rl = http::get(gw.addr, "/chat/_rate_limit_status").json();
    assert_eq!(rl["rate_limit"]["trips_while_off"]["tps"], 1, "{rl}");
    let s429 = http::get(gw.addr, "/chat/_429_status").json();
    assert_eq!(
        s429["by_reason"]["tps"], 3,
        "only the real refusals: {s429}"
    );
}

/// Adaptive concurrency is opt-in, as the OpenResty gateway's: a route that
/// sets only a decode-rate floor sheds on it (decode-rate shedding applies
/// only with adaptive concurrency off) and has no adaptive limit; the same
/// floor with `protection.adaptive.enabled: true` drives the AIMD limit
/// down instead, and never sheds on decode rate.
#[test]
fn a_floor_only_route_sheds_on_decode_rate_and_runs_aimd_only_when_adaptive_is_enabled() {
    let cluster = engines(1);
    let floor = "protection:\n  tps: {limit_tps: 1000, window: 200ms}\n  probes: 0\n";
    let gw = Gateway::start(&[
        ("chat", route_yaml(&ports(&cluster), floor)),
        (
            "aimd",
            route_yaml(
                &ports(&cluster),
                &format!("{floor}  adaptive: {{enabled: true}}\n"),
            ),
        ),
    ]);
    // ~26 tok/s in both pools, far under the floor of 1000.
    for r in ["chat", "aimd"] {
        assert_eq!(stream(&gw, r, "sim-model", 0, 20, 40), 200);
        wait_ewma(&gw, r, "_", "tps_ewma");
    }
    let refused = ask(&gw, "chat", "sim-model");
    assert_eq!(refused.status(), 429, "{}", refused.text());
    assert_eq!(refused.json()["error"]["type"], "tps_limit");
    let tps = http::get(gw.addr, "/chat/_tps_status").json();
    assert!(tps["adaptive_cc"].is_null(), "no AIMD: {tps}");
    // Control: enabled, the same slow pool is let in and its limit shrinks.
    assert_eq!(ask(&gw, "aimd", "sim-model").status(), 200);
    let pool = wait_for("an AIMD overload step", DEADLINE, || {
        let s = http::get(gw.addr, "/aimd/_tps_status").json();
        let pool = s["adaptive_cc"]["pools"][0].clone();
        (pool["last_step"] == "overload").then_some(pool)
    });
    assert_eq!(pool["limit"], pool["min"], "init is the floor: {pool}");
    assert_eq!(
        gw.metric(
            "llm_gateway_load_rejections_total",
            &["route=\"aimd\"", "gate=\"tps\""]
        ),
        0.0
    );
    assert_eq!(
        gw.metric(
            "llm_gateway_load_rejections_total",
            &["route=\"chat\"", "gate=\"tps\""]
        ),
        1.0
    );
}

fn adaptive_limit(gw: &Gateway) -> f64 {
    http::get(gw.addr, "/chat/_tps_status").json()["adaptive_cc"]["pools"][0]["limit"]
        .as_f64()
        .expect("an adaptive limit")
}

#[test]
fn a_fast_pool_under_pressure_grows_its_adaptive_limit_and_an_idle_one_does_not() {
    let cluster = spawn_engines(
        1,
        0,
        EngineConfig {
            max_running: 32,
            ..EngineConfig::default()
        },
    )
    .expect("engine");
    let route = |name: &str| {
        format!(
            "peers:\n  - {{name: {name}, host: 127.0.0.1, port: {}, max_concurrency: 40}}\n\
             tps_limit_tps: 1\ntps_window: 100ms\nadaptive_cc: true\nadaptive_cc_init_frac: 0.4\n",
            cluster.engines[0].port()
        )
    };
    let gw = Gateway::start(&[("chat", route("e0")), ("idle", route("e0"))]);
    // Healthy decode rates in both pools (20 tokens, 30 ms apart: ~33 tok/s).
    for r in ["chat", "idle"] {
        assert_eq!(stream(&gw, r, "sim-model", 0, 20, 30), 200);
        wait_ewma(&gw, r, "_", "tps_ewma");
    }
    // One stream at a time is light load: the limit stays at init.
    assert_eq!(adaptive_limit(&gw), 16.0, "starts at init = 0.4 × 40");
    // Fifteen held streams press on it (at least 0.9 × 16): it grows,
    // toward what they need (15 + 5), never past it.
    let held: Vec<_> = (0..15)
        .map(|_| hold_stream(&gw, "/chat/v1/chat/completions", "press", &[]))
        .collect();
    let grown = wait_for("the limit to grow under pressure", DEADLINE, || {
        let l = adaptive_limit(&gw);
        (l >= 19.0).then_some(l)
    });
    assert!(grown <= 20.0, "no further than demand: {grown}");
    // Control: the idle route's limit stayed at init all along.
    let idle = http::get(gw.addr, "/idle/_tps_status").json()["adaptive_cc"]["pools"][0].clone();
    assert_eq!(idle["limit"], 16.0, "{idle}");
    cluster.engines[0].open_gate("press");
    drop(held);
}

/// The AIMD internals are route options under `protection.adaptive`, shown
/// in `/_route_opts` under `advanced`: a route that halves its limit on
/// overload and steps every second moves as it says, and the same route
/// with the defaults (×0.97) does not.
#[test]
fn the_aimd_internals_are_advanced_options_that_take_effect() {
    let cluster = engines(1);
    let route = |adaptive: &str| {
        format!(
            "peers:\n  - {{name: e0, host: 127.0.0.1, port: {}, max_concurrency: 64}}\n\
             protection:\n  tps: {{limit_tps: 1000, window: 200ms}}\n  \
             adaptive: {{enabled: true, init_frac: 1.0, min: 3, interval: 1s{adaptive}}}\n",
            cluster.engines[0].port()
        )
    };
    let gw = Gateway::start(&[("chat", route(", dec: 0.5")), ("steady", route(""))]);
    let opts = http::get(gw.addr, "/chat/_route_opts").json();
    let advanced = opts["advanced"].as_array().expect("advanced");
    let option = |key: &str| {
        advanced
            .iter()
            .find(|o| o["key"] == key)
            .unwrap_or_else(|| panic!("{key} under advanced: {opts}"))
    };
    let dec = option("protection.adaptive.dec");
    assert_eq!(
        (&dec["value"], &dec["default"], &dec["set_by_route"]),
        (&json!(0.5), &json!("0.97"), &json!(true))
    );
    for (key, default) in [
        ("protection.adaptive.inc", "1.02"),
        ("protection.adaptive.pressure_frac", "0.9"),
        ("protection.adaptive.slack_frac", "0.7"),
        ("protection.adaptive.abs", "5"),
        ("protection.adaptive.min_frac", "0.4"),
        ("protection.adaptive.ttl", "300s"),
    ] {
        let o = option(key);
        assert_eq!(
            (&o["default"], &o["set_by_route"]),
            (&json!(default), &json!(false)),
            "{o}"
        );
    }
    assert!(
        opts["options"]
            .as_array()
            .is_some_and(|o| o.iter().all(|x| x["key"] != "protection.adaptive.dec")),
        "not among the tunables: {opts}"
    );
    // Both pools decode at ~26 tok/s against a floor of 1000: overloaded.
    for r in ["chat", "steady"] {
        assert_eq!(stream(&gw, r, "sim-model", 0, 20, 40), 200);
        wait_ewma(&gw, r, "_", "tps_ewma");
    }
    let first_overload = |route: &str| {
        wait_for(&format!("{route}'s first overload step"), DEADLINE, || {
            let s = http::get(gw.addr, &format!("/{route}/_tps_status")).json();
            let pool = s["adaptive_cc"]["pools"][0].clone();
            (pool["last_step"] == "overload").then(|| pool["limit"].as_f64())?
        })
    };
    // From 64: 32 after one step of ×0.5 (16 if the poll missed a second).
    let halved = first_overload("chat");
    assert!(halved <= 32.0, "{halved}");
    // Control: ×0.97 needs 23 one-second steps to reach 32.
    let steady = first_overload("steady");
    assert!(steady > 32.0, "{steady}");
}

fn turn(n: u64) -> String {
    format!(r#"{{"session_id":"agent-7","turn":{n}}}"#)
}

fn ask_turn(gw: &Gateway, route: &str, n: u64) -> u16 {
    let body = json!({"model": "sim-model", "messages": [{"role": "user", "content": "x"}]});
    let header = turn(n);
    http::post_json(
        gw.addr,
        &format!("/{route}/v1/chat/completions"),
        &[("x-phanrouter-session", &header)],
        &body,
    )
    .status()
}

#[test]
fn turn_one_stays_held_until_the_ttft_falls_below_the_release_line() {
    let cluster = engines(1);
    let gates = "session_prio: true\nttft_window: 200ms\nprobes: 0\nsession_prio_t1_probes: 0\n";
    let gw = Gateway::start(&[("chat", route_yaml(&ports(&cluster), gates))]);
    assert_eq!(stream(&gw, "chat", "sim-model", 300, 2, 1), 200);
    let ewma = wait_ewma(&gw, "chat", "_", "ttft_ewma_ms");
    let set_limit = |ms: f64| {
        let r = post(&gw, &format!("/chat/_ttft_limit?ms={ms:.0}"));
        assert_eq!(r.status(), 200, "{}", r.text());
    };
    // EWMA at 1.25 × the limit: turn 1's soft zone (tol 1.0), under the
    // warmest bucket's line (tol 1.5).
    set_limit(ewma / 1.25);
    assert_eq!(ask_turn(&gw, "chat", 1), 429, "turn 1 is refused first");
    assert_eq!(ask_turn(&gw, "chat", 40), 200, "a warm turn is admitted");
    // The limit rises just over the EWMA (0.95 of it): no trip, but above
    // the release line (0.9), so the hold keeps turn 1 out.
    set_limit(ewma / 0.95);
    assert_eq!(ask_turn(&gw, "chat", 1), 429, "held");
    // Below the release line: turn 1 comes back.
    set_limit(ewma / 0.8);
    assert_eq!(ask_turn(&gw, "chat", 1), 200, "released");
    // Control: at 0.95 again without a hold, turn 1 is admitted — the
    // earlier refusal there was the hold, not the limit.
    set_limit(ewma / 0.95);
    assert_eq!(ask_turn(&gw, "chat", 1), 200);
    let s = http::get(gw.addr, "/chat/_session_status").json();
    assert_eq!(s["buckets"][0]["rejections"], 2, "{s}");
}

#[test]
fn with_session_priority_off_the_header_changes_nothing() {
    let cluster = engines(1);
    let gw = Gateway::start(&[
        ("off", route_yaml(&ports(&cluster), "")),
        ("on", route_yaml(&ports(&cluster), "session_prio: true\n")),
    ]);
    let echo = |route: &str, with_header: bool| {
        let header = turn(1);
        let mut headers = vec![("x-sim-echo", "1")];
        if with_header {
            headers.push(("x-phanrouter-session", header.as_str()));
        }
        let body = json!({"model": "sim-model", "messages": [{"role": "user", "content": "same"}]});
        let r = http::post_json(
            gw.addr,
            &format!("/{route}/v1/chat/completions"),
            &headers,
            &body,
        );
        let mut names: Vec<String> = r
            .head
            .headers
            .iter()
            .map(|(k, _)| k.to_ascii_lowercase())
            .collect();
        names.sort();
        (r.status(), r.body.clone(), names)
    };
    assert_eq!(echo("off", true), echo("off", false), "byte-identical");
    let off = http::get(gw.addr, "/off/_session_status").json();
    assert_eq!(off["buckets"][0]["admits"], 0, "no counter traffic: {off}");
    // Control: with the feature on the same request is counted in its bucket.
    assert_eq!(echo("on", true).0, 200);
    let on = http::get(gw.addr, "/on/_session_status").json();
    assert_eq!(on["buckets"][0]["admits"], 1, "{on}");
}
