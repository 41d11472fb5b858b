//! The engine's connections: accepting them, reading each request and
//! answering it, and closing without losing a response the client has not
//! read yet.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::sleep;

use super::plan::error_body;
use super::{generate, stopped, Shared, JSON};
use crate::http::{self, ReadError};

/// After an accept error such as EMFILE, retrying at once would spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);
/// How long a closing connection waits for the client to close its side.
const LINGER: Duration = Duration::from_secs(2);

pub(crate) async fn accept_loop(shared: Arc<Shared>) {
    if shared.batch.is_some() {
        tokio::spawn(generate::drive(shared.clone()));
    }
    let mut stop = shared.stop.subscribe();
    loop {
        let accepted = tokio::select! {
            r = std::future::poll_fn(|cx| match shared.listener.lock().as_ref() {
                Some(l) => l.poll_accept(cx),
                None => std::task::Poll::Ready(Err(io::ErrorKind::NotConnected.into())),
            }) => r,
            () = stopped(&mut stop) => return,
        };
        match accepted {
            Ok((stream, _)) => {
                // SSE frames are small writes that must not wait for Nagle.
                let _ = stream.set_nodelay(true);
                tokio::spawn(serve_conn(shared.clone(), stream));
            }
            Err(_) if shared.listener.lock().is_none() => return,
            Err(e) => {
                log::warn!("sim engine {}: accept failed: {e}", shared.addr);
                sleep(ACCEPT_BACKOFF).await;
            }
        }
    }
}

async fn serve_conn(shared: Arc<Shared>, mut stream: TcpStream) {
    let mut stop = shared.stop.subscribe();
    tokio::select! {
        () = conn_loop(&shared, &mut stream) => {}
        // Dropping the stream here is what cuts off in-progress responses.
        () = stopped(&mut stop) => {}
    }
}

async fn conn_loop(shared: &Shared, stream: &mut TcpStream) {
    let (mut rd, mut wr) = stream.split();
    let mut buf = BytesMut::new();
    loop {
        let req = match http::read_request(&mut rd, &mut wr, &mut buf).await {
            Ok(req) => req,
            Err(ReadError::Bad(status, message)) => {
                let body = error_body("invalid_request", &message);
                if http::write_response(&mut wr, status, JSON, &body, false)
                    .await
                    .is_ok()
                {
                    lingering_close(&mut rd, &mut wr).await;
                }
                return;
            }
            Err(ReadError::Closed | ReadError::Io) => return,
        };
        // A client that goes away is noticed while its request is queued,
        // prefilling or stalled, not only on the next write; dropping the
        // response future then frees its running slot and KV, as vLLM
        // aborts a request whose client disconnected.
        let reusable = tokio::select! {
            r = shared.respond(&req, &mut wr) => r,
            () = until_client_gone(&mut rd, &mut buf) => return,
        };
        match reusable {
            Ok(true) if req.keep_alive => {}
            Ok(true) => {
                lingering_close(&mut rd, &mut wr).await;
                return;
            }
            // Failed, or cut off on purpose (die_after_frames): close at once.
            _ => return,
        }
    }
}

/// Closing a socket that still has unread input makes the kernel send a
/// reset, which can destroy a response the client has not read yet. So send
/// FIN first and discard input until the client closes too, for a bounded time.
async fn lingering_close<R, W>(rd: &mut R, wr: &mut W)
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let _ = wr.shutdown().await;
    let drain = async {
        let mut sink = [0u8; 4096];
        while let Ok(1..) = rd.read(&mut sink).await {}
    };
    let _ = tokio::time::timeout(LINGER, drain).await;
}

/// Reads until EOF or error. Bytes of a pipelined next request are kept in
/// `buf`; past a bound it stops reading and lets TCP push back.
async fn until_client_gone<R: AsyncRead + Unpin>(rd: &mut R, buf: &mut BytesMut) {
    loop {
        if buf.len() >= http::MAX_HEAD_BYTES + http::MAX_BODY_BYTES {
            std::future::pending::<()>().await;
        }
        buf.reserve(8 * 1024);
        match rd.read_buf(buf).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}
