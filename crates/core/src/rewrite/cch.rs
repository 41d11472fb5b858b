//! `cch_strip`: Claude Code starts its system prompt with an attribution
//! line, `x-anthropic-billing-header: cc_version=<v>; cc_entrypoint=<e>;
//! cch=<hash>;`, whose `cch` changes on every request. Sitting at the very
//! start of the prompt, it makes an engine's prefix cache miss from the
//! first tokens on, for the whole (otherwise unchanged) conversation.
//!
//! Only the field goes, with the one space before it: `cc_version` and
//! `cc_entrypoint` are the same on every request of a session, so they cost
//! no cache hit, and whoever reads the line downstream still sees which
//! client sent it. The rest of the prompt is left exactly as written.

use bytes::Bytes;

use super::edit::{span_in, Edit};
use crate::json_bytes::{next_char, Step};
use serde::Deserialize;
use serde_json::value::RawValue;
use std::borrow::Cow;
use std::ops::Range;

/// How the line starts; matched exactly, at the very start of the text.
pub const HEADER: &str = "x-anthropic-billing-header:";
const FIELD: &str = "cch=";

#[derive(Deserialize)]
struct Message<'a> {
    #[serde(borrow, default)]
    role: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct Part<'a> {
    #[serde(borrow, default, rename = "type")]
    kind: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    text: Option<&'a RawValue>,
}

/// What [`strip`] removed from a body, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CchStripped {
    pub removed: String,
    /// A JSON-path-like place: `system`, `system[0].text`,
    /// `messages[0].content`, `messages[0].content[1].text`.
    pub location: String,
}

/// The edit that removes the `cch` field from the start of the system
/// prompt: the top-level `system` of an Anthropic-shaped body when there is
/// one, else the first message when it is a system (or developer) message;
/// in either, the text itself or its first text part. `None` when there is
/// no such line or it cannot be edited safely. A `cch=` anywhere else (a
/// later message, a later line) is the conversation's, never touched.
pub fn strip(
    raw: &[u8],
    system: Option<&RawValue>,
    messages: Option<&[&RawValue]>,
) -> Option<(Edit, CchStripped)> {
    let (text, location) = match system {
        Some(system) => text_of(system, "system")?,
        None => {
            let first: Message = serde_json::from_str(messages?.first()?.get()).ok()?;
            if !matches!(first.role.as_deref(), Some("system" | "developer")) {
                return None;
            }
            text_of(first.content?, "messages[0].content")?
        }
    };
    let string = span_in(raw, text)?;
    let (cut, removed) = field_span(raw, string.start)?;
    Some((
        Edit {
            at: cut,
            with: Bytes::new(),
        },
        CchStripped { removed, location },
    ))
}

/// The string a content value starts with: itself, or its first text part.
fn text_of<'a>(content: &'a RawValue, at: &str) -> Option<(&'a RawValue, String)> {
    let text = content.get();
    if text.starts_with('"') {
        return Some((content, at.to_string()));
    }
    if !text.starts_with('[') {
        return None;
    }
    let parts: Vec<&RawValue> = serde_json::from_str(text).ok()?;
    for (i, part) in parts.into_iter().enumerate() {
        let part: Part = serde_json::from_str(part.get()).ok()?;
        if part.kind.as_deref() == Some("text") {
            let text = part.text.filter(|t| t.get().starts_with('"'))?;
            return Some((text, format!("{at}[{i}].text")));
        }
    }
    None
}

