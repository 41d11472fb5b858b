//! The load gates: a pool whose measured TTFT has reached its limit, or
//! whose decode rate has fallen to its floor, refuses new requests with a
//! 429, except a few probes per window that keep the measurement alive so
//! the gate can reopen. Only LLM requests are gated; model lists and other
//! cheap calls pass.

use crate::clock::now_ms;
use crate::errors::ErrorResponse;
use crate::metrics::metrics;
use crate::protect::gate::{tps_tripped, ttft_tripped, Gate};
use crate::protect::meter::Scope;
use crate::registry::Route;

///
/// `/_ttft_toggle` (`/_tps_toggle`) off takes a gate out; `/_ttft_429_toggle`
/// off keeps it measuring but never shedding; the rate-limit switch off lets
/// a trip through and counts it.
pub fn check(
    route: &Route,
    pool: &str,
    model: Option<&str>,
    healthy: usize,
    gateway_rate_limit: bool,
) -> Result<(), ErrorResponse> {
    let p = &route.config.protection;
    let t = &route.runtime.toggles;
    let now = now_ms();
    let reading = route
        .runtime
        .meter
        .reading(&Scope::Pool(pool.to_string()), p.meter.ttl_ms, now);
    let ttft_limit = p.ttft_limit_for(model);
    let ttft_on = t.ttft.is_on(true) && t.ttft_429.is_on(true);
    // An adaptive route answers a slow decode rate with a lower limit, not
    // with decode-rate 429s.
    let tps_on = t.tps.is_on(true) && t.tps_429.is_on(true) && p.adaptive.is_none();
    let tripped = if ttft_on && ttft_tripped(reading.ttft_ms, ttft_limit) {
        Some((Gate::Ttft, "ttft_limit", reading.ttft_ms, ttft_limit, "p80"))
    } else {
        match p.tps_limit_tps {
            Some(floor) if tps_on && tps_tripped(reading.tps, floor) => {
                Some((Gate::Tps, "tps_limit", reading.tps, floor, "p20"))
            }
            _ => None,
        }
    };
    let Some((gate, error_type, ewma, limit, metric)) = tripped else {
        return Ok(());
    };
    let budget = route.runtime.meter.probe_budget(pool, gate.as_str());
    if budget.take(now, p.probe_window.as_millis() as u64, p.probes) {
        return Ok(());
    }
    if !route.trip(gate, gateway_rate_limit) {
        return Ok(());
    }
    let gate = gate.as_str();
    metrics()
        .load_rejections
        .with_label_values(&[route.name(), gate])
        .inc();
    Err(ErrorResponse::new(
        429,
        error_type,
        format!(
            "route {:?} pool {pool:?} is over its {gate} limit",
            route.name()
        ),
    )
    .with("ewma", ewma)
    .with("limit", limit)
    .with("metric", metric)
    .with("model", model)
    .with("healthy_peers", healthy)
    .with("route", route.name())
    .retry_after(1))
}
