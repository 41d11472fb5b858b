//! Per-request state shared by the proxy hooks, grouped by the phase that
//! writes it: the request as admitted, the current upstream attempt, and the
//! response on its way back.

use crate::bodylog::capture::Capture;
use crate::lifecycle::ActiveRequest;
use crate::placement::Placement;
use crate::proxy::request::pieces::RequestBody;
use crate::registry::{InFlightGuard, Route, RoutePeer};
use crate::session::SessionId;
use crate::stream::ResponsePipeline;
use crate::trace_context::RequestIds;
use std::sync::Arc;
use std::time::Instant;

pub struct RequestCtx {
    pub started: Instant,
    /// The request id and trace context, read first thing in
    /// `request_filter` (`request::identify`); `None` only for a request
    /// that never got that far. The engine's head, every response and the
    /// access log carry them; a span exporter reads the trace from here.
    pub ids: Option<RequestIds>,
    /// The route version this request was admitted under; kept to the end.
    pub route: Option<Arc<Route>>,
    pub request: Admitted,
    pub upstream: Attempt,
    pub response: Returning,
    /// The body-log capture, only for a request that is being logged:
    /// started after placement, fed the raw upstream chunks, sent in
    /// `logging`.
    pub bodylog: Option<Box<Capture>>,
    /// When its phases ended, for its span; read only when it has one.
    pub phases: Phases,
    _active: ActiveRequest,
}

/// When a traced request's phases ended (`otlp::span::Timeline`). Marked
/// only while `on` (the request's span is exported: `request::identify`),
/// so that a request without one reads no clock for it.
#[derive(Default)]
pub struct Phases {
    pub on: bool,
    pub body_read: Option<Instant>,
    pub gated: Option<Instant>,
    pub placed: Option<Instant>,
    pub connecting: Option<Instant>,
    pub engine_head: Option<Instant>,
}

impl Phases {
    /// Now, for a traced request.
    pub fn now(&self) -> Option<Instant> {
        self.on.then(Instant::now)
    }
}

/// Written by `request_filter`: what the request is and where it may go.
#[derive(Default)]
pub struct Admitted {
    /// The whole request body as the engine will receive it, in the
    /// pieces it was read in.
    pub body: RequestBody,
    /// True once a body was read, so the upstream request gets its real
    /// Content-Length even when it is 0.
    pub body_read: bool,
    /// Pingora's retry buffer was on while the body was read, so a body
    /// that fitted it is sent from it rather than replayed.
    pub retry_buffered: bool,
    /// The body goes upstream through the replay, in pieces.
    pub replayed: bool,
    /// The LLM API the path names (`None`: an endpoint passed through
    /// unread, unless its model picks the pool).
    pub api: Option<crate::api::Api>,
    /// The body was read as a JSON object (an LLM request, or a body whose
    /// model picks the pool).
    pub json_object: bool,
    /// The body's `model`, when it names one.
    pub model: Option<String>,
    /// The body with `stream_options.include_usage` added, waiting for the
    /// content guards to pass (they judge what the client sent).
    pub usage_rewrite: Option<RequestBody>,
    /// The body asks for a streamed response (`"stream": true`).
    pub streamed: bool,
    /// Indices into `route.peers` this request may use (model pool).
    pub pool: Vec<usize>,
    /// The request's session (hash and source only, never the raw value).
    pub session: Option<SessionId>,
    /// The conversation's blocks, while the content phase has still to
    /// recognise a request that named no session.
    pub blocks: Option<Vec<crate::session::content::Block>>,
    /// How the content index recognised the conversation, when the
    /// session came from it.
    pub content: Option<crate::session::content::Recognised>,
    /// What placement decided (X-Routed-Mode).
    pub placement: Option<Placement>,
    /// How long the request waited in the admission queue, if it did.
    pub queued: Option<std::time::Duration>,
    /// The gateway added `stream_options.include_usage`: the usage frame is
    /// for the gateway, not the client.
    pub usage_injected: bool,
    /// `cch_strip` removed the billing line's `cch` field.
    pub cch_stripped: bool,
    /// Kimi tool-call id occurrences `kimi_normalize` renumbered.
    pub kimi_ids_renumbered: usize,
    /// The client connection holds what the client sends while this
    /// request runs (`conn::hold_client_bytes`), so it can watch the engine.
    pub client_held: bool,
    /// The path now lacks its `/<route>` prefix (`request::forward`): the
    /// client's path is the route's name and what is left, which the
    /// access log puts back together rather than every request keeping a
    /// copy.
    pub route_stripped: bool,
    /// Its place among its tenant's requests in flight and its charge,
    /// from admission (`guards::tenant::admit`; `None` without a tenants
    /// file) to the stream's end, where it is settled
    /// (`response::record::settle_tenant`); on any other path, in
    /// `logging`, or dropped with the context.
    pub tenant_admission: Option<crate::tenants::Admission>,
    /// Its tenant, class and weight (`guards::tenant::admit`, with or
    /// without a tenants file): the queue's order.
    pub tenant: Option<crate::tenants::Tag>,
    /// On a route that orders its queue fairly, once placed: what the
    /// queue charged its tenant's counter when it released it (0 placed at
    /// once). The rest of what it is served is charged at its end, by
    /// `response::record::settle_tenant`, which takes it.
    pub fair_charged: Option<f64>,
}

