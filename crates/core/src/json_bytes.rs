//! Byte-level JSON primitives: the steps the gateway's hand-written walkers
//! of JSON text share (the skim of a request body, the usage walk and the
//! key scans of the response path, the rewrites' searches of a request
//! body). Each reads a byte slice and an index, and answers as serde_json
//! would on valid JSON; what each does with invalid JSON is said where it
//! matters. `prop_the_primitives_read_as_serde` holds them to serde_json.

use memchr::memchr2;

/// JSON's four whitespace bytes, as serde_json skips them.
#[inline]
pub(crate) fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

/// The index of the first byte from `i` on that is not whitespace.
#[inline]
pub(crate) fn skip_ws(data: &[u8], mut i: usize) -> usize {
    while data.get(i).is_some_and(|&b| is_ws(b)) {
        i += 1;
    }
    i
}

/// A `"` preceded by an odd number of backslashes is inside a string.
pub(crate) fn quote_is_unescaped(data: &[u8], at: usize) -> bool {
    let backslashes = data[..at].iter().rev().take_while(|&&b| b == b'\\').count();
    backslashes % 2 == 0
}

/// The character a one-letter escape (`\n`, `\"`, ...) stands for, from the
/// letter; `None` for `u` (four hex digits follow) and for what is no escape.
#[inline]
pub(crate) fn unescape(letter: u8) -> Option<char> {
    Some(match letter {
        b'"' => '"',
        b'\\' => '\\',
        b'/' => '/',
        b'b' => '\u{8}',
        b'f' => '\u{c}',
        b'n' => '\n',
        b'r' => '\r',
        b't' => '\t',
        _ => return None,
    })
}

/// One step through the text of a JSON string.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// A decoded character and the index just past its raw spelling.
    Char(char, usize),
    /// The closing quote; the index just past it.
    End(usize),
}

/// Decodes the character whose raw spelling starts at `raw[i]` (inside a
/// string). `None` for text that is not a valid JSON string, lone
/// surrogates included: the caller then leaves the string alone.
pub(crate) fn next_char(raw: &[u8], i: usize) -> Option<Step> {
    match *raw.get(i)? {
        b'"' => Some(Step::End(i + 1)),
        b'\\' => match *raw.get(i + 1)? {
            b'u' => unicode_escape(raw, i),
            b => Some(Step::Char(unescape(b)?, i + 2)),
        },
        b if b < 0x20 => None,
        b => {
            let len = match b {
                0x00..=0x7f => 1,
                0xc0..=0xdf => 2,
                0xe0..=0xef => 3,
                0xf0..=0xf7 => 4,
                _ => return None,
            };
            let s = std::str::from_utf8(raw.get(i..i + len)?).ok()?;
            Some(Step::Char(s.chars().next()?, i + len))
        }
    }
}

fn hex4(raw: &[u8], at: usize) -> Option<u32> {
    let digits = std::str::from_utf8(raw.get(at..at + 4)?).ok()?;
    u32::from_str_radix(digits, 16).ok()
}

/// `\uXXXX` at `raw[i]`, with its low half when it is a high surrogate.
fn unicode_escape(raw: &[u8], i: usize) -> Option<Step> {
    let hi = hex4(raw, i + 2)?;
    if (0xd800..0xdc00).contains(&hi) {
        if raw.get(i + 6..i + 8)? != b"\\u" {
            return None;
        }
        let lo = hex4(raw, i + 8)?;
        if !(0xdc00..0xe000).contains(&lo) {
            return None;
        }
        let c = char::from_u32(0x10000 + ((hi - 0xd800) << 10) + (lo - 0xdc00))?;
        return Some(Step::Char(c, i + 12));
    }
    Some(Step::Char(char::from_u32(hi)?, i + 6))
}

/// Compares a quoted JSON key with `name`. Keys are compared decoded, so
/// `"stream\u005foptions"` is recognised too; `None` if it cannot be decoded.
pub(crate) fn key_equals(quoted: &[u8], name: &str) -> Option<bool> {
    let inner = quoted.get(1..quoted.len().checked_sub(1)?)?;
    if memchr::memchr(b'\\', inner).is_none() {
        return Some(inner == name.as_bytes());
    }
    let decoded: String = serde_json::from_slice(quoted).ok()?;
    Some(decoded == name)
}

