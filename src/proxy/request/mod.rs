//! The request side, before a peer is chosen: which route it is for, the
//! route's own `/_…` endpoints, the body, and handing the request (with its
//! pre-read body) back to Pingora once a peer is placed.

pub mod body;
pub mod endpoints;
pub mod replay;

use crate::errors::ErrorResponse;
use crate::metrics::{body_forwarded, BodyVia};
use crate::registry::{Registry, Route};
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

impl From<ErrorResponse> for Local {
    fn from(e: ErrorResponse) -> Self {
        Local::Error(e)
    }
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

/// Points the request at `rest` (the route prefix stripped) and, when a
/// body was read, hands it back to Pingora: a body that fitted Pingora's
/// retry buffer (64 KiB, enabled before the read) is sent from it, as
/// Pingora sends a retried body; a larger one goes through the replay,
/// which costs a second session and a re-parse of the head. Either way
/// `request_body_filter` swaps in the real (possibly rewritten) body.
pub async fn forward(
    session: &mut Session,
    rest: &str,
    body_pending: bool,
    retry_buffered: bool,
) -> Result<(), Local> {
    let uri = rest
        .parse::<http::Uri>()
        .map_err(|_| Local::Error(ErrorResponse::bad_request("invalid request path")))?;
    session.req_header_mut().set_uri(uri);
    if !body_pending {
        return Ok(());
    }
    if session.as_downstream().is_http2() {
        // h2c is not offered on the listener; refuse rather than hang.
        return Err(ErrorResponse::new(
            505,
            "http_version_not_supported",
            "request bodies need HTTP/1.1",
        )
        .into());
    }
    // Answered before the body was read; the engine must not be asked, nor
    // an interim answer of its passed on, a second time.
    session.req_header_mut().remove_header("expect");
    // Enabled (by `body::read`) and not truncated: the whole body is in it.
    if retry_buffered && !session.as_downstream().retry_buffer_truncated() {
        body_forwarded(BodyVia::RetryBuffer);
        return Ok(());
    }
    body_forwarded(BodyVia::Replay);
    replay::replay_h1(session).await.map_err(|e| {
        Local::Error(ErrorResponse::new(
            500,
            "internal_error",
            format!("body replay failed: {e}"),
        ))
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
