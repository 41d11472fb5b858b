//! One engine for a response body, run once per upstream chunk:
//! 1. observe: token usage and the time of the first generated token (on the
//!    engine's raw bytes, before anything changes them);
//! 2. drop the usage frame the gateway asked for on the client's behalf;
//! 3. post-process with the route's handler.
//!
//! Without 2 and 3 the bytes pass untouched. With them, an SSE event goes
//! out with the chunk that completed it (never held for the next one); a
//! JSON body is held once, for rewriting up to `MAX_HELD_JSON_BYTES`, then
//! passes unchanged. The proptests of `postprocess` drive this engine.
//!
//! The answer's API decides how it is read: OpenAI chunks (chat,
//! completions, and any other endpoint) by `observe` and `usage`; Anthropic
//! Messages and OpenAI Responses, whose events are typed, by `typed`. Steps
//! 2 and 3 are OpenAI's only: the typed APIs always report usage (nothing
//! was injected to drop) and the handlers know only OpenAI shapes, so their
//! bytes pass untouched.

use super::observe::{observe_event, ContentHint, StreamStats};
use super::postprocess::{write_event, Handler, MAX_HELD_JSON_BYTES, MAX_PENDING_EVENT_BYTES};
use super::sse::{event_data, SseSplitter};
use super::typed::{Typed, TypedObserver};
use super::usage::{answer_usage, frame_without_usage, is_usage_only_event};
use super::Usage;
use crate::api::Api;
use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use std::time::Instant;

/// A pass-through JSON body larger than this is not inspected for usage.
const MAX_OBSERVED_JSON: usize = 1 << 20;

/// Which kind of body a pipeline is looking at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyKind {
    /// `text/event-stream`: handled event by event.
    Sse,
    /// `application/json`: held whole when rewritten, else passed through.
    Json,
}

/// A JSON body passed through, as far as the usage read needs it. Most
/// answers arrive in one chunk, which is read where it is: a copy is made
/// only once a second chunk comes.
#[derive(Default)]
enum Observed {
    #[default]
    Nothing,
    One(Bytes),
    Joined(Vec<u8>),
    /// Past MAX_OBSERVED_JSON: not read.
    TooLarge,
}

impl Observed {
    fn add(&mut self, chunk: &Bytes) {
        if chunk.is_empty() {
            return;
        }
        *self = match std::mem::take(self) {
            Observed::Nothing if chunk.len() <= MAX_OBSERVED_JSON => Observed::One(chunk.clone()),
            Observed::One(first) if first.len() + chunk.len() <= MAX_OBSERVED_JSON => {
                Observed::Joined([&first[..], &chunk[..]].concat())
            }
            Observed::Joined(mut buf) if buf.len() + chunk.len() <= MAX_OBSERVED_JSON => {
                buf.extend_from_slice(chunk);
                Observed::Joined(buf)
            }
            _ => Observed::TooLarge,
        };
    }

    fn bytes(&self) -> Option<&[u8]> {
        match self {
            Observed::One(b) => Some(b),
            Observed::Joined(b) => Some(b),
            Observed::Nothing | Observed::TooLarge => None,
        }
    }
}

fn starts_with_ignore_case(value: &[u8], prefix: &[u8]) -> bool {
    value
        .get(..prefix.len())
        .is_some_and(|head| head.eq_ignore_ascii_case(prefix))
}

/// How `process` treats a chunk: the body's kind and its API's format,
/// decided once, so a chunk costs one branch as before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    OpenAiSse,
    Json,
    TypedSse,
}

pub struct ResponsePipeline {
    kind: BodyKind,
    mode: Mode,
    /// Messages and Responses answers: what is read of them (`None`: OpenAI).
    typed: Option<TypedObserver>,
    splitter: SseSplitter,
    /// JSON with a rewrite due: the body so far (up to MAX_HELD_JSON_BYTES).
    held: Option<Vec<u8>>,
    /// JSON passed through: what the usage read needs of it.
    observed: Observed,
    /// A cap was passed: stop interpreting, pass bytes through.
    passthrough: bool,
    stats: StreamStats,
    content_hint: ContentHint,
    first_content_at: Option<Instant>,
    last_content_at: Option<Instant>,
    /// Reads the time a content frame is seen; the caller's (`with_clock`),
    /// so the pipeline reads no clock itself. `None`: frames are not timed.
    clock: Option<fn() -> Instant>,
    handler: Option<Handler>,
    drop_usage_frame: bool,
}

