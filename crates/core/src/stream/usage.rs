//! Token usage read from responses: whole answers and stream frames.
//!
//! Streams only carry a `usage` frame when the request sets
//! `stream_options.include_usage`, which the gateway adds when missing
//! (`rewrite::include_usage`) and drops on the way back (see
//! [`is_usage_only_event`]).

use serde::de::{IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::Value;

/// Visitor methods for the scalar JSON values, each giving `$v`.
macro_rules! scalars_are {
    ($v:expr) => {
        fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
            Ok($v)
        }
        fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
            Ok($v)
        }
        fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
            Ok($v)
        }
        fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
            Ok($v)
        }
        fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
            Ok($v)
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok($v)
        }
    };
}

use super::Usage;
use crate::json_bytes::skip_ws;

/// The top-level `usage` of a response body or stream frame. `None` when it
/// is absent, null or not an object; a missing or non-integer count reads
/// as 0 so that one odd field does not lose the others.
pub fn parse_usage(json: &Value) -> Option<Usage> {
    usage_from_object(json.get("usage")?)
}

fn usage_from_object(usage: &Value) -> Option<Usage> {
    let usage = usage.as_object()?;
    let count = |v: Option<&Value>| v.and_then(Value::as_u64).unwrap_or(0);
    Some(Usage {
        prompt_tokens: count(usage.get("prompt_tokens")),
        completion_tokens: count(usage.get("completion_tokens")),
        cached_tokens: count(
            usage
                .get("prompt_tokens_details")
                .and_then(|d| d.get("cached_tokens")),
        ),
    })
}

/// Only the members the stream path looks at. Everything else is skipped by
/// serde without being built, which is what makes parsing a frame cheap;
/// `usage` is read straight into [`Usage`] (no `Value`, no key strings).
#[derive(Deserialize)]
struct FrameEnvelope {
    choices: Option<Vec<serde::de::IgnoredAny>>,
    #[serde(default)]
    usage: UsageMember,
}

impl FrameEnvelope {
    /// `choices` empty, null or absent, and a `usage` object present.
    fn is_usage_only(&self) -> bool {
        self.choices.as_ref().is_none_or(|c| c.is_empty()) && self.usage.0.is_some()
    }
}

fn parse_envelope(json: &[u8]) -> Option<FrameEnvelope> {
    match serde_json::from_slice::<FrameEnvelope>(json) {
        Ok(env) => Some(env),
        // A duplicated member is an error for the typed pass but not for a
        // `Value` (last one wins, as in the engines' own parsers).
        Err(_) => {
            let v: Value = serde_json::from_slice(json).ok()?;
            let choices = match v.get("choices") {
                None | Some(Value::Null) => None,
                Some(Value::Array(a)) => Some(vec![serde::de::IgnoredAny; a.len()]),
                Some(_) => return None,
            };
            Some(FrameEnvelope {
                choices,
                usage: UsageMember(v.get("usage").and_then(usage_from_object)),
            })
        }
    }
}

/// [`parse_usage`] straight from bytes, without building the whole document.
pub fn parse_usage_bytes(json: &[u8]) -> Option<Usage> {
    parse_envelope(json)?.usage.0
}

/// The top-level `usage` of a whole JSON answer, as [`parse_usage_bytes`]
/// reads it, without reading the answer's content.
///
/// Engines write `usage` after `choices`, near the end. The last `"usage"`
/// key is found from the end and only its object and the members after it
/// are parsed; they must close the answer's object exactly, which puts the
/// member at its top level (a nested one is followed by more closing
/// brackets). Any other shape takes the whole parse. On valid JSON the two
/// read the same; an answer broken before its usage now counts that usage
/// (its tokens were spent), where the whole parse read none.
pub fn answer_usage(json: &[u8]) -> Option<Usage> {
    match trailing_usage(json) {
        Some(usage) => Some(usage),
        None => parse_usage_bytes(json),
    }
}

