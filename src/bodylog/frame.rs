//! The body-log wire format and the size caps, pure.
//!
//! One frame per request, big-endian as the OpenResty gateway's listener reads it:
//! `[u32 length excluding itself][u16 meta_len][meta JSON][u32 req_len][req][u32 resp_len][resp]`.
//! The request keeps its first [`REQ_CAP`] bytes; the response its first
//! [`RESP_HEAD`] and last [`RESP_TAIL`] bytes with a marker in between
//! saying how many are missing, so a long stream keeps both its start and
//! its final usage frame.

use bytes::Bytes;
use std::collections::VecDeque;

pub const REQ_CAP: usize = 2 << 20;
pub const RESP_HEAD: usize = 3 << 19;
pub const RESP_TAIL: usize = 512 << 10;
/// The largest frame a listener accepts; a length above it means the
/// stream is not body-log frames (or is out of step).
pub const MAX_FRAME: usize = 64 << 20;

/// What goes between a truncated response's head and tail.
pub fn truncation_marker(missing: u64) -> String {
    format!("[BODYLOG_TRUNCATED {missing} BYTES MISSING IN MIDDLE]")
}

/// A frame ready for the wire. The bodies are shared, not copied, so
/// building one on the request path costs the meta JSON only.
#[derive(Debug, Clone)]
pub struct Frame {
    meta: Vec<u8>,
    req: Bytes,
    resp: Bytes,
}

impl Frame {
    /// `meta` must fit a u16 ([`fit_meta`] makes it); the bodies are capped
    /// by the caller.
    pub fn new(meta: Vec<u8>, req: Bytes, resp: Bytes) -> Self {
        debug_assert!(meta.len() <= u16::MAX as usize);
        Frame { meta, req, resp }
    }

    /// Bytes on the wire, length prefix included.
    pub fn wire_len(&self) -> usize {
        4 + 2 + self.meta.len() + 4 + self.req.len() + 4 + self.resp.len()
    }

    /// The frame as three writes: everything up to the request body, the
    /// request body, then the response's length and body.
    pub fn parts(&self) -> [Bytes; 4] {
        let mut head = Vec::with_capacity(10 + self.meta.len());
        head.extend_from_slice(&((self.wire_len() - 4) as u32).to_be_bytes());
        head.extend_from_slice(&(self.meta.len() as u16).to_be_bytes());
        head.extend_from_slice(&self.meta);
        head.extend_from_slice(&(self.req.len() as u32).to_be_bytes());
        let resp_len = (self.resp.len() as u32).to_be_bytes().to_vec();
        [
            Bytes::from(head),
            self.req.clone(),
            Bytes::from(resp_len),
            self.resp.clone(),
        ]
    }

    /// The whole frame in one buffer (tests, and small frames).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.wire_len());
        for part in self.parts() {
            out.extend_from_slice(&part);
        }
        out
    }
}

/// A frame's pieces, borrowed from the bytes after its length prefix.
#[derive(Debug, PartialEq, Eq)]
pub struct FrameRef<'a> {
    pub meta: &'a [u8],
    pub req: &'a [u8],
    pub resp: &'a [u8],
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    /// The sections' lengths do not add up to the frame's.
    Malformed(&'static str),
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecodeError::Malformed(why) => write!(f, "malformed frame: {why}"),
        }
    }
}

/// Splits a frame body (the `length` bytes after the prefix).
pub fn decode(body: &[u8]) -> Result<FrameRef<'_>, DecodeError> {
    let (meta, rest) = take(body, 2, "meta length")?;
    let (req, rest) = take(rest, 4, "request length")?;
    let (resp, rest) = take(rest, 4, "response length")?;
    if !rest.is_empty() {
        return Err(DecodeError::Malformed("bytes after the response"));
    }
    Ok(FrameRef { meta, req, resp })
}

