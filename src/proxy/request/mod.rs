//! The request side, before a peer is chosen: which route it is for, the
//! route's own `/_…` endpoints, the body, and handing the request (with its
//! pre-read body) back to Pingora once a peer is placed.

pub mod body;
pub mod endpoints;
pub mod pieces;
pub mod replay;
pub mod rewrites;
pub mod session;

use crate::errors::ErrorResponse;
use crate::metrics::{body_forwarded, BodyVia};
use crate::proxy::ctx::{Admitted, RequestCtx};
use crate::registry::{Registry, Route};
use crate::trace_context::{RequestIds, Sampler};
use pingora::proxy::Session;
use std::sync::Arc;

/// A response the gateway writes itself instead of proxying.
#[derive(Debug)]
pub enum Local {
    Error(ErrorResponse),
    Json(u16, serde_json::Value),
    /// The client went away while the request waited: nothing to answer.
    ClientGone,
}

/// Resolves when the client closes its connection (or sends bytes it
/// should not, before an answer): a request waiting for a peer must not
/// keep its place for a client that is gone.
pub async fn client_gone(session: &mut Session) {
    match session.as_downstream_mut().read_body_or_idle(true).await {
        Err(_) => {}
        // Only a body still being read answers Ok; it is read whole
        // before placement, so wait on rather than return.
        Ok(_) => std::future::pending::<()>().await,
    }
}

/// The request's id and trace, first thing, so that every answer,
/// refusals included, carries the id (`trace_context.rs`); with a span
/// exporter (`exporting`), whether the request's span is recorded, and
/// so its phases timed.
pub fn identify(
    session: &Session,
    ctx: &mut RequestCtx,
    gateway: &crate::config::GatewayConfig,
    exporting: bool,
) {
    let sampler = gateway
        .tracing
        .as_ref()
        .map_or(Sampler::ALWAYS, |t| Sampler::ratio(t.sampling_ratio));
    let ids = RequestIds::of(
        &session.req_header().headers,
        gateway.trace_context,
        sampler,
    );
    ctx.phases.on = exporting && ids.trace.is_some_and(|t| t.sampled());
    ctx.ids = Some(ids);
}

impl From<ErrorResponse> for Local {
    fn from(e: ErrorResponse) -> Self {
        Local::Error(e)
    }
}

/// A request head over `limit` bytes (gateway.yaml `max_header_size`) is
/// refused, 431, before its body is read: Pingora 0.9.1 reads heads up to
/// its own 1 MiB cap, and forwarded they would have every engine parse a
/// megabyte for anyone who asks, no key needed. The size is the head as
/// the client sent it, request line, headers and the blank line after
/// them, which Pingora keeps as one buffer: its length is known without a
/// pass over the headers. Logged at debug only: any client can cause one.
pub fn refuse_large_head(session: &Session, limit: usize) -> Result<(), Local> {
    // HTTP/1 (the listener offers nothing else): a slice of the buffer the
    // head was parsed from, not a copy.
    let size = session.as_downstream().to_h1_raw().len();
    if size <= limit {
        return Ok(());
    }
    log::debug!(
        "client {}: request head of {size} bytes over max_header_size ({limit}): answered 431",
        session
            .client_addr()
            .map_or_else(|| "-".to_string(), ToString::to_string)
    );
    Err(ErrorResponse::head_too_large(limit).into())
}

/// A path with a `.` or `..` segment is refused (400 `invalid_path`), also
/// when the dots or the slash are percent-encoded (`%2e%2e`, `..%2f`) or a
/// backslash stands for the slash. Forwarded as is, `/r/v1/../metrics`
/// passes the `/v1/` check here and is `/metrics` at an engine that
/// normalises it: the dots would step out of the API the route exposes.
/// Refused rather than normalised: no API client sends them, and a path
/// the gateway rewrote could still differ from what the engine makes of
/// it.
pub fn refuse_dot_segments(session: &Session) -> Result<(), Local> {
    let path = session.req_header().uri.path();
    if !has_dot_segment(path.as_bytes()) {
        return Ok(());
    }
    Err(ErrorResponse::new(
        400,
        "invalid_path",
        "the path has a \".\" or \"..\" segment (plain or percent-encoded)",
    )
    .into())
}

