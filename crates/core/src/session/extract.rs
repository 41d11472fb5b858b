//! Finds the session id of a request and reduces it to a stable 64-bit hash.
//!
//! Sources, in order; the first usable value wins:
//! 1. the route's configured headers, in the configured order;
//! 2. `x-litellm-session-id`, `x-claude-code-session-id`, `x-session-id`
//!    (the OpenResty gateway's three), then Codex's `session-id` and, from
//!    its earlier versions, `session_id` (see `BUILTIN_HEADERS`);
//! 3. body `metadata.session_id`, then `litellm_metadata.session_id`;
//! 4. body `metadata.user_id.session_id`, where `user_id` is an object or a
//!    string holding a JSON object (Claude Code sends the latter);
//! 5. body `metadata.user_id` when it is a string or a number;
//! 6. body `user` (the OpenAI field);
//! 7. body `prompt_cache_key` (OpenAI's routing key);
//! 8. body `previous_response_id` (Responses API: the caller maps the id to
//!    the session that produced it, [`SessionSource::BodyPreviousResponseId`]);
//! 9. body `conversation` (Responses API), a string or `{"id": …}`.
//!
//! A request with none of them may still be recognised by its content
//! (`session::content`), which the caller tries last.
//!
//! A value is usable when, after trimming surrounding whitespace, it is not
//! empty and at most [`MAX_SESSION_VALUE_BYTES`] long; an unusable value is
//! skipped and the next source is tried. Blank values are skipped because
//! otherwise every client sending an empty header would share one session (and
//! one replica). Trimming means `" abc "` and `"abc"` are the same session,
//! which is what a client that pads a header by accident expects. Over-long
//! values are skipped rather than truncated: truncation would merge every
//! session sharing a long prefix, and such a value (a prompt pasted into
//! `user`, say) is not an id anyway; hashing it on every request would also
//! cost time for nothing.
//!
//! JSON strings and numbers are accepted as values (a number is hashed in its
//! JSON text form); booleans, null, arrays and objects are not ids. Header
//! values that are not UTF-8 are hashed as bytes, with ASCII whitespace
//! trimmed. The raw value never leaves this module: [`SessionId`] holds only
//! its hash and where it came from.

use std::borrow::Cow;
use std::fmt;

use crate::request_view::{as_str, member, RequestView};
use http::{HeaderMap, HeaderName};
use serde_json::value::RawValue;

use crate::hash::{hex16, stable_hash64};

/// The body's top-level members a session id is read from (inside some of
/// them): what a copy of the body that must not carry ids redacts.
pub const BODY_SOURCES: [&str; 6] = [
    "metadata",
    "litellm_metadata",
    "user",
    "prompt_cache_key",
    "previous_response_id",
    "conversation",
];

/// Longest value (after trimming) accepted as a session id.
pub const MAX_SESSION_VALUE_BYTES: usize = 1024;

/// Longest `metadata.user_id` string that is parsed as embedded JSON. Real
/// ones are a few hundred bytes; the cap bounds the parse work per request.
const MAX_EMBEDDED_USER_ID_JSON_BYTES: usize = 16 * 1024;

/// Headers checked after the configured ones, with their source labels.
/// The OpenResty gateway's three (LiteLLM's, Claude Code's, the generic
/// one), then those agent clients send on every request unasked:
/// - `session-id`: the Codex CLI's session (openai/codex,
///   `codex-rs/codex-api/src/requests/headers.rs`, `build_session_headers`;
///   its `thread-id` beside it names the agent thread, the session being
///   the one whose cache they share);
/// - `session_id`: the same from Codex versions before it (there,
///   `build_conversation_headers`, which also sent `conversation_id` with
///   the same value, so that one adds nothing).
// Names parsed once: a lookup by `&str` parses the name on every request.
const BUILTIN_HEADERS: [(HeaderName, &str); 5] = [
    (
        HeaderName::from_static("x-litellm-session-id"),
        "header:x-litellm-session-id",
    ),
    (
        HeaderName::from_static("x-claude-code-session-id"),
        "header:x-claude-code-session-id",
    ),
    (
        HeaderName::from_static("x-session-id"),
        "header:x-session-id",
    ),
    (HeaderName::from_static("session-id"), "header:session-id"),
    (HeaderName::from_static("session_id"), "header:session_id"),
];

