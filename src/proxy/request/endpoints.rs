//! The answers a route gives itself, without an engine: its `/_…` status
//! endpoints and toggles, and `GET /v1/models` for a route with model pools.
//! Each returns `Err(Local)` with the answer when the request is one of
//! them, so the hook reads as one `?` per phase.

use super::Local;
use crate::admin::routes as endpoints;
use crate::errors::ErrorResponse;
use crate::proxy::guards::is_loopback_peer;
use crate::registry::{Registry, Route};
use pingora::proxy::Session;

/// A runtime control: a toggle, or a limit override.
type Control = fn(&Route, &str) -> Result<serde_json::Value, ErrorResponse>;

/// `/<route>/_…`: a read-only endpoint (no key), or a toggle or limit
/// override (POST from loopback only).
pub fn answer(
    route: &Route,
    registry: &Registry,
    session: &Session,
    rest: &str,
) -> Result<(), Local> {
    let control = match (
        endpoints::toggle_name(rest),
        endpoints::limit_override_name(rest),
    ) {
        (Some(name), _) => Some((name, endpoints::apply_toggle as Control)),
        (None, Some(name)) => Some((name, endpoints::apply_limit_override as Control)),
        _ => None,
    };
    if let Some((name, apply)) = control {
        if session.req_header().method != http::Method::POST {
            return Err(ErrorResponse::new(
                405,
                "method_not_allowed",
                format!("{name} takes POST"),
            )
            .into());
        }
        if !is_loopback_peer(session) {
            return Err(ErrorResponse::new(
                403,
                "forbidden",
                "toggles and overrides answer only 127.0.0.1 and ::1",
            )
            .into());
        }
        return Err(match apply(route, rest) {
            Ok(state) => Local::Json(200, state),
            Err(e) => e.into(),
        });
    }
    if !rest.starts_with("/_") {
        return Ok(());
    }
    let resets = rest
        .split_once('?')
        .is_some_and(|(_, query)| query.split('&').any(|kv| kv == "reset=1"));
    if resets && !is_loopback_peer(session) {
        return Err(ErrorResponse::new(
            403,
            "forbidden",
            "resetting counters answers only 127.0.0.1 and ::1",
        )
        .into());
    }
    Err(match endpoints::respond(route, registry, rest) {
        Some(value) => Local::Json(200, value),
        None => ErrorResponse::not_found(format!(
            "unknown endpoint; per-route endpoints: {}",
            endpoints::ENDPOINTS.join(", ")
        ))
        .into(),
    })
}

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
