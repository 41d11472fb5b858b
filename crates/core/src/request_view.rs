//! What the gateway reads of an OpenAI-style request body, borrowed from the
//! bytes: the top-level members it routes and guards by, each as the raw
//! JSON text the client wrote. Everything else (the messages: nearly all of
//! a long-context body) is skipped as it is read, never built into a tree,
//! so a body costs about its own size in memory however it is shaped (a
//! `serde_json::Value` of 10 MB of small numbers takes ~40x that).
//!
//! Skipping still checks that the whole body is valid JSON, and nesting is
//! bounded by serde_json's recursion limit (128) as a full parse would be.
//! A member written twice keeps its last value, as the engines' parsers do.
//! The first reading is the skim (`request_view/skim.rs`, about a fifth of
//! serde_json's cost on a long prompt); serde_json reads every body the
//! skim is not sure of, so what is accepted, and the error of what is not,
//! are serde_json's.
//! Reject rules, which may look at any path, parse the whole body
//! themselves, and only when a route has rules switched on.

use bytes::Bytes;
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;
use std::borrow::Cow;
use std::fmt;

mod skim;

/// The members of a request body the gateway reads; `None` when absent.
#[derive(Debug, Default, Clone, Copy)]
pub struct RequestView<'a> {
    pub model: Option<&'a RawValue>,
    pub stream: Option<&'a RawValue>,
    pub stream_options: Option<&'a RawValue>,
    pub metadata: Option<&'a RawValue>,
    pub litellm_metadata: Option<&'a RawValue>,
    pub user: Option<&'a RawValue>,
    /// OpenAI's routing key (chat, completions, responses).
    pub prompt_cache_key: Option<&'a RawValue>,
    /// The Responses API's link to the turn before.
    pub previous_response_id: Option<&'a RawValue>,
    /// The Responses API's conversation: an id, or `{"id": …}`.
    pub conversation: Option<&'a RawValue>,
}

impl<'a> RequestView<'a> {
    /// The view of `body`, which must be one JSON object.
    pub fn parse(body: &'a [u8]) -> Result<Self, serde_json::Error> {
        Self::parse_into(body, None)
    }

    /// [`Self::parse`], the conversation's blocks gathered into `sink` when
    /// the skim reads the body (a body only serde reads gives none).
    pub fn parse_into(
        body: &'a [u8],
        mut sink: Option<&mut crate::session::content::BlockSink>,
    ) -> Result<Self, serde_json::Error> {
        match skim::skim_pieces(body, &[], sink.as_deref_mut()).and_then(Self::from_skim) {
            Some(view) => Ok(view),
            None => {
                if let Some(sink) = sink {
                    *sink = Default::default();
                }
                Self::parse_with_serde(body)
            }
        }
    }

    /// The view of the body made of `pieces`, when the skim reads it in
    /// them; `None` leaves the verdict to [`Self::parse`] of the pieces
    /// joined (an invalid body, or a key or kept member cut by a boundary).
    pub fn parse_pieces(pieces: &'a [Bytes]) -> Option<Self> {
        Self::parse_pieces_into(pieces, None)
    }

    /// [`Self::parse_pieces`], the conversation's blocks gathered into
    /// `sink` on the way (only when the skim reads the body).
    pub fn parse_pieces_into(
        pieces: &'a [Bytes],
        sink: Option<&mut crate::session::content::BlockSink>,
    ) -> Option<Self> {
        let (first, rest) = pieces.split_first()?;
        skim::skim_pieces(first, rest, sink).and_then(Self::from_skim)
    }

    /// The view of a body the skim accepted. It accepts only bodies the
    /// serde path accepts, kept members included, so the checks of
    /// [`Self::check_kept`] have nothing left to find. Each kept member
    /// (small, as a rule) is read once more: serde_json hands out a
    /// borrowed `RawValue` only from its own read.
    fn from_skim(found: skim::Found<'a>) -> Option<Self> {
        let mut raw = found.into_iter().map(|value| match value {
            None => Some(None),
            Some(bytes) => serde_json::from_slice::<&RawValue>(bytes).ok().map(Some),
        });
        let mut next = || raw.next().flatten();
        Some(RequestView {
            model: next()?,
            stream: next()?,
            stream_options: next()?,
            metadata: next()?,
            litellm_metadata: next()?,
            user: next()?,
            prompt_cache_key: next()?,
            previous_response_id: next()?,
            conversation: next()?,
        })
    }