/// A `width`-byte big-endian length, then that many bytes.
fn take<'a>(
    buf: &'a [u8],
    width: usize,
    what: &'static str,
) -> Result<(&'a [u8], &'a [u8]), DecodeError> {
    let (len, rest) = buf
        .split_at_checked(width)
        .ok_or(DecodeError::Malformed(what))?;
    let n = len.iter().fold(0usize, |n, &b| (n << 8) | b as usize);
    rest.split_at_checked(n).ok_or(DecodeError::Malformed(what))
}

/// The request body as logged: at most [`REQ_CAP`] bytes, and whether it
/// was cut. Shares the buffer.
pub fn cap_request(body: &Bytes) -> (Bytes, bool) {
    if body.len() <= REQ_CAP {
        (body.clone(), false)
    } else {
        (body.slice(..REQ_CAP), true)
    }
}

/// The meta JSON in a u16. Only headers and the URI can grow it past that
/// (a client's); they give way first, with `meta_truncated` set.
pub fn fit_meta(meta: &mut serde_json::Value) -> Vec<u8> {
    let encoded = serde_json::to_vec(meta).unwrap_or_default();
    if encoded.len() <= u16::MAX as usize {
        return encoded;
    }
    meta["req_headers"] = serde_json::json!({});
    meta["meta_truncated"] = true.into();
    if let Some(uri) = meta["uri"].as_str() {
        let cut = floor_char_boundary(uri, 4096);
        meta["uri"] = uri[..cut].to_string().into();
    }
    let encoded = serde_json::to_vec(meta).unwrap_or_default();
    if encoded.len() <= u16::MAX as usize {
        encoded
    } else {
        br#"{"meta_truncated":true}"#.to_vec()
    }
}

fn floor_char_boundary(s: &str, max: usize) -> usize {
    (0..=max.min(s.len()))
        .rev()
        .find(|&i| s.is_char_boundary(i))
        .unwrap_or(0)
}

/// A response body kept as its first `head` and last `tail` bytes, however
/// long it runs: memory stays bounded by `head + tail`.
#[derive(Debug)]
pub struct HeadTail {
    head_cap: usize,
    tail_cap: usize,
    head: Vec<u8>,
    tail: VecDeque<u8>,
    total: u64,
}

impl Default for HeadTail {
    fn default() -> Self {
        Self::new(RESP_HEAD, RESP_TAIL)
    }
}

impl HeadTail {
    pub fn new(head_cap: usize, tail_cap: usize) -> Self {
        HeadTail {
            head_cap,
            tail_cap,
            head: Vec::new(),
            tail: VecDeque::new(),
            total: 0,
        }
    }

    pub fn push(&mut self, mut data: &[u8]) {
        self.total += data.len() as u64;
        let room = self.head_cap - self.head.len();
        if room > 0 {
            let take = room.min(data.len());
            let need = self.head.len() + take;
            if need > self.head.capacity() {
                // Doubling, but never past the cap: a capture holds
                // head_cap bytes, not the next power of two.
                let grow = need.max(self.head.capacity() * 2).min(self.head_cap);
                self.head.reserve_exact(grow - self.head.len());
            }
            self.head.extend_from_slice(&data[..take]);
            data = &data[take..];
        }
        if data.len() >= self.tail_cap {
            self.tail.clear();
            self.tail.extend(&data[data.len() - self.tail_cap..]);
            return;
        }
        let overflow = (self.tail.len() + data.len()).saturating_sub(self.tail_cap);
        self.tail.drain(..overflow);
        self.tail.extend(data);
    }

