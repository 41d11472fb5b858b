//! Responses the gateway writes itself: refusals and endpoint answers from
//! `request_filter`, and the error after a failed upstream attempt.

use super::headers::{insert, insert_request_id, insert_routed, plain_head, Origin};
use crate::errors;
use crate::proxy::ctx::RequestCtx;
use crate::proxy::request::{body::has_body, Local};
use bytes::Bytes;
use http::header::{ALLOW, CONTENT_LENGTH, CONTENT_TYPE, RETRY_AFTER};
use http::HeaderValue;
use pingora::http::ResponseHeader;
use pingora::proxy::{FailToProxy, Session};
use pingora::{Error, Result};

/// Answers `local` instead of proxying.
pub async fn respond(session: &mut Session, ctx: &mut RequestCtx, local: Local) {
    let (status, body, extra) = match local {
        Local::ClientGone => {
            ctx.response.error = Some("client_gone");
            session.set_keepalive(None);
            return;
        }
        Local::Error(e) => {
            ctx.response.error = Some(e.error_type);
            (e.status, e.body(), Extra::of(e))
        }
        Local::Json(status, value) => {
            let mut bytes = serde_json::to_vec(&value).unwrap_or_default();
            bytes.push(b'\n');
            (status, Bytes::from(bytes), Extra::default())
        }
    };
    ctx.response.local_status = Some(status);
    // The peer slot is not needed for a local answer.
    ctx.upstream.slot = None;
    if !ctx.request.body_read && has_body(session) {
        // Refused before its body was read (e.g. 401): rather than drain
        // an unknown amount of upload, close after answering.
        session.set_keepalive(None);
    }
    if let Err(e) = write_json(session, ctx, Origin::Gateway, status, body, extra).await {
        log::debug!("could not write local response: {e}");
    }
}

/// After a failed attempt: the JSON error, if nothing was written yet, and
/// the one line that logs the failure: a stream cut after its head, or a
/// failed request.
pub async fn fail(session: &mut Session, e: &Error, ctx: &mut RequestCtx) -> FailToProxy {
    let shortage = errors::local_shortage(e);
    let code = match shortage {
        Some(_) => 503,
        None => errors::proxy_failure_status(e, ctx.upstream.count > 0),
    };
    let banned = if ctx.upstream.banned_mid_response {
        " (peer marked not ready)"
    } else {
        ""
    };
    if let (true, Some(head)) = (code >= 500, session.response_written()) {
        // The client has its head (a 200, as a rule) and part of the
        // body: the status Pingora would log is one no client received.
        log::warn!(
            "route {} peer {}: stream cut after its head: the client got status {} and {} body byte(s), then no end of the stream{banned}: {e}",
            ctx.route_name(),
            ctx.peer_name(),
            head.status.as_u16(),
            session.body_bytes_sent(),
        );
        ctx.response.cut_logged = true;
        ctx.response.error = Some("stream_cut");
    } else if code >= 500 {
        log::warn!(
            "route {} peer {}: proxying failed after {} attempt(s){banned}: {e}",
            ctx.route_name(),
            ctx.peer_name(),
            ctx.upstream.count
        );
    }
    if code > 0 && session.response_written().is_none() {
        let err = match shortage {
            Some(what) => errors::ErrorResponse::gateway_overloaded(what),
            None => errors::proxy_failure(
                code,
                e,
                ctx.peer_name(),
                &ctx.upstream.tried,
                ctx.upstream.last_error.as_deref(),
            ),
        };
        ctx.response.local_status = Some(code);
        ctx.response.error = Some(err.error_type);
        let origin = if ctx.upstream.count > 0 {
            Origin::Upstream
        } else {
            Origin::Gateway
        };
        let body = err.body();
        let _ = write_json(session, ctx, origin, code, body, Extra::of(err)).await;
    }
    ctx.upstream.slot = None;
    FailToProxy {
        error_code: code,
        can_reuse_downstream: false,
    }
}

/// The headers an error may add to the JSON response.
#[derive(Default)]
struct Extra {
    retry_after: Option<u32>,
    allow: Option<&'static str>,
    headers: Vec<(&'static str, String)>,
}

impl Extra {
    fn of(e: errors::ErrorResponse) -> Self {
        Extra {
            retry_after: e.retry_after,
            allow: e.allow,
            headers: e.headers.map(|h| *h).unwrap_or_default(),
        }
    }
}

/// Writes a complete JSON response.
async fn write_json(
    session: &mut Session,
    ctx: &RequestCtx,
    origin: Origin,
    status: u16,
    body: Bytes,
    extra: Extra,
) -> Result<()> {
    let mut head = plain_head(status)?;
    let headers = &mut head.headers;
    insert_request_id(headers, ctx)?;
    insert_routed(headers, ctx, origin)?;
    insert(
        headers,
        CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    )?;
    insert(headers, CONTENT_LENGTH, HeaderValue::from(body.len()))?;
    if let Some(secs) = extra.retry_after {
        insert(headers, RETRY_AFTER, HeaderValue::from(secs))?;
    }
    if let Some(methods) = extra.allow {
        insert(headers, ALLOW, HeaderValue::from_static(methods))?;
    }
    for (name, value) in extra.headers {
        // Values the gateway wrote itself (numbers, durations): one that
        // could not be a header value is left out rather than fail the answer.
        if let Ok(value) = HeaderValue::from_str(&value) {
            insert(headers, http::HeaderName::from_static(name), value)?;
        }
    }
    let resp = ResponseHeader::from(head);
    session.write_response_header(Box::new(resp), false).await?;
    session.write_response_body(Some(body), true).await
}