/// Whether the percent-decoded `path`, split at `/` and `\`, has a `.` or
/// `..` segment.
pub fn has_dot_segment(path: &[u8]) -> bool {
    // A dot segment needs a `.`, plain or percent-encoded: most paths have
    // neither and need no decoding.
    if memchr::memchr2(b'.', b'%', path).is_none() {
        return false;
    }
    let mut decoded = Vec::with_capacity(path.len());
    let mut i = 0;
    while i < path.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (
            path[i],
            path.get(i + 1).copied().and_then(hex),
            path.get(i + 2).copied().and_then(hex),
        ) {
            (b'%', Some(hi), Some(lo)) => {
                decoded.push((hi * 16 + lo) as u8);
                i += 3;
            }
            (b, _, _) => {
                decoded.push(b);
                i += 1;
            }
        }
    }
    decoded
        .split(|&b| b == b'/' || b == b'\\')
        .any(|segment| segment == b"." || segment == b"..")
}

/// The route named by the first path segment, and the rest of the path
/// (query included) as the engine will see it.
pub fn resolve_route(
    registry: &Registry,
    session: &Session,
) -> Result<(Arc<Route>, String), Local> {
    let path = session
        .req_header()
        .uri
        .path_and_query()
        .map_or("/", |pq| pq.as_str());
    let Some((name, rest)) = split_route(path) else {
        return Err(ErrorResponse::not_found("requests go to /<route>/v1/...").into());
    };
    let route = registry
        .route(name)
        .ok_or_else(|| Local::Error(ErrorResponse::not_found_route(name)))?;
    Ok((route, rest))
}

/// Only `/v1/...` is proxied; anything else under a route is not an endpoint.
pub fn require_api_path(route: &Route, rest: &str) -> Result<(), Local> {
    if rest.starts_with("/v1/") {
        return Ok(());
    }
    let name = route.name();
    Err(ErrorResponse::not_found(format!(
        "route {name:?} serves /{name}/v1/...; {rest:?} is not an endpoint"
    ))
    .into())
}

/// A request asking to switch protocols (`Upgrade: websocket`, `h2c`) is
/// refused unless its route sets `allow_upgrade`: an engine's `101` would
/// turn the connection into a raw tunnel to it, past the `/v1/`
/// restriction, the body limit and the rules (they judge one request; a
/// tunnel carries anything). Refused rather than ignored, so a client
/// learns why instead of getting a plain answer it did not ask for.
pub fn refuse_upgrade(route: &Route, session: &Session) -> Result<(), Local> {
    let Some(upgrade) = session.req_header().headers.get(http::header::UPGRADE) else {
        return Ok(());
    };
    if route.config.allow_upgrade {
        return Ok(());
    }
    let asked = String::from_utf8_lossy(upgrade.as_bytes());
    Err(ErrorResponse::new(
        400,
        "upgrade_not_allowed",
        format!(
            "route {:?} does not switch protocols (Upgrade: {asked}); send plain HTTP/1.1",
            route.name()
        ),
    )
    .into())
}

