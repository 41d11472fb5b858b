//! A fast first reading of a request body: checks that it is one JSON
//! object and finds the top-level members the view keeps, at a fraction of
//! serde_json's cost on long strings.
//!
//! Why by hand: serde_json skips a string 8 bytes at a time and then
//! validates its UTF-8 separately (about 2.8 instructions a byte, 850 k for
//! a 300 KB prompt, most of the gateway's cost on such a body); this finds a
//! string's end with `memchr2` (vectorised) and checks each run between
//! escapes with one vectorisable fold (about 0.3 a byte). No crate offers
//! what the view needs, which is serde_json's verdict exactly: a faster
//! parser (simd-json, sonic-rs) draws its own lines on numbers, surrogates
//! and nesting. And it reads a body in the pieces it was received in, so a
//! long prompt is never joined into one buffer just to be read.
//!
//! So this reading only ever says "valid, and here are the members" for a
//! body serde_json also accepts, and gives up (`None`) on anything it is
//! not sure of, leaving the verdict (and the error message) to the serde
//! path of [`super::RequestView::parse`]: escaped top-level keys, `\u`
//! escapes of surrogates, numbers that could leave f64's range, nesting
//! past [`MAX_DEPTH`], every malformed body, and a top-level key or kept
//! member cut by a piece boundary (the caller joins the pieces and reads
//! again). `prop_the_skim_agrees_with_serde` and the `request_body` fuzz
//! target hold it to that; `prop_pieces_read_as_the_whole` holds a body
//! cut anywhere to the reading of the whole.

use bytes::Bytes;
use memchr::memchr2;

use crate::json_bytes::{is_ws, unescape};
use crate::session::content::{BlockSink, Member, Source};

/// The members [`super::RequestView`] keeps, in the order of its fields:
/// the skim looks for these and no other.
const KEPT: [&str; 9] = [
    "model",
    "stream",
    "stream_options",
    "metadata",
    "litellm_metadata",
    "user",
    "prompt_cache_key",
    "previous_response_id",
    "conversation",
];

/// The members the view keeps, in the order of [`KEPT`].
pub(super) type Found<'a> = [Option<&'a [u8]>; KEPT.len()];

/// Containers deep, the body's own object included, past which the serde
/// path decides (serde_json refuses the 128th level).
pub(super) const MAX_DEPTH: usize = 100;

/// The kept members' raw values (the last of a repeated one), or `None`
/// when the serde path must decide.
#[cfg(test)]
pub(super) fn skim(body: &[u8]) -> Option<Found<'_>> {
    skim_pieces(body, &[], None)
}

/// [`skim`] of the body made of `first` followed by `rest`; with a `sink`,
/// the conversation's blocks go into it on the way (the verdict is the
/// same either way).
pub(super) fn skim_pieces<'a>(
    first: &'a [u8],
    rest: &'a [Bytes],
    mut sink: Option<&mut BlockSink>,
) -> Option<Found<'a>> {
    let src = sink.is_some().then(|| Source::new(first, rest));
    let mut r = Reader {
        cur: first,
        rest,
        at: 0,
        piece: 0,
    };
    let mut found: Found = [None; KEPT.len()];
    r.ws();
    r.eat(b'{')?;
    r.ws();
    if r.peek()? == b'}' {
        r.at += 1;
    } else {
        loop {
            r.eat(b'"')?;
            r.peek()?;
            let key_start = r.mark();
            r.string()?;
            let key = r.since(key_start, 1)?;
            // An escaped key spells a name only once decoded.
            if memchr::memchr(b'\\', key).is_some() {
                return None;
            }
            r.ws();
            r.eat(b':')?;
            r.ws();
            r.peek()?;
            let value_start = r.mark();
            match (sink.as_deref_mut(), &src, Member::of_key(key)) {
                (Some(sink), Some(src), Some(member)) => r.member(member, sink, src)?,
                _ => r.value(2)?,
            }
            if let Some(slot) = KEPT.iter().position(|name| name.as_bytes() == key) {
                found[slot] = Some(r.since(value_start, 0)?);
            }
            r.ws();
            match r.next()? {
                b',' => r.ws(),
                b'}' => break,
                _ => return None,
            }
        }
    }
    r.ws();
    r.peek().is_none().then_some(found)
}

/// Where [`Reader::walk`] is in a conversation element: its own members
/// (a message's `role`, an item's `type`), the parts of its `content`,
/// one part (whose `type` says `tool_use`, `tool_result`), or deeper.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Level {
    Root,
    Parts,
    Part,
    Inside,
}