/// Whether a request header (lowercase name) is one a session id is read
/// from: the route's `configured` ones and the built-in ones. Whoever copies
/// request headers somewhere (the body log) leaves these out.
pub fn is_session_header(name: &str, configured: &[HeaderName]) -> bool {
    configured.iter().any(|h| h.as_str() == name)
        || BUILTIN_HEADERS.iter().any(|(h, _)| h.as_str() == name)
}

/// A request's session: the stable hash of its id and where the id was found.
///
/// Deliberately holds no raw value, so logging or debugging it cannot leak a
/// client's identifier; `Debug` prints the hash in its 16-hex-digit form.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct SessionId {
    pub hash: u64,
    pub source: SessionSource,
}

impl SessionId {
    /// The hash as sent in `X-Routed-Session`.
    pub fn hex(&self) -> String {
        hex16(self.hash)
    }

    /// [`hex`](Self::hex) without the formatting machinery or a `String`.
    pub fn hex_bytes(&self) -> [u8; 16] {
        crate::hash::hex16_bytes(self.hash)
    }
}

impl fmt::Debug for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SessionId")
            .field("hash", &hex16(self.hash))
            .field("source", &self.source.as_str())
            .finish()
    }
}

/// Where a session id was found.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum SessionSource {
    /// A request header. Holds the whole label, `header:<lowercase name>`,
    /// so that [`SessionSource::as_str`] can borrow it; build it with
    /// [`SessionSource::header`].
    Header(Cow<'static, str>),
    BodyMetadataSessionId,
    BodyLitellmMetadataSessionId,
    BodyUserIdSessionId,
    BodyUserId,
    BodyUser,
    BodyPromptCacheKey,
    /// The hash is the response id's until the caller maps it to the
    /// session that produced that response.
    BodyPreviousResponseId,
    BodyConversation,
    /// No id: the conversation recognised by its content.
    Content,
}

impl SessionSource {
    const HEADER_PREFIX: &'static str = "header:";

    pub fn header(name: &HeaderName) -> Self {
        SessionSource::Header(Cow::Owned(format!(
            "{}{}",
            Self::HEADER_PREFIX,
            name.as_str()
        )))
    }

    /// The label used in `X-Routed-Source`, logs and metrics.
    pub fn as_str(&self) -> &str {
        match self {
            SessionSource::Header(label) => label,
            SessionSource::BodyMetadataSessionId => "body:metadata.session_id",
            SessionSource::BodyLitellmMetadataSessionId => "body:litellm_metadata.session_id",
            SessionSource::BodyUserIdSessionId => "body:metadata.user_id.session_id",
            SessionSource::BodyUserId => "body:metadata.user_id",
            SessionSource::BodyUser => "body:user",
            SessionSource::BodyPromptCacheKey => "body:prompt_cache_key",
            SessionSource::BodyPreviousResponseId => "body:previous_response_id",
            SessionSource::BodyConversation => "body:conversation",
            SessionSource::Content => "content",
        }
    }

    /// The label when it is a constant (body sources, built-in headers), so
    /// a response header can carry it without a copy; `None` for a
    /// configured header's label, which is built per request.
    pub fn static_label(&self) -> Option<&'static str> {
        match self {
            SessionSource::Header(Cow::Borrowed(label)) => Some(label),
            SessionSource::Header(Cow::Owned(_)) => None,
            SessionSource::BodyMetadataSessionId => Some("body:metadata.session_id"),
            SessionSource::BodyLitellmMetadataSessionId => Some("body:litellm_metadata.session_id"),
            SessionSource::BodyUserIdSessionId => Some("body:metadata.user_id.session_id"),
            SessionSource::BodyUserId => Some("body:metadata.user_id"),
            SessionSource::BodyUser => Some("body:user"),
            SessionSource::BodyPromptCacheKey => Some("body:prompt_cache_key"),
            SessionSource::BodyPreviousResponseId => Some("body:previous_response_id"),
            SessionSource::BodyConversation => Some("body:conversation"),
            SessionSource::Content => Some("content"),
        }
    }

    /// The header name for header sources, `None` for body sources.
    pub fn header_name(&self) -> Option<&str> {
        match self {
            SessionSource::Header(label) => Some(
                label
                    .strip_prefix(Self::HEADER_PREFIX)
                    .unwrap_or(label.as_ref()),
            ),
            _ => None,
        }
    }
}

