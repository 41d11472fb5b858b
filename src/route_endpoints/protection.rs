//! The status endpoints of the route's protection: its 429s by gate
//! (`/_429_status`), the rate limit, the reject rules, the TTFT and decode
//! measurements and the adaptive limits (`/_ttft_status`, `/_tps_status`),
//! and the pools' in-flight averages (`/_cluster_avg`).

use crate::clock::now_ms;
use crate::registry::{Registry, Route};
use serde_json::{json, Value};

use super::switches::{limits_json, toggle_json};

pub(super) fn gate_counts_json(counts: &crate::protect::gate::GateCounts) -> Value {
    let mut by = serde_json::Map::new();
    for gate in crate::protect::gate::Gate::ALL {
        by.insert(gate.as_str().into(), json!(counts.get(gate)));
    }
    Value::Object(by)
}

pub(super) fn rate_limit_json(route: &Route, registry: &Registry) -> Value {
    let gateway = registry.gateway().load_rate_limit;
    let (on, source) = route.rate_limit(gateway);
    let (runtime, _) = route.runtime.toggles.rate_limit.effective(false);
    let runtime_set = route.runtime.toggles.rate_limit.effective(false).1 == "runtime";
    json!({
        "on": on,
        "source": source,
        "layers": {
            "runtime": runtime_set.then_some(runtime),
            "route": route.config.protection.load_rate_limit,
            "gateway": gateway,
        },
        "trips_while_off": gate_counts_json(route.runtime.protection.snapshot().trips_while_off),
    })
}

/// `/_429_status`: this route's 429s by gate, or with `all=1` every
/// route's; `reset=1` (loopback only, checked by the caller) zeroes them.
pub(super) fn status_429(route: &Route, registry: &Registry, query: &str) -> Value {
    let param = |key: &str| crate::query::flag(query, key);
    let snapshot = registry.snapshot();
    let routes: Vec<&std::sync::Arc<Route>> = if param("all") {
        let mut all: Vec<_> = snapshot.values().collect();
        all.sort_by(|a, b| a.name().cmp(b.name()));
        all
    } else {
        snapshot.get(route.name()).into_iter().collect()
    };
    let mut by_reason = serde_json::Map::new();
    for gate in crate::protect::gate::Gate::ALL {
        let n: u64 = routes
            .iter()
            .map(|r| r.runtime.protection.snapshot().refusals.get(gate))
            .sum();
        by_reason.insert(gate.as_str().into(), json!(n));
    }
    let out = json!({
        "scope": if param("all") { "all" } else { route.name() },
        "total": routes.iter().map(|r| r.runtime.protection.snapshot().refusals.total()).sum::<u64>(),
        "by_reason": by_reason,
        "by_route": routes.iter().map(|r| json!({
            "route": r.name(),
            "total": r.runtime.protection.snapshot().refusals.total(),
            "by_reason": gate_counts_json(r.runtime.protection.snapshot().refusals),
        })).collect::<Vec<_>>(),
        "rate_limit": rate_limit_json(route, registry),
    });
    if param("reset") {
        for r in &routes {
            r.runtime.protection.reset_counts();
        }
    }
    out
}

pub(super) fn reject_rules_status(route: &Route) -> Value {
    json!({
        "route": route.config.name,
        "enabled": toggle_json(&route.runtime.toggles.reject_rules, route.config.reject_rules_enabled),
        "configured_rules": route.config.reject_rules.configured(),
        "rules": route.config.reject_rules.status_json(),
    })
}