impl ResponsePipeline {
    /// A pipeline for 2xx SSE/JSON responses that are not content-encoded
    /// (compressed bytes can be neither read nor rewritten); None otherwise.
    /// `api` is the request's ([`Api::of_path`]): Messages and Responses
    /// answers are read as their typed events and pass untouched, whatever
    /// `handler` and `drop_usage_frame` say (see the module note); any
    /// other, `None` included, is read as OpenAI chunks.
    pub fn for_response(
        status: StatusCode,
        headers: &HeaderMap,
        api: Option<Api>,
        handler: Option<Handler>,
        drop_usage_frame: bool,
    ) -> Option<Self> {
        if !status.is_success() {
            return None;
        }
        let header =
            |name: http::header::HeaderName| headers.get(name).map_or(&b""[..], |v| v.as_bytes());
        let encoding = header(http::header::CONTENT_ENCODING);
        if !(encoding.is_empty() || encoding.eq_ignore_ascii_case(b"identity")) {
            return None;
        }
        let ct = header(http::header::CONTENT_TYPE);
        let kind = if starts_with_ignore_case(ct, b"text/event-stream") {
            BodyKind::Sse
        } else if starts_with_ignore_case(ct, b"application/json") {
            BodyKind::Json
        } else {
            return None;
        };
        Some(Self::for_api(kind, api, handler, drop_usage_frame))
    }

    /// A pipeline for an OpenAI chunk body of `kind`.
    pub fn new(kind: BodyKind, handler: Option<Handler>, drop_usage_frame: bool) -> Self {
        Self::for_api(kind, None, handler, drop_usage_frame)
    }

    /// A pipeline for a body of `kind` answering `api` (as
    /// [`for_response`](Self::for_response) picks its reading).
    pub fn for_api(
        kind: BodyKind,
        api: Option<Api>,
        handler: Option<Handler>,
        drop_usage_frame: bool,
    ) -> Self {
        let typed = Typed::of(api).map(TypedObserver::new);
        let (handler, drop_usage_frame) = match typed {
            Some(_) => (None, false),
            None => (handler, drop_usage_frame),
        };
        let mode = match (kind, &typed) {
            (BodyKind::Json, _) => Mode::Json,
            (BodyKind::Sse, None) => Mode::OpenAiSse,
            (BodyKind::Sse, Some(_)) => Mode::TypedSse,
        };
        ResponsePipeline {
            kind,
            mode,
            typed,
            splitter: SseSplitter::new(),
            held: None,
            observed: Observed::Nothing,
            passthrough: false,
            stats: StreamStats::default(),
            content_hint: ContentHint::default(),
            first_content_at: None,
            last_content_at: None,
            clock: None,
            handler,
            drop_usage_frame: drop_usage_frame && kind == BodyKind::Sse,
        }
    }

    /// Times the first and last content frame with `clock` (the proxy
    /// passes `Instant::now`; TTFT and the decode rate come from them).
    pub fn with_clock(mut self, clock: fn() -> Instant) -> Self {
        self.clock = Some(clock);
        self
    }

    /// Whether the bytes may change, so Content-Length must go.
    pub fn rewrites(&self) -> bool {
        self.handler.is_some() || self.drop_usage_frame
    }

    /// Processes one upstream chunk in place (`None` on a final empty call).
    pub fn process(&mut self, body: &mut Option<Bytes>, end_of_stream: bool) {
        let chunk = body.take().unwrap_or_default();
        *body = if self.passthrough {
            Some(chunk)
        } else {
            match self.mode {
                Mode::OpenAiSse => self.push_sse(chunk, end_of_stream),
                Mode::Json => self.push_json(chunk, end_of_stream),
                Mode::TypedSse => self.push_typed_sse(chunk, end_of_stream),
            }
        };
    }