fn trailing_usage(json: &[u8]) -> Option<Usage> {
    if json.get(skip_ws(json, 0)) != Some(&b'{') {
        return None;
    }
    let at = super::scan::last_key_value(json, &USAGE_KEY)?;
    if json.get(at) != Some(&b'{') {
        return None;
    }
    let (usage, len) = match super::usage_object::read(&json[at..]) {
        Some(read) => read,
        None => {
            let mut values =
                serde_json::Deserializer::from_slice(&json[at..]).into_iter::<UsageMember>();
            (values.next()?.ok()?.0?, values.byte_offset())
        }
    };
    members_close_the_object(&json[at + len..]).then_some(usage)
}

/// `tail` is `(, "key": value)* }` and whitespace, with no member spelling
/// `usage` (a later one, however escaped, would be the one that counts).
/// Not `find_member`'s walk: it skips values by their brackets without
/// checking them, and here what follows the usage must be valid JSON for
/// the shortcut to read what the whole parse reads.
fn members_close_the_object(tail: &[u8]) -> bool {
    let mut i = skip_ws(tail, 0);
    loop {
        match tail.get(i) {
            Some(b'}') => return skip_ws(tail, i + 1) == tail.len(),
            Some(b',') => {}
            _ => return false,
        }
        i = skip_ws(tail, i + 1);
        let mut key = serde_json::Deserializer::from_slice(&tail[i..])
            .into_iter::<crate::request_view::JsonStr>();
        match key.next() {
            Some(Ok(k)) if k.0 != "usage" => i += key.byte_offset(),
            _ => return false,
        }
        i = skip_ws(tail, i);
        if tail.get(i) != Some(&b':') {
            return false;
        }
        i = skip_ws(tail, i + 1);
        let mut value = serde_json::Deserializer::from_slice(&tail[i..]).into_iter::<IgnoredAny>();
        match value.next() {
            Some(Ok(_)) => i += value.byte_offset(),
            _ => return false,
        }
    }
}

/// Is this SSE event's data a usage-only frame (`choices` empty, null or
/// absent, and a `usage` object present)? When unsure — unparsable data,
/// `choices` not an array — the answer is no, because a wrong yes would
/// drop a frame the client needs. (Data broken before a usage object that
/// closes it, with empty `choices`, is a usage frame: see [`frame_usage`].)
pub fn is_usage_only_event(event_data: &[u8]) -> bool {
    frame_usage(event_data).is_some_and(|(_, only)| only)
}

/// What stays of a usage-only frame once its `usage` goes, when the engine
/// put more in it than the envelope every chunk carries: llama.cpp sends
/// its `timings` in the frame that carries the usage, so dropping the
/// frame the gateway asked for would take from the client what it gets
/// without the gateway. None when nothing beyond the envelope is left (the
/// frame is dropped whole) or the frame is not a JSON object.
pub fn frame_without_usage(event_data: &[u8]) -> Option<Vec<u8>> {
    // The keys every OpenAI chunk has, which say nothing once the usage
    // is gone; `choices` is the empty list that made the frame usage-only.
    const ENVELOPE: [&str; 8] = [
        "id",
        "object",
        "created",
        "model",
        "system_fingerprint",
        "service_tier",
        "choices",
        "usage",
    ];
    let mut frame: serde_json::Map<String, Value> = serde_json::from_slice(event_data).ok()?;
    if frame.keys().all(|k| ENVELOPE.contains(&k.as_str())) {
        return None;
    }
    frame.remove("usage");
    serde_json::to_vec(&frame).ok()
}

/// One frame's usage and whether it is a usage-only frame, parsed only when
/// the frame can carry a usage object: a `"usage"` key whose value opens an
/// object. A frame without one (every content frame, and `"usage": null`
/// ones) costs one search, not a parse. Exactly what parsing every frame
/// gives: a top-level usage object always shows as such a key (unless the
/// key is spelled with escapes, which no engine does), and the parse still
/// decides (a nested or string-embedded match parses to no usage).
///
/// The usage frame itself (once per stream) is read as an answer is, from
/// the end ([`answer_usage`]), and its `choices` from their keys
/// ([`choices_say_usage_only`]); only a frame those cannot judge takes the
/// whole parse. So, as for answers, a frame broken before its usage counts
/// that usage, and counts as usage-only when its `choices` say so.
pub fn frame_usage(event_data: &[u8]) -> Option<(Usage, bool)> {
    if !super::scan::key_has_object(event_data, &USAGE_KEY) {
        return None;
    }
    if let Some(usage) = trailing_usage(event_data) {
        if let Some(only) = choices_say_usage_only(event_data) {
            return Some((usage, only));
        }
    }
    parsed_frame_usage(event_data)
}

