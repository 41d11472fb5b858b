//! Just enough HTTP/1.1 for an engine stand-in: one request at a time per
//! connection (pipelined bytes wait in the buffer), bodies by Content-Length
//! or chunked, `Expect: 100-continue`, keep-alive, and responses either with
//! Content-Length or as a chunked stream whose chunks are written one by one.
//!
//! Everything here treats its input as hostile: malformed input becomes a
//! [`ReadError::Bad`] that the caller answers with a 4xx and a closed
//! connection, since the framing of anything after it cannot be trusted.

use std::io::{self, Write};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

pub(crate) const MAX_HEAD_BYTES: usize = 64 * 1024;
/// Header slots for httparse; one more header is a 431.
const MAX_HEADERS: usize = 128;
/// Generous for prompts (400k tokens at 4 bytes each is 1.6 MB) while
/// bounding what a broken client can make us buffer.
pub(crate) const MAX_BODY_BYTES: usize = 32 * 1024 * 1024;
/// Chunk-size lines and trailer lines; extensions make them longer than hex digits.
const MAX_LINE_BYTES: usize = 4096;
const READ_RESERVE: usize = 8 * 1024;

#[derive(Debug)]
pub(crate) struct Request {
    pub method: String,
    /// As received: origin-form path with query, or absolute-form URL.
    pub target: String,
    /// Path without scheme, authority or query, for routing.
    pub path: String,
    pub http10: bool,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// Whether the client allows another request on this connection.
    pub keep_alive: bool,
}

impl Request {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// All values of a (possibly repeated) list header, split on commas.
    fn header_tokens<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.headers
            .iter()
            .filter(move |(n, _)| n.eq_ignore_ascii_case(name))
            .flat_map(|(_, v)| v.split(','))
            .map(str::trim)
            .filter(|t| !t.is_empty())
    }
}

#[derive(Debug)]
pub(crate) enum ReadError {
    /// The peer closed cleanly between requests.
    Closed,
    /// The transport failed or the peer left mid-request: nobody to answer.
    Io,
    /// Answer with this status and message, then close.
    Bad(u16, String),
}

fn bad(status: u16, message: impl Into<String>) -> ReadError {
    ReadError::Bad(status, message.into())
}

enum Framing {
    Length(usize),
    Chunked,
}

async fn fill<R: AsyncRead + Unpin>(rd: &mut R, buf: &mut BytesMut) -> Result<usize, ReadError> {
    buf.reserve(READ_RESERVE);
    rd.read_buf(buf).await.map_err(|_| ReadError::Io)
}

/// Reads one request. `buf` carries bytes across calls (pipelining), and `wr`
/// is only used for the interim `100 Continue`.
pub(crate) async fn read_request<R, W>(
    rd: &mut R,
    wr: &mut W,
    buf: &mut BytesMut,
) -> Result<Request, ReadError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut req = loop {
        // RFC 9112 §2.2: empty lines before a request-line are to be ignored.
        // Dropped here rather than by httparse, so that a peer that leaves
        // after sending only those has closed cleanly.
        while buf.starts_with(b"\r\n") {
            buf.advance(2);
        }
        if let Some((req, head_len)) = parse_head(buf)? {
            buf.advance(head_len);
            break req;
        }
        if buf.len() > MAX_HEAD_BYTES {
            return Err(bad(431, "request head too large"));
        }
        if fill(rd, buf).await? == 0 {
            return Err(if buf.is_empty() {
                ReadError::Closed
            } else {
                bad(400, "connection closed inside the request head")
            });
        }
    };

    let framing = framing(&req)?;
    let has_body = !matches!(framing, Framing::Length(0));
    if let Some(expect) = req.header("expect") {
        if !expect.eq_ignore_ascii_case("100-continue") {
            return Err(bad(417, format!("unsupported expectation {expect:?}")));
        }
        // HTTP/1.0 clients do not know interim responses (RFC 9110 §10.1.1).
        if has_body && !req.http10 {
            wr.write_all(b"HTTP/1.1 100 Continue\r\n\r\n")
                .await
                .map_err(|_| ReadError::Io)?;
        }
    }
    req.body = match framing {
        Framing::Length(n) => read_exact(rd, buf, n).await?,
        Framing::Chunked => read_chunked(rd, buf).await?,
    };
    Ok(req)
}

