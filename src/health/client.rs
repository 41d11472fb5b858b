//! A minimal HTTP/1.1 GET for probes and metric scrapes: one request per
//! connection (`Connection: close`), the head parsed by httparse. Pingora's
//! connector would pool connections, which a probe must not do: a probe over
//! a kept-alive connection can pass while the engine refuses new ones.
//! A peer with `tls:` is reached over TLS with the settings its proxied
//! requests use (`engine_tls.rs`).

use crate::config::PeerConfig;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

#[derive(Debug)]
pub enum GetError {
    Timeout,
    Connect(std::io::Error),
    /// The TLS handshake failed, or TLS ended the exchange (an alert):
    /// rustls' reason, as `engine_tls::describe` words it.
    Tls(String),
    Io(std::io::Error),
    BadResponse,
}

impl GetError {
    /// What a failed probe's ban shows in `/_health_status`.
    pub fn reason(&self) -> String {
        match self {
            GetError::Timeout => "timeout".into(),
            GetError::Connect(e) => format!("connect failed: {e}"),
            GetError::Tls(why) => why.clone(),
            GetError::Io(e) => format!("exchange failed: {e}"),
            GetError::BadResponse => "not an HTTP response".into(),
        }
    }
}

/// GETs `path` from `peer` at `addr`, returning the status and up to
/// `max_body` bytes of body. `timeout` bounds the whole exchange, the TLS
/// handshake included.
pub async fn get(
    peer: &PeerConfig,
    addr: SocketAddr,
    path: &str,
    timeout: Duration,
    max_body: usize,
) -> Result<(u16, Vec<u8>), GetError> {
    match tokio::time::timeout(timeout, get_inner(peer, addr, path, max_body)).await {
        Ok(r) => r,
        Err(_) => Err(GetError::Timeout),
    }
}

async fn get_inner(
    peer: &PeerConfig,
    addr: SocketAddr,
    path: &str,
    max_body: usize,
) -> Result<(u16, Vec<u8>), GetError> {
    let tcp = TcpStream::connect(addr).await.map_err(GetError::Connect)?;
    let host = peer.address();
    let Some(tls) = &peer.tls else {
        return exchange(tcp, &host, path, max_body).await;
    };
    let stream = tls.connect(&peer.host, tcp).await.map_err(GetError::Tls)?;
    exchange(stream, &host, path, max_body)
        .await
        .map_err(|e| match e {
            GetError::Io(io) => {
                crate::engine_tls::tls_io_error(&io).map_or(GetError::Io(io), GetError::Tls)
            }
            other => other,
        })
}

async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    host: &str,
    path: &str,
    max_body: usize,
) -> Result<(u16, Vec<u8>), GetError> {
    let req = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: llm-gateway\r\nAccept: */*\r\nConnection: close\r\n\r\n");
    stream
        .write_all(req.as_bytes())
        .await
        .map_err(GetError::Io)?;
    let mut buf = Vec::with_capacity(8192);
    let mut chunk = [0u8; 8192];
    // Read to EOF (Connection: close) or until the cap.
    loop {
        let n = match stream.read(&mut chunk).await {
            Ok(n) => n,
            // A TLS engine that closes without its close_notify: what
            // came before the close is the answer (Connection: close).
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !buf.is_empty() => 0,
            Err(e) => return Err(GetError::Io(e)),
        };
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
        if buf.len() > max_body + 16 * 1024 {
            break;
        }
    }
    parse_response(&buf).ok_or(GetError::BadResponse)
}

/// Status and de-chunked body of a complete (or truncated) response.
fn parse_response(raw: &[u8]) -> Option<(u16, Vec<u8>)> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut resp = httparse::Response::new(&mut headers);
    let httparse::Status::Complete(head_len) = resp.parse(raw).ok()? else {
        return None;
    };
    let status = resp.code?;
    let chunked = resp.headers.iter().any(|h| {
        h.name.eq_ignore_ascii_case("transfer-encoding")
            && String::from_utf8_lossy(h.value)
                .to_ascii_lowercase()
                .contains("chunked")
    });
    let body = &raw[head_len..];
    let body = if chunked {
        dechunk(body)
    } else {
        body.to_vec()
    };
    Some((status, body))
}

/// httparse reads chunk-size lines but not the chunk framing around them;
/// a scrape body is small, so a plain loop over the buffer does.
fn dechunk(mut body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len());
    while let Ok(httparse::Status::Complete((line_len, size))) = httparse::parse_chunk_size(body) {
        let Ok(size) = usize::try_from(size) else {
            break;
        };
        body = &body[line_len..];
        if size == 0 || body.len() < size {
            out.extend_from_slice(&body[..size.min(body.len())]);
            break;
        }
        out.extend_from_slice(&body[..size]);
        body = body.get(size + 2..).unwrap_or(&[]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_plain_and_chunked() {
        let (s, b) = parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok").unwrap();
        assert_eq!((s, b.as_slice()), (200, &b"ok"[..]));
        let (s, b) = parse_response(
            b"HTTP/1.1 503 X\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
        )
        .unwrap();
        assert_eq!((s, b.as_slice()), (503, &b"abcde"[..]));
        assert!(parse_response(b"garbage").is_none());
    }
}
