//! The Pingora `ProxyHttp` implementation: hooks only, each a list of named
//! phases. The phases live in the modules beside this one:
//!
//! early_request_filter     `conn::head_complete`: the head's deadline is off;
//!                          `conn::serve_pipelined`: pipelined requests in order
//! request_filter           `request::identify` (request id, trace) →
//!                          `request` (head size, route, endpoints) →
//!                          `guards::auth` (the key's owner) → `request`
//!                          (body, session; `conn::hold_client_bytes`) →
//!                          `guards::rules` → `request::rewrites` (usage,
//!                          prefix) → `guards::tenant::admit` (the tenant,
//!                          its cap and budgets) →
//!                          `Gateway::place` (pool, load gates,
//!                          `crate::balance`) → `request::forward` (the body
//!                          back to Pingora: its retry buffer, or the replay)
//! upstream_peer            `upstream::next_peer`: the placed peer, or on a
//!                          retry the next untried ready one
//! fail_to_connect          `upstream::on_connect_failure`: ban, retry?
//! error_while_proxy        `conn::engine_silence`: the engine's timeout as
//!                          such; `upstream::on_exchange_failure`: ban a
//!                          peer whose connection broke; `upstream::stale_reuse`:
//!                          a closed pooled connection tried again
//! upstream_request_filter  `conn::watch_engine`: its silence is bounded;
//!                          `upstream::rewrite_head`: Host, real Content-Length
//! request_body_filter      `upstream::swap_body`: the real body for the placeholder
//! response_filter          `response::headers`: an unasked `101` refused,
//!                          pipeline, X-Routed-* headers; the head into the
//!                          body-log capture
//! response_body_filter     `response::bodylog::tee` (raw bytes), then the
//!                          `crate::stream` pipeline: observe, drop, rewrite;
//!                          the slot released at the engine's last byte
//! fail_to_proxy            `response::local::fail`: the JSON error
//! logging                  the slot released and the tenant settled (if
//!                          not yet), `response::record`
//!                          (and `share_response`), the access-log line
//!                          (`response::access`) and the body-log frame
//!                          queued, `conn::await_next_head`
//!
//! Under the hooks, `conn` wraps each client connection: a request head
//! must arrive within `client_header_timeout` of its first byte, and an
//! engine may stay silent for at most its route's `timeouts.read`.

pub mod conn;
pub mod ctx;
pub mod front;
pub mod guards;
pub mod request;
pub mod response;
pub mod upstream;

use crate::accesslog::AccessLog;
use crate::balance::{Granted, Refused};
use crate::bodylog::Bodylog;
use crate::errors;
use crate::otlp::Exporter;
use crate::protect::route::TurnBucket;
use crate::registry::Registry;
use async_trait::async_trait;
use bytes::Bytes;
use ctx::RequestCtx;
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::prelude::HttpPeer;
use pingora::proxy::{FailToProxy, ProxyHttp, Session};
use pingora::{Error, Result};
use request::Local;
use response::headers::Origin;
use std::sync::Arc;

pub struct Gateway {
    pub registry: Arc<Registry>,
    /// Body logging, when a listener is configured.
    pub bodylog: Option<Arc<Bodylog>>,
    /// The access log, when gateway.yaml has `access_log:`.
    pub access_log: Option<Arc<AccessLog>>,
    /// The span exporter, when gateway.yaml has `tracing:`.
    pub exporter: Option<Arc<Exporter>>,
}

impl Gateway {
    pub fn new(
        registry: Arc<Registry>,
        bodylog: Option<Arc<Bodylog>>,
        access_log: Option<Arc<AccessLog>>,
        exporter: Option<Arc<Exporter>>,
    ) -> Self {
        Gateway {
            registry,
            bodylog,
            access_log,
            exporter,
        }
    }

