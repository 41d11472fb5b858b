//! The tests' side: a blocking connection with exact control over framing
//! (Content-Length or chunked uploads, raw bytes), keep-alive reuse,
//! chunk-by-chunk reads of a stream, and the source address. It panics where
//! a test could not go on, and returns `io::Result` where a test looks at
//! the failure.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::time::Duration;

use bytes::BytesMut;

use super::{encode_request, parse_head, Chunked, Decoded, Head, Upload};

pub const IO_TIMEOUT: Duration = Duration::from_secs(20);

#[derive(Debug, Clone)]
pub struct Response {
    pub head: Head,
    pub body: Vec<u8>,
}

impl Response {
    pub fn status(&self) -> u16 {
        self.head.status
    }
    pub fn header(&self, name: &str) -> Option<&str> {
        self.head.header(name)
    }
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "status {} body is not JSON ({e}): {}",
                self.head.status,
                String::from_utf8_lossy(&self.body)
            )
        })
    }
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

pub struct Conn {
    stream: TcpStream,
    /// Read but not yet taken: the rest of a head, body bytes, the next
    /// response.
    buf: BytesMut,
    /// Where a chunked body read chunk by chunk stands.
    chunks: Chunked,
}

fn invalid(why: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, why)
}

fn eof(why: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::UnexpectedEof, why.to_string())
}

impl Conn {
    pub fn open(addr: SocketAddr) -> Conn {
        let s = TcpStream::connect_timeout(&addr, IO_TIMEOUT).expect("connect");
        Self::from_stream(s)
    }

    /// Connects from a chosen local address (e.g. 127.0.0.2).
    pub fn open_from(local: IpAddr, addr: SocketAddr) -> Conn {
        let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
            .expect("socket");
        sock.bind(&SocketAddr::new(local, 0).into())
            .expect("bind local");
        sock.connect_timeout(&addr.into(), IO_TIMEOUT)
            .expect("connect");
        Self::from_stream(sock.into())
    }

    fn from_stream(s: TcpStream) -> Conn {
        s.set_nodelay(true).ok();
        s.set_read_timeout(Some(IO_TIMEOUT)).ok();
        s.set_write_timeout(Some(IO_TIMEOUT)).ok();
        Self::wrap(s)
    }

    fn wrap(stream: TcpStream) -> Conn {
        Conn {
            stream,
            buf: BytesMut::with_capacity(64 * 1024),
            chunks: Chunked::default(),
        }
    }

    pub fn set_read_timeout(&self, t: Duration) {
        self.stream.set_read_timeout(Some(t)).ok();
    }

    /// More bytes into the buffer; 0 at the end of the stream.
    fn fill(&mut self) -> std::io::Result<usize> {
        let mut block = [0u8; 64 * 1024];
        let n = self.stream.read(&mut block)?;
        self.buf.extend_from_slice(&block[..n]);
        Ok(n)
    }

    pub fn send(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        upload: Upload,
    ) {
        let mut all = vec![("Host", "gateway.test")];
        all.extend_from_slice(headers);
        // One write, a chunked body too: written a chunk at a time, a body
        // the gateway refuses part way (413 past `max_body_size`, then
        // close) could meet a broken pipe before the client reads the answer.
        let out = encode_request(method, path, &all, body, upload);
        self.stream.write_all(&out).expect("write request");
    }

