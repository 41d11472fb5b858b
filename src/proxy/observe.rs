//! The response on its way to the client, one pass per SSE event:
//! 1. observe: token usage and the time of the first generated token (on the
//!    engine's raw bytes, before anything changes them);
//! 2. drop the usage frame the gateway asked for on the client's behalf;
//! 3. post-process with the route's handler.
//!
//! Without 2 and 3 the bytes pass untouched. With them, an event goes out with
//! the chunk that completed it (never held for the next one); a JSON body is
//! held for rewriting up to `MAX_HELD_JSON_BYTES`, then passes unchanged.

use crate::postprocess::{
    rewrite_sse_event, BodyKind, Handler, ResponseRewriter, MAX_PENDING_EVENT_BYTES,
};
use crate::sse::{event_data, observe_event, SseSplitter, StreamStats};
use crate::usage::{is_usage_only_event, parse_usage_bytes, Usage};
use bytes::Bytes;
use pingora::http::ResponseHeader;
use std::time::Instant;

/// A non-stream JSON body larger than this is not inspected for usage.
const MAX_OBSERVED_JSON: usize = 1 << 20;

enum Body {
    Sse {
        splitter: SseSplitter,
        /// An event outgrew the cap: stop interpreting, pass bytes through.
        passthrough: bool,
    },
    Json {
        /// Raw body for usage, until it outgrows MAX_OBSERVED_JSON.
        observed: Option<Vec<u8>>,
        rewriter: Option<ResponseRewriter>,
    },
}

pub struct ResponsePipeline {
    body: Body,
    stats: StreamStats,
    first_content_at: Option<Instant>,
    handler: Option<Handler>,
    drop_usage_frame: bool,
}

/// What the client gets for one SSE event.
fn transform_event(
    handler: Option<Handler>,
    drop_usage_frame: bool,
    event: &[u8],
    data: Option<&[u8]>,
    out: &mut Vec<u8>,
) {
    if drop_usage_frame && data.is_some_and(is_usage_only_event) {
        return;
    }
    match handler.and_then(|h| rewrite_sse_event(h, event)) {
        Some(rewritten) => out.extend_from_slice(&rewritten),
        None => out.extend_from_slice(event),
    }
}

impl ResponsePipeline {
    /// A pipeline for 2xx SSE/JSON responses that are not content-encoded
    /// (compressed bytes can be neither read nor rewritten); None otherwise.
    pub fn for_response(
        resp: &ResponseHeader,
        handler: Option<Handler>,
        drop_usage_frame: bool,
    ) -> Option<Self> {
        if !resp.status.is_success() {
            return None;
        }
        let header = |name: http::header::HeaderName| {
            resp.headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_ascii_lowercase()
        };
        let encoding = header(http::header::CONTENT_ENCODING);
        if !(encoding.is_empty() || encoding == "identity") {
            return None;
        }
        let ct = header(http::header::CONTENT_TYPE);
        let body = if ct.starts_with("text/event-stream") {
            Body::Sse {
                splitter: SseSplitter::new(),
                passthrough: false,
            }
        } else if ct.starts_with("application/json") {
            Body::Json {
                observed: Some(Vec::new()),
                rewriter: handler.map(|h| ResponseRewriter::new(h, BodyKind::Json)),
            }
        } else {
            return None;
        };
        let drop_usage_frame = drop_usage_frame && matches!(body, Body::Sse { .. });
        Some(ResponsePipeline {
            body,
            stats: StreamStats::default(),
            first_content_at: None,
            handler,
            drop_usage_frame,
        })
    }

    /// Whether the bytes may change, so Content-Length must go.
    pub fn rewrites(&self) -> bool {
        self.handler.is_some() || self.drop_usage_frame
    }

