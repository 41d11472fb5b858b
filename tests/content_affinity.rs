//! Conversations without a session id, recognised by their content: the
//! turns of one conversation stay on the engine holding its cache, an
//! explicit id wins, a shared system prompt pins nobody, and the switch
//! turns it off.

mod common;

use common::http;
use common::*;
use serde_json::{json, Value};
use std::collections::{HashMap, HashSet};

const CHAT: &str = "/chat/v1/chat/completions";
const COMPLETIONS: &str = "/chat/v1/completions";

fn long_text(tag: &str, tokens: usize) -> String {
    (0..tokens).map(|i| format!("{tag}{i:04} ")).collect()
}

fn chat(messages: &[(String, String)]) -> Value {
    let messages: Vec<Value> = messages
        .iter()
        .map(|(role, content)| json!({"role": role, "content": content}))
        .collect();
    json!({"model": "sim-model", "max_tokens": 4, "messages": messages})
}

fn cached(r: &http::Response) -> u64 {
    r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or(0)
}

/// Four turns of a conversation that names no session: one session,
/// recognised by content, on one engine, its cache hits growing.
#[test]
fn a_conversation_without_an_id_stays_on_its_engine() {
    let cluster = engines(3);
    let gw = Gateway::start(&[("chat", route_yaml(&ports(&cluster), ""))]);
    let mut history = vec![
        ("system".to_string(), long_text("sys", 300)),
        ("user".to_string(), long_text("task", 200)),
    ];
    let (mut peers, mut sessions, mut hits) = (HashSet::new(), HashSet::new(), Vec::new());
    for turn in 0..4 {
        let r = http::post_json(gw.addr, CHAT, &[], &chat(&history));
        assert_eq!(r.status(), 200, "{}", r.text());
        assert_eq!(r.header("x-routed-source"), Some("content"));
        peers.insert(r.header("x-routed-peer").unwrap_or("?").to_string());
        sessions.insert(r.header("x-routed-session").unwrap_or("?").to_string());
        hits.push(cached(&r));
        history.push(("assistant".into(), format!("answer {turn}")));
        history.push(("user".into(), long_text(&format!("t{turn}-"), 100)));
    }
    assert_eq!(sessions.len(), 1, "one conversation: {sessions:?}");
    assert_eq!(peers.len(), 1, "one engine: {peers:?}");
    assert!(
        hits.windows(2).all(|w| w[1] > w[0]),
        "cache hits grow: {hits:?}"
    );
}

/// Control of the test above: with content recognition off the same
/// requests carry no session at all.
#[test]
fn content_off_leaves_requests_without_a_session() {
    let cluster = engines(2);
    let extra = "balancing:\n  session_affinity:\n    content: off\n";
    let gw = Gateway::start(&[("chat", route_yaml(&ports(&cluster), extra))]);
    let body = chat(&[("user".into(), "hello".into())]);
    let r = http::post_json(gw.addr, CHAT, &[], &body);
    assert_eq!(r.status(), 200);
    assert_eq!(r.header("x-routed-session"), None);
    assert_eq!(r.header("x-routed-source"), None);
}

#[test]
fn an_explicit_id_wins_over_content() {
    let cluster = engines(2);
    let gw = Gateway::start(&[("chat", route_yaml(&ports(&cluster), ""))]);
    let mut body = chat(&[("user".into(), "hello".into())]);
    let r = http::post_json(gw.addr, CHAT, &[("x-session-id", "mine")], &body);
    assert_eq!(r.header("x-routed-source"), Some("header:x-session-id"));
    body["prompt_cache_key"] = json!("key-1");
    let r = http::post_json(gw.addr, CHAT, &[], &body);
    assert_eq!(r.header("x-routed-source"), Some("body:prompt_cache_key"));
    // The same body without either: content.
    body.as_object_mut().map(|o| o.remove("prompt_cache_key"));
    let r = http::post_json(gw.addr, CHAT, &[], &body);
    assert_eq!(r.header("x-routed-source"), Some("content"));
}

/// A completion prompt that grows turn by turn is one conversation.
#[test]
fn a_growing_completion_prompt_is_one_conversation() {
    let cluster = engines(3);
    let gw = Gateway::start(&[("chat", route_yaml(&ports(&cluster), ""))]);
    let mut prompt = long_text("doc", 3000);
    let mut sessions = HashSet::new();
    let mut peers = HashSet::new();
    for turn in 0..3 {
        let body = json!({"model": "sim-model", "max_tokens": 4, "prompt": prompt});
        let r = http::post_json(gw.addr, COMPLETIONS, &[], &body);
        assert_eq!(r.status(), 200, "{}", r.text());
        assert_eq!(r.header("x-routed-source"), Some("content"));
        sessions.insert(r.header("x-routed-session").unwrap_or("?").to_string());
        peers.insert(r.header("x-routed-peer").unwrap_or("?").to_string());
        prompt.push_str(&long_text(&format!("more{turn}-"), 300));
    }
    assert_eq!(
        (sessions.len(), peers.len()),
        (1, 1),
        "{sessions:?} {peers:?}"
    );
}

