use super::*;
use crate::placement::{PeerId, PeerLoad, SessionTable, TableConfig};
use bytes::Bytes;
use serde_json::{json, Value};

const MIN: u64 = 60_000;

fn index(fanout: u16) -> ContentIndex {
    ContentIndex::new(
        (1, 2),
        ContentConfig {
            template_fanout: fanout,
            idle_ms: 30 * MIN,
            max_nodes: 100_000,
        },
    )
}

fn blocks(body: &Value) -> Vec<Block> {
    blocks_of(&[Bytes::from(body.to_string())])
}

fn chat(messages: &[(&str, &str)]) -> Value {
    let messages: Vec<Value> = messages
        .iter()
        .map(|(role, content)| json!({"role": role, "content": content}))
        .collect();
    json!({"model": "m", "messages": messages, "stream": true})
}

const SYS: &str = "You are a coding agent. Follow the rules of the repository.";

fn see(ix: &ContentIndex, body: &Value, now: u64) -> Recognised {
    ix.recognise(&blocks(body), now).expect("a conversation")
}

#[test]
fn a_later_turn_continues_its_conversation() {
    let ix = index(4);
    let t1 = see(&ix, &chat(&[("system", SYS), ("user", "fix the bug")]), 0);
    assert_eq!(t1.how, How::New);
    let t2 = see(
        &ix,
        &chat(&[
            ("system", SYS),
            ("user", "fix the bug"),
            ("assistant", "done"),
            ("user", "test it"),
        ]),
        1000,
    );
    assert_eq!(
        (t2.session, t2.how, t2.matched),
        (t1.session, How::Continued, 2)
    );
    let t3 = see(
        &ix,
        &chat(&[
            ("system", SYS),
            ("user", "fix the bug"),
            ("assistant", "done"),
            ("user", "test it"),
            ("assistant", "green"),
            ("user", "commit"),
        ]),
        2000,
    );
    assert_eq!((t3.session, t3.how), (t1.session, How::Continued));
    // The same request again (a retry) is the same conversation.
    let again = see(
        &ix,
        &chat(&[("system", SYS), ("user", "fix the bug")]),
        3000,
    );
    assert_eq!(again.session, t1.session);
}

#[test]
fn a_fork_gets_its_own_session_and_the_parent_goes_on() {
    let ix = index(4);
    let history = [("system", SYS), ("user", "refactor the parser")];
    let parent = see(&ix, &chat(&history), 0);
    let mut sub = history.to_vec();
    sub.push(("user", "sub-agent: read lexer.rs"));
    let fork = see(&ix, &chat(&sub), 10);
    assert_eq!(
        fork.how,
        How::Forked {
            parent: parent.session
        }
    );
    assert_ne!(fork.session, parent.session);
    // The parent's own next turn is still the parent.
    let mut next = history.to_vec();
    next.extend([("assistant", "spawned two agents"), ("user", "results: ok")]);
    let p2 = see(&ix, &chat(&next), 20);
    assert_eq!((p2.session, p2.how), (parent.session, How::Continued));
    // And the fork's next turn is the fork.
    sub.extend([("assistant", "lexer read"), ("user", "now the parser")]);
    assert_eq!(see(&ix, &chat(&sub), 30).session, fork.session);
}

#[test]
fn an_edited_message_is_a_new_session_from_that_block_on() {
    let ix = index(4);
    let turns = [
        ("system", SYS),
        ("user", "step one"),
        ("assistant", "ok one"),
        ("user", "step two"),
        ("assistant", "ok two"),
        ("user", "step three"),
    ];
    let first = see(&ix, &chat(&turns[..2]), 0);
    see(&ix, &chat(&turns[..4]), 1);
    see(&ix, &chat(&turns), 2);
    let mut edited = turns.to_vec();
    edited[3].1 = "step TWO, done differently";
    let e = see(&ix, &chat(&edited), 3);
    assert_eq!(e.matched, 3, "the history up to the edit is known");
    assert_eq!(
        e.how,
        How::Forked {
            parent: first.session
        }
    );
    assert_ne!(e.session, first.session);
}