    /// Bytes pushed so far, kept or not.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// The kept bytes (head, marker, tail when something was cut) and
    /// whether something was.
    pub fn finish(self) -> (Bytes, bool) {
        let kept = (self.head.len() + self.tail.len()) as u64;
        let missing = self.total - kept;
        let mut out = self.head;
        if missing > 0 {
            out.extend_from_slice(truncation_marker(missing).as_bytes());
        }
        let (a, b) = self.tail.as_slices();
        out.extend_from_slice(a);
        out.extend_from_slice(b);
        (Bytes::from(out), missing > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_round_trips_with_big_endian_lengths() {
        let f = Frame::new(
            br#"{"a":1}"#.to_vec(),
            Bytes::from_static(b"req"),
            Bytes::from_static(b"resp!"),
        );
        let wire = f.to_vec();
        assert_eq!(wire.len(), f.wire_len());
        assert_eq!(&wire[..4], &((wire.len() - 4) as u32).to_be_bytes());
        assert_eq!(&wire[4..6], &[0, 7]);
        assert_eq!(&wire[13..17], &[0, 0, 0, 3]);
        let parsed = decode(&wire[4..]).unwrap();
        assert_eq!(parsed.meta, br#"{"a":1}"#);
        assert_eq!(parsed.req, b"req");
        assert_eq!(parsed.resp, b"resp!");
    }

    #[test]
    fn decode_refuses_lengths_that_do_not_add_up() {
        let wire = Frame::new(b"{}".to_vec(), Bytes::new(), Bytes::from_static(b"x")).to_vec();
        let body = &wire[4..];
        assert!(decode(&body[..body.len() - 1]).is_err(), "short");
        let mut long = body.to_vec();
        long.push(0);
        assert!(decode(&long).is_err(), "trailing byte");
        assert!(decode(&[]).is_err());
        assert!(decode(&[0xff, 0xff, 1]).is_err());
    }

    #[test]
    fn request_over_the_cap_keeps_its_start() {
        let small = Bytes::from(vec![1u8; REQ_CAP]);
        assert_eq!(cap_request(&small), (small.clone(), false));
        let big = Bytes::from((0..REQ_CAP + 10).map(|i| i as u8).collect::<Vec<_>>());
        let (kept, cut) = cap_request(&big);
        assert!(cut);
        assert_eq!(kept, big.slice(..REQ_CAP));
    }

    /// Every split of the input into chunks gives the same result: head,
    /// marker with the exact missing count, tail.
    #[test]
    fn head_tail_keeps_both_ends_and_counts_the_middle() {
        let data: Vec<u8> = (0..100u32).map(|i| i as u8).collect();
        for chunk in [1, 3, 7, 10, 11, 100] {
            let mut ht = HeadTail::new(10, 20);
            for c in data.chunks(chunk) {
                ht.push(c);
            }
            assert_eq!(ht.total(), 100);
            let (out, cut) = ht.finish();
            assert!(cut);
            let mut want = data[..10].to_vec();
            want.extend_from_slice(truncation_marker(70).as_bytes());
            want.extend_from_slice(&data[80..]);
            assert_eq!(out.as_ref(), want.as_slice(), "chunks of {chunk}");
        }
    }

    #[test]
    fn head_tail_within_caps_is_the_body_itself() {
        let data: Vec<u8> = (0..30u8).collect();
        for chunk in [1, 4, 30] {
            let mut ht = HeadTail::new(10, 20);
            for c in data.chunks(chunk) {
                ht.push(c);
            }
            assert_eq!(ht.finish(), (Bytes::from(data.clone()), false));
        }
        let (empty, cut) = HeadTail::new(10, 20).finish();
        assert!(empty.is_empty() && !cut);
    }

    #[test]
    fn oversized_meta_drops_headers_first() {
        let mut meta = serde_json::json!({
            "uri": "/x",
            "req_headers": {"big": "v".repeat(70_000)},
        });
        let out = fit_meta(&mut meta);
        assert!(out.len() <= u16::MAX as usize);
        let back: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(back["meta_truncated"], true);
        assert_eq!(back["uri"], "/x");
        let mut small = serde_json::json!({"uri": "/x"});
        assert_eq!(fit_meta(&mut small), br#"{"uri":"/x"}"#);
    }
}
