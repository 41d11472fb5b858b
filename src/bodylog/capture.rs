//! One request's capture: what the request phase knew (headers redacted),
//! the raw upstream response bytes as they pass, and at the end the frame.
//! Exists only for a request that is being logged (`RequestCtx::bodylog`).
//! Pure: every time comes from the caller.

use super::frame::{cap_request, fit_meta, Frame, HeadTail};
use base64::Engine as _;
use bytes::Bytes;
use http::HeaderMap;
use serde_json::{json, Map, Value};
use std::time::{Duration, Instant, SystemTime};

/// Request headers that are credentials: never logged.
const CREDENTIAL_HEADERS: [&str; 4] = [
    "authorization",
    "proxy-authorization",
    "x-api-key",
    "cookie",
];

/// Query parameters whose value may be a credential.
const CREDENTIAL_PARAMS: [&str; 5] = ["api_key", "api-key", "key", "token", "access_token"];

/// What the request phase hands over when a request is to be logged.
pub struct RequestSide {
    pub started: Instant,
    /// Wall-clock time of `started`, for `ts`.
    pub wall_start: SystemTime,
    pub request_id: u64,
    pub client_ip: Option<String>,
    pub method: String,
    /// As the client sent it (route prefix included), credentials redacted.
    pub uri: String,
    pub req_headers: Map<String, Value>,
    /// The owner of the API key the request presented.
    pub owner: Option<String>,
}

/// What the logging phase knows once the request is over.
pub struct Outcome<'a> {
    pub route: &'a str,
    pub peer: &'a str,
    pub model: Option<&'a str>,
    pub session_hash: Option<String>,
    pub session_src: Option<&'a str>,
    pub mode: Option<&'a str>,
    pub status: u16,
    pub attempts: u32,
    pub usage: Option<crate::stream::Usage>,
    /// The gateway added `stream_options.include_usage` to the body.
    pub usage_injected: bool,
    /// The body as the engine received it.
    pub req_body: &'a Bytes,
}

pub struct Capture {
    req: RequestSide,
    resp: HeadTail,
    resp_content_type: Option<String>,
    first_chunk: Option<Instant>,
    last_chunk: Option<Instant>,
    chunks: u64,
}

impl Capture {
    pub fn new(req: RequestSide) -> Self {
        Capture {
            req,
            resp: HeadTail::default(),
            resp_content_type: None,
            first_chunk: None,
            last_chunk: None,
            chunks: 0,
        }
    }

    /// The upstream response head arrived (a retry's replaces nothing: only
    /// the attempt that answered has a head).
    pub fn response_head(&mut self, headers: &HeaderMap) {
        self.resp_content_type = headers
            .get(http::header::CONTENT_TYPE)
            .map(|v| header_text(v.as_bytes()));
    }

    /// One raw upstream chunk, before the stream pipeline changes anything.
    pub fn tee(&mut self, chunk: &[u8], now: Instant) {
        if chunk.is_empty() {
            return;
        }
        self.first_chunk.get_or_insert(now);
        self.last_chunk = Some(now);
        self.chunks += 1;
        self.resp.push(chunk);
    }

    /// The frame, as of `now` (the end of the request).
    pub fn finish(self, out: &Outcome<'_>, now: Instant) -> Frame {
        let since =
            |t: Option<Instant>| t.map(|t| secs(t.saturating_duration_since(self.req.started)));
        let resp_bytes = self.resp.total();
        // The session ids a body carries go the way of the headers': only
        // their hash is logged.
        let body = match super::redact::redact_session_ids(out.req_body) {
            std::borrow::Cow::Borrowed(_) => out.req_body.clone(),
            std::borrow::Cow::Owned(edited) => Bytes::from(edited),
        };
        let (req, req_truncated) = cap_request(&body);
        let (resp, resp_truncated) = self.resp.finish();
        let usage = out.usage;
        let mut meta = json!({
            "ts": humantime::format_rfc3339_millis(self.req.wall_start).to_string(),
            "request_id": crate::hash::hex16(self.req.request_id),
            "client_ip": self.req.client_ip,
            "method": self.req.method,
            "uri": self.req.uri,
            "req_headers": self.req.req_headers,
            "route": out.route,
            "peer": out.peer,
            "model": out.model,
            "session_hash": out.session_hash,
            "session_src": out.session_src,
            "mode": out.mode,
            "status": out.status,
            "attempts": out.attempts,
            "req_bytes": out.req_body.len(),
            "resp_bytes": resp_bytes,
            "resp_content_type": self.resp_content_type,
            "first_chunk_t": since(self.first_chunk),
            "last_chunk_t": since(self.last_chunk),
            "chunk_count": self.chunks,
            "rt": secs(now.saturating_duration_since(self.req.started)),
            "owner": self.req.owner,
            "prompt_tokens": usage.map(|u| u.prompt_tokens),
            "cached_tokens": usage.map(|u| u.cached_tokens),
            "completion_tokens": usage.map(|u| u.completion_tokens),
            "usage_injected": out.usage_injected,
            "req_truncated": req_truncated,
            "resp_truncated": resp_truncated,
        });
        Frame::new(fit_meta(&mut meta), req, resp)
    }
}

/// Seconds with microsecond resolution (what a reader of the log wants).
fn secs(d: Duration) -> f64 {
    (d.as_micros() as f64) / 1e6
}

