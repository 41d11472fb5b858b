//! The Pingora `ProxyHttp` implementation. Hooks stay short and read like the
//! request's life; the decisions live in the modules they call.
//!
//! request_filter           route → body → session → pool → pick (→ replay the body)
//! upstream_peer            the pick; on a retry, the next untried ready peer
//! upstream_request_filter  Host, real Content-Length
//! request_body_filter      swap the replay placeholder for the real body
//! response_filter          X-Routed-* headers
//! response_body_filter     stream observation (usage tokens, TTFT)
//! logging                  metrics, release the in-flight slot

pub mod ctx;
pub mod guards;
pub mod replay;
pub mod request;

use crate::clock::now_ms;
use crate::errors::ErrorResponse;
use crate::metrics::metrics;
use crate::registry::Registry;
use async_trait::async_trait;
use bytes::Bytes;
use ctx::RequestCtx;
use pingora::http::ResponseHeader;
use pingora::prelude::HttpPeer;
use pingora::proxy::{FailToProxy, ProxyHttp, Session};
use pingora::{Error, ErrorSource, ErrorType, Result};
use request::Local;
use std::sync::Arc;

pub struct Gateway {
    pub registry: Arc<Registry>,
}

impl Gateway {
    pub fn new(registry: Arc<Registry>) -> Self {
        Gateway { registry }
    }

    /// Everything before proxying. `Ok(())` means: proxy the (replayed) request.
    async fn admit(&self, session: &mut Session, ctx: &mut RequestCtx) -> Result<(), Local> {
        let path = session
            .req_header()
            .uri
            .path_and_query()
            .map(|pq| pq.as_str().to_string())
            .unwrap_or_else(|| "/".into());
        let Some((name, rest)) = request::split_route(&path) else {
            return Err(ErrorResponse::not_found("requests go to /<route>/v1/...").into());
        };
        let route = self
            .registry
            .route(name)
            .ok_or_else(|| Local::Error(ErrorResponse::not_found_route(name)))?;
        ctx.route = Some(Arc::clone(&route));
        if let Some(name) = crate::admin::routes::toggle_name(&rest) {
            if session.req_header().method != http::Method::POST {
                return Err(ErrorResponse::new(
                    405,
                    "method_not_allowed",
                    format!("toggle {name} takes POST"),
                )
                .into());
            }
            if !guards::is_loopback_peer(session) {
                return Err(ErrorResponse::new(
                    403,
                    "forbidden",
                    "toggles answer only 127.0.0.1 and ::1",
                )
                .into());
            }
            return Err(match crate::admin::routes::apply_toggle(&route, &rest) {
                Ok(state) => Local::Json(200, state),
                Err(e) => e.into(),
            });
        }
        if rest.starts_with("/_") {
            return Err(
                match crate::admin::routes::respond(&route, &self.registry, &rest) {
                    Some(value) => Local::Json(200, value),
                    None => ErrorResponse::not_found(format!(
                        "unknown endpoint; per-route endpoints: {}",
                        crate::admin::routes::ENDPOINTS.join(", ")
                    ))
                    .into(),
                },
            );
        }
        if !rest.starts_with("/v1/") {
            return Err(ErrorResponse::not_found(format!(
                "route {name:?} serves /{name}/v1/...; {rest:?} is not an endpoint"
            ))
            .into());
        }
        guards::check_api_key(&route, &self.registry, session)?;
        let has_model_pools = !route.config.peers_by_model.is_empty();
        if has_model_pools
            && rest == "/v1/models"
            && session.req_header().method == http::Method::GET
        {
            return Err(Local::Json(200, models_list(&route)));
        }

        if request::has_body(session) {
            ctx.body = request::read_body(session, route.config.max_body_size).await?;
            ctx.body_read = true;
        }
        if request::is_llm_endpoint(&rest) {
            ctx.json = Some(request::parse_llm_body(&ctx.body)?);
        } else if has_model_pools && !ctx.body.is_empty() {
            // Other endpoints (embeddings, ...) still need their model's pool.
            ctx.json = serde_json::from_slice(&ctx.body).ok();
        }

        if let Some(json) = &ctx.json {
            guards::check_reject_rules(&route, json, ctx.body.len())?;
            if let Some(rewritten) = guards::inject_usage(&route, &ctx.body, json) {
                ctx.body = rewritten;
                ctx.usage_injected = true;
            }
        }
        let model = ctx
            .json
            .as_ref()
            .and_then(|j| j.get("model"))
            .and_then(|m| m.as_str());
        ctx.pool = crate::balance::model_pool(&route, model)?;
        ctx.session = crate::session::extract_session(
            &session.req_header().headers,
            &route.config.balancing.session_headers,
            ctx.json.as_ref(),
        );
        let placed = crate::balance::place(&route, &ctx.pool, ctx.session.as_ref())?;
        metrics()
            .placements
            .with_label_values(&[
                route.name(),
                &route.peers[placed.peer].config.name,
                placed.placement.kind.as_str(),
                placed.placement.reason.map_or("none", |r| r.as_str()),
            ])
            .inc();
        ctx.peer = Some(placed.peer);
        ctx.slot = Some(placed.slot);
        ctx.decision = Some(placed.placement);

        let uri = rest
            .parse::<http::Uri>()
            .map_err(|_| Local::Error(ErrorResponse::bad_request("invalid request path")))?;
        session.req_header_mut().set_uri(uri);
        if ctx.body_read && !ctx.body.is_empty() {
            if session.as_downstream().is_http2() {
                // h2c is not offered on the listener; refuse rather than hang.
                return Err(ErrorResponse::new(
                    505,
                    "http_version_not_supported",
                    "request bodies need HTTP/1.1",
                )
                .into());
            }
            replay::replay_h1(session).await.map_err(|e| {
                Local::Error(ErrorResponse::new(
                    500,
                    "internal_error",
                    format!("body replay failed: {e}"),
                ))
            })?;
        }
        Ok(())
    }