    /// serde_json's reading, which decides every body the skim gives up on
    /// and words the error of a body that is not a JSON object.
    fn parse_with_serde(body: &'a [u8]) -> Result<Self, serde_json::Error> {
        let mut de = serde_json::Deserializer::from_slice(body);
        let view = de.deserialize_map(TopLevel)?;
        de.end()?;
        // serde_json takes a `RawValue` by its bounds alone: a lone
        // surrogate escape, a number out of range or nesting past the limit
        // inside a kept member would pass here and fail the reject rules'
        // full parse, which then skips the rules. So the kept members (small,
        // as a rule) are read once more, as a full parse reads them.
        if let Err(e) = view.check_kept() {
            // Only a body that is not valid JSON gets here; the error of a
            // checking pass over all of it names its place in the body.
            return Err(check_whole(body).err().unwrap_or(e));
        }
        Ok(view)
    }

    fn check_kept(&self) -> Result<(), serde_json::Error> {
        let kept = [
            self.model,
            self.stream,
            self.stream_options,
            self.metadata,
            self.litellm_metadata,
            self.user,
            self.prompt_cache_key,
            self.previous_response_id,
            self.conversation,
        ];
        for value in kept.into_iter().flatten() {
            let mut de = serde_json::Deserializer::from_str(value.get());
            de::DeserializeSeed::deserialize(Checked(MEMBER_DEPTH), &mut de)?;
            de.end()?;
        }
        Ok(())
    }

    /// `model` when it is a string.
    pub fn model(&self) -> Option<Cow<'a, str>> {
        self.model.and_then(as_str)
    }

    /// True only for `"stream": true`.
    pub fn is_stream(&self) -> bool {
        self.stream.is_some_and(|v| v.get() == "true")
    }
}

/// A string value, borrowed unless it has escapes.
pub fn as_str(value: &RawValue) -> Option<Cow<'_, str>> {
    if !value.get().starts_with('"') {
        return None;
    }
    serde_json::from_str::<JsonStr<'_>>(value.get())
        .ok()
        .map(|s| s.0)
}

/// A JSON string borrowed from the text unless it has escapes. serde's own
/// `Cow<str>` always deserializes into a `String` (an allocation for every
/// key of every body); this takes the borrowed form when serde_json offers
/// it.
pub(crate) struct JsonStr<'de>(pub(crate) Cow<'de, str>);

impl<'de> de::Deserialize<'de> for JsonStr<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = JsonStr<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(JsonStr(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(JsonStr(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
                Ok(JsonStr(Cow::Owned(v)))
            }
        }
        d.deserialize_str(V)
    }
}

/// Member `name` of an object value (the last one, if written twice).
pub fn member<'a>(object: &'a RawValue, name: &str) -> Option<&'a RawValue> {
    if !object.get().starts_with('{') {
        return None;
    }
    let mut de = serde_json::Deserializer::from_str(object.get());
    de.deserialize_map(OneMember(name)).ok().flatten()
}

/// Every member of an object value whose name is in `names`, in the order
/// written, duplicates included: what must be found wherever it occurs (the
/// body log's redaction), where [`member`] answers what an engine reads.
/// Not an object, or not valid JSON: none.
pub fn members_named<'a>(
    object: &'a RawValue,
    names: &'static [&'static str],
) -> Vec<(&'static str, &'a RawValue)> {
    if !object.get().starts_with('{') {
        return Vec::new();
    }
    let mut de = serde_json::Deserializer::from_str(object.get());
    de.deserialize_map(AllMembers(names)).unwrap_or_default()
}

struct AllMembers(&'static [&'static str]);

