//! The background service that drains the body-log queue into one TCP
//! connection to the listener, reconnecting with backoff.
//!
//! Frames are taken off the queue only while connected: while the listener
//! is away the queue fills and the request path drops what does not fit.
//! So a listener restart shorter than the queue loses nothing, and a dead
//! one costs the request path nothing but a counter. The connection is
//! made at start and watched while idle, so `/_bodylog_status` tells
//! whether the listener is there before any frame is lost. The service
//! keeps running through SIGTERM: frames of requests that finish during the
//! drain still go out, and the drain watcher waits for them (bounded)
//! before the process exits.

use super::{Bodylog, LinkState, Queued};
use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::mpsc;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// A listener that stops reading holds a write this long at most; the
/// connection is then dropped and the frame counted as an error.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
pub const BACKOFF_MIN: Duration = Duration::from_millis(100);
pub const BACKOFF_MAX: Duration = Duration::from_secs(5);

pub struct SenderService {
    bodylog: Arc<Bodylog>,
}

impl SenderService {
    pub fn new(bodylog: Arc<Bodylog>) -> Self {
        SenderService { bodylog }
    }
}

#[async_trait]
impl BackgroundService for SenderService {
    async fn start(&self, _shutdown: ShutdownWatch) {
        let Some(rx) = self.bodylog.take_receiver() else {
            return;
        };
        log::info!("body logging to {}", self.bodylog.config.target);
        run(&self.bodylog, rx).await;
    }
}

/// Delay between connection attempts: doubling from `BACKOFF_MIN` to
/// `BACKOFF_MAX`, back to the minimum once a frame got through (not on a
/// mere connect: a listener that accepts and closes must not be hammered).
#[derive(Debug)]
pub struct Backoff {
    next: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff { next: BACKOFF_MIN }
    }
}

impl Backoff {
    pub fn next_delay(&mut self) -> Duration {
        let now = self.next;
        self.next = (self.next * 2).min(BACKOFF_MAX);
        now
    }

    pub fn reset(&mut self) {
        self.next = BACKOFF_MIN;
    }
}

/// Connects, writes frames until the connection fails, backs off, again;
/// returns once the queue's sending side is gone.
pub async fn run(bodylog: &Bodylog, mut rx: mpsc::Receiver<Queued>) {
    let mut backoff = Backoff::default();
    loop {
        match connect(bodylog).await {
            Ok(mut stream) => {
                let why = match serve(bodylog, &mut stream, &mut rx, &mut backoff).await {
                    Some(why) => why,
                    None => return,
                };
                bodylog.set_state(LinkState::Backoff, Some(why));
            }
            Err(why) => bodylog.set_state(LinkState::Backoff, Some(why)),
        }
        tokio::time::sleep(backoff.next_delay()).await;
    }
}

async fn connect(bodylog: &Bodylog) -> Result<TcpStream, String> {
    bodylog.set_state(LinkState::Connecting, None);
    let target = &bodylog.config.target;
    let addr = (target.host.as_str(), target.port);
    match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr)).await {
        Ok(Ok(stream)) => {
            bodylog.set_state(LinkState::Connected, None);
            log::info!("body log: connected to {target}");
            Ok(stream)
        }
        Ok(Err(e)) => Err(format!("connect to {target}: {e}")),
        Err(_) => Err(format!("connect to {target}: timed out")),
    }
}

/// Writes queued frames into `stream` until it fails or the listener
/// closes it (why, then), or the queue is gone (None).
async fn serve(
    bodylog: &Bodylog,
    stream: &mut TcpStream,
    rx: &mut mpsc::Receiver<Queued>,
    backoff: &mut Backoff,
) -> Option<String> {
    loop {
        let queued = tokio::select! {
            // A close that is already there wins over a waiting frame,
            // which would otherwise be written into a dead socket.
            biased;
            () = peer_closed(stream) => return Some("the listener closed the connection".into()),
            queued = rx.recv() => queued?,
        };
        let size = queued.frame.wire_len() as u64;
        let written = tokio::time::timeout(WRITE_TIMEOUT, async {
            for part in queued.frame.parts() {
                stream.write_all(&part).await?;
            }
            Ok::<_, std::io::Error>(())
        })
        .await;
        bodylog.dequeued(size);
        let why = match written {
            Ok(Ok(())) => {
                bodylog.counters.sent.inc();
                backoff.reset();
                continue;
            }
            Ok(Err(e)) => format!("write: {e}"),
            Err(_) => format!("write timed out after {WRITE_TIMEOUT:?}"),
        };
        log::warn!("body log: {why}; frame lost, reconnecting");
        bodylog.counters.error.inc();
        return Some(why);
    }
}