/// The request head at the start of `buf` and its length, or `None` while
/// it is incomplete.
fn parse_head(buf: &[u8]) -> Result<Option<(Request, usize)>, ReadError> {
    let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut parsed = httparse::Request::new(&mut slots);
    let head_len = match parsed.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => return Err(bad(431, "too many headers")),
        Err(e @ (httparse::Error::Version | httparse::Error::NewLine)) => {
            return version_error(buf, e)
        }
        Err(e) => return Err(bad(400, format!("malformed request head: {e}"))),
    };
    if head_len > MAX_HEAD_BYTES {
        return Err(bad(431, "request head too large"));
    }
    // httparse also ends lines at a bare LF; this server takes CRLF only, so
    // that no line break can mean one thing here and another to a proxy.
    let head = &buf[..head_len];
    if memchr::memchr_iter(b'\n', head).any(|i| i == 0 || head[i - 1] != b'\r') {
        return Err(bad(400, "bare LF in the request head"));
    }
    let (Some(method), Some(target), Some(minor)) = (parsed.method, parsed.path, parsed.version)
    else {
        return Err(bad(400, "malformed request line"));
    };
    let http10 = minor == 0;
    let path = route_path(target).ok_or_else(|| bad(400, "malformed request target"))?;
    let headers = parsed
        .headers
        .iter()
        .map(|h| {
            // httparse passes obs-text through as bytes; header values here are strings.
            let value =
                std::str::from_utf8(h.value).map_err(|_| bad(400, "request head is not UTF-8"))?;
            Ok((h.name.to_string(), value.to_string()))
        })
        .collect::<Result<Vec<_>, ReadError>>()?;

    let mut req = Request {
        method: method.to_string(),
        target: target.to_string(),
        path,
        http10,
        headers,
        body: Vec::new(),
        keep_alive: false,
    };
    // HTTP/1.0 keep-alive is an opt-in extension that no client of the
    // engine relies on; closing after each response is always allowed.
    req.keep_alive = !http10
        && !req
            .header_tokens("connection")
            .any(|t| t.eq_ignore_ascii_case("close"));
    Ok(Some((req, head_len)))
}

/// httparse refuses every version but 1.0 and 1.1 alike, while a request line
/// that names another HTTP version is answered 505 (RFC 9110 §15.6.6).
fn version_error(buf: &[u8], e: httparse::Error) -> Result<Option<(Request, usize)>, ReadError> {
    let Some(end) = memchr::memmem::find(buf, b"\r\n") else {
        // httparse stops at the first wrong byte; the rest of the version
        // decides between 400 and 505.
        return match e {
            httparse::Error::Version => Ok(None),
            _ => Err(bad(400, "malformed request line")),
        };
    };
    let mut parts = buf[..end].split(|&b| b == b' ');
    match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some(_), Some(_), Some(v), None)
            if v.starts_with(b"HTTP/") && v != b"HTTP/1.0" && v != b"HTTP/1.1" =>
        {
            Err(bad(505, "only HTTP/1.0 and HTTP/1.1"))
        }
        _ => Err(bad(400, format!("malformed request head: {e}"))),
    }
}

/// The path used for routing: absolute-form targets lose scheme and
/// authority, and the query is dropped.
fn route_path(target: &str) -> Option<String> {
    let path = if target.starts_with('/') || target == "*" {
        target
    } else {
        let rest = target
            .strip_prefix("http://")
            .or_else(|| target.strip_prefix("https://"))?;
        rest.find('/').map_or("/", |i| &rest[i..])
    };
    let path = path.split(['?', '#']).next().unwrap_or(path);
    Some(path.to_string())
}

fn framing(req: &Request) -> Result<Framing, ReadError> {
    let has_te = req.header("transfer-encoding").is_some();
    let lengths: Vec<&str> = req.header_tokens("content-length").collect();
    if has_te {
        // Both headers is the classic request-smuggling shape; refuse it.
        if req.header("content-length").is_some() {
            return Err(bad(400, "both Transfer-Encoding and Content-Length"));
        }
        let codings: Vec<&str> = req.header_tokens("transfer-encoding").collect();
        return match codings.as_slice() {
            [c] if c.eq_ignore_ascii_case("chunked") => Ok(Framing::Chunked),
            [.., last] if last.eq_ignore_ascii_case("chunked") => {
                Err(bad(501, "only the chunked transfer coding is supported"))
            }
            _ => Err(bad(400, "request Transfer-Encoding must end with chunked")),
        };
    }
    let Some(first) = lengths.first() else {
        if req.header("content-length").is_some() {
            return Err(bad(400, "empty Content-Length"));
        }
        return Ok(Framing::Length(0));
    };
    if lengths.iter().any(|l| l != first) {
        return Err(bad(400, "conflicting Content-Length values"));
    }
    if !first.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad(400, "malformed Content-Length"));
    }
    match first.parse::<usize>() {
        Ok(n) if n <= MAX_BODY_BYTES => Ok(Framing::Length(n)),
        // All digits, so a parse failure is an overflow: too large either way.
        _ => Err(bad(413, "request body too large")),
    }
}

async fn read_exact<R: AsyncRead + Unpin>(
    rd: &mut R,
    buf: &mut BytesMut,
    n: usize,
) -> Result<Vec<u8>, ReadError> {
    while buf.len() < n {
        if fill(rd, buf).await? == 0 {
            return Err(ReadError::Io);
        }
    }
    Ok(buf.split_to(n).to_vec())
}