/// The TTFT and decode-rate EWMAs per pool and peer, with the histograms
/// of their samples (both endpoints show the same measurement).
pub(super) fn measurement_status(route: &Route, registry: &Registry) -> Value {
    let protection = &route.config.protection;
    let cfg = protection.meter;
    let now = now_ms();
    let snapshot = route.runtime.protection.snapshot();
    let meter = snapshot.meter;
    let series: Vec<Value> = meter
        .snapshot(cfg.ttl_ms, now)
        .into_iter()
        .map(|st| {
            let (r, ttft, tps) = (st.reading, st.ttft_histogram, st.tps_histogram);
            let (kind, name) = match st.scope {
                crate::protect::meter::Scope::Pool(p) => ("pool", p),
                crate::protect::meter::Scope::Peer(p) => ("peer", p),
            };
            json!({
                "scope": kind, "name": name,
                "ttft_ewma_ms": r.ttft_ms, "tps_ewma": r.tps,
                "ttft_ewmas_ms": folds_json(&cfg.ttft_folds, &r.ttft_all),
                "tps_ewmas": folds_json(&cfg.tps_folds, &r.tps_all),
                "ttft_window_samples": r.ttft_pending, "tps_window_samples": r.tps_pending,
                "ttft_histogram_ms": ttft.iter().map(|(le, n)| json!({"le": le, "count": n})).collect::<Vec<_>>(),
                "tps_histogram": tps.iter().map(|(le, n)| json!({"le": le, "count": n})).collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({
        "route": route.config.name,
        "window_ms": {"ttft": cfg.ttft_window_ms, "tps": cfg.tps_window_ms},
        "metrics": {
            "ttft": cfg.ttft_folds.as_slice().iter().map(|f| f.name()).collect::<Vec<_>>(),
            "tps": cfg.tps_folds.as_slice().iter().map(|f| f.name()).collect::<Vec<_>>(),
        },
        "alpha": cfg.alpha,
        "ttl_ms": cfg.ttl_ms,
        "tps_min_tokens": cfg.tps_min_tokens,
        "tps_min_decode_ms": cfg.tps_min_decode_ms,
        "nousage": meter.nousage(),
        "limits": limits_json(route),
        "switches": {
            "ttft": toggle_json(&route.runtime.toggles.ttft, true),
            "ttft_429": toggle_json(&route.runtime.toggles.ttft_429, true),
            "tps": toggle_json(&route.runtime.toggles.tps, true),
            "tps_429": toggle_json(&route.runtime.toggles.tps_429, true),
            "rate_limit": rate_limit_json(route, registry),
        },
        "adaptive_cc": adaptive_json(route),
        "probes": protection.probes,
        "probe_window_ms": protection.probe_window.as_millis() as u64,
        "series": series,
    })
}

/// Each pool's in-flight averaged over the last 5 minutes (10 × 30 s
/// buckets), with its limit: reported, not enforced.
pub(super) fn cluster_avg(route: &Route) -> Value {
    let now = now_ms();
    let mut avgs = route.runtime.cluster_avg.lock();
    let pools: Vec<Value> = route
        .pools()
        .into_iter()
        .map(|(label, pool)| {
            let (max, in_flight) = route.pool_load(&pool);
            let (avg, buckets) = avgs
                .get_mut(label)
                .map(|r| r.average(now))
                .unwrap_or_default();
            json!({
                "pool": label,
                "in_flight": in_flight,
                "avg_in_flight_5m": avg,
                "limit": route.adaptive_limit(label, &pool).unwrap_or(max),
                "buckets": buckets.iter().map(|(start, v)| json!({"start_ms": start, "avg": v})).collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({"route": route.name(), "window_s": 300, "bucket_s": 30, "pools": pools})
}

/// Every fold's EWMA by its name (one entry unless a metric table names more).
pub(super) fn folds_json(
    folds: &crate::protect::window::Folds,
    values: &crate::protect::window::Values,
) -> Value {
    let mut out = serde_json::Map::new();
    for (fold, v) in folds.as_slice().iter().zip(values) {
        out.insert(fold.name(), json!(v));
    }
    Value::Object(out)
}

/// Each pool's adaptive limit with its bounds, `null` when the route has
/// none.
pub(super) fn adaptive_json(route: &Route) -> Value {
    let Some(cfg) = route.config.protection.adaptive_on() else {
        return Value::Null;
    };
    let state = route.runtime.protection.adaptive_pools();
    let pools: Vec<Value> = route
        .pools()
        .into_iter()
        .map(|(label, pool)| {
            let (max, in_flight) = route.pool_load(&pool);
            let p = cfg.params(max);
            let s = state.get(label).copied().unwrap_or_default();
            json!({
                "pool": label,
                "limit": s.current.unwrap_or(p.init),
                "min": p.min, "init": p.init, "max": p.max,
                "in_flight": in_flight,
                "last_step": s.last_step.map(|st| format!("{st:?}").to_lowercase()),
                "hold_when_idle": p.hold_when_idle,
                "use_ttft": p.use_ttft,
            })
        })
        .collect();
    json!({"pools": pools})
}
