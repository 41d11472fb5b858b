//! The load gates: a pool whose measured TTFT has reached its limit, or
//! whose decode rate has fallen to its floor, refuses new requests with a
//! 429, except a few probes per window that keep the measurement alive so
//! the gate can reopen. Only LLM requests are gated; model lists and other
//! cheap calls pass.

use crate::clock::now_ms;
use crate::errors::ErrorResponse;
use crate::protect::gate::Gate;
use crate::protect::limits::Judged;
use crate::protect::route::{GateRequest, Switches, TurnBucket};
use crate::registry::Route;

/// `/_ttft_toggle` (`/_tps_toggle`) off takes a gate out; `/_ttft_429_toggle`
/// off keeps it measuring but never shedding; the rate-limit switch off lets
/// a trip through and counts it. The judgement itself is the route's
/// protection's (`protect::route`).
pub fn check(
    route: &Route,
    pool: &str,
    model: Option<&str>,
    healthy: usize,
    gateway_rate_limit: bool,
    turn: Option<TurnBucket>,
    class: Option<usize>,
) -> Result<(), ErrorResponse> {
    let t = &route.runtime.toggles;
    let request = GateRequest {
        pool,
        model,
        turn,
        class,
        switches: Switches {
            ttft_sheds: t.ttft.is_on(true) && t.ttft_429.is_on(true),
            tps_sheds: t.tps.is_on(true) && t.tps_429.is_on(true),
        },
        now_ms: now_ms(),
    };
    let protection = &route.runtime.protection;
    let Some((gate, judged)) = protection.judge(&route.config.protection, &request) else {
        return Ok(());
    };
    if !route.trip(gate, gateway_rate_limit) {
        return Ok(());
    }
    route
        .metrics
        .load_rejections(route.name(), gate.as_str())
        .inc();
    Err(refusal(route, pool, model, healthy, gate, &judged))
}

fn refusal(
    route: &Route,
    pool: &str,
    model: Option<&str>,
    healthy: usize,
    gate: Gate,
    judged: &Judged,
) -> ErrorResponse {
    let error_type = match gate {
        Gate::Tps => "tps_limit",
        _ => "ttft_limit",
    };
    let name = gate.as_str();
    ErrorResponse::new(
        429,
        error_type,
        format!(
            "route {:?} pool {pool:?} is over its {name} limit",
            route.name()
        ),
    )
    .with("ewma", judged.ewma)
    .with("limit", judged.limit)
    .with("metric", judged.fold.name())
    .with("limit_source", judged.source.as_str())
    .with("model", model)
    .with("healthy_peers", healthy)
    .with("route", route.name())
    .retry_after(1)
}
