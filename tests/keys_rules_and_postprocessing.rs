//! API keys, content reject rules, response
//! post-processing, include_usage injection and the loopback-only toggles.

mod common;

use common::canned::{canned_route, Canned};
use common::http::{self, Conn, Upload};
use common::*;
use serde_json::{json, Value};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::Ordering;

const CHAT: &str = "/chat/v1/chat/completions";

/// A gateway whose shared key file is `key_file` (through the env override).
fn keyed(key_file: &std::path::Path, routes: &[(&str, String)]) -> Gateway {
    Gateway::start_with(
        routes,
        GatewayOptions {
            env: vec![(
                "LLM_GATEWAY_API_KEYS_FILE".into(),
                key_file.display().to_string(),
            )],
            ..Default::default()
        },
    )
}

fn post(gw: &Gateway, path: &str, headers: &[(&str, &str)], body: &Value) -> http::Response {
    http::post_json(gw.addr, path, headers, body)
}

fn small() -> Value {
    json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
}

// ---------------------------------------------------------------- API keys

#[test]
fn key_rotation_with_sighup_keeps_a_stream_alive() {
    let cluster = engines(1);
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys");
    std::fs::write(&keys, "old-key-123:alice\n").unwrap();
    let gw = keyed(&keys, &[("chat", route_yaml(&ports(&cluster), ""))]);

    assert_eq!(post(&gw, CHAT, &[], &small()).status(), 401);
    assert_eq!(
        post(&gw, CHAT, &[("Authorization", "Bearer wrong")], &small()).status(),
        401
    );
    assert_eq!(
        post(
            &gw,
            CHAT,
            &[("Authorization", "Bearer old-key-123")],
            &small()
        )
        .status(),
        200
    );
    assert_eq!(
        post(&gw, CHAT, &[("x-api-key", "old-key-123")], &small()).status(),
        200
    );
    let r = post(&gw, CHAT, &[], &small());
    assert_eq!(r.json()["error"]["type"], "unauthorized");

    // A stream authorised with the old key is in flight across the rotation.
    let mut stream = Conn::open(gw.addr);
    let body =
        json!({"model": "m", "stream": true, "messages": [{"role": "user", "content": "x"}]});
    stream.send(
        "POST",
        CHAT,
        &[
            ("Content-Type", "application/json"),
            ("Authorization", "Bearer old-key-123"),
            ("x-sim-gate", "rot"),
        ],
        body.to_string().as_bytes(),
        Upload::Length,
    );
    assert_eq!(stream.read_head().status, 200);
    stream.read_chunk().unwrap().unwrap();

    std::fs::write(&keys, "new-key-456:bob\n").unwrap();
    gw.reload();
    assert_eq!(
        post(
            &gw,
            CHAT,
            &[("Authorization", "Bearer old-key-123")],
            &small()
        )
        .status(),
        401
    );
    assert_eq!(
        post(
            &gw,
            CHAT,
            &[("Authorization", "Bearer new-key-456")],
            &small()
        )
        .status(),
        200
    );

    cluster.engines[0].open_gate("rot");
    let mut rest = Vec::new();
    while let Some(c) = stream.read_chunk().expect("stream survives rotation") {
        rest.extend_from_slice(&c);
    }
    assert!(String::from_utf8_lossy(&rest).contains("[DONE]"));
    // Owners, never keys, in metrics.
    let metrics = http::get(gw.admin, "/metrics").text();
    assert!(metrics.contains("owner=\"bob\""));
    assert!(!metrics.contains("new-key-456") && !gw.log().contains("new-key-456"));
    // Read-only endpoints need no key.
    assert_eq!(http::get(gw.addr, "/chat/_route_state").status(), 200);
    assert_eq!(http::get(gw.admin, "/healthz").status(), 200);
}

#[test]
fn missing_and_unreadable_key_files_are_told_apart_and_fail_open() {
    let cluster = engines(1);
    let dir = tempfile::tempdir().unwrap();
    let route = route_yaml(&ports(&cluster), "");
    let meta = |gw: &Gateway| http::get(gw.addr, "/chat/_health_status").json()["_meta"].clone();

    // Control: a configured key file rejects a request without a key.
    let good = dir.path().join("good");
    std::fs::write(&good, "k1:alice,k2:bob").unwrap();
    let gw = keyed(&good, &[("chat", route.clone())]);
    assert_eq!(post(&gw, CHAT, &[], &small()).status(), 401);
    let m = meta(&gw);
    assert_eq!(
        (
            m["key_file_status"].as_str(),
            m["api_keys_configured"].as_bool()
        ),
        (Some("ok"), Some(true))
    );
    assert_eq!(gw.metric("llm_gateway_api_keys_configured", &[]), 1.0);
    drop(gw);

    let missing = dir.path().join("nope");
    let gw = keyed(&missing, &[("chat", route.clone())]);
    assert_eq!(
        post(&gw, CHAT, &[], &small()).status(),
        200,
        "missing file fails open"
    );
    let m = meta(&gw);
    assert_eq!(m["key_file_status"], "missing");
    assert_eq!(m["api_keys_configured"], false);
    assert_eq!(m["route_auth_enabled"], false);
    assert_eq!(gw.metric("llm_gateway_api_keys_configured", &[]), 0.0);
    assert!(
        gw.log().contains("authentication is OFF"),
        "fail-open is logged"
    );
    drop(gw);

    // A directory where the file should be: present but unreadable.
    let unreadable = dir.path().join("adir");
    std::fs::create_dir(&unreadable).unwrap();
    let gw = keyed(&unreadable, &[("chat", route)]);
    assert_eq!(
        post(&gw, CHAT, &[], &small()).status(),
        200,
        "unreadable file fails open"
    );
    assert_eq!(meta(&gw)["key_file_status"], "unreadable");
}