/// In the JSON string whose opening quote is `raw[open]`: the raw span of
/// ` cch=<hash>;` on its first line, if that line is the billing header,
/// and the decoded text removed. Working character by character on the raw
/// spelling keeps the cut on escape boundaries, so the result is still a
/// valid string and decodes to the text minus exactly the field.
fn field_span(raw: &[u8], open: usize) -> Option<(Range<usize>, String)> {
    // (character, raw start, raw end) of the first line.
    let mut line: Vec<(char, usize, usize)> = Vec::new();
    let mut i = open + 1;
    let mut header = HEADER.chars();
    while let Step::Char(c, next) = next_char(raw, i)? {
        if c == '\n' {
            break;
        }
        if let Some(want) = header.next() {
            if c != want {
                return None;
            }
        }
        line.push((c, i, next));
        i = next;
    }
    if header.next().is_some() {
        return None;
    }
    let at = |k: usize| line.get(k).map(|&(c, _, _)| c);
    let mut found = None;
    let mut k = HEADER.len();
    while k < line.len() {
        let spaces_from = k;
        while at(k) == Some(' ') {
            k += 1;
        }
        let field = k;
        while at(k).is_some_and(|c| c != ';') {
            k += 1;
        }
        let name_end = field + FIELD.len();
        let is_cch = name_end <= k && (field..name_end).map(at).eq(FIELD.chars().map(Some));
        let semicolon = at(k) == Some(';');
        if is_cch {
            // A second `cch` is not the line we know; leave it all alone.
            if found.is_some() {
                return None;
            }
            // The value is one word; trailing blanks at the end of the line
            // (a `\r`) stay.
            let mut value_end = k;
            if !semicolon {
                while value_end > name_end && at(value_end - 1).is_some_and(char::is_whitespace) {
                    value_end -= 1;
                }
            }
            if (name_end..value_end).any(|j| at(j).is_some_and(char::is_whitespace)) {
                return None;
            }
            let from = if field > spaces_from {
                field - 1
            } else {
                field
            };
            let to = if semicolon { k + 1 } else { value_end };
            found = Some((from, to));
        }
        if semicolon {
            k += 1;
        }
    }
    let (from, to) = found?;
    let removed = line[from..to].iter().map(|&(c, _, _)| c).collect();
    Some((line[from].1..line[to - 1].2, removed))
}

#[cfg(test)]
mod tests {
    use crate::rewrite::{apply, Options};
    use proptest::prelude::*;
    use serde_json::Value;

    const OPTS: Options = Options {
        cch_strip: true,
        kimi_normalize: false,
    };

    /// The rewritten body, after checking that it parses and differs from
    /// the input only by the one removed span.
    fn strip(raw: &str) -> Option<String> {
        let out = apply(raw.as_bytes(), OPTS)?;
        let body = String::from_utf8(out.body).expect("utf-8 out");
        serde_json::from_str::<Value>(&body).expect("valid JSON out");
        let removed_len = raw.len() - body.len();
        let cut = raw
            .bytes()
            .zip(body.bytes())
            .position(|(a, b)| a != b)
            .unwrap_or(body.len());
        assert_eq!(
            format!("{}{}", &raw[..cut], &raw[cut + removed_len..]),
            body,
            "one contiguous removal"
        );
        Some(body)
    }

    fn system_msg(content: &str) -> String {
        format!(
            r#"{{"model":"m","messages":[{{"role":"system","content":{content}}},{{"role":"user","content":"hi"}}],"max_tokens":4}}"#
        )
    }

    #[test]
    fn system_message_string() {
        let raw = system_msg(
            r#""x-anthropic-billing-header: cc_version=2.1.100.7b4; cc_entrypoint=cli; cch=eb6c6;\nYou are Claude Code.""#,
        );
        assert_eq!(
            strip(&raw).unwrap(),
            system_msg(
                r#""x-anthropic-billing-header: cc_version=2.1.100.7b4; cc_entrypoint=cli;\nYou are Claude Code.""#
            )
        );
        let out = apply(raw.as_bytes(), OPTS).unwrap();
        let c = out.report.cch.unwrap();
        assert_eq!(c.removed, " cch=eb6c6;");
        assert_eq!(c.location, "messages[0].content");
    }

    #[test]
    fn field_first_middle_end_and_alone() {
        for (line, want) in [
            (
                "x-anthropic-billing-header: cch=1a2b3; cc_version=2; cc_entrypoint=cli;",
                "x-anthropic-billing-header: cc_version=2; cc_entrypoint=cli;",
            ),
            (
                "x-anthropic-billing-header: cc_version=2; cch=1a2b3; cc_entrypoint=cli;",
                "x-anthropic-billing-header: cc_version=2; cc_entrypoint=cli;",
            ),
            (
                "x-anthropic-billing-header: cc_version=2; cch=1a2b3;",
                "x-anthropic-billing-header: cc_version=2;",
            ),
            // No closing semicolon, then the end of the line or the text.
            (
                "x-anthropic-billing-header: cc_version=2; cch=1a2b3\\nrest",
                "x-anthropic-billing-header: cc_version=2;\\nrest",
            ),
            (
                "x-anthropic-billing-header: cc_version=2; cch=1a2b3\\r\\nrest",
                "x-anthropic-billing-header: cc_version=2;\\r\\nrest",
            ),
            (
                "x-anthropic-billing-header: cch=1a2b3;",
                "x-anthropic-billing-header:",
            ),
            (
                "x-anthropic-billing-header:cch=1a2b3; cc_version=2;",
                "x-anthropic-billing-header: cc_version=2;",
            ),
        ] {
            assert_eq!(
                strip(&system_msg(&format!("\"{line}\""))),
                Some(system_msg(&format!("\"{want}\""))),
                "{line}"
            );
        }
    }

