//! The upstream attempt: which peer it goes to (the placed one, or on a
//! retry the next untried ready one), what a refused connection or a broken
//! exchange does to the peer, and the request head and body as the engine
//! receives them.

use crate::balance;
use crate::clock::now_ms;
use crate::proxy::ctx::RequestCtx;
use crate::trace_context::{TRACEPARENT, TRACESTATE, X_REQUEST_ID};
use bytes::Bytes;
use http::header::{HeaderName, AUTHORIZATION, CONTENT_LENGTH, HOST, TRANSFER_ENCODING};
use http::{HeaderMap, HeaderValue};
use pingora::http::RequestHeader;
use pingora::prelude::HttpPeer;
use pingora::{Error, ErrorSource, ErrorType, OrErr, Result};

/// The peer of the next attempt. On a retry the previous slot goes back
/// before the next peer is chosen.
pub fn next_peer(ctx: &mut RequestCtx) -> Result<Box<HttpPeer>> {
    // After a stale pooled connection, the same peer and slot again: its
    // cache holds the conversation, and it did not fail.
    let same_peer = std::mem::take(&mut ctx.upstream.same_peer_again);
    if ctx.upstream.count > 0 && !same_peer {
        ctx.upstream.slot = None;
        let route = ctx
            .route
            .clone()
            .ok_or_else(|| Error::explain(ErrorType::InternalError, "retry without route"))?;
        let (peer, mut slot) = balance::retry(&route, &ctx.request.pool, &ctx.upstream.tried)
            .ok_or_else(|| Error::explain(ErrorType::ConnectNoRoute, "no untried ready peer left"))
            .inspect_err(|_| ctx.upstream.peer = None)?;
        if !ctx.request.streamed {
            slot.not_streamed();
        }
        ctx.upstream.peer = Some(peer);
        ctx.upstream.backlog_ahead = slot.backlog_ahead();
        ctx.upstream.slot = Some(slot);
    }
    let attempt = &mut ctx.upstream;
    if let Some(p) = attempt.peer.filter(|_| !same_peer) {
        attempt.tried.push(p);
    }
    attempt.count += 1;
    attempt.pieces_sent = 0;
    attempt.responded = false;
    attempt.speed_learned = false;
    attempt.error_status = false;
    attempt.banned_mid_response = false;
    build_peer(ctx)
}

fn build_peer(ctx: &RequestCtx) -> Result<Box<HttpPeer>> {
    let Some((route, p)) = ctx.peer() else {
        return Error::e_explain(ErrorType::InternalError, "no peer chosen");
    };
    let Some(addr) = p.addr else {
        return Error::e_explain(
            ErrorType::ConnectNoRoute,
            format!("peer {} has no address", p.config.name),
        );
    };
    let mut peer = match &p.config.tls {
        None => HttpPeer::new(addr, false, String::new()),
        #[cfg(feature = "tls")]
        Some(tls) => tls.http_peer(addr, &p.config.host),
        // Config refuses a peer's `tls:` in a build without TLS; should one
        // get here all the same, it is not reached in plain text.
        #[cfg(not(feature = "tls"))]
        Some(_) => {
            return Error::e_explain(ErrorType::ConnectNoRoute, crate::engine_tls::NO_TLS);
        }
    };
    let t = &route.config.timeouts;
    peer.options.connection_timeout = Some(t.connect);
    // Bounded by the client connection's wrapper when it can (`conn`):
    // Pingora's own arms a timer on every read.
    peer.options.read_timeout = (!ctx.request.engine_watched()).then_some(t.read);
    // A replayed body crosses Pingora's body pipe piece by piece; an engine
    // that stops reading it blocks the write, and Pingora reads the answer
    // only between writes: each write gets the same limit.
    peer.options.write_timeout = ctx.request.replayed.then_some(t.read);
    peer.options.idle_timeout = Some(t.idle);
    Ok(Box::new(peer))
}