#[test]
fn the_key_file_state_is_logged_when_it_changes_not_at_every_reload() {
    let engine = Canned::start("application/json", vec![b"{}".to_vec()], false);
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys");
    // Two routes read the shared file: still one line per change.
    let gw = keyed(
        &keys,
        &[
            ("chat", canned_route(engine.port(), "")),
            ("other", canned_route(engine.port(), "")),
        ],
    );
    let lines = |gw: &Gateway, what: &str| -> Vec<String> {
        gw.log()
            .lines()
            .filter(|l| l.contains(what))
            .map(str::to_owned)
            .collect()
    };
    let off = lines(&gw, "authentication is OFF");
    assert_eq!(off.len(), 1, "logged at start: {off:?}");
    assert!(off[0].contains("ERROR"), "a missing key file is an error");

    // 20 reloads, nothing changed: nothing more. Each line is written
    // before the reload that logs it is counted, so none is on its way.
    for _ in 0..20 {
        gw.reload();
    }
    assert_eq!(lines(&gw, "authentication is OFF").len(), 1, "{}", gw.log());
    assert!(lines(&gw, "keys loaded").is_empty());

    // Control: a reload that changes the state logs it, each time.
    std::fs::write(&keys, "k1:alice\n").unwrap();
    gw.reload();
    assert_eq!(lines(&gw, "1 keys loaded").len(), 1, "{}", gw.log());
    gw.reload();
    assert_eq!(lines(&gw, "1 keys loaded").len(), 1, "{}", gw.log());
    std::fs::remove_file(&keys).unwrap();
    gw.reload();
    assert_eq!(lines(&gw, "authentication is OFF").len(), 2, "{}", gw.log());
    assert_eq!(post(&gw, CHAT, &[], &small()).status(), 200, "fail-open");
}

#[test]
fn a_route_key_file_replaces_the_shared_one() {
    let cluster = engines(1);
    let dir = tempfile::tempdir().unwrap();
    let shared = dir.path().join("shared");
    let own = dir.path().join("own");
    std::fs::write(&shared, "shared-key:ops").unwrap();
    std::fs::write(&own, "route-key:team").unwrap();
    let p = ports(&cluster);
    let gw = keyed(
        &shared,
        &[
            ("chat", route_yaml(&p, "")),
            (
                "team",
                route_yaml(&p, &format!("api_keys_file: {}\n", own.display())),
            ),
        ],
    );
    let team = "/team/v1/chat/completions";
    assert_eq!(
        post(
            &gw,
            team,
            &[("Authorization", "Bearer route-key")],
            &small()
        )
        .status(),
        200
    );
    assert_eq!(
        post(
            &gw,
            team,
            &[("Authorization", "Bearer shared-key")],
            &small()
        )
        .status(),
        401
    );
    assert_eq!(
        post(
            &gw,
            CHAT,
            &[("Authorization", "Bearer shared-key")],
            &small()
        )
        .status(),
        200
    );
    assert_eq!(
        post(
            &gw,
            CHAT,
            &[("Authorization", "Bearer route-key")],
            &small()
        )
        .status(),
        401
    );
}

// ---------------------------------------------------------------- reject rules

/// (case, field, op, value, body that matches, body that does not).
fn rule_cases() -> Vec<(
    &'static str,
    &'static str,
    &'static str,
    Value,
    Value,
    Value,
)> {
    let msg = |s: &str| json!([{"role": "user", "content": s}]);
    vec![
        (
            "gt",
            "max_tokens",
            "gt",
            json!(100),
            json!({"max_tokens": 101}),
            json!({"max_tokens": 100}),
        ),
        (
            "ge",
            "max_tokens",
            "ge",
            json!(100),
            json!({"max_completion_tokens": 100}),
            json!({"max_tokens": 99}),
        ),
        (
            "lt",
            "messages_count",
            "lt",
            json!(1),
            json!({"messages": []}),
            json!({"messages": msg("a")}),
        ),
        (
            "le",
            "tools_count",
            "le",
            json!(0),
            json!({}),
            json!({"tools": [{"type": "function"}]}),
        ),
        (
            "eq",
            "model",
            "eq",
            json!("bad-model"),
            json!({"model": "bad-model"}),
            json!({"model": "good"}),
        ),
        (
            "ne",
            "stream",
            "ne",
            json!(false),
            json!({"stream": true}),
            json!({"stream": false}),
        ),
        (
            "in",
            "model",
            "in",
            json!(["x1", "x2"]),
            json!({"model": "x2"}),
            json!({"model": "x3"}),
        ),
        (
            "nin",
            "metadata.tier",
            "nin",
            json!(["gold", "silver"]),
            json!({"metadata": {"tier": "free"}}),
            json!({"metadata": {"tier": "gold"}}),
        ),
        (
            "match",
            "messages.0.content",
            "match",
            json!("^ignore (all|previous)"),
            json!({"messages": msg("ignore all rules")}),
            json!({"messages": msg("please ignore")}),
        ),
        (
            "contains",
            "messages.0.content",
            "contains",
            json!("forbidden"),
            json!({"messages": msg("a forbidden word")}),
            json!({"messages": msg("fine")}),
        ),
        (
            "prefix",
            "user",
            "prefix",
            json!("bot-"),
            json!({"user": "bot-7"}),
            json!({"user": "human-bot-7"}),
        ),
        (
            "exists",
            "metadata.debug",
            "exists",
            Value::Null,
            json!({"metadata": {"debug": 1}}),
            json!({"metadata": {}}),
        ),
        (
            "absent",
            "metadata.team",
            "absent",
            Value::Null,
            json!({"metadata": {}}),
            json!({"metadata": {"team": "a"}}),
        ),
        (
            "bytes",
            "input_bytes",
            "gt",
            json!(3000),
            json!({"pad": "p".repeat(3000)}),
            json!({"pad": "p"}),
        ),
        (
            "chars",
            "input_chars",
            "gt",
            json!(50),
            json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "é".repeat(51)}]}]}),
            json!({"messages": [{"role": "user", "content": "é".repeat(50)}]}),
        ),
    ]
}