    /// [`process`](Self::process) for callers holding a slice: the bytes to
    /// send now, possibly empty.
    pub fn push(&mut self, chunk: &[u8], end_of_stream: bool) -> Bytes {
        let mut body = Some(Bytes::copy_from_slice(chunk));
        self.process(&mut body, end_of_stream);
        body.unwrap_or_default()
    }

    fn push_sse(&mut self, chunk: Bytes, end_of_stream: bool) -> Option<Bytes> {
        let rewrites = self.rewrites();
        let (handler, drop_usage) = (self.handler, self.drop_usage_frame);
        let stats = (&mut self.stats, &mut self.content_hint);
        let times = (
            self.clock,
            &mut self.first_content_at,
            &mut self.last_content_at,
        );
        let mut out = Out::default();
        self.splitter.push_events(&chunk, |event| {
            let data = event.data();
            let usage_only = data
                .as_deref()
                .is_some_and(|d| observe(d, stats.0, stats.1, times.0, times.1, times.2));
            if rewrites {
                transform_event(
                    handler,
                    drop_usage,
                    event.bytes,
                    usage_only,
                    &chunk,
                    &mut out,
                );
            }
        });
        let runaway = self.splitter.pending_len() > MAX_PENDING_EVENT_BYTES;
        if end_of_stream || runaway {
            // Not SSE as we understand it: stop interpreting, lose nothing.
            self.passthrough = runaway;
            if let Some(rest) = self.splitter.finish() {
                if rewrites && !runaway {
                    let usage_only = event_data(&rest).is_some_and(|d| is_usage_only_event(&d));
                    transform_event(handler, drop_usage, &rest, usage_only, &chunk, &mut out);
                } else if rewrites {
                    out.built(&chunk).extend_from_slice(&rest);
                }
            }
        }
        if !rewrites {
            Some(chunk)
        } else {
            out.finish(chunk)
        }
    }

    /// A typed-event stream (Messages, Responses): observed event by
    /// event, passed through as it came.
    fn push_typed_sse(&mut self, chunk: Bytes, end_of_stream: bool) -> Option<Bytes> {
        let Some(typed) = self.typed.as_mut() else {
            return Some(chunk);
        };
        let stats = &mut self.stats;
        let times = (
            self.clock,
            &mut self.first_content_at,
            &mut self.last_content_at,
        );
        let mut observe = |event: &[u8]| {
            if typed.event(event, &mut stats.usage) {
                stats.content_events += 1;
                if let Some(clock) = times.0 {
                    let now = clock();
                    times.1.get_or_insert(now);
                    *times.2 = Some(now);
                }
            }
        };
        self.splitter
            .push_events(&chunk, |event| observe(event.bytes));
        let runaway = self.splitter.pending_len() > MAX_PENDING_EVENT_BYTES;
        if end_of_stream || runaway {
            // Not SSE as we understand it: stop interpreting, lose nothing.
            self.passthrough = runaway;
            if let Some(rest) = self.splitter.finish().filter(|_| !runaway) {
                observe(&rest);
            }
        }
        Some(chunk)
    }

    fn push_json(&mut self, chunk: Bytes, end_of_stream: bool) -> Option<Bytes> {
        let Some(handler) = self.handler else {
            self.observed.add(&chunk);
            if end_of_stream {
                let body = self.observed.bytes();
                match self.typed.as_mut() {
                    None => self.stats.usage = body.and_then(answer_usage),
                    Some(typed) => {
                        if let Some(body) = body {
                            typed.answer(body, &mut self.stats.usage);
                        }
                    }
                }
            }
            return Some(chunk);
        };
        let held = self.held.get_or_insert_with(Vec::new);
        held.extend_from_slice(&chunk);
        if held.len() > MAX_HELD_JSON_BYTES {
            self.passthrough = true;
            return self.held.take().map(Bytes::from);
        }
        if !end_of_stream {
            return None;
        }
        self.read_json_usage();
        // Later calls (there should be none) must not resend anything.
        self.passthrough = true;
        let body = self.held.take()?;
        Some(match super::postprocess::rewrite_json(handler, &body) {
            Some(new) => Bytes::from(new),
            None => Bytes::from(body),
        })
    }

