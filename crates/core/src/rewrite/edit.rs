//! The one edit type of request bodies, and applying edits to the
//! original bytes: into one new buffer ([`splice`]) or, through an
//! [`EditSink`], between the pieces a body was read in.

use bytes::Bytes;
use serde_json::value::RawValue;
use std::ops::Range;

/// One replacement of `raw[at]` by `with`: the one edit type of request
/// bodies. `with` is `Bytes` so that a body kept in pieces takes it as a
/// piece of its own, shared, between the untouched pieces around it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Edit {
    pub at: Range<usize>,
    pub with: Bytes,
}

/// Where applied edits go: the spans of the original kept between them, and
/// their replacements.
pub trait EditSink {
    /// `span` of the original, in order; `None` when it is out of bounds.
    fn keep(&mut self, span: Range<usize>) -> Option<()>;
    fn insert(&mut self, with: &Bytes);
}

/// Applies `edits` to an original of `len` bytes, in order of position, into
/// `out`. `None` if an edit is out of bounds or two overlap: the edits then
/// do not describe one consistent change.
pub fn apply_edits(len: usize, edits: &mut [Edit], out: &mut impl EditSink) -> Option<()> {
    edits.sort_by_key(|e| e.at.start);
    let mut done = 0;
    for e in edits.iter() {
        if e.at.start < done || e.at.start > e.at.end {
            return None;
        }
        out.keep(done..e.at.start)?;
        out.insert(&e.with);
        done = e.at.end;
    }
    if done > len {
        return None;
    }
    out.keep(done..len)
}

/// `raw` with every edit applied, in one new buffer (see [`apply_edits`]).
pub fn splice(raw: &[u8], edits: &mut [Edit]) -> Option<Vec<u8>> {
    struct Joined<'a> {
        raw: &'a [u8],
        out: Vec<u8>,
    }
    impl EditSink for Joined<'_> {
        fn keep(&mut self, span: Range<usize>) -> Option<()> {
            self.out.extend_from_slice(self.raw.get(span)?);
            Some(())
        }
        fn insert(&mut self, with: &Bytes) {
            self.out.extend_from_slice(with);
        }
    }
    let grow: usize = edits.iter().map(|e| e.with.len()).sum();
    let mut joined = Joined {
        raw,
        out: Vec::with_capacity(raw.len() + grow),
    };
    apply_edits(raw.len(), edits, &mut joined)?;
    Some(joined.out)
}

/// The byte span of `value` inside `raw`. `RawValue`s deserialized from
/// `raw` borrow their text from it, so the span is the pointer offset;
/// `None` for a value that is not a slice of `raw`.
pub(crate) fn span_in(raw: &[u8], value: &RawValue) -> Option<Range<usize>> {
    let text = value.get().as_bytes();
    let start = (text.as_ptr() as usize).checked_sub(raw.as_ptr() as usize)?;
    let end = start.checked_add(text.len())?;
    (end <= raw.len()).then_some(start..end)
}
