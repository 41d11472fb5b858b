//! The APIs whose streams are typed events: Anthropic Messages
//! (`/v1/messages`) and OpenAI Responses (`/v1/responses`). What the
//! gateway reads of them, without changing a byte: token usage, which
//! events carry generated output (the first token's time, the decode
//! rate), and for Responses the response's id, kept only as its hash.
//!
//! Each event names its type twice, on its `event:` line and in its data's
//! `type` member. The line is read when there is one (no walk of the data);
//! without it, the data's top-level `type`. Only the few events that carry
//! usage or an id are parsed (about three a stream), with serde into the
//! members read; a content delta is judged by a key scan, as OpenAI chunks
//! are (`observe`). An event that does not parse is skipped: it counts no
//! token and changes no count.
//!
//! Usage, as [`Usage`] holds it (OpenAI's meaning):
//! - Anthropic: `input_tokens` leaves out the tokens read from or written
//!   to the prompt cache, so the prompt is `input_tokens +
//!   cache_read_input_tokens + cache_creation_input_tokens`, the cached part
//!   `cache_read_input_tokens`, the completion `output_tokens`.
//!   `message_start` reports the input counts (and a placeholder
//!   `output_tokens`), each `message_delta` the output so far: a count
//!   present in a later event replaces the earlier one.
//! - Responses: `input_tokens` includes the cached ones; the prompt is
//!   `input_tokens`, the cached part `input_tokens_details.cached_tokens`,
//!   the completion `output_tokens`, from `response.completed` (or
//!   `response.incomplete` / `response.failed`) or the answer's `usage`.

use super::scan::{first_nonempty_string, Key};
use super::sse::event_type_and_data;
use super::usage::Count;
use super::Usage;
use crate::api::Api;
use crate::hash::stable_hash64;
use crate::json_bytes::{key_equals, skip_value, skip_ws, string_end};
use serde::de::{IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};
use std::borrow::Cow;
use std::marker::PhantomData;
use std::sync::LazyLock;

/// An API whose answers are read here rather than as OpenAI chunks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Typed {
    Messages,
    Responses,
}

impl Typed {
    /// `None` for the OpenAI chunk APIs and for bodies of no known API.
    pub(crate) fn of(api: Option<Api>) -> Option<Typed> {
        match api? {
            Api::Messages => Some(Typed::Messages),
            Api::Responses => Some(Typed::Responses),
            Api::Chat | Api::Completions => None,
        }
    }
}

/// Anthropic's counts as reported so far.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct AnthropicCounts {
    input: u64,
    cache_read: u64,
    cache_creation: u64,
    output: u64,
}

impl AnthropicCounts {
    /// Each count the event reports replaces the one held.
    fn update(&mut self, u: &AnthropicUsage) {
        let set = |held: &mut u64, new: &Option<Count>| {
            if let Some(Count(n)) = new {
                *held = *n;
            }
        };
        set(&mut self.input, &u.input_tokens);
        set(&mut self.cache_read, &u.cache_read_input_tokens);
        set(&mut self.cache_creation, &u.cache_creation_input_tokens);
        set(&mut self.output, &u.output_tokens);
    }

    fn usage(self) -> Usage {
        Usage {
            prompt_tokens: self
                .input
                .saturating_add(self.cache_read)
                .saturating_add(self.cache_creation),
            completion_tokens: self.output,
            cached_tokens: self.cache_read,
        }
    }
}

/// What the gateway reads of a typed stream or answer.
#[derive(Debug)]
pub(crate) struct TypedObserver {
    api: Typed,
    anthropic: AnthropicCounts,
    response_id: Option<u64>,
}

/// Where Anthropic's content deltas hold their text: `text_delta`,
/// `input_json_delta` (a tool call's arguments), `thinking_delta`.
static ANTHROPIC_DELTA_KEYS: LazyLock<[Key; 3]> =
    LazyLock::new(|| ["text", "partial_json", "thinking"].map(Key::new));

