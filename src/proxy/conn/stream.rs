//! The wrapped client stream: its reads carry the head deadline, the idle
//! wait and the engine's silence; everything else is the inner stream's.

use super::watch::{EngineWatch, IdleWatch};
use async_trait::async_trait;
use pingora::protocols::raw_connect::ProxyDigest;
use pingora::protocols::tls::{SslDigest, TlsRef};
use pingora::protocols::{
    GetProxyDigest, GetSocketDigest, GetTimingDigest, Peek, Shutdown, SocketDigest, Ssl, Stream,
    TimingDigest, UniqueID, UniqueIDType, ALPN,
};
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// What the failed read says; Pingora wraps it as a ReadError "while
/// reading request headers".
pub const HEADER_TIMEOUT: &str = "client_header_timeout: request head incomplete";

/// What the failed read says when the engine stayed silent; never seen by
/// a client (`conn::engine_silence` turns it into the engine's timeout).
pub const ENGINE_TIMEOUT: &str = "timeouts.read: the engine sent nothing";

/// A client stream whose reads fail once a request head has been arriving
/// for longer than the limit, or once the engine serving its request has
/// been silent for the route's read timeout. Everything else is the inner
/// stream's.
#[derive(Debug)]
pub struct ClientStream {
    inner: Stream,
    limit: Duration,
    /// Set from the hooks (through `&self`): a head is expected or arriving.
    pub(super) waiting_head: AtomicBool,
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
    /// Set from the hooks: the request's body is read, client bytes are
    /// held rather than handed to Pingora.
    holding: AtomicBool,
    /// What the client sent while held: the start of its next request.
    held: Vec<u8>,
    /// Set from the hooks: the engine's limit in milliseconds while a
    /// request is with it; 0 when none is.
    pub(super) engine_limit_ms: AtomicU64,
    /// Bumped from the hooks for every upstream attempt.
    engine_attempt: AtomicU32,
    /// The engine's limit passed: the read failed for that reason.
    pub(super) engine_timed_out: AtomicBool,
    /// Bytes written to the client so far, counted by write calls: the
    /// answer moving (a count, not a clock read per write).
    writes: u64,
    watch: EngineWatch,
    /// Set from the hooks: `client_idle_timeout` in milliseconds, 0 for
    /// none (nothing bounds the wait for a next request).
    pub(super) idle_limit_ms: AtomicU64,
    idle: IdleWatch,
}

impl ClientStream {
    pub fn new(inner: Stream, limit: Duration) -> Self {
        ClientStream {
            inner,
            limit,
            waiting_head: AtomicBool::new(true),
            epoch: AtomicU32::new(0),
            armed_epoch: 0,
            head_since: None,
            deadline: None,
            holding: AtomicBool::new(false),
            held: Vec::new(),
            engine_limit_ms: AtomicU64::new(0),
            engine_attempt: AtomicU32::new(0),
            engine_timed_out: AtomicBool::new(false),
            writes: 0,
            watch: EngineWatch::default(),
            idle_limit_ms: AtomicU64::new(0),
            idle: IdleWatch::default(),
        }
    }

    /// True once the connection has waited for its next request (no byte
    /// of it yet) for its idle limit: the caller ends the connection.
    /// Otherwise the timer is set to wake the task by the wait's deadline.
    fn idle_expired(&mut self, cx: &mut Context<'_>, epoch: u32) -> bool {
        let limit_ms = self.idle_limit_ms.load(Ordering::Relaxed);
        if limit_ms == 0 {
            return false;
        }
        let w = &mut self.idle;
        let since = match w.since {
            Some(since) if w.epoch == epoch => since,
            _ => {
                // A new wait: the one clock read it costs.
                let now = tokio::time::Instant::now();
                w.epoch = epoch;
                w.since = Some(now);
                now
            }
        };
        if w.alarm.pending_for(cx) {
            // Set for this wait's deadline or an earlier wait's (sooner):
            // either way the task is woken by the deadline.
            return false;
        }
        let due = since + Duration::from_millis(limit_ms);
        if w.alarm.fired() && tokio::time::Instant::now() >= due {
            return true;
        }
        w.alarm.wake_by(due, cx);
        false
    }