    async fn respond_local(&self, session: &mut Session, ctx: &mut RequestCtx, local: Local) {
        let (status, body, retry_after) = match local {
            Local::Error(e) => (e.status, e.body(), e.retry_after),
            Local::Json(status, value) => {
                let mut bytes = serde_json::to_vec(&value).unwrap_or_default();
                bytes.push(b'\n');
                (status, Bytes::from(bytes), None)
            }
        };
        ctx.local_status = Some(status);
        // The peer slot is not needed for a local answer.
        ctx.slot = None;
        if !ctx.body_read && request::has_body(session) {
            // Refused before its body was read (e.g. 401): rather than drain
            // an unknown amount of upload, close after answering.
            session.set_keepalive(None);
        }
        if let Err(e) = write_json(session, status, body, retry_after).await {
            log::debug!("could not write local response: {e}");
        }
    }

    fn build_peer(&self, ctx: &RequestCtx) -> Result<Box<HttpPeer>> {
        let (Some(route), Some(i)) = (&ctx.route, ctx.peer) else {
            return Error::e_explain(ErrorType::InternalError, "no peer chosen");
        };
        let p = &route.peers[i];
        let Some(addr) = p.addr else {
            return Error::e_explain(
                ErrorType::ConnectNoRoute,
                format!("peer {} has no address", p.config.name),
            );
        };
        let mut peer = HttpPeer::new(addr, false, String::new());
        let t = &route.config.timeouts;
        peer.options.connection_timeout = Some(t.connect);
        peer.options.read_timeout = Some(t.read);
        peer.options.idle_timeout = Some(t.idle);
        Ok(Box::new(peer))
    }
}

/// `GET /v1/models` of a route with model pools, answered from its config.
fn models_list(route: &crate::registry::Route) -> serde_json::Value {
    let data: Vec<serde_json::Value> = route
        .config
        .peers_by_model
        .iter()
        .map(|(m, _)| serde_json::json!({"id": m, "object": "model", "owned_by": "llm-gateway"}))
        .collect();
    serde_json::json!({"object": "list", "data": data})
}

/// Writes a complete JSON response the gateway answers itself.
pub async fn write_json(
    session: &mut Session,
    status: u16,
    body: Bytes,
    retry_after: Option<u32>,
) -> Result<()> {
    let mut resp = ResponseHeader::build(status, Some(4))?;
    resp.insert_header("content-type", "application/json")?;
    resp.insert_header("content-length", body.len().to_string())?;
    if let Some(secs) = retry_after {
        resp.insert_header("retry-after", secs.to_string())?;
    }
    session.write_response_header(Box::new(resp), false).await?;
    session.write_response_body(Some(body), true).await
}

#[async_trait]
impl ProxyHttp for Gateway {
    type CTX = RequestCtx;

    fn new_ctx(&self) -> RequestCtx {
        RequestCtx::new()
    }

