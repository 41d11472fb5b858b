//! The bench's side: one keep-alive connection per session on tokio, whose
//! response body can be handed over as it arrives, and a one-shot GET for
//! metrics.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::{encode_request, parse_head, Chunked, Head, Upload};

const MAX_HEAD: usize = 64 * 1024;
/// A body read whole (an error's, an unframed one) stops past this.
const MAX_PLAIN_BODY: usize = 1024 * 1024;

/// One keep-alive connection.
pub struct Conn {
    stream: TcpStream,
    buf: BytesMut,
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

    /// Writes a request: `headers` as given, the body framed by its length.
    pub async fn send(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<(), String> {
        let out = encode_request(method, path, headers, body, Upload::Length);
        self.stream
            .write_all(&out)
            .await
            .map_err(|e| format!("write: {e}"))
    }

    /// The next final response head (interim 1xx heads are skipped).
    pub async fn read_head(&mut self) -> Result<Head, String> {
        loop {
            if let Some(head) = parse_head(&mut self.buf)? {
                // Interim 1xx responses carry no body; the real one follows.
                if (100..200).contains(&head.status) {
                    continue;
                }
                return Ok(head);
            }
            if self.buf.len() > MAX_HEAD {
                return Err("response head too large".into());
            }
            if self.fill().await? == 0 {
                return Err("connection closed before the response head".into());
            }
        }
    }

    /// A chunked body, each piece handed to `each` as soon as it is read.
    pub async fn read_chunked(&mut self, mut each: impl FnMut(&[u8])) -> Result<(), String> {
        let mut decoder = Chunked::default();
        let mut data = Vec::with_capacity(4096);
        loop {
            data.clear();
            let finished = decoder.decode(&mut self.buf, &mut data)?;
            if !data.is_empty() {
                each(&data);
            }
            if finished {
                return Ok(());
            }
            if self.fill().await? == 0 {
                return Err("stream cut: connection closed mid-body".into());
            }
        }
    }

    /// The body of `head` read whole; one that is not framed ends with the
    /// connection or past `MAX_PLAIN_BODY`.
    pub async fn read_body(&mut self, head: &Head) -> Result<Vec<u8>, String> {
        let mut body = Vec::new();
        if head.chunked() {
            let mut decoder = Chunked::default();
            while !decoder.decode(&mut self.buf, &mut body)? {
                if body.len() > MAX_PLAIN_BODY || self.fill().await? == 0 {
                    return Err("body cut or too large".into());
                }
            }
            return Ok(body);
        }
        match head.content_length() {
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
                if body.len() > MAX_PLAIN_BODY || self.fill().await? == 0 {
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
        let host = addr.to_string();
        conn.send(
            "GET",
            path,
            &[("host", &host), ("connection", "close")],
            b"",
        )
        .await?;
        let head = conn.read_head().await?;
        let body = conn.read_body(&head).await?;
        Ok((head.status, body))
    };
    tokio::time::timeout(timeout, run)
        .await
        .map_err(|_| format!("GET {addr}{path} timed out"))?
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::time::Instant;

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
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}