/// Where a token started: the piece (counted from the first) and the
/// offset in it.
#[derive(Clone, Copy)]
struct Mark {
    piece: usize,
    at: usize,
}

struct Reader<'a> {
    /// The piece being read, and the pieces after it.
    cur: &'a [u8],
    rest: &'a [Bytes],
    at: usize,
    piece: usize,
}

impl<'a> Reader<'a> {
    #[inline]
    fn peek(&mut self) -> Option<u8> {
        match self.cur.get(self.at) {
            Some(&b) => Some(b),
            None => self.peek_in_next_piece(),
        }
    }

    /// Past the end of a piece, the next one that holds a byte.
    #[cold]
    fn peek_in_next_piece(&mut self) -> Option<u8> {
        while self.at == self.cur.len() {
            self.next_piece()?;
        }
        self.cur.get(self.at).copied()
    }

    fn next_piece(&mut self) -> Option<()> {
        let (next, rest) = self.rest.split_first()?;
        self.cur = next;
        self.rest = rest;
        self.at = 0;
        self.piece += 1;
        Some(())
    }

    fn next(&mut self) -> Option<u8> {
        let b = self.peek()?;
        self.at += 1;
        Some(b)
    }

    fn eat(&mut self, want: u8) -> Option<()> {
        (self.next()? == want).then_some(())
    }

    /// The position of the next byte; call after `peek`, which moves past
    /// a piece's end.
    fn mark(&self) -> Mark {
        Mark {
            piece: self.piece,
            at: self.at,
        }
    }

