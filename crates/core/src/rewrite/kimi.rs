//! `kimi_normalize`: Kimi's chat template renders every tool call's id,
//! `functions.<name>:<n>`, into the prompt, `n` being a counter the client
//! keeps. Clients that restart, reset or offset that counter between turns
//! send the same history with different ids, and the prompt then differs at
//! the first tool call: the cache misses from there on.
//!
//! Renumbering by order of first appearance across the messages (0, 1, 2,
//! …, one counter for all names, as Kimi numbers them) makes the ids a
//! function of the history alone; since an id's number depends only on what
//! came before it, a history that grows by a turn keeps its earlier bytes.
//! Only `tool_calls[].id` of assistant messages and `tool_call_id` of tool
//! messages are looked at; ids of any other shape are left as they are.

use super::edit::{span_in, Edit};
use serde::Deserialize;
use serde_json::value::RawValue;
use std::borrow::Cow;
use std::collections::HashMap;

const PREFIX: &str = "functions.";

#[derive(Deserialize)]
struct Message<'a> {
    #[serde(borrow, default)]
    role: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    tool_calls: Option<Vec<Call<'a>>>,
    #[serde(borrow, default)]
    tool_call_id: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct Call<'a> {
    #[serde(borrow, default)]
    id: Option<&'a RawValue>,
}

/// The edits of one renumbering.
#[derive(Debug, Default)]
pub struct Renumbered {
    pub edits: Vec<Edit>,
    /// Distinct ids whose number changed, `(from, to)`.
    pub renamed: Vec<(String, String)>,
    /// Occurrences edited.
    pub occurrences: usize,
}

/// The edits that renumber the Kimi ids of `messages` (borrowed from `raw`);
/// `None` when no id changes, or when one cannot be edited safely (a
/// message of an unexpected shape, an id whose number is escaped): an edit
/// of one occurrence without the other would break the pairing of a call
/// with its result, so then none is made.
pub fn renumber(raw: &[u8], messages: &[&RawValue]) -> Option<Renumbered> {
    let mut numbers: HashMap<String, usize> = HashMap::new();
    let mut out = Renumbered::default();
    for message in messages {
        let message: Message = serde_json::from_str(message.get()).ok()?;
        let ids: Vec<&RawValue> = match message.role.as_deref() {
            Some("assistant") => message
                .tool_calls
                .unwrap_or_default()
                .into_iter()
                .filter_map(|c| c.id)
                .collect(),
            Some("tool") => message.tool_call_id.into_iter().collect(),
            _ => continue,
        };
        for id in ids {
            let Some(text) = crate::request_view::as_str(id) else {
                continue;
            };
            let Some((name, old)) = parse(&text) else {
                continue;
            };
            let next = numbers.len();
            let new = *numbers.entry(text.to_string()).or_insert(next);
            let new_digits = new.to_string();
            if new_digits == old {
                continue;
            }
            if new == next {
                out.renamed
                    .push((text.to_string(), format!("{PREFIX}{name}:{new}")));
            }
            // The number is the end of the string; edited only when it is
            // written `:<digits>"` literally. The `:` matters: without it the
            // bytes before the quote could be the hex of a `\u` escape.
            let span = span_in(raw, id)?;
            let digits_end = span.end.checked_sub(1)?;
            let digits_start = digits_end.checked_sub(old.len())?;
            if raw.get(digits_start.checked_sub(1)?..digits_end)? != format!(":{old}").as_bytes() {
                return None;
            }
            out.edits.push(Edit {
                at: digits_start..digits_end,
                with: new_digits.into_bytes().into(),
            });
            out.occurrences += 1;
        }
    }
    (out.occurrences > 0).then_some(out)
}