    /// Processes one upstream chunk in place.
    pub fn process(&mut self, body: &mut Option<Bytes>, end_of_stream: bool) {
        let rewrites = self.rewrites();
        let chunk = body.take().unwrap_or_default();
        let (handler, drop_usage) = (self.handler, self.drop_usage_frame);
        let stats = &mut self.stats;
        let first = &mut self.first_content_at;
        let mut observe = |data: &[u8]| {
            let before = stats.content_events;
            observe_event(data, stats);
            if first.is_none() && stats.content_events > before {
                *first = Some(Instant::now());
            }
        };
        match &mut self.body {
            Body::Sse {
                passthrough: true, ..
            } => *body = Some(chunk),
            Body::Sse {
                splitter,
                passthrough,
            } => {
                let mut out = Vec::new();
                splitter.push(&chunk, |event| {
                    let data = event_data(event);
                    if let Some(d) = data.as_deref() {
                        observe(d);
                    }
                    if rewrites {
                        transform_event(handler, drop_usage, event, data.as_deref(), &mut out);
                    }
                });
                if end_of_stream || splitter.pending_len() > MAX_PENDING_EVENT_BYTES {
                    if splitter.pending_len() > MAX_PENDING_EVENT_BYTES {
                        *passthrough = true;
                    }
                    if let Some(rest) = splitter.finish() {
                        if rewrites && !*passthrough {
                            let data = event_data(&rest);
                            transform_event(handler, drop_usage, &rest, data.as_deref(), &mut out);
                        } else if rewrites {
                            out.extend_from_slice(&rest);
                        }
                    }
                }
                *body = if !rewrites {
                    Some(chunk)
                } else if out.is_empty() {
                    None
                } else {
                    Some(Bytes::from(out))
                };
            }
            Body::Json { observed, rewriter } => {
                if let Some(buf) = observed {
                    if buf.len() + chunk.len() <= MAX_OBSERVED_JSON {
                        buf.extend_from_slice(&chunk);
                    } else {
                        *observed = None;
                    }
                }
                if end_of_stream {
                    if let Some(buf) = observed.as_deref().filter(|b| !b.is_empty()) {
                        stats.usage = parse_usage_bytes(buf);
                    }
                }
                *body = match rewriter {
                    Some(r) => {
                        let out = r.push(Some(&chunk), end_of_stream);
                        (!out.is_empty()).then_some(out)
                    }
                    None => Some(chunk),
                };
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

#[cfg(test)]
mod tests {
    use super::*;

    fn header(ct: &str) -> ResponseHeader {
        let mut h = ResponseHeader::build(200, None).unwrap();
        h.insert_header("content-type", ct).unwrap();
        h
    }

    fn run(p: &mut ResponsePipeline, chunks: &[&str]) -> String {
        let mut out = String::new();
        for (i, c) in chunks.iter().enumerate() {
            let mut b = Some(Bytes::copy_from_slice(c.as_bytes()));
            p.process(&mut b, i + 1 == chunks.len());
            if let Some(b) = b {
                out.push_str(std::str::from_utf8(&b).unwrap());
            }
        }
        out
    }

    const CONTENT: &str =
        "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}],\"system_fingerprint\":\"x\"}\n\n";
    const USAGE: &str =
        "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":1}}\n\n";

    #[test]
    fn observe_only_passes_bytes_untouched() {
        let mut p =
            ResponsePipeline::for_response(&header("text/event-stream"), None, false).unwrap();
        assert!(!p.rewrites());
        let stream = format!("{CONTENT}{USAGE}data: [DONE]\n\n");
        let (a, b) = stream.split_at(17);
        assert_eq!(run(&mut p, &[a, b]), stream);
        assert_eq!(p.usage().unwrap().prompt_tokens, 7);
        assert!(p.first_content_at().is_some());
    }

    #[test]
    fn injected_usage_frame_is_counted_then_dropped() {
        let mut p =
            ResponsePipeline::for_response(&header("text/event-stream"), None, true).unwrap();
        let out = run(
            &mut p,
            &[CONTENT, &USAGE[..10], &USAGE[10..], "data: [DONE]\n\n"],
        );
        assert_eq!(out, format!("{CONTENT}data: [DONE]\n\n"));
        assert_eq!(
            p.usage().unwrap().prompt_tokens,
            7,
            "the gateway still saw it"
        );
    }

    #[test]
    fn handler_rewrites_events_and_sees_raw_usage() {
        let mut p = ResponsePipeline::for_response(
            &header("text/event-stream"),
            Some(Handler::VllmFormat),
            false,
        )
        .unwrap();
        let out = run(&mut p, &[CONTENT, USAGE]);
        assert!(!out.contains("system_fingerprint"), "{out}");
        assert!(out.contains("\"usage\""));
        assert_eq!(p.usage().unwrap().completion_tokens, 1);
    }

    #[test]
    fn json_body_is_rewritten_and_usage_read() {
        let mut p = ResponsePipeline::for_response(
            &header("application/json"),
            Some(Handler::StripActualUsage),
            false,
        )
        .unwrap();
        let body = "{\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2},\"actual_usage\":{}}";
        let out = run(&mut p, &[&body[..20], &body[20..]]);
        assert_eq!(
            out,
            "{\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2}}"
        );
        assert_eq!(p.usage().unwrap().prompt_tokens, 3);
    }

    #[test]
    fn errors_and_compressed_bodies_are_left_alone() {
        let mut err = header("application/json");
        err.set_status(500).unwrap();
        assert!(ResponsePipeline::for_response(&err, Some(Handler::VllmFormat), false).is_none());
        let mut gz = header("text/event-stream");
        gz.insert_header("content-encoding", "gzip").unwrap();
        assert!(ResponsePipeline::for_response(&gz, Some(Handler::VllmFormat), true).is_none());
        assert!(ResponsePipeline::for_response(&header("text/plain"), None, false).is_none());
    }
}
