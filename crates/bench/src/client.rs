//! A small HTTP/1.1 client on plain tokio: one keep-alive connection per
//! session, a streaming POST whose SSE frames are timed as they arrive, and a
//! one-shot GET for metrics.
//!
//! The parsers ([`Chunked`], [`StreamTimer`], [`parse_head`]) are pure and
//! unit-tested; the bench deliberately does not reuse the gateway's own SSE
//! code, so a framing bug there cannot hide itself here.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::{Buf, BytesMut};
use memchr::memmem;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

const MAX_HEAD: usize = 64 * 1024;
/// Header slots for httparse: Pingora forwards at most 256 upstream headers
/// and adds a few of its own.
const MAX_HEADERS: usize = 512;
const MAX_ERROR_BODY: usize = 64 * 1024;

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

impl Chunked {
    /// Consumes what it can of `input`, appending body bytes to `out`.
    /// Returns true once the terminating chunk and trailer are read.
    pub fn decode(&mut self, input: &mut BytesMut, out: &mut Vec<u8>) -> Result<bool, String> {
        loop {
            match self.state {
                ChunkState::Done => return Ok(true),
                ChunkState::Size => {
                    let Some(end) = memmem::find(input, b"\r\n") else {
                        return if input.len() > 4096 {
                            Err("chunk size line too long".into())
                        } else {
                            Ok(false)
                        };
                    };
                    // Not httparse::parse_chunk_size: it reads an empty size
                    // line as the last chunk.
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
                        return Ok(false);
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
                        return Ok(false);
                    }
                    if &input[..2] != b"\r\n" {
                        return Err("chunk data longer than its size".into());
                    }
                    input.advance(2);
                    self.state = ChunkState::Size;
                }
                ChunkState::Trailer => {
                    let Some(end) = memmem::find(input, b"\r\n") else {
                        return Ok(false);
                    };
                    input.advance(end + 2);
                    if end == 0 {
                        self.state = ChunkState::Done;
                    }
                }
            }
        }
    }
}

/// Token counts from a stream's usage frame.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub cached_tokens: u64,
}

/// Splits an SSE body into events and times the content frames. Times are
/// offsets from the request start, stamped when the bytes were read.
#[derive(Debug, Default)]
pub struct StreamTimer {
    pending: Vec<u8>,
    pub first_content: Option<Duration>,
    pub last_content: Option<Duration>,
    pub content_frames: u64,
    /// The streamed text, which the session appends to its history.
    pub content: String,
    pub usage: Option<Usage>,
    pub done: bool,
    /// An `error` object in the stream, or a frame that is not JSON.
    pub error: Option<String>,
}

impl StreamTimer {
    pub fn feed(&mut self, data: &[u8], at: Duration) {
        self.pending.extend_from_slice(data);
        loop {
            // Events end at a blank line; accept \n\n and \r\n\r\n.
            let lf = memmem::find(&self.pending, b"\n\n").map(|i| (i, 2));
            let crlf = memmem::find(&self.pending, b"\r\n\r\n").map(|i| (i, 4));
            let Some((end, sep)) = [lf, crlf].into_iter().flatten().min_by_key(|(i, _)| *i) else {
                return;
            };
            let event: Vec<u8> = self.pending.drain(..end + sep).collect();
            self.event(&event[..end], at);
        }
    }

    fn event(&mut self, event: &[u8], at: Duration) {
        let text = String::from_utf8_lossy(event);
        let mut data = String::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("data:") {
                if !data.is_empty() {
                    data.push('\n');
                }
                data.push_str(rest.strip_prefix(' ').unwrap_or(rest));
            }
        }
        if data.is_empty() {
            return;
        }
        if data.trim() == "[DONE]" {
            self.done = true;
            return;
        }
        let v: Value = match serde_json::from_str(&data) {
            Ok(v) => v,
            Err(e) => {
                self.error
                    .get_or_insert_with(|| format!("SSE frame is not JSON: {e}"));
                return;
            }
        };
        if let Some(err) = v.get("error").filter(|e| !e.is_null()) {
            self.error
                .get_or_insert_with(|| format!("error in stream: {err}"));
            return;
        }
        let content = v
            .pointer("/choices/0/delta/content")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty());
        if let Some(content) = content {
            self.content.push_str(content);
            self.content_frames += 1;
            self.first_content.get_or_insert(at);
            self.last_content = Some(at);
        }
        if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
            let n = |p: &str| u.pointer(p).and_then(Value::as_u64).unwrap_or(0);
            self.usage = Some(Usage {
                prompt_tokens: n("/prompt_tokens"),
                completion_tokens: n("/completion_tokens"),
                cached_tokens: n("/prompt_tokens_details/cached_tokens"),
            });
        }
    }

    /// Decode speed: tokens after the first over the time from first to last
    /// content frame. None with fewer than two frames or no time between them.
    pub fn decode_tok_per_s(&self) -> Option<f64> {
        let tokens = self
            .usage
            .map_or(self.content_frames, |u| u.completion_tokens);
        let span = self.last_content?.checked_sub(self.first_content?)?;
        if tokens < 2 || span.is_zero() {
            return None;
        }
        Some((tokens - 1) as f64 / span.as_secs_f64())
    }
}