/// Passive health check: a peer that refuses connections is not ready until
/// a probe (or the ban TTL) says otherwise, and the route's discovery looks
/// its name up again at once (`RouteRuntime::rediscover`). Retry when
/// another ready peer is left untried. A connection the gateway could not
/// open for want of its own resources (descriptors, ports) bans nothing, is
/// not retried, and answers 503.
pub fn on_connect_failure(ctx: &mut RequestCtx, mut e: Box<Error>) -> Box<Error> {
    let Some((route, p)) = ctx.peer() else {
        return e;
    };
    if let Some(what) = crate::errors::local_shortage(&e) {
        // The gateway could not even make a socket: its own limit, not the
        // peer's failure. Banning would turn a moment without descriptors
        // into an outage lasting a probe interval (or the whole ban TTL when
        // the probes run short too), and another peer would fail the same way.
        log::error!(
            "route {} peer {}: no connection for lack of {what} in the gateway ({}); the peer is not banned, the client gets a 503 (raise the gateway's file-descriptor limit)",
            route.name(),
            p.config.name,
            e.root_cause()
        );
        e.set_retry(false);
        return e;
    }
    let why = failure_reason(&e, "connect failed");
    p.state.ban(now_ms(), route.config.health.ban_ttl);
    p.state.note_failure(why.clone());
    // The engine may have moved (a restarted pod, a new address): its name
    // is looked up again now, not at its TTL's end.
    route.runtime.rediscover.notify_one();
    log::warn!(
        "route {} peer {}: {why}, marked not ready",
        route.name(),
        p.config.name,
    );
    let failed = format!(
        "connect to {} failed: {}",
        p.config.name,
        e.etype().as_str()
    );
    e.set_retry(balance::has_untried_ready(
        route,
        &ctx.request.pool,
        &ctx.upstream.tried,
    ));
    ctx.upstream.last_error = Some(failed);
    e
}

/// Same-peer retries after stale pooled connections, per request: each
/// one uses up a pooled connection, and a pool holds few per peer.
const MAX_STALE_RETRIES: u32 = 2;

/// The request went out on a pooled connection that the engine had closed
/// (an engine may close a connection it announced as kept alive:
/// llama-server does, right after each stream) and failed before any
/// response byte: nothing reached the client, and the engine either never
/// read the request or dropped it unanswered. So it goes again, to the
/// same peer on a fresh connection, whatever its method, as the OpenResty
/// gateway's `proxy_next_upstream … non_idempotent` does: a generation
/// has no side effect but its cost. Returns whether it will.
pub fn stale_reuse(ctx: &mut RequestCtx, e: &Error, reused: bool, body_kept: bool) -> bool {
    let closed = matches!(
        e.etype(),
        ErrorType::ConnectionClosed | ErrorType::ReadError | ErrorType::WriteError
    );
    let attempt = &mut ctx.upstream;
    if !(reused && closed && body_kept && !attempt.responded)
        || attempt.stale_retries >= MAX_STALE_RETRIES
    {
        return false;
    }
    attempt.stale_retries += 1;
    attempt.same_peer_again = true;
    true
}

/// Passive health check on a broken exchange: a peer whose connection dies
/// mid-request (a killed or crashed engine: reset, closed, a body cut
/// short) or that answers something that is not HTTP is banned at once, as
/// a refused connection is, so new sessions go elsewhere without waiting for
/// a probe; the next passing probe readmits it. Not banned: a timeout (a
/// busy engine, the probe's rule too), a failure on the client's side, and
/// a reused pooled connection that fails before any answer (the engine
/// closing an idle keep-alive, which says nothing about its health).
/// A ban before the engine's head is logged here; after it, the line that
/// reports the cut stream says it.
pub fn on_exchange_failure(ctx: &mut RequestCtx, e: &Error, reused: bool) {
    if *e.esource() != ErrorSource::Upstream
        || matches!(
            e.etype(),
            ErrorType::ReadTimedout | ErrorType::WriteTimedout | ErrorType::ConnectTimedout
        )
        || (reused && !ctx.upstream.responded)
    {
        return;
    }
    let Some((route, p)) = ctx.peer() else {
        return;
    };
    p.state.ban(now_ms(), route.config.health.ban_ttl);
    let what = if ctx.upstream.responded {
        "exchange broke in its response"
    } else {
        "exchange broke before its response head"
    };
    p.state.note_failure(failure_reason(e, what));
    if ctx.upstream.responded {
        // Said by the line that reports the cut, so that one failure is
        // one line (`response::local::fail`).
        ctx.upstream.banned_mid_response = true;
        return;
    }
    log::warn!(
        "route {} peer {}: exchange broke before its response head ({}), marked not ready",
        route.name(),
        p.config.name,
        e.etype().as_str()
    );
}

