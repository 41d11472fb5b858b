//! The logged request body without the session ids it carries: every
//! member a session id can come from (`metadata.session_id`,
//! `litellm_metadata.session_id`, `metadata.user_id`, `user`,
//! `prompt_cache_key`, `previous_response_id`, `conversation`) has its value
//! replaced by `"sid:<hash>"`, the same 64-bit hash the frame's
//! `session_hash` and the X-Routed-Session header give, so a record still
//! correlates with its session (for `previous_response_id` the hash is
//! the response id's: its session is the one that response answered).
//! Every other byte is kept as the engine received it. Pure.

use crate::request_view::{members_named, RequestView};
use crate::session::extract::{hash_id, hash_user_id, BODY_SOURCES};
use serde_json::value::RawValue;
use std::borrow::Cow;

/// `body` with its session-id members replaced; borrowed when it has none
/// (or is not a JSON object, which then carries no member to find).
pub fn redact_session_ids(body: &[u8]) -> Cow<'_, [u8]> {
    // The view only proves the body is one valid JSON object; the members
    // are then found wherever they occur, since a member written twice
    // keeps only its last value in the view but both copies in the bytes.
    if RequestView::parse(body).is_err() {
        return Cow::Borrowed(body);
    }
    let Ok(whole) = serde_json::from_slice::<&RawValue>(body) else {
        return Cow::Borrowed(body);
    };
    let mut spans: Vec<(usize, usize, String)> = Vec::new();
    // Each member hashed as `extract_session` hashes it there: only
    // `user_id` can embed the id as JSON.
    let mut push = |value: &RawValue, hash: fn(&RawValue) -> Option<u64>| {
        if let Some((start, end)) = span_of(body, value) {
            let replacement = match hash(value) {
                Some(hash) => format!("\"sid:{hash:016x}\""),
                None => "\"sid:redacted\"".to_string(),
            };
            spans.push((start, end, replacement));
        }
    };
    for (name, value) in members_named(whole, &BODY_SOURCES) {
        match name {
            "user" | "prompt_cache_key" | "previous_response_id" => push(value, hash_id),
            // A string, or `{"id": …}`: the id either way.
            "conversation" if value.get().starts_with('{') => {
                for (_, id) in members_named(value, &["id"]) {
                    push(id, hash_id);
                }
            }
            "conversation" => push(value, hash_id),
            "metadata" => {
                for (inner, id) in members_named(value, &["session_id", "user_id"]) {
                    push(
                        id,
                        if inner == "user_id" {
                            hash_user_id
                        } else {
                            hash_id
                        },
                    );
                }
            }
            _ => {
                for (_, id) in members_named(value, &["session_id"]) {
                    push(id, hash_id);
                }
            }
        }
    }
    if spans.is_empty() {
        return Cow::Borrowed(body);
    }
    spans.sort_by_key(|s| s.0);
    let mut out = Vec::with_capacity(body.len());
    let mut at = 0;
    for (start, end, replacement) in spans {
        if start < at {
            continue;
        }
        out.extend_from_slice(&body[at..start]);
        out.extend_from_slice(replacement.as_bytes());
        at = end;
    }
    out.extend_from_slice(&body[at..]);
    Cow::Owned(out)
}

