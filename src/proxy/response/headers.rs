//! A proxied response's head: the stream pipeline it gets (and so whether
//! Content-Length must go), and the X-Routed-* headers.

use crate::proxy::ctx::RequestCtx;
use crate::stream::ResponsePipeline;
use crate::trace_context::X_REQUEST_ID;
use http::header::{HeaderName, CONTENT_LENGTH, TRANSFER_ENCODING};
use http::response::Parts;
use http::{HeaderMap, HeaderValue};
use pingora::http::ResponseHeader;
use pingora::{ErrorType, OrErr, Result};

/// Lets `edit` change the engine's response head as plain `http` parts.
///
/// Why not `ResponseHeader::insert_header`: Pingora keeps the engine's
/// spelling of every header name in a second map beside the header map,
/// and each insert through it parses the name, allocates it twice and
/// updates both maps (about 4 k instructions a header: 22 k of a small
/// request's 156 k went to the X-Routed set, `benches/instructions.sh`).
/// Without that map the names go out in their canonical spelling (standard
/// names titled, the rest lower case), which HTTP reads as the same names
/// (RFC 9110, section 5.1). The status and a non-standard reason phrase are
/// kept.
pub fn edit_plain(
    resp: &mut ResponseHeader,
    edit: impl FnOnce(&mut Parts) -> Result<()>,
) -> Result<()> {
    let reason = resp
        .get_reason_phrase()
        .filter(|r| Some(*r) != resp.status.canonical_reason())
        .map(str::to_owned);
    let placeholder = ResponseHeader::build_no_case(resp.status, Some(0))?;
    let mut parts = Parts::from(std::mem::replace(resp, placeholder));
    let edited = edit(&mut parts);
    *resp = ResponseHeader::from(parts);
    resp.set_reason_phrase(reason.as_deref())?;
    edited
}

/// A head the gateway writes itself (an error, a 429), without Pingora's
/// name-spelling map (see [`edit_plain`]).
pub fn plain_head(status: u16) -> Result<Parts> {
    let status = http::StatusCode::from_u16(status)
        .or_err(ErrorType::InternalError, "local response status")?;
    let (mut parts, ()) = http::Response::new(()).into_parts();
    parts.status = status;
    Ok(parts)
}

/// Sets up the body pipeline for this response; a body that may change
/// length is sent chunked.
pub fn prepare_pipeline(head: &mut Parts, ctx: &mut RequestCtx) -> Result<()> {
    let Some(route) = &ctx.route else {
        return Ok(());
    };
    let handler = route
        .config
        .postprocess
        .filter(|_| route.runtime.toggles.postprocess.is_on(true));
    let pipeline = ResponsePipeline::for_response(
        head.status,
        &head.headers,
        ctx.request.api,
        handler,
        ctx.request.usage_injected,
    )
    .map(|p| p.with_clock(std::time::Instant::now));
    if pipeline.as_ref().is_some_and(ResponsePipeline::rewrites) {
        head.headers.remove(CONTENT_LENGTH);
        insert(
            &mut head.headers,
            TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        )?;
    }
    ctx.response.pipeline = pipeline;
    Ok(())
}

/// `HeaderMap::insert` without its panic on a map past `http`'s size limit.
pub fn insert(headers: &mut HeaderMap, name: HeaderName, value: HeaderValue) -> Result<()> {
    headers
        .try_insert(name, value)
        .or_err(ErrorType::InternalError, "response header map full")?;
    Ok(())
}

/// An engine's `101 Switching Protocols` passes only on a route that
/// allows upgrades; anywhere else it would make the connection a raw
/// tunnel to the engine (the request side refuses `Upgrade` already; this
/// covers an engine that switches unasked). The client gets a 502.
pub fn refuse_switch(status: http::StatusCode, ctx: &mut RequestCtx) -> Result<()> {
    if status != http::StatusCode::SWITCHING_PROTOCOLS
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

/// `x-request-id` on every response, the engine's own replaced: the id
/// the engine and the access log know the request by.
pub fn insert_request_id(headers: &mut HeaderMap, ctx: &RequestCtx) -> Result<()> {
    match &ctx.ids {
        Some(ids) => insert(headers, X_REQUEST_ID, ids.request_id.clone()),
        None => Ok(()),
    }
}

/// Who produced a response: the engine (through an upstream attempt), or
/// the gateway itself without one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    Upstream,
    Gateway,
}

const X_ROUTED_SESSION: HeaderName = HeaderName::from_static("x-routed-session");
const X_ROUTED_SOURCE: HeaderName = HeaderName::from_static("x-routed-source");
const X_ROUTED_QUEUED_MS: HeaderName = HeaderName::from_static("x-routed-queued-ms");
const X_ROUTED_MODE: HeaderName = HeaderName::from_static("x-routed-mode");
const X_ROUTED_PEER: HeaderName = HeaderName::from_static("x-routed-peer");
const X_ROUTED_RETRIES: HeaderName = HeaderName::from_static("x-routed-retries");
/// The most X-Routed-* headers one response carries.
const ROUTED_HEADERS: usize = 6;