/// A header value as text, or `base64:…` when it is not UTF-8.
pub fn header_text(value: &[u8]) -> String {
    match std::str::from_utf8(value) {
        Ok(s) => s.to_string(),
        Err(_) => format!(
            "base64:{}",
            base64::engine::general_purpose::STANDARD.encode(value)
        ),
    }
}

/// The request headers as logged: credentials and any header that
/// `carries_session` says holds a session id removed (the meta has its
/// hash), repeated names joined with ", ".
pub fn redact_headers(
    headers: &HeaderMap,
    carries_session: impl Fn(&str) -> bool,
) -> Map<String, Value> {
    let mut out = Map::new();
    for (name, value) in headers {
        let name = name.as_str();
        if CREDENTIAL_HEADERS.contains(&name) || carries_session(name) {
            continue;
        }
        let text = header_text(value.as_bytes());
        match out.get_mut(name) {
            Some(Value::String(prev)) => {
                prev.push_str(", ");
                prev.push_str(&text);
            }
            _ => {
                out.insert(name.to_string(), Value::String(text));
            }
        }
    }
    out
}

/// The path and query as logged: a parameter that may hold a credential
/// keeps its name, not its value.
pub fn redact_uri(path_and_query: &str) -> String {
    let Some((path, query)) = path_and_query.split_once('?') else {
        return path_and_query.to_string();
    };
    let params: Vec<String> = crate::query::raw_pieces(query)
        .map(|kv| {
            let name = kv.split('=').next().unwrap_or("");
            if CREDENTIAL_PARAMS
                .iter()
                .any(|c| name.eq_ignore_ascii_case(c))
            {
                format!("{name}=[redacted]")
            } else {
                kv.to_string()
            }
        })
        .collect();
    format!("{path}?{}", params.join("&"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &[u8])]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                http::HeaderValue::from_bytes(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn credentials_and_session_headers_are_dropped() {
        let h = headers(&[
            ("Authorization", b"Bearer sk-1"),
            ("X-Api-Key", b"sk-2"),
            ("Cookie", b"a=b"),
            ("Proxy-Authorization", b"Basic x"),
            ("X-Session-Id", b"raw-session"),
            ("Accept", b"text/event-stream"),
            ("X-Tag", b"a"),
            ("X-Tag", b"b"),
            ("X-Bin", b"\xff\x80"),
        ]);
        let out = redact_headers(&h, |n| n == "x-session-id");
        let text = serde_json::to_string(&out).unwrap();
        for secret in ["sk-1", "sk-2", "a=b", "Basic", "raw-session"] {
            assert!(!text.contains(secret), "{secret} in {text}");
        }
        assert_eq!(out["accept"], "text/event-stream");
        assert_eq!(out["x-tag"], "a, b");
        assert_eq!(out["x-bin"], "base64:/4A=");
        // Control: without the session predicate the header stays.
        assert!(redact_headers(&h, |_| false).contains_key("x-session-id"));
    }

    #[test]
    fn credential_query_parameters_lose_their_values() {
        assert_eq!(redact_uri("/r/v1/x"), "/r/v1/x");
        assert_eq!(
            redact_uri("/r/v1/x?a=1&API_KEY=sk&token=t&b"),
            "/r/v1/x?a=1&API_KEY=[redacted]&token=[redacted]&b"
        );
    }

    #[test]
    fn frame_meta_has_the_timings_and_no_raw_body_in_meta() {
        let started = Instant::now();
        let mut c = Capture::new(RequestSide {
            started,
            wall_start: SystemTime::UNIX_EPOCH + Duration::from_millis(1_500),
            request_id: 1,
            client_ip: Some("127.0.0.1".into()),
            method: "POST".into(),
            uri: "/r/v1/chat/completions".into(),
            req_headers: Map::new(),
            owner: Some("alice".into()),
        });
        c.tee(b"ab", started + Duration::from_millis(5));
        c.tee(b"", started + Duration::from_millis(6));
        c.tee(b"cd", started + Duration::from_millis(9));
        let body = Bytes::from_static(b"{\"x\":1}");
        let frame = c.finish(
            &Outcome {
                route: "r",
                peer: "p",
                model: Some("m"),
                session_hash: Some("00000000000000ab".into()),
                session_src: Some("header:x-session-id"),
                mode: Some("new"),
                status: 200,
                attempts: 1,
                usage: None,
                usage_injected: false,
                req_body: &body,
            },
            started + Duration::from_millis(12),
        );
        let wire = frame.to_vec();
        let parts = super::super::frame::decode(&wire[4..]).unwrap();
        let meta: Value = serde_json::from_slice(parts.meta).unwrap();
        assert_eq!(parts.req, b"{\"x\":1}");
        assert_eq!(parts.resp, b"abcd");
        assert_eq!(meta["chunk_count"], 2);
        assert_eq!(meta["first_chunk_t"], 0.005);
        assert_eq!(meta["last_chunk_t"], 0.009);
        assert_eq!(meta["resp_bytes"], 4);
        assert_eq!(meta["request_id"], "0000000000000001");
        assert_eq!(meta["owner"], "alice");
        assert_eq!(meta["ts"], "1970-01-01T00:00:01.500Z");
        assert_eq!(meta["rt"], 0.012);
        assert_eq!(meta["prompt_tokens"], Value::Null);
    }
}