/// A frame's usage and usage-only verdict from the whole parse.
fn parsed_frame_usage(event_data: &[u8]) -> Option<(Usage, bool)> {
    let env = parse_envelope(event_data)?;
    let only = env.is_usage_only();
    Some((env.usage.0?, only))
}

static USAGE_KEY: std::sync::LazyLock<super::scan::Key> =
    std::sync::LazyLock::new(|| super::scan::Key::new("usage"));
static CHOICES_KEY: std::sync::LazyLock<super::scan::Key> =
    std::sync::LazyLock::new(|| super::scan::Key::new("choices"));

/// Whether a frame with a top-level usage object is usage-only, judged by
/// its `"choices"` keys alone: with none, `choices` is absent (yes); with
/// one whose value is `[]` or `null`, it is empty or null if that key is
/// the top-level one, and absent if it is nested (yes either way). Several,
/// or one holding anything else, may or may not be the top-level one:
/// `None`, the whole parse decides. So does a frame with a backslash: an
/// escaped spelling of `choices` is a key no byte search sees (a usage
/// frame has no text that needs escapes).
fn choices_say_usage_only(data: &[u8]) -> Option<bool> {
    if super::scan::find_byte(data, b'\\').is_some() {
        return None;
    }
    let mut keys = super::scan::key_values(data, &CHOICES_KEY);
    let Some((_, value)) = keys.next() else {
        return Some(true);
    };
    if keys.next().is_some() {
        return None;
    }
    let rest = &data[value..];
    let empty = match rest.first() {
        Some(b'[') => rest.get(skip_ws(rest, 1)) == Some(&b']'),
        Some(b'n') => rest.starts_with(b"null"),
        _ => false,
    };
    empty.then_some(true)
}

/// The top-level `usage` as [`usage_from_object`] reads it from a `Value`:
/// `None` unless it is an object; in it a count that is missing or not an
/// unsigned integer is 0, and of a repeated key the last one counts.
#[derive(Default)]
struct UsageMember(Option<Usage>);

impl<'de> Deserialize<'de> for UsageMember {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = UsageMember;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<UsageMember, A::Error> {
                let mut u = Usage::default();
                while let Some(key) = map.next_key::<UsageKey>()? {
                    match key {
                        UsageKey::Prompt => u.prompt_tokens = map.next_value::<Count>()?.0,
                        UsageKey::Completion => u.completion_tokens = map.next_value::<Count>()?.0,
                        UsageKey::Details => u.cached_tokens = map.next_value::<Cached>()?.0,
                        UsageKey::Cached | UsageKey::Other => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(UsageMember(Some(u)))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<UsageMember, A::Error> {
                drain_seq(seq).map(|()| UsageMember(None))
            }
            scalars_are!(UsageMember(None));
        }
        d.deserialize_any(V)
    }
}

/// `Value::as_u64` of any value, or 0 (the typed APIs' counts are read
/// with it too, `typed`).
pub(super) struct Count(pub(super) u64);

impl<'de> Deserialize<'de> for Count {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Count;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_u64<E>(self, v: u64) -> Result<Count, E> {
                Ok(Count(v))
            }
            // serde_json hands non-negative integers to visit_u64; a `Value`
            // holding a negative one has no u64.
            fn visit_i64<E>(self, v: i64) -> Result<Count, E> {
                Ok(Count(u64::try_from(v).unwrap_or(0)))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Count, A::Error> {
                drain_map(map).map(|()| Count(0))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Count, A::Error> {
                drain_seq(seq).map(|()| Count(0))
            }
            fn visit_f64<E>(self, _: f64) -> Result<Count, E> {
                Ok(Count(0))
            }
            fn visit_bool<E>(self, _: bool) -> Result<Count, E> {
                Ok(Count(0))
            }
            fn visit_str<E>(self, _: &str) -> Result<Count, E> {
                Ok(Count(0))
            }
            fn visit_unit<E>(self) -> Result<Count, E> {
                Ok(Count(0))
            }
        }
        d.deserialize_any(V)
    }
}

/// `prompt_tokens_details.cached_tokens` (0 unless the details are an
/// object holding a count).
struct Cached(u64);

impl<'de> Deserialize<'de> for Cached {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Cached;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Cached, A::Error> {
                let mut cached = 0;
                while let Some(key) = map.next_key::<UsageKey>()? {
                    if let UsageKey::Cached = key {
                        cached = map.next_value::<Count>()?.0;
                    } else {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
                Ok(Cached(cached))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Cached, A::Error> {
                drain_seq(seq).map(|()| Cached(0))
            }
            scalars_are!(Cached(0));
        }
        d.deserialize_any(V)
    }
}

/// The keys of a usage object (and of its details) the gateway reads.
enum UsageKey {
    Prompt,
    Completion,
    Details,
    Cached,
    Other,
}

impl<'de> Deserialize<'de> for UsageKey {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = UsageKey;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a key")
            }
            // Called with the decoded key, so an escaped spelling matches
            // as it does in a `Value`.
            fn visit_str<E>(self, key: &str) -> Result<UsageKey, E> {
                Ok(match key {
                    "prompt_tokens" => UsageKey::Prompt,
                    "completion_tokens" => UsageKey::Completion,
                    "prompt_tokens_details" => UsageKey::Details,
                    "cached_tokens" => UsageKey::Cached,
                    _ => UsageKey::Other,
                })
            }
        }
        d.deserialize_identifier(V)
    }
}