/// Where the string whose opening quote is at `at` ends (just past its
/// closing quote), and whether it holds an escape. Escapes are skipped, not
/// checked: whatever follows a backslash cannot end the string, and the
/// digits of `\uXXXX` are ordinary bytes. memchr is ~90 instructions even
/// on a dozen-byte string, and still half of what a byte loop costs.
#[inline]
pub(crate) fn string_end(data: &[u8], at: usize) -> Option<(usize, bool)> {
    if data.get(at) != Some(&b'"') {
        return None;
    }
    let mut i = at + 1;
    let mut escaped = false;
    loop {
        let found = i + memchr2(b'"', b'\\', data.get(i..)?)?;
        if data[found] == b'"' {
            return Some((found + 1, escaped));
        }
        escaped = true;
        i = found + 2;
    }
}

/// Returns the index just past the value starting at `at`. Containers are
/// walked with a depth counter rather than recursion, so no input can
/// exhaust the stack.
pub(crate) fn skip_value(raw: &[u8], at: usize) -> Option<usize> {
    match raw.get(at)? {
        b'"' => string_end(raw, at).map(|(end, _)| end),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut i = at;
            while let Some(&b) = raw.get(i) {
                match b {
                    b'"' => {
                        i = string_end(raw, i)?.0;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth = depth.checked_sub(1)?;
                        if depth == 0 {
                            return Some(i + 1);
                        }
                    }
                    _ => {}
                }
                i += 1;
            }
            None
        }
        _ => {
            let len = raw[at..]
                .iter()
                .position(|b| matches!(b, b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r'))
                .unwrap_or(raw.len() - at);
            (len > 0).then_some(at + len)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{key_strategy, value_strategy, Writer};
    use super::*;
    use proptest::prelude::*;
    use serde::de::IgnoredAny;

    fn chars(raw: &str) -> Option<Vec<(char, usize)>> {
        let raw = raw.as_bytes();
        let mut i = 1;
        let mut out = Vec::new();
        loop {
            match next_char(raw, i)? {
                Step::Char(c, next) => {
                    out.push((c, next));
                    i = next;
                }
                Step::End(end) => {
                    assert_eq!(end, raw.len());
                    return Some(out);
                }
            }
        }
    }

    #[test]
    fn decodes_like_serde() {
        for raw in [
            r#""plain""#,
            r#""a\"b\\c\/d\b\f\n\r\t""#,
            r#""caf\u00e9 é \ud83d\ude00 😀""#,
            r#""""#,
        ] {
            let ours: String = chars(raw).unwrap().into_iter().map(|(c, _)| c).collect();
            let theirs: String = serde_json::from_str(raw).unwrap();
            assert_eq!(ours, theirs, "{raw}");
        }
        // Each character's raw spelling ends where the next one starts.
        let ends: Vec<usize> = chars(r#""a\u00e9\n😀""#)
            .unwrap()
            .into_iter()
            .map(|(_, e)| e)
            .collect();
        assert_eq!(ends, vec![2, 8, 10, 14]);
    }

    #[test]
    fn refuses_what_is_not_a_json_string() {
        for raw in [
            r#""\ud83d""#,
            r#""\ud83dx""#,
            r#""\ude00""#,
            r#""\x""#,
            r#""\u12""#,
            "\"a\nb\"",
            r#""unterminated"#,
        ] {
            assert_eq!(chars(raw), None, "{raw}");
        }
        assert_eq!(next_char(b"\"\xff\"", 1), None);
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]
        /// On valid JSON, spelled with any whitespace and escapes, each
        /// primitive reads what serde_json reads.
        #[test]
        fn prop_the_primitives_read_as_serde(
            value in value_strategy(),
            key in key_strategy(),
            seed in 1u64..,
        ) {
            let mut w = Writer { out: String::new(), seed };
            w.ws();
            w.value(&value);
            w.ws();
            let raw = w.out.into_bytes();
            let mut values = serde_json::Deserializer::from_slice(&raw).into_iter::<IgnoredAny>();
            prop_assert!(matches!(values.next(), Some(Ok(_))));
            let end = values.byte_offset();
            prop_assert_eq!(skip_value(&raw, skip_ws(&raw, 0)), Some(end));
            prop_assert_eq!(skip_ws(&raw, end), raw.len());

            let mut w = Writer { out: String::new(), seed };
            w.string(&key);
            let quoted = w.out.into_bytes();
            let escaped = quoted.contains(&b'\\');
            prop_assert_eq!(string_end(&quoted, 0), Some((quoted.len(), escaped)));
            prop_assert!(quote_is_unescaped(&quoted, quoted.len() - 1));
            let mut decoded = String::new();
            let mut i = 1;
            loop {
                match next_char(&quoted, i) {
                    Some(Step::Char(c, next)) => {
                        decoded.push(c);
                        i = next;
                    }
                    other => {
                        prop_assert_eq!(other, Some(Step::End(quoted.len())));
                        break;
                    }
                }
            }
            let theirs: String = serde_json::from_slice(&quoted).expect("the writer spells a string");
            prop_assert_eq!(&decoded, &theirs);
            prop_assert_eq!(key_equals(&quoted, &key), Some(true));
            prop_assert_eq!(key_equals(&quoted, "stream_options"), Some(key == "stream_options"));
        }
    }
}

#[cfg(test)]
pub(crate) mod testing {
    //! Random JSON text: any value, spelled with random whitespace and
    //! escapes, for proptests that hold a byte walker to serde_json.

    use proptest::prelude::*;
    use serde_json::{json, Value};

    pub(crate) fn value_strategy() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            any::<u64>().prop_map(|n| json!(n)),
            // Quarter steps are exact in binary, so text round-trips exactly.
            (-4000i32..4000).prop_map(|n| json!(f64::from(n) / 4.0)),
            any::<String>().prop_map(Value::String),
            "[a-z\"\\\\/\u{e9}\u{1f600}\n\t ]{0,10}".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                proptest::collection::vec((key_strategy(), inner), 0..6)
                    .prop_map(|kv| Value::Object(kv.into_iter().collect())),
            ]
        })
    }

    pub(crate) fn key_strategy() -> impl Strategy<Value = String> {
        prop_oneof![
            "[a-z_]{0,8}",
            any::<String>(),
            Just("stream_options".to_string()),
            Just("include_usage".to_string()),
        ]
    }

    /// Writes JSON with random whitespace and random (valid) escaping,
    /// driven by a small deterministic generator seeded by proptest.
    pub(crate) struct Writer {
        pub(crate) out: String,
        pub(crate) seed: u64,
    }

    impl Writer {
        fn roll(&mut self, n: u64) -> u64 {
            self.seed ^= self.seed << 13;
            self.seed ^= self.seed >> 7;
            self.seed ^= self.seed << 17;
            self.seed % n
        }

        pub(crate) fn ws(&mut self) {
            for _ in 0..self.roll(4).saturating_sub(1) {
                let c = [' ', '\n', '\t', '\r'][self.roll(4) as usize];
                self.out.push(c);
            }
        }

        pub(crate) fn string(&mut self, s: &str) {
            self.out.push('"');
            for c in s.chars() {
                let must = matches!(c, '"' | '\\') || (c as u32) < 0x20;
                if must || self.roll(6) == 0 {
                    match (c, self.roll(2)) {
                        ('"', 0) => self.out.push_str("\\\""),
                        ('\\', 0) => self.out.push_str("\\\\"),
                        ('/', 0) => self.out.push_str("\\/"),
                        ('\n', 0) => self.out.push_str("\\n"),
                        _ => {
                            let mut buf = [0u16; 2];
                            for unit in c.encode_utf16(&mut buf) {
                                self.out.push_str(&format!("\\u{unit:04x}"));
                            }
                        }
                    }
                } else {
                    self.out.push(c);
                }
            }
            self.out.push('"');
        }

        pub(crate) fn value(&mut self, v: &Value) {
            match v {
                Value::String(s) => self.string(s),
                Value::Array(a) => {
                    self.out.push('[');
                    for (i, x) in a.iter().enumerate() {
                        if i > 0 {
                            self.out.push(',');
                        }
                        self.ws();
                        self.value(x);
                        self.ws();
                    }
                    self.ws();
                    self.out.push(']');
                }
                Value::Object(m) => {
                    self.out.push('{');
                    for (i, (k, x)) in m.iter().enumerate() {
                        if i > 0 {
                            self.out.push(',');
                        }
                        self.ws();
                        self.string(k);
                        self.ws();
                        self.out.push(':');
                        self.ws();
                        self.value(x);
                        self.ws();
                    }
                    self.ws();
                    self.out.push('}');
                }
                other => self.out.push_str(&other.to_string()),
            }
        }
    }
}
