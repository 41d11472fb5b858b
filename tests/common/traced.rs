//! What the request-id, access-log and tracing tests share: a canned
//! engine answering a short SSE stream with usage, a streamed chat through
//! the gateway, a client trace to continue, reading the heads the engine
//! got, and a key file.

use super::canned::Canned;
use super::http::{self, Conn};
use super::Gateway;
use std::path::Path;

pub const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
pub const CLIENT_SPAN: &str = "00f067aa0ba902b7";
pub const SSE: &str = concat!(
    "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"},\"finish_reason\":null}]}\n\n",
    "data: {\"id\":\"c1\",\"choices\":[],\"usage\":{\"prompt_tokens\":11,\"completion_tokens\":1,\"prompt_tokens_details\":{\"cached_tokens\":3}}}\n\n",
    "data: [DONE]\n\n",
);

pub fn sse_engine() -> Canned {
    Canned::start("text/event-stream", vec![SSE.as_bytes().to_vec()], true)
}

/// A streamed chat to `path`, answered 200.
pub fn chat(gw: &Gateway, path: &str, headers: &[(&str, &str)]) -> http::Response {
    let body = br#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    let mut all = vec![("Content-Type", "application/json")];
    all.extend_from_slice(headers);
    let r = Conn::open(gw.addr).request("POST", path, &all, body);
    assert_eq!(r.status(), 200, "{}", r.text());
    r
}

/// The value of header `name` in a raw request head, as the engine got it.
pub fn header_of(head: &str, name: &str) -> Option<String> {
    head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim()
            .eq_ignore_ascii_case(name)
            .then(|| v.trim().to_string())
    })
}

/// `traceparent`'s four fields, checked for the version-00 layout.
pub fn traceparent_fields(traceparent: &str) -> [String; 4] {
    let parts: Vec<&str> = traceparent.split('-').collect();
    assert_eq!(parts.len(), 4, "{traceparent}");
    let hex = |s: &str, n: usize| {
        s.len() == n
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    assert!(
        parts[0] == "00" && hex(parts[1], 32) && hex(parts[2], 16) && hex(parts[3], 2),
        "{traceparent}"
    );
    assert!(
        parts[1] != "0".repeat(32) && parts[2] != "0".repeat(16),
        "{traceparent}"
    );
    let owned: Vec<String> = parts.iter().map(|p| p.to_string()).collect();
    owned.try_into().expect("four")
}

/// A key file with one key, `sk-test-1`, owned by `alice`, in `dir`, and
/// the environment that points the gateway at it.
pub fn keys_env(dir: &Path) -> Vec<(String, String)> {
    let path = dir.join("api-keys");
    std::fs::write(&path, "sk-test-1:alice\n").expect("key file");
    vec![(
        "LLM_GATEWAY_API_KEYS_FILE".into(),
        path.display().to_string(),
    )]
}
