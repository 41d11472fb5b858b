//! Who the tenant is, and whether it may send this request now.
//!
//! The tenant is the API key's owner; where keys are off, the value of
//! gateway.yaml's `tenant_header` (llm-d's `x-gateway-inference-fairness-id`
//! unless set); else `default`. With keys on, the header is not read: a
//! client cannot spend another team's budget by naming it.
//!
//! Admission (`crate::tenants::Tenants::admit`) refuses a request over its
//! tenant's cap on requests in flight or over one of its budgets with a
//! 429 whose headers are OpenAI's (`x-ratelimit-limit-tokens`,
//! `-remaining-tokens`, `-reset-tokens` and the `-requests` trio, for the
//! limits the tenant has) and `Retry-After`.

use crate::budget::{Dimension, Standing};
use crate::config::tenants::name_problem;
use crate::errors::ErrorResponse;
use crate::proxy::ctx::Admitted;
use crate::registry::Registry;
use crate::tenants::{Reason, TenantRefusal, DEFAULT_TENANT};
use pingora::proxy::Session;
use std::sync::Arc;

/// The request's tenant: `owner` (its key's, when keys are on), else the
/// tenant header's value when it is a usable name, else `default`.
fn identify(owner: Option<Arc<str>>, registry: &Registry, session: &Session) -> Arc<str> {
    if let Some(owner) = owner {
        return owner;
    }
    let header = &registry.gateway().tenant_header;
    session
        .req_header()
        .headers
        .get(header)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|name| name_problem(name).is_none())
        .map_or_else(|| Arc::clone(&DEFAULT_TENANT), Arc::from)
}

/// Admits the request for its tenant (`owner`: its key's, from the key
/// check), charged its prompt's estimate and counted in flight until its
/// admission is dropped, or the tenant's 429. Without a tenants file, it
/// does nothing: nothing is enforced or counted, so the tenant is not even
/// looked for.
pub fn admit(
    owner: Option<Arc<str>>,
    registry: &Registry,
    session: &Session,
    req: &mut Admitted,
) -> Result<(), ErrorResponse> {
    let tenants = registry.tenants();
    if !tenants.tracked() {
        return Ok(());
    }
    let tenant = identify(owner, registry, session);
    let estimate = crate::proxy::request::body::estimated_tokens(&req.body);
    let now = crate::clock::now_ms();
    match tenants.admit(&tenant, estimate, now) {
        Ok(admission) => {
            req.tenant_admission = Some(admission);
            Ok(())
        }
        Err(refusal) => Err(refused(&refusal)),
    }
}

/// The 429 for `r`.
fn refused(r: &TenantRefusal) -> ErrorResponse {
    let (error_type, message, reset_ms) = match (r.reason, &r.budget) {
        (Reason::Budget(d), Some(b)) => (
            "tenant_rate_limit",
            format!(
                "tenant {:?} is over its {} per minute ({}); retry after {}",
                r.tenant,
                d.as_str(),
                b.limit,
                duration_text(b.reset_ms)
            ),
            b.reset_ms,
        ),
        _ => (
            "tenant_in_flight_limit",
            format!(
                "tenant {:?} has {} request(s) in flight, its cap",
                r.tenant,
                r.max_in_flight.unwrap_or(0)
            ),
            1000,
        ),
    };
    let mut e = ErrorResponse::new(429, error_type, message)
        .with("code", "rate_limit_exceeded")
        .with("tenant", &*r.tenant)
        .with("reason", r.reason.as_str())
        .retry_after(u32::try_from(reset_ms.div_ceil(1000).max(1)).unwrap_or(u32::MAX));
    if let Some(b) = &r.budget {
        e = e.with("limit", b.limit).with("remaining", b.remaining);
    }
    if let Some(cap) = r.max_in_flight.filter(|_| r.reason == Reason::InFlight) {
        e = e.with("limit", cap);
    }
    let requests = &r.standing[Dimension::Requests.index()];
    for (names, standing) in [
        (TOKEN_HEADERS, token_standing(r)),
        (REQUEST_HEADERS, Some(requests)),
    ] {
        let Some(st) = standing else { continue };
        let (Some(limit), Some(remaining)) = (st.limit, st.remaining) else {
            continue;
        };
        let reset = match &r.budget {
            Some(b) if b.dimension == st.dimension => b.reset_ms,
            _ => st.reset_ms,
        };
        let [limit_h, remaining_h, reset_h] = names;
        e = e
            .with_header(limit_h, limit.to_string())
            .with_header(remaining_h, remaining.to_string())
            .with_header(reset_h, duration_text(reset));
    }
    e
}

/// The token limit the `-tokens` headers tell: the one refused, else the
/// one with the least left (OpenAI has one token limit; a tenant here may
/// have three).
fn token_standing(r: &TenantRefusal) -> Option<&Standing> {
    if let Some(b) = r.budget.filter(|b| b.dimension.is_tokens()) {
        return r.standing.iter().find(|s| s.dimension == b.dimension);
    }
    r.standing
        .iter()
        .filter(|s| s.dimension.is_tokens() && s.limit.is_some())
        .min_by_key(|s| s.remaining)
}

/// OpenAI's limit, remaining and reset headers for its token limit.
const TOKEN_HEADERS: [&str; 3] = [
    "x-ratelimit-limit-tokens",
    "x-ratelimit-remaining-tokens",
    "x-ratelimit-reset-tokens",
];
/// ... and for its request limit.
const REQUEST_HEADERS: [&str; 3] = [
    "x-ratelimit-limit-requests",
    "x-ratelimit-remaining-requests",
    "x-ratelimit-reset-requests",
];

/// A wait as OpenAI writes its reset headers: `250ms`, `17s`, `1m5s`.
fn duration_text(ms: u64) -> String {
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let secs = ms.div_ceil(1000);
    match (secs / 60, secs % 60) {
        (0, s) => format!("{s}s"),
        (m, s) => format!("{m}m{s}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_are_written_as_openai_does() {
        assert_eq!(duration_text(0), "0ms");
        assert_eq!(duration_text(250), "250ms");
        assert_eq!(duration_text(1_000), "1s");
        assert_eq!(duration_text(16_200), "17s");
        assert_eq!(duration_text(60_000), "1m0s");
        assert_eq!(duration_text(65_000), "1m5s");
    }
}