/// Twenty conversations that share a long system prompt and differ from
/// their first user message: twenty sessions, spread over the engines.
#[test]
fn a_shared_system_prompt_spreads_by_load() {
    let cluster = engines(3);
    let gw = Gateway::start(&[("chat", route_yaml(&ports(&cluster), ""))]);
    let system = long_text("shared-sys", 400);
    let mut per_peer: HashMap<String, usize> = HashMap::new();
    let mut sessions = HashSet::new();
    let mut conns: Vec<http::Conn> = Vec::new();
    for i in 0..20 {
        // Held open, so each new conversation sees the others' load.
        let gate = format!("g{i}");
        let mut conn = http::Conn::open(gw.addr);
        let body = json!({"model": "sim-model", "stream": true, "max_tokens": 4,
            "messages": [{"role": "system", "content": system},
                         {"role": "user", "content": format!("question {i}")}]});
        conn.send(
            "POST",
            CHAT,
            &[("content-type", "application/json"), ("x-sim-gate", &gate)],
            body.to_string().as_bytes(),
            http::Upload::Length,
        );
        let head = conn.read_head();
        assert_eq!(head.status, 200);
        assert_eq!(head.header("x-routed-source"), Some("content"));
        sessions.insert(head.header("x-routed-session").unwrap_or("?").to_string());
        *per_peer
            .entry(head.header("x-routed-peer").unwrap_or("?").to_string())
            .or_default() += 1;
        conns.push(conn);
    }
    for i in 0..20 {
        for engine in &cluster.engines {
            engine.open_gate(&format!("g{i}"));
        }
    }
    assert_eq!(sessions.len(), 20, "every conversation its own session");
    assert_eq!(per_peer.len(), 3, "spread: {per_peer:?}");
    assert!(
        per_peer.values().all(|&n| n <= 9),
        "no engine holds most of them: {per_peer:?}"
    );
}

/// `/_route_inspect` says how a body's conversation was found, and
/// remembers nothing.
#[test]
fn route_inspect_tells_content_matches_without_remembering() {
    let cluster = engines(2);
    let gw = Gateway::start(&[("chat", route_yaml(&ports(&cluster), ""))]);
    let turn1 = chat(&[
        ("system".into(), "be brief".into()),
        ("user".into(), "hi".into()),
    ]);
    let inspect = |body: &Value| {
        let r = http::post_json(gw.addr, "/chat/_route_inspect", &[], body);
        assert_eq!(r.status(), 200, "{}", r.text());
        r.json()
    };
    let before = inspect(&turn1);
    assert_eq!(before["session"]["source"], "content");
    assert_eq!(before["content"]["how"], "new");
    // Inspecting twice remembered nothing: still new.
    assert_eq!(inspect(&turn1)["content"]["how"], "new");
    let r = http::post_json(gw.addr, CHAT, &[], &turn1);
    assert_eq!(r.status(), 200);
    let turn2 = chat(&[
        ("system".into(), "be brief".into()),
        ("user".into(), "hi".into()),
        ("assistant".into(), "hello".into()),
        ("user".into(), "bye".into()),
    ]);
    let after = inspect(&turn2);
    assert_eq!(after["content"]["how"], "continued");
    assert_eq!(after["content"]["matched_blocks"], 2);
    assert_eq!(after["content"]["blocks"], 4);
    assert_eq!(after["session"]["hash"], before["session"]["hash"]);
}

const MESSAGES: &str = "/chat/v1/messages";
const RESPONSES: &str = "/chat/v1/responses";

/// Reads a response's routing headers, whatever its body (an SSE stream is
/// read to its end).
fn routed(r: &http::Response) -> (String, String, String) {
    let h = |name| r.header(name).unwrap_or("-").to_string();
    (
        h("x-routed-source"),
        h("x-routed-session"),
        h("x-routed-peer"),
    )
}

