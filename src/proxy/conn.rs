//! The client connection under the hooks: a deadline for receiving each
//! request head (`client_header_timeout`).
//!
//! Pingora 0.9.1 times out each *read* of a request head (60 s on a fresh
//! connection, the keep-alive timeout after), not the head as a whole: a
//! client sending one byte a second keeps its connection forever
//! (slowloris). `HttpSession::set_read_timeout` is the same per-read
//! timeout, and no server option bounds the head, so the gateway wraps each
//! accepted stream ([`HeadDeadline`]) before Pingora sees it ([`Front`]).
//! The deadline starts at the first byte of a head, so a keep-alive
//! connection's idle wait stays `client_idle_timeout`'s; it ends when
//! Pingora has parsed the head (`early_request_filter` →
//! [`head_complete`]) and is re-armed for the next head when the request
//! is logged ([`await_next_head`]). A read past the deadline fails, Pingora
//! drops the connection, and its ERROR line for a head cut short is logged
//! at debug (`crate::logging`): a flood of them is not something to page on.

use crate::proxy::Gateway;
use async_trait::async_trait;
use pingora::apps::ServerApp;
use pingora::protocols::raw_connect::ProxyDigest;
use pingora::protocols::tls::{SslDigest, TlsRef};
use pingora::protocols::{
    GetProxyDigest, GetSocketDigest, GetTimingDigest, Peek, Shutdown, SocketDigest, Ssl, Stream,
    TimingDigest, UniqueID, UniqueIDType, ALPN,
};
use pingora::proxy::{HttpProxy, Session};
use pingora::server::ShutdownWatch;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// What the failed read says; Pingora wraps it as a ReadError "while
/// reading request headers".
pub const HEADER_TIMEOUT: &str = "client_header_timeout: request head incomplete";

/// The proxy service's application: every accepted connection is wrapped
/// in a [`HeadDeadline`] and handed to Pingora's own HTTP loop unchanged.
pub struct Front {
    proxy: Arc<HttpProxy<Gateway>>,
    header_timeout: Duration,
}

impl Front {
    pub fn new(proxy: HttpProxy<Gateway>, header_timeout: Duration) -> Self {
        Front {
            proxy: Arc::new(proxy),
            header_timeout,
        }
    }
}

#[async_trait]
impl ServerApp for Front {
    async fn process_new(
        self: &Arc<Self>,
        stream: Stream,
        shutdown: &ShutdownWatch,
    ) -> Option<Stream> {
        let guarded: Stream = Box::new(HeadDeadline::new(stream, self.header_timeout));
        self.proxy.process_new(guarded, shutdown).await
    }

    async fn cleanup(&self) {
        // Pingora's own shutdown: wakes keep-alive connections waiting for
        // a next request so they close.
        ServerApp::cleanup(&*self.proxy).await
    }
}

/// Phase of `early_request_filter`: the head is parsed, its deadline is off.
pub fn head_complete(session: &Session) {
    if let Some(d) = deadline_of(session) {
        d.waiting_head.store(false, Ordering::Release);
    }
}

/// Phase of `request_filter`: how long the connection may idle before its
/// next request. Pingora keeps an HTTP/1.1 client connection open between
/// requests forever by default: idle connections would pile up without a
/// key. Only a connection Pingora would keep is given the timeout: one it
/// closes after this request (`Connection: close`, HTTP/1.0 without
/// keep-alive, both Content-Length and Transfer-Encoding, which RFC 9112
/// §6.1 says to close so that a front end that framed by Content-Length
/// cannot have the rest taken as a next request) stays closing.
pub fn idle_timeout(session: &mut Session, idle: Duration) {
    if session.get_keepalive().is_some() {
        session.set_keepalive(Some(idle.as_secs()));
    }
}

/// Phase of `early_request_filter`: requests a client pipelines (sends
/// before the answer to the one before) are answered in order. Pingora's
/// default closes the connection once it reads past a request, silently
/// dropping what followed, and cuts a stream short when the next request
/// arrives while it runs ("Sent data after end of body"). With pipelining
/// on, those bytes are kept and parsed as the next request once this one
/// is done (RFC 9112 §9.3.2; one at a time, never in parallel). The
/// setting carries over to the connection's later requests.
pub fn serve_pipelined(session: &mut Session) {
    session.as_downstream_mut().set_pipelining_enabled(true);
}

/// Phase of `logging`: the request is done, the next bytes on this
/// connection start a new head (with a fresh deadline from its first byte).
pub fn await_next_head(session: &Session) {
    if let Some(d) = deadline_of(session) {
        d.epoch.fetch_add(1, Ordering::AcqRel);
        d.waiting_head.store(true, Ordering::Release);
    }
}

fn deadline_of(session: &Session) -> Option<&HeadDeadline> {
    let stream = session.as_downstream().stream()?;
    (**stream).as_any().downcast_ref::<HeadDeadline>()
}