    /// Raw bytes, for malformed-request tests.
    pub fn send_raw(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).expect("write raw");
    }

    pub fn read_head(&mut self) -> Head {
        self.try_read_head().expect("response head")
    }

    pub fn try_read_head(&mut self) -> std::io::Result<Head> {
        loop {
            let head = self.read_one_head()?;
            // 100 Continue precedes the real response.
            if head.status != 100 {
                return Ok(head);
            }
        }
    }

    /// Status of the next head, 1xx included.
    pub fn read_head_raw_status(&mut self) -> u16 {
        self.read_one_head().expect("response head").status
    }

    fn read_one_head(&mut self) -> std::io::Result<Head> {
        self.chunks = Chunked::default();
        loop {
            if let Some(head) = parse_head(&mut self.buf).map_err(invalid)? {
                return Ok(head);
            }
            let empty = self.buf.is_empty();
            if self.fill()? == 0 {
                return Err(eof(if empty {
                    "closed before response"
                } else {
                    "closed inside the response head"
                }));
            }
        }
    }

    /// Next chunk of a chunked body: Ok(Some) data, Ok(None) the terminating
    /// chunk, Err if the connection ended without it.
    pub fn read_chunk(&mut self) -> std::io::Result<Option<Vec<u8>>> {
        let mut data = Vec::new();
        loop {
            match self
                .chunks
                .decode_chunk(&mut self.buf, &mut data)
                .map_err(invalid)?
            {
                Decoded::ChunkEnd => return Ok(Some(data)),
                Decoded::Done => {
                    self.chunks = Chunked::default();
                    return Ok(None);
                }
                Decoded::NeedMore => {}
            }
            if self.fill()? == 0 {
                // The last chunk came; only the trailer's end is missing.
                if self.chunks.in_trailer() {
                    self.chunks = Chunked::default();
                    return Ok(None);
                }
                return Err(eof("stream ended without last chunk"));
            }
        }
    }

    pub fn read_body(&mut self, head: &Head) -> std::io::Result<Vec<u8>> {
        if head.chunked() {
            let mut body = Vec::new();
            while let Some(chunk) = self.read_chunk()? {
                body.extend_from_slice(&chunk);
            }
            Ok(body)
        } else if let Some(n) = head.content_length() {
            while self.buf.len() < n {
                if self.fill()? == 0 {
                    return Err(eof("closed inside the body"));
                }
            }
            Ok(self.buf.split_to(n).to_vec())
        } else {
            while self.fill()? > 0 {}
            Ok(self.buf.split().to_vec())
        }
    }

    pub fn read_response(&mut self) -> Response {
        let head = self.read_head();
        let body = self.read_body(&head).expect("response body");
        Response { head, body }
    }

    pub fn request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Response {
        self.send(method, path, headers, body, Upload::Length);
        self.read_response()
    }

    /// True once the server has closed the connection (EOF on read).
    pub fn is_closed(&mut self) -> bool {
        self.buf.is_empty() && matches!(self.fill(), Ok(0))
    }
}

/// One request on a fresh connection.
pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Response {
    Conn::open(addr).request(method, path, headers, body)
}

pub fn get(addr: SocketAddr, path: &str) -> Response {
    request(addr, "GET", path, &[], b"")
}

pub fn post_json(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    body: &serde_json::Value,
) -> Response {
    let mut h = vec![("Content-Type", "application/json")];
    h.extend_from_slice(headers);
    request(addr, "POST", path, &h, body.to_string().as_bytes())
}

/// GET that reports any connection failure as None instead of panicking
/// (for listeners that may be closing).
pub fn try_get(addr: SocketAddr, path: &str) -> Option<Response> {
    try_get_within(addr, path, IO_TIMEOUT)
}

/// [`try_get`] that gives up after `timeout` without an answer (a probe
/// that must not hang on a listener that accepts and never replies).
pub fn try_get_within(addr: SocketAddr, path: &str, timeout: Duration) -> Option<Response> {
    let stream = TcpStream::connect_timeout(&addr, timeout).ok()?;
    stream.set_read_timeout(Some(timeout)).ok()?;
    let mut conn = Conn::wrap(stream);
    let out = encode_request(
        "GET",
        path,
        &[("Host", "t"), ("Connection", "close")],
        b"",
        Upload::Length,
    );
    conn.stream.write_all(&out).ok()?;
    let head = conn.try_read_head().ok()?;
    let body = conn.read_body(&head).ok()?;
    Some(Response { head, body })
}