fn rules_route(port: u16) -> String {
    let mut rules: Vec<Value> = rule_cases()
        .into_iter()
        .map(|(case, field, op, value, _, _)| {
            let mut cond = json!({"field": field, "op": op});
            if !value.is_null() {
                cond["value"] = value;
            }
            json!({"name": format!("r_{case}"), "message": format!("rule {case}"),
                   "when": {"all": [{"field": "metadata.case", "op": "eq", "value": case}, cond]}})
        })
        .collect();
    // Nesting: any of (all of two things) or a third.
    rules.push(json!({"name": "r_nested", "status": 400, "message": "nested",
        "when": {"all": [{"field": "metadata.case", "op": "eq", "value": "nested"},
                         {"any": [{"all": [{"field": "model", "op": "prefix", "value": "n-"}, {"field": "stream", "op": "eq", "value": true}]},
                                  {"field": "user", "op": "eq", "value": "nested-user"}]}]}}));
    // Invalid: dropped at load, the others keep working.
    rules.insert(
        0,
        json!({"name": "r_broken", "when": {"field": "model", "op": "resembles", "value": "x"}}),
    );
    rules.insert(
        1,
        json!({"name": "r_bad_regex", "when": {"field": "model", "op": "match", "value": "("}}),
    );
    // YAML is a superset of JSON.
    format!(
        "peers:\n  - {{name: e0, host: 127.0.0.1, port: {port}}}\nreject_rules: {}\n",
        serde_json::to_string(&rules).unwrap()
    )
}

fn with_case(case: &str, patch: &Value) -> Value {
    let mut body =
        json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "metadata": {}});
    for (k, v) in patch.as_object().unwrap() {
        body[k] = v.clone();
    }
    body["metadata"]["case"] = json!(case);
    body
}

#[test]
fn every_operator_and_field_end_to_end() {
    let cluster = engines(1);
    let gw = Gateway::start(&[("chat", rules_route(cluster.engines[0].port()))]);
    for (case, _, _, _, hit, miss) in rule_cases() {
        let r = post(&gw, CHAT, &[], &with_case(case, &hit));
        assert_eq!(r.status(), 429, "{case} should match: {}", r.text());
        let e = &r.json()["error"];
        assert_eq!(e["type"], "rejected_by_rule");
        assert_eq!(e["rule"], format!("r_{case}"));
        assert_eq!(e["route"], "chat");
        assert_eq!(e["message"], format!("rule {case}"));
        let r = post(&gw, CHAT, &[], &with_case(case, &miss));
        assert_eq!(r.status(), 200, "{case} must not match: {}", r.text());
    }
    // all/any nesting, with a custom status.
    let nested = |patch: Value| post(&gw, CHAT, &[], &with_case("nested", &patch)).status();
    assert_eq!(nested(json!({"model": "n-1", "stream": true})), 400);
    assert_eq!(nested(json!({"user": "nested-user"})), 400);
    assert_eq!(nested(json!({"model": "n-1", "stream": false})), 200);
    // The status endpoint: the two invalid rules were dropped, hits counted.
    let status = http::get(gw.addr, "/chat/_reject_rules_status").json();
    let rules = status["rules"].as_array().unwrap();
    assert_eq!(rules.len(), rule_cases().len() + 1);
    assert!(rules
        .iter()
        .all(|r| r["name"] != "r_broken" && r["name"] != "r_bad_regex"));
    let hits = |name: &str| {
        rules.iter().find(|r| r["name"] == name).unwrap()["hits"]
            .as_u64()
            .unwrap()
    };
    assert_eq!(hits("r_gt"), 1);
    assert_eq!(hits("r_nested"), 2);
    assert!(rules[0]["when"].is_object());
    assert!(gw.log().contains("r_broken") && gw.log().contains("reject rule dropped"));
    assert_eq!(
        gw.metric("llm_gateway_rejected_by_rule_total", &["rule=\"r_gt\""]),
        1.0
    );
}

