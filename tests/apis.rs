//! The typed APIs through the gateway: Anthropic Messages (`/v1/messages`)
//! and OpenAI Responses (`/v1/responses`), stream and not, pass to the
//! client as the engine wrote them, and the gateway counts their tokens
//! (the metrics, the session's context, the cache hit rate) and their
//! first token's time (TTFT samples, the TTFT gate) as it does chat's.
//!
//! "As the engine wrote them": each request goes through the gateway to
//! engine 0 and straight to engine 1, a twin that has seen the same
//! requests in the same order, so the two answers are the same bytes but
//! for the engine's port in the ids and the clock in `created_at`.

mod common;

use common::http;
use common::*;
use serde_json::{json, Value};

/// The route sends everything to engine 0, with every rewrite the gateway
/// has for chat switched on: they must leave these APIs alone.
fn start() -> (SimCluster, Gateway) {
    let cluster = engines(2);
    let route = route_yaml(
        &[cluster.engines[0].port()],
        "postprocess: vllm_format\ninclude_usage: true\n",
    );
    let gw = Gateway::start(&[("chat", route)]);
    (cluster, gw)
}

/// The same request through the gateway (engine 0) and to engine 1
/// directly; the gateway's answer, after checking it is engine 1's with
/// the port and the clock aside.
fn through_and_direct(
    cluster: &SimCluster,
    gw: &Gateway,
    path: &str,
    session: &str,
    headers: &[(&str, &str)],
    body: &Value,
    direct_body: &Value,
) -> http::Response {
    let mut with_session = vec![("x-session-id", session)];
    with_session.extend_from_slice(headers);
    let via = http::post_json(gw.addr, &format!("/chat{path}"), &with_session, body);
    let direct = http::post_json(cluster.engines[1].addr, path, headers, direct_body);
    assert_eq!(via.status(), direct.status(), "{}", via.text());
    assert_eq!(via.header("content-type"), direct.header("content-type"));
    let (p0, p1) = (
        cluster.engines[0].port().to_string(),
        cluster.engines[1].port().to_string(),
    );
    assert_eq!(
        without_clock(&via.text().replace(&p0, &p1)),
        without_clock(&direct.text()),
        "the engine's answer, unchanged"
    );
    via
}

/// `"created_at":N` as `"created_at":0`.
fn without_clock(text: &str) -> String {
    const KEY: &str = "\"created_at\":";
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(KEY) {
        out.push_str(&rest[..at + KEY.len()]);
        out.push('0');
        rest = rest[at + KEY.len()..].trim_start_matches(|c: char| c.is_ascii_digit());
    }
    out.push_str(rest);
    out
}

/// The route's token counters: prompt, cached, completion.
fn tokens(gw: &Gateway) -> [f64; 3] {
    [
        "llm_gateway_prompt_tokens_total",
        "llm_gateway_cached_prompt_tokens_total",
        "llm_gateway_completion_tokens_total",
    ]
    .map(|name| gw.metric(name, &["route=\"chat\""]))
}

fn wait_tokens(gw: &Gateway, want: [f64; 3]) {
    wait_for(&format!("token counters at {want:?}"), DEADLINE, || {
        (tokens(gw) == want).then_some(())
    });
}

/// TTFT and decode-rate samples of the route's streams.
fn samples(gw: &Gateway) -> (f64, f64) {
    (
        gw.metric("llm_gateway_ttft_seconds_count", &["route=\"chat\""]),
        gw.metric(
            "llm_gateway_decode_tokens_per_second_count",
            &["route=\"chat\""],
        ),
    )
}

/// What the session table holds on the route's engine (one live session).
fn live_tokens(gw: &Gateway) -> u64 {
    let state = http::get(gw.addr, "/chat/_route_state").json();
    state["peers"][0]["live_tokens"].as_u64().unwrap_or(0)
}

/// A first turn of 105 prompt tokens as the simulator counts them, and the
/// conversation's second turn after a 16-token reply: 131 tokens, of which
/// turn 1's six complete blocks (96) are in the engine's prefix cache.
const SYSTEM: &str = "You are terse.";
const FOLLOW_UP: &str = "and a follow-up question";

fn first_text() -> String {
    "a".repeat(396)
}

/// The TTFT and decode-rate headers of a measured stream: 20 tokens 40 ms
/// apart (0.76 s of decode, a decode-rate sample).
const MEASURED: [(&str, &str); 2] = [("x-sim-max-tokens", "20"), ("x-sim-frame-delay-ms", "40")];

