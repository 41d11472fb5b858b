//! The bench's streaming request: a POST on a keep-alive connection (the
//! one HTTP client, `llm_gateway_sim::client`) whose SSE frames are timed as
//! they arrive.
//!
//! [`StreamTimer`] is pure and unit-tested; the bench deliberately does not
//! reuse the gateway's own SSE code, so a framing bug there cannot hide
//! itself here.

use std::time::Duration;

use memchr::memmem;
use serde_json::Value;
use tokio::time::Instant;

pub use llm_gateway_sim::client::nonblocking::{get, Conn};
use llm_gateway_sim::client::Head;

/// Token counts from a stream's usage frame.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub cached_tokens: u64,
}

/// Splits an SSE body into events and times the content frames. Times are
/// offsets from the request start, stamped when the bytes were read.
#[derive(Debug, Default)]
pub struct StreamTimer {
    pending: Vec<u8>,
    pub first_content: Option<Duration>,
    pub last_content: Option<Duration>,
    pub content_frames: u64,
    /// The streamed text, which the session appends to its history.
    pub content: String,
    pub usage: Option<Usage>,
    /// The first frame's `id`: the simulated engine names itself there
    /// (`chatcmpl-sim<port>-<n>`), which tells a router cell's engine.
    pub id: Option<String>,
    pub done: bool,
    /// An `error` object in the stream, or a frame that is not JSON.
    pub error: Option<String>,
}

impl StreamTimer {
    pub fn feed(&mut self, data: &[u8], at: Duration) {
        self.pending.extend_from_slice(data);
        loop {
            // Events end at a blank line; accept \n\n and \r\n\r\n.
            let lf = memmem::find(&self.pending, b"\n\n").map(|i| (i, 2));
            let crlf = memmem::find(&self.pending, b"\r\n\r\n").map(|i| (i, 4));
            let Some((end, sep)) = [lf, crlf].into_iter().flatten().min_by_key(|(i, _)| *i) else {
                return;
            };
            let event: Vec<u8> = self.pending.drain(..end + sep).collect();
            self.event(&event[..end], at);
        }
    }

    fn event(&mut self, event: &[u8], at: Duration) {
        let text = String::from_utf8_lossy(event);
        let mut data = String::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("data:") {
                if !data.is_empty() {
                    data.push('\n');
                }
                data.push_str(rest.strip_prefix(' ').unwrap_or(rest));
            }
        }
        if data.is_empty() {
            return;
        }
        if data.trim() == "[DONE]" {
            self.done = true;
            return;
        }
        let v: Value = match serde_json::from_str(&data) {
            Ok(v) => v,
            Err(e) => {
                self.error
                    .get_or_insert_with(|| format!("SSE frame is not JSON: {e}"));
                return;
            }
        };
        if self.id.is_none() {
            self.id = v.get("id").and_then(Value::as_str).map(str::to_string);
        }
        if let Some(err) = v.get("error").filter(|e| !e.is_null()) {
            self.error
                .get_or_insert_with(|| format!("error in stream: {err}"));
            return;
        }
        let content = v
            .pointer("/choices/0/delta/content")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty());
        if let Some(content) = content {
            self.content.push_str(content);
            self.content_frames += 1;
            self.first_content.get_or_insert(at);
            self.last_content = Some(at);
        }
        if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
            let n = |p: &str| u.pointer(p).and_then(Value::as_u64).unwrap_or(0);
            self.usage = Some(Usage {
                prompt_tokens: n("/prompt_tokens"),
                completion_tokens: n("/completion_tokens"),
                cached_tokens: n("/prompt_tokens_details/cached_tokens"),
            });
        }
    }

    /// Decode speed: tokens after the first over the time from first to last
    /// content frame. None with fewer than two frames or no time between them.
    pub fn decode_tok_per_s(&self) -> Option<f64> {
        let tokens = self
            .usage
            .map_or(self.content_frames, |u| u.completion_tokens);
        let span = self.last_content?.checked_sub(self.first_content?)?;
        if tokens < 2 || span.is_zero() {
            return None;
        }
        Some((tokens - 1) as f64 / span.as_secs_f64())
    }
}

/// How one streaming request went.
#[derive(Debug)]
pub struct Exchange {
    pub status: u16,
    pub head: Option<Head>,
    pub timer: StreamTimer,
    /// Set for a non-200 answer, a broken stream or a transport failure.
    pub error: Option<String>,
    /// Time from request start to the end of the response.
    pub elapsed: Duration,
}

