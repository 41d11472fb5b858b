//! A request body kept in the pieces it was read in.
//!
//! Pingora hands a body out as copies of its 64 KiB read buffer. Joining
//! them into one buffer copied every long prompt a second time (239 k of
//! the 1.03 M instructions a 300 KB body cost, `benches/instructions.sh`), and a streamed
//! one a third time for the include_usage edit. The view's skim reads
//! across pieces, an include_usage edit splices a piece in, and the replay
//! sends the pieces on one by one; a body is joined only for a reader that
//! needs it whole (content rules, prefix transforms, the body log) and for
//! Pingora's retry buffer, which takes one buffer (at most 64 KiB).

use crate::rewrite::{apply_edits, Edit, EditSink};
use bytes::{Bytes, BytesMut};
use smallvec::SmallVec;
use std::borrow::Cow;
use std::ops::Range;

/// Read chunks shorter than this are copied together into a piece of at
/// least this size, so that a client sending a chunked body in tiny chunks
/// cannot make a piece (and a chunk of the replayed request) per byte: a
/// body of n bytes has at most 2n / `MIN_PIECE` + 2 pieces.
pub const MIN_PIECE: usize = 16 * 1024;

#[derive(Debug, Default, Clone)]
pub struct RequestBody {
    /// Never empty pieces.
    pieces: SmallVec<[Bytes; 1]>,
    len: usize,
}

impl RequestBody {
    pub fn one(bytes: Bytes) -> Self {
        let mut body = RequestBody::default();
        body.push(bytes);
        body
    }

    fn push(&mut self, piece: Bytes) {
        if !piece.is_empty() {
            self.len += piece.len();
            self.pieces.push(piece);
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn pieces(&self) -> &[Bytes] {
        &self.pieces
    }

    /// The body in one buffer: borrowed when it is one piece, else copied.
    pub fn whole(&self) -> Cow<'_, [u8]> {
        match self.pieces.as_slice() {
            [] => Cow::Borrowed(&[]),
            [one] => Cow::Borrowed(one),
            many => Cow::Owned(many.concat()),
        }
    }

    /// The body as one `Bytes`, shared when it is one piece.
    pub fn whole_bytes(&self) -> Bytes {
        match self.pieces.as_slice() {
            [] => Bytes::new(),
            [one] => one.clone(),
            _ => self.join(),
        }
    }

    /// Joins the pieces into one, in place.
    pub fn make_whole(&mut self) {
        if self.pieces.len() > 1 {
            let joined = self.join();
            self.pieces.clear();
            self.pieces.push(joined);
        }
    }

    /// The first piece: the whole body once it was made whole.
    pub fn first_piece(&self) -> &[u8] {
        self.pieces.first().map_or(&[], |p| p)
    }

    fn join(&self) -> Bytes {
        self.pieces.concat().into()
    }

    /// Whether `ptr` points into one of the pieces (a view's member read
    /// from this body does).
    pub fn holds(&self, ptr: *const u8) -> bool {
        self.pieces
            .iter()
            .any(|piece| piece.as_ptr_range().contains(&ptr))
    }

    /// The body with `edits` made; the pieces around them are shared, not
    /// copied. `None` when the edits do not fit the body (see
    /// [`apply_edits`]).
    pub fn spliced(&self, edits: &mut [Edit]) -> Option<RequestBody> {
        let mut out = Shared {
            from: self,
            out: RequestBody::default(),
        };
        apply_edits(self.len, edits, &mut out)?;
        Some(out.out)
    }
}

/// Edits applied between a body's pieces: what is kept is sliced out of
/// them, each replacement is a piece of its own.
struct Shared<'a> {
    from: &'a RequestBody,
    out: RequestBody,
}

impl EditSink for Shared<'_> {
    fn keep(&mut self, span: Range<usize>) -> Option<()> {
        if span.start > span.end || span.end > self.from.len {
            return None;
        }
        let mut start = 0;
        for piece in &self.from.pieces {
            let end = start + piece.len();
            if start < span.end && span.start < end {
                self.out
                    .push(piece.slice(span.start.max(start) - start..span.end.min(end) - start));
            }
            start = end;
            if start >= span.end {
                break;
            }
        }
        Some(())
    }

    fn insert(&mut self, with: &Bytes) {
        self.out.push(with.clone());
    }
}