#[test]
fn messages_pass_unchanged_and_their_tokens_and_first_token_are_counted() {
    let (cluster, gw) = start();
    // Turn 1, not streamed: no TTFT sample.
    let turn1 = json!({"model": "sim-model", "max_tokens": 4096, "system": SYSTEM,
                       "messages": [{"role": "user", "content": first_text()}],
                       "metadata": {"user_id": "u1"}});
    let r = through_and_direct(&cluster, &gw, "/v1/messages", "m1", &[], &turn1, &turn1);
    let answer = r.json();
    // vllm_format would have dropped it: the handler left the answer alone.
    assert_eq!(answer["stop_reason"], "end_turn");
    assert_eq!(
        answer["usage"],
        json!({"input_tokens": 105, "cache_creation_input_tokens": 0,
               "cache_read_input_tokens": 0, "output_tokens": 16})
    );
    wait_tokens(&gw, [105.0, 0.0, 16.0]);
    assert_eq!(live_tokens(&gw), 105 + 16, "the session's context");
    assert_eq!(samples(&gw), (0.0, 0.0));

    // Turn 2, streamed: Anthropic counts the cached tokens apart
    // (input_tokens 35 + cache_read_input_tokens 96); the gateway's prompt
    // is both.
    let turn2 = json!({"model": "sim-model", "max_tokens": 4096, "stream": true,
                       "system": [{"type": "text", "text": SYSTEM}],
                       "messages": [
                           {"role": "user", "content": first_text()},
                           {"role": "assistant", "content": answer["content"]},
                           {"role": "user", "content": FOLLOW_UP}]});
    let r = through_and_direct(
        &cluster,
        &gw,
        "/v1/messages",
        "m1",
        &MEASURED,
        &turn2,
        &turn2,
    );
    let text = r.text();
    assert!(text.starts_with("event: message_start\n"), "{text}");
    assert!(
        text.contains("\"cache_read_input_tokens\":96") && text.contains("\"input_tokens\":35"),
        "{text}"
    );
    assert!(text.ends_with("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"));
    assert!(!text.contains("[DONE]"));
    wait_tokens(&gw, [105.0 + 131.0, 96.0, 16.0 + 20.0]);
    assert_eq!(live_tokens(&gw), 131 + 20);
    wait_for("a TTFT and a decode-rate sample", DEADLINE, || {
        (samples(&gw) == (1.0, 1.0)).then_some(())
    });
    let status = http::get(gw.addr, "/chat/_ttft_status").json();
    assert_eq!(status["nousage"], 0, "the decode rate came from usage");
    let hit = http::get(gw.addr, "/chat/_session_status").json()["cache_hit_rate"].as_f64();
    assert_eq!(hit, Some(96.0 / 236.0));

    // Control: the same route's handler does rewrite a chat answer (the sim
    // writes `logprobs: null`, which vllm_format drops).
    let chat = http::post_json(
        gw.addr,
        "/chat/v1/chat/completions",
        &[],
        &chat_body("c1", "hi", false),
    );
    assert_eq!(chat.status(), 200);
    assert!(!chat.text().contains("logprobs"), "{}", chat.text());
}