    /// Everything before proxying. `Ok(())`: proxy the (replayed) request;
    /// `Err(local)`: the gateway answers itself.
    async fn admit(&self, session: &mut Session, ctx: &mut RequestCtx) -> Result<(), Local> {
        let gateway = self.registry.gateway();
        request::identify(session, ctx, gateway, self.exporter.is_some());
        conn::idle_timeout(session, gateway.client_idle_timeout);
        request::refuse_large_head(session, gateway.max_header_size)?;
        request::refuse_dot_segments(session)?;
        request::endpoints::answer_gateway(self.bodylog.as_deref(), &self.registry, session)?;
        let (route, rest) = request::resolve_route(&self.registry, session)?;
        ctx.route = Some(Arc::clone(&route));
        request::endpoints::inspect(&route, &self.registry, session, &rest).await?;
        request::endpoints::answer(
            &route,
            &self.registry,
            self.bodylog.as_deref(),
            session,
            &rest,
        )?;
        request::require_api_path(&route, &rest)?;
        request::refuse_upgrade(&route, session)?;
        let owner = guards::auth::check(&route, &self.registry, session)?;
        request::endpoints::answer_models(&route, session, &rest)?;
        request::body::read(session, &route, &rest, &mut ctx.request).await?;
        ctx.phases.body_read = ctx.phases.now();
        request::session::settle(&route, self.registry.store(), &mut ctx.request).await;
        ctx.request.client_held = conn::hold_client_bytes(session);
        guards::rules::check(&route, &ctx.request)?;
        request::rewrites::include_usage(&mut ctx.request);
        request::rewrites::prefix_transforms(&route, &mut ctx.request);
        guards::tenant::admit(owner, &self.registry, session, &mut ctx.request)?;
        self.place(session, &route, ctx).await?;
        response::bodylog::begin(
            self.bodylog.as_deref(),
            &route,
            &self.registry,
            session,
            ctx,
        );
        request::forward(&route, session, &rest, &mut ctx.request).await
    }

    /// Model pool, load gates, a fork bound next to its parent, placement:
    /// the peer and its reserved slot, after a wait in the route's
    /// admission queue if it has one and no peer has room.
    async fn place(
        &self,
        session: &mut Session,
        route: &Arc<crate::registry::Route>,
        ctx: &mut RequestCtx,
    ) -> Result<(), Local> {
        let req = &mut ctx.request;
        req.pool = crate::balance::model_pool(route, req.model.as_deref())?;
        let req = &*req;
        let label = response::record::pool_label(route, req.model.as_deref());
        let turn = guards::prio::turn_of(route, session, req.json_object);
        self.load_gates(route, req, label, turn)?;
        ctx.phases.gated = ctx.phases.now();
        crate::balance::forks::start_near_parent(route, req.session.as_ref(), req.content.as_ref());
        let outcome = self.placement(session, route, req, label, turn).await?;
        record_placement(route, ctx, turn, outcome)
    }

    /// The TTFT and decode-rate gates on the request's pool (LLM requests
    /// only); a refused turn is counted in its bucket.
    fn load_gates(
        &self,
        route: &crate::registry::Route,
        req: &ctx::Admitted,
        label: &str,
        turn: Option<TurnBucket>,
    ) -> Result<(), Local> {
        if !req.json_object {
            return Ok(());
        }
        let healthy = crate::balance::candidates(route, &req.pool, crate::clock::now_ms());
        let gateway_rate_limit = self.registry.gateway().load_rate_limit;
        let model = req.model.as_deref();
        let class = req.tenant.as_ref().map(|t| t.class);
        let gates = guards::gates::check(
            route,
            label,
            model,
            healthy.len(),
            gateway_rate_limit,
            turn,
            class,
        );
        if let (Err(_), Some(t)) = (&gates, turn) {
            route.runtime.protection.count_turn(t, false);
        }
        Ok(gates?)
    }

    /// A peer with room, agreed with the other replicas, waiting in the
    /// admission queue when the route has one; a client that hangs up
    /// while queued leaves the queue at once.
    async fn placement(
        &self,
        session: &mut Session,
        route: &Arc<crate::registry::Route>,
        req: &ctx::Admitted,
        label: &str,
        turn: Option<TurnBucket>,
    ) -> Result<Result<Granted, Refused>, Local> {
        let demand = crate::balance::Demand {
            pool: &req.pool,
            label,
            session: req.session.as_ref(),
            tokens: request::body::estimated_tokens(&req.body),
            prefix: crate::balance::prefix::prefix_for(route, req.content.as_ref()),
            limits_on: route.rate_limit(self.registry.gateway().load_rate_limit).0,
            share: turn.map_or(1.0, |t| t.share),
            waited: std::time::Duration::ZERO,
            fair: (req.tenant.as_ref())
                .filter(|_| route.config.fair_queue())
                .map(|tag| (tag, self.registry.tenants().class_min_share())),
        };
        let store = self.registry.store();
        let waiting = crate::balance::shared::place_agreed(route, store, &demand);
        tokio::select! {
            outcome = waiting => Ok(outcome),
            _ = request::client_gone(session) => Err(Local::ClientGone),
        }
    }
}

