//! The one HTTP/1.1 client of the integration tests and the bench: the wire
//! format here (request heads and chunked uploads, response heads, chunked
//! bodies), over a blocking socket for the tests ([`blocking`]) and over
//! tokio for the bench ([`nonblocking`]).
//!
//! Hand-written on httparse rather than a client crate because the tests
//! need what a client crate hides: exact request framing (a chunked upload
//! in chunks of a chosen size, raw bytes), a response read chunk by chunk as
//! it left the gateway, 1xx heads, and a body cut short told apart from a
//! complete one. The gateway's own SSE and framing code is not reused, so a
//! framing bug there cannot hide itself here.

pub mod blocking;
pub mod nonblocking;

use bytes::{Buf, BytesMut};
use memchr::memmem;

/// Header slots for httparse: Pingora forwards at most 256 upstream headers
/// and adds a few of its own.
const MAX_HEADERS: usize = 512;

/// How a request body is framed.
pub enum Upload {
    /// Content-Length framing.
    Length,
    /// Transfer-Encoding: chunked, in chunks of this many bytes.
    Chunked(usize),
}

/// A request's bytes: its head (`headers` as given, then the framing
/// header) and its body framed as `upload` says. A body that is empty goes
/// without Content-Length, except on a POST.
pub fn encode_request(
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    upload: Upload,
) -> Vec<u8> {
    let mut head = format!("{method} {path} HTTP/1.1\r\n");
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    match upload {
        Upload::Length => {
            if !body.is_empty() || method == "POST" {
                head.push_str(&format!("Content-Length: {}\r\n", body.len()));
            }
            head.push_str("\r\n");
            let mut out = head.into_bytes();
            out.extend_from_slice(body);
            out
        }
        Upload::Chunked(size) => {
            head.push_str("Transfer-Encoding: chunked\r\n\r\n");
            let mut out = head.into_bytes();
            for chunk in body.chunks(size.max(1)) {
                out.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
                out.extend_from_slice(chunk);
                out.extend_from_slice(b"\r\n");
            }
            out.extend_from_slice(b"0\r\n\r\n");
            out
        }
    }
}

/// A response head: the status and the headers as they came.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    pub status: u16,
    pub headers: Vec<(String, String)>,
}

impl Head {
    /// The first value of header `name`, whatever the case of its name.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn chunked(&self) -> bool {
        self.header("transfer-encoding")
            .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"))
    }

    pub fn close(&self) -> bool {
        self.header("connection")
            .is_some_and(|v| v.eq_ignore_ascii_case("close"))
    }

    pub fn content_length(&self) -> Option<usize> {
        self.header("content-length")
            .and_then(|v| v.trim().parse().ok())
    }
}

/// Parses a response head from the start of `buf`; `Ok(None)` if it is
/// incomplete. On success the head's bytes are removed from `buf`.
pub fn parse_head(buf: &mut BytesMut) -> Result<Option<Head>, String> {
    let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut parsed = httparse::Response::new(&mut slots);
    // Header lines a client cannot read are skipped, not fatal: it looks
    // only at the framing headers and the ones it reports or asserts on.
    let end = match httparse::ParserConfig::default()
        .ignore_invalid_headers_in_responses(true)
        .allow_spaces_after_header_name_in_responses(true)
        .parse_response(&mut parsed, buf)
    {
        Ok(httparse::Status::Complete(end)) => end,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(format!("bad response head: {e}")),
    };
    let status = parsed.code.ok_or("response head without a status")?;
    let headers = parsed
        .headers
        .iter()
        .map(|h| {
            let value = std::str::from_utf8(h.value).map_err(|_| "response head is not UTF-8")?;
            Ok((h.name.to_string(), value.to_string()))
        })
        .collect::<Result<_, String>>()?;
    buf.advance(end);
    Ok(Some(Head { status, headers }))
}

/// Decodes a chunked body incrementally.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Chunked {
    state: ChunkState,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum ChunkState {
    #[default]
    Size,
    Data(usize),
    DataEnd,
    Trailer,
    Done,
}

/// Where [`Chunked::decode_chunk`] stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decoded {
    /// The input ran out first.
    NeedMore,
    /// A chunk's data (and its CRLF) ended.
    ChunkEnd,
    /// The terminating chunk and the trailer are read.
    Done,
}

impl Chunked {
    /// Consumes what it can of `input`, appending body bytes to `out`.
    /// Returns true once the terminating chunk and trailer are read.
    pub fn decode(&mut self, input: &mut BytesMut, out: &mut Vec<u8>) -> Result<bool, String> {
        loop {
            match self.decode_chunk(input, out)? {
                Decoded::NeedMore => return Ok(false),
                Decoded::ChunkEnd => {}
                Decoded::Done => return Ok(true),
            }
        }
    }

