//! The answers the gateway gives itself, without an engine: the gateway-wide
//! `/_tenants` and `/_bodylog_…` endpoints (the latter also under each
//! route, as `/<route>/_bodylog_…`),
//! a route's `/_…` status endpoints and toggles, `/_route_inspect`, and
//! `GET /v1/models` for a route with model pools.
//! Each returns `Err(Local)` with the answer when the request is one of
//! them, so the hook reads as one `?` per phase.
//!
//! Who may ask: a toggle or limit override is a POST from loopback; a
//! status endpoint (and `/_route_inspect`) is open, needs a key, or
//! answers loopback only, as gateway.yaml's `status_endpoints` says, and
//! shows engine addresses to a loopback caller only. Status endpoints take
//! GET or HEAD (405 before they run), `/_route_inspect` POST (a body to
//! look at) or GET and HEAD (the headers alone). The answers
//! themselves are `route_endpoints.rs`'.

use super::Local;
use crate::bodylog::Bodylog;
use crate::config::StatusAccess;
use crate::errors::ErrorResponse;
use crate::proxy::guards::{auth, is_loopback_peer};
use crate::registry::{Registry, Route};
use crate::route_endpoints as endpoints;
use pingora::proxy::Session;

/// `/_tenants` (`tenants/status.rs`), `/_bodylog_status` and
/// `/_bodylog_toggle`: gateway-wide, so served at
/// the top of the main listener rather than under a route (no route name
/// starts with `_`, so neither can shadow one). Status is read like the
/// routes' status endpoints (`status_endpoints`); the toggle is POST from
/// loopback only.
pub fn answer_gateway(
    bodylog: Option<&Bodylog>,
    registry: &Registry,
    session: &Session,
) -> Result<(), Local> {
    let uri = &session.req_header().uri;
    let query = uri.query().unwrap_or("");
    if uri.path() == "/_tenants" {
        let local = status_allowed(None, registry, session)?;
        read_method(session, "/_tenants")?;
        let mut routes: Vec<_> = registry.snapshot().values().cloned().collect();
        routes.sort_by(|a, b| a.name().cmp(b.name()));
        let queues: Vec<crate::tenants::RouteQueue> = routes
            .iter()
            .filter(|r| !r.config.queue_timeout.is_zero() || r.config.fair_queue())
            .map(|r| crate::tenants::RouteQueue {
                route: r.name().to_string(),
                fair: r.config.fair_queue(),
                tenants: r.runtime.queue.fair_standings(),
            })
            .collect();
        let status = registry
            .tenants()
            .status_json(crate::clock::now_ms(), &queues);
        return Err(Local::Json(200, shown(status, local)));
    }
    bodylog_endpoint(bodylog, None, registry, session, uri.path(), query)
}

/// The body-log status and toggle, at the top (`route` None) or under a
/// route (`/<route>/_bodylog_…`, where the OpenResty gateway serves them
/// and probes written for it look): the same process-wide state either
/// way; under a route, a status read is allowed as the route's own are.
fn bodylog_endpoint(
    bodylog: Option<&Bodylog>,
    route: Option<&Route>,
    registry: &Registry,
    session: &Session,
    path: &str,
    query: &str,
) -> Result<(), Local> {
    match path {
        "/_bodylog_status" => {
            let local = status_allowed(route, registry, session)?;
            read_method(session, "/_bodylog_status")?;
            let status = bodylog.map_or_else(crate::bodylog::status_off, Bodylog::status_json);
            Err(Local::Json(200, shown(status, local)))
        }
        "/_bodylog_toggle" => {
            toggle_allowed(session, "bodylog")?;
            let Some(bodylog) = bodylog else {
                return Err(ErrorResponse::new(
                    409,
                    "not_configured",
                    "body logging has no listener (bodylog.listener or BODYLOG_LISTENER_HOST)",
                )
                .into());
            };
            Err(match bodylog.apply_toggle(query) {
                Ok(state) => Local::Json(200, state),
                Err(e) => ErrorResponse::bad_request(e).into(),
            })
        }
        _ => Ok(()),
    }
}

/// Toggles take POST, from a socket peer that is exactly 127.0.0.1 or ::1.
fn toggle_allowed(session: &Session, name: &str) -> Result<(), Local> {
    if session.req_header().method != http::Method::POST {
        return Err(
            ErrorResponse::method_not_allowed(format!("toggle {name} takes POST"), "POST").into(),
        );
    }
    if !is_loopback_peer(session) {
        return Err(
            ErrorResponse::new(403, "forbidden", "toggles answer only 127.0.0.1 and ::1").into(),
        );
    }
    Ok(())
}

