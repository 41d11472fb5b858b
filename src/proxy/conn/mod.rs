//! The client connection under the hooks: a deadline for receiving each
//! request head (`client_header_timeout`), the idle wait between requests
//! (`client_idle_timeout`), and an engine's silence (`timeouts.read`).
//!
//! Pingora 0.9.1 times out each *read* of a request head (60 s on a fresh
//! connection, the keep-alive timeout after), not the head as a whole: a
//! client sending one byte a second keeps its connection forever
//! (slowloris). `HttpSession::set_read_timeout` is the same per-read
//! timeout, and no server option bounds the head, so the gateway wraps each
//! accepted stream ([`ClientStream`]) before Pingora sees it (`proxy/front.rs`).
//! The deadline starts at the first byte of a head, so a keep-alive
//! connection's idle wait stays `client_idle_timeout`'s; it ends when
//! Pingora has parsed the head (`early_request_filter` →
//! [`head_complete`]) and is re-armed for the next head when the request
//! is logged ([`await_next_head`]). A read past the deadline fails, Pingora
//! drops the connection, and its ERROR line for a head cut short is logged
//! at debug (`crate::logging`): a flood of them is not something to page on.
//!
//! The same wrapper bounds an engine's silence (the route's `timeouts.read`)
//! in place of Pingora's peer read timeout, which arms a timer on every read
//! of the engine's socket: 2.3 k instructions a frame on a stream, more than
//! the gateway's own work on it (BENCHMARKS.md, proxy overhead). Here one timer per
//! connection, created once, is reset only when it fires (at most every
//! quarter of the limit while a request waits on an engine) or when a request
//! needs it sooner ([`EngineWatch`]). While a request is with the engine,
//! Pingora's proxy loop keeps a read of the client connection pending (to
//! notice a client hanging up); that read fails once the engine has sent
//! nothing for the limit ([`watch_engine`]), the loop ends and drops the
//! engine's connection, and the failure is told to Pingora's hooks as the
//! engine's `ReadTimedout` it replaces ([`engine_silence`]). Progress is any
//! byte written to the client: a slow client stalls the engine's bytes too
//! and must not count as the engine's silence. For that read to stay pending,
//! bytes a client sends once its request body is read (a pipelined next
//! request) are held by the wrapper until the request is done
//! ([`hold_client_bytes`]): Pingora, given them, would keep them for the next
//! request and stop reading the connection, and the deadline with it.
//! A body that goes upstream through the replay (over 64 KiB) keeps
//! Pingora's timeouts instead: its pieces cross Pingora's body pipe, and
//! an engine that stops reading them stalls the proxy loop before it
//! reads the client connection again (`upstream::build_peer`).
//!
//! The idle wait between requests is the wrapper's too ([`IdleWatch`]):
//! Pingora's keep-alive timeout arms a timer for each wait; here one timer
//! per connection is moved only when it fires, and a wait that reaches
//! its limit with no byte of the next request ends (an end of stream,
//! which Pingora takes as the client leaving).

use pingora::proxy::Session;
use pingora::{Error, ErrorType};
use std::sync::atomic::Ordering;
use std::time::Duration;

mod stream;
mod watch;

pub use stream::{ClientStream, ENGINE_TIMEOUT, HEADER_TIMEOUT};

/// Phase of `early_request_filter`: the head is parsed, its deadline is off.
pub fn head_complete(session: &Session) {
    if let Some(c) = client_stream(session) {
        c.waiting_head.store(false, Ordering::Release);
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
///
/// On a wrapped connection the wrapper bounds the idle wait ([`IdleWatch`]):
/// Pingora's keep-alive timeout arms a timer for every wait (~1.4 k
/// instructions a request, `benches/instructions.sh`), so Pingora is told
/// to wait without one.
pub fn idle_timeout(session: &mut Session, idle: Duration) {
    if session.get_keepalive().is_none() {
        return;
    }
    match client_stream(session) {
        Some(c) => {
            let ms = u64::try_from(idle.as_millis()).unwrap_or(u64::MAX);
            c.idle_limit_ms.store(ms, Ordering::Relaxed);
            // Some(0): keep the connection, with no timer of Pingora's.
            session.set_keepalive(Some(0));
        }
        None => session.set_keepalive(Some(idle.as_secs())),
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

/// Phase of `logging`: the request is done. The engine's watch is off, the
/// bytes held for the next request are let through, and the next bytes on
/// this connection start a new head (with a fresh deadline from its first
/// byte).
pub fn await_next_head(session: &Session) {
    if let Some(c) = client_stream(session) {
        c.await_next_head();
    }
}

/// Phase of `request_filter`, once the body is read: what the client
/// sends from now on belongs to a next request and waits in the wrapper.
/// False when the connection is not wrapped or the request switches
/// protocols (its bytes after the `101` are the exchange itself): the
/// engine's silence is then left to Pingora's per-read timeout.
pub fn hold_client_bytes(session: &Session) -> bool {
    if session
        .req_header()
        .headers
        .contains_key(http::header::UPGRADE)
    {
        return false;
    }
    let Some(c) = client_stream(session) else {
        return false;
    };
    c.hold_client_bytes();
    true
}

/// Phase of `upstream_request_filter` (every attempt): the engine has
/// `limit` to send its first byte, then `limit` between bytes.
pub fn watch_engine(session: &Session, limit: Duration) {
    if let Some(c) = client_stream(session) {
        c.watch_engine(limit);
    }
}

/// First phase of `error_while_proxy`: a failure caused by the engine's
/// silence is the engine's `ReadTimedout`, as Pingora's own read timeout
/// would have reported it (a 502 naming it, no ban, no retry), not the
/// client read error it surfaced as.
pub fn engine_silence(session: &Session, e: Box<Error>) -> Box<Error> {
    match client_stream(session) {
        Some(c) if c.engine_timed_out.load(Ordering::Acquire) => {
            let limit = Duration::from_millis(c.engine_limit_ms.load(Ordering::Acquire));
            let mut timeout = Error::explain(
                ErrorType::ReadTimedout,
                format!("the engine sent nothing for {limit:?} (timeouts.read)"),
            );
            timeout.set_retry(false);
            timeout.into_up()
        }
        _ => e,
    }
}

fn client_stream(session: &Session) -> Option<&ClientStream> {
    let stream = session.as_downstream().stream()?;
    (**stream).as_any().downcast_ref::<ClientStream>()
}