/// Why a connection to an engine failed, as the ban shows it in
/// `/_health_status`: a TLS failure in rustls' words (as the probe tells
/// the same failure, `engine_tls::describe`), else `what` and the kind.
fn failure_reason(e: &Error, what: &str) -> String {
    let tls = matches!(
        e.etype(),
        ErrorType::TLSHandshakeFailure | ErrorType::InvalidCert
    );
    match (&e.context, tls) {
        (Some(context), true) => crate::engine_tls::describe_pingora(&context.to_string()),
        _ => {
            // After the handshake, an alert arrives as a read error whose
            // root is rustls' own.
            let alert = e
                .root_cause()
                .downcast_ref::<std::io::Error>()
                .and_then(crate::engine_tls::tls_io_error);
            alert.unwrap_or_else(|| format!("{what} ({})", e.etype().as_str()))
        }
    }
}

const X_API_KEY: HeaderName = HeaderName::from_static("x-api-key");

/// The head the engine receives: its own Host, the engine's credential
/// rather than the client's, the request's id and trace, and the real
/// Content-Length of the pre-read body (the replayed request carries a
/// placeholder).
pub fn rewrite_head(upstream: &mut RequestHeader, ctx: &mut RequestCtx) -> Result<()> {
    ctx.upstream.sent_at = Some(std::time::Instant::now());
    edit_plain(upstream, |head| {
        let headers = &mut head.headers;
        identify_upstream(headers, ctx)?;
        if let Some((route, p)) = ctx.peer() {
            let host = match &p.host_header {
                Some(host) => host.clone(),
                None => HeaderValue::from_str(&crate::registry::host_header(&p.config))
                    .or_err(ErrorType::InvalidHTTPHeader, "engine Host header")?,
            };
            insert(headers, HOST, host)?;
            if !route.config.forward_client_key {
                headers.remove(AUTHORIZATION);
                headers.remove(&X_API_KEY);
            }
            if let Some(key) = &route.engine_auth {
                insert(headers, AUTHORIZATION, key.clone())?;
            }
        }
        if ctx.request.body_read {
            headers.remove(TRANSFER_ENCODING);
            let length = ctx.request.body.len();
            // Most bodies were sent with their true length: the header stays.
            let mut text = itoa::Buffer::new();
            let text = text.format(length).as_bytes();
            let mut declared = headers.get_all(CONTENT_LENGTH).iter();
            let declared_once =
                declared.next().is_some_and(|v| v.as_bytes() == text) && declared.next().is_none();
            if !declared_once {
                insert(headers, CONTENT_LENGTH, HeaderValue::from(length))?;
            }
        }
        Ok(())
    })
}

/// Lets `edit` change the engine's request head as plain `http` parts.
///
/// Why not `RequestHeader::insert_header`: Pingora keeps the client's
/// spelling of every header name in a second map beside the header map,
/// and each insert or remove through it parses the name, copies a
/// non-standard one into an allocation of its own and updates both maps
/// (the x-request-id, traceparent and Host edits cost a small request
/// about 4 k instructions that way, `benches/instructions.sh`). Without
/// that map the engine gets the names in their canonical spelling
/// (standard names titled, the rest lower case), which HTTP reads as the
/// same names (RFC 9110, section 5.1), as the client gets the gateway's
/// responses (`response::headers::edit_plain`). The request target is the
/// URI `request::forward` set, so nothing of it is lost.
fn edit_plain(
    upstream: &mut RequestHeader,
    edit: impl FnOnce(&mut http::request::Parts) -> Result<()>,
) -> Result<()> {
    // An empty head: `Request::new` allocates nothing for it.
    let placeholder = RequestHeader::from(http::Request::new(()).into_parts().0);
    let mut parts = http::request::Parts::from(std::mem::replace(upstream, placeholder));
    let edited = edit(&mut parts);
    *upstream = RequestHeader::from(parts);
    edited
}

/// `HeaderMap::insert` without its panic on a map past `http`'s size limit.
fn insert(headers: &mut HeaderMap, name: HeaderName, value: HeaderValue) -> Result<()> {
    headers
        .try_insert(name, value)
        .or_err(ErrorType::InternalError, "engine request header map full")?;
    Ok(())
}