/// Sends a POST on `conn` and reads the response, timing SSE frames from
/// `start`. Returns whether the connection can carry another request.
pub async fn post_stream(
    conn: &mut Conn,
    host: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    start: Instant,
) -> (Exchange, bool) {
    let mut ex = Exchange {
        status: 0,
        head: None,
        timer: StreamTimer::default(),
        error: None,
        elapsed: Duration::ZERO,
    };
    let exchange = async {
        let mut all = vec![
            ("host", host),
            ("content-type", "application/json"),
            ("accept", "text/event-stream"),
        ];
        all.extend_from_slice(headers);
        conn.send("POST", path, &all, body).await?;

        let head = conn.read_head().await?;
        ex.status = head.status;
        ex.head = Some(head.clone());
        let chunked = head.chunked();
        let framed = chunked || head.content_length().is_some();
        let close = head.close();
        if ex.status != 200 {
            let body = conn.read_body(&head).await?;
            let snippet = String::from_utf8_lossy(&body[..body.len().min(300)]).into_owned();
            ex.error = Some(format!("status {}: {snippet}", ex.status));
            return Ok(!close && framed);
        }
        if !chunked {
            // Pingora re-frames streams as chunked; anything else is read
            // whole, timed as it comes.
            let body = conn.read_body(&head).await?;
            ex.timer.feed(&body, start.elapsed());
        } else {
            let timer = &mut ex.timer;
            conn.read_chunked(|data| timer.feed(data, start.elapsed()))
                .await?;
        }
        if let Some(e) = ex.timer.error.clone() {
            ex.error = Some(e);
        } else if !ex.timer.done {
            ex.error = Some("stream ended without [DONE]".into());
        } else if ex.timer.usage.is_none() {
            ex.error = Some("stream had no usage frame".into());
        } else if ex.timer.first_content.is_none() {
            ex.error = Some("stream had no content".into());
        }
        Ok::<bool, String>(!close && framed)
    };
    let reusable = match exchange.await {
        Ok(reusable) => reusable,
        Err(e) => {
            ex.error.get_or_insert(e);
            false
        }
    };
    ex.elapsed = start.elapsed();
    (ex, reusable)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn content(text: &str) -> String {
        format!(
            "data: {{\"id\":\"x\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{text}\"}},\"finish_reason\":null}}]}}\n\n"
        )
    }

    const USAGE: &str = "data: {\"id\":\"x\",\"choices\":[],\"usage\":{\"prompt_tokens\":100,\"completion_tokens\":3,\"total_tokens\":103,\"prompt_tokens_details\":{\"cached_tokens\":64}}}\n\n";

    #[test]
    fn timer_stamps_first_and_last_content_frames() {
        let mut t = StreamTimer::default();
        // A role-only frame is not content.
        t.feed(
            b"data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"}}]}\n\n",
            ms(5),
        );
        assert_eq!(t.first_content, None);
        assert_eq!(t.id, None);
        t.feed(content("tok ").as_bytes(), ms(100));
        assert_eq!(t.id.as_deref(), Some("x"));
        t.feed(content("tok ").as_bytes(), ms(150));
        t.feed(content("tok ").as_bytes(), ms(300));
        t.feed(USAGE.as_bytes(), ms(301));
        t.feed(b"data: [DONE]\n\n", ms(302));
        assert_eq!(t.first_content, Some(ms(100)));
        assert_eq!(t.last_content, Some(ms(300)));
        assert_eq!(t.content, "tok tok tok ");
        assert_eq!(
            t.usage,
            Some(Usage {
                prompt_tokens: 100,
                completion_tokens: 3,
                cached_tokens: 64
            })
        );
        assert!(t.done && t.error.is_none());
        // Two tokens after the first, over 200 ms.
        assert!((t.decode_tok_per_s().unwrap() - 10.0).abs() < 1e-9);
    }

    #[test]
    fn timer_reassembles_events_split_anywhere_and_crlf() {
        let whole = format!(
            "{}{}{}data: [DONE]\r\n\r\n",
            content("a"),
            content("b"),
            USAGE.replace("\n\n", "\r\n\r\n")
        );
        for cut in 0..whole.len() {
            let mut t = StreamTimer::default();
            t.feed(&whole.as_bytes()[..cut], ms(1));
            t.feed(&whole.as_bytes()[cut..], ms(2));
            assert_eq!(t.content, "ab", "cut at {cut}");
            assert_eq!(t.content_frames, 2);
            assert!(t.done, "cut at {cut}");
            assert_eq!(t.usage.map(|u| u.cached_tokens), Some(64));
            // The first frame is stamped when its last byte arrived.
            let first_end = content("a").len();
            let expect = if cut >= first_end { ms(1) } else { ms(2) };
            assert_eq!(t.first_content, Some(expect), "cut at {cut}");
        }
    }

    #[test]
    fn timer_reports_errors_and_garbage() {
        let mut t = StreamTimer::default();
        t.feed(b"data: {\"error\":{\"message\":\"boom\"}}\n\n", ms(1));
        assert!(t.error.as_deref().unwrap().contains("boom"));
        let mut t = StreamTimer::default();
        t.feed(b": comment\n\ndata: not json\n\n", ms(1));
        assert!(t.error.as_deref().unwrap().contains("not JSON"));
        assert_eq!(t.decode_tok_per_s(), None);
    }
}