#[test]
fn toggles_answer_only_loopback_and_survive_reload() {
    let cluster = engines(1);
    let port = cluster.engines[0].port();
    let gw = Gateway::start(&[("chat", rules_route(port))]);
    let hit = with_case("gt", &json!({"max_tokens": 500}));
    assert_eq!(post(&gw, CHAT, &[], &hit).status(), 429);

    let toggle = |from: Ipv4Addr, path: &str, headers: &[(&str, &str)]| {
        let mut c = Conn::open_from(IpAddr::V4(from), gw.addr);
        c.request("POST", path, headers, b"")
    };
    let off = "/chat/_reject_rules_toggle?on=0";
    // Another source address is refused, whatever the headers claim.
    for spoof in [
        ("X-Forwarded-For", "127.0.0.1"),
        ("X-Real-IP", "127.0.0.1"),
        ("Forwarded", "for=127.0.0.1"),
    ] {
        let r = toggle(Ipv4Addr::new(127, 0, 0, 2), off, &[spoof]);
        assert_eq!(r.status(), 403, "{spoof:?}");
        assert_eq!(r.json()["error"]["type"], "forbidden");
    }
    assert_eq!(
        post(&gw, CHAT, &[], &hit).status(),
        429,
        "refused toggle changed nothing"
    );
    // Control: the same call from 127.0.0.1 works.
    let r = toggle(Ipv4Addr::LOCALHOST, off, &[]);
    assert_eq!(r.status(), 200, "{}", r.text());
    assert_eq!(post(&gw, CHAT, &[], &hit).status(), 200);
    let status = http::get(gw.addr, "/chat/_reject_rules_status").json();
    assert_eq!(status["enabled"]["on"], false);
    assert_eq!(status["enabled"]["source"], "runtime");

    // Survives a reload (the route file changed).
    gw.write_route(
        "chat",
        &format!("{}routed_headers: true\n", rules_route(port)),
    );
    gw.reload();
    assert_eq!(
        post(&gw, CHAT, &[], &hit).status(),
        200,
        "override survived reload"
    );
    // reset=1 returns to the configured value.
    assert_eq!(
        toggle(
            Ipv4Addr::LOCALHOST,
            "/chat/_reject_rules_toggle?reset=1",
            &[]
        )
        .status(),
        200
    );
    assert_eq!(post(&gw, CHAT, &[], &hit).status(), 429);
    let status = http::get(gw.addr, "/chat/_reject_rules_status").json();
    assert_eq!(status["enabled"]["source"], "config");
    // GET is not a toggle.
    assert_eq!(http::get(gw.addr, off).status(), 405);
}

// ---------------------------------------------------------------- post-processing

fn sse_parts(events: &[&str], cuts: &[usize]) -> Vec<Vec<u8>> {
    let all: Vec<u8> = events.concat().into_bytes();
    let mut parts = Vec::new();
    let mut last = 0;
    for &c in cuts {
        parts.push(all[last..c].to_vec());
        last = c;
    }
    parts.push(all[last..].to_vec());
    parts
}

const VLLM_FRAME: &str = "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"system_fingerprint\":null,\"choices\":[{\"index\":0,\"delta\":{\"reasoning\":\"think\",\"content\":\"hi\"},\"logprobs\":null,\"stop_reason\":null,\"finish_reason\":null}]}\n\n";
const PLAIN_FRAME: &str = "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"},\"finish_reason\":null}]}\n\n";
const USAGE_FRAME: &str = "data: {\"id\":\"c1\",\"choices\":[],\"usage\":{\"prompt_tokens\":11,\"completion_tokens\":2,\"prompt_tokens_details\":{\"cached_tokens\":8}},\"actual_usage\":{\"prompt_tokens\":11}}\n\n";
const DONE: &str = "data: [DONE]\n\n";

fn stream_through(gw: &Gateway, route: &str) -> String {
    let body =
        json!({"model": "m", "stream": true, "messages": [{"role": "user", "content": "x"}]});
    let r = post(gw, &format!("/{route}/v1/chat/completions"), &[], &body);
    assert_eq!(r.status(), 200);
    r.text()
}

#[test]
fn vllm_format_on_sse_with_frames_split_across_chunks() {
    let events = [VLLM_FRAME, VLLM_FRAME, USAGE_FRAME, DONE];
    // Cut inside the first frame's JSON, inside the second frame's "\n\n", and inside the usage frame.
    let cuts = [40, VLLM_FRAME.len() * 2 - 1, VLLM_FRAME.len() * 2 + 30];
    let engine = Canned::start("text/event-stream", sse_parts(&events, &cuts), true);
    let gw = Gateway::start(&[
        (
            "fmt",
            canned_route(engine.port(), "postprocess: vllm_format\n"),
        ),
        ("raw", canned_route(engine.port(), "")),
    ]);
    let out = stream_through(&gw, "fmt");
    for gone in [
        "system_fingerprint",
        "\"logprobs\"",
        "stop_reason",
        "\"reasoning\"",
        "actual_usage",
    ] {
        assert!(!out.contains(gone), "{gone} still in {out}");
    }
    assert_eq!(out.matches("\"reasoning_content\":\"think\"").count(), 2);
    assert!(out.ends_with(DONE), "{out}");
    // Control: the route without a handler passes the engine's bytes exactly.
    assert_eq!(stream_through(&gw, "raw"), events.concat());
    // The gateway still counted the engine's usage on the rewritten route.
    wait_for("usage counted", DEADLINE, || {
        (gw.metric("llm_gateway_cached_prompt_tokens_total", &["route=\"fmt\""]) == 8.0)
            .then_some(())
    });
}

#[test]
fn nothing_to_change_is_byte_identical_and_broken_frames_fail_open() {
    let broken =
        "data: {\"id\":\"c1\",\"choices\":[{\"delta\":{\"content\":\"a\"}}],\"actual_usage\":\n\n";
    let events = [PLAIN_FRAME, broken, PLAIN_FRAME, DONE];
    let cuts = [10, PLAIN_FRAME.len() + 5];
    let engine = Canned::start("text/event-stream", sse_parts(&events, &cuts), true);
    let gw = Gateway::start(&[(
        "s",
        canned_route(engine.port(), "postprocess: strip_actual_usage\n"),
    )]);
    assert_eq!(
        stream_through(&gw, "s"),
        events.concat(),
        "unchanged frames and a broken one pass as sent"
    );
}