impl fmt::Display for SessionSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The request's session, or `None` when no source holds a usable value.
pub fn extract_session(
    headers: &HeaderMap,
    configured: &[HeaderName],
    body: Option<&RequestView>,
) -> Option<SessionId> {
    for name in configured {
        if let Some(hash) = hash_header(headers, name) {
            return Some(SessionId {
                hash,
                source: SessionSource::header(name),
            });
        }
    }
    for (name, label) in &BUILTIN_HEADERS {
        if let Some(hash) = hash_header(headers, name) {
            return Some(SessionId {
                hash,
                source: SessionSource::Header(Cow::Borrowed(label)),
            });
        }
    }
    body.and_then(session_from_body)
}

/// The body's sources alone (3. to 9.), for a caller that read the
/// headers already.
pub fn session_from_body(body: &RequestView) -> Option<SessionId> {
    let found = |hash, source| Some(SessionId { hash, source });
    let metadata = body.metadata;

    if let Some(hash) = metadata
        .and_then(|m| member(m, "session_id"))
        .and_then(hash_scalar)
    {
        return found(hash, SessionSource::BodyMetadataSessionId);
    }
    let litellm_session = body.litellm_metadata.and_then(|m| member(m, "session_id"));
    if let Some(hash) = litellm_session.and_then(hash_scalar) {
        return found(hash, SessionSource::BodyLitellmMetadataSessionId);
    }
    let user_id = metadata.and_then(|m| member(m, "user_id"));
    if let Some(hash) = user_id.and_then(hash_embedded_session_id) {
        return found(hash, SessionSource::BodyUserIdSessionId);
    }
    // A JSON-object string without a usable session_id still identifies the
    // user steadily, so it falls through to here and is hashed whole.
    if let Some(hash) = user_id.and_then(hash_scalar) {
        return found(hash, SessionSource::BodyUserId);
    }
    if let Some(hash) = body.user.and_then(hash_scalar) {
        return found(hash, SessionSource::BodyUser);
    }
    if let Some(hash) = body.prompt_cache_key.and_then(hash_scalar) {
        return found(hash, SessionSource::BodyPromptCacheKey);
    }
    if let Some(hash) = body.previous_response_id.and_then(hash_scalar) {
        return found(hash, SessionSource::BodyPreviousResponseId);
    }
    let conversation = body
        .conversation
        .map(|c| member(c, "id").unwrap_or(c))
        .and_then(hash_scalar);
    if let Some(hash) = conversation {
        return found(hash, SessionSource::BodyConversation);
    }
    None
}

/// The hash `metadata.user_id`'s value stands for: the session id inside
/// it when it embeds one, else the value itself, as `extract_session`
/// hashes it, so a redacted body log still matches its `session_hash`.
pub fn hash_user_id(value: &RawValue) -> Option<u64> {
    hash_embedded_session_id(value).or_else(|| hash_scalar(value))
}

/// The hash of a `session_id` member's or `user`'s value, as
/// `extract_session` hashes it: the value itself, never read as embedded
/// JSON (only `user_id` is).
pub fn hash_id(value: &RawValue) -> Option<u64> {
    hash_scalar(value)
}

/// `metadata.user_id.session_id` for both shapes of `user_id`.
fn hash_embedded_session_id(user_id: &RawValue) -> Option<u64> {
    if user_id.get().starts_with('{') {
        return member(user_id, "session_id").and_then(hash_scalar);
    }
    let text = as_str(user_id)?;
    let text = text.trim();
    // Cheap screen first: most user_id strings are plain ids, and
    // parsing them as JSON on every request would be wasted work.
    if !text.starts_with('{') || text.len() > MAX_EMBEDDED_USER_ID_JSON_BYTES {
        return None;
    }
    let embedded: &RawValue = serde_json::from_str(text).ok()?;
    member(embedded, "session_id").and_then(hash_scalar)
}

/// First usable value among the header's (possibly repeated) values.
fn hash_header(headers: &HeaderMap, name: &HeaderName) -> Option<u64> {
    headers
        .get_all(name)
        .iter()
        .find_map(|value| usable_bytes(value.as_bytes()).map(stable_hash64))
}

/// A string or a number (hashed in serde_json's canonical text, as it
/// always has been: `1e3` and `1000.0` are one id).
fn hash_scalar(value: &RawValue) -> Option<u64> {
    let text = value.get();
    if text.starts_with('"') {
        let s = as_str(value)?;
        return usable_str(&s).map(|t| stable_hash64(t.as_bytes()));
    }
    if text.starts_with(|c: char| c == '-' || c.is_ascii_digit()) {
        let number: serde_json::Number = serde_json::from_str(text).ok()?;
        let text = number.to_string();
        return usable_str(&text).map(|t| stable_hash64(t.as_bytes()));
    }
    None
}

