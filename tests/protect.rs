//! Issue 9, measurement: TTFT and decode-rate samples from the streams the
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
