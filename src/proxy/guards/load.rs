//! The load gates: a pool whose measured TTFT has reached its limit, or
//! whose decode rate has fallen to its floor, refuses new requests with a
//! 429, except a few probes per window that keep the measurement alive so
//! the gate can reopen. Only LLM requests are gated; model lists and other
//! cheap calls pass.

use crate::clock::now_ms;
use crate::errors::ErrorResponse;
use crate::protect::gate::{Gate, ProbeBudget};
use crate::protect::limits::{Direction, Judged};
use crate::protect::meter::ScopeRef;
use crate::protect::prio::{grade, releases_turn1_hold, Grade};
use crate::proxy::guards::prio::TurnBucket;
use crate::registry::Route;
use std::sync::atomic::Ordering;

/// What the pool's gates see for this request.
struct View<'a> {
    route: &'a Route,
    pool: &'a str,
    turn: Option<TurnBucket>,
    now: u64,
}

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
    let view = View {
        route,
        pool,
        turn,
        now: now_ms(),
    };
    let Some((gate, judged)) = tripped(&view, model) else {
        return Ok(());
    };
    if admitted_past_trip(&view, gate, &judged) || !route.trip(gate, gateway_rate_limit) {
        return Ok(());
    }
    route
        .metrics
        .load_rejections(route.name(), gate.as_str())
        .inc();
    Err(refusal(route, pool, model, healthy, gate, &judged))
}

/// The first gate the pool's EWMAs trip (TTFT before decode rate), with
/// what it judged. With session priority a gate starts grading at its
/// first bucket's line, and a held turn 1 counts as a TTFT trip.
fn tripped(v: &View, model: Option<&str>) -> Option<(Gate, Judged)> {
    let route = v.route;
    let p = &route.config.protection;
    let t = &route.runtime.toggles;
    let reading = route
        .runtime
        .meter
        .reading(ScopeRef::Pool(v.pool), p.meter.ttl_ms, v.now);
    let overrides = &route.runtime.limit_overrides;
    let first_tol = match v.turn {
        Some(_) => p.session_prio.table.first().map_or(1.0, |b| b.tol),
        None => 1.0,
    };
    if t.ttft.is_on(true) && t.ttft_429.is_on(true) {
        let ttft = p.judge_ttft(&reading, model, overrides.ttft_ms.get(v.now));
        let prio = &route.runtime.prio;
        if v.turn.is_some() && releases_turn1_hold(ttft.ewma, ttft.limit, p.session_prio.release) {
            prio.hold_turn1.store(false, Ordering::Relaxed);
        }
        let held = v.turn.is_some_and(|t| t.bucket == 0) && prio.hold_turn1.load(Ordering::Relaxed);
        if held || ttft.tripped(Direction::Above, first_tol) {
            return Some((Gate::Ttft, ttft));
        }
    }
    // An adaptive route answers a slow decode rate with a lower limit, not
    // with decode-rate 429s.
    if t.tps.is_on(true) && t.tps_429.is_on(true) && p.adaptive.is_none() {
        let tps = p.judge_tps(&reading, overrides.tps.get(v.now))?;
        if tps.tripped(Direction::Below, first_tol) {
            return Some((Gate::Tps, tps));
        }
    }
    None
}

/// A tripped gate still lets a probe through; with session priority it
/// grades by bucket instead.
fn admitted_past_trip(v: &View, gate: Gate, judged: &Judged) -> bool {
    let p = &v.route.config.protection;
    let budget = v.route.runtime.meter.probe_budget(v.pool, gate.as_str());
    match v.turn {
        Some(t) => graded(v, &budget, gate, judged, t),
        None => budget.take(v.now, p.probe_window.as_millis() as u64, p.probes),
    }
}

/// A gate with session priority: open under the bucket's soft line; in the
/// soft zone or past the hard trip a warm turn needs a probe slot, turn 1
/// its own (smaller) budget, and only while the gate is really tripped, no
/// warm turn has probed this window and no hold is set. A turn 1 the TTFT
/// gate refuses sets the hold.
fn graded(v: &View, budget: &ProbeBudget, gate: Gate, judged: &Judged, t: TurnBucket) -> bool {
    let p = &v.route.config.protection;
    let prio = &p.session_prio;
    let state = &v.route.runtime.prio;
    let dir = match gate {
        Gate::Tps => Direction::Below,
        _ => Direction::Above,
    };
    let held = gate == Gate::Ttft && state.hold_turn1.load(Ordering::Relaxed);
    let pressure = judged.pressure(dir);
    if grade(pressure, &prio.table, t.bucket, prio.severe, held) == Grade::Open {
        return true;
    }
    let window = p.probe_window.as_millis() as u64;
    if t.bucket > 0 {
        return budget.take(v.now, window, p.probes);
    }
    let admitted = !held
        && judged.tripped(dir, 1.0)
        && budget.used(v.now, window) == 0
        && state.t1_probes.take(v.now, window, prio.t1_probes);
    if !admitted && gate == Gate::Ttft {
        state.hold_turn1.store(true, Ordering::Relaxed);
    }
    admitted
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