    /// The held body's usage (a rewrite reads the engine's bytes, before
    /// they change).
    fn read_json_usage(&mut self) {
        if let Some(buf) = self.held.as_deref().filter(|b| !b.is_empty()) {
            self.stats.usage = answer_usage(buf);
        }
    }

    /// The engine's token counts, in OpenAI's meaning whatever the API
    /// (see `typed` for how Messages and Responses counts map to them).
    pub fn usage(&self) -> Option<Usage> {
        self.stats.usage
    }

    /// The Responses API's response id (the answer's `id`, or the stream's
    /// `response.created` / `response.completed` `response.id`) as
    /// [`stable_hash64`](crate::hash::stable_hash64) of its bytes; the id
    /// itself is not kept past its parse. `None` for every other API.
    pub fn response_id_hash(&self) -> Option<u64> {
        self.typed
            .as_ref()
            .and_then(TypedObserver::response_id_hash)
    }

    pub fn first_content_at(&self) -> Option<Instant> {
        self.first_content_at
    }

    /// When the last content frame arrived (SSE only).
    pub fn last_content_at(&self) -> Option<Instant> {
        self.last_content_at
    }

    /// SSE events that carried generated output.
    pub fn content_events(&self) -> u64 {
        self.stats.content_events
    }

    pub fn is_stream(&self) -> bool {
        self.kind == BodyKind::Sse
    }
}

/// Observes one event's data; true for a usage-only frame.
fn observe(
    data: &[u8],
    stats: &mut StreamStats,
    hint: &mut ContentHint,
    clock: Option<fn() -> Instant>,
    first: &mut Option<Instant>,
    last: &mut Option<Instant>,
) -> bool {
    let before = stats.content_events;
    let usage_only = observe_event(data, stats, hint);
    if let Some(clock) = clock.filter(|_| stats.content_events > before) {
        let now = clock();
        first.get_or_insert(now);
        *last = Some(now);
    }
    usage_only
}

/// What the client gets for one SSE event.
fn transform_event(
    handler: Option<Handler>,
    drop_usage_frame: bool,
    event: &[u8],
    usage_only: bool,
    chunk: &[u8],
    out: &mut Out,
) {
    if drop_usage_frame && usage_only {
        if let Some(rest) = event_data(event).and_then(|d| frame_without_usage(&d)) {
            // What is left is an ordinary frame: post-processed as one.
            let rest = [&b"data: "[..], &rest, b"\n\n"].concat();
            match handler {
                Some(h) => write_event(h, &rest, out.built(chunk)),
                None => out.built(chunk).extend_from_slice(&rest),
            }
        }
        return;
    }
    match handler {
        Some(h) => write_event(h, event, out.built(chunk)),
        None => out.keep(chunk, event),
    }
}

/// The bytes one chunk sends on when events may be dropped or rewritten.
/// While every event kept is an unchanged, contiguous run of the chunk
/// itself (a stream whose only change is the dropped usage frame, chunk
/// after chunk), that run goes out as a slice of the chunk: no copy and no
/// allocation per frame. Anything else (a rewritten event, an event that
/// began in an earlier chunk, a gap left by a dropped one) is built anew.
#[derive(Default)]
struct Out {
    run: Option<(usize, usize)>,
    built: Option<Vec<u8>>,
}

impl Out {
    /// Sends `event` unchanged.
    fn keep(&mut self, chunk: &[u8], event: &[u8]) {
        if self.built.is_none() {
            if let Some(start) = offset_in(chunk, event) {
                match &mut self.run {
                    None => {
                        self.run = Some((start, start + event.len()));
                        return;
                    }
                    Some((_, end)) if *end == start => {
                        *end += event.len();
                        return;
                    }
                    Some(_) => {}
                }
            }
        }
        self.built(chunk).extend_from_slice(event);
    }

    /// The output as bytes of its own (the run so far copied in).
    fn built(&mut self, chunk: &[u8]) -> &mut Vec<u8> {
        let run = &mut self.run;
        self.built.get_or_insert_with(|| match run.take() {
            Some((start, end)) => chunk[start..end].to_vec(),
            None => Vec::new(),
        })
    }

