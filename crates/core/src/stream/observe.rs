//! What the gateway learns from a response without changing it: whether an
//! SSE event carries generated output, and the engine's token usage.

use super::scan::{first_nonempty_string, nonempty_string_at, Key};
use super::usage;
use super::Usage;
use std::sync::LazyLock;

/// What the proxy learns from a stream without changing it.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct StreamStats {
    /// Events that carried generated output (see [`observe_event`]).
    pub content_events: u64,
    /// The last `usage` object seen (engines report cumulative counts).
    pub usage: Option<Usage>,
}

/// Updates `stats` from one event's data payload.
///
/// This runs on every frame of every stream, so it avoids JSON parsing on
/// the hot path:
/// - usage: a frame is parsed only if it has a `"usage"` key whose value
///   opens an object (typically just the last frame; `"usage": null`
///   frames are not parsed), and then only the `usage` counts are read.
/// - content: decided by a byte search for a `"content"`, `"text"`,
///   `"reasoning"`, `"reasoning_content"` or `"arguments"` key whose value
///   is a non-empty string. For valid JSON this cannot be fooled by string
///   contents: inside a string every `"` is escaped, and the backslash
///   parity check rejects those. The trade-off is that the search does not
///   know which object the key belongs to, so a frame that has such a key
///   outside `choices[]` (no engine sends one today) would count, and a
///   malformed frame may be counted either way. `arguments` (tool-call
///   deltas) is included because a tool-only answer is still generated
///   output, and leaving it out would make it look like an empty stream.
/// - `hint` is where the previous frame of the same stream had its content
///   key (see [`ContentHint`]); a fresh one for a lone frame.
///
/// Returns whether the event is a usage-only frame (see
/// [`usage::is_usage_only_event`]), from the same parse.
pub fn observe_event(event_data: &[u8], stats: &mut StreamStats, hint: &mut ContentHint) -> bool {
    // The end marker holds no key, so every search below would miss; it
    // ends every OpenAI stream, so they are not run for it.
    if event_data == DONE {
        return false;
    }
    if carries_content(event_data, hint) {
        stats.content_events += 1;
    }
    match usage::frame_usage(event_data) {
        Some((u, usage_only)) => {
            stats.usage = Some(u);
            usage_only
        }
        None => false,
    }
}

/// The data of the event that ends an OpenAI-style stream.
const DONE: &[u8] = b"[DONE]";

/// Where the last frame's content key was found. A stream's frames share
/// one shape (the same id, model and nesting), so the next frame's key is
/// usually at the same offset: it is checked there first, with one
/// comparison instead of up to five searches. The answer is the one the
/// searches give: a key found at the hint is one they would find.
#[derive(Debug, Default, Clone, Copy)]
pub struct ContentHint(Option<(usize, usize)>);

/// The content keys, each searcher built once (see [`Key`]).
static CONTENT_KEYS: LazyLock<[Key; 5]> = LazyLock::new(|| {
    [
        "content",
        "text",
        "reasoning",
        "reasoning_content",
        "arguments",
    ]
    .map(Key::new)
});

fn carries_content(data: &[u8], hint: &mut ContentHint) -> bool {
    if let Some((at, k)) = hint.0 {
        if nonempty_string_at(data, at, &CONTENT_KEYS[k]) {
            return true;
        }
    }
    for (k, key) in CONTENT_KEYS.iter().enumerate() {
        if let Some(at) = first_nonempty_string(data, key) {
            hint.0 = Some((at, k));
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One frame on its own, without a stream's hint.
    fn observe_alone(data: &[u8], stats: &mut StreamStats) -> bool {
        observe_event(data, stats, &mut ContentHint::default())
    }

    /// With a hint from earlier frames, every frame is judged as without
    /// one: a hint that points at the key, at another key, past the end, or
    /// inside a string value.
    #[test]
    fn a_hint_never_changes_the_answer() {
        let frames: [&[u8]; 9] = [
            br#"{"id":"a","choices":[{"delta":{"content":"Hi"}}]}"#,
            br#"{"id":"a","choices":[{"delta":{"content":"yo"}}]}"#,
            br#"{"id":"a","choices":[{"delta":{"content":""}}]}"#,
            br#"{"id":"ab","choices":[{"delta":{"content":"x"}}]}"#,
            br#"{"id":"a","choices":[{"delta":{"reasoning_content":"r"}}]}"#,
            br#"{"id":"a","choices":[{"delta":{"x":"\"content\":\"y"}}]}"#,
            br#"{"choices":[{"delta":{"content":null}}]}"#,
            br#"{"a":1}"#,
            br#"{"id":"a","choices":[{"text":"t"}]}"#,
        ];
        for first in frames {
            for then in frames {
                let mut hint = ContentHint::default();
                let mut hinted = StreamStats::default();
                observe_event(first, &mut hinted, &mut hint);
                let before = hinted.content_events;
                observe_event(then, &mut hinted, &mut hint);
                let mut alone = StreamStats::default();
                observe_alone(then, &mut alone);
                assert_eq!(hinted.content_events - before, alone.content_events);
            }
        }
        // Control: the hint is taken (a second identical frame is found at it).
        let mut hint = ContentHint::default();
        observe_event(frames[0], &mut StreamStats::default(), &mut hint);
        assert!(hint.0.is_some());
    }

    #[test]
    fn observe_counts_content_and_captures_usage() {
        let mut stats = StreamStats::default();
        let frames: [&[u8]; 8] = [
            br#"{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#,
            br#"{"choices":[{"index":0,"delta":{"content":"Hi"}}]}"#,
            br#"{"choices":[{"index":0,"delta":{"reasoning_content":"hmm"}}]}"#,
            br#"{"choices":[{"index":0,"text":"x"}]}"#,
            br#"{"choices":[{"index":0,"delta":{"content" : "\"q"}}]}"#,
            br#"{"choices":[{"index":0,"delta":{"content":null},"finish_reason":"stop"}]}"#,
            br#"{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":2}}}"#,
            b"[DONE]",
        ];
        for f in frames {
            observe_alone(f, &mut stats);
        }
        assert_eq!(stats.content_events, 4);
        assert_eq!(
            stats.usage,
            Some(Usage {
                prompt_tokens: 5,
                completion_tokens: 3,
                cached_tokens: 2
            })
        );
    }

    #[test]
    fn observe_is_not_fooled_by_string_contents() {
        let mut stats = StreamStats::default();
        // The needle appears only inside a string value (escaped quotes).
        observe_alone(
            br#"{"choices":[{"delta":{"content":""},"x":"\"content\":\"y"}]}"#,
            &mut stats,
        );
        // A key containing an escaped quote right before the needle.
        observe_alone(br#"{"choices":[],"a\"content":"y"}"#, &mut stats);
        observe_alone(br#"{"note":"the \"usage\" word","usage":null}"#, &mut stats);
        assert_eq!(stats, StreamStats::default());
        // Tool-call argument deltas are generated output too.
        observe_alone(
            br#"{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\""}}]}}]}"#,
            &mut stats,
        );
        assert_eq!(stats.content_events, 1);
    }
}