/// A Responses `*.delta` event's text.
static DELTA_KEY: LazyLock<Key> = LazyLock::new(|| Key::new("delta"));

impl TypedObserver {
    pub(crate) fn new(api: Typed) -> Self {
        TypedObserver {
            api,
            anthropic: AnthropicCounts::default(),
            response_id: None,
        }
    }

    /// The hash of the Responses API's response id, once seen.
    pub(crate) fn response_id_hash(&self) -> Option<u64> {
        self.response_id
    }

    /// One complete SSE event, its bytes as the splitter hands them out.
    /// Updates `usage` from an event that reports it; true when the event
    /// carried generated output.
    pub(crate) fn event(&mut self, event: &[u8], usage: &mut Option<Usage>) -> bool {
        let (line_type, data) = event_type_and_data(event);
        let Some(data) = data else {
            return false;
        };
        let data: &[u8] = &data;
        let kind = match line_type.filter(|t| !t.is_empty()) {
            Some(t) => t,
            None => match top_level_string(data, "type") {
                Some(t) => t,
                None => return false,
            },
        };
        match self.api {
            Typed::Messages => self.anthropic_event(kind, data, usage),
            Typed::Responses => self.responses_event(kind, data, usage),
        }
    }

    fn anthropic_event(&mut self, kind: &[u8], data: &[u8], usage: &mut Option<Usage>) -> bool {
        let reported = match kind {
            b"content_block_delta" => {
                return ANTHROPIC_DELTA_KEYS
                    .iter()
                    .any(|key| first_nonempty_string(data, key).is_some());
            }
            b"message_start" => serde_json::from_slice::<MessageStart>(data)
                .ok()
                .and_then(|m| m.message?.usage),
            b"message_delta" => serde_json::from_slice::<WithUsage>(data)
                .ok()
                .and_then(|m| m.usage),
            _ => None,
        };
        if let Some(u) = reported {
            self.anthropic.update(&u);
            *usage = Some(self.anthropic.usage());
        }
        false
    }

    fn responses_event(&mut self, kind: &[u8], data: &[u8], usage: &mut Option<Usage>) -> bool {
        if kind.ends_with(b".delta") {
            // `response.output_text.delta`, `….function_call_arguments.delta`,
            // `….reasoning_text.delta`, `….refusal.delta`, …: all generated.
            return first_nonempty_string(data, &DELTA_KEY).is_some();
        }
        if matches!(
            kind,
            b"response.created"
                | b"response.in_progress"
                | b"response.completed"
                | b"response.incomplete"
                | b"response.failed"
        ) {
            if let Ok(ResponseEvent {
                response: Some(response),
            }) = serde_json::from_slice(data)
            {
                self.take_response(response, usage);
            }
        }
        false
    }

    /// A Responses object's id (hashed; the string goes with the parse)
    /// and usage.
    fn take_response(&mut self, response: ResponseObject<'_>, usage: &mut Option<Usage>) {
        if let Some(id) = response.id.filter(|id| !id.is_empty()) {
            self.response_id = Some(stable_hash64(id.as_bytes()));
        }
        if let Some(u) = response.usage {
            *usage = Some(u.usage());
        }
    }

    /// A whole (non-stream) answer.
    pub(crate) fn answer(&mut self, body: &[u8], usage: &mut Option<Usage>) {
        match self.api {
            Typed::Messages => {
                if let Ok(WithUsage { usage: Some(u) }) = serde_json::from_slice(body) {
                    self.anthropic.update(&u);
                    *usage = Some(self.anthropic.usage());
                }
            }
            Typed::Responses => {
                if let Ok(response) = serde_json::from_slice::<ResponseObject<'_>>(body) {
                    self.take_response(response, usage);
                }
            }
        }
    }
}