    async fn request_filter(&self, session: &mut Session, ctx: &mut RequestCtx) -> Result<bool> {
        match self.admit(session, ctx).await {
            Ok(()) => Ok(false),
            Err(local) => {
                self.respond_local(session, ctx, local).await;
                Ok(true)
            }
        }
    }

    async fn upstream_peer(
        &self,
        _session: &mut Session,
        ctx: &mut RequestCtx,
    ) -> Result<Box<HttpPeer>> {
        if ctx.attempts > 0 {
            // A retry: the previous attempt's slot goes back before the next pick.
            ctx.slot = None;
            let route = ctx
                .route
                .clone()
                .ok_or_else(|| Error::explain(ErrorType::InternalError, "retry without route"))?;
            match crate::balance::retry(&route, &ctx.pool, &ctx.tried) {
                Some((peer, slot)) => {
                    ctx.peer = Some(peer);
                    ctx.slot = Some(slot);
                }
                None => {
                    ctx.peer = None;
                    return Error::e_explain(
                        ErrorType::ConnectNoRoute,
                        "no untried ready peer left",
                    );
                }
            }
        }
        if let Some(p) = ctx.peer {
            ctx.tried.push(p);
        }
        ctx.attempts += 1;
        ctx.body_sent_this_attempt = false;
        self.build_peer(ctx)
    }

    fn fail_to_connect(
        &self,
        _session: &mut Session,
        _peer: &HttpPeer,
        ctx: &mut RequestCtx,
        mut e: Box<Error>,
    ) -> Box<Error> {
        if let (Some(route), Some(i)) = (&ctx.route, ctx.peer) {
            // Passive health check: a peer that refuses connections is not
            // ready until a probe (or the ban TTL) says otherwise.
            let p = &route.peers[i];
            p.state.ban(now_ms(), route.config.health.ban_ttl);
            log::warn!(
                "route {} peer {}: connect failed ({}), marked not ready",
                route.name(),
                p.config.name,
                e.etype().as_str()
            );
            ctx.last_upstream_error = Some(format!(
                "connect to {} failed: {}",
                p.config.name,
                e.etype().as_str()
            ));
            e.set_retry(crate::balance::has_untried_ready(
                route, &ctx.pool, &ctx.tried,
            ));
        }
        e
    }

    async fn upstream_request_filter(
        &self,
        _session: &mut Session,
        upstream: &mut pingora::http::RequestHeader,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        if let (Some(route), Some(i)) = (&ctx.route, ctx.peer) {
            let p = &route.peers[i].config;
            upstream.insert_header("host", format!("{}:{}", p.host, p.port))?;
        }
        if ctx.body_read {
            upstream.remove_header("transfer-encoding");
            upstream.insert_header("content-length", ctx.body.len().to_string())?;
        }
        Ok(())
    }

    async fn request_body_filter(
        &self,
        _session: &mut Session,
        body: &mut Option<Bytes>,
        _end_of_stream: bool,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        if !ctx.body_read {
            return Ok(());
        }
        // The replayed request carries only a placeholder; the real body goes
        // out once per attempt, whatever chunks pingora hands us.
        *body = if ctx.body_sent_this_attempt || ctx.body.is_empty() {
            None
        } else {
            ctx.body_sent_this_attempt = true;
            Some(ctx.body.clone())
        };
        Ok(())
    }

    async fn response_filter(
        &self,
        _session: &mut Session,
        resp: &mut ResponseHeader,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        if let Some(route) = &ctx.route {
            let handler = route
                .config
                .postprocess
                .filter(|_| route.runtime.toggles.postprocess.is_on(true));
            ctx.pipeline = crate::stream::ResponsePipeline::for_response(
                resp.status,
                &resp.headers,
                handler,
                ctx.usage_injected,
            );
            if ctx.pipeline.as_ref().is_some_and(|p| p.rewrites()) {
                // The body may change length: send it chunked.
                resp.remove_header("content-length");
                resp.insert_header("transfer-encoding", "chunked")?;
            }
        }
        let Some(route) = &ctx.route else {
            return Ok(());
        };
        if !route.config.routed_headers {
            return Ok(());
        }
        if let Some(sid) = &ctx.session {
            resp.insert_header("x-routed-session", sid.hex())?;
            resp.insert_header("x-routed-source", sid.source.as_str().to_string())?;
        }
        if let Some(decision) = ctx.decision {
            resp.insert_header("x-routed-mode", decision.kind.as_str())?;
        }
        resp.insert_header("x-routed-peer", ctx.peer_name().to_string())?;
        resp.insert_header(
            "x-routed-retries",
            ctx.attempts.saturating_sub(1).to_string(),
        )?;
        Ok(())
    }

