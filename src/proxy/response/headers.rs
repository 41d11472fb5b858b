//! A proxied response's head: the stream pipeline it gets (and so whether
//! Content-Length must go), and the X-Routed-* headers.

use crate::proxy::ctx::RequestCtx;
use crate::stream::ResponsePipeline;
use http::HeaderValue;
use pingora::http::ResponseHeader;
use pingora::{ErrorType, OrErr, Result};

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
///
/// Values are constants or built at load (peer names) where they can be;
/// only the session hash is written per request, without `format!`.
pub fn insert_routed(resp: &mut ResponseHeader, ctx: &RequestCtx, origin: Origin) -> Result<()> {
    let Some(route) = &ctx.route else {
        return Ok(());
    };
    if !route.config.routed_headers {
        return Ok(());
    }
    if let Some(sid) = &ctx.request.session {
        let hex = HeaderValue::from_bytes(&sid.hex_bytes())
            .or_err(ErrorType::InternalError, "session hash header")?;
        resp.insert_header("x-routed-session", hex)?;
        match sid.source.static_label() {
            Some(label) => {
                resp.insert_header("x-routed-source", HeaderValue::from_static(label))?
            }
            None => resp.insert_header("x-routed-source", sid.source.as_str().to_string())?,
        }
    }
    if let Some(waited) = ctx.request.queued {
        let ms = u64::try_from(waited.as_millis()).unwrap_or(u64::MAX);
        resp.insert_header("x-routed-queued-ms", HeaderValue::from(ms))?;
    }
    let placement = ctx.request.placement.filter(|_| origin == Origin::Upstream);
    let Some(placement) = placement else {
        return resp.insert_header("x-routed-mode", HeaderValue::from_static("local"));
    };
    resp.insert_header(
        "x-routed-mode",
        HeaderValue::from_static(placement.kind.as_str()),
    )?;
    match ctx.peer().and_then(|(_, p)| p.routed_peer.clone()) {
        Some(name) => resp.insert_header("x-routed-peer", name)?,
        None => resp.insert_header("x-routed-peer", ctx.peer_name().to_string())?,
    }
    resp.insert_header(
        "x-routed-retries",
        count_value(ctx.upstream.count.saturating_sub(1)),
    )?;
    Ok(())
}

/// A small count as a header value: a constant for the usual few.
fn count_value(n: u32) -> HeaderValue {
    const SMALL: [&str; 10] = ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"];
    match SMALL.get(n as usize) {
        Some(s) => HeaderValue::from_static(s),
        None => HeaderValue::from(n),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_read_as_before() {
        for n in [0, 1, 9, 10, 11, 1234, u32::MAX] {
            assert_eq!(count_value(n).to_str().ok(), Some(n.to_string().as_str()));
        }
    }
}
