//! Watching a response on its way to the client: token usage (from the
//! stream's usage frame or a JSON body's `usage`) and the time of the first
//! generated token. Observation never changes or holds the bytes.

use crate::sse::{event_data, observe_event, SseSplitter, StreamStats};
use crate::usage::{parse_usage_bytes, Usage};
use pingora::http::ResponseHeader;
use std::time::Instant;

/// A non-stream JSON body larger than this is not inspected for usage.
const MAX_OBSERVED_JSON: usize = 1 << 20;

enum Body {
    Sse(SseSplitter),
    Json(Vec<u8>),
}

pub struct ResponseObserver {
    body: Body,
    stats: StreamStats,
    first_content_at: Option<Instant>,
}

impl ResponseObserver {
    /// Observes 2xx SSE and JSON responses; anything else is not worth a look.
    pub fn for_response(resp: &ResponseHeader) -> Option<Self> {
        if !resp.status.is_success() {
            return None;
        }
        let ct = resp
            .headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_ascii_lowercase();
        let body = if ct.starts_with("text/event-stream") {
            Body::Sse(SseSplitter::new())
        } else if ct.starts_with("application/json") {
            Body::Json(Vec::new())
        } else {
            return None;
        };
        Some(ResponseObserver {
            body,
            stats: StreamStats::default(),
            first_content_at: None,
        })
    }

    pub fn observe(&mut self, chunk: &[u8]) {
        match &mut self.body {
            Body::Sse(splitter) => {
                let stats = &mut self.stats;
                let first = &mut self.first_content_at;
                splitter.push(chunk, |event| {
                    if let Some(data) = event_data(event) {
                        let before = stats.content_events;
                        observe_event(&data, stats);
                        if first.is_none() && stats.content_events > before {
                            *first = Some(Instant::now());
                        }
                    }
                });
            }
            Body::Json(buf) => {
                if buf.len() + chunk.len() <= MAX_OBSERVED_JSON {
                    buf.extend_from_slice(chunk);
                } else {
                    // Too big to be worth parsing: stop collecting.
                    self.body = Body::Json(Vec::new());
                    self.stats.usage = None;
                }
            }
        }
    }

    pub fn finish(&mut self) {
        if let Body::Json(buf) = &self.body {
            if !buf.is_empty() {
                self.stats.usage = parse_usage_bytes(buf);
            }
        }
    }

    pub fn usage(&self) -> Option<Usage> {
        self.stats.usage
    }

    pub fn first_content_at(&self) -> Option<Instant> {
        self.first_content_at
    }
}
