//! Response post-processing: per-route handlers that hide backend quirks
//! from clients.
//!
//! Contract (the same as the OpenResty gateway's lua/postprocess.lua):
//! - a document with nothing to change goes out byte-identical; a changed
//!   one is re-encoded (key order kept via serde_json's `preserve_order`,
//!   escaping and number formatting may differ from the backend's);
//! - fail-open: anything that does not parse leaves the original bytes;
//! - a stream is never held: each complete SSE event leaves with the chunk
//!   that completed it, and only an event cut by a chunk boundary waits;
//! - OpenAI shapes only (chat, completions): an Anthropic Messages or
//!   OpenAI Responses answer passes through untouched whatever the route's
//!   handler (`pipeline` does not run one on it).

use serde_json::{Map, Value};

use super::scan::contains;
use super::sse::{data_field_value, event_data, split_line_terminator};

/// Largest non-stream body held for rewriting; bigger ones pass unchanged.
pub const MAX_HELD_JSON_BYTES: usize = 8 * 1024 * 1024;

/// Largest unfinished SSE event we wait for. A peer that never ends an
/// event (or a body that is not really SSE) would otherwise grow the buffer
/// without bound; past this the rest of the stream passes through as is.
pub const MAX_PENDING_EVENT_BYTES: usize = MAX_HELD_JSON_BYTES;

/// A route's response handler.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Handler {
    /// Removes the top-level `actual_usage` some SGLang builds add.
    StripActualUsage,
    /// Normalises vLLM's response shape to plain OpenAI.
    VllmFormat,
}

impl Handler {
    pub fn from_name(s: &str) -> Option<Handler> {
        match s {
            "strip_actual_usage" => Some(Handler::StripActualUsage),
            "vllm_format" => Some(Handler::VllmFormat),
            _ => None,
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Handler::StripActualUsage => "strip_actual_usage",
            Handler::VllmFormat => "vllm_format",
        }
    }

    /// Cheap byte test: can this document possibly need a change? Most
    /// frames of a stream are answered here without parsing. Member names
    /// can also be spelled with `\u` escapes, so those documents always go
    /// on to the real check.
    fn may_apply(self, data: &[u8]) -> bool {
        let found = |names: &[&str]| names.iter().any(|n| contains(data, n.as_bytes()));
        let applies = match self {
            Handler::StripActualUsage => found(&["actual_usage"]),
            Handler::VllmFormat => {
                found(DROP_IF_NULL)
                    || found(DROP_ALWAYS)
                    || found(&[REASONING_RENAME.0, CACHE_WRITE_RENAME.0])
            }
        };
        applies || contains(data, b"\\u")
    }
}

/// vLLM placeholders: noise when null, real data otherwise.
const DROP_IF_NULL: &[&str] = &[
    "prompt_token_ids",
    "prompt_logprobs",
    "logprobs",
    "token_ids",
    "refusal",
    "annotations",
];

/// Engine-internal fields that OpenAI clients never expect.
const DROP_ALWAYS: &[&str] = &[
    "stop_reason",
    "service_tier",
    "system_fingerprint",
    "kv_transfer_params",
    "ec_transfer_params",
    "actual_usage",
];

const REASONING_RENAME: (&str, &str) = ("reasoning", "reasoning_content");
const CACHE_WRITE_RENAME: (&str, &str) = ("created_cache_tokens", "cache_write_tokens");

/// Rewrites one JSON document (a whole body or one SSE frame's data).
/// `None` means nothing changed and the caller must send the original
/// bytes; that includes data that is not a JSON object (fail-open).
/// Whitespace around the document is kept.
pub fn rewrite_json(handler: Handler, data: &[u8]) -> Option<Vec<u8>> {
    if !handler.may_apply(data) {
        return None;
    }
    let mut doc: Value = serde_json::from_slice(data).ok()?;
    let top = doc.as_object_mut()?;
    let changed = match handler {
        Handler::StripActualUsage => top.shift_remove("actual_usage").is_some(),
        Handler::VllmFormat => vllm_format(top),
    };
    if !changed {
        return None;
    }
    let lead = data.iter().take_while(|b| is_json_ws(**b)).count();
    let trail = data[lead..]
        .iter()
        .rev()
        .take_while(|b| is_json_ws(**b))
        .count();
    let mut out = Vec::with_capacity(data.len());
    out.extend_from_slice(&data[..lead]);
    serde_json::to_writer(&mut out, &doc).ok()?;
    out.extend_from_slice(&data[data.len() - trail..]);
    Some(out)
}

