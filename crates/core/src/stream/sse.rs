//! Server-sent-events framing for the response path.
//!
//! Upstream chunks are cut wherever the engine's socket writes happened to
//! land, so an SSE event can straddle two (or more) chunks. [`SseSplitter`]
//! re-frames them while copying as little as possible: events that are
//! complete inside a chunk are handed out as slices of that chunk, and only
//! the unfinished tail is kept between calls.
//!
//! Hand-written rather than taken from an SSE crate: those parse events into
//! fields (allocating, normalising line endings), while the proxy must hand
//! each event on byte for byte, out of the chunk it arrived in, so that a
//! stream with nothing to change reaches the client untouched.
//!
//! Line endings: `\n` and `\r\n` (in any mix) are recognised. A bare `\r`
//! line ending, which the SSE spec also allows, is not: no OpenAI-compatible
//! engine emits it, and supporting it would force the splitter to hold a
//! complete event whose last byte is `\r` until the next chunk shows whether
//! a `\n` follows — exactly the hold-back this module must avoid.

use std::borrow::Cow;

/// Where the scanner stands relative to the current line. Kept between
/// `push` calls so that a terminator cut by a chunk boundary (`"\n" | "\n"`,
/// `"\r\n\r" | "\n"`, ...) is still recognised without re-scanning the tail.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum LineState {
    /// Nothing of the current line seen yet: a `\n` here ends the event.
    #[default]
    LineStart,
    /// The current line so far is a lone `\r`: a `\n` makes it a blank line.
    LineStartCr,
    /// The current line has content; only a `\n` changes anything.
    InLine,
}

/// Buffers bigger than this are released rather than kept for reuse, so one
/// oversized event does not pin its memory for the rest of a long stream.
const KEEP_BUFFER_CAPACITY: usize = 64 * 1024;

/// Splits a byte stream into SSE events (each ending at a blank line).
#[derive(Debug, Default)]
pub struct SseSplitter {
    /// Bytes of the event that the last chunk ended in the middle of.
    pending: Vec<u8>,
    /// Scanner state at the end of `pending`; `LineStart` when it is empty.
    state: LineState,
}

impl SseSplitter {
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds one chunk; calls `on_event` for each complete event, in order,
    /// with its exact bytes including the terminating blank line and what
    /// the scan learnt of its lines (see [`Event::data`]). The bytes of an
    /// unfinished event stay buffered until a later chunk ends it.
    pub fn push_events(&mut self, chunk: &[u8], mut on_event: impl FnMut(Event<'_>)) {
        let mut rest = chunk;
        if !self.pending.is_empty() {
            let mut lines = 0;
            match scan_event_end(rest, &mut self.state, &mut lines) {
                Some(end) => {
                    self.pending.extend_from_slice(&rest[..end]);
                    on_event(Event {
                        bytes: &self.pending,
                        one_line: false,
                    });
                    self.reset_pending();
                    rest = &rest[end..];
                }
                None => {
                    self.pending.extend_from_slice(rest);
                    return;
                }
            }
        }
        // From here on events are emitted straight out of the chunk; only
        // the final partial one is copied.
        loop {
            let mut state = LineState::LineStart;
            let mut lines = 0;
            match scan_event_end(rest, &mut state, &mut lines) {
                Some(end) => {
                    on_event(Event {
                        bytes: &rest[..end],
                        one_line: lines == 1,
                    });
                    rest = &rest[end..];
                }
                None => {
                    self.pending.extend_from_slice(rest);
                    self.state = state;
                    return;
                }
            }
        }
    }

    /// End of stream: the bytes of an unterminated final event, if any.
    pub fn finish(&mut self) -> Option<Vec<u8>> {
        self.state = LineState::LineStart;
        if self.pending.is_empty() {
            None
        } else {
            Some(std::mem::take(&mut self.pending))
        }
    }

    /// Bytes currently held back (the unfinished event). Callers use this to
    /// cap what a peer that never ends an event can make us buffer.
    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }

    fn reset_pending(&mut self) {
        self.state = LineState::LineStart;
        if self.pending.capacity() > KEEP_BUFFER_CAPACITY {
            self.pending = Vec::new();
        } else {
            self.pending.clear();
        }
    }
}