    /// [`Chunked::decode`] that stops at the end of each chunk, for a reader
    /// that takes a stream chunk by chunk.
    pub fn decode_chunk(
        &mut self,
        input: &mut BytesMut,
        out: &mut Vec<u8>,
    ) -> Result<Decoded, String> {
        loop {
            match self.state {
                ChunkState::Done => return Ok(Decoded::Done),
                ChunkState::Size => {
                    let Some(end) = memmem::find(input, b"\r\n") else {
                        return if input.len() > 4096 {
                            Err("chunk size line too long".into())
                        } else {
                            Ok(Decoded::NeedMore)
                        };
                    };
                    // Not httparse::parse_chunk_size: it reads an empty size
                    // line as the last chunk, which would hide a broken stream.
                    let line = std::str::from_utf8(&input[..end])
                        .map_err(|_| "chunk size is not UTF-8".to_string())?;
                    let hex = line.split(';').next().unwrap_or("").trim();
                    let size = usize::from_str_radix(hex, 16)
                        .map_err(|_| format!("bad chunk size {hex:?}"))?;
                    input.advance(end + 2);
                    self.state = if size == 0 {
                        ChunkState::Trailer
                    } else {
                        ChunkState::Data(size)
                    };
                }
                ChunkState::Data(left) => {
                    if input.is_empty() {
                        return Ok(Decoded::NeedMore);
                    }
                    let n = left.min(input.len());
                    out.extend_from_slice(&input[..n]);
                    input.advance(n);
                    self.state = if n == left {
                        ChunkState::DataEnd
                    } else {
                        ChunkState::Data(left - n)
                    };
                }
                ChunkState::DataEnd => {
                    if input.len() < 2 {
                        return Ok(Decoded::NeedMore);
                    }
                    if &input[..2] != b"\r\n" {
                        return Err("chunk data longer than its size".into());
                    }
                    input.advance(2);
                    self.state = ChunkState::Size;
                    return Ok(Decoded::ChunkEnd);
                }
                ChunkState::Trailer => {
                    let Some(end) = memmem::find(input, b"\r\n") else {
                        return Ok(Decoded::NeedMore);
                    };
                    input.advance(end + 2);
                    if end == 0 {
                        self.state = ChunkState::Done;
                    }
                }
            }
        }
    }

    /// Past the terminating chunk, in its trailer.
    pub fn in_trailer(&self) -> bool {
        self.state == ChunkState::Trailer
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunked_decodes_across_any_split() {
        let wire = b"4\r\nabcd\r\na;ext=1\r\n0123456789\r\n0\r\nx-trailer: 1\r\n\r\nNEXT";
        for cut in 0..wire.len() {
            let mut d = Chunked::default();
            let mut out = Vec::new();
            let mut buf = BytesMut::from(&wire[..cut]);
            let done_early = d.decode(&mut buf, &mut out).expect("valid");
            buf.extend_from_slice(&wire[cut..]);
            let done = done_early || d.decode(&mut buf, &mut out).expect("valid");
            assert!(done, "cut at {cut}");
            assert_eq!(out, b"abcd0123456789", "cut at {cut}");
            assert_eq!(&buf[..], b"NEXT", "cut at {cut}");
        }
        let mut d = Chunked::default();
        let mut out = Vec::new();
        assert!(d
            .decode(&mut BytesMut::from(&b"zz\r\n"[..]), &mut out)
            .is_err());
        let mut d = Chunked::default();
        assert!(d
            .decode(&mut BytesMut::from(&b"2\r\nabc\r\n"[..]), &mut out)
            .is_err());
    }

    #[test]
    fn head_parses_status_and_finds_names_in_any_case() {
        let mut buf = BytesMut::from(
            &b"HTTP/1.1 200 OK\r\nX-Routed-Peer: e1\r\nTransfer-Encoding: chunked\r\n\r\nrest"[..],
        );
        let head = parse_head(&mut buf).expect("valid").expect("complete");
        assert_eq!(head.status, 200);
        assert_eq!(head.header("x-routed-peer"), Some("e1"));
        assert!(head.chunked() && !head.close());
        assert_eq!(&buf[..], b"rest");
        let mut partial = BytesMut::from(&b"HTTP/1.1 200 OK\r\n"[..]);
        assert_eq!(parse_head(&mut partial), Ok(None));
        assert!(parse_head(&mut BytesMut::from(&b"SPDY 200\r\n\r\n"[..])).is_err());
    }
}