#[test]
fn json_bodies_rewritten_and_large_ones_pass_unchanged() {
    let body = br#"{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi","refusal":null,"reasoning":"r"},"logprobs":null,"finish_reason":"stop","stop_reason":null}],"usage":{"prompt_tokens":5,"completion_tokens":1},"service_tier":null,"kv_transfer_params":null}"#.to_vec();
    let engine = Canned::start(
        "application/json",
        vec![body[..50].to_vec(), body[50..].to_vec()],
        false,
    );
    let gw = Gateway::start(&[(
        "j",
        canned_route(engine.port(), "postprocess: vllm_format\n"),
    )]);
    let r = post(&gw, "/j/v1/chat/completions", &[], &small());
    assert_eq!(r.status(), 200);
    assert!(
        r.header("content-length").is_none(),
        "rewritten responses drop Content-Length"
    );
    let v = r.json();
    assert_eq!(v["choices"][0]["message"]["reasoning_content"], "r");
    for gone in [
        "refusal",
        "logprobs",
        "stop_reason",
        "service_tier",
        "kv_transfer_params",
        "reasoning\"",
    ] {
        assert!(!r.text().contains(gone), "{gone}: {}", r.text());
    }
    // Key order of what remains is the engine's.
    assert!(r
        .text()
        .starts_with("{\"id\":\"x\",\"object\":\"chat.completion\",\"choices\""));

    // A 9 MiB body passes through unchanged (past the 8 MiB hold limit).
    let mut big = br#"{"actual_usage":{"x":1},"pad":""#.to_vec();
    big.extend(std::iter::repeat_n(b'z', 9 << 20));
    big.extend_from_slice(b"\"}");
    let engine = Canned::start(
        "application/json",
        big.chunks(1 << 20).map(<[u8]>::to_vec).collect(),
        true,
    );
    let gw2 = Gateway::start(&[(
        "big",
        canned_route(engine.port(), "postprocess: strip_actual_usage\n"),
    )]);
    let r = post(&gw2, "/big/v1/chat/completions", &[], &small());
    assert_eq!(r.status(), 200);
    assert!(r.body == big, "over 8 MiB: byte-identical pass-through");
    // Control: a small body with the same field is rewritten.
    let small_body = br#"{"actual_usage":{"x":1},"pad":"z"}"#.to_vec();
    let engine = Canned::start("application/json", vec![small_body], false);
    let gw3 = Gateway::start(&[(
        "s",
        canned_route(engine.port(), "postprocess: strip_actual_usage\n"),
    )]);
    assert_eq!(
        post(&gw3, "/s/v1/chat/completions", &[], &small()).text(),
        r#"{"pad":"z"}"#
    );
}

#[test]
fn postprocess_toggle_turns_the_handler_off() {
    let engine = Canned::start(
        "text/event-stream",
        vec![VLLM_FRAME.as_bytes().to_vec(), DONE.as_bytes().to_vec()],
        true,
    );
    let gw = Gateway::start(&[(
        "fmt",
        canned_route(engine.port(), "postprocess: vllm_format\n"),
    )]);
    assert!(!stream_through(&gw, "fmt").contains("system_fingerprint"));
    let r = http::request(gw.addr, "POST", "/fmt/_postprocess_toggle?on=0", &[], b"");
    assert_eq!(r.status(), 200);
    assert_eq!(stream_through(&gw, "fmt"), format!("{VLLM_FRAME}{DONE}"));
}

// ---------------------------------------------------------------- include_usage

#[test]
fn injected_usage_reaches_the_counters_but_not_the_client() {
    let cluster = engines(1);
    let gw = Gateway::start(&[(
        "chat",
        route_yaml(&ports(&cluster), "include_usage: true\n"),
    )]);
    // Odd spacing and key order the engine must receive untouched.
    let raw = br#"{ "model" : "m",  "stream":true, "messages":[{"role":"user","content":"caf\u00e9 \"q\""}] ,"max_tokens":3}"#;
    let mut conn = Conn::open(gw.addr);
    conn.send(
        "POST",
        CHAT,
        &[("Content-Type", "application/json")],
        raw,
        Upload::Length,
    );
    let resp = conn.read_response();
    assert_eq!(resp.status(), 200);
    let text = resp.text();
    assert!(text.contains("[DONE]"));
    assert!(
        !text.contains("\"usage\""),
        "client did not ask for usage: {text}"
    );
    // The engine got the original bytes plus exactly the inserted member.
    let got = cluster.engines[0]
        .stats
        .recorded
        .lock()
        .last()
        .unwrap()
        .body
        .clone();
    let inserted = br#""stream_options":{"include_usage":true},"#;
    let mut expected = raw[..1].to_vec();
    expected.extend_from_slice(inserted);
    expected.extend_from_slice(&raw[1..]);
    assert_eq!(
        String::from_utf8_lossy(&got),
        String::from_utf8_lossy(&expected)
    );
    wait_for("completion tokens counted", DEADLINE, || {
        (gw.metric("llm_gateway_completion_tokens_total", &["route=\"chat\""]) == 3.0).then_some(())
    });

    // Control: a client that asked for usage sees it.
    let asked = json!({"model": "m", "stream": true, "stream_options": {"include_usage": true}, "max_tokens": 2,
                       "messages": [{"role": "user", "content": "y"}]});
    assert!(post(&gw, CHAT, &[], &asked).text().contains("\"usage\""));
    // Toggled off: the engine gets the client's bytes exactly.
    assert_eq!(
        http::request(
            gw.addr,
            "POST",
            "/chat/_include_usage_toggle?on=0",
            &[],
            b""
        )
        .status(),
        200
    );
    let mut conn = Conn::open(gw.addr);
    conn.send(
        "POST",
        CHAT,
        &[("Content-Type", "application/json")],
        raw,
        Upload::Length,
    );
    assert_eq!(conn.read_response().status(), 200);
    assert_eq!(
        cluster.engines[0]
            .stats
            .recorded
            .lock()
            .last()
            .unwrap()
            .body,
        raw.to_vec()
    );
    assert_eq!(cluster.engines[0].stats.requests.load(Ordering::Relaxed), 3);
}