fn usable_str(text: &str) -> Option<&str> {
    let trimmed = text.trim();
    let usable = !trimmed.is_empty() && trimmed.len() <= MAX_SESSION_VALUE_BYTES;
    usable.then_some(trimmed)
}

/// Header bytes trimmed the same way as body strings when they are UTF-8, so
/// one id hashes alike from either place; other bytes lose ASCII whitespace.
fn usable_bytes(bytes: &[u8]) -> Option<&[u8]> {
    match std::str::from_utf8(bytes) {
        Ok(text) => usable_str(text).map(str::as_bytes),
        Err(_) => {
            let trimmed = bytes.trim_ascii();
            let usable = !trimmed.is_empty() && trimmed.len() <= MAX_SESSION_VALUE_BYTES;
            usable.then_some(trimmed)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;
    use serde_json::{json, Value};

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                HeaderName::from_bytes(name.as_bytes()).expect("test header name"),
                HeaderValue::from_str(value).expect("test header value"),
            );
        }
        map
    }

    fn h(value: &str) -> u64 {
        stable_hash64(value.as_bytes())
    }

    fn names(list: &[&str]) -> Vec<HeaderName> {
        list.iter()
            .map(|n| HeaderName::from_bytes(n.as_bytes()).expect("test header name"))
            .collect()
    }

    fn extract(
        pairs: &[(&str, &str)],
        configured: &[&str],
        body: Option<Value>,
    ) -> Option<SessionId> {
        let text = body.map(|b| b.to_string());
        // A body that is not an object never gets this far in the proxy
        // (it is a 400), so it has no view.
        let view = text
            .as_deref()
            .and_then(|t| RequestView::parse(t.as_bytes()).ok());
        extract_session(&headers(pairs), &names(configured), view.as_ref())
    }

    fn source_and_hash(found: Option<SessionId>) -> Option<(String, u64)> {
        found.map(|s| (s.source.as_str().to_owned(), s.hash))
    }

    #[test]
    fn openai_and_responses_sources_after_the_seeds() {
        let src = |body: Value| source_and_hash(extract(&[], &[], Some(body)));
        assert_eq!(
            src(json!({"prompt_cache_key": "pk", "previous_response_id": "resp_1"})),
            Some(("body:prompt_cache_key".into(), h("pk")))
        );
        assert_eq!(
            src(json!({"previous_response_id": "resp_1", "conversation": "conv_1"})),
            Some(("body:previous_response_id".into(), h("resp_1")))
        );
        assert_eq!(
            src(json!({"conversation": {"id": "conv_1"}})),
            Some(("body:conversation".into(), h("conv_1")))
        );
        assert_eq!(
            src(json!({"conversation": "conv_1"})),
            Some(("body:conversation".into(), h("conv_1")))
        );
        // The seed's sources still come first.
        assert_eq!(
            src(json!({"user": "u", "prompt_cache_key": "pk"})),
            Some(("body:user".into(), h("u")))
        );
        assert_eq!(
            src(json!({"metadata": {"user_id": "claude"}, "prompt_cache_key": "pk"})),
            Some(("body:metadata.user_id".into(), h("claude")))
        );
        assert_eq!(src(json!({"prompt_cache_key": ""})), None);
    }

    #[test]
    fn configured_headers_win_in_configured_order() {
        let pairs = [
            ("x-session-id", "builtin"),
            ("x-opencode-session", "second"),
            ("x-session-affinity", "first"),
        ];
        let found = extract(&pairs, &["x-session-affinity", "x-opencode-session"], None);
        assert_eq!(
            source_and_hash(found),
            Some(("header:x-session-affinity".into(), h("first")))
        );
        let found = extract(&pairs, &["x-opencode-session", "x-session-affinity"], None);
        assert_eq!(
            source_and_hash(found),
            Some(("header:x-opencode-session".into(), h("second")))
        );
    }

    #[test]
    fn builtin_headers_in_order() {
        let all = [
            ("x-session-id", "c"),
            ("x-claude-code-session-id", "b"),
            ("x-litellm-session-id", "a"),
        ];
        assert_eq!(
            source_and_hash(extract(&all, &[], None)),
            Some(("header:x-litellm-session-id".into(), h("a")))
        );
        assert_eq!(
            source_and_hash(extract(&all[..2], &[], None)),
            Some(("header:x-claude-code-session-id".into(), h("b")))
        );
        assert_eq!(
            source_and_hash(extract(&all[..1], &[], None)),
            Some(("header:x-session-id".into(), h("c")))
        );
        // Codex's, after the OpenResty gateway's three.
        let codex = [
            ("session_id", "e"),
            ("session-id", "d"),
            ("x-session-id", "c"),
        ];
        assert_eq!(
            source_and_hash(extract(&codex, &[], None)),
            Some(("header:x-session-id".into(), h("c")))
        );
        assert_eq!(
            source_and_hash(extract(&codex[..2], &[], None)),
            Some(("header:session-id".into(), h("d")))
        );
        assert_eq!(
            source_and_hash(extract(&codex[..1], &[], None)),
            Some(("header:session_id".into(), h("e")))
        );
        // Codex's `conversation_id` and `thread-id` are not sources.
        let others = [("conversation_id", "f"), ("thread-id", "g")];
        assert_eq!(source_and_hash(extract(&others, &[], None)), None);
    }

    #[test]
    fn headers_win_over_body() {
        let body = json!({"metadata": {"session_id": "from-body"}});
        let found = extract(&[("x-session-id", "from-header")], &[], Some(body));
        assert_eq!(
            source_and_hash(found),
            Some(("header:x-session-id".into(), h("from-header")))
        );
    }

    #[test]
    fn each_body_source_in_order() {
        let full = json!({
            "metadata": {"session_id": "m", "user_id": {"session_id": "u"}},
            "litellm_metadata": {"session_id": "l"},
            "user": "top",
        });
        let expect = |body: Value, label: &str, value: &str| {
            assert_eq!(
                source_and_hash(extract(&[], &[], Some(body))),
                Some((label.to_owned(), h(value)))
            );
        };
        expect(full, "body:metadata.session_id", "m");
        expect(
            json!({"metadata": {"user_id": {"session_id": "u"}},
                   "litellm_metadata": {"session_id": "l"}, "user": "top"}),
            "body:litellm_metadata.session_id",
            "l",
        );
        expect(
            json!({"metadata": {"user_id": {"session_id": "u"}}, "user": "top"}),
            "body:metadata.user_id.session_id",
            "u",
        );
        expect(
            json!({"metadata": {"user_id": "plain-user"}, "user": "top"}),
            "body:metadata.user_id",
            "plain-user",
        );
        expect(json!({"user": "top"}), "body:user", "top");
    }

    #[test]
    fn user_id_as_json_string_yields_its_session_id() {
        let user_id = r#"{"device_id":"d1","account_uuid":"a1","session_id":"s-123"}"#;
        let body = json!({"metadata": {"user_id": user_id}, "user": "top"});
        assert_eq!(
            source_and_hash(extract(&[], &[], Some(body))),
            Some(("body:metadata.user_id.session_id".into(), h("s-123")))
        );
    }

    #[test]
    fn user_id_json_string_without_session_id_is_hashed_whole() {
        let user_id = r#"{"device_id":"d1"}"#;
        let body = json!({"metadata": {"user_id": user_id}});
        assert_eq!(
            source_and_hash(extract(&[], &[], Some(body))),
            Some(("body:metadata.user_id".into(), h(user_id)))
        );
        // Not JSON despite the brace: still a plain id.
        let body = json!({"metadata": {"user_id": "{not json"}});
        assert_eq!(
            source_and_hash(extract(&[], &[], Some(body))),
            Some(("body:metadata.user_id".into(), h("{not json")))
        );
    }

    #[test]
    fn user_id_object_without_session_id_falls_to_user() {
        let body = json!({"metadata": {"user_id": {"device_id": "d"}}, "user": "top"});
        assert_eq!(
            source_and_hash(extract(&[], &[], Some(body))),
            Some(("body:user".into(), h("top")))
        );
    }

    #[test]
    fn blank_values_are_skipped_everywhere() {
        let pairs = [
            ("x-session-affinity", "   "),
            ("x-litellm-session-id", ""),
            ("x-session-id", "\t"),
        ];
        let body = json!({
            "metadata": {"session_id": "  ", "user_id": {"session_id": " "}},
            "litellm_metadata": {"session_id": ""},
            "user": " real ",
        });
        let found = extract(&pairs, &["x-session-affinity"], Some(body));
        assert_eq!(
            source_and_hash(found),
            Some(("body:user".into(), h("real")))
        );
        assert_eq!(extract(&pairs, &["x-session-affinity"], None), None);
        assert_eq!(extract(&[], &[], Some(json!({"user": "\n "}))), None);
    }

    #[test]
    fn values_are_trimmed_before_hashing() {
        let padded = extract(&[("x-session-id", "  abc  ")], &[], None).map(|s| s.hash);
        let body = extract(&[], &[], Some(json!({"user": "\tabc\n"}))).map(|s| s.hash);
        assert_eq!(padded, Some(h("abc")));
        assert_eq!(body, Some(h("abc")));
    }

    #[test]
    fn repeated_header_uses_first_usable_value() {
        let found = extract(
            &[("x-session-id", " "), ("x-session-id", "second")],
            &[],
            None,
        );
        assert_eq!(found.map(|s| s.hash), Some(h("second")));
    }

    #[test]
    fn non_utf8_header_bytes_are_hashed() {
        let mut map = HeaderMap::new();
        let raw = [b' ', 0xff, 0xfe, b'x', b' '];
        map.insert(
            "x-session-id",
            HeaderValue::from_bytes(&raw).expect("obs-text is a valid header value"),
        );
        let found = extract_session(&map, &[], None);
        assert_eq!(found.map(|s| s.hash), Some(stable_hash64(&raw[1..4])));
    }

    #[test]
    fn over_long_values_are_skipped() {
        let at_cap = "a".repeat(MAX_SESSION_VALUE_BYTES);
        let over_cap = "b".repeat(MAX_SESSION_VALUE_BYTES + 1);
        let found = extract(&[("x-session-id", &at_cap)], &[], None);
        assert_eq!(found.map(|s| s.hash), Some(h(&at_cap)));

        let body = json!({"user": "fallback"});
        let found = extract(&[("x-session-id", &over_cap)], &[], Some(body));
        assert_eq!(
            source_and_hash(found),
            Some(("body:user".into(), h("fallback")))
        );
    }

    #[test]
    fn numbers_count_other_json_types_do_not() {
        let found = extract(&[], &[], Some(json!({"metadata": {"session_id": 12345}})));
        assert_eq!(found.map(|s| s.hash), Some(h("12345")));
        for not_an_id in [json!(true), json!(null), json!([1]), json!({"a": 1})] {
            let body = json!({"metadata": {"session_id": not_an_id}, "user": "u"});
            let found = extract(&[], &[], Some(body));
            assert_eq!(found.map(|s| s.source), Some(SessionSource::BodyUser));
        }
    }

    #[test]
    fn odd_bodies_yield_none_without_panicking() {
        for body in [
            json!(null),
            json!("text"),
            json!([1, 2]),
            json!({"metadata": "x"}),
            json!({"metadata": {"user_id": ["a"]}}),
            json!({"metadata": {"user_id": "{\"session_id\": {\"deep\": 1}}"}}),
        ] {
            let found = extract(&[], &[], Some(body.clone()));
            assert!(
                found.is_none()
                    || found.as_ref().map(|s| &s.source) == Some(&SessionSource::BodyUserId),
                "{body}"
            );
        }
        assert_eq!(extract(&[], &[], None), None);
    }

    #[test]
    fn debug_output_never_contains_the_raw_value() {
        let raw = "secret-conversation-7f3a";
        let body = json!({"metadata": {"user_id": format!("{{\"session_id\":\"{raw}\"}}")}});
        for found in [
            extract(&[("x-session-id", raw)], &[], None),
            extract(&[("x-custom", raw)], &["x-custom"], None),
            extract(&[], &[], Some(body)),
            extract(&[], &[], Some(json!({"user": raw}))),
        ] {
            let found = found.expect("a session");
            let debug = format!("{found:?} {:?} {}", found.source, found.source);
            assert!(!debug.contains(raw), "{debug}");
            assert!(debug.contains(&hex16(found.hash)), "{debug}");
        }
    }

    #[test]
    fn header_source_labels_and_names() {
        let source = SessionSource::header(&HeaderName::from_static("x-opencode-session"));
        assert_eq!(source.as_str(), "header:x-opencode-session");
        assert_eq!(source.header_name(), Some("x-opencode-session"));
        assert_eq!(SessionSource::BodyUser.header_name(), None);
        let found = extract(&[("X-Session-Id", "v")], &[], None).expect("a session");
        assert_eq!(found.source.as_str(), "header:x-session-id");
        assert_eq!(found.hex(), hex16(h("v")));
    }
}