/// `x-request-id`, and the trace the engine's own spans join: this trace
/// with the gateway's span as their parent. A started trace carries no
/// `tracestate` (the client's, if any, went with the trace it belonged
/// to); a continued one keeps the client's as it came. With
/// `trace_context: off` the client's trace headers pass untouched.
fn identify_upstream(headers: &mut HeaderMap, ctx: &RequestCtx) -> Result<()> {
    let Some(ids) = &ctx.ids else {
        return Ok(());
    };
    // None when the client's own id is already there, alone.
    if !ids.client_request_id {
        insert(headers, X_REQUEST_ID, ids.request_id.clone())?;
    }
    if let Some(trace) = &ids.trace {
        let traceparent = HeaderValue::from_bytes(&trace.traceparent().encode())
            .or_err(ErrorType::InternalError, "traceparent")?;
        insert(headers, TRACEPARENT, traceparent)?;
        if !trace.continued() {
            headers.remove(TRACESTATE);
        }
    } else if ids.traceparent_sent {
        // `continue` without a valid incoming trace: an invalid one is
        // not passed on for the engine to make sense of, nor its state.
        // A `tracestate` that came without any `traceparent` stays: no
        // trace reaches the engine for it to be read with (Trace Context,
        // section 3.3: it is only parsed beside a valid `traceparent`).
        headers.remove(TRACEPARENT);
        headers.remove(TRACESTATE);
    }
    Ok(())
}

/// The real body goes out once per attempt in place of what Pingora
/// hands over: a piece for each of the replay's placeholder chunks, or
/// the whole body (one piece, see `request::forward`) for the retry
/// buffer. Whatever is left when Pingora's body ends goes out with its end.
pub fn swap_body(body: &mut Option<Bytes>, end_of_stream: bool, ctx: &mut RequestCtx) {
    if !ctx.request.body_read {
        return;
    }
    *body = next_piece(
        ctx.request.body.pieces(),
        &mut ctx.upstream.pieces_sent,
        end_of_stream,
    );
}

/// What goes to the engine for one call of `request_body_filter`, given the
/// pieces and how many of them this attempt has sent. `Some(empty)` sends
/// nothing yet (Pingora skips it); `None` ends the upstream body. Pingora
/// calls with `end_of_stream` whenever it has no data to hand over, so
/// every other call carries a placeholder (or the retry buffer).
///
/// The last piece waits for the end of Pingora's body. Sent with the last
/// placeholder, the engine holds the whole body and may answer before
/// Pingora has parsed the placeholder body's closing chunk; a response
/// that starts before the request body is done makes Pingora answer
/// `Connection: close` and drop the client's keep-alive connection, and a
/// client already writing its next request on it meets a reset.
fn next_piece(pieces: &[Bytes], sent: &mut usize, end_of_stream: bool) -> Option<Bytes> {
    let left = &pieces[(*sent).min(pieces.len())..];
    let (out, count) = match left {
        [] if end_of_stream => (None, 0),
        [last] if end_of_stream => (Some(last.clone()), 1),
        [next, _, ..] if !end_of_stream => (Some(next.clone()), 1),
        // Pingora's body ended before the placeholders did (never expected):
        // the rest, joined, so the engine still gets every byte.
        _ if end_of_stream => (Some(left.concat().into()), left.len()),
        _ => (Some(Bytes::new()), 0),
    };
    *sent += count;
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `next_piece` the calls Pingora makes for a replayed body of
    /// `pieces`: a placeholder each (not the end), then the end alone.
    fn replay(pieces: &[Bytes]) -> Vec<Option<Bytes>> {
        let mut sent = 0;
        let mut out: Vec<_> = pieces
            .iter()
            .map(|_| next_piece(pieces, &mut sent, false))
            .collect();
        out.push(next_piece(pieces, &mut sent, true));
        out
    }

    fn b(s: &'static str) -> Bytes {
        Bytes::from_static(s.as_bytes())
    }

    #[test]
    fn the_last_piece_waits_for_the_end_of_pingoras_body() {
        let pieces = [b("one"), b("two"), b("three")];
        assert_eq!(
            replay(&pieces),
            [
                Some(b("one")),
                Some(b("two")),
                Some(b("")),
                Some(b("three"))
            ]
        );
        // One piece: nothing until the end.
        assert_eq!(replay(&pieces[..1]), [Some(b("")), Some(b("one"))]);
    }

    #[test]
    fn the_retry_buffer_sends_the_body_with_its_end() {
        let pieces = [b("whole")];
        let mut sent = 0;
        assert_eq!(next_piece(&pieces, &mut sent, true), Some(b("whole")));
        // A later end-of-body call ends the upstream body with nothing more.
        assert_eq!(next_piece(&pieces, &mut sent, true), None);
    }

    #[test]
    fn an_early_end_sends_every_piece_left_joined() {
        let pieces = [b("a"), b("b"), b("c")];
        let mut sent = 0;
        assert_eq!(next_piece(&pieces, &mut sent, false), Some(b("a")));
        assert_eq!(next_piece(&pieces, &mut sent, true), Some(b("bc")));
        assert_eq!(sent, 3);
    }
}
