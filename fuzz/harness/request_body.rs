//! The `request_body` harness (see `fuzz/harness.rs`): a request body and
//! its headers through the request view, the session id, the pieces a body
//! is read in, the include_usage rewrite, the prefix transforms and the
//! body log's redaction, each against its reference model or the others.

use super::split_nul;
use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue};
use llm_gateway::bodylog::redact;
use llm_gateway::request_view::{as_str, member, RequestView};
use llm_gateway::rewrite;
use llm_gateway::rewrite::include_usage::inject_include_usage;
use llm_gateway::session::extract::{extract_session, SessionId};
use serde_json::Value;

/// Request headers from the part before the NUL: one per line,
/// `name: value`; a line `+name` makes `name` a configured session header.
fn headers_of(text: &[u8]) -> (HeaderMap, Vec<HeaderName>) {
    let mut headers = HeaderMap::new();
    let mut configured = Vec::new();
    for line in text.split(|&b| b == b'\n') {
        if let Some(name) = line.strip_prefix(b"+") {
            if let Ok(name) = HeaderName::from_bytes(name) {
                configured.push(name);
            }
            continue;
        }
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            continue;
        };
        let value = &line[colon + 1..];
        let value = value.strip_prefix(b" ").unwrap_or(value);
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(&line[..colon]),
            HeaderValue::from_bytes(value),
        ) {
            headers.append(name, value);
        }
    }
    (headers, configured)
}

/// A request body (after optional headers and a NUL): the view, session
/// extraction, the include_usage rewrite, the prefix transforms and the
/// body log's redaction, each against what it promises.
pub fn request_body(data: &[u8]) {
    let (head, body) = match data.iter().position(|&b| b == 0) {
        Some(_) => split_nul(data),
        None => (&[][..], data),
    };
    let (headers, configured) = headers_of(head);
    let full: Option<Value> = serde_json::from_slice(body).ok();
    let view = RequestView::parse(body);
    // request_view.rs: skipping still checks the body is valid JSON, nested
    // no deeper than a full parse allows. The reject rules' full parse
    // must accept every body the view accepted, or rules are skipped.
    assert_eq!(
        view.is_ok(),
        full.as_ref().is_some_and(Value::is_object),
        "the view accepts exactly the JSON objects a full parse accepts: {view:?}"
    );

    check_pieces(data, body, view.as_ref().ok());

    let session = extract_session(&headers, &configured, view.as_ref().ok());
    if let Some(id) = &session {
        if let Some(name) = id.source.header_name() {
            assert!(headers.contains_key(name), "{name} was sent");
        }
    }
    if let (Ok(view), Some(full)) = (&view, &full) {
        check_body_session(view, full);
        check_include_usage(body, view, full);
    }
    for opts in [
        rewrite::Options {
            cch_strip: true,
            kimi_normalize: false,
        },
        rewrite::Options {
            cch_strip: false,
            kimi_normalize: true,
        },
        rewrite::Options {
            cch_strip: true,
            kimi_normalize: true,
        },
    ] {
        check_rewrite(body, opts, full.is_some(), view.as_ref().ok());
    }
    check_redaction(body, view.as_ref().ok());
}

/// What the session of a body with no headers must be, from the fully
/// parsed tree: a reference model of the order in `session/extract.rs`.
/// `None` when the model cannot tell (an embedded `user_id` that only a
/// lenient parse reads).
fn model_session(body: &Value) -> Option<Option<(u64, &'static str)>> {
    fn usable(value: &Value) -> Option<u64> {
        let text = match value {
            Value::String(s) => s.trim().to_string(),
            Value::Number(n) => n.to_string(),
            _ => return None,
        };
        let ok = !text.is_empty() && text.len() <= 1024;
        ok.then(|| llm_gateway::hash::stable_hash64(text.as_bytes()))
    }
    let metadata = body.get("metadata").filter(|m| m.is_object());
    let field = |v: Option<&Value>, name: &str| v.and_then(|v| v.get(name)).cloned();
    if let Some(h) = field(metadata, "session_id").as_ref().and_then(usable) {
        return Some(Some((h, "body:metadata.session_id")));
    }
    let litellm = body.get("litellm_metadata").filter(|m| m.is_object());
    if let Some(h) = field(litellm, "session_id").as_ref().and_then(usable) {
        return Some(Some((h, "body:litellm_metadata.session_id")));
    }
    let user_id = field(metadata, "user_id");
    let embedded = match &user_id {
        Some(Value::Object(o)) => o.get("session_id").cloned(),
        Some(Value::String(s)) if s.trim().starts_with('{') && s.trim().len() <= 16 * 1024 => {
            match serde_json::from_str::<Value>(s.trim()) {
                Ok(Value::Object(o)) => o.get("session_id").cloned(),
                Ok(_) => None,
                Err(_) => return None,
            }
        }
        _ => None,
    };
    if let Some(h) = embedded.as_ref().and_then(usable) {
        return Some(Some((h, "body:metadata.user_id.session_id")));
    }
    if let Some(h) = user_id.as_ref().and_then(usable) {
        return Some(Some((h, "body:metadata.user_id")));
    }
    if let Some(h) = body.get("user").and_then(usable) {
        return Some(Some((h, "body:user")));
    }
    Some(None)
}

fn body_session(view: &RequestView) -> Option<SessionId> {
    extract_session(&HeaderMap::new(), &[], Some(view))
}