/// One complete event out of the splitter.
#[derive(Debug, Clone, Copy)]
pub struct Event<'a> {
    /// Its exact bytes, the blank line that ends it included.
    pub bytes: &'a [u8],
    /// The scan saw it start and found one line before the blank one.
    one_line: bool,
}

impl<'a> Event<'a> {
    /// [`event_data`], without looking for line breaks the splitter has
    /// already found: every frame of every stream comes here.
    pub fn data(&self) -> Option<Cow<'a, [u8]>> {
        if self.one_line {
            if let Some(value) = self.bytes.strip_prefix(b"data: ") {
                return Some(Cow::Borrowed(without_line_ends(value)));
            }
        }
        event_data(self.bytes)
    }
}

/// Advances `state` over `bytes`; returns the index just past the first
/// event terminator, or `None` (with `state` describing the end of `bytes`).
/// `lines` counts the lines with content it entered.
fn scan_event_end(bytes: &[u8], state: &mut LineState, lines: &mut u32) -> Option<usize> {
    let mut i = 0;
    while i < bytes.len() {
        match *state {
            LineState::InLine => match memchr::memchr(b'\n', &bytes[i..]) {
                Some(off) => {
                    i += off + 1;
                    *state = LineState::LineStart;
                }
                None => return None,
            },
            LineState::LineStart | LineState::LineStartCr => {
                let b = bytes[i];
                i += 1;
                if b == b'\n' {
                    *state = LineState::LineStart;
                    return Some(i);
                }
                *state = if b == b'\r' && *state == LineState::LineStart {
                    LineState::LineStartCr
                } else {
                    *lines += 1;
                    LineState::InLine
                };
            }
        }
    }
    None
}

/// Splits an SSE line into its content and its terminator (`\n`, `\r\n` or
/// nothing for an unterminated last line).
pub(crate) fn split_line_terminator(line: &[u8]) -> (&[u8], &[u8]) {
    let content_len = match line {
        [.., b'\r', b'\n'] => line.len() - 2,
        [.., b'\n'] => line.len() - 1,
        _ => line.len(),
    };
    line.split_at(content_len)
}

/// The value of a `data` field line, or `None` for any other line. A line
/// that is exactly `data` counts too (SSE: a field with no colon has an
/// empty value).
pub(crate) fn data_field_value(content: &[u8]) -> Option<&[u8]> {
    if content == b"data" {
        return Some(&[]);
    }
    let value = content.strip_prefix(b"data:")?;
    Some(value.strip_prefix(b" ").unwrap_or(value))
}

/// The data payload of one event: its `data` lines joined by `\n`, with one
/// optional space after the colon stripped. `None` if there is no data line.
/// Borrowed in the usual single-line case, so no copy is made.
pub fn event_data(event: &[u8]) -> Option<Cow<'_, [u8]>> {
    match single_data_line(event) {
        Some(value) => Some(Cow::Borrowed(value)),
        None => data_lines(event),
    }
}

/// The type an event names on its `event:` line (the last such line, as
/// the SSE spec reads them; one space after the colon cut off) and its data
/// as [`event_data`] reads it, from one walk of its lines: the events of
/// the typed APIs (Anthropic Messages, OpenAI Responses) carry both.
pub fn event_type_and_data(event: &[u8]) -> (Option<&[u8]>, Option<Cow<'_, [u8]>>) {
    let mut name = None;
    let mut data: Option<Cow<'_, [u8]>> = None;
    for line in lines(event) {
        let (content, _) = split_line_terminator(line);
        if let Some(value) = data_field_value(content) {
            match &mut data {
                None => data = Some(Cow::Borrowed(value)),
                Some(joined) => {
                    let joined = joined.to_mut();
                    joined.push(b'\n');
                    joined.extend_from_slice(value);
                }
            }
        } else if content == b"event" {
            name = Some(&b""[..]);
        } else if let Some(value) = content.strip_prefix(b"event:") {
            name = Some(value.strip_prefix(b" ").unwrap_or(value));
        }
    }
    (name, data)
}

/// [`event_data`] line by line, for any shape of event.
fn data_lines(event: &[u8]) -> Option<Cow<'_, [u8]>> {
    event_type_and_data(event).1
}