fn is_json_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

/// Applies `vllm_format` where OpenAI/vLLM responses carry these fields:
/// the top level, each `choices[i]`, its `message`/`delta`, and `usage`.
fn vllm_format(top: &mut Map<String, Value>) -> bool {
    let mut changed = clean_object(top, true, None);
    if let Some(Value::Array(choices)) = top.get_mut("choices") {
        for choice in choices.iter_mut().filter_map(Value::as_object_mut) {
            changed |= clean_object(choice, true, None);
            for key in ["message", "delta"] {
                if let Some(Value::Object(m)) = choice.get_mut(key) {
                    changed |= clean_object(m, true, Some(REASONING_RENAME));
                }
            }
        }
    }
    if let Some(Value::Object(usage)) = top.get_mut("usage") {
        changed |= clean_object(usage, false, Some(CACHE_WRITE_RENAME));
        if let Some(Value::Object(details)) = usage.get_mut("prompt_tokens_details") {
            changed |= clean_object(details, false, Some(CACHE_WRITE_RENAME));
        }
    }
    changed
}

/// Drops the vLLM-only members (when `drop` is set) and renames
/// `rename.0` to `rename.1` in place. If both names exist the new one is
/// already what clients read, so the old one is just dropped. Member order
/// is kept, which is why a rename rebuilds the map instead of remove+insert.
fn clean_object(map: &mut Map<String, Value>, drop: bool, rename: Option<(&str, &str)>) -> bool {
    let dropped = |k: &str, v: &Value| {
        drop && (DROP_ALWAYS.contains(&k) || (v.is_null() && DROP_IF_NULL.contains(&k)))
    };
    let rename = rename.filter(|(from, _)| map.contains_key(*from));
    let needs_drop = map.iter().any(|(k, v)| dropped(k, v));
    if rename.is_none() && !needs_drop {
        return false;
    }
    match rename {
        None => map.retain(|k, v| !dropped(k, v)),
        Some((from, to)) => {
            let keep_new = map.contains_key(to);
            let old = std::mem::take(map);
            for (k, v) in old {
                if dropped(&k, &v) {
                    continue;
                }
                if k == from {
                    if !keep_new {
                        map.insert(to.to_owned(), v);
                    }
                } else {
                    map.insert(k, v);
                }
            }
        }
    }
    true
}

/// Rewrites one complete (or, at end of stream, unterminated) SSE event
/// into `out`. An event whose data the handler leaves alone — no data,
/// `[DONE]`, not JSON, nothing to change — is copied byte for byte.
/// A changed event keeps its other lines and its line endings; its data
/// line(s) become one `data:` line (re-encoded JSON has no raw newlines).
pub(super) fn write_event(handler: Handler, event: &[u8], out: &mut Vec<u8>) {
    let new_json = event_data(event).and_then(|data| {
        let trimmed = data.trim_ascii_start();
        if trimmed.first() == Some(&b'{') {
            rewrite_json(handler, trimmed)
        } else {
            None
        }
    });
    let Some(new_json) = new_json else {
        out.extend_from_slice(event);
        return;
    };
    let mut replaced = false;
    for line in event.split_inclusive(|&b| b == b'\n') {
        let (content, terminator) = split_line_terminator(line);
        if data_field_value(content).is_none() {
            out.extend_from_slice(line);
            continue;
        }
        if !replaced {
            replaced = true;
            let prefix: &[u8] = if content.starts_with(b"data: ") {
                b"data: "
            } else {
                b"data:"
            };
            out.extend_from_slice(prefix);
            out.extend_from_slice(new_json.trim_ascii());
            out.extend_from_slice(terminator);
        }
    }
}