/// What the placement decided, counted (the turn's bucket, the queue wait,
/// the placement by kind and reason) and kept in the request's context.
fn record_placement(
    route: &crate::registry::Route,
    ctx: &mut RequestCtx,
    turn: Option<TurnBucket>,
    outcome: Result<Granted, Refused>,
) -> Result<(), Local> {
    if let Some(t) = turn {
        route.runtime.protection.count_turn(t, outcome.is_ok());
    }
    let (placed, waited, admitted_charge) = match outcome {
        Ok(admitted) => (admitted.placed, admitted.waited, admitted.fair_charged),
        Err(refused) => {
            ctx.request.queued = refused.waited;
            record_queue_wait(route, refused.waited);
            return Err(refused.error.into());
        }
    };
    ctx.request.queued = waited;
    record_queue_wait(route, waited);
    if route.config.fair_queue() && ctx.request.tenant.is_some() {
        ctx.request.fair_charged = Some(admitted_charge);
    }
    let peer = &route.peers[placed.peer];
    peer.metrics
        .placements(
            route.name(),
            &peer.config.name,
            placed.placement.kind.as_str(),
            placed.placement.reason.map_or("none", |r| r.as_str()),
        )
        .inc();
    crate::balance::prefix::sent(route, ctx.request.content.as_ref(), placed.placement.peer);
    ctx.request.placement = Some(placed.placement);
    ctx.upstream.peer = Some(placed.peer);
    ctx.upstream.backlog_ahead = placed.slot.backlog_ahead();
    let mut slot = placed.slot;
    if !ctx.request.streamed {
        slot.not_streamed();
    }
    ctx.upstream.slot = Some(slot);
    ctx.phases.placed = ctx.phases.now();
    Ok(())
}

fn record_queue_wait(route: &crate::registry::Route, waited: Option<std::time::Duration>) {
    if let Some(waited) = waited {
        route
            .metrics
            .queue_wait(route.name())
            .observe(waited.as_secs_f64());
    }
}

#[async_trait]
impl ProxyHttp for Gateway {
    /// Boxed: Pingora holds the context by value in the request's future,
    /// in more than one of its nested states, and copies that future into
    /// a box per request: with the 576-byte context inline the copy was
    /// 1.7 KB longer than bare Pingora's. Boxed, the connection's task
    /// counts ~4 k instructions fewer a request (`benches/instructions.sh`).
    type CTX = Box<RequestCtx>;

    fn new_ctx(&self) -> Box<RequestCtx> {
        Box::new(RequestCtx::new())
    }

    async fn early_request_filter(
        &self,
        session: &mut Session,
        _: &mut Box<RequestCtx>,
    ) -> Result<()> {
        conn::head_complete(session);
        conn::serve_pipelined(session);
        Ok(())
    }

    async fn request_filter(
        &self,
        session: &mut Session,
        ctx: &mut Box<RequestCtx>,
    ) -> Result<bool> {
        match self.admit(session, ctx).await {
            Ok(()) => Ok(false),
            Err(local) => {
                response::local::respond(session, ctx, local).await;
                Ok(true)
            }
        }
    }

    async fn upstream_peer(
        &self,
        _: &mut Session,
        ctx: &mut Box<RequestCtx>,
    ) -> Result<Box<HttpPeer>> {
        ctx.phases.connecting = ctx.phases.now();
        upstream::next_peer(ctx)
    }

    fn fail_to_connect(
        &self,
        _: &mut Session,
        _: &HttpPeer,
        ctx: &mut Box<RequestCtx>,
        e: Box<Error>,
    ) -> Box<Error> {
        upstream::on_connect_failure(ctx, e)
    }

    /// Pingora's own retry policy (kept as is: never for a POST, whose body
    /// the engine may have acted on), plus the passive ban of a peer whose
    /// exchange broke.
    fn error_while_proxy(
        &self,
        peer: &HttpPeer,
        session: &mut Session,
        e: Box<Error>,
        ctx: &mut Box<RequestCtx>,
        client_reused: bool,
    ) -> Box<Error> {
        let e = conn::engine_silence(session, e);
        upstream::on_exchange_failure(ctx, &e, client_reused);
        let body_kept = !session.as_ref().retry_buffer_truncated();
        let stale = upstream::stale_reuse(ctx, &e, client_reused, body_kept);
        let mut e = e.more_context(format!("Peer: {peer}"));
        if stale {
            e.set_retry(true);
        } else if !session.req_header().method.is_idempotent() || !body_kept {
            e.set_retry(false);
        } else {
            e.retry.decide_reuse(client_reused);
        }
        e
    }