/// Where `value` (borrowed from `body` by the view) lies in `body`.
fn span_of(body: &[u8], value: &RawValue) -> Option<(usize, usize)> {
    let text = value.get().as_bytes();
    let start = (text.as_ptr() as usize).checked_sub(body.as_ptr() as usize)?;
    let end = start.checked_add(text.len())?;
    (end <= body.len()).then_some((start, end))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::stable_hash64;

    fn redacted(body: &str) -> String {
        String::from_utf8(redact_session_ids(body.as_bytes()).into_owned()).expect("utf-8")
    }

    #[test]
    fn every_session_id_member_becomes_its_hash_and_the_rest_is_kept() {
        let body = r#"{"model":"m", "metadata": {"session_id":"agent-42","x":1},"user":"u-7","messages":[{"role":"user","content":"agent-42 says hi"}]}"#;
        let out = redacted(body);
        let sid = format!("sid:{:016x}", stable_hash64(b"agent-42"));
        let user = format!("sid:{:016x}", stable_hash64(b"u-7"));
        assert_eq!(
            out,
            format!(
                r#"{{"model":"m", "metadata": {{"session_id":"{sid}","x":1}},"user":"{user}","messages":[{{"role":"user","content":"agent-42 says hi"}}]}}"#
            ),
            "only the members' values change; text that merely mentions the id is the conversation"
        );
        serde_json::from_str::<serde_json::Value>(&out).expect("still JSON");
    }

    #[test]
    fn openai_and_responses_ids_are_redacted_too() {
        let body = r#"{"prompt_cache_key":"pk-1","previous_response_id":"resp_9","conversation":{"id":"conv_3"},"input":"pk-1"}"#;
        let out = redacted(body);
        for id in ["pk-1", "resp_9", "conv_3"] {
            assert!(
                out.contains(&format!("sid:{:016x}", stable_hash64(id.as_bytes()))),
                "{id}: {out}"
            );
        }
        assert!(!out.contains("resp_9") && !out.contains("conv_3"), "{out}");
        assert!(
            out.ends_with(r#""input":"pk-1"}"#),
            "the conversation is kept: {out}"
        );
        let out = redacted(r#"{"conversation":"conv_4"}"#);
        assert!(!out.contains("conv_4"), "{out}");
    }

    #[test]
    fn an_embedded_user_id_and_litellm_metadata_are_redacted_too() {
        let body = r#"{"metadata":{"user_id":"{\"session_id\":\"s-9\"}"},"litellm_metadata":{"session_id":17}}"#;
        let out = redacted(body);
        assert!(!out.contains("s-9"), "{out}");
        assert!(!out.contains(":17"), "{out}");
        assert!(
            out.contains(&format!("sid:{:016x}", stable_hash64(b"s-9"))),
            "{out}"
        );
        assert!(
            out.contains(&format!("sid:{:016x}", stable_hash64(b"17"))),
            "{out}"
        );
    }

    /// Found by the `request_body` fuzz harness's redaction property (on
    /// an input written for it: the fuzz runs had not reached it). Only
    /// `metadata.user_id` may hold an id as embedded JSON; a `user` or a
    /// `session_id` string that looks like one is the id itself, hashed
    /// whole by `extract_session`, so its `sid:` must be that hash or the
    /// record no longer matches its session.
    #[test]
    fn only_user_id_is_read_as_embedded_json() {
        let id = r#"{\"session_id\":\"x\"}"#;
        let whole = format!("sid:{:016x}", stable_hash64(br#"{"session_id":"x"}"#));
        for (body, want) in [
            (
                format!(r#"{{"user":"{id}"}}"#),
                format!(r#"{{"user":"{whole}"}}"#),
            ),
            (
                format!(r#"{{"metadata":{{"session_id":"{id}"}}}}"#),
                format!(r#"{{"metadata":{{"session_id":"{whole}"}}}}"#),
            ),
            (
                format!(r#"{{"litellm_metadata":{{"session_id":"{id}"}}}}"#),
                format!(r#"{{"litellm_metadata":{{"session_id":"{whole}"}}}}"#),
            ),
        ] {
            assert_eq!(redacted(&body), want);
        }
        let embedded = format!("sid:{:016x}", stable_hash64(b"x"));
        assert_eq!(
            redacted(&format!(r#"{{"metadata":{{"user_id":"{id}"}}}}"#)),
            format!(r#"{{"metadata":{{"user_id":"{embedded}"}}}}"#)
        );
    }

    #[test]
    fn a_member_written_twice_is_redacted_in_both_copies() {
        for body in [
            r#"{"metadata":{"session_id":"first-raw"},"metadata":{"session_id":"second-raw"}}"#,
            r#"{"metadata":{"session_id":"first-raw","session_id":"second-raw"}}"#,
            r#"{"user":"first-raw","user":"second-raw"}"#,
            r#"{"litellm_metadata":{"session_id":"first-raw"},"litellm_metadata":{"session_id":"second-raw"}}"#,
            r#"{"metadata":{"user_id":"{\"session_id\":\"first-raw\"}","user_id":"second-raw"}}"#,
        ] {
            let out = redacted(body);
            assert!(
                !out.contains("first-raw") && !out.contains("second-raw"),
                "{out}"
            );
            assert_eq!(out.matches("sid:").count(), 2, "{out}");
            serde_json::from_str::<serde_json::Value>(&out).expect("still JSON");
        }
        // Control: the second copy is the one the engine (and the view) reads.
        let body =
            r#"{"metadata":{"session_id":"first-raw"},"metadata":{"session_id":"second-raw"}}"#;
        let view = RequestView::parse(body.as_bytes()).expect("a JSON object");
        assert!(view
            .metadata
            .is_some_and(|m| m.get().contains("second-raw")));
    }

    #[test]
    fn a_body_without_ids_is_borrowed_unchanged() {
        for body in [
            &br#"{"model":"m","messages":[]}"#[..],
            b"not json",
            b"",
            br#"{"metadata":{"session_id":"   "}}"#,
        ] {
            let out = redact_session_ids(body);
            match body {
                br#"{"metadata":{"session_id":"   "}}"# => {
                    assert_eq!(&*out, br#"{"metadata":{"session_id":"sid:redacted"}}"#)
                }
                _ => assert!(
                    matches!(out, Cow::Borrowed(_)),
                    "{:?}",
                    String::from_utf8_lossy(body)
                ),
            }
        }
    }
}
