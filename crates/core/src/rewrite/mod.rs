//! Rewrites of a request body, each made of [`Edit`]s of the original bytes.
//!
//! - `include_usage`: `stream_options.include_usage` added to a streaming
//!   request, so the stream reports its token usage.
//!
//! The prefix-stability transforms make the prompt an engine renders the
//! same bytes from one request of a session to the next, so its prefix
//! cache keeps hitting:
//!
//! - `cch`: the per-request `cch=<hash>;` field of Claude Code's billing
//!   line at the start of the system prompt.
//! - `kimi`: Kimi tool-call ids (`functions.<name>:<n>`) renumbered by
//!   order of first appearance.
//!
//! A body is edited in place, never re-serialized: a re-encoding that
//! changed escaping, spacing or key order anywhere in `messages` would
//! change the rendered prompt and cost the very cache hit these transforms
//! exist for. Each rewrite finds byte spans of the original body (the
//! transforms through borrowed `RawValue`s, whose text is a slice of it) and
//! [`apply_edits`] replaces just those, into one buffer ([`splice`]) or
//! between the pieces a body was read in. Whatever cannot be edited safely
//! yields no edit: the body then goes on as the client sent it.
//!
//! Pure: no clock, no route; the proxy decides per route which rewrites run.

pub mod cch;
mod edit;
pub mod include_usage;
pub mod kimi;

pub use edit::{apply_edits, splice, Edit, EditSink};

use cch::CchStripped;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};

/// Which transforms to run.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    pub cch_strip: bool,
    pub kimi_normalize: bool,
}

impl Options {
    pub fn any(self) -> bool {
        self.cch_strip || self.kimi_normalize
    }
}

/// What the transforms changed in one body.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Report {
    /// The removed text (`" cch=<hash>;"`) and where it was.
    pub cch: Option<CchStripped>,
    /// Distinct Kimi ids renamed, `(from, to)`, in order of first appearance.
    pub kimi_renamed: Vec<(String, String)>,
    /// Occurrences (`tool_calls[].id` and `tool_call_id`) whose bytes changed.
    pub kimi_ids_renumbered: usize,
}

impl Report {
    pub fn is_empty(&self) -> bool {
        self.cch.is_none() && self.kimi_ids_renumbered == 0
    }

    pub fn to_json(&self) -> Value {
        json!({
            "cch_stripped": self.cch.as_ref().map(|c| json!({
                "removed": c.removed,
                "location": c.location,
            })),
            "kimi_ids_renumbered": self.kimi_ids_renumbered,
            "kimi_renamed": self.kimi_renamed.iter()
                .map(|(from, to)| json!({"from": from, "to": to}))
                .collect::<Vec<_>>(),
        })
    }
}

/// The edits the transforms would make, and what they mean.
#[derive(Debug, Default)]
pub struct Plan {
    pub edits: Vec<Edit>,
    pub report: Report,
}

/// A rewritten body and what changed in it.
#[derive(Debug)]
pub struct Rewritten {
    pub body: Vec<u8>,
    pub report: Report,
}

/// The top-level members the transforms read. A member written twice makes
/// this fail (serde's duplicate-field error): which copy an engine honours is
/// its business, so an edit of one could miss, and nothing is edited.
#[derive(Deserialize)]
struct Body<'a> {
    #[serde(borrow, default)]
    messages: Option<&'a RawValue>,
    #[serde(borrow, default)]
    system: Option<&'a RawValue>,
}

/// Works out the edits for `raw` without applying them. An empty plan when
/// nothing applies or `raw` is not an object these transforms can read.
pub fn plan(raw: &[u8], opts: Options) -> Plan {
    let mut plan = Plan::default();
    if !opts.any() {
        return plan;
    }
    let Ok(body) = serde_json::from_slice::<Body>(raw) else {
        return plan;
    };
    let messages: Option<Vec<&RawValue>> = body
        .messages
        .and_then(|m| serde_json::from_str::<Vec<&RawValue>>(m.get()).ok());
    if opts.cch_strip {
        if let Some((edit, stripped)) = cch::strip(raw, body.system, messages.as_deref()) {
            plan.edits.push(edit);
            plan.report.cch = Some(stripped);
        }
    }
    if opts.kimi_normalize {
        if let Some(k) = messages.as_deref().and_then(|m| kimi::renumber(raw, m)) {
            plan.edits.extend(k.edits);
            plan.report.kimi_renamed = k.renamed;
            plan.report.kimi_ids_renumbered = k.occurrences;
        }
    }
    plan
}

/// `raw` with the transforms applied; `None` when nothing changes.
pub fn apply(raw: &[u8], opts: Options) -> Option<Rewritten> {
    let Plan { mut edits, report } = plan(raw, opts);
    if edits.is_empty() {
        return None;
    }
    let body = splice(raw, &mut edits)?;
    Some(Rewritten { body, report })
}