#[test]
fn responses_pass_unchanged_and_their_tokens_and_first_token_are_counted() {
    let (cluster, gw) = start();
    let turn1 = json!({"model": "sim-model", "instructions": SYSTEM, "input": first_text(),
                       "max_output_tokens": 1000});
    let r = through_and_direct(&cluster, &gw, "/v1/responses", "r1", &[], &turn1, &turn1);
    let answer = r.json();
    assert_eq!(answer["object"], "response");
    assert_eq!(answer["status"], "completed");
    assert_eq!(answer["usage"]["input_tokens"], 105);
    wait_tokens(&gw, [105.0, 0.0, 16.0]);
    assert_eq!(live_tokens(&gw), 105 + 16);
    assert_eq!(samples(&gw), (0.0, 0.0));

    // Turn 2 continues turn 1 on its engine: each side names its own
    // engine's id. Responses counts the cached tokens inside input_tokens.
    let id = answer["id"].as_str().expect("id");
    let (p0, p1) = (
        cluster.engines[0].port().to_string(),
        cluster.engines[1].port().to_string(),
    );
    let turn2 = |id: String| {
        json!({"model": "sim-model", "stream": true, "previous_response_id": id,
               "input": [{"role": "user", "content": [{"type": "input_text", "text": FOLLOW_UP}]}]})
    };
    let r = through_and_direct(
        &cluster,
        &gw,
        "/v1/responses",
        "r1",
        &MEASURED,
        &turn2(id.to_string()),
        &turn2(id.replace(&p0, &p1)),
    );
    let text = r.text();
    assert!(text.starts_with("event: response.created\n"), "{text}");
    // x-sim-max-tokens is a limit that cut the reply, as for chat.
    assert!(text.contains("event: response.incomplete\n"), "{text}");
    assert!(
        text.contains("\"input_tokens\":131,\"input_tokens_details\":{\"cached_tokens\":96}"),
        "{text}"
    );
    wait_tokens(&gw, [105.0 + 131.0, 96.0, 16.0 + 20.0]);
    assert_eq!(live_tokens(&gw), 131 + 20);
    wait_for("a TTFT and a decode-rate sample", DEADLINE, || {
        (samples(&gw) == (1.0, 1.0)).then_some(())
    });
    assert_eq!(
        http::get(gw.addr, "/chat/_ttft_status").json()["nousage"],
        0
    );

    // The engine's own refusal of an id it does not hold passes as it is,
    // and counts nothing.
    let unknown = json!({"previous_response_id": "resp_nope", "input": "x"});
    let r = http::post_json(
        gw.addr,
        "/chat/v1/responses",
        &[("x-session-id", "r2")],
        &unknown,
    );
    assert_eq!(r.status(), 404);
    assert_eq!(r.json()["error"]["code"], "previous_response_not_found");
    assert_eq!(tokens(&gw), [236.0, 96.0, 36.0]);
}

/// A Messages stream whose first token comes `ttft_ms` after the request.
fn timed_stream(gw: &Gateway, ttft_ms: u64) -> u16 {
    let body = json!({"model": "sim-model", "max_tokens": 2, "stream": true,
                      "messages": [{"role": "user", "content": "gate me"}]});
    let ttft = ttft_ms.to_string();
    let r = http::post_json(
        gw.addr,
        "/gated/v1/messages",
        &[("x-sim-ttft-ms", &ttft), ("x-session-id", "t")],
        &body,
    );
    if r.status() == 200 {
        assert!(r.text().contains("event: message_stop"), "a whole stream");
    }
    r.status()
}

/// A gated, unsampled Messages request.
fn ask(gw: &Gateway) -> http::Response {
    let body = json!({"model": "sim-model", "max_tokens": 2,
                      "messages": [{"role": "user", "content": "may I?"}]});
    http::post_json(
        gw.addr,
        "/gated/v1/messages",
        &[("x-session-id", "a")],
        &body,
    )
}

fn ttft_ewma(gw: &Gateway) -> Option<f64> {
    let status = http::get(gw.addr, "/gated/_ttft_status").json();
    status["series"]
        .as_array()?
        .iter()
        .find(|s| s["scope"] == "pool" && s["name"] == "_")?["ttft_ewma_ms"]
        .as_f64()
}

#[test]
fn the_ttft_gate_measures_messages_streams_and_refuses_messages_over_its_limit() {
    let cluster = engines(1);
    let gates = "protection:\n  ttft: {limit_ms: 200, window: 200ms}\n  probes: 0\n";
    let gw = Gateway::start(&[("gated", route_yaml(&ports(&cluster), gates))]);
    // A fast first token: measured, under the limit, and the gate passes.
    assert_eq!(timed_stream(&gw, 0), 200);
    let fast = wait_for("the first TTFT EWMA", DEADLINE, || ttft_ewma(&gw));
    assert!(fast < 200.0, "{fast}");
    assert_eq!(ask(&gw).status(), 200, "under the limit it passes");
    // A slow one: 0.3 × 1000 + 0.7 × the fast one is over the limit.
    assert_eq!(timed_stream(&gw, 1000), 200);
    let slow = wait_for("the EWMA over the limit", DEADLINE, || {
        ttft_ewma(&gw).filter(|&v| v > 200.0)
    });
    assert!(slow >= 0.3 * 1000.0, "{slow}");
    let refused = ask(&gw);
    assert_eq!(refused.status(), 429, "{}", refused.text());
    assert_eq!(refused.json()["error"]["type"], "ttft_limit");
    assert_eq!(
        gw.metric(
            "llm_gateway_load_rejections_total",
            &["route=\"gated\"", "gate=\"ttft\""]
        ),
        1.0
    );
    assert_eq!(
        cluster.engines[0]
            .stats
            .requests
            .load(std::sync::atomic::Ordering::SeqCst),
        3
    );
}