/// A response head: status, lower-cased header names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    pub status: u16,
    pub headers: Vec<(String, String)>,
}

impl Head {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    fn chunked(&self) -> bool {
        self.header("transfer-encoding")
            .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"))
    }

    fn close(&self) -> bool {
        self.header("connection")
            .is_some_and(|v| v.eq_ignore_ascii_case("close"))
    }

    fn content_length(&self) -> Option<usize> {
        self.header("content-length").and_then(|v| v.parse().ok())
    }
}

/// Parses a head from the start of `buf`; `Ok(None)` if it is incomplete.
/// On success the head's bytes are removed from `buf`.
pub fn parse_head(buf: &mut BytesMut) -> Result<Option<Head>, String> {
    let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut parsed = httparse::Response::new(&mut slots);
    // Header lines the bench cannot read are skipped, not fatal: it only
    // needs the framing headers and the ones it reports.
    let end = match httparse::ParserConfig::default()
        .ignore_invalid_headers_in_responses(true)
        .allow_spaces_after_header_name_in_responses(true)
        .parse_response(&mut parsed, buf)
    {
        Ok(httparse::Status::Complete(end)) => end,
        Ok(httparse::Status::Partial) if buf.len() > MAX_HEAD => {
            return Err("response head too large".into())
        }
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(format!("bad response head: {e}")),
    };
    let status = parsed.code.ok_or("response head without a status")?;
    let headers = parsed
        .headers
        .iter()
        .map(|h| {
            let value = std::str::from_utf8(h.value).map_err(|_| "response head is not UTF-8")?;
            Ok((h.name.to_ascii_lowercase(), value.to_string()))
        })
        .collect::<Result<_, String>>()?;
    buf.advance(end);
    Ok(Some(Head { status, headers }))
}

/// One keep-alive connection.
pub struct Conn {
    stream: TcpStream,
    buf: BytesMut,
}

/// How one streaming request went.
#[derive(Debug)]
pub struct Exchange {
    pub status: u16,
    pub head: Option<Head>,
    pub timer: StreamTimer,
    /// Set for a non-200 answer, a broken stream or a transport failure.
    pub error: Option<String>,
    /// Time from request start to the end of the response.
    pub elapsed: Duration,
}

