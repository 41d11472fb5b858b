//! A `usage` object read byte by byte, for the shape engines write: keys
//! without escapes, values that are unsigned integers, `null`, booleans,
//! escape-free strings, or objects of those.
//!
//! Hand-written because serde's typed read of a 100-byte usage object costs
//! ~2.4k instructions (`benches/instructions.sh`) and is paid on every
//! answer and every stream; this walk costs a fraction of it. On valid JSON
//! it accepts only what it reads exactly as serde does: any other shape (an
//! escape, a negative or fractional number, an array, a count past `u64`)
//! answers `None`, and the caller takes serde's read. So the result, when
//! there is one, is serde's (a proptest in `usage` checks it). Invalid
//! JSON inside a string (a raw control character, bad UTF-8) is not looked
//! for: the counts beside it are read, where serde would read none.

use super::Usage;
use crate::json_bytes::{skip_ws, string_end};

/// Nesting this walk follows before giving the object to serde.
const MAX_DEPTH: usize = 4;

/// The usage object at the start of `bytes` (which must open with `{`) and
/// the length it spans, or `None` when its shape is not the plain one.
pub(super) fn read(bytes: &[u8]) -> Option<(Usage, usize)> {
    let mut walk = Walk { bytes, at: 0 };
    let mut usage = Usage::default();
    walk.object(|walk, key| {
        match key {
            b"prompt_tokens" => usage.prompt_tokens = walk.count()?,
            b"completion_tokens" => usage.completion_tokens = walk.count()?,
            b"prompt_tokens_details" => usage.cached_tokens = walk.details()?,
            _ => walk.skip_value(1)?,
        }
        Some(())
    })?;
    Some((usage, walk.at))
}

struct Walk<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Walk<'a> {
    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.at).copied()
    }

    fn ws(&mut self) {
        self.at = skip_ws(self.bytes, self.at);
    }

    fn eat(&mut self, byte: u8) -> Option<()> {
        (self.peek() == Some(byte)).then(|| self.at += 1)
    }

    fn literal(&mut self, word: &[u8]) -> Option<()> {
        let end = self.at + word.len();
        (self.bytes.get(self.at..end) == Some(word)).then(|| self.at = end)
    }

    /// `{ "key": value, ... }`, each member's value read by `member`
    /// (which is left standing on it).
    fn object(&mut self, mut member: impl FnMut(&mut Self, &'a [u8]) -> Option<()>) -> Option<()> {
        self.eat(b'{')?;
        self.ws();
        if self.eat(b'}').is_some() {
            return Some(());
        }
        loop {
            let key = self.string()?;
            self.ws();
            self.eat(b':')?;
            self.ws();
            member(self, key)?;
            self.ws();
            match self.peek()? {
                b',' => {
                    self.at += 1;
                    self.ws();
                }
                b'}' => {
                    self.at += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// A string without escapes: its bytes are its value. Raw control
    /// characters and bad UTF-8, which serde would refuse, are not looked
    /// for (see the module note).
    fn string(&mut self) -> Option<&'a [u8]> {
        let start = self.at;
        let (end, escaped) = string_end(self.bytes, start)?;
        if escaped {
            return None;
        }
        self.at = end;
        Some(&self.bytes[start + 1..end - 1])
    }

    /// An unsigned integer that fits `u64`, written as JSON writes one.
    fn uint(&mut self) -> Option<u64> {
        let digits = self.bytes[self.at..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count();
        let text = &self.bytes[self.at..self.at + digits];
        // A leading zero, a fraction or an exponent: serde's to judge.
        if digits == 0 || (digits > 1 && text[0] == b'0') {
            return None;
        }
        if matches!(self.bytes.get(self.at + digits), Some(b'.' | b'e' | b'E')) {
            return None;
        }
        let n = text.iter().try_fold(0u64, |n, &d| {
            n.checked_mul(10)?.checked_add(u64::from(d - b'0'))
        })?;
        self.at += digits;
        Some(n)
    }

    /// A count as `usage` reads one: the integer, or 0 for null, a boolean,
    /// a string or an object.
    fn count(&mut self) -> Option<u64> {
        if self.peek()?.is_ascii_digit() {
            return self.uint();
        }
        self.skip_value(1).map(|()| 0)
    }

    /// `prompt_tokens_details`: its `cached_tokens`, 0 when it is not an
    /// object or has none.
    fn details(&mut self) -> Option<u64> {
        if self.peek()? != b'{' {
            return self.skip_value(1).map(|()| 0);
        }
        let mut cached = 0;
        self.object(|walk, key| {
            if key == b"cached_tokens" {
                cached = walk.count()?;
            } else {
                walk.skip_value(2)?;
            }
            Some(())
        })?;
        Some(cached)
    }

    fn skip_value(&mut self, depth: usize) -> Option<()> {
        match self.peek()? {
            b'n' => self.literal(b"null"),
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'"' => self.string().map(drop),
            b'0'..=b'9' => self.uint().map(drop),
            b'{' if depth < MAX_DEPTH => self.object(|walk, _| walk.skip_value(depth + 1)),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(prompt: u64, completion: u64, cached: u64) -> Usage {
        Usage {
            prompt_tokens: prompt,
            completion_tokens: completion,
            cached_tokens: cached,
        }
    }

    /// What vLLM, SGLang and llama.cpp write is read here, not handed to
    /// serde (the control for the proptest, which only checks agreement).
    #[test]
    fn the_engines_shapes_are_read() {
        let cases: [(&str, Usage); 4] = [
            (
                r#"{"prompt_tokens":2,"total_tokens":5,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":1}}"#,
                usage(2, 3, 1),
            ),
            (
                r#"{"prompt_tokens":12,"total_tokens":20,"completion_tokens":8,"prompt_tokens_details":null}"#,
                usage(12, 8, 0),
            ),
            (
                r#"{"prompt_tokens": 7, "completion_tokens": 1, "total_tokens": 8, "completion_tokens_details": {"reasoning_tokens": 0}, "reasoning_tokens": 0}"#,
                usage(7, 1, 0),
            ),
            (r#"{ }"#, usage(0, 0, 0)),
        ];
        for (text, want) in cases {
            assert_eq!(read(text.as_bytes()), Some((want, text.len())), "{text}");
        }
        let trailing = br#"{"prompt_tokens":1},"x":2}"#;
        assert_eq!(read(trailing).map(|(_, len)| len), Some(19));
    }

    /// Shapes whose reading is serde's to decide are left to it.
    #[test]
    fn other_shapes_are_left_to_serde() {
        for text in [
            r#"{"prompt_tokens":-1}"#,
            r#"{"prompt_tokens":1.0}"#,
            r#"{"prompt_tokens":1e3}"#,
            r#"{"prompt_tokens":01}"#,
            r#"{"prompt_tokens":18446744073709551616}"#,
            r#"{"prompt\u005ftokens":1}"#,
            r#"{"prompt_tokens":[1]}"#,
            r#"{"prompt_tokens":1,}"#,
            r#"{"prompt_tokens":1"#,
            r#"{"a":{"b":{"c":{"d":{}}}}}"#,
            r#"null"#,
        ] {
            assert_eq!(read(text.as_bytes()), None, "{text}");
        }
    }
}
