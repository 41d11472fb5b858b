//! include_usage: the edit that makes a streaming request ask for its token
//! usage (`stream_options.include_usage: true`), so the stream carries a
//! `usage` frame (`stream::usage` reads it and drops it on the way back).
//!
//! The request body is edited in place rather than re-serialized: engines
//! key their prefix cache on the rendered prompt, and a re-encoding that
//! changes escaping or number formatting inside `messages` could change the
//! prompt and silently cost a cache hit.

use bytes::Bytes;

use super::edit::{splice, Edit};
use crate::json_bytes::{key_equals, skip_value, skip_ws, string_end};
use crate::request_view::{member, RequestView};

const TOP_LEVEL_INSERT: &[u8] = b"\"stream_options\":{\"include_usage\":true}";
const TOP_LEVEL_INSERT_COMMA: &[u8] = b"\"stream_options\":{\"include_usage\":true},";
const NESTED_INSERT: &[u8] = b"\"include_usage\":true";
const NESTED_INSERT_COMMA: &[u8] = b"\"include_usage\":true,";

/// An insertion at `at`: `text`, or `with_comma` when members follow.
fn insertion(at: usize, text: &'static [u8], with_comma: &'static [u8], comma: bool) -> Edit {
    let insert = if comma { with_comma } else { text };
    Edit {
        at: at..at,
        with: Bytes::from_static(insert),
    }
}

/// [`include_usage_edit`] made: the new body.
pub fn inject_include_usage(raw: &[u8], parsed: &RequestView) -> Option<Vec<u8>> {
    splice(raw, &mut [include_usage_edit(raw, parsed)?])
}

/// The common case of [`include_usage_edit`], decided from the body's
/// first bytes (`head`) alone: a client that sets no stream_options. The
/// view then has no such member in any spelling (a top-level key is
/// decoded before it is compared) and at least one member (`stream`), so
/// the walk of the whole body would answer `Missing { empty: false }`:
/// skipping it saves a walk of the whole body. Only for a view read from
/// the body itself (`view_of_body`): its members borrow from the bytes
/// they were read from. `None` when the walk must decide.
pub fn include_usage_at_top(head: &[u8], parsed: &RequestView, view_of_body: bool) -> Option<Edit> {
    let open = skip_ws(head, 0);
    (parsed.is_stream()
        && parsed.stream_options.is_none()
        && view_of_body
        && head.get(open) == Some(&b'{'))
    .then(|| Edit {
        at: open + 1..open + 1,
        with: Bytes::from_static(TOP_LEVEL_INSERT_COMMA),
    })
}

/// The edit that adds `stream_options.include_usage: true` to a streaming
/// request body, touching only the bytes needed (see the module docs for
/// why).
///
/// `raw` is the exact body and `parsed` its view. Returns `None` when
/// nothing needs to change (not `"stream": true`, or already asked for) and
/// when it cannot be done safely: `stream_options` or `include_usage` of an
/// unexpected type, a duplicated key, or `raw` not matching `parsed`.
pub fn include_usage_edit(raw: &[u8], parsed: &RequestView) -> Option<Edit> {
    if !parsed.is_stream() {
        return None;
    }
    if let Some(edit) = include_usage_at_top(raw, parsed, view_of(raw, parsed)) {
        return Some(edit);
    }
    let open = skip_ws(raw, 0);
    match find_member(raw, open, "stream_options")? {
        Member::Missing { empty } => {
            if parsed.stream_options.is_some() {
                return None;
            }
            Some(insertion(
                open + 1,
                TOP_LEVEL_INSERT,
                TOP_LEVEL_INSERT_COMMA,
                !empty,
            ))
        }
        Member::Found { start, end: _ } => {
            let opts = parsed.stream_options?;
            if !opts.get().starts_with('{') {
                return None;
            }
            let include_usage = member(opts, "include_usage");
            match find_member(raw, start, "include_usage")? {
                Member::Missing { empty } => {
                    if include_usage.is_some() {
                        return None;
                    }
                    Some(insertion(
                        start + 1,
                        NESTED_INSERT,
                        NESTED_INSERT_COMMA,
                        !empty,
                    ))
                }
                Member::Found { start, end } => {
                    let literal = match include_usage?.get() {
                        "false" => &b"false"[..],
                        "null" => b"null",
                        // `true` needs nothing; any other type is the
                        // engine's to judge, not ours to overwrite.
                        _ => return None,
                    };
                    if raw.get(start..end)? != literal {
                        return None;
                    }
                    Some(Edit {
                        at: start..end,
                        with: Bytes::from_static(b"true"),
                    })
                }
            }
        }
    }
}

