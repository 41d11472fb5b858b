//! Prefix-stability transforms end to end: what the engine
//! receives with `cch_strip` / `kimi_normalize` on and off (the simulated
//! engine echoes the exact body with `x-sim-echo: 1`), the runtime toggles,
//! and the simulator's prefix cache across a session whose client changes
//! the billing header's `cch` every turn.

mod common;

use common::http::{self, Conn};
use common::*;
use serde_json::{json, Value};
use std::net::{IpAddr, Ipv4Addr};

const ECHO: (&str, &str) = ("x-sim-echo", "1");
const JSON: (&str, &str) = ("Content-Type", "application/json");

fn chat(route: &str) -> String {
    format!("/{route}/v1/chat/completions")
}

/// What the engine received for `raw` sent on `route`.
fn echoed(gw: &Gateway, route: &str, raw: &str) -> String {
    let r = http::request(gw.addr, "POST", &chat(route), &[JSON, ECHO], raw.as_bytes());
    assert_eq!(r.status(), 200, "{}", r.text());
    r.text()
}

fn rewrites(gw: &Gateway, route: &str, transform: &str) -> f64 {
    gw.metric(
        "llm_gateway_prefix_rewrites_total",
        &[
            &format!("route=\"{route}\""),
            &format!("transform=\"{transform}\""),
        ],
    )
}

/// A Claude Code-shaped body: odd spacing and key order the engine must get
/// untouched, escapes in the system text, and a `cch=` in a later message
/// that is the conversation's, not the header's.
const CLAUDE: &str = r#"{ "model" : "m","messages":[ {"content" : "x-anthropic-billing-header: cc_version=2.1.100.7b4; cc_entrypoint=cli; cch=eb6c6;\nYou are Claude Code, caf\u00e9 \"edition\".", "role":"system"},
 {"role":"user","content":"what does cch=abcde; mean?"}],"max_tokens":2 }"#;

#[test]
fn cch_strip_removes_exactly_the_field_and_off_forwards_the_original() {
    let cluster = engines(1);
    let port = ports(&cluster);
    let gw = Gateway::start(&[
        ("strip", route_yaml(&port, "cch_strip: true\n")),
        ("plain", route_yaml(&port, "")),
    ]);
    assert_eq!(
        echoed(&gw, "strip", CLAUDE),
        CLAUDE.replacen(" cch=eb6c6;", "", 1),
        "the engine gets the body minus ` cch=eb6c6;`, every other byte in place"
    );
    assert_eq!(rewrites(&gw, "strip", "cch_strip"), 1.0);
    // Control: a route without the option forwards the client's bytes.
    assert_eq!(echoed(&gw, "plain", CLAUDE), CLAUDE);
    assert_eq!(rewrites(&gw, "plain", "cch_strip"), 0.0);

    // A body the transform will not edit (its member written twice: which
    // copy an engine reads is its business) goes on unchanged, not refused.
    let twice = r#"{"messages":[{"role":"system","content":"x-anthropic-billing-header: cch=11111;"}],"messages":[{"role":"system","content":"x-anthropic-billing-header: cch=22222;"}]}"#;
    assert_eq!(echoed(&gw, "strip", twice), twice);
    // No header: nothing to do, nothing counted.
    let none = r#"{"messages":[{"role":"system","content":"You are. cch=11111;"}]}"#;
    assert_eq!(echoed(&gw, "strip", none), none);
    assert_eq!(rewrites(&gw, "strip", "cch_strip"), 1.0);
    // An Anthropic-shaped body on /v1/messages: the top-level system. The
    // simulator answers it and records what it received.
    let anthropic = r#"{"model":"claude","system":[{"type":"text","text":"x-anthropic-billing-header: cc_version=2.1.1.abc; cc_entrypoint=cli; cch=0aaa9;"},{"type":"text","text":"You are Claude Code."}],"messages":[{"role":"user","content":"hi"}]}"#;
    let r = http::request(
        gw.addr,
        "POST",
        "/strip/v1/messages",
        &[JSON],
        anthropic.as_bytes(),
    );
    assert_eq!(r.status(), 200, "the engine's answer: {}", r.text());
    let got = cluster.engines[0].stats.recorded.lock().last().cloned();
    let got = got.expect("the engine saw the request");
    assert_eq!(got.path, "/v1/messages");
    assert_eq!(
        String::from_utf8_lossy(&got.body),
        anthropic.replacen(" cch=0aaa9;", "", 1)
    );
}

