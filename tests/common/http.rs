//! A raw HTTP/1.1 client for tests: exact control over framing (Content-Length
//! or chunked uploads), keep-alive reuse, frame-by-frame reads of a stream,
//! and the source address.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::time::Duration;

pub const IO_TIMEOUT: Duration = Duration::from_secs(20);
/// Header slots for httparse: Pingora forwards at most 256 upstream headers
/// and adds a few of its own.
const MAX_HEADERS: usize = 512;

pub enum Upload {
    /// Content-Length framing.
    Length,
    /// Transfer-Encoding: chunked, in chunks of this many bytes.
    Chunked(usize),
}

#[derive(Debug, Clone)]
pub struct Head {
    pub status: u16,
    pub headers: Vec<(String, String)>,
}

impl Head {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn chunked(&self) -> bool {
        self.header("transfer-encoding")
            .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"))
    }

    fn content_length(&self) -> Option<usize> {
        self.header("content-length")
            .and_then(|v| v.trim().parse().ok())
    }
}

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
    reader: BufReader<TcpStream>,
    writer: TcpStream,
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
        let writer = s.try_clone().expect("clone");
        Conn {
            reader: BufReader::with_capacity(64 * 1024, s),
            writer,
        }
    }

    pub fn set_read_timeout(&self, t: Duration) {
        self.writer.set_read_timeout(Some(t)).ok();
    }

    pub fn send(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        upload: Upload,
    ) {
        let mut head = format!("{method} {path} HTTP/1.1\r\nHost: gateway.test\r\n");
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
                self.writer.write_all(&out).expect("write request");
            }
            Upload::Chunked(size) => {
                // One write, as for a length: written a chunk at a time, a
                // body the gateway refuses part way (413 past
                // `max_body_size`, then close) could meet a broken pipe
                // before the client reads the answer.
                head.push_str("Transfer-Encoding: chunked\r\n\r\n");
                let mut out = head.into_bytes();
                for chunk in body.chunks(size.max(1)) {
                    out.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
                    out.extend_from_slice(chunk);
                    out.extend_from_slice(b"\r\n");
                }
                out.extend_from_slice(b"0\r\n\r\n");
                self.writer.write_all(&out).expect("write request");
            }
        }
    }

    /// Raw bytes, for malformed-request tests.
    pub fn send_raw(&mut self, bytes: &[u8]) {
        self.writer.write_all(bytes).expect("write raw");
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
        // Line by line up to the blank line, so the body stays in the reader.
        let mut raw = Vec::new();
        loop {
            let start = raw.len();
            if self.reader.read_until(b'\n', &mut raw)? == 0 {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    if raw.is_empty() {
                        "closed before response"
                    } else {
                        "closed inside the response head"
                    },
                ));
            }
            if matches!(&raw[start..], b"\r\n" | b"\n") {
                break;
            }
        }
        let bad = |why: String| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "bad response head {:?}: {why}",
                    String::from_utf8_lossy(&raw)
                ),
            )
        };
        let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut parsed = httparse::Response::new(&mut slots);
        // Header lines a test cannot read are skipped, not fatal, as a test
        // looks only at the headers it asserts on.
        match httparse::ParserConfig::default()
            .ignore_invalid_headers_in_responses(true)
            .allow_spaces_after_header_name_in_responses(true)
            .parse_response(&mut parsed, &raw)
        {
            Ok(httparse::Status::Complete(_)) => {}
            Ok(httparse::Status::Partial) => return Err(bad("incomplete".into())),
            Err(e) => return Err(bad(e.to_string())),
        }
        let status = parsed.code.ok_or_else(|| bad("no status".into()))?;
        let headers = parsed
            .headers
            .iter()
            .map(|h| {
                let value = std::str::from_utf8(h.value).map_err(|e| bad(e.to_string()))?;
                Ok((h.name.to_string(), value.to_string()))
            })
            .collect::<std::io::Result<_>>()?;
        Ok(Head { status, headers })
    }

    /// Next chunk of a chunked body: Ok(Some) data, Ok(None) the terminating
    /// chunk, Err if the connection ended without it.
    pub fn read_chunk(&mut self) -> std::io::Result<Option<Vec<u8>>> {
        let mut line = String::new();
        if self.reader.read_line(&mut line)? == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "stream ended without last chunk",
            ));
        }
        // Not httparse::parse_chunk_size: it reads an empty size line as the
        // last chunk, which would hide a broken stream.
        let size = usize::from_str_radix(line.trim().split(';').next().unwrap_or(""), 16).map_err(
            |_| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("bad chunk size {line:?}"),
                )
            },
        )?;
        if size == 0 {
            line.clear();
            self.reader.read_line(&mut line)?;
            return Ok(None);
        }
        let mut data = vec![0u8; size + 2];
        self.reader.read_exact(&mut data)?;
        data.truncate(size);
        Ok(Some(data))
    }

    pub fn read_body(&mut self, head: &Head) -> std::io::Result<Vec<u8>> {
        if head.chunked() {
            let mut body = Vec::new();
            while let Some(chunk) = self.read_chunk()? {
                body.extend_from_slice(&chunk);
            }
            Ok(body)
        } else if let Some(n) = head.content_length() {
            let mut body = vec![0u8; n];
            self.reader.read_exact(&mut body)?;
            Ok(body)
        } else {
            let mut body = Vec::new();
            self.reader.read_to_end(&mut body)?;
            Ok(body)
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
        matches!(self.reader.fill_buf(), Ok([]))
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
    let mut writer = stream.try_clone().ok()?;
    writer
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .ok()?;
    let mut conn = Conn {
        reader: BufReader::new(stream),
        writer,
    };
    let head = conn.try_read_head().ok()?;
    let body = conn.read_body(&head).ok()?;
    Some(Response { head, body })
}