impl Conn {
    pub async fn connect(addr: SocketAddr) -> std::io::Result<Conn> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(Conn {
            stream,
            buf: BytesMut::with_capacity(16 * 1024),
        })
    }

    /// Whether the peer has closed this idle connection (or sent bytes
    /// nobody asked for): a keep-alive pool checks before reusing one, so a
    /// connection an engine dropped while the session was thinking costs a
    /// reconnect, not a failed request.
    pub fn is_closed(&self) -> bool {
        let mut probe = [0u8; 1];
        match self.stream.try_read(&mut probe) {
            Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
            Ok(_) => true,
        }
    }

    async fn fill(&mut self) -> Result<usize, String> {
        self.buf.reserve(16 * 1024);
        self.stream
            .read_buf(&mut self.buf)
            .await
            .map_err(|e| format!("read: {e}"))
    }

    async fn read_head(&mut self) -> Result<Head, String> {
        loop {
            if let Some(head) = parse_head(&mut self.buf)? {
                // Interim 1xx responses carry no body; the real one follows.
                if (100..200).contains(&head.status) {
                    continue;
                }
                return Ok(head);
            }
            if self.fill().await? == 0 {
                return Err("connection closed before the response head".into());
            }
        }
    }

    /// Sends a POST and reads the response, timing SSE frames from `start`.
    /// Returns whether the connection can carry another request.
    pub async fn post_stream(
        &mut self,
        host: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        start: Instant,
    ) -> (Exchange, bool) {
        let mut ex = Exchange {
            status: 0,
            head: None,
            timer: StreamTimer::default(),
            error: None,
            elapsed: Duration::ZERO,
        };
        let reusable = match self
            .exchange(host, path, headers, body, start, &mut ex)
            .await
        {
            Ok(reusable) => reusable,
            Err(e) => {
                ex.error.get_or_insert(e);
                false
            }
        };
        ex.elapsed = start.elapsed();
        (ex, reusable)
    }

    async fn exchange(
        &mut self,
        host: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        start: Instant,
        ex: &mut Exchange,
    ) -> Result<bool, String> {
        let mut req = format!(
            "POST {path} HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n\
             accept: text/event-stream\r\ncontent-length: {}\r\n",
            body.len()
        );
        for (n, v) in headers {
            req.push_str(n);
            req.push_str(": ");
            req.push_str(v);
            req.push_str("\r\n");
        }
        req.push_str("\r\n");
        let mut out = Vec::with_capacity(req.len() + body.len());
        out.extend_from_slice(req.as_bytes());
        out.extend_from_slice(body);
        self.stream
            .write_all(&out)
            .await
            .map_err(|e| format!("write: {e}"))?;

        let head = self.read_head().await?;
        ex.status = head.status;
        let chunked = head.chunked();
        let length = head.content_length();
        let close = head.close();
        ex.head = Some(head);
        if ex.status != 200 {
            let body = self.read_plain_body(chunked, length).await?;
            let snippet = String::from_utf8_lossy(&body[..body.len().min(300)]).into_owned();
            ex.error = Some(format!("status {}: {snippet}", ex.status));
            return Ok(!close && (chunked || length.is_some()));
        }
        if !chunked {
            // Pingora re-frames streams as chunked; anything else is read
            // whole, timed as it comes.
            let body = self.read_plain_body(false, length).await?;
            ex.timer.feed(&body, start.elapsed());
        } else {
            let mut decoder = Chunked::default();
            let mut data = Vec::with_capacity(4096);
            loop {
                data.clear();
                let finished = decoder.decode(&mut self.buf, &mut data)?;
                if !data.is_empty() {
                    ex.timer.feed(&data, start.elapsed());
                }
                if finished {
                    break;
                }
                if self.fill().await? == 0 {
                    return Err("stream cut: connection closed mid-body".into());
                }
            }
        }
        if let Some(e) = ex.timer.error.clone() {
            ex.error = Some(e);
        } else if !ex.timer.done {
            ex.error = Some("stream ended without [DONE]".into());
        } else if ex.timer.usage.is_none() {
            ex.error = Some("stream had no usage frame".into());
        } else if ex.timer.first_content.is_none() {
            ex.error = Some("stream had no content".into());
        }
        Ok(!close && (chunked || length.is_some()))
    }

    async fn read_plain_body(
        &mut self,
        chunked: bool,
        length: Option<usize>,
    ) -> Result<Vec<u8>, String> {
        let mut body = Vec::new();
        if chunked {
            let mut decoder = Chunked::default();
            while !decoder.decode(&mut self.buf, &mut body)? {
                if body.len() > MAX_ERROR_BODY * 16 || self.fill().await? == 0 {
                    return Err("body cut or too large".into());
                }
            }
            return Ok(body);
        }
        match length {
            Some(n) => {
                while self.buf.len() < n {
                    if self.fill().await? == 0 {
                        return Err("connection closed mid-body".into());
                    }
                }
                body.extend_from_slice(&self.buf[..n]);
                self.buf.advance(n);
            }
            None => loop {
                body.extend_from_slice(&self.buf);
                self.buf.clear();
                if body.len() > MAX_ERROR_BODY * 16 || self.fill().await? == 0 {
                    break;
                }
            },
        }
        Ok(body)
    }
}