#[test]
fn strip_actual_usage_on_split_sse_and_untouched_json() {
    // The usage frame carries actual_usage and is cut in the middle.
    let events = [PLAIN_FRAME, USAGE_FRAME, DONE];
    let cuts = [PLAIN_FRAME.len() + 25, PLAIN_FRAME.len() + 60];
    let sse = Canned::start("text/event-stream", sse_parts(&events, &cuts), true);
    // A JSON body with nothing for the handler to change.
    let json_body = br#"{"id":"x", "usage" : {"prompt_tokens":5},"choices":[]}"#.to_vec();
    let json = Canned::start(
        "application/json",
        vec![json_body[..9].to_vec(), json_body[9..].to_vec()],
        true,
    );
    let gw = Gateway::start(&[
        (
            "s",
            canned_route(sse.port(), "postprocess: strip_actual_usage\n"),
        ),
        (
            "j",
            canned_route(json.port(), "postprocess: strip_actual_usage\n"),
        ),
    ]);
    let out = stream_through(&gw, "s");
    assert!(!out.contains("actual_usage"), "{out}");
    assert!(
        out.contains("\"cached_tokens\":8"),
        "usage itself stays: {out}"
    );
    assert!(out.starts_with(PLAIN_FRAME) && out.ends_with(DONE), "{out}");
    let r = post(&gw, "/j/v1/chat/completions", &[], &small());
    assert_eq!(r.status(), 200);
    assert!(
        r.body == json_body,
        "nothing to change: byte-identical, spacing included"
    );
}

#[test]
fn gateway_answers_carry_routed_headers_so_a_client_can_tell_them_from_the_engine() {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys");
    std::fs::write(&keys, "k1:team\n").unwrap();
    let cluster = engines(1);
    let route = route_yaml(
        &ports(&cluster),
        "max_body_size: 1k\nreject_rules:\n  - {name: busy, status: 429, when: {field: model, op: eq, value: busy}}\n",
    );
    let gw = keyed(&keys, &[("chat", route)]);
    let auth = [("authorization", "Bearer k1"), ("x-session-id", "tell-me")];
    let mode = |r: &http::Response| r.header("x-routed-mode").map(str::to_string);

    // Control: an engine's answer says where placement put it.
    let ok = post(&gw, "/chat/v1/chat/completions", &auth, &small());
    assert_eq!(ok.status(), 200);
    assert_eq!(mode(&ok).as_deref(), Some("new"));

    let refused = post(
        &gw,
        "/chat/v1/chat/completions",
        &auth,
        &json!({"model": "busy", "messages": []}),
    );
    assert_eq!(refused.status(), 429);
    assert_eq!(mode(&refused).as_deref(), Some("local"));
    assert_eq!(
        refused.header("x-routed-session"),
        ok.header("x-routed-session")
    );
    assert!(refused.header("x-routed-session").is_some());

    let unauthorized = post(&gw, "/chat/v1/chat/completions", &[], &small());
    assert_eq!(unauthorized.status(), 401);
    assert_eq!(mode(&unauthorized).as_deref(), Some("local"));

    let big = json!({"model": "m", "messages": [{"role": "user", "content": "x".repeat(2000)}]});
    let too_large = post(&gw, "/chat/v1/chat/completions", &auth, &big);
    assert_eq!(too_large.status(), 413);
    assert_eq!(mode(&too_large).as_deref(), Some("local"));
}

