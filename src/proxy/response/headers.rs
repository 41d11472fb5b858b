//! A proxied response's head: the stream pipeline it gets (and so whether
//! Content-Length must go), and the X-Routed-* headers.

use crate::proxy::ctx::RequestCtx;
use crate::stream::ResponsePipeline;
use pingora::http::ResponseHeader;
use pingora::Result;

/// Sets up the body pipeline for this response; a body that may change
/// length is sent chunked.
pub fn prepare_pipeline(resp: &mut ResponseHeader, ctx: &mut RequestCtx) -> Result<()> {
    let Some(route) = &ctx.route else {
        return Ok(());
    };
    let handler = route
        .config
        .postprocess
        .filter(|_| route.runtime.toggles.postprocess.is_on(true));
    let pipeline = ResponsePipeline::for_response(
        resp.status,
        &resp.headers,
        handler,
        ctx.request.usage_injected,
    );
    if pipeline.as_ref().is_some_and(ResponsePipeline::rewrites) {
        resp.remove_header("content-length");
        resp.insert_header("transfer-encoding", "chunked")?;
    }
    ctx.response.pipeline = pipeline;
    Ok(())
}

/// An engine's `101 Switching Protocols` passes only on a route that
/// allows upgrades; anywhere else it would make the connection a raw
/// tunnel to the engine (the request side refuses `Upgrade` already; this
/// covers an engine that switches unasked). The client gets a 502.
pub fn refuse_switch(resp: &ResponseHeader, ctx: &mut RequestCtx) -> Result<()> {
    if resp.status != http::StatusCode::SWITCHING_PROTOCOLS
        || ctx.route.as_ref().is_some_and(|r| r.config.allow_upgrade)
    {
        return Ok(());
    }
    let why = format!(
        "peer {} answered 101 Switching Protocols; the route does not allow upgrades",
        ctx.peer_name()
    );
    ctx.upstream.last_error = Some(why.clone());
    Err(pingora::Error::explain(pingora::ErrorType::InvalidHTTPHeader, why).into_up())
}

/// Who produced a response: the engine (through an upstream attempt), or
/// the gateway itself without one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    Upstream,
    Gateway,
}

/// X-Routed-Session/Source/Mode/Peer/Retries, unless the route turned them
/// off. A gateway answer says `X-Routed-Mode: local` (and names no peer),
/// so a client can tell a gateway 429 from an engine's.
pub fn insert_routed(resp: &mut ResponseHeader, ctx: &RequestCtx, origin: Origin) -> Result<()> {
    let Some(route) = &ctx.route else {
        return Ok(());
    };
    if !route.config.routed_headers {
        return Ok(());
    }
    if let Some(sid) = &ctx.request.session {
        resp.insert_header("x-routed-session", sid.hex())?;
        resp.insert_header("x-routed-source", sid.source.as_str().to_string())?;
    }
    if let Some(waited) = ctx.request.queued {
        resp.insert_header("x-routed-queued-ms", waited.as_millis().to_string())?;
    }
    let placement = ctx.request.placement.filter(|_| origin == Origin::Upstream);
    let Some(placement) = placement else {
        return resp.insert_header("x-routed-mode", "local");
    };
    resp.insert_header("x-routed-mode", placement.kind.as_str())?;
    resp.insert_header("x-routed-peer", ctx.peer_name().to_string())?;
    resp.insert_header(
        "x-routed-retries",
        ctx.upstream.count.saturating_sub(1).to_string(),
    )?;
    Ok(())
}