/// `GET path` on a fresh connection, bounded by `timeout`; the status and body.
pub async fn get(
    addr: SocketAddr,
    path: &str,
    timeout: Duration,
) -> Result<(u16, Vec<u8>), String> {
    let run = async {
        let mut conn = Conn::connect(addr)
            .await
            .map_err(|e| format!("connect {addr}: {e}"))?;
        let req = format!("GET {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n");
        conn.stream
            .write_all(req.as_bytes())
            .await
            .map_err(|e| format!("write: {e}"))?;
        let head = conn.read_head().await?;
        let body = conn
            .read_plain_body(head.chunked(), head.content_length())
            .await?;
        Ok((head.status, body))
    };
    tokio::time::timeout(timeout, run)
        .await
        .map_err(|_| format!("GET {addr}{path} timed out"))?
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn content(text: &str) -> String {
        format!(
            "data: {{\"id\":\"x\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{text}\"}},\"finish_reason\":null}}]}}\n\n"
        )
    }

    const USAGE: &str = "data: {\"id\":\"x\",\"choices\":[],\"usage\":{\"prompt_tokens\":100,\"completion_tokens\":3,\"total_tokens\":103,\"prompt_tokens_details\":{\"cached_tokens\":64}}}\n\n";

    #[test]
    fn timer_stamps_first_and_last_content_frames() {
        let mut t = StreamTimer::default();
        // A role-only frame is not content.
        t.feed(
            b"data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"}}]}\n\n",
            ms(5),
        );
        assert_eq!(t.first_content, None);
        t.feed(content("tok ").as_bytes(), ms(100));
        t.feed(content("tok ").as_bytes(), ms(150));
        t.feed(content("tok ").as_bytes(), ms(300));
        t.feed(USAGE.as_bytes(), ms(301));
        t.feed(b"data: [DONE]\n\n", ms(302));
        assert_eq!(t.first_content, Some(ms(100)));
        assert_eq!(t.last_content, Some(ms(300)));
        assert_eq!(t.content, "tok tok tok ");
        assert_eq!(
            t.usage,
            Some(Usage {
                prompt_tokens: 100,
                completion_tokens: 3,
                cached_tokens: 64
            })
        );
        assert!(t.done && t.error.is_none());
        // Two tokens after the first, over 200 ms.
        assert!((t.decode_tok_per_s().unwrap() - 10.0).abs() < 1e-9);
    }

    #[test]
    fn timer_reassembles_events_split_anywhere_and_crlf() {
        let whole = format!(
            "{}{}{}data: [DONE]\r\n\r\n",
            content("a"),
            content("b"),
            USAGE.replace("\n\n", "\r\n\r\n")
        );
        for cut in 0..whole.len() {
            let mut t = StreamTimer::default();
            t.feed(&whole.as_bytes()[..cut], ms(1));
            t.feed(&whole.as_bytes()[cut..], ms(2));
            assert_eq!(t.content, "ab", "cut at {cut}");
            assert_eq!(t.content_frames, 2);
            assert!(t.done, "cut at {cut}");
            assert_eq!(t.usage.map(|u| u.cached_tokens), Some(64));
            // The first frame is stamped when its last byte arrived.
            let first_end = content("a").len();
            let expect = if cut >= first_end { ms(1) } else { ms(2) };
            assert_eq!(t.first_content, Some(expect), "cut at {cut}");
        }
    }

    #[test]
    fn timer_reports_errors_and_garbage() {
        let mut t = StreamTimer::default();
        t.feed(b"data: {\"error\":{\"message\":\"boom\"}}\n\n", ms(1));
        assert!(t.error.as_deref().unwrap().contains("boom"));
        let mut t = StreamTimer::default();
        t.feed(b": comment\n\ndata: not json\n\n", ms(1));
        assert!(t.error.as_deref().unwrap().contains("not JSON"));
        assert_eq!(t.decode_tok_per_s(), None);
    }

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

    #[tokio::test]
    async fn an_idle_connection_the_peer_closed_is_noticed() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let conn = Conn::connect(addr).await.unwrap();
        let (server_side, _) = listener.accept().await.unwrap();
        assert!(!conn.is_closed());
        drop(server_side);
        let deadline = Instant::now() + Duration::from_secs(5);
        while !conn.is_closed() {
            assert!(Instant::now() < deadline, "close not seen");
            tokio::time::sleep(ms(10)).await;
        }
    }

    #[test]
    fn head_parses_status_and_lowercases_names() {
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