/// Anthropic Messages, stream and not, with no id: one conversation by its
/// content; with Claude Code's `metadata.user_id`: that id.
#[test]
fn messages_conversations_by_content_and_by_user_id() {
    let cluster = engines(3);
    let gw = Gateway::start(&[("chat", route_yaml(&ports(&cluster), ""))]);
    let system = long_text("anthropic-sys", 300);
    let mut messages = vec![
        json!({"role": "user", "content": [{"type": "text", "text": long_text("ask", 100), "cache_control": {"type": "ephemeral"}}]}),
    ];
    let mut seen = Vec::new();
    for turn in 0..4 {
        let body = json!({"model": "sim-model", "max_tokens": 8, "stream": turn % 2 == 1,
                          "system": [{"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}],
                          "messages": messages});
        let r = http::post_json(gw.addr, MESSAGES, &[], &body);
        assert_eq!(r.status(), 200, "{}", r.text());
        seen.push(routed(&r));
        // The breakpoint moves to the newest message, as Claude Code does.
        for m in messages.iter_mut() {
            if let Some(blocks) = m["content"].as_array_mut() {
                for b in blocks {
                    b.as_object_mut().map(|o| o.remove("cache_control"));
                }
            }
        }
        messages.push(json!({"role": "assistant", "content": [{"type": "text", "text": format!("reply {turn}")}]}));
        messages.push(json!({"role": "user", "content": [{"type": "text", "text": long_text(&format!("more{turn}-"), 50), "cache_control": {"type": "ephemeral"}}]}));
    }
    assert!(seen.iter().all(|s| s.0 == "content"), "{seen:?}");
    assert!(
        seen.iter().all(|s| s.1 == seen[0].1 && s.2 == seen[0].2),
        "{seen:?}"
    );
    let body = json!({"model": "sim-model", "max_tokens": 8, "metadata": {"user_id": "user_abc_account_1_session_2"},
                      "messages": [{"role": "user", "content": "hi"}]});
    let r = http::post_json(gw.addr, MESSAGES, &[], &body);
    assert_eq!(r.status(), 200, "{}", r.text());
    assert_eq!(routed(&r).0, "body:metadata.user_id");
}

/// The Responses API's stateful chain: each turn names the one before by
/// `previous_response_id` and sends only its new input; all three land on
/// the engine that holds the conversation, as one session.
#[test]
fn previous_response_id_chains_three_turns_onto_one_engine() {
    let cluster = engines(3);
    let gw = Gateway::start(&[("chat", route_yaml(&ports(&cluster), ""))]);
    let mut previous: Option<String> = None;
    let mut seen = Vec::new();
    for turn in 0..3 {
        let mut body = json!({"model": "sim-model", "max_output_tokens": 8, "stream": turn == 1,
                              "input": [{"type": "message", "role": "user", "content": long_text(&format!("step{turn}-"), 200)}]});
        if let Some(id) = &previous {
            body["previous_response_id"] = json!(id);
        }
        let r = http::post_json(gw.addr, RESPONSES, &[], &body);
        assert_eq!(r.status(), 200, "{}", r.text());
        seen.push(routed(&r));
        previous = Some(response_id(&r));
    }
    assert_eq!(seen[0].0, "content");
    assert_eq!(seen[1].0, "body:previous_response_id");
    assert_eq!(seen[2].0, "body:previous_response_id");
    assert!(
        seen.iter().all(|s| s.1 == seen[0].1 && s.2 == seen[0].2),
        "{seen:?}"
    );
}

/// The id of a Responses answer, JSON or SSE (`response.created`).
fn response_id(r: &http::Response) -> String {
    let text = r.text();
    if let Ok(v) = serde_json::from_str::<Value>(&text) {
        return v["id"].as_str().expect("an id").to_string();
    }
    text.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .find_map(|v| v["response"]["id"].as_str().map(str::to_string))
        .unwrap_or_else(|| panic!("no response id in {text}"))
}

/// Conversations one after another, each starting with `system(i)` and a
/// question of its own: the engine of each, and the tokens cached for it.
fn one_after_another(
    gw: &Gateway,
    n: usize,
    system: impl Fn(usize) -> String,
) -> Vec<(String, u64)> {
    (0..n)
        .map(|i| {
            let body = chat(&[
                ("system".into(), system(i)),
                (
                    "user".into(),
                    format!("question {i}: what does section {i} say?"),
                ),
            ]);
            let r = http::post_json(gw.addr, CHAT, &[], &body);
            assert_eq!(r.status(), 200, "{}", r.text());
            (
                r.header("x-routed-peer").unwrap_or("?").to_string(),
                cached(&r),
            )
        })
        .collect()
}

/// A template (a long prefix many conversations start with) is priced, not
/// ignored: with the engines idle, each new conversation goes where the
/// template is cached and prefills only its question.
#[test]
fn a_templates_newcomers_go_where_it_is_cached_while_that_costs_no_wait() {
    let cluster = engines(3);
    let gw = Gateway::start(&[("chat", route_yaml(&ports(&cluster), ""))]);
    let docs = long_text("tenant-docs", 1_500);
    let placed = one_after_another(&gw, 12, |_| docs.clone());
    let engines: HashSet<&String> = placed.iter().map(|(peer, _)| peer).collect();
    assert_eq!(engines.len(), 1, "where the template is: {placed:?}");
    // From the second on, the template is cached for each.
    assert!(
        placed[1..].iter().all(|(_, cached)| *cached >= 1_500),
        "{placed:?}"
    );
    // Control: conversations that share nothing spread by what the engines
    // hold (away from the one the template's conversations are on).
    let own = one_after_another(&gw, 12, |i| long_text(&format!("own{i}-"), 1_500));
    let engines: HashSet<&String> = own.iter().map(|(peer, _)| peer).collect();
    assert!(engines.len() >= 2, "{own:?}");
    assert!(own.iter().all(|(_, cached)| *cached < 1_500), "{own:?}");
}