    async fn upstream_request_filter(
        &self,
        session: &mut Session,
        upstream: &mut RequestHeader,
        ctx: &mut Box<RequestCtx>,
    ) -> Result<()> {
        if let (true, Some(route)) = (ctx.request.engine_watched(), &ctx.route) {
            conn::watch_engine(session, route.config.timeouts.read);
        }
        upstream::rewrite_head(upstream, ctx)
    }

    async fn request_body_filter(
        &self,
        _: &mut Session,
        body: &mut Option<Bytes>,
        end_of_stream: bool,
        ctx: &mut Box<RequestCtx>,
    ) -> Result<()> {
        upstream::swap_body(body, end_of_stream, ctx);
        Ok(())
    }

    async fn response_filter(
        &self,
        _: &mut Session,
        resp: &mut ResponseHeader,
        ctx: &mut Box<RequestCtx>,
    ) -> Result<()> {
        ctx.upstream.responded = true;
        ctx.phases.engine_head = ctx.phases.now();
        ctx.upstream.error_status = !resp.status.is_success();
        response::headers::refuse_switch(resp.status, ctx)?;
        response::bodylog::response_head(ctx, &resp.headers);
        response::headers::edit_plain(resp, |head| {
            response::headers::prepare_pipeline(head, ctx)?;
            // After the X-Routed set, whose one reservation has room for it.
            response::headers::insert_routed(&mut head.headers, ctx, Origin::Upstream)?;
            response::headers::insert_request_id(&mut head.headers, ctx)
        })
    }

    fn response_body_filter(
        &self,
        _: &mut Session,
        body: &mut Option<Bytes>,
        end_of_stream: bool,
        ctx: &mut Box<RequestCtx>,
    ) -> Result<Option<std::time::Duration>> {
        response::bodylog::tee(ctx, body.as_ref());
        let first = ctx.response.pipeline.as_mut().and_then(|pipeline| {
            pipeline.process(body, end_of_stream);
            pipeline.first_content_at()
        });
        if let Some(first) = first {
            let started = ctx.upstream.slot.as_mut().and_then(|s| s.first_token());
            if let Some(cold_tokens) = started {
                response::record::learn_cold_start(ctx, cold_tokens, first);
            }
        }
        if end_of_stream {
            // Released before the last bytes are written, so a client that
            // sends its next request the moment it has them finds the slot
            // (and its tenant's place in flight) free (`logging` runs only
            // after the write). The tenant is settled first: the slot's
            // release wakes the queue, whose order reads its counter.
            response::record::settle_tenant(ctx);
            ctx.upstream.slot = None;
        }
        Ok(None)
    }

    /// A client that hangs up is logged at debug; a stream cut after its
    /// head was logged by `fail_to_proxy`, which says what the client got
    /// (Pingora's line names a 502 the client never saw). ERROR stays for
    /// failures someone should look at.
    fn suppress_error_log(&self, _: &Session, ctx: &Box<RequestCtx>, error: &Error) -> bool {
        let gone = errors::is_client_gone(error);
        if gone {
            log::debug!(
                "route {}: client went away: {}",
                ctx.route_name(),
                error.etype().as_str()
            );
        }
        gone || ctx.response.cut_logged
    }

    async fn fail_to_proxy(
        &self,
        session: &mut Session,
        e: &Error,
        ctx: &mut Box<RequestCtx>,
    ) -> FailToProxy {
        response::local::fail(session, e, ctx).await
    }

    /// What Pingora's own error lines say about the request: method, path
    /// and route only. The query string can carry a key (`?api_key=`) and
    /// the default summary's Host and full URI are the client's to keep.
    fn request_summary(&self, session: &Session, ctx: &Box<RequestCtx>) -> String {
        let req = session.req_header();
        format!(
            "{} {} route {} peer {}",
            req.method,
            req.uri.path(),
            ctx.route_name(),
            ctx.peer_name()
        )
    }

    async fn logging(&self, session: &mut Session, _e: Option<&Error>, ctx: &mut Box<RequestCtx>) {
        response::record::settle_tenant(ctx);
        ctx.upstream.slot = None;
        let ended = response::record::record(session, ctx);
        response::access::emit(
            self.access_log.as_deref(),
            self.exporter.as_deref(),
            &self.registry,
            session,
            ctx,
            &ended,
        );
        response::record::share_response(self.registry.store(), session, ctx);
        response::bodylog::emit(self.bodylog.as_deref(), session, ctx);
        conn::await_next_head(session);
    }
}