/// Rewrites `event` (its exact bytes) with `handler`; `None` if unchanged.
pub fn rewrite_sse_event(handler: Handler, event: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(event.len());
    write_event(handler, event, &mut out);
    (out != event).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream::pipeline::{BodyKind, ResponsePipeline};
    use bytes::Bytes;
    use proptest::prelude::*;
    use serde_json::json;

    fn rewrite_str(h: Handler, s: &str) -> Option<String> {
        rewrite_json(h, s.as_bytes()).map(|b| String::from_utf8(b).unwrap())
    }

    /// Runs a whole body through the response pipeline the proxy runs, in
    /// the given chunks, then the final empty call.
    fn run(h: Handler, kind: BodyKind, chunks: &[&[u8]]) -> (Vec<u8>, Vec<Bytes>) {
        let mut rw = rewriter(h, kind);
        let mut outs: Vec<Bytes> = chunks.iter().map(|c| rw.push(c, false)).collect();
        outs.push(rw.push(&[], true));
        (outs.concat(), outs)
    }

    fn rewriter(h: Handler, kind: BodyKind) -> ResponsePipeline {
        ResponsePipeline::new(kind, Some(h), false)
    }

    #[test]
    fn handler_names_round_trip() {
        for h in [Handler::StripActualUsage, Handler::VllmFormat] {
            assert_eq!(Handler::from_name(h.name()), Some(h));
        }
        assert_eq!(Handler::from_name("nope"), None);
    }

    #[test]
    fn strip_actual_usage_top_level_only() {
        assert_eq!(
            rewrite_str(
                Handler::StripActualUsage,
                r#"{"id":"x","usage":{"prompt_tokens":1},"actual_usage":{"prompt_tokens":2},"z":1}"#
            )
            .as_deref(),
            Some(r#"{"id":"x","usage":{"prompt_tokens":1},"z":1}"#)
        );
        // Nested ones and look-alikes are left alone.
        assert_eq!(
            rewrite_str(
                Handler::StripActualUsage,
                r#"{"choices":[{"actual_usage":1}],"note":"actual_usage"}"#
            ),
            None
        );
        assert_eq!(
            rewrite_str(Handler::StripActualUsage, r#"{"id":"x"}"#),
            None
        );
    }

    #[test]
    fn vllm_format_full_response() {
        let body = json!({
            "id": "c1", "object": "chat.completion", "created": 1, "model": "m",
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "reasoning": "think", "content": "hi",
                            "refusal": null, "annotations": null, "tool_calls": []},
                "logprobs": null, "finish_reason": "stop", "stop_reason": null,
                "token_ids": null
            }],
            "service_tier": null, "system_fingerprint": null,
            "usage": {"prompt_tokens": 3, "created_cache_tokens": 1, "completion_tokens": 2,
                      "prompt_tokens_details": {"cached_tokens": 1, "created_cache_tokens": 0}},
            "prompt_logprobs": null, "prompt_token_ids": null,
            "kv_transfer_params": null, "actual_usage": {"prompt_tokens": 9}
        });
        let out = rewrite_json(Handler::VllmFormat, body.to_string().as_bytes()).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            json!({
                "id": "c1", "object": "chat.completion", "created": 1, "model": "m",
                "choices": [{
                    "index": 0,
                    "message": {"role": "assistant", "reasoning_content": "think",
                                "content": "hi", "tool_calls": []},
                    "finish_reason": "stop"
                }],
                "usage": {"prompt_tokens": 3, "cache_write_tokens": 1, "completion_tokens": 2,
                          "prompt_tokens_details": {"cached_tokens": 1, "cache_write_tokens": 0}}
            })
            .to_string()
        );
    }

    #[test]
    fn vllm_format_keeps_non_null_placeholders_and_existing_reasoning_content() {
        let out = rewrite_str(
            Handler::VllmFormat,
            r#"{"choices":[{"delta":{"reasoning":"a","reasoning_content":"b"},"logprobs":{"content":[]}}],"prompt_token_ids":[1,2]}"#,
        );
        assert_eq!(
            out.as_deref(),
            Some(
                r#"{"choices":[{"delta":{"reasoning_content":"b"},"logprobs":{"content":[]}}],"prompt_token_ids":[1,2]}"#
            )
        );
        // Already clean: byte-identical (None), despite pre-check hits.
        assert_eq!(
            rewrite_str(
                Handler::VllmFormat,
                r#"{"choices":[{"delta":{"reasoning_content":"x"},"logprobs":{"content":[]}}]}"#
            ),
            None
        );
    }

    #[test]
    fn escaped_member_names_are_seen() {
        assert_eq!(
            rewrite_str(
                Handler::StripActualUsage,
                r#"{"a":1,"actual\u005fusage":{}}"#
            )
            .as_deref(),
            Some(r#"{"a":1}"#)
        );
    }

    #[test]
    fn fail_open_and_non_objects() {
        for data in [
            "{\"actual_usage\":",
            "[DONE]",
            "[{\"actual_usage\":1}]",
            "",
            "null",
        ] {
            assert_eq!(rewrite_str(Handler::StripActualUsage, data), None, "{data}");
            assert_eq!(rewrite_str(Handler::VllmFormat, data), None, "{data}");
        }
    }

    #[test]
    fn surrounding_whitespace_kept() {
        assert_eq!(
            rewrite_str(
                Handler::StripActualUsage,
                " {\"actual_usage\":1, \"a\": 2}\n"
            )
            .as_deref(),
            Some(" {\"a\":2}\n")
        );
    }

    const SSE_IN: &str = concat!(
        "data: {\"id\":\"1\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n",
        ": keepalive\n\n",
        "data: {\"id\":\"1\",\"choices\":[{\"index\":0,\"delta\":{\"reasoning\":\"hm\"},\"logprobs\":null,\"finish_reason\":null,\"stop_reason\":null}]}\n\n",
        "data: {\"id\":\"1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"ok\"},\"finish_reason\":null}]}\n\n",
        "data: {\"id\":\"1\",\"choices\":[],\"usage\":{\"prompt_tokens\":3},\"actual_usage\":{\"prompt_tokens\":4}}\n\n",
        "data: [DONE]\n\n",
    );

    fn expected_sse(h: Handler, crlf: bool) -> String {
        let out = match h {
            Handler::VllmFormat => concat!(
                "data: {\"id\":\"1\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n",
                ": keepalive\n\n",
                "data: {\"id\":\"1\",\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":\"hm\"},\"finish_reason\":null}]}\n\n",
                "data: {\"id\":\"1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"ok\"},\"finish_reason\":null}]}\n\n",
                "data: {\"id\":\"1\",\"choices\":[],\"usage\":{\"prompt_tokens\":3}}\n\n",
                "data: [DONE]\n\n",
            ),
            Handler::StripActualUsage => concat!(
                "data: {\"id\":\"1\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n",
                ": keepalive\n\n",
                "data: {\"id\":\"1\",\"choices\":[{\"index\":0,\"delta\":{\"reasoning\":\"hm\"},\"logprobs\":null,\"finish_reason\":null,\"stop_reason\":null}]}\n\n",
                "data: {\"id\":\"1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"ok\"},\"finish_reason\":null}]}\n\n",
                "data: {\"id\":\"1\",\"choices\":[],\"usage\":{\"prompt_tokens\":3}}\n\n",
                "data: [DONE]\n\n",
            ),
        };
        if crlf {
            out.replace('\n', "\r\n")
        } else {
            out.to_string()
        }
    }

    #[test]
    fn sse_handlers_across_every_two_chunk_split() {
        for h in [Handler::StripActualUsage, Handler::VllmFormat] {
            for crlf in [false, true] {
                let input = if crlf {
                    SSE_IN.replace('\n', "\r\n")
                } else {
                    SSE_IN.to_string()
                };
                let input = input.as_bytes();
                let want = expected_sse(h, crlf);
                for i in 0..=input.len() {
                    let (out, _) = run(h, BodyKind::Sse, &[&input[..i], &input[i..]]);
                    assert_eq!(
                        String::from_utf8(out).unwrap(),
                        want,
                        "{h:?} crlf={crlf} at {i}"
                    );
                }
            }
        }
    }

    #[test]
    fn sse_events_leave_with_the_chunk_that_completes_them() {
        let mut rw = rewriter(Handler::StripActualUsage, BodyKind::Sse);
        let a = "data: {\"a\":1,\"actual_usage\":2}\n\n";
        let out = rw.push(format!("{a}data: {{\"b\"").as_bytes(), false);
        assert_eq!(&out[..], b"data: {\"a\":1}\n\n");
        assert_eq!(&rw.push(b":1}\n", false)[..], b"");
        assert_eq!(&rw.push(b"\n", false)[..], b"data: {\"b\":1}\n\n");
        assert_eq!(&rw.push(&[], true)[..], b"");
    }

    #[test]
    fn sse_event_structure_kept() {
        let ev =
            b"event: chunk\r\nid: 7\r\ndata:{\"actual_usage\":1,\r\ndata: \"x\":2}\r\n: c\r\n\r\n";
        assert_eq!(
            rewrite_sse_event(Handler::StripActualUsage, ev).as_deref(),
            Some(&b"event: chunk\r\nid: 7\r\ndata:{\"x\":2}\r\n: c\r\n\r\n"[..])
        );
    }

    #[test]
    fn sse_broken_frame_and_done_pass_unchanged() {
        let input =
            b"data: {\"actual_usage\":1,\n\ndata: [DONE]\n\ndata: not json actual_usage\n\n";
        for h in [Handler::StripActualUsage, Handler::VllmFormat] {
            let (out, _) = run(h, BodyKind::Sse, &[input]);
            assert_eq!(out, input);
        }
    }

    #[test]
    fn sse_unterminated_final_event_is_flushed() {
        let (out, _) = run(
            Handler::StripActualUsage,
            BodyKind::Sse,
            &[b"data: {\"a\":1}\n\ndata: {\"actual_usage\":1,\"b\":2}"],
        );
        assert_eq!(out, b"data: {\"a\":1}\n\ndata: {\"b\":2}");
        let (out, _) = run(Handler::StripActualUsage, BodyKind::Sse, &[b"data: [DO"]);
        assert_eq!(out, b"data: [DO");
    }

    #[test]
    fn sse_unchanged_is_byte_identical() {
        let input = SSE_IN.replace(",\"actual_usage\":{\"prompt_tokens\":4}", "");
        let input = input.as_bytes();
        for i in 0..=input.len() {
            let (out, _) = run(
                Handler::StripActualUsage,
                BodyKind::Sse,
                &[&input[..i], &input[i..]],
            );
            assert_eq!(out, input);
        }
    }

    #[test]
    fn sse_runaway_event_switches_to_passthrough() {
        let mut rw = rewriter(Handler::StripActualUsage, BodyKind::Sse);
        let big = vec![b'x'; MAX_PENDING_EVENT_BYTES / 2 + 1];
        assert!(rw.push(&big, false).is_empty());
        let out = rw.push(&big, false);
        assert_eq!(out.len(), big.len() * 2);
        let tail = b"\n\ndata: {\"actual_usage\":1}\n\n";
        assert_eq!(&rw.push(tail, false)[..], tail);
        assert!(rw.push(&[], true).is_empty());
    }

    #[test]
    fn json_body_rewritten_at_end_only() {
        let body = br#"{"id":"x","actual_usage":{"prompt_tokens":1},"choices":[]}"#;
        let (out, outs) = run(
            Handler::StripActualUsage,
            BodyKind::Json,
            &[&body[..10], &body[10..30], &body[30..]],
        );
        assert_eq!(out, br#"{"id":"x","choices":[]}"#);
        assert!(outs[..3].iter().all(Bytes::is_empty));
        // Data on the final call itself.
        let mut rw = rewriter(Handler::StripActualUsage, BodyKind::Json);
        assert_eq!(&rw.push(body, true)[..], br#"{"id":"x","choices":[]}"#);
    }

    #[test]
    fn json_unchanged_and_broken_are_byte_identical() {
        for body in [
            &br#"{"id":"x", "choices" : [ ] }"#[..],
            br#"{"id":"x","actual_usage":"#,
            b"",
        ] {
            for h in [Handler::StripActualUsage, Handler::VllmFormat] {
                for i in 0..=body.len() {
                    let (out, _) = run(h, BodyKind::Json, &[&body[..i], &body[i..]]);
                    assert_eq!(out, body);
                }
            }
        }
    }

    #[test]
    fn json_over_cap_passes_through_unchanged() {
        let mut body = br#"{"actual_usage":{"prompt_tokens":1},"pad":""#.to_vec();
        body.resize(9 * 1024 * 1024, b'a');
        body.extend_from_slice(b"\"}");
        let chunks: Vec<&[u8]> = body.chunks(64 * 1024).collect();
        let (out, outs) = run(Handler::StripActualUsage, BodyKind::Json, &chunks);
        assert_eq!(out.len(), body.len());
        assert!(out == body);
        // Bytes start flowing once the cap is passed, not at the end.
        let first_non_empty = outs.iter().position(|b| !b.is_empty()).unwrap();
        assert_eq!(first_non_empty, MAX_HELD_JSON_BYTES / (64 * 1024));
        assert!(outs.last().unwrap().is_empty());
    }

    #[test]
    fn json_exactly_at_cap_is_still_rewritten() {
        let mut body = br#"{"actual_usage":1,"pad":""#.to_vec();
        body.resize(MAX_HELD_JSON_BYTES - 2, b'a');
        body.extend_from_slice(b"\"}");
        let mut rw = rewriter(Handler::StripActualUsage, BodyKind::Json);
        let out = rw.push(&body, true);
        assert!(!out.starts_with(b"{\"actual_usage\""));
        assert_eq!(out.len(), body.len() - br#""actual_usage":1,"#.len());
    }

    // ---- property tests ----

    fn frame_strategy() -> impl Strategy<Value = String> {
        let text = "[a-zA-Z0-9 \u{e9}\u{4e2d}\u{1f600}]{0,12}";
        prop_oneof![
            (text, any::<u32>()).prop_map(|(t, n)| format!(
                "data: {}",
                json!({"id": n, "choices": [{"index": 0, "delta": {"content": t}, "finish_reason": null}]})
            )),
            (text, any::<u32>()).prop_map(|(t, n)| format!(
                "data:{}",
                json!({"choices": [{"delta": {"reasoning_content": t}}], "usage": {"prompt_tokens": n}})
            )),
            text.prop_map(|t| format!(": {t}")),
            text.prop_map(|t| format!("data: not json {t}")),
            Just("data: [DONE]".to_string()),
            Just("data: {\"broken\":".to_string()),
        ]
    }

    fn stream_strategy() -> impl Strategy<Value = Vec<u8>> {
        (
            proptest::collection::vec((frame_strategy(), any::<bool>()), 0..10),
            any::<bool>(),
        )
            .prop_map(|(frames, unterminated_last)| {
                let mut s = String::new();
                for (f, crlf) in &frames {
                    let eol = if *crlf { "\r\n" } else { "\n" };
                    s.push_str(f);
                    s.push_str(eol);
                    s.push_str(eol);
                }
                if unterminated_last {
                    s.push_str("data: {\"tail\":1}");
                }
                s.into_bytes()
            })
    }

    fn chunked(h: Handler, kind: BodyKind, input: &[u8], cuts: &[usize]) -> Vec<u8> {
        let mut points: Vec<usize> = cuts.iter().map(|c| c % (input.len() + 1)).collect();
        points.sort_unstable();
        points.push(input.len());
        let mut prev = 0;
        let mut refs: Vec<&[u8]> = Vec::new();
        for p in points {
            refs.push(&input[prev..p]);
            prev = p;
        }
        run(h, kind, &refs).0
    }

    proptest! {
        #[test]
        fn prop_noop_stream_identical_for_any_chunking(
            input in stream_strategy(),
            cuts in proptest::collection::vec(any::<usize>(), 0..8),
        ) {
            for h in [Handler::StripActualUsage, Handler::VllmFormat] {
                prop_assert_eq!(chunked(h, BodyKind::Sse, &input, &cuts), input.clone());
            }
        }

        #[test]
        fn prop_noop_json_identical_for_any_chunking(
            frame in frame_strategy(),
            pad in "[ \n]{0,3}",
            cuts in proptest::collection::vec(any::<usize>(), 0..8),
        ) {
            let body = format!("{pad}{}{pad}", frame.trim_start_matches("data:").trim_start());
            for h in [Handler::StripActualUsage, Handler::VllmFormat] {
                prop_assert_eq!(
                    chunked(h, BodyKind::Json, body.as_bytes(), &cuts),
                    body.as_bytes().to_vec()
                );
            }
        }

        #[test]
        fn prop_rewrite_independent_of_chunking(
            input in stream_strategy(),
            cuts in proptest::collection::vec(any::<usize>(), 0..8),
        ) {
            // Same stream with something to change in every JSON frame.
            let input = String::from_utf8(input).unwrap()
                .replace("{\"id\"", "{\"actual_usage\":null,\"stop_reason\":null,\"id\"")
                .into_bytes();
            for h in [Handler::StripActualUsage, Handler::VllmFormat] {
                let whole = chunked(h, BodyKind::Sse, &input, &[]);
                prop_assert_eq!(chunked(h, BodyKind::Sse, &input, &cuts), whole.clone());
                if contains(&input, b"actual_usage") {
                    prop_assert!(!contains(&whole, b"actual_usage"));
                }
            }
        }
    }
}