/// 50 conversations share a system prompt and differ from their first
/// user message. Forks are placed next to their parent (adopted onto its
/// peer), the rest by load: with the template rule the 50 spread; without
/// it they all hang off the first and collapse onto its engine.
#[test]
fn a_shared_system_prompt_does_not_pin_every_conversation() {
    fn engines_used(fanout: u16) -> (usize, usize) {
        let ix = index(fanout);
        let table = SessionTable::new(TableConfig::default());
        let peers: Vec<PeerLoad> = (0..4).map(|i| PeerLoad::idle(i as PeerId, 64)).collect();
        let mut used = std::collections::HashSet::new();
        let mut forks = 0;
        for i in 0..50 {
            let question = format!("question number {i}: why does test {i} fail?");
            let r = see(&ix, &chat(&[("system", SYS), ("user", &question)]), i);
            let peer = match r.how {
                How::Forked { parent } => {
                    forks += 1;
                    let (peer, _) = table.binding_of(parent, i).expect("parent bound");
                    table.adopt(r.session, peer, None, i);
                    peer
                }
                _ => table.place(r.session, &peers, i).expect("placed").peer,
            };
            used.insert(peer);
        }
        (used.len(), forks)
    }
    let (spread, forks) = engines_used(4);
    assert_eq!(spread, 4, "placed by load");
    assert!(
        forks <= 3,
        "only until the prompt counts as a template: {forks}"
    );
    let (collapsed, forks) = engines_used(0);
    assert_eq!(
        (collapsed, forks),
        (1, 49),
        "control: without the rule they collapse"
    );
}

#[test]
fn a_growing_prompt_continues_through_its_full_chunks() {
    let ix = index(4);
    let p1 = "x".repeat(blocks::CHUNK_BYTES * 2 + 100);
    let t1 = see(&ix, &json!({"model": "m", "prompt": p1}), 0);
    let p2 = format!("{p1} and then more text appended by the next turn");
    let t2 = see(&ix, &json!({"model": "m", "prompt": p2}), 1);
    assert_eq!((t2.session, t2.how), (t1.session, How::Continued));
}

#[test]
fn the_index_forgets_after_idle_and_keeps_its_cap() {
    let ix = index(4);
    let t1 = see(&ix, &chat(&[("system", SYS), ("user", "hello")]), 0);
    let later = chat(&[
        ("system", SYS),
        ("user", "hello"),
        ("assistant", "hi"),
        ("user", "bye"),
    ]);
    ix.sweep(31 * MIN);
    assert!(ix.is_empty());
    let t2 = see(&ix, &later, 31 * MIN);
    assert_eq!(t2.how, How::New, "forgotten");
    // Control: within idle_timeout it is remembered.
    let ix = index(4);
    let t1b = see(&ix, &chat(&[("system", SYS), ("user", "hello")]), 0);
    assert_eq!(t1b.session, t1.session, "the same key, the same session");
    ix.sweep(29 * MIN);
    assert_eq!(see(&ix, &later, 29 * MIN).session, t1.session);

    let small = ContentIndex::new(
        (1, 2),
        ContentConfig {
            template_fanout: 4,
            idle_ms: 30 * MIN,
            max_nodes: 10,
        },
    );
    for i in 0..100 {
        see(
            &small,
            &chat(&[("system", SYS), ("user", &format!("q{i}"))]),
            i,
        );
        assert!(small.len().0 <= 10);
    }
}

