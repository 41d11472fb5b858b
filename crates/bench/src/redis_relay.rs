//! `--redis-delay`: a TCP relay on 127.0.0.1 between the gateway replicas
//! and redis-server that holds every chunk going to Redis a fixed time, so
//! each round trip gains that much, as a Redis in another zone would add.
//!
//! Hand-written: the one crate that injects latency into a TCP relay,
//! noxious (a Toxiproxy port), has had no release since 2021, sits on
//! tokio-util 0.6 and a REST control API; what the bench needs is the ~80
//! lines below.
//!
//! The delay is a line, not a gate: a chunk is due `delay` after it was
//! read, whatever is queued before it, so pipelined commands each gain the
//! delay once and order is kept. Replies flow back undelayed.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::{sleep_until, Instant};

/// Chunks read from a client and not yet due; past this the relay stops
/// reading that client (back-pressure) rather than buffer without bound.
const CHUNKS_IN_FLIGHT: usize = 256;
const CHUNK_BYTES: usize = 16 * 1024;

/// The relay's listener and its connections; dropping it stops them all.
pub struct RedisRelay {
    pub addr: SocketAddr,
    task: JoinHandle<()>,
}

impl RedisRelay {
    /// Listens on a free port of 127.0.0.1; each connection accepted gets
    /// one to `upstream`.
    pub async fn start(upstream: SocketAddr, delay: Duration) -> io::Result<RedisRelay> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(accept(listener, upstream, delay));
        Ok(RedisRelay { addr, task })
    }
}

impl Drop for RedisRelay {
    fn drop(&mut self) {
        // The accept task owns the connections' JoinSet: aborting it drops
        // the set, which aborts them.
        self.task.abort();
    }
}

async fn accept(listener: TcpListener, upstream: SocketAddr, delay: Duration) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((client, _)) => {
                    connections.spawn(async move {
                        // A connection that fails (Redis gone, a reset)
                        // closes both ends, which is what the client sees
                        // of a Redis that went away.
                        let _ = relay(client, upstream, delay).await;
                    });
                }
                // Out of descriptors or the like: the client retries.
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            },
            Some(_) = connections.join_next() => {}
        }
    }
}

async fn relay(client: TcpStream, upstream: SocketAddr, delay: Duration) -> io::Result<()> {
    let server = TcpStream::connect(upstream).await?;
    // Small request/reply exchanges: Nagle would add its own delay.
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    let (client_read, mut client_write) = client.into_split();
    let (mut server_read, server_write) = server.into_split();
    let to_server = delayed_copy(client_read, server_write, delay);
    let to_client = tokio::io::copy(&mut server_read, &mut client_write);
    tokio::pin!(to_server, to_client);
    tokio::select! {
        // Redis closing (or dying) ends the connection.
        done = &mut to_client => done.map(|_| ()),
        // The client closing its side: Redis still answers what it sent.
        sent = &mut to_server => {
            sent?;
            to_client.await.map(|_| ())
        }
    }
}

/// Copies `from` to `to`, each chunk written `delay` after it was read, in
/// order; shuts `to` down after `from`'s end.
async fn delayed_copy(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    delay: Duration,
) -> io::Result<()> {
    let (due_tx, mut due_rx) = mpsc::channel::<(Instant, Vec<u8>)>(CHUNKS_IN_FLIGHT);
    let read = async move {
        let mut buf = vec![0u8; CHUNK_BYTES];
        loop {
            let n = from.read(&mut buf).await?;
            if n == 0 {
                return Ok::<(), io::Error>(());
            }
            if due_tx
                .send((Instant::now() + delay, buf[..n].to_vec()))
                .await
                .is_err()
            {
                // The writer failed; its error is the one returned.
                return Ok(());
            }
        }
    };
    let write = async move {
        while let Some((due, chunk)) = due_rx.recv().await {
            sleep_until(due).await;
            to.write_all(&chunk).await?;
        }
        to.shutdown().await
    };
    tokio::try_join!(read, write).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A listener on 127.0.0.1 that writes back whatever it reads.
    async fn echo_server() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = conn.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        addr
    }

    async fn connect(relay: &RedisRelay) -> TcpStream {
        let conn = TcpStream::connect(relay.addr).await.expect("connect");
        conn.set_nodelay(true).expect("nodelay");
        conn
    }

    /// Sends `message` through the relay and reads it back; the reply and
    /// how long the round trip took.
    async fn round_trip(conn: &mut TcpStream, message: &[u8]) -> (Vec<u8>, Duration) {
        let sent = Instant::now();
        conn.write_all(message).await.expect("write");
        let mut back = vec![0u8; message.len()];
        tokio::time::timeout(Duration::from_secs(10), conn.read_exact(&mut back))
            .await
            .expect("the echo within 10s")
            .expect("read");
        (back, sent.elapsed())
    }

    #[tokio::test]
    async fn a_round_trip_through_the_relay_takes_at_least_the_delay() {
        let echo = echo_server().await;
        let message = b"*1\r\n$4\r\nPING\r\n".repeat(100);
        let delay = Duration::from_millis(60);
        let relay = RedisRelay::start(echo, delay).await.expect("relay");
        let mut conn = connect(&relay).await;
        let (back, took) = round_trip(&mut conn, &message).await;
        assert_eq!(back, message);
        assert!(
            took >= delay,
            "round trip {took:?} under the {delay:?} delay"
        );
        // Later chunks on the same connection are held too.
        let (back, took) = round_trip(&mut conn, b"again").await;
        assert_eq!(back, b"again");
        assert!(took >= delay, "second round trip {took:?}");
    }

    /// The control: no delay, the bytes pass through unchanged, also a
    /// message larger than one chunk.
    #[tokio::test]
    async fn with_no_delay_the_relay_passes_bytes_through_unchanged() {
        let echo = echo_server().await;
        let relay = RedisRelay::start(echo, Duration::ZERO)
            .await
            .expect("relay");
        let mut conn = connect(&relay).await;
        let message: Vec<u8> = (0..3 * CHUNK_BYTES).map(|i| (i % 251) as u8).collect();
        let (back, _) = round_trip(&mut conn, &message).await;
        assert_eq!(back, message);
    }

    /// Dropping the relay closes the connections it carried (the control:
    /// the same connection echoed while the relay ran).
    #[tokio::test]
    async fn a_dropped_relay_closes_its_connections() {
        let echo = echo_server().await;
        let relay = RedisRelay::start(echo, Duration::ZERO)
            .await
            .expect("relay");
        let mut conn = connect(&relay).await;
        let (back, _) = round_trip(&mut conn, b"x").await;
        assert_eq!(back, b"x");
        drop(relay);
        let mut rest = Vec::new();
        // Ok(0) on a close, an error on a reset; a timeout if left open.
        let closed = tokio::time::timeout(Duration::from_secs(10), conn.read_to_end(&mut rest))
            .await
            .is_ok();
        assert!(closed, "the connection outlived the relay");
        assert!(rest.is_empty());
    }
}