#[test]
fn the_gateway_key_is_not_forwarded_unless_the_route_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys");
    std::fs::write(&keys, "client-key-1:team\n").unwrap();
    let engine_key = dir.path().join("engine-key");
    std::fs::write(&engine_key, "engine-secret\n").unwrap();
    let cluster = engines(3);
    let p = ports(&cluster);
    let gw = keyed(
        &keys,
        &[
            ("strip", route_yaml(&p[0..1], "")),
            ("fwd", route_yaml(&p[1..2], "forward_client_key: true\n")),
            (
                "own",
                route_yaml(
                    &p[2..3],
                    &format!("engine_api_key_file: {}\n", engine_key.display()),
                ),
            ),
        ],
    );
    let last_headers = |engine: usize| {
        let recorded = cluster.engines[engine].stats.recorded.lock().clone();
        let last = recorded
            .last()
            .cloned()
            .expect("the engine got the request");
        (
            last.header("authorization").map(str::to_string),
            last.header("x-api-key").map(str::to_string),
        )
    };
    for (route, engine) in [("strip", 0), ("fwd", 1), ("own", 2)] {
        for header in ["authorization", "x-api-key"] {
            let value = if header == "authorization" {
                "Bearer client-key-1"
            } else {
                "client-key-1"
            };
            let r = post(
                &gw,
                &format!("/{route}/v1/chat/completions"),
                &[(header, value)],
                &small(),
            );
            assert_eq!(r.status(), 200, "{route} {header}");
            let (auth, api_key) = last_headers(engine);
            match route {
                "strip" => assert_eq!((auth, api_key), (None, None), "{header}"),
                // Control: the same request does carry the key when asked to.
                "fwd" if header == "authorization" => {
                    assert_eq!(auth.as_deref(), Some("Bearer client-key-1"))
                }
                "fwd" => assert_eq!(api_key.as_deref(), Some("client-key-1")),
                _ => {
                    assert_eq!(auth.as_deref(), Some("Bearer engine-secret"), "{header}");
                    assert_eq!(api_key, None, "{header}");
                }
            }
        }
    }
}

/// Reject rules read an Anthropic Messages body and a Responses body as
/// they read a chat body; control: the same body on an endpoint the
/// gateway passes through unread is not judged.
#[test]
fn rules_judge_messages_and_responses_bodies() {
    let cluster = engines(1);
    let port = cluster.engines[0].port();
    let route = format!(
        "peers:\n  - {{name: e0, host: 127.0.0.1, port: {port}}}\nreject_rules: {}\n",
        json!([{"name": "r_blocked", "when": {"field": "metadata.user_id", "op": "eq", "value": "blocked"}}])
    );
    let gw = Gateway::start(&[("chat", route)]);
    let body = json!({"model": "m", "max_tokens": 4, "metadata": {"user_id": "blocked"},
                      "messages": [{"role": "user", "content": "hi"}]});
    for path in ["/chat/v1/messages", "/chat/v1/responses"] {
        let r = post(&gw, path, &[], &body);
        assert_eq!(r.status(), 429, "{path}: {}", r.text());
        assert_eq!(r.json()["error"]["rule"], "r_blocked");
    }
    let r = post(&gw, "/chat/v1/embeddings", &[], &body);
    assert_ne!(r.status(), 429, "passed through unread: {}", r.text());
    let mut allowed = body.clone();
    allowed["metadata"]["user_id"] = json!("fine");
    let r = post(&gw, "/chat/v1/messages", &[], &allowed);
    assert_ne!(r.status(), 429, "{}", r.text());
}

// The pieces of one conversation for `computed_fields_mean_the_same_on_every_endpoint`.
const SYSTEM: &str = "You are terse.";
const ASK: &str = "Read the log and say what broke.";
const ARGS: &str = r#"{"path":"app.log"}"#;
const ANSWER: &str = "The disk is full.";
const FOLLOW_UP: &str = "Why?";
const CHARS_LIMIT: usize = 200;
const TOKENS_LIMIT: u64 = 64;
const MESSAGES_LIMIT: u64 = 5;

/// One conversation in the shape of the API at `path`: a system prompt, a
/// question, a tool call and its result (4 messages in chat form), then
/// `later_turns` of the assistant's answer and one more question. The
/// tool's result is filled so that the conversation has `chars` characters;
/// the cap on generated tokens is `cap`. Completions gets the same text as
/// one prompt (it has no turns).
fn conversation(path: &str, chars: usize, cap: u64, later_turns: usize) -> Value {
    let later_texts = &[ANSWER, FOLLOW_UP][..later_turns];
    let fixed: usize = [SYSTEM, ASK, ARGS]
        .iter()
        .chain(later_texts)
        .map(|piece| piece.chars().count())
        .sum();
    // Two-byte characters: the limit is on characters, not bytes.
    let result = "é".repeat(chars - fixed);
    let later = |answer: Value, follow_up: Value| {
        let mut turns = vec![answer, follow_up];
        turns.truncate(later_turns);
        turns
    };
    let call = json!({"id": "call_1", "type": "function",
                      "function": {"name": "read", "arguments": ARGS}});
    match path {
        "/v1/chat/completions" => {
            let mut messages = vec![
                json!({"role": "system", "content": SYSTEM}),
                json!({"role": "user", "content": [{"type": "text", "text": ASK}]}),
                json!({"role": "assistant", "content": null, "tool_calls": [call]}),
                json!({"role": "tool", "tool_call_id": "call_1", "content": result}),
            ];
            messages.extend(later(
                json!({"role": "assistant", "content": ANSWER}),
                json!({"role": "user", "content": FOLLOW_UP}),
            ));
            json!({"model": "m", "max_completion_tokens": cap, "messages": messages})
        }
        "/v1/completions" => {
            let prompt = format!("{SYSTEM}{ASK}{ARGS}{result}{}", later_texts.concat());
            json!({"model": "m", "max_tokens": cap, "prompt": prompt})
        }
        "/v1/messages" => {
            let args: Value = serde_json::from_str(ARGS).unwrap();
            let mut messages = vec![
                json!({"role": "user", "content": ASK}),
                json!({"role": "assistant", "content": [
                    {"type": "tool_use", "id": "call_1", "name": "read", "input": args}]}),
                json!({"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "call_1",
                     "content": [{"type": "text", "text": result}]}]}),
            ];
            messages.extend(later(
                json!({"role": "assistant", "content": [{"type": "text", "text": ANSWER}]}),
                json!({"role": "user", "content": FOLLOW_UP}),
            ));
            json!({"model": "m", "max_tokens": cap,
                   "system": [{"type": "text", "text": SYSTEM}], "messages": messages})
        }
        "/v1/responses" => {
            let mut input = vec![
                json!({"role": "user", "content": [{"type": "input_text", "text": ASK}]}),
                json!({"type": "function_call", "call_id": "call_1", "name": "read",
                       "arguments": ARGS}),
                json!({"type": "function_call_output", "call_id": "call_1", "output": result}),
            ];
            input.extend(later(
                json!({"type": "message", "role": "assistant",
                       "content": [{"type": "output_text", "text": ANSWER}]}),
                json!({"role": "user", "content": FOLLOW_UP}),
            ));
            json!({"model": "m", "max_output_tokens": cap, "instructions": SYSTEM,
                   "input": input})
        }
        other => panic!("no shape for {other}"),
    }
}

