//! Per-request state shared by the proxy hooks.

use crate::lifecycle::ActiveRequest;
use crate::placement::Placement;
use crate::registry::{InFlightGuard, Route};
use crate::session::SessionId;
use crate::stream::ResponsePipeline;
use bytes::Bytes;
use std::sync::Arc;
use std::time::Instant;

pub struct RequestCtx {
    pub started: Instant,
    /// The route version this request was admitted under; kept to the end.
    pub route: Option<Arc<Route>>,
    /// The whole request body as the engine will receive it.
    pub body: Bytes,
    /// True once a body was read, so the upstream request gets its real
    /// Content-Length even when it is 0.
    pub body_read: bool,
    /// Parsed once in `request_filter`; later phases reuse it.
    pub json: Option<serde_json::Value>,
    /// The replayed request carries a placeholder body; whether the real body
    /// already went out in the current upstream attempt.
    pub body_sent_this_attempt: bool,
    /// Indices into `route.peers` this request may use (model pool + tier).
    pub pool: Vec<usize>,
    /// Peers tried so far, in order (indices into `route.peers`).
    pub tried: Vec<usize>,
    /// The peer of the current attempt.
    pub peer: Option<usize>,
    /// In-flight slot on `peer`; dropped on every exit path.
    pub slot: Option<InFlightGuard>,
    /// Upstream attempts started.
    pub attempts: u32,
    /// Status of a response the gateway answered itself.
    pub local_status: Option<u16>,
    /// Why the last upstream attempt failed, for the final 502.
    pub last_upstream_error: Option<String>,
    /// The request's session (hash and source only, never the raw value).
    pub session: Option<SessionId>,
    /// What placement decided (X-Routed-Mode).
    pub decision: Option<Placement>,
    /// The gateway added `stream_options.include_usage`: the usage frame is
    /// for the gateway, not the client.
    pub usage_injected: bool,
    /// Usage and first-token time of a 2xx SSE/JSON response.
    pub pipeline: Option<ResponsePipeline>,
    _active: ActiveRequest,
}

impl RequestCtx {
    pub fn new() -> Self {
        RequestCtx {
            started: Instant::now(),
            route: None,
            body: Bytes::new(),
            body_read: false,
            json: None,
            body_sent_this_attempt: false,
            pool: Vec::new(),
            tried: Vec::new(),
            peer: None,
            slot: None,
            attempts: 0,
            local_status: None,
            last_upstream_error: None,
            session: None,
            decision: None,
            pipeline: None,
            usage_injected: false,
            _active: ActiveRequest::new(),
        }
    }

    pub fn route_name(&self) -> &str {
        self.route.as_ref().map(|r| r.name()).unwrap_or("-")
    }

    pub fn peer_name(&self) -> &str {
        match (&self.route, self.peer) {
            (Some(route), Some(i)) => route
                .peers
                .get(i)
                .map(|p| p.config.name.as_str())
                .unwrap_or("-"),
            _ => "-",
        }
    }
}

impl Default for RequestCtx {
    fn default() -> Self {
        Self::new()
    }
}