impl Admitted {
    /// The client connection bounds the engine's silence (`conn`), and
    /// the upstream connection goes without Pingora's per-read timeout.
    /// Not for a replayed body: its pieces cross Pingora's body pipe, which
    /// an engine that stops reading them stalls where the connection's
    /// watch is never polled, so Pingora's own timeouts bound that exchange
    /// (`upstream::build_peer`).
    pub fn engine_watched(&self) -> bool {
        self.client_held && !self.replayed
    }
}

/// Written by `upstream_peer` and the failure hooks: the current attempt.
#[derive(Default)]
pub struct Attempt {
    /// The peer of the current attempt (index into `route.peers`).
    pub peer: Option<usize>,
    /// In-flight slot on `peer`; dropped on every exit path.
    pub slot: Option<InFlightGuard>,
    /// The cold prompts' tokens prefilling on `peer` when the slot was
    /// taken (kept past the slot, which goes at the stream's end, for the
    /// engine's speed learned at the first token or in `logging`).
    pub backlog_ahead: u64,
    /// Peers tried so far, in order.
    pub tried: Vec<usize>,
    /// Upstream attempts started.
    pub count: u32,
    /// The replayed request carries a placeholder chunk per piece of the
    /// body; how many pieces went out in this attempt.
    pub pieces_sent: usize,
    /// Why the last attempt failed, for the log line of the final 502.
    pub last_error: Option<String>,
    /// When the current attempt's request head went upstream (TTFT starts).
    pub sent_at: Option<std::time::Instant>,
    /// The current attempt's response head arrived.
    pub responded: bool,
    /// The engine's prefill speed was taught by this attempt's first token
    /// (a cold prompt on an engine not timed yet), so its stream's end
    /// does not teach it again.
    pub speed_learned: bool,
    /// ... with a status other than 2xx: the engine did not take the
    /// request on, and its tenant is not charged its prompt.
    pub error_status: bool,
    /// The current attempt's exchange broke after the engine's head and its
    /// peer was banned for it (`upstream::on_exchange_failure`): the one
    /// line that reports the failure (`response::local::fail`) says so.
    pub banned_mid_response: bool,
    /// Retries on the same peer, each after a pooled connection the engine
    /// had closed failed before any response byte (`upstream::stale_reuse`).
    pub stale_retries: u32,
    /// The next attempt goes to the same peer, on a fresh connection.
    pub same_peer_again: bool,
}

/// Written by the response hooks.
#[derive(Default)]
pub struct Returning {
    /// Status of a response the gateway answered itself.
    pub local_status: Option<u16>,
    /// Usage and first-token time of a 2xx SSE/JSON response.
    pub pipeline: Option<ResponsePipeline>,
    /// The response was cut after its head had gone to the client, and the
    /// gateway logged the cut (`response::local::fail`): Pingora's own line
    /// for it, a 502 no client received, is suppressed.
    pub cut_logged: bool,
    /// What went wrong, for the access log: the error type of an answer
    /// the gateway gave itself (`errors.rs`), `stream_cut`, `client_gone`.
    pub error: Option<&'static str>,
}

impl RequestCtx {
    pub fn new() -> Self {
        RequestCtx {
            started: Instant::now(),
            ids: None,
            route: None,
            request: Admitted::default(),
            upstream: Attempt::default(),
            response: Returning::default(),
            bodylog: None,
            phases: Phases::default(),
            _active: ActiveRequest::new(),
        }
    }

    /// The route and the peer of the current attempt, once one is chosen.
    pub fn peer(&self) -> Option<(&Route, &RoutePeer)> {
        let route = self.route.as_deref()?;
        Some((route, route.peers.get(self.upstream.peer?)?))
    }

    pub fn route_name(&self) -> &str {
        self.route.as_ref().map(|r| r.name()).unwrap_or("-")
    }

    pub fn peer_name(&self) -> &str {
        self.peer().map_or("-", |(_, p)| p.config.name.as_str())
    }
}

impl Default for RequestCtx {
    fn default() -> Self {
        Self::new()
    }
}