/// X-Routed-Session/Source/Mode/Peer/Retries, unless the route turned them
/// off. A gateway answer says `X-Routed-Mode: local` (and names no peer),
/// so a client can tell a gateway 429 from an engine's.
///
/// Names are constants and values constants or built at load (peer names)
/// where they can be; only the session hash is written per request, without
/// `format!`.
pub fn insert_routed(headers: &mut HeaderMap, ctx: &RequestCtx, origin: Origin) -> Result<()> {
    let Some(route) = &ctx.route else {
        return Ok(());
    };
    if !route.config.routed_headers {
        return Ok(());
    }
    // One growth of the engine's (small) map instead of one per insert;
    // room for the `x-request-id` that follows too.
    headers
        .try_reserve(ROUTED_HEADERS + 1)
        .or_err(ErrorType::InternalError, "response header map full")?;
    if let Some(sid) = &ctx.request.session {
        let hex = HeaderValue::from_bytes(&sid.hex_bytes())
            .or_err(ErrorType::InternalError, "session hash header")?;
        insert(headers, X_ROUTED_SESSION, hex)?;
        let source = match sid.source.static_label() {
            Some(label) => HeaderValue::from_static(label),
            None => HeaderValue::from_str(sid.source.as_str())
                .or_err(ErrorType::InternalError, "session source header")?,
        };
        insert(headers, X_ROUTED_SOURCE, source)?;
    }
    if let Some(waited) = ctx.request.queued {
        let ms = u64::try_from(waited.as_millis()).unwrap_or(u64::MAX);
        insert(headers, X_ROUTED_QUEUED_MS, HeaderValue::from(ms))?;
    }
    let placement = ctx.request.placement.filter(|_| origin == Origin::Upstream);
    let Some(placement) = placement else {
        return insert(headers, X_ROUTED_MODE, HeaderValue::from_static("local"));
    };
    insert(
        headers,
        X_ROUTED_MODE,
        HeaderValue::from_static(placement.kind.as_str()),
    )?;
    let peer = match ctx.peer().and_then(|(_, p)| p.routed_peer.clone()) {
        Some(name) => name,
        None => HeaderValue::from_str(ctx.peer_name())
            .or_err(ErrorType::InternalError, "peer name header")?,
    };
    insert(headers, X_ROUTED_PEER, peer)?;
    insert(
        headers,
        X_ROUTED_RETRIES,
        count_value(ctx.upstream.count.saturating_sub(1)),
    )
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

    /// An engine head as Pingora reads it (with the name-spelling map),
    /// edited: every engine header and the reason phrase survive, the
    /// edit's headers are written, and the head serializes in one piece.
    #[test]
    fn a_plain_edit_keeps_the_engine_head() {
        let mut resp = ResponseHeader::build(429, Some(2)).unwrap();
        resp.append_header("X-Engine-Id", "e7").unwrap();
        resp.append_header("Content-Type", "application/json")
            .unwrap();
        resp.set_reason_phrase(Some("Slow Down")).unwrap();
        edit_plain(&mut resp, |head| {
            insert(
                &mut head.headers,
                X_ROUTED_MODE,
                HeaderValue::from_static("sticky"),
            )
        })
        .unwrap();
        assert_eq!(resp.status, 429);
        assert_eq!(resp.get_reason_phrase(), Some("Slow Down"));
        assert_eq!(resp.headers["x-engine-id"], "e7");
        assert_eq!(resp.headers["content-type"], "application/json");
        assert_eq!(resp.headers["x-routed-mode"], "sticky");
        let mut wire = Vec::new();
        resp.header_to_h1_wire(&mut wire);
        let wire = String::from_utf8(wire).unwrap();
        assert!(wire.contains("x-engine-id: e7\r\n"), "{wire}");
        assert!(
            wire.contains("Content-Type: application/json\r\n"),
            "{wire}"
        );
        assert!(wire.contains("x-routed-mode: sticky\r\n"), "{wire}");
        // Control: a canonical reason phrase stays the canonical one.
        let mut ok = ResponseHeader::build(200, None).unwrap();
        edit_plain(&mut ok, |_| Ok(())).unwrap();
        assert_eq!(ok.get_reason_phrase(), Some("OK"));
    }

    /// A failed edit still leaves the head in place for the error path.
    #[test]
    fn a_failed_edit_leaves_the_head() {
        let mut resp = ResponseHeader::build(200, None).unwrap();
        resp.append_header("x-a", "1").unwrap();
        let failed = edit_plain(&mut resp, |_| {
            Err(pingora::Error::explain(ErrorType::InternalError, "no"))
        });
        assert!(failed.is_err());
        assert_eq!(resp.headers["x-a"], "1");
    }

    #[test]
    fn counts_read_as_before() {
        for n in [0, 1, 9, 10, 11, 1234, u32::MAX] {
            assert_eq!(count_value(n).to_str().ok(), Some(n.to_string().as_str()));
        }
    }
}