/// What [`apply`] would change in `raw`, as JSON (for an inspect endpoint):
/// the report, and the body's length before and after.
pub fn preview(raw: &[u8], opts: Options) -> Value {
    let Plan { mut edits, report } = plan(raw, opts);
    let after = splice(raw, &mut edits).map_or(raw.len(), |b| b.len());
    let mut out = report.to_json();
    out["changed"] = json!(!report.is_empty());
    out["bytes_before"] = json!(raw.len());
    out["bytes_after"] = json!(after);
    out
}

#[cfg(test)]
mod tests {
    use super::edit::span_in;
    use super::*;

    #[test]
    fn splice_applies_in_order_and_refuses_overlaps() {
        let raw = b"0123456789";
        let e = |a: usize, b: usize, w: &str| Edit {
            at: a..b,
            with: w.as_bytes().to_vec().into(),
        };
        assert_eq!(
            splice(raw, &mut [e(8, 9, "X"), e(1, 3, ""), e(5, 5, "ins")]).unwrap(),
            b"034ins567X9"
        );
        assert_eq!(splice(raw, &mut []).unwrap(), raw);
        assert_eq!(splice(raw, &mut [e(1, 4, ""), e(3, 5, "")]), None);
        assert_eq!(splice(raw, &mut [e(9, 11, "")]), None);
        assert_eq!(splice(raw, &mut [e(11, 12, "")]), None);
        // Control: touching (not overlapping) edits are fine.
        assert_eq!(
            splice(raw, &mut [e(1, 3, "a"), e(3, 5, "b")]).unwrap(),
            b"0ab56789"
        );
    }

    #[test]
    fn span_is_the_slice_of_the_body() {
        let raw = br#"{"a": [1, {"b" : "x\"y"}]}"#;
        let v: Body = serde_json::from_slice(br#"{"messages":[]}"#).unwrap();
        // A value parsed from another buffer has no span in `raw`.
        assert_eq!(span_in(raw, v.messages.unwrap()), None);
        #[derive(Deserialize)]
        struct A<'a> {
            #[serde(borrow)]
            a: &'a RawValue,
        }
        let a: A = serde_json::from_slice(raw).unwrap();
        let s = span_in(raw, a.a).unwrap();
        assert_eq!(&raw[s], br#"[1, {"b" : "x\"y"}]"#);
    }

    #[test]
    fn both_transforms_compose_on_one_body() {
        let raw = br#"{"model":"k","messages":[{"role":"system","content":"x-anthropic-billing-header: cc_version=1; cch=ab12;\nYou help."},{"role":"assistant","content":null,"tool_calls":[{"id":"functions.f:7","type":"function","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","tool_call_id":"functions.f:7","content":"ok"}]}"#;
        let out = apply(
            raw,
            Options {
                cch_strip: true,
                kimi_normalize: true,
            },
        )
        .unwrap();
        let expected = String::from_utf8_lossy(raw)
            .replace(" cch=ab12;", "")
            .replace("functions.f:7", "functions.f:0");
        assert_eq!(String::from_utf8(out.body).unwrap(), expected);
        assert_eq!(out.report.kimi_ids_renumbered, 2);
        assert_eq!(
            out.report.cch.map(|c| (c.removed, c.location)),
            Some((" cch=ab12;".into(), "messages[0].content".into()))
        );
        // Control: each option alone does only its own part.
        let only_cch = apply(
            raw,
            Options {
                cch_strip: true,
                ..Options::default()
            },
        )
        .unwrap();
        assert!(String::from_utf8(only_cch.body)
            .unwrap()
            .contains("functions.f:7"));
        assert!(apply(raw, Options::default()).is_none());
    }

    #[test]
    fn preview_reports_without_changing() {
        let raw = br#"{"messages":[{"role":"system","content":"x-anthropic-billing-header: cc_version=1; cch=ab12;"}]}"#;
        let on = Options {
            cch_strip: true,
            kimi_normalize: true,
        };
        let p = preview(raw, on);
        assert_eq!(p["changed"], true);
        assert_eq!(p["cch_stripped"]["removed"], " cch=ab12;");
        assert_eq!(p["cch_stripped"]["location"], "messages[0].content");
        assert_eq!(p["kimi_ids_renumbered"], 0);
        assert_eq!(p["bytes_before"], raw.len());
        assert_eq!(p["bytes_after"], raw.len() - " cch=ab12;".len());
        // Control: with the options off nothing would change.
        let p = preview(raw, Options::default());
        assert_eq!(p["changed"], false);
        assert_eq!(p["cch_stripped"], Value::Null);
        assert_eq!(p["bytes_after"], raw.len());
    }

    #[test]
    fn unreadable_bodies_are_left_alone() {
        let all = Options {
            cch_strip: true,
            kimi_normalize: true,
        };
        for raw in [
            &b"[1]"[..],
            b"not json",
            b"",
            br#"{"messages":[{"role":"system","content":"x-anthropic-billing-header: cch=1;"}],"messages":[]}"#,
        ] {
            assert!(plan(raw, all).edits.is_empty());
            assert!(apply(raw, all).is_none());
        }
    }
}
