//! Request guards that run before placement: API keys, content reject
//! rules, and the include_usage request rewrite.

use crate::auth::presented_key;
use crate::errors::ErrorResponse;
use crate::metrics::metrics;
use crate::registry::{Registry, Route};
use crate::reject::{rejection_body, RequestFacts};
use crate::stream::usage::inject_include_usage;
use bytes::Bytes;
use pingora::proxy::Session;

/// Toggles answer only a caller on this machine: the socket's peer address
/// must be exactly 127.0.0.1 or ::1. Headers (X-Forwarded-For, X-Real-IP,
/// Forwarded) are deliberately never consulted.
pub fn is_loopback_peer(session: &Session) -> bool {
    let Some(addr) = session.client_addr().and_then(|a| a.as_inet()) else {
        return false;
    };
    match addr.ip() {
        std::net::IpAddr::V4(ip) => ip == std::net::Ipv4Addr::LOCALHOST,
        std::net::IpAddr::V6(ip) => ip == std::net::Ipv6Addr::LOCALHOST,
    }
}

/// 401 unless the route's key file (or the shared one) is not configured
/// (fail-open, logged at every reload) or the request carries a known key.
pub fn check_api_key(
    route: &Route,
    registry: &Registry,
    session: &Session,
) -> Result<(), ErrorResponse> {
    let state = route.keys(registry);
    let Some(keys) = state.enforced() else {
        return Ok(());
    };
    let counter = &metrics().auth;
    match presented_key(&session.req_header().headers) {
        None => {
            counter
                .with_label_values(&[route.name(), "-", "missing"])
                .inc();
            Err(ErrorResponse::new(
                401,
                "unauthorized",
                "missing API key: send Authorization: Bearer <key>",
            ))
        }
        Some(key) => match keys.check(key) {
            Some(owner) => {
                counter
                    .with_label_values(&[route.name(), owner, "ok"])
                    .inc();
                Ok(())
            }
            None => {
                counter
                    .with_label_values(&[route.name(), "-", "invalid"])
                    .inc();
                Err(ErrorResponse::new(401, "unauthorized", "invalid API key"))
            }
        },
    }
}

/// The first matching content rule's refusal, if rules are on for the route.
pub fn check_reject_rules(
    route: &Route,
    body: &serde_json::Value,
    raw_len: usize,
) -> Result<(), ErrorResponse> {
    let enabled = route
        .runtime
        .toggles
        .reject_rules
        .is_on(route.config.reject_rules_enabled);
    let rules = &route.config.reject_rules;
    if !enabled || rules.is_empty() {
        return Ok(());
    }
    let Some(rule) = rules.evaluate(&RequestFacts { body, raw_len }) else {
        return Ok(());
    };
    metrics()
        .rejections
        .with_label_values(&[route.name(), &rule.name])
        .inc();
    let body = rejection_body(rule, route.name());
    let mut err = ErrorResponse::new(rule.status, "rejected_by_rule", rule.message.clone());
    if let Some(fields) = body.get("error").and_then(|e| e.as_object()) {
        for (k, v) in fields {
            if k != "type" && k != "message" {
                err = err.with(k, v.clone());
            }
        }
    }
    if rule.status == 429 || rule.status == 503 {
        err = err.retry_after(1);
    }
    Err(err)
}

/// Adds `stream_options.include_usage` to a streaming request that lacks it,
/// editing only the bytes needed. Returns the new body when it changed.
pub fn inject_usage(route: &Route, body: &Bytes, json: &serde_json::Value) -> Option<Bytes> {
    if !route
        .runtime
        .toggles
        .include_usage
        .is_on(route.config.include_usage)
    {
        return None;
    }
    if json.get("stream") != Some(&serde_json::Value::Bool(true)) {
        return None;
    }
    inject_include_usage(body, json).map(Bytes::from)
}
