//! A minimal HTTP/1.1 GET for probes and metric scrapes. Engines answer these
//! on loopback or a LAN; a few lines over a TcpStream avoid pulling an HTTP
//! client crate into the gateway.

use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[derive(Debug)]
pub enum GetError {
    Timeout,
    Connect(std::io::Error),
    Io(std::io::Error),
    BadResponse,
}

/// GETs `path`, returning the status and up to `max_body` bytes of body.
/// `timeout` bounds the whole exchange.
pub async fn get(
    addr: SocketAddr,
    host: &str,
    path: &str,
    timeout: Duration,
    max_body: usize,
) -> Result<(u16, Vec<u8>), GetError> {
    match tokio::time::timeout(timeout, get_inner(addr, host, path, max_body)).await {
        Ok(r) => r,
        Err(_) => Err(GetError::Timeout),
    }
}

async fn get_inner(
    addr: SocketAddr,
    host: &str,
    path: &str,
    max_body: usize,
) -> Result<(u16, Vec<u8>), GetError> {
    let mut stream = TcpStream::connect(addr).await.map_err(GetError::Connect)?;
    let req = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: llm-gateway\r\nAccept: */*\r\nConnection: close\r\n\r\n");
    stream
        .write_all(req.as_bytes())
        .await
        .map_err(GetError::Io)?;
    let mut buf = Vec::with_capacity(8192);
    let mut chunk = [0u8; 8192];
    // Read to EOF (Connection: close) or until the cap.
    loop {
        let n = stream.read(&mut chunk).await.map_err(GetError::Io)?;
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
    let head_end = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&raw[..head_end]).ok()?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next()?;
    let status: u16 = status_line.split_whitespace().nth(1)?.parse().ok()?;
    let chunked = lines.any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:") && l.contains("chunked")
    });
    let body = &raw[head_end + 4..];
    let body = if chunked {
        dechunk(body)
    } else {
        body.to_vec()
    };
    Some((status, body))
}

fn dechunk(mut body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len());
    while let Some(line_end) = body.windows(2).position(|w| w == b"\r\n") {
        let size_text = std::str::from_utf8(&body[..line_end]).unwrap_or("");
        let size_text = size_text.split(';').next().unwrap_or("").trim();
        let Ok(size) = usize::from_str_radix(size_text, 16) else {
            break;
        };
        body = &body[line_end + 2..];
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