/// Gathers a body's chunks as they are read (see [`MIN_PIECE`]).
#[derive(Default)]
pub struct Gather {
    body: RequestBody,
    /// Short chunks being copied together into one piece.
    open: BytesMut,
}

impl Gather {
    /// Bytes gathered so far.
    pub fn read(&self) -> usize {
        self.body.len + self.open.len()
    }

    /// A body's first chunk is kept as it is, however short (most small
    /// bodies arrive in one); after it, short chunks are copied together.
    pub fn add(&mut self, chunk: Bytes) {
        if chunk.len() >= MIN_PIECE || self.read() == 0 {
            self.close_open();
            self.body.push(chunk);
        } else {
            self.open.extend_from_slice(&chunk);
            if self.open.len() >= MIN_PIECE {
                self.close_open();
            }
        }
    }

    fn close_open(&mut self) {
        if !self.open.is_empty() {
            let piece = self.open.split().freeze();
            self.body.push(piece);
        }
    }

    pub fn finish(mut self) -> RequestBody {
        self.close_open();
        self.body
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces_of(body: &RequestBody) -> Vec<Vec<u8>> {
        body.pieces().iter().map(|p| p.to_vec()).collect()
    }

    fn gathered(chunks: &[&[u8]]) -> RequestBody {
        let mut gather = Gather::default();
        for chunk in chunks {
            gather.add(Bytes::copy_from_slice(chunk));
        }
        gather.finish()
    }

    #[test]
    fn long_chunks_stay_pieces_and_short_ones_are_copied_together() {
        let long = vec![b'a'; MIN_PIECE];
        let body = gathered(&[b"{", &long, b"x", b"y", &long, b"z"]);
        assert_eq!(
            pieces_of(&body),
            vec![
                b"{".to_vec(),
                long.clone(),
                b"xy".to_vec(),
                long.clone(),
                b"z".to_vec()
            ]
        );
        assert_eq!(body.len(), 2 * MIN_PIECE + 4);
        assert_eq!(body.whole().len(), body.len());

        // Tiny chunks: one piece per MIN_PIECE bytes, not one per chunk.
        let mut gather = Gather::default();
        for _ in 0..3 * MIN_PIECE {
            gather.add(Bytes::from_static(b"b"));
        }
        let body = gather.finish();
        assert_eq!(body.pieces().len(), 4, "first chunk, then 3 joined pieces");
        assert_eq!(body.len(), 3 * MIN_PIECE);
    }

    #[test]
    fn splices_edit_without_copying_the_pieces() {
        let body = gathered(&[b"{\"a\":", &vec![b'1'; MIN_PIECE], b"}"]);
        let whole = body.whole().into_owned();
        for (at, remove) in [(0, 0), (1, 0), (5, 0), (5, 3), (4, 2), (whole.len(), 0)] {
            let mut want = whole.clone();
            want.splice(at..at + remove, b"XY".iter().copied());
            let got = body
                .spliced(&mut [Edit {
                    at: at..at + remove,
                    with: Bytes::from_static(b"XY"),
                }])
                .unwrap();
            assert_eq!(got.whole().into_owned(), want, "at {at} remove {remove}");
            assert_eq!(got.len(), want.len());
        }
        // The long piece is shared by the edited body.
        let edited = body
            .spliced(&mut [Edit {
                at: 1..1,
                with: Bytes::from_static(b"XY"),
            }])
            .unwrap();
        assert!(edited.holds(body.pieces()[1].as_ptr()));
        assert!(!edited.holds(b"elsewhere".as_ptr()));
    }

    #[test]
    fn made_whole_in_place() {
        let mut body = gathered(&[b"ab", &vec![b'c'; MIN_PIECE]]);
        assert_eq!(body.pieces().len(), 2);
        let whole = body.whole_bytes();
        body.make_whole();
        assert_eq!(body.pieces().len(), 1);
        assert_eq!(body.first_piece(), &whole[..]);
        assert!(RequestBody::default().whole().is_empty());
        assert_eq!(RequestBody::one(Bytes::new()).pieces().len(), 0);
    }
}