    #[test]
    fn first_text_part_of_a_content_array() {
        let raw = system_msg(
            r#"[{"type":"image_url","image_url":{"url":"x"}},{"type":"text","text":"x-anthropic-billing-header: cc_version=2; cch=ff00f;"},{"type":"text","text":"cch=keep;"}]"#,
        );
        assert_eq!(
            strip(&raw).unwrap(),
            system_msg(
                r#"[{"type":"image_url","image_url":{"url":"x"}},{"type":"text","text":"x-anthropic-billing-header: cc_version=2;"},{"type":"text","text":"cch=keep;"}]"#
            )
        );
        let c = apply(raw.as_bytes(), OPTS).unwrap().report.cch.unwrap();
        assert_eq!(c.location, "messages[0].content[1].text");
    }

    #[test]
    fn anthropic_top_level_system() {
        let raw = r#"{"model":"claude","system":"x-anthropic-billing-header: cc_version=2; cch=abcde;\nYou are","messages":[{"role":"user","content":"x-anthropic-billing-header: cch=zzzzz;"}]}"#;
        assert_eq!(
            strip(raw).unwrap(),
            raw.replacen(" cch=abcde;", "", 1),
            "the user message's cch stays"
        );
        let raw = r#"{"system":[{"type":"text","text":"x-anthropic-billing-header: cc_version=2; cc_entrypoint=cli; cch=abcde;"},{"type":"text","text":"You are Claude Code.","cache_control":{"type":"ephemeral"}}],"messages":[]}"#;
        assert_eq!(strip(raw).unwrap(), raw.replace(" cch=abcde;", ""));
        let c = apply(raw.as_bytes(), OPTS).unwrap().report.cch.unwrap();
        assert_eq!(c.location, "system[0].text");
        // A top-level system without the header: the messages are not
        // looked at (the system prompt is the top-level one).
        let raw = r#"{"system":"You are","messages":[{"role":"system","content":"x-anthropic-billing-header: cch=abcde;"}]}"#;
        assert_eq!(strip(raw), None);
    }