#[test]
fn toggles_switch_both_transforms_at_runtime_from_loopback_only() {
    let cluster = engines(1);
    let gw = Gateway::start(&[("r", route_yaml(&ports(&cluster), ""))]);
    let stripped = CLAUDE.replacen(" cch=eb6c6;", "", 1);
    let toggle = |from: Ipv4Addr, path: &str| {
        Conn::open_from(IpAddr::V4(from), gw.addr).request("POST", path, &[], b"")
    };
    assert_eq!(echoed(&gw, "r", CLAUDE), CLAUDE, "off by default");

    let r = toggle(Ipv4Addr::new(127, 0, 0, 2), "/r/_cch_strip_toggle?on=1");
    assert_eq!(r.status(), 403);
    assert_eq!(
        echoed(&gw, "r", CLAUDE),
        CLAUDE,
        "a refused toggle changed nothing"
    );

    let r = toggle(Ipv4Addr::LOCALHOST, "/r/_cch_strip_toggle?on=1");
    assert_eq!(r.status(), 200, "{}", r.text());
    assert_eq!(r.json()["state"]["on"], true);
    assert_eq!(r.json()["state"]["source"], "runtime");
    assert_eq!(echoed(&gw, "r", CLAUDE), stripped);
    let state = http::get(gw.addr, "/r/_route_state").json();
    assert_eq!(state["toggles"]["cch_strip"]["on"], true);
    assert_eq!(state["toggles"]["kimi_normalize"]["on"], false);

    // The override outlives a reload, and reset=1 returns to the file.
    gw.write_route("r", &route_yaml(&ports(&cluster), "routed_headers: true\n"));
    gw.reload();
    assert_eq!(echoed(&gw, "r", CLAUDE), stripped);
    let r = toggle(Ipv4Addr::LOCALHOST, "/r/_cch_strip_toggle?reset=1");
    assert_eq!(r.status(), 200);
    assert_eq!(r.json()["state"]["source"], "config");
    assert_eq!(echoed(&gw, "r", CLAUDE), CLAUDE);

    // The other toggle, and GET is not a toggle.
    let kimi = kimi_body(&[("search", 5)]);
    assert_eq!(echoed(&gw, "r", &kimi), kimi);
    let r = toggle(Ipv4Addr::LOCALHOST, "/r/_kimi_normalize_toggle?on=1");
    assert_eq!(r.status(), 200, "{}", r.text());
    assert_eq!(echoed(&gw, "r", &kimi), kimi_body(&[("search", 0)]));
    assert_eq!(
        http::get(gw.addr, "/r/_kimi_normalize_toggle?on=0").status(),
        405
    );
}

/// A Kimi conversation: one assistant tool call and its result per round,
/// numbered with the client's counters.
fn kimi_body(rounds: &[(&str, u32)]) -> String {
    let mut messages = vec![
        json!({"role": "system", "content": "You are Kimi."}),
        json!({"role": "user", "content": "go"}),
    ];
    for (name, n) in rounds {
        let id = format!("functions.{name}:{n}");
        messages.push(json!({"role": "assistant", "content": "", "tool_calls": [
            {"id": id, "type": "function", "function": {"name": name, "arguments": "{\"q\":1}"}}]}));
        messages.push(json!({"role": "tool", "tool_call_id": id, "content": "result"}));
    }
    json!({"model": "kimi-k2", "max_tokens": 2, "messages": messages}).to_string()
}

#[test]
fn kimi_ids_are_renumbered_in_what_the_engine_receives() {
    let cluster = engines(1);
    let port = ports(&cluster);
    let gw = Gateway::start(&[
        ("kimi", route_yaml(&port, "kimi_normalize: true\n")),
        ("plain", route_yaml(&port, "")),
    ]);
    let raw = kimi_body(&[("search", 17), ("read", 18), ("search", 19)]);
    assert_eq!(
        echoed(&gw, "kimi", &raw),
        kimi_body(&[("search", 0), ("read", 1), ("search", 2)])
    );
    assert_eq!(rewrites(&gw, "kimi", "kimi_normalize"), 1.0);
    assert_eq!(echoed(&gw, "plain", &raw), raw, "control: option off");
    // Two turns whose client counters disagree reach the engine with the
    // earlier turn's history as a byte prefix of the later one.
    let turn1 = echoed(&gw, "kimi", &kimi_body(&[("search", 40)]));
    let turn2 = echoed(&gw, "kimi", &kimi_body(&[("search", 3), ("write", 4)]));
    let history_end = turn1.rfind(']').expect("messages end");
    assert_eq!(turn1[..history_end], turn2[..history_end]);
}