    pub(super) fn await_next_head(&self) {
        self.engine_limit_ms.store(0, Ordering::Release);
        self.engine_timed_out.store(false, Ordering::Release);
        self.holding.store(false, Ordering::Release);
        self.epoch.fetch_add(1, Ordering::AcqRel);
        self.waiting_head.store(true, Ordering::Release);
    }

    pub(super) fn hold_client_bytes(&self) {
        self.holding.store(true, Ordering::Release);
    }

    pub(super) fn watch_engine(&self, limit: Duration) {
        let ms = u64::try_from(limit.as_millis())
            .unwrap_or(u64::MAX / 4)
            .max(1);
        self.engine_timed_out.store(false, Ordering::Relaxed);
        self.engine_limit_ms.store(ms, Ordering::Relaxed);
        self.engine_attempt.fetch_add(1, Ordering::Release);
    }

    fn peer(&self) -> String {
        self.inner
            .get_socket_digest()
            .and_then(|d| d.peer_addr().map(|a| a.to_string()))
            .unwrap_or_else(|| "-".into())
    }

    /// Ready with the error once the engine has been silent for its limit;
    /// pending otherwise, or when no request is with an engine (the timer
    /// then wakes the task by the next check).
    fn poll_engine_deadline(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        let limit_ms = self.engine_limit_ms.load(Ordering::Relaxed);
        if limit_ms == 0 {
            return Poll::Pending;
        }
        let attempt = self.engine_attempt.load(Ordering::Acquire);
        let w = &mut self.watch;
        let now = if w.attempt != attempt || w.moved_at.is_none() {
            // A new attempt: its request just went out.
            let now = tokio::time::Instant::now();
            w.attempt = attempt;
            w.limit = Duration::from_millis(limit_ms);
            w.moved_at = Some(now);
            w.writes_seen = self.writes;
            now
        } else {
            if w.alarm.pending_for(cx) {
                return Poll::Pending;
            }
            tokio::time::Instant::now()
        };
        if self.writes != w.writes_seen {
            w.writes_seen = self.writes;
            w.moved_at = Some(now);
        }
        let due = w.moved_at.unwrap_or(now) + w.limit;
        if now >= due {
            self.engine_timed_out.store(true, Ordering::Release);
            return Poll::Ready(io::Error::new(io::ErrorKind::TimedOut, ENGINE_TIMEOUT));
        }
        w.alarm.wake_by(due.min(now + w.limit / 4), cx);
        Poll::Pending
    }

    /// A read while the request is with the engine: fails when the engine's
    /// deadline passes; an end of stream or an error passes through (the
    /// client hung up); bytes are kept for the next request.
    fn poll_read_held(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if let Poll::Ready(e) = self.poll_engine_deadline(cx) {
            return Poll::Ready(Err(e));
        }
        if !self.held.is_empty() {
            // Like Pingora with a pipelined request stashed, stop reading:
            // the next request waits for this one. The task is woken by
            // the exchange itself or by the engine's timer.
            return Poll::Pending;
        }
        let before = buf.filled().len();
        match Pin::new(&mut self.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) if buf.filled().len() > before => {
                self.held.extend_from_slice(&buf.filled()[before..]);
                buf.set_filled(before);
                Poll::Pending
            }
            other => other,
        }
    }
}