impl<'de> Visitor<'de> for AllMembers {
    type Value = Vec<(&'static str, &'de RawValue)>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut found = Vec::new();
        while let Some(key) = map.next_key::<JsonStr<'de>>()?.map(|k| k.0) {
            match self.0.iter().find(|name| **name == key.as_ref()) {
                Some(name) => found.push((*name, map.next_value::<&'de RawValue>()?)),
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(found)
    }
}

struct TopLevel;

impl<'de> Visitor<'de> for TopLevel {
    type Value = RequestView<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut view = RequestView::default();
        while let Some(key) = map.next_key::<JsonStr<'de>>()?.map(|k| k.0) {
            let slot = match key.as_ref() {
                "model" => &mut view.model,
                "stream" => &mut view.stream,
                "stream_options" => &mut view.stream_options,
                "metadata" => &mut view.metadata,
                "litellm_metadata" => &mut view.litellm_metadata,
                "user" => &mut view.user,
                "prompt_cache_key" => &mut view.prompt_cache_key,
                "previous_response_id" => &mut view.previous_response_id,
                "conversation" => &mut view.conversation,
                _ => {
                    map.next_value::<Skip>()?;
                    continue;
                }
            };
            *slot = Some(map.next_value::<&'de RawValue>()?);
        }
        Ok(view)
    }
}

struct OneMember<'n>(&'n str);

impl<'de> Visitor<'de> for OneMember<'_> {
    type Value = Option<&'de RawValue>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut found = None;
        while let Some(key) = map.next_key::<JsonStr<'de>>()?.map(|k| k.0) {
            if key == self.0 {
                found = Some(map.next_value::<&'de RawValue>()?);
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(found)
    }
}

/// The whole body skipped value by value, as a full parse reads it.
fn check_whole(body: &[u8]) -> Result<(), serde_json::Error> {
    let mut de = serde_json::Deserializer::from_slice(body);
    <Skip as de::Deserialize>::deserialize(&mut de)?;
    de.end()
}

/// Containers a top-level member may nest, itself included: serde_json
/// refuses a 128th level (its recursion limit), and the body's own object
/// is the first.
const MEMBER_DEPTH: usize = 126;

/// Reads one value as [`Skip`] does, but with its own depth budget: a kept
/// member is checked on a deserializer of its own, which would otherwise
/// allow it the body object's level too.
struct Checked(usize);

impl<'de> de::DeserializeSeed<'de> for Checked {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Checked {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let inner = self.nested()?;
        while seq.next_element_seed(Checked(inner))?.is_some() {}
        Ok(())
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let inner = self.nested()?;
        while map.next_key::<IgnoredAny>()?.is_some() {
            map.next_value_seed(Checked(inner))?;
        }
        Ok(())
    }
}

impl Checked {
    /// The budget inside a container that starts here.
    fn nested<E: de::Error>(self) -> Result<usize, E> {
        self.0
            .checked_sub(1)
            .ok_or_else(|| E::custom("recursion limit exceeded"))
    }
}

/// Skips one value of any shape without building it. Unlike `IgnoredAny`
/// it goes through serde_json's `deserialize_any`, so every level of
/// nesting counts against the recursion limit, exactly as a full parse.
struct Skip;

impl<'de> de::Deserialize<'de> for Skip {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(Skip)
    }
}