/// The usual event, `data: VALUE` and the blank line, read without
/// walking its lines (every frame of every stream comes here): the value,
/// or `None` for any other shape.
fn single_data_line(event: &[u8]) -> Option<&[u8]> {
    let rest = event.strip_prefix(b"data: ")?;
    let nl = memchr::memchr(b'\n', rest)?;
    matches!(&rest[nl + 1..], b"\n" | b"\r\n").then(|| without_line_ends(rest))
}

/// A one-line event's value (`data: ` already cut off): its line's end and
/// the blank line's, each `\n` or `\r\n`, cut off.
fn without_line_ends(value: &[u8]) -> &[u8] {
    let (line, _) = split_line_terminator(value);
    split_line_terminator(line).0
}

/// The lines of `bytes`, each with its `\n` (the last one without, when
/// unterminated): `split_inclusive` on `\n`, found with memchr rather than
/// byte by byte, since every frame of every stream goes through here.
fn lines(bytes: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut rest = bytes;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let end = memchr::memchr(b'\n', rest).map_or(rest.len(), |i| i + 1);
        let (line, tail) = rest.split_at(end);
        rest = tail;
        Some(line)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream::scan::find;

    /// Complete events of every shape the one-line readings must agree on
    /// with the line walk.
    const EVENT_SHAPES: [&[u8]; 13] = [
        b"data: {\"a\":1}\n\n",
        b"data: {\"a\":1}\r\n\r\n",
        b"data: {\"a\":1}\r\n\n",
        b"data: x\n\r\n",
        b"data: a\rb\n\n",
        b"data: x\r\r\n\n",
        b"data:  two spaces\n\n",
        b"data:nospace\n\n",
        b"data: \n\n",
        b"data: a\ndata: b\n\n",
        b"event: x\ndata: y\n\n",
        b"\rdata: x\n\n",
        b": comment\n\n",
    ];

    /// Events of more than one line: the splitter marks none of them.
    const MULTI_LINE: [&[u8]; 2] = [b"data: a\ndata: b\n\n", b"event: x\ndata: y\n\n"];

    /// An event's type from its `event:` line, beside its data.
    #[test]
    fn the_event_line_names_the_type() {
        let read = |e: &[u8]| {
            let (name, data) = event_type_and_data(e);
            (name.map(<[u8]>::to_vec), data.map(|d| d.into_owned()))
        };
        let some = |s: &[u8]| Some(s.to_vec());
        assert_eq!(read(b"event: x\ndata: y\n\n"), (some(b"x"), some(b"y")));
        assert_eq!(
            read(b"data: y\r\nevent:x\r\n\r\n"),
            (some(b"x"), some(b"y"))
        );
        assert_eq!(read(b"event: a\nevent: b\n\n"), (some(b"b"), None));
        assert_eq!(read(b"event\ndata: y\n\n"), (some(b""), some(b"y")));
        assert_eq!(read(b"events: x\ndata: y\n\n"), (None, some(b"y")));
        assert_eq!(
            read(b"event: x\ndata: a\ndata: b"),
            (some(b"x"), some(b"a\nb"))
        );
    }

    /// The one-line shortcut reads what the line walk reads, and is taken
    /// only for the shape it knows.
    #[test]
    fn a_single_data_line_reads_as_the_line_walk() {
        // An unterminated event too, which only `finish` hands out.
        for event in EVENT_SHAPES.into_iter().chain([&b"data: x\n"[..]]) {
            let walked = data_lines(event);
            assert_eq!(
                event_data(event),
                walked,
                "{:?}",
                String::from_utf8_lossy(event)
            );
            if let Some(short) = single_data_line(event) {
                assert_eq!(Some(Cow::Borrowed(short)), walked);
            }
        }
        assert!(single_data_line(b"data: x\n\n").is_some());
        assert!(single_data_line(b"data: a\ndata: b\n\n").is_none());
    }

    /// An event the splitter marks as one line reads as the line walk, in
    /// one chunk (marked) and cut in two (read the long way).
    #[test]
    fn a_split_event_reads_as_the_line_walk() {
        for event in EVENT_SHAPES {
            let walked = data_lines(event);
            for cut in [event.len(), 3] {
                let mut splitter = SseSplitter::new();
                let mut seen = Vec::new();
                for part in [&event[..cut], &event[cut..]] {
                    splitter.push_events(part, |ev| {
                        seen.push((ev.data().map(|d| d.into_owned()), ev.one_line))
                    });
                }
                assert_eq!(seen.len(), 1);
                let (data, one_line) = &seen[0];
                assert_eq!(
                    data.as_deref(),
                    walked.as_deref(),
                    "{:?}",
                    String::from_utf8_lossy(event)
                );
                // Control: the single-line reading is the one taken here.
                assert_eq!(
                    *one_line,
                    cut == event.len() && !MULTI_LINE.contains(&event),
                    "{:?}",
                    String::from_utf8_lossy(event)
                );
            }
        }
    }

    #[test]
    fn lines_match_split_inclusive() {
        for text in [
            &b""[..],
            b"\n",
            b"a",
            b"a\n",
            b"a\nb",
            b"\n\na\r\n\nb\n",
            b"data: x\n\n",
        ] {
            let ours: Vec<&[u8]> = lines(text).collect();
            let std: Vec<&[u8]> = text.split_inclusive(|&b| b == b'\n').collect();
            assert_eq!(ours, std, "{text:?}");
        }
    }
    use proptest::prelude::*;

    fn collect(splitter: &mut SseSplitter, chunk: &[u8]) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        splitter.push_events(chunk, |ev| out.push(ev.bytes.to_vec()));
        out
    }

    fn split_all(chunks: &[&[u8]]) -> (Vec<Vec<u8>>, Option<Vec<u8>>) {
        let mut s = SseSplitter::new();
        let mut events = Vec::new();
        for c in chunks {
            events.extend(collect(&mut s, c));
        }
        (events, s.finish())
    }

    const LF_STREAM: &[u8] =
        b"data: {\"a\":1}\n\n: keepalive\n\nevent: x\ndata: l1\ndata: l2\n\ndata: [DONE]\n\n";
    const CRLF_STREAM: &[u8] =
        b"data: {\"a\":1}\r\n\r\n: keepalive\r\n\r\nevent: x\r\ndata: l1\r\ndata: l2\r\n\r\ndata: [DONE]\r\n\r\n";
    const MIXED_STREAM: &[u8] = b"data: a\r\n\ndata: b\n\r\ndata: c\r\n\r\n";

    fn expected(stream: &[u8], term: &[u8]) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let mut rest = stream;
        while let Some(i) = find(rest, term) {
            out.push(rest[..i + term.len()].to_vec());
            rest = &rest[i + term.len()..];
        }
        assert!(rest.is_empty());
        out
    }

    #[test]
    fn splits_whole_stream() {
        for (stream, term) in [(LF_STREAM, &b"\n\n"[..]), (CRLF_STREAM, b"\r\n\r\n")] {
            let (events, rest) = split_all(&[stream]);
            assert_eq!(events, expected(stream, term));
            assert_eq!(events.len(), 4);
            assert_eq!(rest, None);
        }
        let (events, _) = split_all(&[MIXED_STREAM]);
        assert_eq!(
            events,
            vec![
                b"data: a\r\n\n".to_vec(),
                b"data: b\n\r\n".to_vec(),
                b"data: c\r\n\r\n".to_vec()
            ]
        );
    }

    #[test]
    fn every_split_point_in_two_and_three_chunks() {
        for stream in [LF_STREAM, CRLF_STREAM, MIXED_STREAM] {
            let (whole, _) = split_all(&[stream]);
            for i in 0..=stream.len() {
                let (events, rest) = split_all(&[&stream[..i], &stream[i..]]);
                assert_eq!(events, whole, "split at {i}");
                assert_eq!(rest, None);
                for j in i..=stream.len() {
                    let (events, rest) = split_all(&[&stream[..i], &stream[i..j], &stream[j..]]);
                    assert_eq!(events, whole, "split at {i},{j}");
                    assert_eq!(rest, None);
                }
            }
        }
    }

    #[test]
    fn complete_event_is_never_held() {
        let mut s = SseSplitter::new();
        assert!(collect(&mut s, b"data: x\n").is_empty());
        assert_eq!(s.pending_len(), 8);
        // The blank line arriving alone completes the held event at once.
        assert_eq!(collect(&mut s, b"\n"), vec![b"data: x\n\n".to_vec()]);
        assert_eq!(s.pending_len(), 0);
        // CRLF terminator cut between '\r' and '\n'.
        assert!(collect(&mut s, b"data: y\r\n\r").is_empty());
        assert_eq!(
            collect(&mut s, b"\ndata: z"),
            vec![b"data: y\r\n\r\n".to_vec()]
        );
        assert_eq!(s.finish(), Some(b"data: z".to_vec()));
        assert_eq!(s.finish(), None);
    }

    #[test]
    fn comments_and_blank_events_pass_as_events() {
        let (events, _) = split_all(&[b"\n: keepalive\n\n\r\n"]);
        assert_eq!(
            events,
            vec![
                b"\n".to_vec(),
                b": keepalive\n\n".to_vec(),
                b"\r\n".to_vec()
            ]
        );
    }

    #[test]
    fn bare_cr_is_content() {
        let (events, rest) = split_all(&[b"data: a\r\r\ndata: b\n\n"]);
        assert_eq!(events, vec![b"data: a\r\r\ndata: b\n\n".to_vec()]);
        assert_eq!(rest, None);
    }

    #[test]
    fn event_data_variants() {
        assert_eq!(
            event_data(b"data: {\"a\":1}\n\n").as_deref(),
            Some(&b"{\"a\":1}"[..])
        );
        assert!(matches!(event_data(b"data: x\n\n"), Some(Cow::Borrowed(_))));
        assert_eq!(event_data(b"data:x\r\n\r\n").as_deref(), Some(&b"x"[..]));
        assert_eq!(event_data(b"data:  x\n\n").as_deref(), Some(&b" x"[..]));
        assert_eq!(
            event_data(b"event: e\ndata: l1\n: c\ndata:l2\ndata\n\n").as_deref(),
            Some(&b"l1\nl2\n"[..])
        );
        assert_eq!(event_data(b": keepalive\n\n"), None);
        assert_eq!(event_data(b"\n"), None);
        assert_eq!(event_data(b"datax: y\n\n"), None);
        assert_eq!(event_data(b"data: [DONE]").as_deref(), Some(&b"[DONE]"[..]));
    }

    /// One event: field/comment lines (no CR/LF inside, non-empty) with a
    /// random line ending each, then a blank line.
    fn event_strategy() -> impl Strategy<Value = Vec<u8>> {
        let line = prop_oneof![
            "[^\r\n]{0,12}".prop_map(|s| format!("data: {s}")),
            "[^\r\n]{0,12}".prop_map(|s| format!(": {s}")),
            "[a-z]{1,5}".prop_map(|s| format!("event: {s}")),
            "[^\r\n]{1,12}",
        ];
        let eol = prop_oneof![Just("\n"), Just("\r\n")];
        (proptest::collection::vec((line, eol.clone()), 0..4), eol).prop_map(|(lines, end)| {
            let mut ev = Vec::new();
            for (l, e) in lines {
                ev.extend_from_slice(l.as_bytes());
                ev.extend_from_slice(e.as_bytes());
            }
            ev.extend_from_slice(end.as_bytes());
            ev
        })
    }

    fn chunk_at(input: &[u8], cuts: &[usize]) -> Vec<Vec<u8>> {
        let mut points: Vec<usize> = cuts.iter().map(|c| c % (input.len() + 1)).collect();
        points.sort_unstable();
        let mut chunks = Vec::new();
        let mut prev = 0;
        for p in points {
            chunks.push(input[prev..p].to_vec());
            prev = p;
        }
        chunks.push(input[prev..].to_vec());
        chunks
    }

    proptest! {
        #[test]
        fn prop_split_any_chunking(
            events in proptest::collection::vec(event_strategy(), 0..12),
            tail in "[^\r\n]{0,8}",
            cuts in proptest::collection::vec(any::<usize>(), 0..8),
        ) {
            let mut input: Vec<u8> = events.concat();
            input.extend_from_slice(tail.as_bytes());
            let mut s = SseSplitter::new();
            let mut got = Vec::new();
            let mut concat = Vec::new();
            for c in chunk_at(&input, &cuts) {
                s.push_events(&c, |ev| {
                    assert_eq!(ev.data(), event_data(ev.bytes));
                    got.push(ev.bytes.to_vec());
                    concat.extend_from_slice(ev.bytes);
                });
            }
            let rest = s.finish();
            prop_assert_eq!(&got, &events);
            prop_assert_eq!(rest.clone(), (!tail.is_empty()).then(|| tail.as_bytes().to_vec()));
            concat.extend(rest.unwrap_or_default());
            prop_assert_eq!(concat, input);
        }
    }
}
