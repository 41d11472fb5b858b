//! One access-log line: what a finished request was, as one JSON object
//! on one line. Pure: the proxy fills it from the request's context
//! (`proxy/response/access.rs`), this turns it into bytes.

use serde::Serialize;

/// The fields of a line, in the order they are written. `None` fields are
/// written as `null`, so every line has every key.
#[derive(Debug, Serialize)]
pub struct Line<'a> {
    /// When the request finished, RFC 3339 in UTC with milliseconds.
    pub time: String,
    pub request_id: &'a str,
    /// The W3C trace id (32 hex digits); `null` with `trace_context: off`
    /// or `continue` and no incoming trace.
    pub trace_id: Option<String>,
    pub method: &'a str,
    /// The path as the client sent it, without the query string (which
    /// may carry a key).
    pub path: std::borrow::Cow<'a, str>,
    pub route: Option<&'a str>,
    /// The status the client got; 0 when nothing was answered (the client
    /// went away first).
    pub status: u16,
    /// The peer's name, as in the metrics' `peer` label.
    pub peer: Option<&'a str>,
    /// The peer's address, `host:port`.
    pub peer_addr: Option<String>,
    /// `X-Routed-Mode`: the placement's kind, or `local` for an answer the
    /// gateway gave itself.
    pub mode: &'a str,
    /// Why placement chose as it did, as the placements metric's `reason`.
    pub reason: Option<&'a str>,
    /// The session's hash, as `X-Routed-Session` shows it; never the id.
    pub session: Option<String>,
    pub session_source: Option<&'a str>,
    /// The API key's owner, when keys are enforced; never the key.
    pub owner: Option<String>,
    pub model: Option<&'a str>,
    pub prompt_tokens: Option<u64>,
    pub cached_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
    /// From the request's arrival to its first content frame.
    pub ttft_ms: Option<f64>,
    /// From the request's arrival to its end.
    pub duration_ms: f64,
    /// Time in the route's admission queue, when it waited there.
    pub queue_ms: Option<f64>,
    /// Response body bytes written to the client.
    pub bytes_out: usize,
    /// Upstream attempts after the first.
    pub retries: u32,
    /// The error type of an answer the gateway gave itself (`errors.rs`),
    /// `stream_cut` for a stream cut after its head, `client_gone`.
    pub error: Option<&'a str>,
}

impl Line<'_> {
    /// The line as written: JSON and a newline.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(512);
        // A struct of strings and numbers: serializing it cannot fail.
        if serde_json::to_writer(&mut out, self).is_err() {
            out.clear();
            out.extend_from_slice(b"{}");
        }
        out.push(b'\n');
        out
    }
}

/// `d` in milliseconds, to the microsecond.
pub fn millis(d: std::time::Duration) -> f64 {
    (d.as_micros() as f64) / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_is_one_json_object_with_every_key() {
        let line = Line {
            time: "2026-01-02T03:04:05.678Z".into(),
            request_id: "r\"1",
            trace_id: None,
            method: "POST",
            path: "/chat/v1/chat/completions\n".into(),
            route: Some("chat"),
            status: 200,
            peer: None,
            peer_addr: None,
            mode: "local",
            reason: None,
            session: Some("00000000000000ff".into()),
            session_source: None,
            owner: None,
            model: None,
            prompt_tokens: Some(3),
            cached_tokens: None,
            completion_tokens: None,
            ttft_ms: None,
            duration_ms: 1.5,
            queue_ms: None,
            bytes_out: 10,
            retries: 0,
            error: None,
        };
        let bytes = line.to_bytes();
        assert_eq!(bytes.iter().filter(|&&b| b == b'\n').count(), 1, "one line");
        let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(v["request_id"], "r\"1");
        assert_eq!(v["path"], "/chat/v1/chat/completions\n");
        assert!(v["trace_id"].is_null() && v.as_object().unwrap().contains_key("trace_id"));
        assert_eq!(v.as_object().unwrap().len(), 24);
    }

    #[test]
    fn millis_keep_microseconds() {
        assert_eq!(
            millis(std::time::Duration::from_micros(1_234_567)),
            1234.567
        );
    }
}