    /// The bytes from `start` to here, less the last `less` (a closing
    /// quote); `None` when a piece boundary cuts them.
    fn since(&self, start: Mark, less: usize) -> Option<&'a [u8]> {
        let end = self.at.checked_sub(less)?;
        let cur: &'a [u8] = self.cur;
        (start.piece == self.piece).then(|| &cur[start.at..end])
    }

    /// JSON's four whitespace bytes, as serde_json skips them.
    fn ws(&mut self) {
        while self.peek().is_some_and(is_ws) {
            self.at += 1;
        }
    }

    /// One value at `depth` (containers it opens are one deeper).
    fn value(&mut self, depth: usize) -> Option<()> {
        match self.next()? {
            b'"' => self.string(),
            b'{' => self.container(depth, b'}'),
            b'[' => self.container(depth, b']'),
            b't' => self.literal(b"rue"),
            b'f' => self.literal(b"alse"),
            b'n' => self.literal(b"ull"),
            first @ (b'-' | b'0'..=b'9') => self.number(first),
            _ => None,
        }
    }

    /// An object or an array, whose opening byte was read; `close` is
    /// the byte that ends it. Containers it holds are one deeper.
    fn container(&mut self, depth: usize, close: u8) -> Option<()> {
        if depth > MAX_DEPTH {
            return None;
        }
        self.ws();
        if self.peek()? == close {
            self.at += 1;
            return Some(());
        }
        loop {
            if close == b'}' {
                self.eat(b'"')?;
                self.string()?;
                self.ws();
                self.eat(b':')?;
                self.ws();
            }
            self.value(depth + 1)?;
            self.ws();
            match self.next()? {
                b',' => self.ws(),
                b if b == close => return Some(()),
                _ => return None,
            }
        }
    }

    /// A conversation member's value, as [`Self::value`] reads it, its
    /// blocks into `sink`: an array's elements one each, anything else one.
    fn member(&mut self, member: Member, sink: &mut BlockSink, src: &Source) -> Option<()> {
        if self.peek()? != b'[' {
            sink.begin(member);
            self.walk(2, sink, src, Level::Root)?;
            sink.end();
            return Some(());
        }
        self.at += 1;
        self.ws();
        if self.peek()? == b']' {
            self.at += 1;
            return Some(());
        }
        loop {
            sink.begin(member);
            self.walk(3, sink, src, Level::Root)?;
            sink.end();
            self.ws();
            match self.next()? {
                b',' => self.ws(),
                b']' => return Some(()),
                _ => return None,
            }
        }
    }

    /// [`Self::value`] inside a conversation element: its strings into
    /// `sink`, `cache_control` skipped, the element's own `role` or `type`
    /// (`root`) told to it. The checks are `value`'s, so the verdict is.
    fn walk(&mut self, depth: usize, sink: &mut BlockSink, src: &Source, at: Level) -> Option<()> {
        match self.next()? {
            b'"' => {
                self.peek()?;
                let start = src.offset(self.piece, self.at);
                self.string()?;
                sink.string(src, start, src.offset(self.piece, self.at - 1));
                Some(())
            }
            open @ (b'{' | b'[') => {
                if depth > MAX_DEPTH {
                    return None;
                }
                let close = if open == b'{' { b'}' } else { b']' };
                self.ws();
                if self.peek()? == close {
                    self.at += 1;
                    return Some(());
                }
                // An element of a message's `content` array is one part.
                let inner_of_array = if at == Level::Parts {
                    Level::Part
                } else {
                    Level::Inside
                };
                loop {
                    let mut key = None;
                    if close == b'}' {
                        self.eat(b'"')?;
                        self.peek()?;
                        let key_start = self.mark();
                        self.string()?;
                        key = self.since(key_start, 1);
                        self.ws();
                        self.eat(b':')?;
                        self.ws();
                    }
                    let typed = matches!(
                        (at, key),
                        (Level::Root, Some(b"role" | b"type")) | (Level::Part, Some(b"type"))
                    );
                    match key {
                        Some(b"cache_control") => self.value(depth + 1)?,
                        _ if typed && self.peek()? == b'"' => {
                            self.at += 1;
                            self.peek()?;
                            let value_start = self.mark();
                            let start = src.offset(self.piece, self.at);
                            self.string()?;
                            if let Some(kind) = self.since(value_start, 1) {
                                match at {
                                    Level::Root => sink.kind(kind),
                                    _ => sink.block_kind(kind),
                                }
                            }
                            sink.string(src, start, src.offset(self.piece, self.at - 1));
                        }
                        _ => {
                            let inner = match (at, key) {
                                (_, None) => inner_of_array,
                                (Level::Root, Some(b"tool_calls")) => {
                                    sink.calls_tool();
                                    Level::Inside
                                }
                                (Level::Root, Some(b"content")) => Level::Parts,
                                _ => Level::Inside,
                            };
                            self.walk(depth + 1, sink, src, inner)?
                        }
                    }
                    self.ws();
                    match self.next()? {
                        b',' => self.ws(),
                        b if b == close => return Some(()),
                        _ => return None,
                    }
                }
            }
            b't' => self.literal(b"rue"),
            b'f' => self.literal(b"alse"),
            b'n' => self.literal(b"ull"),
            first @ (b'-' | b'0'..=b'9') => self.number(first),
            _ => None,
        }
    }

    fn literal(&mut self, rest: &[u8]) -> Option<()> {
        for &want in rest {
            self.eat(want)?;
        }
        Some(())
    }

    /// The rest of a string whose opening quote was read; `at` ends past
    /// its closing quote. Runs between escapes must hold no control byte
    /// and be valid UTF-8 (a multi-byte sequence never holds `"` or `\`,
    /// so cutting at those keeps every sequence whole; one cut by a piece
    /// boundary is put together from both sides).
    fn string(&mut self) -> Option<()> {
        loop {
            let rest = &self.cur[self.at..];
            let Some(end) = memchr2(b'"', b'\\', rest) else {
                let cut = check_run(rest, true)?;
                self.at = self.cur.len();
                if !cut.is_empty() {
                    self.finish_char(cut)?;
                }
                self.peek()?;
                continue;
            };
            check_run(&rest[..end], false)?;
            self.at += end + 1;
            if rest[end] == b'"' {
                return Some(());
            }
            match self.next()? {
                b'u' => {
                    let mut unit = 0u32;
                    for _ in 0..4 {
                        unit = unit << 4 | char::from(self.next()?).to_digit(16)?;
                    }
                    // A surrogate must pair with the next escape: serde's call.
                    if (0xD800..=0xDFFF).contains(&unit) {
                        return None;
                    }
                }
                letter => {
                    unescape(letter)?;
                }
            }
        }
    }

    /// Completes a character whose first bytes, `cut`, ended a piece, from
    /// the pieces after it.
    #[cold]
    fn finish_char(&mut self, cut: &[u8]) -> Option<()> {
        let mut char_bytes = [0u8; 4];
        let width = match cut[0] {
            0xC0..=0xDF => 2,
            0xE0..=0xEF => 3,
            _ => 4,
        };
        char_bytes[..cut.len()].copy_from_slice(cut);
        for slot in &mut char_bytes[cut.len()..width] {
            *slot = self.next()?;
        }
        std::str::from_utf8(&char_bytes[..width]).ok().map(drop)
    }

    /// A number in JSON's grammar whose value stays well inside f64's range
    /// (at most 17 integer digits and a two-digit exponent), so that
    /// serde_json, which refuses a number out of range, reads it too.
    /// `first` (a sign or a digit) was read.
    fn number(&mut self, first: u8) -> Option<()> {
        let (leading, int_digits) = if first == b'-' {
            (self.peek(), self.digits())
        } else {
            (Some(first), 1 + self.digits())
        };
        match int_digits {
            0 => return None,
            1 => {}
            _ if leading == Some(b'0') => return None,
            n if n > 17 => return None,
            _ => {}
        }
        if self.peek() == Some(b'.') {
            self.at += 1;
            if self.digits() == 0 {
                return None;
            }
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.at += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.at += 1;
            }
            if !(1..=2).contains(&self.digits()) {
                return None;
            }
        }
        Some(())
    }

    fn digits(&mut self) -> usize {
        let mut count = 0;
        while let Some(b'0'..=b'9') = self.peek() {
            self.at += 1;
            count += 1;
        }
        count
    }
}