/// A client stream whose reads fail once a request head has been arriving
/// for longer than the limit. Everything else is the inner stream's.
#[derive(Debug)]
pub struct HeadDeadline {
    inner: Stream,
    limit: Duration,
    /// Set from the hooks (through `&self`): a head is expected or arriving.
    waiting_head: AtomicBool,
    /// Bumped for every new head, so a deadline never carries over.
    epoch: AtomicU32,
    /// The epoch the running deadline belongs to.
    armed_epoch: u32,
    /// When the first byte of the current head came.
    head_since: Option<tokio::time::Instant>,
    /// The deadline's timer, built only once a head is left incomplete (a
    /// read returns pending mid-head): most heads arrive in one read and
    /// need none, which saves a timer and an allocation per request.
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl HeadDeadline {
    pub fn new(inner: Stream, limit: Duration) -> Self {
        HeadDeadline {
            inner,
            limit,
            waiting_head: AtomicBool::new(true),
            epoch: AtomicU32::new(0),
            armed_epoch: 0,
            head_since: None,
            deadline: None,
        }
    }

    fn peer(&self) -> String {
        self.inner
            .get_socket_digest()
            .and_then(|d| d.peer_addr().map(|a| a.to_string()))
            .unwrap_or_else(|| "-".into())
    }
}

impl AsyncRead for HeadDeadline {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if !this.waiting_head.load(Ordering::Acquire) {
            this.head_since = None;
            this.deadline = None;
            return Pin::new(&mut this.inner).poll_read(cx, buf);
        }
        let epoch = this.epoch.load(Ordering::Acquire);
        if epoch != this.armed_epoch {
            this.armed_epoch = epoch;
            this.head_since = None;
            this.deadline = None;
        }
        let before = buf.filled().len();
        let read = Pin::new(&mut this.inner).poll_read(cx, buf);
        match &read {
            Poll::Ready(Ok(())) if buf.filled().len() > before && this.head_since.is_none() => {
                this.head_since = Some(tokio::time::Instant::now());
            }
            Poll::Pending => {
                if let Some(since) = this.head_since {
                    let limit = this.limit;
                    let deadline = this
                        .deadline
                        .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(since + limit)));
                    if deadline.as_mut().poll(cx).is_ready() {
                        log::debug!(
                            "closing client {}: request head not complete within {:?} (client_header_timeout)",
                            this.peer(),
                            this.limit
                        );
                        return Poll::Ready(Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            HEADER_TIMEOUT,
                        )));
                    }
                }
            }
            _ => {}
        }
        read
    }
}

impl AsyncWrite for HeadDeadline {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[async_trait]
impl Shutdown for HeadDeadline {
    async fn shutdown(&mut self) {
        self.inner.shutdown().await
    }
}

impl UniqueID for HeadDeadline {
    fn id(&self) -> UniqueIDType {
        self.inner.id()
    }
}

impl Ssl for HeadDeadline {
    fn get_ssl(&self) -> Option<&TlsRef> {
        self.inner.get_ssl()
    }
    fn get_ssl_digest(&self) -> Option<Arc<SslDigest>> {
        self.inner.get_ssl_digest()
    }
    fn selected_alpn_proto(&self) -> Option<ALPN> {
        self.inner.selected_alpn_proto()
    }
}

impl GetTimingDigest for HeadDeadline {
    fn get_timing_digest(&self) -> Vec<Option<TimingDigest>> {
        self.inner.get_timing_digest()
    }
    fn get_read_pending_time(&self) -> Duration {
        self.inner.get_read_pending_time()
    }
    fn get_write_pending_time(&self) -> Duration {
        self.inner.get_write_pending_time()
    }
}

impl GetProxyDigest for HeadDeadline {
    fn get_proxy_digest(&self) -> Option<Arc<ProxyDigest>> {
        self.inner.get_proxy_digest()
    }
    fn set_proxy_digest(&mut self, digest: ProxyDigest) {
        self.inner.set_proxy_digest(digest)
    }
}

impl GetSocketDigest for HeadDeadline {
    fn get_socket_digest(&self) -> Option<Arc<SocketDigest>> {
        self.inner.get_socket_digest()
    }
    fn set_socket_digest(&mut self, digest: SocketDigest) {
        self.inner.set_socket_digest(digest)
    }
}

#[async_trait]
impl Peek for HeadDeadline {
    async fn try_peek(&mut self, buf: &mut [u8]) -> io::Result<bool> {
        self.inner.try_peek(buf).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn pair(limit: Duration) -> (HeadDeadline, tokio::io::DuplexStream) {
        let (a, b) = tokio::io::duplex(1024);
        (HeadDeadline::new(Box::new(a), limit), b)
    }

    #[tokio::test(start_paused = true)]
    async fn a_head_dribbled_past_the_limit_fails_the_read() {
        let (mut s, mut client) = pair(Duration::from_secs(2));
        client.write_all(b"G").await.unwrap();
        let mut buf = [0u8; 64];
        assert_eq!(s.read(&mut buf).await.unwrap(), 1);
        let e = s.read(&mut buf).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
    }

    #[tokio::test(start_paused = true)]
    async fn idle_time_before_the_first_byte_does_not_count() {
        let (mut s, mut client) = pair(Duration::from_secs(2));
        let mut buf = [0u8; 64];
        let read = s.read(&mut buf);
        tokio::pin!(read);
        // 10 s of silence: no deadline is running yet.
        assert!(tokio::time::timeout(Duration::from_secs(10), &mut read)
            .await
            .is_err());
        client.write_all(b"GET").await.unwrap();
        assert_eq!(read.await.unwrap(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_completed_head_turns_the_deadline_off_until_the_next_one() {
        let (mut s, mut client) = pair(Duration::from_secs(2));
        let mut buf = [0u8; 64];
        client.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        assert_eq!(s.read(&mut buf).await.unwrap(), 18);
        s.waiting_head.store(false, Ordering::Release);
        // A body may take its time.
        tokio::time::sleep(Duration::from_secs(5)).await;
        client.write_all(b"x").await.unwrap();
        assert_eq!(s.read(&mut buf).await.unwrap(), 1);
        // The next head gets a deadline of its own.
        s.epoch.fetch_add(1, Ordering::AcqRel);
        s.waiting_head.store(true, Ordering::Release);
        client.write_all(b"G").await.unwrap();
        assert_eq!(s.read(&mut buf).await.unwrap(), 1);
        let e = s.read(&mut buf).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
    }
}
