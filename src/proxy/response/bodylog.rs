//! The body log's phases on the proxy side: a sampled request gets a
//! capture once it is placed (`begin`), the upstream response head and raw
//! body chunks go into it before the stream pipeline rewrites them
//! (`response_head`, `tee`), and `logging` turns it into a frame for the
//! sender's queue (`emit`). A request that is not logged, or a gateway with
//! no listener, has `ctx.bodylog == None` and pays one branch per phase.

use crate::bodylog::capture::{redact_headers, redact_uri, Capture, Outcome, RequestSide};
use crate::bodylog::Bodylog;
use crate::proxy::ctx::RequestCtx;
use crate::proxy::guards::auth;
use crate::registry::{Registry, Route};
use crate::session::is_session_header;
use bytes::Bytes;
use http::HeaderMap;
use pingora::proxy::Session;
use std::time::{Instant, SystemTime};

/// Starts a capture when body logging is on and samples this request.
/// Runs before the path is rewritten, so the URI is the client's.
pub fn begin(
    bodylog: Option<&Bodylog>,
    route: &Route,
    registry: &Registry,
    session: &Session,
    ctx: &mut RequestCtx,
) {
    let Some(bodylog) = bodylog.filter(|b| b.sample()) else {
        return;
    };
    let req = session.req_header();
    let configured = &route.config.balancing.session_headers;
    // Session ids stay out of the log; the meta carries their hash.
    let carries_session =
        |name: &str| is_session_header(name, configured) || name == crate::protect::prio::HEADER;
    let side = RequestSide {
        started: ctx.started,
        wall_start: SystemTime::now()
            .checked_sub(ctx.started.elapsed())
            .unwrap_or_else(SystemTime::now),
        request_id: bodylog.request_id(),
        client_ip: session
            .client_addr()
            .and_then(|a| a.as_inet())
            .map(|a| a.ip().to_string()),
        method: req.method.as_str().to_string(),
        uri: redact_uri(req.uri.path_and_query().map_or("/", |pq| pq.as_str())),
        req_headers: redact_headers(&req.headers, carries_session),
        owner: auth::owner(route, registry, session),
    };
    ctx.bodylog = Some(Box::new(Capture::new(side)));
}

pub fn response_head(ctx: &mut RequestCtx, headers: &HeaderMap) {
    if let Some(capture) = ctx.bodylog.as_mut() {
        capture.response_head(headers);
    }
}

/// The engine's bytes as they came, before anything rewrites them.
pub fn tee(ctx: &mut RequestCtx, body: Option<&Bytes>) {
    if let (Some(capture), Some(chunk)) = (ctx.bodylog.as_mut(), body) {
        capture.tee(chunk, Instant::now());
    }
}

/// The frame of a request that went upstream, queued without waiting.
pub fn emit(bodylog: Option<&Bodylog>, session: &Session, ctx: &mut RequestCtx) {
    let (Some(bodylog), Some(capture)) = (bodylog, ctx.bodylog.take()) else {
        return;
    };
    if ctx.upstream.count == 0 {
        // Placed, then answered locally (a failed replay): not proxied.
        return;
    }
    let req = &ctx.request;
    let req_body = req.body.whole_bytes();
    let outcome = Outcome {
        route: ctx.route_name(),
        peer: ctx.peer_name(),
        model: req.model.as_deref(),
        session_hash: req.session.as_ref().map(|s| s.hex()),
        session_src: req.session.as_ref().map(|s| s.source.as_str()),
        mode: req.placement.map(|p| p.kind.as_str()),
        status: super::record::status_code(session, ctx),
        attempts: ctx.upstream.count,
        usage: ctx.response.pipeline.as_ref().and_then(|p| p.usage()),
        usage_injected: req.usage_injected,
        req_body: &req_body,
    };
    bodylog.enqueue(capture.finish(&outcome, Instant::now()));
}