/// The body cut in three where the input says (as Pingora's reads cut a
/// long one): the skim over the pieces answers only for a body the whole
/// reading accepts, with the same members (`proxy/request/pieces.rs`).
fn check_pieces(data: &[u8], body: &[u8], whole: Option<&RequestView>) {
    let seed = data
        .iter()
        .fold(0usize, |h, &b| h.wrapping_mul(31) ^ b as usize);
    let mut cuts = [seed % (body.len() + 1), (seed >> 16) % (body.len() + 1)];
    cuts.sort_unstable();
    let pieces = [
        Bytes::copy_from_slice(&body[..cuts[0]]),
        Bytes::copy_from_slice(&body[cuts[0]..cuts[1]]),
        Bytes::copy_from_slice(&body[cuts[1]..]),
    ];
    let Some(in_pieces) = RequestView::parse_pieces(&pieces) else {
        return;
    };
    let whole = whole.expect("the pieces were read as a body the whole reading refuses");
    let members = |v: &RequestView| {
        [
            v.model,
            v.stream,
            v.stream_options,
            v.metadata,
            v.litellm_metadata,
            v.user,
        ]
        .map(|m| m.map(|m| m.get().to_string()))
    };
    assert_eq!(members(&in_pieces), members(whole), "cut at {cuts:?}");
}

fn check_body_session(view: &RequestView, full: &Value) {
    let got = body_session(view);
    if let Some(want) = model_session(full) {
        let got = got.as_ref().map(|s| (s.hash, s.source.as_str()));
        assert_eq!(got, want, "the borrowed view and the parsed tree agree");
    }
}

/// include_usage: the output is the input with exactly
/// `stream_options.include_usage: true` set, and a second pass is a no-op.
fn check_include_usage(body: &[u8], view: &RequestView, full: &Value) {
    let Some(out) = inject_include_usage(body, view) else {
        return;
    };
    assert!(view.is_stream(), "only streaming requests are rewritten");
    let after: Value = serde_json::from_slice(&out).expect("include_usage output is JSON");
    let mut want = full.clone();
    want["stream_options"]["include_usage"] = Value::Bool(true);
    assert_eq!(after, want, "only stream_options.include_usage changes");
    let view2 = RequestView::parse(&out).expect("the rewritten body has a view");
    assert!(
        inject_include_usage(&out, &view2).is_none(),
        "include_usage is idempotent"
    );
    assert_eq!(body_session(view), body_session(&view2), "same session");
    assert_eq!(view.model(), view2.model(), "same model");
}

/// The raw text of the members the gateway routes and guards by.
fn routed_members(view: &RequestView) -> [Option<String>; 6] {
    let text = |v: Option<&serde_json::value::RawValue>| v.map(|v| v.get().to_string());
    [
        text(view.model),
        text(view.stream),
        text(view.stream_options),
        text(view.metadata),
        text(view.litellm_metadata),
        text(view.user),
    ]
}

/// cch_strip / kimi_normalize: JSON in gives JSON out, a second pass
/// changes nothing, only `system` / `messages` bytes move, and the preview
/// tells the same story as the rewrite.
fn check_rewrite(body: &[u8], opts: rewrite::Options, json_in: bool, view: Option<&RequestView>) {
    let applied = rewrite::apply(body, opts);
    let preview = rewrite::preview(body, opts);
    assert_eq!(
        preview["changed"],
        Value::Bool(applied.is_some()),
        "preview and apply agree ({opts:?})"
    );
    let Some(out) = applied else {
        return;
    };
    assert_eq!(preview["bytes_after"], out.body.len());
    assert_ne!(out.body, body, "a rewrite changes something");
    assert_eq!(
        serde_json::from_slice::<Value>(&out.body).is_ok(),
        json_in,
        "valid JSON in, valid JSON out ({opts:?})"
    );
    assert!(
        rewrite::apply(&out.body, opts).is_none(),
        "{opts:?} is idempotent: {}",
        String::from_utf8_lossy(&out.body)
    );
    if let Some(view) = view {
        let view2 = RequestView::parse(&out.body).expect("still one JSON object");
        assert_eq!(
            routed_members(view),
            routed_members(&view2),
            "only system and messages change"
        );
    }
}

/// The body log's redaction keeps a JSON object a JSON object and leaves
/// only `sid:` strings where the session ids were.
fn check_redaction(body: &[u8], view: Option<&RequestView>) {
    let redacted = redact::redact_session_ids(body);
    let Some(view) = view else {
        assert_eq!(&*redacted, body, "what is not an object is kept as is");
        return;
    };
    let view2 = RequestView::parse(&redacted).expect("a redacted body still parses");
    let sid = |v: Option<&serde_json::value::RawValue>| {
        if let Some(v) = v {
            assert!(
                as_str(v).is_some_and(|s| s.starts_with("sid:")),
                "left unredacted: {}",
                v.get()
            );
        }
    };
    sid(view2.metadata.and_then(|m| member(m, "session_id")));
    sid(view2.metadata.and_then(|m| member(m, "user_id")));
    sid(view2.litellm_metadata.and_then(|m| member(m, "session_id")));
    sid(view2.user);
    // The hash a redacted member carries is the one the session got, so a
    // record still correlates with its X-Routed-Session.
    if let Some(session) = body_session(view) {
        let at = match session.source.as_str() {
            "body:metadata.session_id" => view2.metadata.and_then(|m| member(m, "session_id")),
            "body:litellm_metadata.session_id" => {
                view2.litellm_metadata.and_then(|m| member(m, "session_id"))
            }
            "body:metadata.user_id.session_id" | "body:metadata.user_id" => {
                view2.metadata.and_then(|m| member(m, "user_id"))
            }
            "body:user" => view2.user,
            other => panic!("a body session from {other}"),
        };
        let want = format!("\"sid:{:016x}\"", session.hash);
        assert_eq!(
            at.map(|v| v.get()),
            Some(want.as_str()),
            "the redacted {} carries the session's hash",
            session.source
        );
    }
}