/// `functions.<name>:<n>` → (name, n's digits).
fn parse(id: &str) -> Option<(&str, &str)> {
    let (name, digits) = id.strip_prefix(PREFIX)?.rsplit_once(':')?;
    let ok = !name.is_empty() && !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit());
    ok.then_some((name, digits))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rewrite::{apply, Options};
    use serde_json::{json, Value};

    const OPTS: Options = Options {
        cch_strip: false,
        kimi_normalize: true,
    };

    fn normalize(raw: &str) -> Option<String> {
        let out = apply(raw.as_bytes(), OPTS)?;
        let body = String::from_utf8(out.body).expect("utf-8 out");
        serde_json::from_str::<Value>(&body).expect("valid JSON out");
        Some(body)
    }

    fn call(id: &str, name: &str) -> Value {
        json!({"id": id, "type": "function", "function": {"name": name, "arguments": "{}"}})
    }

    /// A history of tool rounds: each `(name, client's counter)` is one
    /// assistant call answered by one tool message.
    fn history(rounds: &[(&str, u32)]) -> Vec<Value> {
        let mut m = vec![
            json!({"role": "system", "content": "You are Kimi."}),
            json!({"role": "user", "content": "go"}),
        ];
        for (name, n) in rounds {
            let id = format!("functions.{name}:{n}");
            m.push(json!({"role": "assistant", "content": "", "tool_calls": [call(&id, name)]}));
            m.push(json!({"role": "tool", "tool_call_id": id, "content": "done"}));
        }
        m
    }

    fn body(messages: Vec<Value>) -> String {
        json!({"model": "kimi-k2", "messages": messages}).to_string()
    }

    #[test]
    fn parse_shapes() {
        assert_eq!(
            parse("functions.get_weather:12"),
            Some(("get_weather", "12"))
        );
        assert_eq!(parse("functions.a.b:c:3"), Some(("a.b:c", "3")));
        for other in [
            "call_abc123",
            "functions.:1",
            "functions.x:",
            "functions.x:1a",
            "functions.x",
            "tools.x:1",
            "functions.x:-1",
        ] {
            assert_eq!(parse(other), None, "{other}");
        }
    }

    #[test]
    fn renumbers_by_first_appearance_across_names() {
        let raw = body(history(&[("search", 5), ("read", 9), ("search", 2)]));
        let out = normalize(&raw).unwrap();
        assert_eq!(
            out,
            body(history(&[("search", 0), ("read", 1), ("search", 2)]))
        );
        let report = apply(raw.as_bytes(), OPTS).unwrap().report;
        // search:2 keeps its number; each renamed id counts twice (call and result).
        assert_eq!(report.kimi_ids_renumbered, 4);
        assert_eq!(
            report.kimi_renamed,
            vec![
                ("functions.search:5".into(), "functions.search:0".into()),
                ("functions.read:9".into(), "functions.read:1".into()),
            ]
        );
    }

    #[test]
    fn already_normal_and_other_shapes_are_unchanged() {
        assert_eq!(
            normalize(&body(history(&[("a", 0), ("b", 1)]))),
            None,
            "nothing to change"
        );
        let raw = body(vec![
            json!({"role": "assistant", "tool_calls": [call("call_x9", "f")]}),
            json!({"role": "tool", "tool_call_id": "call_x9", "content": "r"}),
            // An id that looks right in a message of another role stays.
            json!({"role": "user", "tool_call_id": "functions.f:4", "content": "functions.f:4"}),
        ]);
        assert_eq!(normalize(&raw), None);
        // Control: the same Kimi id in an assistant message is renumbered.
        let raw = body(vec![
            json!({"role": "assistant", "tool_calls": [call("call_x9", "f"), call("functions.f:4", "f")]}),
        ]);
        assert_eq!(
            normalize(&raw),
            Some(raw.replace("functions.f:4", "functions.f:0"))
        );
    }

    #[test]
    fn several_calls_in_one_message_and_results_out_of_order() {
        let raw = body(vec![
            json!({"role": "assistant", "tool_calls": [call("functions.a:3", "a"), call("functions.b:4", "b")]}),
            json!({"role": "tool", "tool_call_id": "functions.b:4", "content": "b"}),
            json!({"role": "tool", "tool_call_id": "functions.a:3", "content": "a"}),
            // A result whose call is not in the history gets the next number.
            json!({"role": "tool", "tool_call_id": "functions.c:9", "content": "c"}),
        ]);
        let want = raw
            .replace("functions.a:3", "functions.a:0")
            .replace("functions.b:4", "functions.b:1")
            .replace("functions.c:9", "functions.c:2");
        assert_eq!(normalize(&raw), Some(want));
    }

    #[test]
    fn two_turns_with_different_counters_share_their_prefix() {
        // The client renumbered its history between turns, so the raw
        // turns disagree from the first tool call on.
        let turn1 = body(history(&[("search", 3), ("read", 4)]));
        let mut turn2_messages = history(&[("search", 10), ("read", 11), ("write", 12)]);
        turn2_messages.push(json!({"role": "user", "content": "next"}));
        let turn2 = body(turn2_messages);
        let common =
            |a: &str, b: &str| a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count();
        let first_call = turn1.find("functions.").unwrap();
        assert!(common(&turn1, &turn2) <= first_call + "functions.search:".len());

        let (n1, n2) = (normalize(&turn1).unwrap(), normalize(&turn2).unwrap());
        // Turn 1's history, up to its closing `]`, is a byte prefix of turn 2.
        let history_end = n1.rfind(']').unwrap();
        assert!(common(&n1, &n2) >= history_end, "{n1}\n{n2}");
        assert_eq!(&n2[..history_end], &n1[..history_end]);
    }

    #[test]
    fn odd_spellings_and_unsafe_bodies() {
        // Escapes in the name are fine; the digits are what is edited.
        let raw = r#"{"messages":[{"role":"assistant","tool_calls":[{"id":"functions.caf\u00e9:7"}]},{"role":"tool","tool_call_id":"functions.café:7"}]}"#;
        assert_eq!(
            normalize(raw).as_deref(),
            Some(
                r#"{"messages":[{"role":"assistant","tool_calls":[{"id":"functions.caf\u00e9:0"}]},{"role":"tool","tool_call_id":"functions.café:0"}]}"#
            )
        );
        for raw in [
            // An escaped digit: that occurrence cannot be edited, so none is.
            r#"{"messages":[{"role":"assistant","tool_calls":[{"id":"functions.f:7"}]},{"role":"tool","tool_call_id":"functions.f:\u0037"}]}"#,
            r#"{"messages":[{"role":"assistant","tool_calls":[{"id":"functions.f:12"}]},{"role":"tool","tool_call_id":"functions.f\u003a12"}]}"#,
            r#"{"messages":[{"role":"assistant","tool_calls":[{"id":"functions.f:12"}]},{"role":"tool","tool_call_id":"functions.f:\u00312"}]}"#,
            // Shapes the transform does not know.
            r#"{"messages":[{"role":"assistant","tool_calls":{"id":"functions.f:7"}}]}"#,
            r#"{"messages":[{"role":"assistant","tool_calls":[{"id":"functions.f:7","id":"functions.f:7"}]}]}"#,
            r#"{"messages":[7,{"role":"assistant","tool_calls":[{"id":"functions.f:7"}]}]}"#,
            r#"{"messages":{"role":"assistant","tool_calls":[{"id":"functions.f:7"}]}}"#,
        ] {
            assert_eq!(normalize(raw), None, "{raw}");
        }
        // Non-string ids are skipped, the others still renumbered.
        let raw = r#"{"messages":[{"role":"assistant","tool_calls":[{"id":7},{"id":null},{"id":"functions.f:7"}]}]}"#;
        assert_eq!(normalize(raw), Some(raw.replace("f:7", "f:0")));
    }
}
