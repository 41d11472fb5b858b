//! The load gates: a pool whose measured TTFT has reached its limit, or
//! whose decode rate has fallen to its floor, refuses new requests with a
//! 429, except a few probes per window that keep the measurement alive so
//! the gate can reopen. Only LLM requests are gated; model lists and other
//! cheap calls pass.

use crate::clock::now_ms;
use crate::errors::ErrorResponse;
use crate::metrics::metrics;
use crate::protect::gate::ProbeBudget;
use crate::protect::gate::{tps_tripped, ttft_tripped, Gate};
use crate::protect::meter::Scope;
use crate::protect::prio::{releases_turn1_hold, ttft_grade, Grade};
use crate::proxy::guards::prio::TurnBucket;
use crate::registry::Route;
use std::sync::atomic::Ordering;

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
    turn: Option<TurnBucket>,
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
    // With session priority the TTFT gate is graded per bucket; the warmest
    // bucket's line is the hard trip, so it trips from the first bucket's.
    let ttft_line = match turn {
        Some(_) => ttft_limit * p.session_prio.table.first().map_or(1.0, |b| b.tol),
        None => ttft_limit,
    };
    if turn.is_some() && releases_turn1_hold(reading.ttft_ms, ttft_limit, p.session_prio.release) {
        route
            .runtime
            .prio
            .hold_turn1
            .store(false, Ordering::Relaxed);
    }
    let held = turn.is_some_and(|t| t.bucket == 0)
        && route.runtime.prio.hold_turn1.load(Ordering::Relaxed);
    let tripped = if ttft_on && (held || ttft_tripped(reading.ttft_ms, ttft_line)) {
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
    let window = p.probe_window.as_millis() as u64;
    let admitted = match (gate, turn) {
        (Gate::Ttft, Some(t)) => graded_ttft(route, &budget, reading.ttft_ms, ttft_limit, t, now),
        _ => budget.take(now, window, p.probes),
    };
    if admitted {
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

/// The TTFT gate with session priority: open under the bucket's soft line;
/// in the soft zone or past the hard trip a warm turn needs a probe slot,
/// turn 1 its own (smaller) budget, and only while no warm turn has probed
/// this window and no hold is set. A refused turn 1 sets the hold.
fn graded_ttft(
    route: &Route,
    budget: &ProbeBudget,
    ewma_ms: Option<f64>,
    limit_ms: f64,
    t: TurnBucket,
    now: u64,
) -> bool {
    let p = &route.config.protection;
    let prio = &p.session_prio;
    let state = &route.runtime.prio;
    let held = state.hold_turn1.load(Ordering::Relaxed);
    let grade = ttft_grade(ewma_ms, limit_ms, &prio.table, t.bucket, prio.severe, held);
    if grade == Grade::Open {
        return true;
    }
    let window = p.probe_window.as_millis() as u64;
    if t.bucket > 0 {
        return budget.take(now, window, p.probes);
    }
    let tripped = ewma_ms.is_some_and(|v| v >= limit_ms);
    let admitted = !held
        && tripped
        && budget.used(now, window) == 0
        && state.t1_probes.take(now, window, prio.t1_probes);
    if !admitted {
        state.hold_turn1.store(true, Ordering::Relaxed);
    }
    admitted
}