/// Resolves once the listener closed the connection (it never sends; any
/// bytes it does send are ignored).
async fn peer_closed(stream: &TcpStream) {
    let mut sink = [0u8; 64];
    loop {
        if stream.readable().await.is_err() {
            return;
        }
        match stream.try_read(&mut sink) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::frame::{decode, Frame};
    use super::super::tests::bodylog_to;
    use super::*;
    use bytes::Bytes;
    use tokio::io::AsyncReadExt;

    #[test]
    fn backoff_doubles_to_its_cap_and_resets() {
        let mut b = Backoff::default();
        let delays: Vec<u128> = (0..8).map(|_| b.next_delay().as_millis()).collect();
        assert_eq!(delays, [100, 200, 400, 800, 1600, 3200, 5000, 5000]);
        b.reset();
        assert_eq!(b.next_delay(), BACKOFF_MIN);
    }

    fn frame(n: u8) -> Frame {
        Frame::new(
            b"{}".to_vec(),
            Bytes::from(vec![n; 3]),
            Bytes::from(vec![n; 5]),
        )
    }

    async fn read_frame(s: &mut TcpStream) -> Vec<u8> {
        let mut len = [0u8; 4];
        s.read_exact(&mut len).await.unwrap();
        let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
        s.read_exact(&mut body).await.unwrap();
        body
    }

    /// Frames queued while no listener exists wait in the queue and arrive,
    /// in order, once it is up; the ones that did not fit were dropped at
    /// once.
    #[tokio::test]
    async fn frames_wait_for_a_late_listener_and_overflow_is_dropped() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let b = Arc::new(bodylog_to(&format!("127.0.0.1:{port}"), 2, 1 << 20));
        let rx = b.take_receiver().unwrap();
        let sender = tokio::spawn({
            let b = Arc::clone(&b);
            async move { run(&b, rx).await }
        });
        tokio::time::timeout(Duration::from_secs(5), async {
            while b.state() != LinkState::Backoff {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .unwrap();
        for n in 1..=5 {
            b.enqueue(frame(n));
        }
        assert_eq!(b.counters.dropped.get(), 3);
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .unwrap();
        let (mut conn, _) = listener.accept().await.unwrap();
        for n in 1..=2u8 {
            let body = read_frame(&mut conn).await;
            assert_eq!(decode(&body).unwrap().req, [n; 3], "frame {n} in order");
        }
        tokio::time::timeout(Duration::from_secs(5), async {
            while b.counters.sent.get() < 2 || b.pending() > 0 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .unwrap();
        assert_eq!(b.state(), LinkState::Connected);
        sender.abort();
    }

    /// A listener that went away is noticed while idle: the sender
    /// reconnects by itself and the next frame goes to the new connection
    /// instead of into a dead socket.
    #[tokio::test]
    async fn a_closed_connection_is_replaced() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let b = Arc::new(bodylog_to(&addr.to_string(), 8, 1 << 20));
        let rx = b.take_receiver().unwrap();
        let sender = tokio::spawn({
            let b = Arc::clone(&b);
            async move { run(&b, rx).await }
        });
        b.enqueue(frame(1));
        let (mut first, _) = listener.accept().await.unwrap();
        read_frame(&mut first).await;
        drop(first);
        let (mut second, _) = listener.accept().await.unwrap();
        b.enqueue(frame(2));
        let body = read_frame(&mut second).await;
        assert_eq!(decode(&body).unwrap().req, [2; 3]);
        assert_eq!(b.counters.error.get(), 0);
        sender.abort();
    }
}