/// Whether `view` was read from `raw`: its `stream` member lies in it.
fn view_of(raw: &[u8], view: &RequestView) -> bool {
    view.stream
        .is_some_and(|v| raw.as_ptr_range().contains(&v.get().as_ptr()))
}

/// Result of looking a key up in one object of the raw text.
#[derive(Debug, PartialEq, Eq)]
enum Member {
    /// Not there; `empty` says whether the object has no members at all
    /// (an insertion then needs no trailing comma).
    Missing { empty: bool },
    /// The value's byte span.
    Found { start: usize, end: usize },
}

/// Walks the object whose `{` is at `open` and looks for member `name`.
/// `None` if the text is not a well-formed object or the key occurs twice
/// (which occurrence an engine honours is then its business, so an edit
/// could miss).
fn find_member(raw: &[u8], open: usize, name: &str) -> Option<Member> {
    if raw.get(open) != Some(&b'{') {
        return None;
    }
    let mut i = skip_ws(raw, open + 1);
    if raw.get(i) == Some(&b'}') {
        return Some(Member::Missing { empty: true });
    }
    let mut found = None;
    loop {
        let (key_end, _) = string_end(raw, i)?;
        let is_name = key_equals(&raw[i..key_end], name)?;
        i = skip_ws(raw, key_end);
        if raw.get(i) != Some(&b':') {
            return None;
        }
        let start = skip_ws(raw, i + 1);
        let end = skip_value(raw, start)?;
        if is_name {
            if found.is_some() {
                return None;
            }
            found = Some(Member::Found { start, end });
        }
        i = skip_ws(raw, end);
        match raw.get(i)? {
            b',' => i = skip_ws(raw, i + 1),
            b'}' => return Some(found.unwrap_or(Member::Missing { empty: false })),
            _ => return None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::json_bytes::testing::{key_strategy, value_strategy, Writer};
    use proptest::prelude::*;
    use serde_json::{json, Value};

    fn inject(raw: &str) -> Option<String> {
        // A body that is not an object has no view (the proxy answers 400).
        let parsed = RequestView::parse(raw.as_bytes()).ok()?;
        inject_include_usage(raw.as_bytes(), &parsed).map(|b| String::from_utf8(b).unwrap())
    }

    #[test]
    fn inject_cases() {
        assert_eq!(
            inject(r#"{"model":"m","stream":true}"#).as_deref(),
            Some(r#"{"stream_options":{"include_usage":true},"model":"m","stream":true}"#)
        );
        assert_eq!(
            inject(" {\n \"stream\" : true }\n").as_deref(),
            Some(" {\"stream_options\":{\"include_usage\":true},\n \"stream\" : true }\n")
        );
        assert_eq!(
            inject(r#"{"stream":true,"stream_options":{}}"#).as_deref(),
            Some(r#"{"stream":true,"stream_options":{"include_usage":true}}"#)
        );
        assert_eq!(
            inject(r#"{"stream":true,"stream_options":{ "continuous_usage_stats":true }}"#)
                .as_deref(),
            Some(
                r#"{"stream":true,"stream_options":{"include_usage":true, "continuous_usage_stats":true }}"#
            )
        );
        assert_eq!(
            inject(r#"{"stream_options":{"include_usage" : false},"stream":true}"#).as_deref(),
            Some(r#"{"stream_options":{"include_usage" : true},"stream":true}"#)
        );
        assert_eq!(
            inject(r#"{"stream_options":{"include_usage":null},"stream":true}"#).as_deref(),
            Some(r#"{"stream_options":{"include_usage":true},"stream":true}"#)
        );
        // Escaped key spellings are the same key.
        assert_eq!(
            inject(r#"{"stream":true,"stream\u005foptions":{"include\u005fusage":false}}"#)
                .as_deref(),
            Some(r#"{"stream":true,"stream\u005foptions":{"include\u005fusage":true}}"#)
        );
    }

    #[test]
    fn inject_declines() {
        for raw in [
            r#"{"model":"m"}"#,
            r#"{"stream":false}"#,
            r#"{"stream":"true"}"#,
            r#"{"stream":true,"stream_options":{"include_usage":true}}"#,
            r#"{"stream":true,"stream_options":null}"#,
            r#"{"stream":true,"stream_options":[]}"#,
            r#"{"stream":true,"stream_options":{"include_usage":"yes"}}"#,
            r#"{"stream":true,"stream_options":{},"stream_options":{}}"#,
            r#"{"stream":true,"stream_options":{"include_usage":false,"include_usage":false}}"#,
            r#"[{"stream":true}]"#,
        ] {
            assert_eq!(inject(raw), None, "{raw}");
        }
        // raw that does not match parsed
        let other = br#"{"stream": true, "stream_options": {}}"#;
        let parsed = RequestView::parse(other).unwrap();
        assert_eq!(inject_include_usage(br#"{"stream":true}"#, &parsed), None);
        let parsed = RequestView::parse(br#"{"stream":true}"#).unwrap();
        assert_eq!(inject_include_usage(br#"{"stream":true,"#, &parsed), None);
    }

    #[test]
    fn scanner_skips_tricky_strings() {
        let raw = r#"{"messages":[{"content":"a \"stream_options\": {} \\"},{"x":"}]{["}],"stream":true}"#;
        assert_eq!(
            inject(raw).as_deref(),
            Some(
                r#"{"stream_options":{"include_usage":true},"messages":[{"content":"a \"stream_options\": {} \\"},{"x":"}]{["}],"stream":true}"#
            )
        );
    }

    fn body_strategy() -> impl Strategy<Value = Value> {
        let opts = prop_oneof![
            Just(None),
            Just(Some(json!({}))),
            Just(Some(json!({"include_usage": false}))),
            Just(Some(json!({"include_usage": null}))),
            Just(Some(json!({"continuous_usage_stats": true}))),
            Just(Some(
                json!({"include_usage": false, "continuous_usage_stats": true})
            )),
        ];
        (
            proptest::collection::vec((key_strategy(), value_strategy()), 0..6),
            opts,
            any::<bool>(),
        )
            .prop_map(|(members, opts, stream_first)| {
                let mut m = serde_json::Map::new();
                if stream_first {
                    m.insert("stream".into(), Value::Bool(true));
                }
                for (k, v) in members {
                    if k != "stream" && k != "stream_options" {
                        m.insert(k, v);
                    }
                }
                if let Some(o) = opts {
                    m.insert("stream_options".into(), o);
                }
                m.insert("stream".into(), Value::Bool(true));
                Value::Object(m)
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        #[test]
        fn prop_inject_is_surgical(body in body_strategy(), seed in 1u64..) {
            let mut w = Writer { out: String::new(), seed };
            w.ws();
            w.value(&body);
            w.ws();
            let raw = w.out.into_bytes();
            let parsed: Value = serde_json::from_slice(&raw).expect("writer emits valid JSON");
            prop_assert_eq!(&parsed, &body);

            let view = RequestView::parse(&raw).expect("the writer emits an object");
            let new = inject_include_usage(&raw, &view).expect("always applicable here");
            let new_value: Value = serde_json::from_slice(&new).expect("valid JSON out");
            let mut expected = body.clone();
            let opts = expected
                .as_object_mut()
                .unwrap()
                .entry("stream_options")
                .or_insert_with(|| json!({}));
            opts.as_object_mut().unwrap().insert("include_usage".into(), Value::Bool(true));
            prop_assert_eq!(new_value, expected);

            // Every other byte is in place: undoing the one edit restores raw.
            let undone = [
                (TOP_LEVEL_INSERT, &b""[..]),
                (NESTED_INSERT, &b""[..]),
                (&b"true"[..], &b"false"[..]),
                (&b"true"[..], &b"null"[..]),
            ]
            .iter()
            .any(|(inserted, original)| {
                [inserted.to_vec(), [*inserted, b","].concat()].iter().any(|ins| {
                    (0..new.len()).any(|p| {
                        new[p..].starts_with(ins)
                            && [&new[..p], *original, &new[p + ins.len()..]].concat() == raw
                    })
                })
            });
            prop_assert!(undone, "edit is not a single insertion/replacement");
        }
    }
}
