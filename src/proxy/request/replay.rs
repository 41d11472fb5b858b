//! Handing a body that `request_filter` already read back to Pingora's proxy loop.
//!
//! Pingora 0.9.1 forwards a pre-read body only through its retry buffer, which
//! is capped at 64 KiB; larger bodies then hang. Long-context prompts are far
//! above that. Bodies that fit go through the retry buffer (`super::forward`);
//! this is for the rest. The fix uses public API only: take the TCP stream out of the
//! downstream session and let pingora-core re-parse a synthetic request from
//! its pipelined-prefix buffer. The synthetic request carries a chunked
//! placeholder body, a 1-byte chunk for each piece of the real body (see
//! `pieces.rs`); `request_body_filter` swaps each placeholder chunk for its
//! piece on every upstream attempt, so the pieces go out as they were read,
//! never joined. Placeholders rather than the body itself, because the
//! re-parse checks the whole prefix against the 1 MiB header cap.
//!
//! All hooks still run once per request, keep-alive and retries keep working,
//! and the client address and socket digest survive (same stream). Pinned to
//! pingora =0.9.1; `tests/proxy.rs` fails loudly if a bump breaks this.
//! The other public way, Pingora's subrequest pipe with a preset body, was
//! measured and not taken: it runs every hook twice, costs about 10 us of CPU
//! per request, races the upstream connection pool, and is documented alpha.

use bytes::BytesMut;
use pingora::protocols::http::v1::client::http_req_header_to_wire;
use pingora::protocols::http::ServerSession;
use pingora::proxy::Session;
use pingora::{Error, ErrorType, Result};

/// One placeholder chunk of the synthetic request's body, standing for one
/// piece of the real body; `request_body_filter` replaces it.
const PLACEHOLDER_CHUNK: &[u8] = b"1\r\n \r\n";
/// The chunked body's end.
const LAST_CHUNK: &[u8] = b"0\r\n\r\n";

/// pingora-core's `MAX_HEADER_SIZE` (`protocols/http/v1/common.rs`, not
/// public): the re-parse refuses a pipelined prefix longer than this.
pub const PINGORA_MAX_HEADER_SIZE: usize = 1_048_575;

#[derive(Debug)]
pub enum ReplayError {
    /// The re-serialised head (and placeholder) would not fit Pingora's
    /// header cap: `http_req_header_to_wire` writes `name: value` where a
    /// client may have sent `name:value`, one byte more per header, so a
    /// head Pingora accepted within ~256 bytes of the cap can outgrow it.
    HeadTooLarge(usize),
    Failed(Box<Error>),
}

impl From<Box<Error>> for ReplayError {
    fn from(e: Box<Error>) -> Self {
        ReplayError::Failed(e)
    }
}

/// Rebuilds the downstream session so that pingora proxies the current
/// request header (already rewritten by the caller) with a placeholder body
/// of `pieces` chunks. HTTP/1.x only: the caller must not call this for h2
/// sessions.
pub async fn replay_h1(session: &mut Session, pieces: usize) -> Result<(), ReplayError> {
    let mut head = session.req_header().clone();
    head.remove_header("content-length");
    // Already answered before the body was read; the replayed request must
    // not make pingora answer it twice.
    head.remove_header("expect");
    head.insert_header("transfer-encoding", "chunked")?;
    // Serialize before touching the session: if this failed after the swap
    // below, the error response would have no connection to go to.
    let mut prefix: BytesMut = http_req_header_to_wire(&head)
        .ok_or_else(|| Error::explain(ErrorType::InternalError, "cannot serialize request head"))?;
    let head_len = prefix.len();
    prefix.reserve(pieces * PLACEHOLDER_CHUNK.len() + LAST_CHUNK.len());
    for _ in 0..pieces {
        prefix.extend_from_slice(PLACEHOLDER_CHUNK);
    }
    prefix.extend_from_slice(LAST_CHUNK);
    // Checked while the session is still whole: past the swap below a
    // refused re-parse leaves nothing to answer the client on.
    if prefix.len() > PINGORA_MAX_HEADER_SIZE {
        return Err(ReplayError::HeadTooLarge(head_len));
    }

    let ds = &mut session.downstream_session;
    let keepalive = ds.get_keepalive();
    let reuses = ds.get_keepalive_reuses_remaining();
    let read_timeout = ds.get_read_timeout();
    let write_timeout = ds.get_write_timeout();
    let pipelining = ds.pipelining_enabled();
    // `Connection: close` would veto keep-alive and make finish() close the
    // socket; the serialized head above still carries it for the new session.
    ds.req_header_mut().remove_header("connection");
    ds.set_keepalive(Some(0));
    ds.set_keepalive_reuses_remaining(None);
    // So finish() hands back bytes the client already sent after the body.
    ds.set_pipelining_enabled(true);

    let placeholder = ServerSession::new_http1(Box::new(std::io::Cursor::new(Vec::<u8>::new())));
    let old = std::mem::replace(ds, Box::new(placeholder));
    let reusable = old.finish().await?.ok_or_else(|| {
        Error::explain(
            ErrorType::InternalError,
            "downstream not reusable for replay",
        )
    })?;
    let (stream, overread) = reusable.into_parts();
    // Bytes the client pipelined after the body start the next request.
    // If they would push the prefix over the cap, this request is still
    // served but the connection closes after it (`Connection: close`):
    // the client sends them again on a new one.
    let mut keepalive = keepalive;
    if let Some(extra) = overread {
        if prefix.len() + extra.len() > PINGORA_MAX_HEADER_SIZE {
            keepalive = None;
        } else {
            prefix.extend_from_slice(&extra);
        }
    }
    let mut fresh = ServerSession::new_http1(stream);
    fresh.set_pipelined_prefix(prefix);
    if !fresh.read_request().await? {
        return Err(
            Error::explain(ErrorType::InternalError, "replayed request did not parse").into(),
        );
    }
    fresh.set_keepalive(keepalive);
    fresh.set_keepalive_reuses_remaining(reuses);
    fresh.set_read_timeout(read_timeout);
    fresh.set_write_timeout(write_timeout);
    // What the client pipelined after this request is in the prefix (or
    // arrives while it runs): kept for the next request, as the original
    // session would have.
    fresh.set_pipelining_enabled(pipelining);
    **ds = fresh;
    Ok(())
}