#[test]
fn anthropic_cache_control_moving_does_not_break_the_chain() {
    let ix = index(4);
    let t1 = json!({"model": "m", "system": [{"type": "text", "text": SYS, "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}]}]});
    let t2 = json!({"model": "m", "system": [{"type": "text", "text": SYS, "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]},
                     {"role": "assistant", "content": [{"type": "text", "text": "hello"}]},
                     {"role": "user", "content": [{"type": "text", "text": "more", "cache_control": {"type": "ephemeral"}}]}]});
    let a = see(&ix, &t1, 0);
    let b = see(&ix, &t2, 1);
    assert_eq!((b.session, b.how), (a.session, How::Continued));
}

#[test]
fn responses_items_chain_like_messages() {
    let ix = index(4);
    let t1 = json!({"model": "m", "instructions": SYS, "input": [{"type": "message", "role": "user", "content": "list files"}]});
    let t2 = json!({"model": "m", "instructions": SYS, "input": [
        {"type": "message", "role": "user", "content": "list files"},
        {"type": "function_call", "call_id": "c1", "name": "ls", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "a.rs b.rs"}]});
    let a = see(&ix, &t1, 0);
    assert_eq!(see(&ix, &t2, 1).session, a.session);
}

#[test]
fn a_body_cut_into_pieces_gives_the_same_blocks() {
    let body = chat(&[
        ("system", &SYS.repeat(200)),
        ("user", "hello"),
        ("assistant", "hi"),
    ])
    .to_string();
    let whole = blocks_of(&[Bytes::from(body.clone())]);
    assert!(whole.len() > 4);
    let bytes = Bytes::from(body);
    for cut in [1, 100, 4000, 9000, bytes.len() - 3] {
        let pieces = [bytes.slice(..cut), bytes.slice(cut..)];
        assert_eq!(blocks_of(&pieces), whole, "cut at {cut}");
    }
}

/// Two replicas with one key: what one writes (the tip, the stem), the
/// other adopts, and it then recognises the next turn as the first did.
#[test]
fn a_second_replica_continues_what_the_first_wrote() {
    let (a, b) = (index(4), index(4));
    let t1 = chat(&[("system", SYS), ("user", "hello")]);
    let t2 = chat(&[
        ("system", SYS),
        ("user", "hello"),
        ("assistant", "hi"),
        ("user", "more"),
    ]);
    let first = see(&a, &t1, 0);
    // Control: without the shared write, b takes turn 2 for a new one.
    let probes = b
        .missing_near(&blocks(&t2), 1)
        .expect("b knows nothing near");
    assert_eq!(b.peek(&blocks(&t2), 1).unwrap().how, How::New);
    let (key, depth) = first.tip;
    assert!(probes.contains(&(key, depth)), "b asks for a's tip");
    b.adopt(key, depth, first.session, false, 1);
    assert!(b.missing_near(&blocks(&t2), 1).is_none());
    let second = see(&b, &t2, 1);
    assert_eq!(
        (second.session, second.how),
        (first.session, How::Continued)
    );
}

#[test]
fn peek_remembers_nothing() {
    let ix = index(4);
    let t1 = chat(&[("system", SYS), ("user", "hello")]);
    assert_eq!(ix.peek(&blocks(&t1), 0).unwrap().how, How::New);
    assert!(ix.is_empty());
    // Control: recognise does remember.
    see(&ix, &t1, 0);
    assert!(!ix.is_empty());
}

/// Sub-agents handed the parent's history up to its tool call (the reply
/// that spawned them included) are forks; the parent, which goes on with
/// the tool's results, keeps its session, whoever comes first.
#[test]
fn sub_agents_after_a_tool_call_are_forks_and_the_parent_goes_on() {
    let ix = index(4);
    let call = json!({"role": "assistant", "content": null, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "spawn_agents", "arguments": "{}"}}]});
    let base = vec![
        json!({"role": "system", "content": SYS}),
        json!({"role": "user", "content": "fix all the tests"}),
    ];
    let body = |msgs: &[Value]| json!({"model": "m", "messages": msgs});
    let parent = see(&ix, &body(&base), 0);
    let mut spawned = base.clone();
    spawned.push(call.clone());
    for agent in 0..3 {
        let mut sub = spawned.clone();
        sub.push(json!({"role": "user", "content": format!("sub-task {agent}")}));
        let r = see(&ix, &body(&sub), 1 + agent);
        assert_eq!(
            r.how,
            How::Forked {
                parent: parent.session
            },
            "agent {agent}"
        );
    }
    let mut resume = spawned.clone();
    resume.push(json!({"role": "tool", "tool_call_id": "call_1", "content": "all three done"}));
    let r = see(&ix, &body(&resume), 10);
    assert_eq!((r.session, r.how), (parent.session, How::Continued));
    // Control: a reply without a tool call, then a user message, is the
    // conversation going on (an ordinary chat).
    let ix = index(4);
    let first = see(&ix, &body(&base), 0);
    let mut chat_next = base.clone();
    chat_next.push(json!({"role": "assistant", "content": "done"}));
    chat_next.push(json!({"role": "user", "content": "thanks, now docs"}));
    assert_eq!(see(&ix, &body(&chat_next), 1).session, first.session);
}

/// Anthropic's shapes of the same: a `tool_use` block in the reply, a
/// `tool_result` block in the next user message.
#[test]
fn anthropic_tool_use_and_tool_result_blocks_are_read() {
    let ix = index(4);
    let base =
        vec![json!({"role": "user", "content": [{"type": "text", "text": "run the tests"}]})];
    let body = |msgs: &[Value]| json!({"model": "m", "system": SYS, "messages": msgs});
    let parent = see(&ix, &body(&base), 0);
    let mut spawned = base.clone();
    spawned.push(json!({"role": "assistant", "content": [
        {"type": "text", "text": "spawning"},
        {"type": "tool_use", "id": "toolu_1", "name": "Task", "input": {"n": 2}}]}));
    let mut sub = spawned.clone();
    sub.push(json!({"role": "user", "content": [{"type": "text", "text": "you are sub-agent 1"}]}));
    assert_eq!(
        see(&ix, &body(&sub), 1).how,
        How::Forked {
            parent: parent.session
        }
    );
    let mut resume = spawned.clone();
    resume.push(json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"}]}));
    let r = see(&ix, &body(&resume), 2);
    assert_eq!((r.session, r.how), (parent.session, How::Continued));
}

/// The same with a long last message (its chunks make a stem): a
/// sub-agent passes through the whole request, so the blocks after it
/// decide, not the stem.
#[test]
fn a_long_last_message_does_not_let_sub_agents_take_the_parent() {
    let ix = index(4);
    let long = "tool output line\n".repeat(2000);
    let base = vec![
        json!({"role": "system", "content": SYS}),
        json!({"role": "user", "content": long}),
    ];
    let body = |msgs: &[Value]| json!({"model": "m", "messages": msgs});
    let parent = see(&ix, &body(&base), 0);
    let mut spawned = base.clone();
    spawned.push(json!({"role": "assistant", "content": "go", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "spawn_agents", "arguments": "{}"}}]}));
    for agent in 0..2 {
        let mut sub = spawned.clone();
        sub.push(json!({"role": "user", "content": format!("sub-task {agent}")}));
        assert_eq!(
            see(&ix, &body(&sub), 1 + agent).how,
            How::Forked {
                parent: parent.session
            }
        );
    }
    let mut resume = spawned.clone();
    resume.push(json!({"role": "tool", "tool_call_id": "call_1", "content": "done"}));
    assert_eq!(see(&ix, &body(&resume), 5).session, parent.session);
}