/// Rules on `input_chars`, `max_tokens` and `messages_count` judge one
/// conversation alike on the four endpoints, though each keeps its system
/// prompt, tool result and token cap in members of its own. Over a limit
/// each endpoint refuses it with that limit's rule; the control, the same
/// conversation at each limit exactly, is forwarded on each. (Completions
/// has no turns: a prompt is one message, so only the two other limits.)
#[test]
fn computed_fields_mean_the_same_on_every_endpoint() {
    let cluster = engines(1);
    let port = cluster.engines[0].port();
    let rules = json!([
        {"name": "too-long", "status": 413,
         "when": {"field": "input_chars", "op": "gt", "value": CHARS_LIMIT}},
        {"name": "too-much", "when": {"field": "max_tokens", "op": "gt", "value": TOKENS_LIMIT}},
        {"name": "too-many", "when": {"field": "messages_count", "op": "gt", "value": MESSAGES_LIMIT}},
    ]);
    let route =
        format!("peers:\n  - {{name: e0, host: 127.0.0.1, port: {port}}}\nreject_rules: {rules}\n");
    let gw = Gateway::start(&[("chat", route)]);
    let send = |path: &str, body: &Value| post(&gw, &format!("/chat{path}"), &[], body);
    let refused = |path: &str, body: &Value, rule: &str, status: u16| {
        let r = send(path, body);
        assert_eq!(r.status(), status, "{path} over {rule}: {}", r.text());
        let error = &r.json()["error"];
        assert_eq!(error["type"], "rejected_by_rule", "{path}");
        assert_eq!(error["rule"], rule, "{path}");
    };
    let paths = [
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/messages",
        "/v1/responses",
    ];
    for path in paths {
        // 5 messages, 200 characters, 64 tokens.
        let at_limits = conversation(path, CHARS_LIMIT, TOKENS_LIMIT, 1);
        let r = send(path, &at_limits);
        assert_eq!(
            r.status(),
            200,
            "{path} at the limits is forwarded: {}",
            r.text()
        );

        let long = conversation(path, CHARS_LIMIT + 1, TOKENS_LIMIT, 1);
        refused(path, &long, "too-long", 413);
        let greedy = conversation(path, CHARS_LIMIT, TOKENS_LIMIT + 1, 1);
        refused(path, &greedy, "too-much", 429);
        if path != "/v1/completions" {
            let chatty = conversation(path, CHARS_LIMIT, TOKENS_LIMIT, 2);
            refused(path, &chatty, "too-many", 429);
        }
    }
    let status = http::get(gw.addr, "/chat/_reject_rules_status").json();
    let hits: Vec<u64> = status["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|rule| rule["hits"].as_u64().unwrap())
        .collect();
    assert_eq!(hits, [4, 4, 3], "each endpoint refused by each rule once");
}

/// The example Secret's key, applied unchanged, opens nothing: a key file
/// holding only the documented placeholder refuses every request, the
/// placeholder itself included, and says why (an empty file would instead
/// turn authentication off). The control: the same file with a real key
/// beside the placeholder lets that key in, and still not the placeholder.
#[test]
fn the_documented_placeholder_key_is_never_accepted() {
    let cluster = engines(1);
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys");
    std::fs::write(&keys, "sk-replace-me:team-a\n").unwrap();
    let gw = keyed(&keys, &[("chat", route_yaml(&ports(&cluster), ""))]);
    let bearer = |key: &str| format!("Bearer {key}");
    for presented in [None, Some("sk-replace-me"), Some("anything")] {
        let auth = presented.map(bearer);
        let headers: Vec<(&str, &str)> =
            auth.iter().map(|a| ("authorization", a.as_str())).collect();
        let r = post(&gw, CHAT, &headers, &small());
        assert_eq!(r.status(), 401, "{presented:?}: {}", r.text());
        assert!(r.text().contains("placeholder"), "{}", r.text());
    }
    assert!(
        gw.log()
            .contains("holds only the documented placeholder key"),
        "{}",
        gw.log()
    );

    std::fs::write(&keys, "sk-replace-me:team-a\nreal-key-456:team-b\n").unwrap();
    gw.reload();
    let ok = post(
        &gw,
        CHAT,
        &[("authorization", &bearer("real-key-456"))],
        &small(),
    );
    assert_eq!(ok.status(), 200, "{}", ok.text());
    let r = post(
        &gw,
        CHAT,
        &[("authorization", &bearer("sk-replace-me"))],
        &small(),
    );
    assert_eq!(r.status(), 401, "{}", r.text());
}