#[test]
fn include_usage_cch_strip_and_kimi_compose_on_one_body() {
    let cluster = engines(1);
    let gw = Gateway::start(&[(
        "all",
        route_yaml(
            &ports(&cluster),
            "include_usage: true\ncch_strip: true\nkimi_normalize: true\n",
        ),
    )]);
    let raw = r#"{"stream":true,"messages":[{"role":"system","content":"x-anthropic-billing-header: cc_version=2; cch=9f9f9;\nBe brief."},{"role":"assistant","tool_calls":[{"id":"functions.ls:8"}]},{"role":"tool","tool_call_id":"functions.ls:8","content":"a b"}]}"#;
    let expected = format!(
        "{{\"stream_options\":{{\"include_usage\":true}},{}",
        &raw[1..]
    )
    .replacen(" cch=9f9f9;", "", 1)
    .replace("functions.ls:8", "functions.ls:0");
    assert_eq!(echoed(&gw, "all", raw), expected);
}

// ------------------------------------------------------------ prefix cache

/// A long, fixed system prompt (~2000 simulated tokens at 4 bytes each).
fn system_prompt(seed: &str) -> String {
    (0..400)
        .map(|i| format!("{seed} rule {i:03}: be exact. "))
        .collect()
}

const HEADER: &str = "x-anthropic-billing-header: cc_version=2.1.100.7b4; cc_entrypoint=cli;";

/// Turn `turn` (1-based) of a session: the billing line with this turn's
/// `cch`, the system prompt, and the history so far.
fn session_turn(seed: &str, session: &str, turn: usize) -> Value {
    let cch = format!("{:05x}", 0x1f2e3 * turn + 0x77);
    let mut messages = vec![json!({"role": "system",
        "content": format!("{HEADER} cch={cch};\n{}", system_prompt(seed))})];
    for t in 1..turn {
        messages.push(json!({"role": "user", "content": format!("question {t}")}));
        messages.push(json!({"role": "assistant", "content": format!("answer {t}")}));
    }
    messages.push(json!({"role": "user", "content": format!("question {turn}")}));
    json!({"model": "sim-model", "max_tokens": 2, "messages": messages,
           "metadata": {"session_id": session}})
}

/// (prompt_tokens, cached_tokens) of each turn's non-stream response.
fn run_session(gw: &Gateway, route: &str, seed: &str, turns: usize) -> Vec<(u64, u64)> {
    (1..=turns)
        .map(|turn| {
            let r = http::post_json(gw.addr, &chat(route), &[], &session_turn(seed, route, turn));
            assert_eq!(r.status(), 200, "{}", r.text());
            let usage = &r.json()["usage"];
            (
                usage["prompt_tokens"].as_u64().expect("prompt_tokens"),
                usage["prompt_tokens_details"]["cached_tokens"]
                    .as_u64()
                    .expect("cached_tokens"),
            )
        })
        .collect()
}

#[test]
fn a_session_whose_billing_header_varies_hits_the_cache_only_with_cch_strip() {
    // One engine per route, so neither session can warm the other's cache.
    let cluster = engines(2);
    let p = ports(&cluster);
    let gw = Gateway::start(&[
        ("on", route_yaml(&p[..1], "cch_strip: true\n")),
        ("off", route_yaml(&p[1..], "")),
    ]);
    const TURNS: usize = 4;
    let on = run_session(&gw, "on", "alpha", TURNS);
    let off = run_session(&gw, "off", "bravo", TURNS);
    eprintln!("cch_strip on  (prompt, cached) per turn: {on:?}");
    eprintln!("cch_strip off (prompt, cached) per turn: {off:?}");

    assert!(
        on[0].0 > 2000,
        "the prompt is long enough for blocks to matter"
    );
    assert_eq!(on[0].1, 0, "turn 1 is cold");
    for t in 1..TURNS {
        let (prompt, cached) = on[t];
        // Everything of the previous turn's prompt but its last partial
        // block (16 tokens) is served from the cache.
        assert!(
            cached + 16 > on[t - 1].0 && cached * 10 >= prompt * 9,
            "turn {}: {cached} of {prompt} cached",
            t + 1
        );
    }
    // Off: nothing past the block that holds `cch=` can match. The prompt
    // the engine sees is the role, then the content.
    let cch_at = ("system".len() + HEADER.len() + 1) as u64;
    for (t, &(prompt, cached)) in off.iter().enumerate() {
        assert!(
            cached * 4 <= cch_at,
            "turn {}: {cached} of {prompt} cached",
            t + 1
        );
        // Control: the same shape of session, so the prompts are as long.
        assert!(prompt.abs_diff(on[t].0) < 8, "{prompt} vs {}", on[t].0);
    }
}