    #[test]
    fn escaped_strings() {
        // Escapes in the header itself and in its neighbourhood.
        let raw = system_msg(
            r#""\u0078-anthropic-billing-header: cc_version=2;\u0020cch=a\u0062c; cc_entrypoint=caf\u00e9 \"q\";\n\"quoted\" \\ rest""#,
        );
        assert_eq!(
            strip(&raw).unwrap(),
            system_msg(
                r#""\u0078-anthropic-billing-header: cc_version=2; cc_entrypoint=caf\u00e9 \"q\";\n\"quoted\" \\ rest""#
            )
        );
        let c = apply(raw.as_bytes(), OPTS).unwrap().report.cch.unwrap();
        assert_eq!(c.removed, " cch=abc;");
        // An escaped newline ends the line: a cch on the next line stays.
        let raw = system_msg(r#""x-anthropic-billing-header: cc_version=2;\ncch=abc;""#);
        assert_eq!(strip(&raw), None);
    }

    #[test]
    fn left_alone() {
        for content in [
            // No header.
            r#""You are Claude Code. cch=abc;""#,
            // Not at the start.
            r#"" x-anthropic-billing-header: cch=abc;""#,
            r#""Hello\nx-anthropic-billing-header: cch=abc;""#,
            // Header without the field, or with a look-alike.
            r#""x-anthropic-billing-header: cc_version=2; cc_entrypoint=cli;""#,
            r#""x-anthropic-billing-header: cc_version=2; xcch=abc;""#,
            r#""x-anthropic-billing-header: cc_version=cch=abc;""#,
            // Upper case is not what Claude Code writes.
            r#""X-Anthropic-Billing-Header: cch=abc;""#,
            // Two cch fields, or a value that is not one word.
            r#""x-anthropic-billing-header: cch=a; cch=b;""#,
            r#""x-anthropic-billing-header: cch=a b;""#,
            // Content shapes that are not text first.
            r#"[{"type":"image_url","image_url":{"url":"x-anthropic-billing-header: cch=a;"}}]"#,
            r#"[{"type":"text","text":["x-anthropic-billing-header: cch=a;"]}]"#,
            r#"{"text":"x-anthropic-billing-header: cch=a;"}"#,
            "null",
        ] {
            assert_eq!(strip(&system_msg(content)), None, "{content}");
        }
        // Not a system message first: the header in a user message stays.
        let raw =
            r#"{"messages":[{"role":"user","content":"x-anthropic-billing-header: cch=abc;"}]}"#;
        assert_eq!(strip(raw), None);
        let raw = r#"{"messages":[{"role":"user","content":"hi"},{"role":"system","content":"x-anthropic-billing-header: cch=abc;"}]}"#;
        assert_eq!(strip(raw), None);
        // A first message with a duplicated member: which one an engine
        // reads is its business.
        let raw = r#"{"messages":[{"role":"system","content":"x-anthropic-billing-header: cch=abc;","content":"x"}]}"#;
        assert_eq!(strip(raw), None);
        // Control: the developer role is a system prompt too.
        let raw = r#"{"messages":[{"role":"developer","content":"x-anthropic-billing-header: cch=abc;"}]}"#;
        assert!(strip(raw).is_some());
    }

    #[test]
    fn whitespace_and_key_order_elsewhere_are_kept() {
        let raw = "{ \"messages\" : [ { \"content\" : \"x-anthropic-billing-header: cc_version=2; cch=abc;\\n\\tBe brief.\" ,\n \"role\":\"system\" } ],\n\"z\":1, \"a\" : [ 1.50, 1e3 ] }";
        assert_eq!(
            strip(raw).unwrap(),
            raw.replace(" cch=abc;", ""),
            "members after content, odd spacing and number spellings stay"
        );
    }

    #[test]
    fn session_turns_share_the_prefix_once_stripped() {
        let turn = |cch: &str, history: &str| {
            system_msg(&format!(
                r#""x-anthropic-billing-header: cc_version=2.1.1.abc; cc_entrypoint=cli; cch={cch};\nLong system prompt{history}""#
            ))
        };
        let (a, b) = (turn("11111", ""), turn("22222", ""));
        assert_ne!(a, b);
        assert_eq!(strip(&a), strip(&b));
    }

    /// JSON-encodes `text`, escaping any character at random (driven by
    /// `seed`), the ones that must be escaped always.
    fn encode(text: &str, mut seed: u64) -> String {
        let mut out = String::from("\"");
        for c in text.chars() {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            match (c, seed % 4) {
                ('"', 1..) => out.push_str("\\\""),
                ('\\', 1..) => out.push_str("\\\\"),
                ('\n', 1..) => out.push_str("\\n"),
                (c, r) if r == 0 || (c as u32) < 0x20 => {
                    let mut buf = [0u16; 2];
                    for unit in c.encode_utf16(&mut buf) {
                        out.push_str(&format!("\\u{unit:04x}"));
                    }
                }
                (c, _) => out.push(c),
            }
        }
        out.push('"');
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]
        #[test]
        fn prop_strips_exactly_the_field(
            fields in Just(vec![
                "cc_version=2.1.100.7b4".to_string(),
                "cc_entrypoint=cli".to_string(),
                "cch=HASH".to_string(),
            ]).prop_shuffle(),
            hash in "[0-9a-f]{5}",
            rest in "[a-z \n\"\\\\\u{e9}\u{1f600}]{0,24}",
            seed in 1u64..,
            as_part in any::<bool>(),
        ) {
            let fields: Vec<String> = fields.iter().map(|f| f.replace("HASH", &hash)).collect();
            let text = format!("{} {};\n{rest}", super::HEADER, fields.join("; "));
            let expected_text = text.replacen(&format!(" cch={hash};"), "", 1);
            let encoded = encode(&text, seed);
            let content = if as_part {
                format!(r#"[{{"type":"text","text":{encoded}}}]"#)
            } else {
                encoded
            };
            let raw = system_msg(&content);
            let out = strip(&raw).expect("the header is there");
            let v: Value = serde_json::from_str(&out).unwrap();
            let got = if as_part {
                &v["messages"][0]["content"][0]["text"]
            } else {
                &v["messages"][0]["content"]
            };
            prop_assert_eq!(got.as_str(), Some(expected_text.as_str()));
            let report = apply(raw.as_bytes(), OPTS).unwrap().report.cch.unwrap();
            prop_assert_eq!(report.removed, format!(" cch={hash};"));
        }
    }
}