/// Anthropic's `usage` object, each count as present (a missing or null one
/// leaves the held count alone; any other value that is not a count is 0).
#[derive(Deserialize)]
struct AnthropicUsage {
    #[serde(default)]
    input_tokens: Option<Count>,
    #[serde(default)]
    cache_read_input_tokens: Option<Count>,
    #[serde(default)]
    cache_creation_input_tokens: Option<Count>,
    #[serde(default)]
    output_tokens: Option<Count>,
}

/// `message_start`'s data: the message, with its usage.
#[derive(Deserialize)]
struct MessageStart {
    #[serde(default, deserialize_with = "object")]
    message: Option<WithUsage>,
}

/// An object with a top-level `usage`: `message_delta`'s data, a Messages
/// answer, `message_start`'s message.
#[derive(Deserialize)]
struct WithUsage {
    #[serde(default, deserialize_with = "object")]
    usage: Option<AnthropicUsage>,
}

/// A Responses event's data, as far as its `response` object goes.
#[derive(Deserialize)]
struct ResponseEvent<'a> {
    #[serde(default, borrow, deserialize_with = "object")]
    response: Option<ResponseObject<'a>>,
}

/// A Responses object (a whole answer, or the one an event carries).
#[derive(Deserialize)]
struct ResponseObject<'a> {
    #[serde(default, borrow)]
    id: Option<Cow<'a, str>>,
    #[serde(default, deserialize_with = "object")]
    usage: Option<ResponsesUsage>,
}

#[derive(Deserialize)]
struct ResponsesUsage {
    #[serde(default)]
    input_tokens: Option<Count>,
    #[serde(default, deserialize_with = "object")]
    input_tokens_details: Option<InputDetails>,
    #[serde(default)]
    output_tokens: Option<Count>,
}

#[derive(Deserialize)]
struct InputDetails {
    #[serde(default)]
    cached_tokens: Option<Count>,
}

impl ResponsesUsage {
    fn usage(&self) -> Usage {
        let count = |c: &Option<Count>| c.as_ref().map_or(0, |c| c.0);
        Usage {
            prompt_tokens: count(&self.input_tokens),
            completion_tokens: count(&self.output_tokens),
            cached_tokens: self
                .input_tokens_details
                .as_ref()
                .map_or(0, |d| count(&d.cached_tokens)),
        }
    }
}

/// A member that counts only as an object: any other value (null, an
/// array, a string, a number) reads as absent, as OpenAI's `usage` does
/// (`usage::parse_usage`), rather than as serde's struct-from-array.
fn object<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    struct V<T>(PhantomData<T>);
    impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
        type Value = Option<T>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("any JSON value")
        }
        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
            T::deserialize(serde::de::value::MapAccessDeserializer::new(map)).map(Some)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            Ok(None)
        }
        fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
    }
    d.deserialize_any(V(PhantomData))
}