impl AsyncRead for ClientStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.holding.load(Ordering::Acquire) {
            return this.poll_read_held(cx, buf);
        }
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
        let read = if this.held.is_empty() {
            Pin::new(&mut this.inner).poll_read(cx, buf)
        } else {
            // The next request's first bytes, held while the last one ran.
            let n = this.held.len().min(buf.remaining());
            buf.put_slice(&this.held[..n]);
            this.held.drain(..n);
            Poll::Ready(Ok(()))
        };
        match &read {
            Poll::Ready(Ok(())) if buf.filled().len() > before && this.head_since.is_none() => {
                this.head_since = Some(tokio::time::Instant::now());
            }
            // Waiting for a next request, no byte of it yet.
            Poll::Pending if this.head_since.is_none() && this.idle_expired(cx, epoch) => {
                log::debug!(
                    "closing client {}: idle past client_idle_timeout",
                    this.peer()
                );
                // An end of stream before a head: Pingora closes the
                // connection quietly, as at its own keep-alive timeout.
                return Poll::Ready(Ok(()));
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

impl AsyncWrite for ClientStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let written = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(written, Poll::Ready(Ok(n)) if n > 0) {
            self.writes += 1;
        }
        written
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
        let written = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(written, Poll::Ready(Ok(n)) if n > 0) {
            self.writes += 1;
        }
        written
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[async_trait]
impl Shutdown for ClientStream {
    async fn shutdown(&mut self) {
        self.inner.shutdown().await
    }
}

impl UniqueID for ClientStream {
    fn id(&self) -> UniqueIDType {
        self.inner.id()
    }
}

impl Ssl for ClientStream {
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

impl GetTimingDigest for ClientStream {
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

impl GetProxyDigest for ClientStream {
    fn get_proxy_digest(&self) -> Option<Arc<ProxyDigest>> {
        self.inner.get_proxy_digest()
    }
    fn set_proxy_digest(&mut self, digest: ProxyDigest) {
        self.inner.set_proxy_digest(digest)
    }
}

impl GetSocketDigest for ClientStream {
    fn get_socket_digest(&self) -> Option<Arc<SocketDigest>> {
        self.inner.get_socket_digest()
    }
    fn set_socket_digest(&mut self, digest: SocketDigest) {
        self.inner.set_socket_digest(digest)
    }
}

#[async_trait]
impl Peek for ClientStream {
    async fn try_peek(&mut self, buf: &mut [u8]) -> io::Result<bool> {
        self.inner.try_peek(buf).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn pair(limit: Duration) -> (ClientStream, tokio::io::DuplexStream) {
        let (a, b) = tokio::io::duplex(1024);
        (ClientStream::new(Box::new(a), limit), b)
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

    /// `s` after a head and body were read, with the engine given `limit`.
    fn with_engine(s: &ClientStream, limit: Duration) {
        s.waiting_head.store(false, Ordering::Release);
        s.hold_client_bytes();
        s.watch_engine(limit);
    }

    #[tokio::test(start_paused = true)]
    async fn an_engine_silent_for_its_limit_fails_the_client_read() {
        let (mut s, _client) = pair(Duration::from_secs(2));
        with_engine(&s, Duration::from_secs(8));
        let mut buf = [0u8; 1];
        let t = tokio::time::Instant::now();
        let e = s.read(&mut buf).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert!(s.engine_timed_out.load(Ordering::Acquire));
        let took = t.elapsed();
        assert!(
            took >= Duration::from_secs(8) && took <= Duration::from_secs(10),
            "within a quarter of the limit after it, never before: {took:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_reaching_the_client_keeps_the_engine_alive() {
        let (mut s, mut client) = pair(Duration::from_secs(2));
        with_engine(&s, Duration::from_secs(8));
        let mut buf = [0u8; 1];
        // 40 s, twice the limit, with a byte written every 3 s: the read
        // Pingora keeps pending (made anew for each of its loop's turns)
        // never fails.
        for _ in 0..13 {
            let idle = tokio::time::timeout(Duration::from_secs(3), s.read(&mut buf)).await;
            assert!(idle.is_err(), "the read stays pending: {idle:?}");
            s.write_all(b"x").await.unwrap();
        }
        assert!(!s.engine_timed_out.load(Ordering::Acquire));
        let mut got = vec![0u8; 13];
        client.read_exact(&mut got).await.unwrap();
        // Control: the same stream, once the writes stop, fails the read.
        let e = s.read(&mut buf).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
    }

    #[tokio::test(start_paused = true)]
    async fn a_finished_request_frees_the_read_and_the_next_one_gets_its_own_limit() {
        let (mut s, mut client) = pair(Duration::from_secs(2));
        with_engine(&s, Duration::from_secs(8));
        let mut buf = [0u8; 64];
        tokio::time::sleep(Duration::from_secs(6)).await;
        s.await_next_head();
        // Idle between requests: no engine deadline runs.
        tokio::time::sleep(Duration::from_secs(30)).await;
        client.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        assert_eq!(s.read(&mut buf).await.unwrap(), 18);
        // A second request with a shorter limit is held to it.
        with_engine(&s, Duration::from_secs(4));
        let t = tokio::time::Instant::now();
        let e = s.read(&mut buf).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert!(t.elapsed() >= Duration::from_secs(4) && t.elapsed() <= Duration::from_secs(5));
    }

    /// `s` after a request, waiting for the next with `idle` allowed.
    fn between_requests(s: &ClientStream, idle: Duration) {
        s.idle_limit_ms
            .store(idle.as_millis() as u64, Ordering::Relaxed);
        s.await_next_head();
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_idle_for_its_limit_ends() {
        let (mut s, _client) = pair(Duration::from_secs(2));
        between_requests(&s, Duration::from_secs(8));
        let mut buf = [0u8; 64];
        let t = tokio::time::Instant::now();
        // An end of stream, which Pingora takes as the client leaving.
        assert_eq!(s.read(&mut buf).await.unwrap(), 0);
        let waited = t.elapsed();
        assert!(
            waited >= Duration::from_secs(8) && waited <= Duration::from_secs(9),
            "{waited:?}"
        );
        // Control: with no idle limit the same wait never ends by itself.
        let (mut open, _client) = pair(Duration::from_secs(2));
        between_requests(&open, Duration::ZERO);
        let idle = tokio::time::timeout(Duration::from_secs(100), open.read(&mut buf)).await;
        assert!(idle.is_err(), "no limit, no end: {idle:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_in_between_starts_the_idle_count_again() {
        let (mut s, mut client) = pair(Duration::from_secs(2));
        between_requests(&s, Duration::from_secs(8));
        let mut buf = [0u8; 64];
        // 7 s idle, then a request, then 7 s idle again: 14 s in all, but
        // never 8 s in one wait.
        let idle = tokio::time::timeout(Duration::from_secs(7), s.read(&mut buf)).await;
        assert!(idle.is_err(), "{idle:?}");
        client.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        assert_eq!(s.read(&mut buf).await.unwrap(), 18);
        s.waiting_head.store(false, Ordering::Release);
        between_requests(&s, Duration::from_secs(8));
        let t = tokio::time::Instant::now();
        let idle = tokio::time::timeout(Duration::from_secs(7), s.read(&mut buf)).await;
        assert!(idle.is_err(), "the second wait is its own: {idle:?}");
        // Control: the second wait, left to run, ends within its own limit.
        assert_eq!(s.read(&mut buf).await.unwrap(), 0);
        assert!(t.elapsed() >= Duration::from_secs(8) && t.elapsed() <= Duration::from_secs(9));
    }

    #[tokio::test(start_paused = true)]
    async fn bytes_sent_while_a_request_runs_wait_for_the_next_head() {
        let (mut s, mut client) = pair(Duration::from_secs(2));
        s.waiting_head.store(false, Ordering::Release);
        s.hold_client_bytes();
        client.write_all(b"GET /next HTTP/1.1\r\n").await.unwrap();
        let mut buf = [0u8; 64];
        let early = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await;
        assert!(early.is_err(), "held, not handed on: {early:?}");
        s.await_next_head();
        let mut got = Vec::new();
        while got.len() < 20 {
            let n = s.read(&mut buf).await.unwrap();
            got.extend_from_slice(&buf[..n]);
        }
        assert_eq!(&got, b"GET /next HTTP/1.1\r\n");
        // Control: without the hold the same bytes are read at once.
        let (mut open, mut client) = pair(Duration::from_secs(2));
        open.waiting_head.store(false, Ordering::Release);
        client.write_all(b"GET").await.unwrap();
        assert_eq!(open.read(&mut buf).await.unwrap(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_hanging_up_while_held_is_seen_at_once() {
        let (mut s, client) = pair(Duration::from_secs(2));
        with_engine(&s, Duration::from_secs(600));
        drop(client);
        let mut buf = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_secs(1), s.read(&mut buf)).await;
        assert_eq!(read.expect("not held").unwrap(), 0);
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