/// A full index makes room by forgetting what was used least recently:
/// a flood of one-off conversations does not cost a conversation that
/// is still going on its recognition. Control: the flood's oldest are
/// forgotten.
#[test]
fn a_full_index_forgets_the_least_recent_not_the_newest() {
    let ix = ContentIndex::new(
        (1, 2),
        ContentConfig {
            template_fanout: 4,
            idle_ms: 30 * MIN,
            max_nodes: 40,
        },
    );
    let flood = |i: u64| chat(&[("system", SYS), ("user", &format!("one-off question {i}"))]);
    let ours = chat(&[("system", "a different agent"), ("user", "keep going")]);
    let mine = see(&ix, &ours, 0);
    let mut next = vec![("system", "a different agent"), ("user", "keep going")];
    for i in 0..200u64 {
        see(&ix, &flood(i), 1000 + i * 1000);
        assert!(ix.len().0 <= 40);
        if i % 20 == 19 {
            // Our conversation goes on now and then.
            let reply = format!("reply {i}");
            let ask = format!("more {i}");
            next.push(("assistant", Box::leak(reply.into_boxed_str())));
            next.push(("user", Box::leak(ask.into_boxed_str())));
            let r = see(&ix, &chat(&next), 1000 + i * 1000 + 500);
            assert_eq!(
                (r.session, r.how),
                (mine.session, How::Continued),
                "turn at {i}"
            );
        }
    }
    assert_eq!(
        ix.peek(&blocks(&flood(0)), 201_000).unwrap().how,
        How::New,
        "the oldest forgotten"
    );
}