    fn response_body_filter(
        &self,
        _session: &mut Session,
        body: &mut Option<Bytes>,
        end_of_stream: bool,
        ctx: &mut RequestCtx,
    ) -> Result<Option<std::time::Duration>> {
        if let Some(pipeline) = ctx.pipeline.as_mut() {
            pipeline.process(body, end_of_stream);
        }
        Ok(None)
    }

    /// A client that hangs up is routine (a cancelled completion, a load
    /// generator ending its run), not a gateway error: log it at debug and
    /// keep ERROR for failures someone should look at.
    fn suppress_error_log(&self, _session: &Session, ctx: &RequestCtx, error: &Error) -> bool {
        let client_gone = *error.esource() == ErrorSource::Downstream
            && matches!(
                error.etype(),
                ErrorType::ConnectionClosed | ErrorType::ReadError | ErrorType::WriteError
            );
        if client_gone {
            log::debug!(
                "route {}: client went away: {}",
                ctx.route_name(),
                error.etype().as_str()
            );
        }
        client_gone
    }

    async fn fail_to_proxy(
        &self,
        session: &mut Session,
        e: &Error,
        ctx: &mut RequestCtx,
    ) -> FailToProxy {
        let code = match e.etype() {
            ErrorType::HTTPStatus(code) => *code,
            _ => match e.esource() {
                ErrorSource::Downstream => match e.etype() {
                    ErrorType::ReadError | ErrorType::WriteError | ErrorType::ConnectionClosed => 0,
                    _ => 400,
                },
                ErrorSource::Upstream => 502,
                _ if ctx.attempts > 0 => 502,
                _ => 500,
            },
        };
        if code > 0 && session.response_written().is_none() {
            let err = match code {
                502 => {
                    let tried = ctx.tried.len();
                    let detail = ctx
                        .last_upstream_error
                        .clone()
                        .unwrap_or_else(|| e.to_string());
                    ErrorResponse::upstream_failed(format!(
                        "upstream failed after {tried} attempt(s): {detail}"
                    ))
                    .with("attempts", tried)
                }
                400 => ErrorResponse::bad_request(format!("bad request: {}", e.etype().as_str())),
                c => ErrorResponse::new(c, "internal_error", e.etype().as_str().to_string()),
            };
            ctx.local_status = Some(code);
            let _ = write_json(session, code, err.body(), err.retry_after).await;
        }
        ctx.slot = None;
        FailToProxy {
            error_code: code,
            can_reuse_downstream: false,
        }
    }

    async fn logging(&self, session: &mut Session, _e: Option<&Error>, ctx: &mut RequestCtx) {
        ctx.slot = None;
        let code = session
            .response_written()
            .map(|r| r.status.as_u16())
            .or(ctx.local_status)
            .unwrap_or(0);
        let m = metrics();
        let route = ctx.route_name();
        m.requests
            .with_label_values(&[route, ctx.peer_name(), itoa_status(code)])
            .inc();
        m.request_duration
            .with_label_values(&[route])
            .observe(ctx.started.elapsed().as_secs_f64());
        if let Some(pipeline) = &ctx.pipeline {
            let labels = [route, ctx.peer_name()];
            if let Some(u) = pipeline.usage() {
                m.prompt_tokens
                    .with_label_values(&labels)
                    .inc_by(u.prompt_tokens);
                m.cached_prompt_tokens
                    .with_label_values(&labels)
                    .inc_by(u.cached_tokens);
                m.completion_tokens
                    .with_label_values(&labels)
                    .inc_by(u.completion_tokens);
            }
            if let Some(first) = pipeline.first_content_at() {
                m.ttft
                    .with_label_values(&[route])
                    .observe(first.saturating_duration_since(ctx.started).as_secs_f64());
            }
        }
    }
}

/// Status codes as label values without a per-request allocation.
fn itoa_status(code: u16) -> &'static str {
    static TEXT: std::sync::LazyLock<Vec<String>> =
        std::sync::LazyLock::new(|| (0u16..600).map(|c| c.to_string()).collect());
    TEXT.get(code as usize)
        .map(String::as_str)
        .unwrap_or("other")
}