/// Whether the caller may read a status endpoint (gateway.yaml
/// `status_endpoints`), and whether it is local (`Ok(true)`: it sees
/// engine addresses). `route` is None for a gateway-wide endpoint, whose
/// key is checked against the shared key file.
fn status_allowed(
    route: Option<&Route>,
    registry: &Registry,
    session: &Session,
) -> Result<bool, Local> {
    let local = is_loopback_peer(session);
    match registry.gateway().status_endpoints {
        StatusAccess::Open => {}
        _ if local => {}
        StatusAccess::Loopback => {
            return Err(ErrorResponse::new(
                403,
                "forbidden",
                "status endpoints answer only 127.0.0.1 and ::1 (status_endpoints: loopback)",
            )
            .into())
        }
        StatusAccess::Key => match route {
            Some(route) => {
                auth::check(route, registry, session)?;
            }
            None => auth::check_shared(registry, session)?,
        },
    }
    Ok(local)
}

/// A status answer as the caller may see it: whole for a local caller,
/// without addresses and paths for anyone else.
fn shown(mut value: serde_json::Value, local: bool) -> serde_json::Value {
    if !local {
        endpoints::redact_addresses(&mut value);
    }
    value
}

/// A runtime control: a toggle, or a limit override.
type Control = fn(&Route, &str) -> Result<serde_json::Value, ErrorResponse>;

/// `/<route>/_…`: a read-only endpoint (GET or HEAD; no key unless
/// `status_endpoints` says so), or a toggle or limit override (POST from
/// loopback only).
pub fn answer(
    route: &Route,
    registry: &Registry,
    bodylog: Option<&Bodylog>,
    session: &Session,
    rest: &str,
) -> Result<(), Local> {
    // Every toggle and status endpoint starts so; an API path (every
    // proxied request) leaves here without the name matching below.
    if !rest.starts_with("/_") {
        return Ok(());
    }
    let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
    bodylog_endpoint(bodylog, Some(route), registry, session, path, query)?;
    let control = match (
        endpoints::toggle_name(rest),
        endpoints::limit_override_name(rest),
    ) {
        (Some(name), _) => Some((name, endpoints::apply_toggle as Control)),
        (None, Some(name)) => Some((name, endpoints::apply_limit_override as Control)),
        _ => None,
    };
    if let Some((name, apply)) = control {
        toggle_allowed(session, name)?;
        return Err(match apply(route, rest) {
            Ok(state) => Local::Json(200, state),
            Err(e) => e.into(),
        });
    }
    let local = status_allowed(Some(route), registry, session)?;
    let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
    let Some(read) = endpoints::read_endpoint(path) else {
        return Err(ErrorResponse::not_found(format!(
            "unknown endpoint; per-route endpoints: {}",
            endpoints::ENDPOINTS.join(", ")
        ))
        .into());
    };
    read_method(session, path)?;
    if crate::query::flag(query, "reset") && !local {
        return Err(ErrorResponse::new(
            403,
            "forbidden",
            "resetting counters answers only 127.0.0.1 and ::1",
        )
        .into());
    }
    Err(Local::Json(200, shown(read(route, registry, query), local)))
}

/// A read endpoint serves GET and HEAD; any other method is refused (405)
/// before the endpoint runs, rather than answered as a GET: a client that
/// sent DELETE or POST meant something the endpoint does not do.
fn read_method(session: &Session, path: &str) -> Result<(), Local> {
    let method = &session.req_header().method;
    if *method == http::Method::GET || *method == http::Method::HEAD {
        return Ok(());
    }
    Err(ErrorResponse::method_not_allowed(
        format!("{path} is read with GET (or HEAD), not {method}"),
        endpoints::READ_METHODS,
    )
    .into())
}