    fn finish(self, chunk: Bytes) -> Option<Bytes> {
        match (self.built, self.run) {
            (Some(built), _) => (!built.is_empty()).then(|| Bytes::from(built)),
            (None, Some((0, end))) if end == chunk.len() => Some(chunk),
            (None, Some((start, end))) => Some(chunk.slice(start..end)),
            (None, None) => None,
        }
    }
}

/// Where `part` starts inside `whole`, if it is a slice of it (the
/// splitter hands out events either from the chunk or from its own buffer).
fn offset_in(whole: &[u8], part: &[u8]) -> Option<usize> {
    let (base, at) = (whole.as_ptr() as usize, part.as_ptr() as usize);
    (at >= base && at + part.len() <= base + whole.len()).then(|| at - base)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(ct: &str) -> (StatusCode, HeaderMap) {
        let mut h = HeaderMap::new();
        h.insert("content-type", ct.parse().unwrap());
        (StatusCode::OK, h)
    }

    fn pipeline(
        (status, headers): (StatusCode, HeaderMap),
        handler: Option<Handler>,
        drop_usage_frame: bool,
    ) -> Option<ResponsePipeline> {
        ResponsePipeline::for_response(status, &headers, None, handler, drop_usage_frame)
            .map(|p| p.with_clock(Instant::now))
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
        let mut p = pipeline(header("text/event-stream"), None, false).unwrap();
        assert!(!p.rewrites());
        let stream = format!("{CONTENT}{USAGE}data: [DONE]\n\n");
        let (a, b) = stream.split_at(17);
        assert_eq!(run(&mut p, &[a, b]), stream);
        assert_eq!(p.usage().unwrap().prompt_tokens, 7);
        assert!(p.first_content_at().is_some());
    }

    #[test]
    fn injected_usage_frame_is_counted_then_dropped() {
        let mut p = pipeline(header("text/event-stream"), None, true).unwrap();
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

    /// llama.cpp puts its `timings` in the frame that carries the usage
    /// once usage is asked for; without the gateway's ask the client gets
    /// them in the last content frame, so they stay, the usage goes. The
    /// control is the test above: a frame of usage alone goes whole.
    #[test]
    fn what_the_engine_added_to_the_injected_usage_frame_reaches_the_client() {
        let llamacpp_usage = concat!(
            "data: {\"choices\":[],\"created\":1796335948,\"id\":\"chatcmpl-Q\",",
            "\"model\":\"tiny.gguf\",\"object\":\"chat.completion.chunk\",",
            "\"usage\":{\"completion_tokens\":5,\"prompt_tokens\":30,\"total_tokens\":35},",
            "\"timings\":{\"cache_n\":0,\"prompt_n\":30}}\n\n"
        );
        let mut p = pipeline(header("text/event-stream"), None, true).unwrap();
        let out = run(&mut p, &[CONTENT, llamacpp_usage, "data: [DONE]\n\n"]);
        let expected = concat!(
            "data: {\"choices\":[],\"created\":1796335948,\"id\":\"chatcmpl-Q\",",
            "\"model\":\"tiny.gguf\",\"object\":\"chat.completion.chunk\",",
            "\"timings\":{\"cache_n\":0,\"prompt_n\":30}}\n\n"
        );
        assert_eq!(out, format!("{CONTENT}{expected}data: [DONE]\n\n"));
        assert_eq!(p.usage().unwrap().prompt_tokens, 30, "the gateway read it");
        // Without the injection the frame is the client's, untouched.
        let mut p = pipeline(header("text/event-stream"), None, false).unwrap();
        let out = run(&mut p, &[CONTENT, llamacpp_usage]);
        assert_eq!(out, format!("{CONTENT}{llamacpp_usage}"));
    }

    /// Dropping the injected usage frame costs no copy where nothing is
    /// dropped: the chunk itself (or a slice of it) goes out.
    #[test]
    fn kept_events_go_out_as_the_chunk_itself() {
        let mut p = pipeline(header("text/event-stream"), None, true).unwrap();
        let send = |p: &mut ResponsePipeline, text: String, end: bool| {
            let chunk = Bytes::from(text);
            let mut body = Some(chunk.clone());
            p.process(&mut body, end);
            (chunk, body)
        };
        let (chunk, out) = send(&mut p, format!("{CONTENT}{CONTENT}"), false);
        let out = out.unwrap();
        assert_eq!(out, chunk);
        assert_eq!(out.as_ptr(), chunk.as_ptr(), "the same bytes, not a copy");
        // Usage last in the chunk: the events before it, as a slice.
        let (chunk, out) = send(&mut p, format!("{CONTENT}{USAGE}"), false);
        let out = out.unwrap();
        assert_eq!(out, CONTENT.as_bytes());
        assert_eq!(out.as_ptr(), chunk.as_ptr());
        // Usage first: what follows it, as a slice.
        let (chunk, out) = send(&mut p, format!("{USAGE}data: [DONE]\n\n"), false);
        let out = out.unwrap();
        assert_eq!(out, &b"data: [DONE]\n\n"[..]);
        assert_eq!(out.as_ptr(), chunk[USAGE.len()..].as_ptr());
        // A gap in the middle: built anew, in order.
        let (_, out) = send(&mut p, format!("{CONTENT}{USAGE}{CONTENT}"), false);
        assert_eq!(out.unwrap(), format!("{CONTENT}{CONTENT}").as_bytes());
        // Only the usage frame: nothing to send.
        let (_, out) = send(&mut p, USAGE.to_string(), false);
        assert_eq!(out, None);
        // An event begun in an earlier chunk, then one of this chunk.
        let (_, out) = send(&mut p, CONTENT[..9].to_string(), false);
        assert_eq!(out, None);
        let (_, out) = send(&mut p, format!("{}{CONTENT}", &CONTENT[9..]), true);
        assert_eq!(out.unwrap(), format!("{CONTENT}{CONTENT}").as_bytes());
        assert_eq!(p.usage().unwrap().prompt_tokens, 7);
    }

    #[test]
    fn handler_rewrites_events_and_sees_raw_usage() {
        let mut p = pipeline(
            header("text/event-stream"),
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
        let mut p = pipeline(
            header("application/json"),
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

    /// A passed-through answer's usage is read however it is chunked, the
    /// bytes go out untouched, and one past the observation cap is not read.
    #[test]
    fn json_usage_is_read_in_one_chunk_or_many() {
        let body = "{\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":2}}";
        for cuts in [vec![], vec![10], vec![5, 30], vec![1, 2, 3, 40]] {
            let mut p = pipeline(header("application/json"), None, false).unwrap();
            let mut parts = Vec::new();
            let mut from = 0;
            for cut in cuts.iter().copied().chain([body.len()]) {
                parts.push(&body[from..cut]);
                from = cut;
            }
            assert_eq!(run(&mut p, &parts), body, "{cuts:?}");
            assert_eq!(p.usage().map(|u| u.prompt_tokens), Some(7), "{cuts:?}");
        }
        let mut big = pipeline(header("Application/JSON; charset=utf-8"), None, false).unwrap();
        let padding = " ".repeat(MAX_OBSERVED_JSON);
        run(&mut big, &[&padding, body]);
        assert_eq!(big.usage(), None);
        // Control: the same padding within the cap is read.
        let mut fits = pipeline(header("application/json"), None, false).unwrap();
        run(&mut fits, &[&padding[..1000], body]);
        assert_eq!(fits.usage().map(|u| u.prompt_tokens), Some(7));
    }

    #[test]
    fn errors_and_compressed_bodies_are_left_alone() {
        let (_, json) = header("application/json");
        let err = (StatusCode::INTERNAL_SERVER_ERROR, json);
        assert!(pipeline(err, Some(Handler::VllmFormat), false).is_none());
        let (ok, mut gz) = header("text/event-stream");
        gz.insert("content-encoding", "gzip".parse().unwrap());
        assert!(pipeline((ok, gz), Some(Handler::VllmFormat), true).is_none());
        assert!(pipeline(header("text/plain"), None, false).is_none());
    }
}