/// Points the request at `rest` (the route prefix stripped) and, when a
/// body was read, hands it back to Pingora: a body that fitted Pingora's
/// retry buffer (64 KiB, enabled before the read) is sent from it, as
/// Pingora sends a retried body; a larger one goes through the replay,
/// which costs a second session and a re-parse of the head. Either way
/// `request_body_filter` swaps in the real (possibly rewritten) body: in
/// one piece from the retry buffer, piece by piece through the replay.
pub async fn forward(
    route: &Route,
    session: &mut Session,
    rest: &str,
    req: &mut Admitted,
) -> Result<(), Local> {
    let uri = rest
        .parse::<http::Uri>()
        .map_err(|_| Local::Error(ErrorResponse::bad_request("invalid request path")))?;
    session.req_header_mut().set_uri(uri);
    req.route_stripped = true;
    if !req.body_read || req.body.is_empty() {
        return Ok(());
    }
    // Answered before the body was read; the engine must not be asked, nor
    // an interim answer of its passed on, a second time.
    session.req_header_mut().remove_header("expect");
    // Enabled (by `body::read`) and not truncated: the whole body is in it.
    // The same over h2: Pingora keeps the retry buffer for h2 sessions too.
    if req.retry_buffered && !session.as_downstream().retry_buffer_truncated() {
        // Pingora hands its retry buffer over in one piece.
        req.body.make_whole();
        body_forwarded(BodyVia::RetryBuffer);
        return Ok(());
    }
    if session.as_downstream().is_http2() {
        // The replay re-reads an HTTP/1 head from bytes; an h2 request has
        // none. Refused rather than hang. (64 KiB: `body::RETRY_BUFFER_BYTES`,
        // not imported here, where `body` imports this module.)
        return Err(ErrorResponse::new(
            413,
            "request_too_large",
            "over HTTP/2 a request body is forwarded up to 64 KiB; send a larger one over HTTP/1.1",
        )
        .into());
    }
    body_forwarded(BodyVia::Replay);
    req.replayed = true;
    replay::replay_h1(session, req.body.pieces().len()).await.map_err(|e| match e {
        replay::ReplayError::HeadTooLarge(size) => {
            log::warn!(
                "route {}: request head of {size} bytes (re-serialised) over Pingora's {} byte cap: answered 431",
                route.name(),
                replay::PINGORA_MAX_HEADER_SIZE
            );
            // The body is read; the head is what the client must shrink.
            Local::Error(ErrorResponse::head_too_large(
                replay::PINGORA_MAX_HEADER_SIZE - 1024,
            ))
        }
        replay::ReplayError::Failed(e) => Local::Error(ErrorResponse::new(
            500,
            "internal_error",
            format!("body replay failed: {e}"),
        )),
    })
}

/// `/<route>/<rest>` → (route, rest). `rest` keeps the query string and is
/// "/" when empty.
pub fn split_route(path_and_query: &str) -> Option<(&str, String)> {
    let trimmed = path_and_query.strip_prefix('/')?;
    let end = trimmed.find(['/', '?']).unwrap_or(trimmed.len());
    let (name, rest) = trimmed.split_at(end);
    if name.is_empty() {
        return None;
    }
    let rest = if rest.is_empty() {
        "/".to_string()
    } else if rest.starts_with('?') {
        format!("/{rest}")
    } else {
        rest.to_string()
    };
    Some((name, rest))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_segments_are_found_however_they_are_written() {
        for bad in [
            "/r/v1/../metrics",
            "/r/./_x",
            "/r/v1/..",
            "/r/v1/.",
            "/../r/v1/x",
            "/r/%2e%2e/",
            "/r/v1/%2E%2e/metrics",
            "/r/v1/.%2e/metrics",
            "/r/v1/..%2fmetrics",
            "/r/v1/..%2Fmetrics",
            "/r/v1/..%5cmetrics",
            "/r/v1\\..\\metrics",
        ] {
            assert!(has_dot_segment(bad.as_bytes()), "{bad}");
        }
        for good in [
            "/r/v1/chat/completions",
            "/r/v1/models/org%2Fmodel",
            "/r/v1/files/a.b",
            "/r/v1/.well-known",
            "/r/v1/...",
            "/r/v1/%252e%252e/x",
            "/r/v1/%2",
            "/r/v1/%zz",
        ] {
            assert!(!has_dot_segment(good.as_bytes()), "{good}");
        }
    }

    #[test]
    fn splits_route_and_rest() {
        assert_eq!(
            split_route("/chat/v1/models"),
            Some(("chat", "/v1/models".into()))
        );
        assert_eq!(split_route("/chat"), Some(("chat", "/".into())));
        assert_eq!(split_route("/chat?x=1"), Some(("chat", "/?x=1".into())));
        assert_eq!(
            split_route("/chat/v1/x?a=b"),
            Some(("chat", "/v1/x?a=b".into()))
        );
        assert_eq!(split_route("/"), None);
        assert_eq!(split_route("//v1"), None);
        assert_eq!(split_route("chat"), None);
    }
}