/// One CRLF-terminated line, without the CRLF.
async fn read_line<R: AsyncRead + Unpin>(
    rd: &mut R,
    buf: &mut BytesMut,
) -> Result<String, ReadError> {
    loop {
        if let Some(end) = memchr::memmem::find(buf, b"\r\n") {
            if end > MAX_LINE_BYTES {
                return Err(bad(400, "chunk line too long"));
            }
            let line = buf.split_to(end + 2);
            return std::str::from_utf8(&line[..end])
                .map(str::to_string)
                .map_err(|_| bad(400, "chunk line is not UTF-8"));
        }
        if buf.len() > MAX_LINE_BYTES {
            return Err(bad(400, "chunk line too long"));
        }
        if fill(rd, buf).await? == 0 {
            return Err(ReadError::Io);
        }
    }
}

async fn read_chunked<R: AsyncRead + Unpin>(
    rd: &mut R,
    buf: &mut BytesMut,
) -> Result<Vec<u8>, ReadError> {
    let mut body = Vec::new();
    loop {
        let line = read_line(rd, buf).await?;
        // Not httparse::parse_chunk_size: it reads an empty size as 0 and
        // cannot tell an overflow (413 here) from garbage (400).
        let size = line
            .split(';')
            .next()
            .unwrap_or_default()
            .trim_matches([' ', '\t']);
        if size.is_empty() || !size.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad(400, "malformed chunk size"));
        }
        let size =
            usize::from_str_radix(size, 16).map_err(|_| bad(413, "request body too large"))?;
        if size == 0 {
            break;
        }
        if body.len().saturating_add(size) > MAX_BODY_BYTES {
            return Err(bad(413, "request body too large"));
        }
        body.extend_from_slice(&read_exact(rd, buf, size).await?);
        if !read_line(rd, buf).await?.is_empty() {
            return Err(bad(400, "chunk data longer than its size"));
        }
    }
    // Trailer fields carry nothing the engine uses; they are read and dropped.
    let mut trailer_bytes = 0;
    loop {
        let line = read_line(rd, buf).await?;
        if line.is_empty() {
            return Ok(body);
        }
        trailer_bytes += line.len();
        if trailer_bytes > MAX_HEAD_BYTES {
            return Err(bad(431, "trailer section too large"));
        }
    }
}

pub(crate) fn reason(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        413 => "Content Too Large",
        417 => "Expectation Failed",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        505 => "HTTP Version Not Supported",
        _ => "Unknown",
    }
}

fn status_line(out: &mut Vec<u8>, status: u16) {
    let _ = write!(out, "HTTP/1.1 {status} {}\r\n", reason(status));
}

/// A complete response with Content-Length, in a single write.
pub(crate) async fn write_response<W: AsyncWrite + Unpin>(
    wr: &mut W,
    status: u16,
    content_type: &str,
    body: &[u8],
    keep_alive: bool,
) -> io::Result<()> {
    let mut out = Vec::with_capacity(body.len() + 160);
    status_line(&mut out, status);
    if !content_type.is_empty() {
        let _ = write!(out, "content-type: {content_type}\r\n");
    }
    let _ = write!(out, "content-length: {}\r\n", body.len());
    if !keep_alive {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body);
    wr.write_all(&out).await
}

/// How a streamed body is delimited: chunked for HTTP/1.1, and by closing
/// the connection for HTTP/1.0 clients, which cannot parse chunks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StreamFraming {
    Chunked,
    UntilClose,
}

pub(crate) async fn write_stream_head<W: AsyncWrite + Unpin>(
    wr: &mut W,
    content_type: &str,
    framing: StreamFraming,
    keep_alive: bool,
) -> io::Result<()> {
    let mut out = Vec::with_capacity(160);
    status_line(&mut out, 200);
    let _ = write!(
        out,
        "content-type: {content_type}\r\ncache-control: no-cache\r\n"
    );
    match framing {
        StreamFraming::Chunked => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
        StreamFraming::UntilClose => {}
    }
    if !keep_alive || framing == StreamFraming::UntilClose {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
    wr.write_all(&out).await
}

/// Writes `data` as one chunk in one write. The socket is unbuffered with
/// TCP_NODELAY, so the chunk is on the wire when this returns.
pub(crate) async fn write_stream_chunk<W: AsyncWrite + Unpin>(
    wr: &mut W,
    framing: StreamFraming,
    data: &[u8],
) -> io::Result<()> {
    if data.is_empty() {
        // An empty chunk would read as the terminator.
        return Ok(());
    }
    match framing {
        StreamFraming::Chunked => {
            let mut out = Vec::with_capacity(data.len() + 12);
            let _ = write!(out, "{:x}\r\n", data.len());
            out.extend_from_slice(data);
            out.extend_from_slice(b"\r\n");
            wr.write_all(&out).await
        }
        StreamFraming::UntilClose => wr.write_all(data).await,
    }
}

pub(crate) async fn write_stream_end<W: AsyncWrite + Unpin>(
    wr: &mut W,
    framing: StreamFraming,
) -> io::Result<()> {
    match framing {
        StreamFraming::Chunked => wr.write_all(b"0\r\n\r\n").await,
        StreamFraming::UntilClose => Ok(()),
    }
}