/// README states the index's memory: about 40 bytes a block and 72 a
/// conversation (an entry of the hash maps, at their 7/8 load). The
/// entries must stay that small for the figure to hold.
#[test]
fn entries_are_as_small_as_the_readme_says() {
    let (node, session) = super::index::entry_sizes();
    // A map entry also takes a control byte: below, not up to.
    assert!(node * 8 / 7 < 40, "a block's entry is {node} bytes");
    assert!(
        session * 8 / 7 < 80,
        "a conversation's entry is {session} bytes"
    );
}

/// The node of a system prompt alone, as the index keys it.
fn first_node(ix: &ContentIndex, system: &str) -> u64 {
    let chain = ContentIndex::chain(&blocks(&chat(&[("system", system)])));
    ix.keyed_for_tests(*chain.last().expect("a block"))
}

/// A newcomer of a template is a new conversation that names the template
/// (its node and its size), so placement can find the engines it was sent
/// to.
#[test]
fn a_templates_newcomer_names_the_template_and_where_it_was_sent() {
    let ix = index(2);
    let docs = "the tenant's documents ".repeat(2_000); // 46 KB: about 11.5k tokens
    let ask = |i: u64| chat(&[("system", &docs), ("user", &format!("question {i}"))]);
    let first = see(&ix, &ask(0), 0);
    assert_eq!((first.how, first.template), (How::New, None));
    let second = see(&ix, &ask(1), 1);
    assert!(
        matches!(second.how, How::Forked { .. }),
        "not yet a template"
    );
    // A fork already names the prefix it shares, so its engine is known
    // when the prefix turns template.
    assert_eq!(
        second.template.map(|t| t.node),
        Some(first_node(&ix, &docs))
    );
    let third = see(&ix, &ask(2), 2);
    assert_eq!(third.how, How::New);
    let template = third.template.expect("the prompt is a template now");
    assert_eq!(Some(template), second.template);
    // The system text and its role's few bytes, at four bytes a token.
    let tokens = docs.len() as u64 / 4;
    assert!(
        (tokens..=tokens + 4).contains(&template.tokens),
        "{template:?}"
    );
    // The engines it went to, most recent first; none before any.
    assert!(ix.holders(template.node).is_empty());
    ix.hold(template.node, 3, 100, 10);
    ix.hold(template.node, 1, 200, 20);
    ix.hold(template.node, 3, 300, 30);
    let held: Vec<(u32, u64)> = ix
        .holders(template.node)
        .iter()
        .map(|h| (h.peer, h.mark))
        .collect();
    assert_eq!(held, vec![(3, 300), (1, 200)]);
    // Forgotten with the rest of the index once idle.
    ix.sweep(30 + 31 * MIN);
    assert!(ix.holders(template.node).is_empty());
}
