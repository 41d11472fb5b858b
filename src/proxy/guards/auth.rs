//! The API key check: the route's key file, else the shared one.

use crate::auth::presented_key;
use crate::errors::ErrorResponse;
use crate::metrics::metrics;
use crate::registry::{Registry, Route};
use pingora::proxy::Session;
use std::sync::Arc;

/// 401 unless the route's key file (or the shared one) is not configured
/// (fail-open, logged when the file's state changes) or the request carries a known key.
/// `Ok(Some(owner))`: the key's owner, the request's tenant; `Ok(None)`:
/// keys are off.
pub fn check(
    route: &Route,
    registry: &Registry,
    session: &Session,
) -> Result<Option<Arc<str>>, ErrorResponse> {
    check_with(&registry.keys_for(route), route.name(), session)
}

/// The same check for a gateway-wide endpoint (no route): the shared key
/// file, counted under route `-`.
pub fn check_shared(registry: &Registry, session: &Session) -> Result<(), ErrorResponse> {
    check_with(&registry.shared_keys(), "-", session).map(drop)
}

fn check_with(
    state: &crate::registry::KeyState,
    route_label: &str,
    session: &Session,
) -> Result<Option<Arc<str>>, ErrorResponse> {
    let Some(keys) = state.enforced() else {
        return Ok(None);
    };
    let counter = &metrics().auth;
    if keys.only_placeholders() {
        counter
            .with_label_values(&[route_label, "-", "invalid"])
            .inc();
        return Err(ErrorResponse::new(
            401,
            "unauthorized",
            "no key is accepted: the gateway's key file holds only the documented placeholder",
        ));
    }
    match presented_key(&session.req_header().headers) {
        None => {
            counter
                .with_label_values(&[route_label, "-", "missing"])
                .inc();
            Err(ErrorResponse::new(
                401,
                "unauthorized",
                "missing API key: send Authorization: Bearer <key>",
            ))
        }
        Some(key) => match keys.check(key) {
            Some(owner) => {
                counter.with_label_values(&[route_label, owner, "ok"]).inc();
                Ok(Some(Arc::clone(owner)))
            }
            None => {
                counter
                    .with_label_values(&[route_label, "-", "invalid"])
                    .inc();
                Err(ErrorResponse::new(401, "unauthorized", "invalid API key"))
            }
        },
    }
}

/// The owner of the key the request presents, when keys are enforced and
/// it is a known one (`check` let it through). Only the body log asks, and
/// only for the requests it records, so the common path hashes once.
pub fn owner(route: &Route, registry: &Registry, session: &Session) -> Option<String> {
    let state = registry.keys_for(route);
    let key = presented_key(&session.req_header().headers)?;
    state.enforced()?.check(key).map(|owner| owner.to_string())
}