/// `POST /<route>/_route_inspect` with a request's body and headers: its
/// session id (source and hash), model pool, active tier, and where the
/// route's mode would place it and why, computed by the same rules as a
/// real request and changing nothing (no binding, no slot, no counter).
/// `GET` (or `HEAD`) is the same look with the headers alone, as the
/// OpenResty gateway lists it among its read-only endpoints: no body is
/// read, a model pool is named by `?model=`.
pub async fn inspect(
    route: &Route,
    registry: &Registry,
    session: &mut Session,
    rest: &str,
) -> Result<(), Local> {
    let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
    if path != "/_route_inspect" {
        return Ok(());
    }
    let local = status_allowed(Some(route), registry, session)?;
    let method = &session.req_header().method;
    let with_body = *method == http::Method::POST;
    if !(with_body || *method == http::Method::GET || *method == http::Method::HEAD) {
        return Err(ErrorResponse::method_not_allowed(
            "_route_inspect takes POST with the request body to inspect, or GET (HEAD) to look at the headers alone",
            INSPECT_METHODS,
        )
        .into());
    }
    let body = match with_body {
        true => super::body::read_body(session, route.config.max_body_size).await?,
        false => bytes::Bytes::new(),
    };
    let headers = &session.req_header().headers;
    let named =
        crate::session::extract_session(headers, &route.config.balancing.session_headers, None);
    // The body is read as an LLM request, whatever its API: its
    // conversation's blocks are gathered the same way for all of them.
    let mut sink = super::session::sink_for(route, Some(crate::api::Api::Chat), named.is_some());
    let view = match body.is_empty() {
        true => None,
        false => Some(
            crate::request_view::RequestView::parse_into(&body, sink.as_mut()).map_err(|_| {
                ErrorResponse::bad_request("the body to inspect must be a JSON object")
            })?,
        ),
    };
    let mut sid = super::session::named(named, view.as_ref());
    if let Some(id) = sid
        .as_mut()
        .filter(|id| id.source == crate::session::SessionSource::BodyPreviousResponseId)
    {
        id.hash = super::session::known_response(route, id.hash).unwrap_or(id.hash);
    }
    let content = match sid {
        Some(_) => None,
        None => super::session::peek(route, sink),
    };
    let sid = sid.or_else(|| {
        content.map(|c| crate::session::SessionId {
            hash: c.session,
            source: crate::session::SessionSource::Content,
        })
    });
    let model = match with_body {
        true => view
            .as_ref()
            .and_then(|v| v.model())
            .map(|m| m.into_owned()),
        false => crate::query::param(query, "model").map(|m| m.into_owned()),
    };
    if !with_body && model.is_none() && !route.config.peers_by_model.is_empty() {
        return Err(ErrorResponse::bad_request(format!(
            "route {:?} has model pools: name one with ?model=",
            route.name()
        ))
        .into());
    }
    let pool = crate::balance::model_pool(route, model.as_deref())?;
    let now = crate::clock::now_ms();
    let candidates = crate::balance::candidates(route, &pool, now);
    if candidates.is_empty() {
        return Err(ErrorResponse::no_ready_peer(route.name()).into());
    }
    let tier = route.peers[candidates[0]].config.priority;
    let placement = match &sid {
        Some(sid) => crate::balance::explain(route, &pool, sid),
        None => serde_json::json!({
            "mode": route.config.balancing.mode.as_str(),
            "why": "no session id: the request goes to the least-loaded candidate",
        }),
    };
    let answer = serde_json::json!({
        "route": route.name(),
        "looked_at": if with_body { "headers and body" } else { "headers" },
        "session": sid.as_ref().map(|s| serde_json::json!({"hash": s.hex(), "source": s.source.as_str()})),
        "content": content.map(|c| serde_json::json!({
            "how": c.how.as_str(),
            "matched_blocks": c.matched,
            "blocks": c.blocks,
            "parent": match c.how {
                crate::session::content::How::Forked { parent } => Some(crate::hash::hex16(parent)),
                _ => None,
            },
        })),
        "model": model,
        "pool": pool.iter().map(|&i| route.peers[i].config.name.clone()).collect::<Vec<_>>(),
        "active_tier": tier,
        "candidates": candidates.iter().map(|&i| route.peers[i].config.name.clone()).collect::<Vec<_>>(),
        "mode": route.config.balancing.mode.as_str(),
        "placement": placement,
        "estimates": crate::balance::estimates(
            route,
            &pool,
            sid.as_ref(),
            super::body::estimated_len(body.len()),
            crate::balance::prefix::prefix_for(route, content.as_ref()),
        ),
        "transforms": crate::route_endpoints::preview(route, &body),
    });
    Err(Local::Json(200, shown(answer, local)))
}

/// What `/_route_inspect` serves, as its 405's `Allow` lists them.
const INSPECT_METHODS: &str = "GET, HEAD, POST";

/// `GET /v1/models` of a route with model pools, answered from its config
/// (the engines each know only their own model).
pub fn answer_models(route: &Route, session: &Session, rest: &str) -> Result<(), Local> {
    let pools = &route.config.peers_by_model;
    if pools.is_empty() || rest != "/v1/models" || session.req_header().method != http::Method::GET
    {
        return Ok(());
    }
    let data: Vec<serde_json::Value> = pools
        .iter()
        .map(|(m, _)| serde_json::json!({"id": m, "object": "model", "owned_by": "llm-gateway"}))
        .collect();
    Err(Local::Json(
        200,
        serde_json::json!({"object": "list", "data": data}),
    ))
}