fn drain_map<'de, A: MapAccess<'de>>(mut map: A) -> Result<(), A::Error> {
    while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
    Ok(())
}

fn drain_seq<'de, A: SeqAccess<'de>>(mut seq: A) -> Result<(), A::Error> {
    while seq.next_element::<IgnoredAny>()?.is_some() {}
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::json_bytes::testing::{value_strategy, Writer};
    use proptest::prelude::*;
    use serde_json::json;

    /// On valid JSON the search from the end reads what the whole parse
    /// reads, whatever the shape around the usage.
    #[test]
    fn an_answer_usage_reads_as_the_whole_parse() {
        let u = r#"{"prompt_tokens":4,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":2}}"#;
        let answers = [
            format!(r#"{{"id":"a","choices":[{{"message":{{"content":"hi"}}}}],"usage":{u}}}"#),
            format!(
                r#"{{"choices":[],"usage":{u},"prompt_logprobs":null,"kv_transfer_params":null}}"#
            ),
            format!(r#"{{"usage":{u},"x":[1,{{"a":"}}"}}],"y":-1.5e3, "z" : true }}"#),
            format!(r#"{{"usage":{{"prompt_tokens":9}},"usage":{u}}}"#),
            format!(r#"{{"usage":{u},"usage":null}}"#),
            format!(r#"{{"usage":{u},"us\u0061ge":null}}"#),
            format!(r#"{{"a":{{"usage":{u}}}}}"#),
            format!(r#"{{"a":[{{"usage":{u}}}]}}"#),
            format!(r#"{{"a":{{"usage":{u}}},"b":1}}"#),
            format!(r#"{{"usage":{u},"a":{{"usage":{{"prompt_tokens":9}}}}}}"#),
            format!(r#"{{"c":"\"usage\":{u}"}}"#),
            format!(r#"[{{"usage":{u}}}]"#),
            format!(r#"{{"usage":[{u}]}}"#),
            format!(r#"{{"usage":{u} }}   "#),
            format!(r#"  {{"usage" : {u}}}"#),
            r#"{"usage":{"prompt_tokens":"x","completion_tokens":-1}}"#.to_string(),
            r#"{"choices":[]}"#.to_string(),
        ];
        for answer in &answers {
            let whole = parse_usage_bytes(answer.as_bytes());
            assert_eq!(answer_usage(answer.as_bytes()), whole, "{answer}");
        }
        assert_eq!(
            answer_usage(answers[1].as_bytes()).map(|u| u.cached_tokens),
            Some(2)
        );
    }

    /// The search from the end does not read the content: an answer broken
    /// before its usage still counts it (control: the whole parse does
    /// not), but not one broken after it.
    #[test]
    fn an_answer_usage_is_read_from_the_end() {
        let broken_before = br#"{"choices":[{"content":"\x"}],"usage":{"prompt_tokens":3}}"#;
        assert_eq!(parse_usage_bytes(broken_before), None);
        assert_eq!(
            answer_usage(broken_before).map(|u| u.prompt_tokens),
            Some(3)
        );
        let broken_after = br#"{"usage":{"prompt_tokens":3},"x":tru}"#;
        assert_eq!(answer_usage(broken_after), None);
    }

    /// The typed read of `usage` gives what `parse_usage` gives on the
    /// `Value` of the same text, for every odd shape a count can take.
    #[test]
    fn typed_usage_reads_as_the_value_path() {
        let usages = [
            r#"{"prompt_tokens":10,"completion_tokens":4,"prompt_tokens_details":{"cached_tokens":8}}"#,
            r#"{"prompt_tokens":-3,"completion_tokens":4.0,"prompt_tokens_details":{"cached_tokens":"8"}}"#,
            r#"{"prompt_tokens":1e3,"completion_tokens":null,"prompt_tokens_details":[1,2]}"#,
            r#"{"prompt_tokens":{"a":[1]},"completion_tokens":[2],"prompt_tokens_details":7}"#,
            r#"{"prompt_tokens":true,"prompt_tokens_details":{"cached_tokens":{"x":1},"audio_tokens":2}}"#,
            r#"{"prompt_tokens":1,"prompt_tokens":2,"prompt_tokens_details":{"cached_tokens":1,"cached_tokens":5}}"#,
            r#"{"prompt\u005ftokens":6,"completion_tokens":18446744073709551615}"#,
            r#"{"prompt_tokens":18446744073709551616,"completion_tokens":-0,"total_tokens":3}"#,
            r#"{"prompt_tokens_details":null,"prompt_tokens_details":{"cached_tokens":2}}"#,
            r#"{}"#,
            r#"null"#,
            r#"[1,{"prompt_tokens":1}]"#,
            r#""usage""#,
            r#"12"#,
        ];
        for usage in usages {
            for frame in [
                format!(r#"{{"choices":[],"usage":{usage}}}"#),
                format!(r#"{{"usage":{usage},"choices":[{{"index":0}}],"model":"m"}}"#),
            ] {
                let value: Value = serde_json::from_str(&frame).unwrap();
                assert_eq!(
                    parse_usage_bytes(frame.as_bytes()),
                    parse_usage(&value),
                    "{frame}"
                );
            }
        }
    }

    #[test]
    fn parse_usage_shapes() {
        let v = json!({"usage":{"prompt_tokens":10,"completion_tokens":4,
            "prompt_tokens_details":{"cached_tokens":8}}});
        assert_eq!(
            parse_usage(&v),
            Some(Usage {
                prompt_tokens: 10,
                completion_tokens: 4,
                cached_tokens: 8
            })
        );
        let v = json!({"usage":{"prompt_tokens":10,"completion_tokens":4,"prompt_tokens_details":null}});
        assert_eq!(parse_usage(&v).map(|u| u.cached_tokens), Some(0));
        assert_eq!(parse_usage(&json!({"usage":null})), None);
        assert_eq!(parse_usage(&json!({"choices":[]})), None);
        assert_eq!(parse_usage(&json!([1])), None);
        assert_eq!(
            parse_usage_bytes(br#"{"usage":{"prompt_tokens":1},"usage":{"prompt_tokens":2}}"#)
                .map(|u| u.prompt_tokens),
            Some(2)
        );
        assert_eq!(parse_usage_bytes(b"[DONE]"), None);
    }

    #[test]
    fn usage_only_frames() {
        assert!(is_usage_only_event(
            br#"{"id":"x","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2}}"#
        ));
        assert!(is_usage_only_event(
            br#"{"id":"x","usage":{"prompt_tokens":1}}"#
        ));
        assert!(is_usage_only_event(br#"{"choices":null,"usage":{}}"#));
        assert!(!is_usage_only_event(
            br#"{"choices":[{"delta":{"content":"a"}}],"usage":{"prompt_tokens":1}}"#
        ));
        assert!(!is_usage_only_event(br#"{"choices":[],"usage":null}"#));
        assert!(!is_usage_only_event(br#"{"choices":[]}"#));
        assert!(!is_usage_only_event(br#"{"choices":{},"usage":{}}"#));
        assert!(!is_usage_only_event(br#"{"choices":[],"usage":{"#));
        assert!(!is_usage_only_event(b"[DONE]"));
    }

    /// The whole parse of a frame, as `frame_usage` read every usage
    /// frame before its shortcut (after the same key search).
    fn whole_frame_usage(data: &[u8]) -> Option<(Usage, bool)> {
        if !super::super::scan::key_has_object(data, &USAGE_KEY) {
            return None;
        }
        parsed_frame_usage(data)
    }

    /// The usage frames engines send take the shortcut (control for the
    /// proptest below, which only checks that the two agree).
    #[test]
    fn engine_usage_frames_are_read_without_the_whole_parse() {
        let frames = [
            r#"{"id":"c-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":2,"completion_tokens":3,"total_tokens":5,"prompt_tokens_details":{"cached_tokens":1}}}"#,
            r#"{"id":"c-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[ ],"usage":{"prompt_tokens":2,"completion_tokens":3,"total_tokens":5}}"#,
            r#"{"id":"c-1","choices":[{"index":0,"delta":{"content":"x"}}],"usage":{"prompt_tokens":2,"completion_tokens":3}}"#,
        ];
        let expect = [Some(true), Some(true), None];
        for (frame, only) in frames.iter().zip(expect) {
            let f = frame.as_bytes();
            assert!(trailing_usage(f).is_some(), "{frame}");
            assert_eq!(choices_say_usage_only(f), only, "{frame}");
            assert_eq!(frame_usage(f), whole_frame_usage(f), "{frame}");
        }
        assert_eq!(
            frame_usage(frames[0].as_bytes()).map(|(u, _)| u.cached_tokens),
            Some(1)
        );
    }

    // ---- property test: random JSON with random formatting ----

    fn usage_key_strategy() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("prompt_tokens".to_string()),
            Just("completion_tokens".to_string()),
            Just("prompt_tokens_details".to_string()),
            Just("cached_tokens".to_string()),
            Just("choices".to_string()),
            Just("usage".to_string()),
            "[a-z_]{0,8}",
        ]
    }

    /// Usage-like values: the usage keys at every level, counts and
    /// objects more often than the general strategy gives them.
    fn usage_value_strategy() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            4 => (0u64..100_000).prop_map(|n| json!(n)),
            1 => value_strategy(),
            1 => Just(json!([])),
        ];
        leaf.prop_recursive(4, 32, 6, |inner| {
            proptest::collection::vec((usage_key_strategy(), inner), 0..6)
                .prop_map(|kv| Value::Object(kv.into_iter().collect()))
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]
        /// Wherever the byte walk reads a usage object, it reads serde's.
        #[test]
        fn prop_the_usage_walk_reads_as_serde(usage in usage_value_strategy(), seed in 1u64..) {
            let mut w = Writer { out: String::new(), seed };
            w.value(&usage);
            let raw = w.out.into_bytes();
            let serde_read = serde_json::from_slice::<UsageMember>(&raw).ok().and_then(|u| u.0);
            if let Some((walked, len)) = super::super::usage_object::read(&raw) {
                prop_assert_eq!(Some(walked), serde_read);
                prop_assert_eq!(len, raw.len());
            }
        }

        /// A frame's usage and usage-only verdict, with the shortcuts, are
        /// the whole parse's on valid JSON.
        #[test]
        fn prop_frame_usage_reads_as_the_whole_parse(
            members in proptest::collection::vec((usage_key_strategy(), usage_value_strategy()), 0..6),
            seed in 1u64..,
        ) {
            let frame = Value::Object(members.into_iter().collect());
            let mut w = Writer { out: String::new(), seed };
            w.value(&frame);
            let raw = w.out.into_bytes();
            prop_assert_eq!(frame_usage(&raw), whole_frame_usage(&raw));
            // From the end an answer's usage is read whatever its `choices`
            // hold, as the `Value` path reads it; the typed envelope, which
            // the search falls back to, gives up on a `choices` that is not
            // an array.
            let answer = answer_usage(&raw);
            prop_assert!(
                answer == parse_usage_bytes(&raw) || answer == parse_usage(&frame),
                "{:?}", String::from_utf8_lossy(&raw)
            );
        }
    }
}