/// The raw text of the top-level member `name` of the object `data`, when
/// it is a string without escapes: a walk of the members before it (the
/// `type` of an event is its first), skipping their values unread.
fn top_level_string<'a>(data: &'a [u8], name: &str) -> Option<&'a [u8]> {
    let mut i = skip_ws(data, 0);
    if data.get(i) != Some(&b'{') {
        return None;
    }
    i = skip_ws(data, i + 1);
    loop {
        let (key_end, _) = string_end(data, i)?;
        let key = &data[i..key_end];
        i = skip_ws(data, key_end);
        if data.get(i) != Some(&b':') {
            return None;
        }
        i = skip_ws(data, i + 1);
        if key_equals(key, name)? {
            let (end, escaped) = string_end(data, i)?;
            return (!escaped).then(|| &data[i + 1..end - 1]);
        }
        i = skip_ws(data, skip_value(data, i)?);
        if data.get(i) != Some(&b',') {
            return None;
        }
        i = skip_ws(data, i + 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream::pipeline::ResponsePipeline;
    use crate::stream::postprocess::Handler;
    use bytes::Bytes;
    use http::{HeaderMap, StatusCode};
    use std::cell::Cell;
    use std::time::{Duration, Instant};

    /// An Anthropic stream as the API (and vLLM's `/v1/messages`) sends it:
    /// two text deltas, a tool call whose first argument delta is empty, a
    /// thinking delta; 95 prompt tokens of which 80 read from the cache.
    const MESSAGES_STREAM: &str = concat!(
        "event: message_start\n",
        "data: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_01\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"m\",\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":12,\"cache_creation_input_tokens\":3,\"cache_read_input_tokens\":80,\"output_tokens\":1}}}\n\n",
        "event: content_block_start\n",
        "data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
        "event: ping\n",
        "data: {\"type\": \"ping\"}\n\n",
        "event: content_block_delta\n",
        "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hello\"}}\n\n",
        "event: content_block_delta\n",
        "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"!\"}}\n\n",
        "event: content_block_stop\n",
        "data: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
        "event: content_block_start\n",
        "data: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"get\",\"input\":{}}}\n\n",
        "event: content_block_delta\n",
        "data: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"\"}}\n\n",
        "event: content_block_delta\n",
        "data: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"a\\\":1}\"}}\n\n",
        "event: content_block_stop\n",
        "data: {\"type\":\"content_block_stop\",\"index\":1}\n\n",
        "event: content_block_delta\n",
        "data: {\"type\":\"content_block_delta\",\"index\":2,\"delta\":{\"type\":\"thinking_delta\",\"thinking\":\"hm\"}}\n\n",
        "event: content_block_delta\n",
        "data: {\"type\":\"content_block_delta\",\"index\":2,\"delta\":{\"type\":\"signature_delta\",\"signature\":\"c2ln\"}}\n\n",
        "event: message_delta\n",
        "data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":9}}\n\n",
        "event: message_delta\n",
        "data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":15}}\n\n",
        "event: message_stop\n",
        "data: {\"type\":\"message_stop\"}\n\n",
    );

    /// What the stream above reports, in OpenAI's meaning.
    const MESSAGES_USAGE: Usage = Usage {
        prompt_tokens: 95,
        completion_tokens: 15,
        cached_tokens: 80,
    };

    /// A Responses stream: text, reasoning and tool-argument deltas, the
    /// `.done` events that repeat the text, and the usage at the end.
    const RESPONSES_STREAM: &str = concat!(
        "event: response.created\n",
        "data: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_abc\",\"object\":\"response\",\"created_at\":1,\"status\":\"in_progress\",\"model\":\"m\",\"output\":[],\"usage\":null}}\n\n",
        "event: response.in_progress\n",
        "data: {\"type\":\"response.in_progress\",\"sequence_number\":1,\"response\":{\"id\":\"resp_abc\",\"object\":\"response\",\"status\":\"in_progress\",\"output\":[],\"usage\":null}}\n\n",
        "event: response.output_item.added\n",
        "data: {\"type\":\"response.output_item.added\",\"sequence_number\":2,\"output_index\":0,\"item\":{\"id\":\"msg_1\",\"type\":\"message\",\"status\":\"in_progress\",\"role\":\"assistant\",\"content\":[]}}\n\n",
        "event: response.content_part.added\n",
        "data: {\"type\":\"response.content_part.added\",\"sequence_number\":3,\"item_id\":\"msg_1\",\"output_index\":0,\"content_index\":0,\"part\":{\"type\":\"output_text\",\"text\":\"\",\"annotations\":[]}}\n\n",
        "event: response.reasoning_text.delta\n",
        "data: {\"type\":\"response.reasoning_text.delta\",\"sequence_number\":4,\"item_id\":\"rs_1\",\"output_index\":0,\"content_index\":0,\"delta\":\"think\"}\n\n",
        "event: response.output_text.delta\n",
        "data: {\"type\":\"response.output_text.delta\",\"sequence_number\":5,\"item_id\":\"msg_1\",\"output_index\":0,\"content_index\":0,\"delta\":\"Hi\"}\n\n",
        "event: response.output_text.delta\n",
        "data: {\"type\":\"response.output_text.delta\",\"sequence_number\":6,\"item_id\":\"msg_1\",\"output_index\":0,\"content_index\":0,\"delta\":\"\"}\n\n",
        "event: response.output_text.delta\n",
        "data: {\"type\":\"response.output_text.delta\",\"sequence_number\":7,\"item_id\":\"msg_1\",\"output_index\":0,\"content_index\":0,\"delta\":\" there\"}\n\n",
        "event: response.output_text.done\n",
        "data: {\"type\":\"response.output_text.done\",\"sequence_number\":8,\"item_id\":\"msg_1\",\"output_index\":0,\"content_index\":0,\"text\":\"Hi there\"}\n\n",
        "event: response.function_call_arguments.delta\n",
        "data: {\"type\":\"response.function_call_arguments.delta\",\"sequence_number\":9,\"item_id\":\"fc_1\",\"output_index\":1,\"delta\":\"{}\"}\n\n",
        "event: response.completed\n",
        "data: {\"type\":\"response.completed\",\"sequence_number\":10,\"response\":{\"id\":\"resp_abc\",\"object\":\"response\",\"status\":\"completed\",\"output\":[{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[{\"type\":\"output_text\",\"text\":\"Hi there\",\"annotations\":[]}]}],\"usage\":{\"input_tokens\":120,\"input_tokens_details\":{\"cached_tokens\":96},\"output_tokens\":4,\"output_tokens_details\":{\"reasoning_tokens\":1},\"total_tokens\":124}}}\n\n",
    );

    const RESPONSES_USAGE: Usage = Usage {
        prompt_tokens: 120,
        completion_tokens: 4,
        cached_tokens: 96,
    };

    fn resp_abc() -> Option<u64> {
        Some(stable_hash64(b"resp_abc"))
    }

    thread_local! {
        /// The time the test's clock reads: set by the test between chunks.
        static NOW: Cell<Option<Instant>> = const { Cell::new(None) };
    }

    fn test_clock() -> Instant {
        NOW.with(|n| n.get()).expect("the test sets the clock")
    }

    fn pipeline(api: Api, ct: &str) -> ResponsePipeline {
        let mut h = HeaderMap::new();
        h.insert("content-type", ct.parse().unwrap());
        ResponsePipeline::for_response(StatusCode::OK, &h, Some(api), None, false)
            .expect("a 2xx SSE / JSON answer gets a pipeline")
            .with_clock(test_clock)
    }

    /// Runs `chunks` through a fresh pipeline, the clock at a second per
    /// chunk; the bytes sent, and the pipeline after.
    fn run(api: Api, ct: &str, chunks: &[&[u8]]) -> (Vec<u8>, ResponsePipeline) {
        let start = Instant::now();
        let mut p = pipeline(api, ct);
        let mut out = Vec::new();
        for (i, c) in chunks.iter().enumerate() {
            NOW.with(|n| n.set(Some(start + Duration::from_secs(i as u64))));
            out.extend_from_slice(&p.push(c, i + 1 == chunks.len()));
        }
        (out, p)
    }

    /// The stream in two chunks at every cut, and in three at a stride of
    /// cuts (inside `event:` lines, between `\n`s, inside the JSON): the
    /// same bytes out, the same reading.
    fn every_cut(api: Api, stream: &str, want: Usage, content: u64, id: Option<u64>) {
        let bytes = stream.as_bytes();
        let check = |chunks: &[&[u8]]| {
            let (out, p) = run(api, "text/event-stream", chunks);
            assert_eq!(out, bytes, "passed untouched");
            assert_eq!(p.usage(), Some(want), "{chunks:?}");
            assert_eq!(p.content_events(), content, "{chunks:?}");
            assert_eq!(p.response_id_hash(), id);
            assert!(p.first_content_at().is_some() && p.is_stream());
            assert!(!p.rewrites());
        };
        for cut in 0..=bytes.len() {
            check(&[&bytes[..cut], &bytes[cut..]]);
        }
        for a in (0..bytes.len()).step_by(7) {
            for b in (a..bytes.len()).step_by(13) {
                check(&[&bytes[..a], &bytes[a..b], &bytes[b..]]);
            }
        }
        // Byte by byte.
        let singles: Vec<&[u8]> = bytes.chunks(1).collect();
        check(&singles);
    }

    #[test]
    fn a_messages_stream_is_read_however_it_is_cut() {
        every_cut(Api::Messages, MESSAGES_STREAM, MESSAGES_USAGE, 4, None);
    }

    #[test]
    fn a_responses_stream_is_read_however_it_is_cut() {
        every_cut(
            Api::Responses,
            RESPONSES_STREAM,
            RESPONSES_USAGE,
            4,
            resp_abc(),
        );
    }

    /// Without `event:` lines the data's own `type` is read; with `\r\n`
    /// line ends the same.
    #[test]
    fn the_type_comes_from_the_data_without_an_event_line() {
        for (api, stream, want, id) in [
            (Api::Messages, MESSAGES_STREAM, MESSAGES_USAGE, None),
            (
                Api::Responses,
                RESPONSES_STREAM,
                RESPONSES_USAGE,
                resp_abc(),
            ),
        ] {
            let data_only: String = stream
                .split_inclusive('\n')
                .filter(|l| !l.starts_with("event:"))
                .collect();
            let crlf = stream.replace('\n', "\r\n");
            for s in [data_only, crlf] {
                let (out, p) = run(api, "text/event-stream", &[s.as_bytes()]);
                assert_eq!(out, s.as_bytes());
                assert_eq!(p.usage(), Some(want), "{s}");
                assert_eq!(p.content_events(), 4, "{s}");
                assert_eq!(p.response_id_hash(), id);
            }
        }
    }

    /// The first token's time is that of the chunk holding the first
    /// delta with text, not of `message_start`, a ping or an empty delta;
    /// the last, that of the last delta.
    #[test]
    fn the_first_token_is_the_first_delta_with_text() {
        for (api, stream, first_delta, last_delta) in [
            (
                Api::Messages,
                MESSAGES_STREAM,
                "event: content_block_delta",
                "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":2,\"delta\":{\"type\":\"thinking",
            ),
            (
                Api::Responses,
                RESPONSES_STREAM,
                "event: response.reasoning_text.delta",
                "event: response.function_call_arguments.delta",
            ),
        ] {
            let at = stream.find(first_delta).unwrap();
            let last = stream.find(last_delta).unwrap();
            let s = stream.as_bytes();
            // Chunk 0: everything before the first delta and a few bytes
            // of it; chunk 1: the rest of it (it completes here); chunk 2:
            // up to the last delta; chunk 3: the rest.
            let chunks: [&[u8]; 4] = [&s[..at + 5], &s[at + 5..last], &s[last..last + 3], &s[last + 3..]];
            let start = Instant::now();
            let mut p = pipeline(api, "text/event-stream");
            let mut seen = Vec::new();
            for (i, c) in chunks.iter().enumerate() {
                NOW.with(|n| n.set(Some(start + Duration::from_secs(i as u64))));
                p.push(c, i == 3);
                seen.push(p.first_content_at());
            }
            let at = |i: u64| Some(start + Duration::from_secs(i));
            assert_eq!(seen, [None, at(1), at(1), at(1)], "{api:?}");
            assert_eq!(p.last_content_at(), at(3), "{api:?}");
        }
    }

    /// A whole answer, in one chunk or several.
    #[test]
    fn answers_are_read_in_one_chunk_or_many() {
        let messages = r#"{"id":"msg_01","type":"message","role":"assistant","model":"m","content":[{"type":"text","text":"Hi \"usage\": {}"}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":10,"cache_creation_input_tokens":0,"cache_read_input_tokens":32,"output_tokens":7}}"#;
        let responses = r#"{"id":"resp_abc","object":"response","created_at":1,"status":"completed","model":"m","output":[{"type":"message","id":"msg_1","status":"completed","role":"assistant","content":[{"type":"output_text","text":"Hi","annotations":[]}]}],"previous_response_id":"resp_0","usage":{"input_tokens":42,"input_tokens_details":{"cached_tokens":32},"output_tokens":7,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":49}}"#;
        let want = Usage {
            prompt_tokens: 42,
            completion_tokens: 7,
            cached_tokens: 32,
        };
        for (api, body, id) in [
            (Api::Messages, messages, None),
            (Api::Responses, responses, resp_abc()),
        ] {
            for cuts in [vec![], vec![1], vec![30, 31], vec![body.len() - 1]] {
                let mut parts: Vec<&[u8]> = Vec::new();
                let mut from = 0;
                for cut in cuts.iter().copied().chain([body.len()]) {
                    parts.push(&body.as_bytes()[from..cut]);
                    from = cut;
                }
                let (out, p) = run(api, "application/json", &parts);
                assert_eq!(out, body.as_bytes());
                assert_eq!(p.usage(), Some(want), "{api:?} {cuts:?}");
                assert_eq!(p.response_id_hash(), id, "{api:?}");
                assert!(!p.is_stream() && p.first_content_at().is_none());
            }
        }
    }

    /// A route's handler and the usage-frame drop are OpenAI's: a typed
    /// answer passes untouched, stream or not, and its usage is read.
    #[test]
    fn handlers_and_the_usage_drop_leave_typed_answers_alone() {
        let mut sse = HeaderMap::new();
        sse.insert("content-type", "text/event-stream".parse().unwrap());
        for (api, stream, want) in [
            (Api::Messages, MESSAGES_STREAM, MESSAGES_USAGE),
            (Api::Responses, RESPONSES_STREAM, RESPONSES_USAGE),
        ] {
            let mut p = ResponsePipeline::for_response(
                StatusCode::OK,
                &sse,
                Some(api),
                Some(Handler::VllmFormat),
                true,
            )
            .unwrap();
            assert!(!p.rewrites());
            let chunk = Bytes::from(stream);
            let mut body = Some(chunk.clone());
            p.process(&mut body, true);
            let out = body.unwrap();
            assert_eq!(out, chunk);
            assert_eq!(out.as_ptr(), chunk.as_ptr(), "the chunk itself");
            assert_eq!(p.usage(), Some(want));
        }
        // Control: the same handler on a chat stream does rewrite.
        let p = ResponsePipeline::for_response(
            StatusCode::OK,
            &sse,
            Some(Api::Chat),
            Some(Handler::VllmFormat),
            true,
        )
        .unwrap();
        assert!(p.rewrites());
        assert_eq!(p.response_id_hash(), None);
    }

    /// Broken events are skipped, without a panic, and the events around
    /// them are still read: a cut JSON, a count that is no count, a
    /// `usage` that is no object, an event with no data, OpenAI's end
    /// marker, no type at all.
    #[test]
    fn malformed_events_are_skipped() {
        let messages = concat!(
            "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":5,\"output_tokens\":1}}}\n\n",
            "event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":\n\n",
            "event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":[3]}\n\n",
            "event: message_start\ndata: {\"type\":\"message_start\",\"message\":\"x\"}\n\n",
            "event: content_block_delta\ndata: {\"delta\":{\"text\":\"a\"\n\n",
            "event: content_block_delta\n\n",
            "data: [DONE]\n\n",
            "data: {\"no_type\":1}\n\n",
            ": comment\n\n",
            "event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":4,\"input_tokens\":null}}\n\n",
            "event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"cache_read_input_tokens\":\"2\"}}\n\n",
        );
        let (out, p) = run(Api::Messages, "text/event-stream", &[messages.as_bytes()]);
        assert_eq!(out, messages.as_bytes());
        assert_eq!(
            p.usage(),
            Some(Usage {
                prompt_tokens: 5,
                completion_tokens: 4,
                cached_tokens: 0
            })
        );
        // The cut delta still has a key with text before its cut: the scan
        // counts it, as it would an OpenAI chunk cut the same way.
        assert_eq!(p.content_events(), 1);

        let responses = concat!(
            "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":7}}\n\n",
            "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"resp_abc\",\"usage\":{\"input_tokens\":\n\n",
            "event: response.output_text.delta\ndata: {\"delta\":1}\n\n",
            "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":null}\n\n",
        );
        let (out, p) = run(Api::Responses, "text/event-stream", &[responses.as_bytes()]);
        assert_eq!(out, responses.as_bytes());
        assert_eq!((p.usage(), p.response_id_hash()), (None, None));
        assert_eq!(p.content_events(), 0);
        // Not JSON at all, as an answer.
        let (_, p) = run(
            Api::Responses,
            "application/json",
            &[b"{\"id\":\"resp_abc\","],
        );
        assert_eq!((p.usage(), p.response_id_hash()), (None, None));
        let (_, p) = run(Api::Messages, "application/json", &[b"<html>"]);
        assert_eq!(p.usage(), None);
    }

    /// The id is hashed as its decoded text: an escaped spelling hashes as
    /// the plain one, and the last event that names one wins.
    #[test]
    fn the_response_id_is_hashed_decoded() {
        let stream =
            "data: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_\\u0061bc\"}}\n\n";
        let (_, p) = run(Api::Responses, "text/event-stream", &[stream.as_bytes()]);
        assert_eq!(p.response_id_hash(), resp_abc());
        let two = concat!(
            "data: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_1\"}}\n\n",
            "data: {\"type\":\"response.completed\",\"response\":{\"id\":\"resp_abc\",\"usage\":null}}\n\n",
        );
        let (_, p) = run(Api::Responses, "text/event-stream", &[two.as_bytes()]);
        assert_eq!(p.response_id_hash(), resp_abc());
        assert_eq!(p.usage(), None);
    }

    /// A chat pipeline is the one it was: OpenAI chunks, no id.
    #[test]
    fn other_apis_read_openai_chunks() {
        let chunk = "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1}}\n\n";
        for api in [Api::Chat, Api::Completions] {
            let (_, p) = run(api, "text/event-stream", &[chunk.as_bytes()]);
            assert_eq!(p.usage().map(|u| u.prompt_tokens), Some(3));
            assert_eq!((p.content_events(), p.response_id_hash()), (1, None));
        }
        // And a Messages pipeline does not read an OpenAI chunk's usage.
        let (_, p) = run(Api::Messages, "text/event-stream", &[chunk.as_bytes()]);
        assert_eq!(p.usage(), None);
    }

    #[test]
    fn the_type_is_read_from_the_top_level_only() {
        let read = |s: &str| top_level_string(s.as_bytes(), "type").map(|t| t.to_vec());
        assert_eq!(read(r#"{"type":"ping"}"#), Some(b"ping".to_vec()));
        assert_eq!(
            read(r#" { "a" : {"type":"no"}, "b":[1,"x"] , "type" : "yes" } "#),
            Some(b"yes".to_vec())
        );
        assert_eq!(read(r#"{"t\u0079pe":"esc"}"#), Some(b"esc".to_vec()));
        assert_eq!(read(r#"{"a":{"type":"nested"}}"#), None);
        assert_eq!(read(r#"{"type":"a\"b"}"#), None, "escaped value");
        assert_eq!(read(r#"{"type":1}"#), None);
        assert_eq!(read(r#"["type","x"]"#), None);
        assert_eq!(read(r#"{"a":1 "type":"x"}"#), None);
        assert_eq!(read(r#"{"type""#), None);
        assert_eq!(read(""), None);
    }
}