/// The lowest and highest byte of `run`: one fold that vectorises, with
/// 32-byte vectors where the CPU has AVX2 (twice the bytes of the SSE2
/// every x86-64 has, and the loads folded into the min and max: a third
/// of the instructions a byte).
#[multiversion::multiversion(targets("x86_64+avx2"))]
fn min_max(run: &[u8]) -> (u8, u8) {
    let (mut low, mut high) = (u8::MAX, 0u8);
    for &b in run {
        low = if b < low { b } else { low };
        high = if b > high { b } else { high };
    }
    (low, high)
}

/// Checks a run of string bytes between escapes: no control byte, valid
/// UTF-8. A run that ends its piece (`at_piece_end`) may end in the first
/// bytes of a character the next piece completes: those are returned, for
/// [`Reader::finish_char`]; otherwise the result is empty.
#[inline]
fn check_run(run: &[u8], at_piece_end: bool) -> Option<&[u8]> {
    let (low, high) = min_max(run);
    if low < 0x20 {
        return None;
    }
    if high < 0x80 {
        return Some(&[]);
    }
    match std::str::from_utf8(run) {
        Ok(_) => Some(&[]),
        // No error length: the run ends inside a character, whole so far.
        Err(e) if at_piece_end && e.error_len().is_none() => Some(&run[e.valid_up_to()..]),
        Err(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::super::RequestView;
    use super::*;
    use proptest::prelude::*;
    use serde_json::{json, Value};

    fn raw_members(view: &RequestView) -> [Option<String>; 9] {
        [
            view.model,
            view.stream,
            view.stream_options,
            view.metadata,
            view.litellm_metadata,
            view.user,
            view.prompt_cache_key,
            view.previous_response_id,
            view.conversation,
        ]
        .map(|v| v.map(|v| v.get().to_string()))
    }

    fn as_text(found: Found) -> [Option<String>; 9] {
        found.map(|v| v.map(|v| String::from_utf8(v.to_vec()).unwrap()))
    }

    /// The bodies clients send, engines' and agents' shapes: the skim reads
    /// them (control for the fallback tests below: without the skim the
    /// gateway would pay serde's cost on every one), as serde reads them.
    #[test]
    fn ordinary_bodies_take_the_skim() {
        let long_prompt =
            "line one\n\ttabbed \"quoted\" caf\u{e9} \u{1f600} \\ slash / ".repeat(500);
        let bodies = [
            json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}),
            json!({"model": "sim-model", "messages": [{"role": "user", "content": "x ".repeat(1000)}]}),
            json!({
                "model": "qwen", "stream": true, "stream_options": {"include_usage": true},
                "temperature": 0.7, "top_p": 1, "seed": -42, "presence_penalty": -1.5e-3,
                "messages": [
                    {"role": "system", "content": long_prompt},
                    {"role": "assistant", "content": null, "tool_calls": [
                        {"id": "call_1", "type": "function",
                         "function": {"name": "read", "arguments": "{\"path\": \"/a\"}"}}]},
                    {"role": "tool", "tool_call_id": "call_1", "content": "\u{7}\u{1f}"}
                ],
                "tools": [{"type": "function", "function": {"parameters": {"type": "object", "properties": {}}}}],
                "metadata": {"session_id": "s-1", "user_id": "{\"session_id\": \"x\"}"},
                "litellm_metadata": {"session_id": 12345},
                "user": "u"
            }),
        ];
        for body in bodies {
            for text in [
                body.to_string(),
                serde_json::to_string_pretty(&body).unwrap(),
            ] {
                let found =
                    skim(text.as_bytes()).unwrap_or_else(|| panic!("skim gave up: {text:.200}"));
                let serde = RequestView::parse_with_serde(text.as_bytes()).unwrap();
                assert_eq!(as_text(found), raw_members(&serde));
            }
        }
        let spaced = b" \r\n{ \"model\" :\t\"m\" , \"user\":\"\\ud7ff\\ue000\" }\n ";
        assert_eq!(as_text(skim(spaced).unwrap())[0].as_deref(), Some("\"m\""));
    }

    /// What the skim leaves to serde: the cases serde words or decides on
    /// its own terms. Each is a body serde accepts or refuses; the skim
    /// says neither.
    #[test]
    fn gives_up_where_serde_must_decide() {
        let deep = |n: usize| format!("{{\"messages\":{}{}}}", "[".repeat(n), "]".repeat(n));
        for body in [
            r#"{"mod\u0065l":"m"}"#.to_string(),
            r#"{"user":"\ud83d\ude00"}"#.to_string(),
            r#"{"x":"\udc00"}"#.to_string(),
            r#"{"x":1e400}"#.to_string(),
            r#"{"x":123456789012345678}"#.to_string(),
            r#"{"x":1e100}"#.to_string(),
            deep(MAX_DEPTH),
            r#"{"a":1,}"#.to_string(),
            r#"{"a":01}"#.to_string(),
            r#"{"a":"\x"}"#.to_string(),
            "{\"a\":\"\u{1}\"}".to_string(),
            r#"{"a":1} x"#.to_string(),
            r#"[1]"#.to_string(),
            r#"{"a":tru}"#.to_string(),
        ] {
            assert!(skim(body.as_bytes()).is_none(), "{body}");
        }
        // Control: just inside each limit the skim reads it.
        for body in [
            r#"{"x":12345678901234567}"#.to_string(),
            r#"{"x":-1.5E-99}"#.to_string(),
            r#"{"user":"\ud7ff"}"#.to_string(),
            deep(MAX_DEPTH - 1),
        ] {
            assert!(skim(body.as_bytes()).is_some(), "{body}");
        }
        assert!(skim(b"{\"a\":\"\xff\"}").is_none());
        assert!(skim(b"{\"a\":\"\xc3\"}").is_none());
    }

    /// JSON values with the kept names, escapes, non-ASCII text and numbers
    /// at the edges of what the skim reads.
    fn value_strategy() -> impl Strategy<Value = Value> {
        let text = prop_oneof![
            Just("plain".to_string()),
            Just("a\"b\\c/d\n\t\r\u{8}\u{c}".to_string()),
            Just("caf\u{e9} \u{1f600} \u{7f}".to_string()),
            Just("\u{1}\u{1f}".to_string()),
            "[a-z]{0,6}",
        ];
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            any::<u64>().prop_map(|n| json!(n)),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(|f| json!(f)),
            text.clone().prop_map(Value::String),
        ];
        let key = prop_oneof![
            Just("model".to_string()),
            Just("stream".to_string()),
            Just("user".to_string()),
            Just("metadata".to_string()),
            Just("messages".to_string()),
            text,
        ];
        leaf.prop_recursive(4, 24, 5, move |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
                proptest::collection::vec((key.clone(), inner), 0..5)
                    .prop_map(|kv| Value::Object(kv.into_iter().collect())),
            ]
        })
    }

    /// Bytes a mutation writes: structure, escapes, numbers past the
    /// limits, broken UTF-8, control bytes, the kept names.
    const SPLICES: [&[u8]; 17] = [
        b"{",
        b"}",
        b"[",
        b"]",
        b",",
        b":",
        b"\"",
        b"\\",
        b"\\u",
        b"\\ud800",
        b"\\udc00",
        b"1e999",
        b"-",
        b"\xc3",
        b"\x01",
        b"\"model\":",
        b" ",
    ];

    /// `body` cut at `cuts` (ascending offsets), as the read gives pieces.
    fn cut(body: &[u8], cuts: &[usize]) -> Vec<Bytes> {
        let mut pieces = Vec::new();
        let mut start = 0;
        for &at in cuts.iter().chain([&body.len()]) {
            pieces.push(Bytes::copy_from_slice(&body[start..at]));
            start = at;
        }
        pieces
    }

    fn skim_cut(body: &[u8], cuts: &[usize]) -> Option<[Option<String>; 9]> {
        let pieces = cut(body, cuts);
        let (first, rest) = pieces.split_first().unwrap();
        skim_pieces(first, rest, None).map(as_text)
    }

    /// A cut anywhere in the messages (inside a multi-byte character, an
    /// escape, a `\u` escape, a number, a literal) leaves the reading as
    /// it is on the whole body; so do empty pieces and a one-byte piece
    /// in the middle of a four-byte character.
    #[test]
    fn pieces_cut_inside_any_token_read_as_the_whole() {
        let messages = r#"[{"role":"user","content":"café 😀 中文 \"q\" \\ \n \u00e9nd"},{"role":"tool","content":null,"n":-12.5e-3,"ok":true,"no":false,"big":12345678}]"#;
        let head = r#"{"model":"m","stream":true,"messages":"#;
        let body = format!("{head}{messages},\"user\":\"u\"}}");
        let body = body.as_bytes();
        let whole = skim(body).map(as_text).expect("the whole body reads");
        let span = head.len()..head.len() + messages.len();
        for at in span.clone() {
            assert_eq!(skim_cut(body, &[at]).as_ref(), Some(&whole), "cut at {at}");
            assert_eq!(
                skim_cut(body, &[at, at]).as_ref(),
                Some(&whole),
                "empty piece at {at}"
            );
            assert_eq!(
                skim_cut(body, &[at, at + 1]).as_ref(),
                Some(&whole),
                "1-byte piece at {at}"
            );
        }
        // Control: a cut inside a kept member's value or a top-level key
        // gives up (the caller joins and reads again), never misreads.
        let model_value = body.windows(3).position(|w| w == b"\"m\"").unwrap() + 1;
        assert_eq!(skim_cut(body, &[model_value]), None);
        assert_eq!(
            skim_cut(body, &[head.len() - 4]),
            None,
            "inside the key \"messages\""
        );
        // A broken character cut in two is still refused.
        let broken = b"{\"a\":\"\xe4\xb8x\"}";
        assert!(skim(broken).is_none());
        for at in 6..broken.len() {
            assert_eq!(skim_cut(broken, &[at]), None, "cut at {at}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]
        /// Wherever the skim answers, the body is one the serde path
        /// accepts, with the same members; read in pieces cut anywhere, it
        /// answers the same or gives up.
        #[test]
        fn prop_the_skim_agrees_with_serde(
            members in proptest::collection::vec(
                (prop_oneof![
                    Just("model".to_string()), Just("stream".to_string()),
                    Just("stream_options".to_string()), Just("metadata".to_string()),
                    Just("litellm_metadata".to_string()), Just("user".to_string()),
                    Just("messages".to_string()), Just("input".to_string()),
                    Just("system".to_string()), Just("prompt".to_string()),
                    "[a-z]{0,4}",
                ], value_strategy()),
                0..6,
            ),
            pretty in any::<bool>(),
            cuts in proptest::collection::vec((any::<prop::sample::Index>(), 0..SPLICES.len(), 0usize..3), 0..3),
            cuts_at in proptest::collection::vec(any::<prop::sample::Index>(), 1..4),
        ) {
            let object = Value::Object(members.into_iter().collect());
            let mut body = if pretty {
                serde_json::to_vec_pretty(&object).unwrap()
            } else {
                serde_json::to_vec(&object).unwrap()
            };
            for (at, splice, removed) in cuts {
                let at = at.index(body.len() + 1);
                let end = (at + removed).min(body.len());
                body.splice(at..end, SPLICES[splice].iter().copied());
            }
            let serde = RequestView::parse_with_serde(&body);
            // Cut anywhere, the pieces read as the whole, or give up.
            let mut cuts: Vec<usize> = cuts_at.iter().map(|at| at.index(body.len() + 1)).collect();
            cuts.sort_unstable();
            if let Some(in_pieces) = skim_cut(&body, &cuts) {
                prop_assert_eq!(Some(in_pieces), skim(&body).map(as_text));
            }
            // Gathering the conversation's blocks changes no verdict.
            let mut sink = BlockSink::default();
            prop_assert_eq!(
                skim_pieces(&body, &[], Some(&mut sink)).map(as_text),
                skim(&body).map(as_text)
            );
            if let Some(found) = skim(&body) {
                let serde = serde.expect("the skim accepted a body serde refuses");
                prop_assert_eq!(as_text(found), raw_members(&serde));
                let view = RequestView::parse(&body).unwrap();
                prop_assert_eq!(raw_members(&view), raw_members(&serde));
            }
        }
    }
}