impl<'de> Visitor<'de> for Skip {
    type Value = Skip;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_str<E>(self, _: &str) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_unit<E>(self) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Skip, A::Error> {
        while seq.next_element::<Skip>()?.is_some() {}
        Ok(Skip)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Skip, A::Error> {
        while map.next_entry::<IgnoredAny, Skip>()?.is_some() {}
        Ok(Skip)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_borrow_unless_escaped() {
        let plain: &RawValue = serde_json::from_str(r#""gpt-4o""#).unwrap();
        assert!(matches!(as_str(plain), Some(Cow::Borrowed("gpt-4o"))));
        let escaped: &RawValue = serde_json::from_str(r#""a\nb""#).unwrap();
        assert!(matches!(as_str(escaped), Some(Cow::Owned(s)) if s == "a\nb"));
        let number: &RawValue = serde_json::from_str("1").unwrap();
        assert!(as_str(number).is_none());
        // An escaped key is still the key it spells.
        let view = RequestView::parse(br#"{"mod\u0065l":"m"}"#).unwrap();
        assert_eq!(view.model().as_deref(), Some("m"));
    }

    #[test]
    fn reads_the_members_it_needs_and_skips_the_rest() {
        let body = br#"{"messages":[{"role":"user","content":"a \"model\": x"}],"model":"m\u00e9","stream":true,"user":"u","stream_options":{"include_usage":false}}"#;
        let v = RequestView::parse(body).unwrap();
        assert_eq!(v.model().as_deref(), Some("m\u{e9}"));
        assert!(v.is_stream());
        assert_eq!(v.user.map(RawValue::get), Some("\"u\""));
        let opts = v.stream_options.unwrap();
        assert_eq!(
            member(opts, "include_usage").map(RawValue::get),
            Some("false")
        );
        assert!(member(opts, "other").is_none());
        assert!(v.metadata.is_none());
    }

    #[test]
    fn the_last_of_a_repeated_member_wins() {
        let v = RequestView::parse(br#"{"model":"a","model":"b"}"#).unwrap();
        assert_eq!(v.model().as_deref(), Some("b"));
    }

    #[test]
    fn only_one_valid_object_is_accepted() {
        for bad in [
            &b"[1]"[..],
            b"",
            b"{not json",
            b"{\"a\":1} trailing",
            b"{\"messages\":[1,2,}",
            b"\"text\"",
        ] {
            assert!(
                RequestView::parse(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn nesting_is_bounded_like_a_full_parse() {
        let deep = |n: usize| format!("{{\"messages\":{}{}}}", "[".repeat(n), "]".repeat(n));
        assert!(RequestView::parse(deep(100).as_bytes()).is_ok());
        // Control: serde_json's full parse draws the line at the same depth.
        for n in [126, 127, 128, 200, 100_000] {
            let body = deep(n);
            let full = serde_json::from_str::<serde_json::Value>(&body).is_ok();
            assert_eq!(
                RequestView::parse(body.as_bytes()).is_ok(),
                full,
                "depth {n}"
            );
        }
    }

    /// Found by the `request_body` fuzz target: the members the view keeps
    /// whole were taken by their bounds alone, so a body whose `metadata`
    /// held a lone surrogate escape (or a number out of range, or nesting
    /// past the limit) passed the view while the reject rules' full parse
    /// refused it, and the rules were skipped for that request.
    #[test]
    fn kept_members_are_checked_like_a_full_parse() {
        for body in [
            r#"{"metadata":{"\ude00user_id":"x"}}"#,
            r#"{"user":"\udc00"}"#,
            r#"{"model":"\ud800x"}"#,
            r#"{"stream_options":{"include_usage":1e400}}"#,
            r#"{"litellm_metadata":[-1e999]}"#,
            r#"{"stream":1e400}"#,
        ] {
            let full = serde_json::from_str::<serde_json::Value>(body).unwrap_err();
            let view = RequestView::parse(body.as_bytes()).expect_err(body);
            // The same class and place, so the 400 says the same.
            assert_eq!(view.classify(), full.classify(), "{body}");
            assert_eq!((view.line(), view.column()), (full.line(), full.column()));
        }
        let fine = r#"{"user":"\ud83d\ude00","metadata":{"a":[1e308,-0,{"b":null}]}}"#;
        let v = RequestView::parse(fine.as_bytes()).unwrap();
        assert_eq!(v.user.map(RawValue::get), Some(r#""\ud83d\ude00""#));
    }

    #[test]
    fn kept_members_nest_no_deeper_than_a_full_parse() {
        for member in ["metadata", "user", "stream_options"] {
            for n in [1, 100, 125, 126, 127, 128, 1000] {
                let body = format!("{{\"{member}\":{}{}}}", "[".repeat(n), "]".repeat(n));
                let full = serde_json::from_str::<serde_json::Value>(&body).is_ok();
                assert_eq!(
                    RequestView::parse(body.as_bytes()).is_ok(),
                    full,
                    "{member} at depth {n}"
                );
            }
        }
    }

    #[test]
    fn is_stream_is_exactly_true() {
        for (body, want) in [
            (&br#"{"stream":true}"#[..], true),
            (br#"{"stream":false}"#, false),
            (br#"{"stream":"true"}"#, false),
            (br#"{"stream": true }"#, true),
            (br#"{}"#, false),
        ] {
            assert_eq!(RequestView::parse(body).unwrap().is_stream(), want);
        }
    }
}
