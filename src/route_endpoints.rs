//! Per-route endpoints on the main listener, `/<route>/_…`: dispatched by
//! `proxy/request/endpoints.rs`, and read by the admin listener's
//! dashboard too, which is why they live outside `proxy`.
//! The status endpoints report state and change nothing (`/_route_debug`
//! explains a placement without making it); the toggles and the limit
//! overrides (loopback only, checked by the caller) set the route's
//! runtime switches. No raw session id is ever echoed: only its hash.

use crate::balance;
use crate::clock::now_ms;
use crate::errors::ErrorResponse;
use crate::registry::{Registry, Route, Toggle, TOGGLE_NAMES};
use crate::session::extract_session;
use serde_json::{json, Value};

pub const ENDPOINTS: &[&str] = &[
    "/_route_state",
    "/_health_status",
    "/_active_conns",
    "/_route_debug?sid=…",
    "/_sessions",
    "/_reject_rules_status",
    "/_ttft_status",
    "/_tps_status",
    "/_429_status[?all=1][&reset=1]",
    "/_rate_limit_status",
    "/_session_status",
    "/_route_opts",
    "/_cluster_avg",
    "POST /_route_inspect (a request body and headers: where it would go and why)",
    "POST /_reject_rules_toggle?on=0|1|reset=1",
    "POST /_include_usage_toggle?on=0|1|reset=1",
    "POST /_postprocess_toggle?on=0|1|reset=1",
    "POST /_cch_strip_toggle?on=0|1|reset=1, /_kimi_normalize_toggle?on=0|1|reset=1",
    "POST /_ttft_toggle, /_ttft_429_toggle, /_tps_toggle, /_tps_429_toggle, /_rate_limit_toggle, /_session_prio_toggle ?on=0|1|reset=1",
    "POST /_ttft_limit?ms=N[&ttl=S]|reset=1, /_tps_limit?tps=N[&ttl=S]|reset=1",
];

/// `/_ttft_limit`, `/_tps_limit` → which limit a runtime override sets.
pub fn limit_override_name(path: &str) -> Option<&'static str> {
    match path.split('?').next()? {
        "/_ttft_limit" => Some("ttft"),
        "/_tps_limit" => Some("tps"),
        _ => None,
    }
}

/// Sets (`?ms=` / `?tps=`, with `&ttl=` in seconds or as a duration,
/// default two hours) or clears (`?reset=1`) a runtime limit override.
/// The caller has already checked that the request came from loopback.
pub fn apply_limit_override(route: &Route, path_and_query: &str) -> Result<Value, ErrorResponse> {
    let name = limit_override_name(path_and_query)
        .ok_or_else(|| ErrorResponse::not_found("unknown limit"))?;
    let (o, key) = match name {
        "ttft" => (&route.runtime.protection.overrides().ttft_ms, "ms"),
        _ => (&route.runtime.protection.overrides().tps, "tps"),
    };
    let query = path_and_query.split_once('?').map(|(_, q)| q).unwrap_or("");
    let param = |k: &str| crate::query::param(query, k);
    let now = now_ms();
    match (param(key).as_deref(), param("reset").as_deref()) {
        (_, Some("1")) => o.clear(),
        (Some(v), _) => {
            let value = v
                .parse::<f64>()
                .ok()
                .filter(|v| v.is_finite() && *v > 0.0)
                .ok_or_else(|| {
                    ErrorResponse::bad_request(format!("{key} must be a positive number"))
                })?;
            let ttl = match param("ttl").as_deref() {
                None => {
                    std::time::Duration::from_secs(crate::protect::limits::DEFAULT_OVERRIDE_TTL_S)
                }
                Some(t) => crate::config::units::parse_duration(t)
                    .ok()
                    .filter(|d| !d.is_zero())
                    .ok_or_else(|| {
                        ErrorResponse::bad_request("ttl must be seconds or a duration (90s, 2h)")
                    })?,
            };
            o.set(value, now.saturating_add(ttl.as_millis() as u64));
        }
        _ => {
            return Err(ErrorResponse::bad_request(format!(
                "use ?{key}=N[&ttl=S] or ?reset=1"
            )))
        }
    }
    Ok(
        json!({"route": route.config.name, "limit": name, "state": limits_json(route)[name].clone()}),
    )
}

/// The limits in force for the route's default model, where each comes
/// from, and the runtime overrides with their expiry.
fn limits_json(route: &Route) -> Value {
    let p = &route.config.protection;
    let now = now_ms();
    let o = route.runtime.protection.overrides();
    let reading = crate::protect::meter::Reading::default();
    let override_json = |ov: &crate::protect::limits::Override| match ov.get(now) {
        Some(v) => {
            json!({"value": v, "expires_in_s": ov.expires_ms(now).map(|e| e.saturating_sub(now) / 1000)})
        }
        None => Value::Null,
    };
    let table_json = |t: &Option<Vec<crate::protect::limits::MetricLimit>>| match t {
        Some(t) => json!(t
            .iter()
            .map(|m| json!({"metric": m.fold.name(), "threshold": m.threshold}))
            .collect::<Vec<_>>()),
        None => Value::Null,
    };
    let ttft = p.judge_ttft(&reading, None, o.ttft_ms.get(now));
    let tps = p.judge_tps(&reading, o.tps.get(now));
    json!({
        "ttft": {
            "limit_ms": (p.ttft_metrics.is_none()).then_some(ttft.limit),
            "source": ttft.source.as_str(),
            "metric_table": table_json(&p.ttft_metrics),
            "override": override_json(&o.ttft_ms),
            "static_ms": p.ttft_limit_ms,
            "by_model": p.ttft_limit_by_model.iter().map(|(m, l)| json!({"model": m, "limit_ms": l})).collect::<Vec<_>>(),
        },
        "tps": {
            "floor": tps.filter(|_| p.tps_metrics.is_none()).map(|j| j.limit),
            "source": tps.map(|j| j.source.as_str()),
            "metric_table": table_json(&p.tps_metrics),
            "override": override_json(&o.tps),
            "static": p.tps_limit_tps,
        },
    })
}

/// `/_<name>_toggle` → the toggle's name.
pub fn toggle_name(path: &str) -> Option<&str> {
    let name = path
        .split('?')
        .next()?
        .strip_prefix("/_")?
        .strip_suffix("_toggle")?;
    TOGGLE_NAMES.contains(&name).then_some(name)
}

/// Applies `?on=0|1` or `?reset=1` to the named toggle and reports the result.
/// The caller has already checked that the request came from loopback.
pub fn apply_toggle(route: &Route, path_and_query: &str) -> Result<Value, ErrorResponse> {
    let name =
        toggle_name(path_and_query).ok_or_else(|| ErrorResponse::not_found("unknown toggle"))?;
    let toggle = route
        .runtime
        .toggles
        .by_name(name)
        .ok_or_else(|| ErrorResponse::not_found("unknown toggle"))?;
    let query = path_and_query.split_once('?').map(|(_, q)| q).unwrap_or("");
    let param = |key: &str| crate::query::param(query, key);
    match (param("on").as_deref(), param("reset").as_deref()) {
        (_, Some("1")) => toggle.reset(),
        (Some("1"), _) => toggle.set(true),
        (Some("0"), _) => toggle.set(false),
        _ => return Err(ErrorResponse::bad_request("use ?on=0, ?on=1 or ?reset=1")),
    }
    Ok(
        json!({"route": route.config.name, "toggle": name, "state": toggles_json(route)[name].clone()}),
    )
}

fn toggle_json(toggle: &Toggle, configured: bool) -> Value {
    let (on, source) = toggle.effective(configured);
    json!({"on": on, "source": source, "configured": configured})
}

fn toggles_json(route: &Route) -> Value {
    let t = &route.runtime.toggles;
    let c = &route.config;
    let mut postprocess = toggle_json(&t.postprocess, c.postprocess.is_some());
    postprocess["handler"] = json!(c.postprocess.map(|h| h.name()));
    json!({
        "reject_rules": toggle_json(&t.reject_rules, c.reject_rules_enabled),
        "include_usage": toggle_json(&t.include_usage, c.include_usage),
        "postprocess": postprocess,
        "ttft": toggle_json(&t.ttft, true),
        "ttft_429": toggle_json(&t.ttft_429, true),
        "tps": toggle_json(&t.tps, true),
        "tps_429": toggle_json(&t.tps_429, true),
        "cch_strip": toggle_json(&t.cch_strip, c.cch_strip),
        "kimi_normalize": toggle_json(&t.kimi_normalize, c.kimi_normalize),
    })
}

/// What the route's prefix-stability transforms would change in `body`,
/// with the toggles in force: for `/_route_inspect`, which shows what the
/// gateway does to a body without sending it anywhere.
pub fn preview(route: &Route, body: &[u8]) -> Value {
    let t = &route.runtime.toggles;
    let c = &route.config;
    let mut out = crate::rewrite::preview(body, route.prefix_transforms());
    out["route"] = json!(c.name);
    out["cch_strip"] = toggle_json(&t.cch_strip, c.cch_strip);
    out["kimi_normalize"] = toggle_json(&t.kimi_normalize, c.kimi_normalize);
    out
}

fn gate_counts_json(counts: &crate::protect::gate::GateCounts) -> Value {
    let mut by = serde_json::Map::new();
    for gate in crate::protect::gate::Gate::ALL {
        by.insert(gate.as_str().into(), json!(counts.get(gate)));
    }
    Value::Object(by)
}

fn rate_limit_json(route: &Route, registry: &Registry) -> Value {
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
fn status_429(route: &Route, registry: &Registry, query: &str) -> Value {
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

fn reject_rules_status(route: &Route) -> Value {
    json!({
        "route": route.config.name,
        "enabled": toggle_json(&route.runtime.toggles.reject_rules, route.config.reject_rules_enabled),
        "configured_rules": route.config.reject_rules.configured(),
        "rules": route.config.reject_rules.status_json(),
    })
}

/// The JSON for `path` (query included) under `route`, or None if unknown.
/// Keys whose values say where something runs: engine `host:port`s (in
/// `/_route_state` and `/_route_opts`), the body-log listener and its last
/// connect error (`/_bodylog_status`), a store URL.
// `dns` and `api`: where `peers_from` finds its engines;
// `service_account_dir`: where its credentials lie on the host.
const ADDRESS_KEYS: [&str; 9] = [
    "address",
    "host",
    "port",
    "target",
    "last_error",
    "url",
    "dns",
    "api",
    "service_account_dir",
];
/// `/_route_opts` options whose value is a file path.
const PATH_OPTIONS: [&str; 2] = ["api_keys_file", "engine_api_key_file"];

/// Replaces every address and file path in an endpoint's answer with
/// `"[redacted]"`, for callers not on this machine: they may see how a
/// route behaves (peers by name, load, sessions, limits), not where its
/// engines are or how the host is laid out.
pub fn redact_addresses(value: &mut Value) {
    match value {
        Value::Object(map) => {
            let path_option = map
                .get("key")
                .and_then(Value::as_str)
                .is_some_and(|k| PATH_OPTIONS.contains(&k));
            for (key, v) in map.iter_mut() {
                let hides = ADDRESS_KEYS.contains(&key.as_str()) || (path_option && key == "value");
                if hides && !v.is_null() {
                    *v = Value::String("[redacted]".into());
                } else {
                    redact_addresses(v);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(redact_addresses),
        _ => {}
    }
}

/// A read endpoint: its answer from the route, the registry and the query
/// string ("" when none).
pub type Read = fn(&Route, &Registry, &str) -> Value;

/// The methods every read endpoint serves, as a 405's `Allow` lists them.
pub const READ_METHODS: &str = "GET, HEAD";

/// The read endpoint at `path` (no query), or None when there is none.
/// Looked up before anything is computed, so that a caller can be refused
/// (a method it does not serve) without the endpoint having run: some
/// answers change state (`/_429_status?reset=1`).
pub fn read_endpoint(path: &str) -> Option<Read> {
    let read: Read = match path {
        "/_route_state" => |r, g, _| route_state(r, g),
        "/_health_status" => |r, g, _| health_status(r, g),
        "/_reject_rules_status" => |r, _, _| reject_rules_status(r),
        "/_active_conns" => |r, _, _| active_conns(r),
        "/_sessions" => |r, _, _| sessions(r),
        "/_route_debug" => |r, _, q| route_debug(r, q),
        "/_ttft_status" | "/_tps_status" => |r, g, _| measurement_status(r, g),
        "/_429_status" => status_429,
        "/_session_status" => |r, _, _| session_status(r),
        "/_route_opts" => |r, _, _| route_opts(r),
        "/_cluster_avg" => |r, _, _| cluster_avg(r),
        "/_rate_limit_status" => |r, g, _| {
            json!({
                "route": r.config.name,
                "rate_limit": rate_limit_json(r, g),
            })
        },
        _ => return None,
    };
    Some(read)
}

/// The answer of the read endpoint at `path_and_query`, if there is one.
pub fn respond(route: &Route, registry: &Registry, path_and_query: &str) -> Option<Value> {
    let (path, query) = path_and_query
        .split_once('?')
        .unwrap_or((path_and_query, ""));
    read_endpoint(path).map(|read| read(route, registry, query))
}

/// The last scrape as read; `fresh` is whether placement uses it (the
/// decision `Route::peer_loads` made, not a second computation of it).
fn peer_engine_json(route: &Route, i: usize, fresh: bool, now: u64) -> Value {
    match route.peers[i].state.engine_sample() {
        Some(s) => json!({
            "waiting": s.load.waiting,
            "running": s.load.running,
            "kv_usage": s.load.kv_usage,
            "age_ms": now.saturating_sub(s.read_at_ms),
            "fresh": fresh,
        }),
        None => Value::Null,
    }
}

/// The session store: local, or Redis with whether it answers and this
/// replica's id in the shared load keys.
fn store_json(registry: &Registry) -> Value {
    let store = registry.store();
    match store.redis() {
        None => json!({"kind": "local"}),
        Some(r) => json!({
            "kind": "redis",
            "up": r.is_up(),
            "replica": r.replica,
            "timeout_ms": r.timeout().as_millis() as u64,
            "ops": r.ops(),
        }),
    }
}

fn route_state(route: &Route, registry: &Registry) -> Value {
    let now = now_ms();
    let all: Vec<usize> = (0..route.peers.len()).collect();
    let loads = balance::peer_loads(route, &all, now);
    let sessions = route.sessions_per_peer();
    let c = &route.config;
    json!({
        "route": c.name,
        "mode": c.balancing.mode.as_str(),
        "cross_tier_fallback": c.balancing.cross_tier_fallback,
        "idle_timeout_s": c.balancing.idle_timeout.as_secs(),
        // Configured, or learned from the clients' think time if shorter.
        "live_window_ms": route.runtime.sessions.live_window_ms(),
        "toggles": toggles_json(route),
        "queue": queue_json(route),
        "session_store": store_json(registry),
        "active_candidates": balance::candidates(route, &all, now)
            .iter().map(|&i| route.peers[i].config.name.clone()).collect::<Vec<_>>(),
        "models": c.peers_by_model.iter().map(|(m, idx)| json!({
            "model": m,
            "peers": idx.iter().map(|&i| route.peers[i].config.name.clone()).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "peers": route.peers.iter().enumerate().map(|(i, p)| json!({
            "name": p.config.name,
            "address": p.config.address(),
            "priority": p.config.priority,
            "ready": p.is_usable(now),
            "in_flight": p.state.in_flight(),
            "awaiting_first_token": p.state.awaiting_first_token(),
            "cold_prefill_tokens": p.state.cold_backlog_tokens(),
            "max_concurrency": p.config.max_concurrency,
            "load": loads[i].load(),
            "kv_full": loads[i].kv_full,
            "engine": peer_engine_json(route, i, loads[i].engine.is_some(), now),
            "sessions": sessions[i],
            "live_sessions": loads[i].bound.sessions,
            "live_tokens": loads[i].bound.tokens,
            // Each live session weighted by its chance of coming back: what
            // placement ranks by and KV admission protects.
            "returning_sessions": loads[i].bound.returning_milli as f64 / f64::from(crate::placement::WHOLE),
            "returning_tokens": loads[i].bound.returning_tokens,
            "kv_capacity_tokens": balance::kv_capacity(p).map(|(tokens, _)| tokens),
            "kv_capacity_source": balance::kv_capacity(p).map(|(_, source)| source.as_str()),
            // Whether placement measures live sessions against it (not a
            // llama.cpp slot context: `balance::peer_loads`).
            "kv_aware": loads[i].kv_capacity_tokens.is_some(),
        })).collect::<Vec<_>>(),
    })
}

/// The TTFT and decode-rate EWMAs per pool and peer, with the histograms
/// of their samples (both endpoints show the same measurement).
fn measurement_status(route: &Route, registry: &Registry) -> Value {
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
fn cluster_avg(route: &Route) -> Value {
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

/// The catalog with the values this route runs with: tunables under
/// `options`, engine internals under `advanced`, and the derived adaptive
/// bounds per pool.
fn route_opts(route: &Route) -> Value {
    use crate::config::catalog::{option_json, values, ROUTE_OPTIONS};
    let c = &route.config;
    let values = values(c);
    let all = |hidden: bool| {
        ROUTE_OPTIONS
            .iter()
            .filter(|o| o.hidden == hidden)
            .map(|o| option_json(o, &values, &c.keys_set))
            .collect::<Vec<_>>()
    };
    let adaptive: Vec<Value> = match c.protection.adaptive {
        None => Vec::new(),
        Some(cfg) => route
            .pools()
            .into_iter()
            .map(|(label, pool)| {
                let (max, _) = route.pool_load(&pool);
                let p = cfg.params(max);
                json!({"pool": label, "static_max": max, "floor": p.min, "start": p.init})
            })
            .collect(),
    };
    json!({
        "route": c.name,
        "options": all(false),
        "advanced": all(true),
        "derived": {"adaptive_cc": adaptive},
    })
}

/// Every fold's EWMA by its name (one entry unless a metric table names more).
fn folds_json(
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
fn adaptive_json(route: &Route) -> Value {
    let Some(cfg) = route.config.protection.adaptive else {
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

/// Session turn priority: the table in force, admits and refusals per
/// bucket, requests without a usable header, and the route's cache hit rate.
fn session_status(route: &Route) -> Value {
    use std::sync::atomic::Ordering::Relaxed;
    let prio = &route.config.protection.session_prio;
    let snapshot = route.runtime.protection.snapshot();
    let state = snapshot.prio;
    let (on, source) = route.runtime.toggles.session_prio.effective(prio.enabled);
    let (prompt, cached) = route.runtime.prompt_tokens();
    json!({
        "route": route.config.name,
        "enabled": {"on": on, "source": source},
        "rt_limit_factor": prio.rt_limit_factor,
        "severe": prio.severe,
        "release": prio.release,
        "t1_probes": prio.t1_probes,
        "hold_turn1": state.hold_turn1.load(Relaxed),
        "buckets": prio.table.iter().enumerate().map(|(i, b)| {
            let (admits, rejections) = state.counts(i);
            json!({"min_turn": b.min_turn, "share": b.share, "tol": b.tol,
                   "admits": admits, "rejections": rejections})
        }).collect::<Vec<_>>(),
        "bnohdr": {
            "admits": state.bnohdr_admits.load(Relaxed),
            "rejections": state.bnohdr_rejections.load(Relaxed),
        },
        "cache_hit_rate": (prompt > 0).then(|| cached as f64 / prompt as f64),
    })
}

fn queue_json(route: &Route) -> Value {
    let (warm, new) = route.runtime.queue.waiting();
    json!({
        "timeout_ms": route.config.queue_timeout.as_millis() as u64,
        "waiting_warm": warm,
        "waiting_new": new,
    })
}

fn health_status(route: &Route, registry: &Registry) -> Value {
    let now = now_ms();
    let h = &route.config.health;
    let keys = registry.keys_for(route);
    let enforced = keys.enforced().is_some();
    json!({
        "_meta": {
            "api_keys_configured": enforced,
            "route_auth_enabled": enforced,
            "key_file_status": keys.status.as_str(),
            "key_file_scope": keys.scope,
            "keys": keys.keys.as_ref().map_or(0, |k| k.len()),
        },
        "route": route.config.name,
        "probe": {
            "enabled": h.enabled,
            "interval_ms": h.interval.as_millis() as u64,
            "ban_ttl_ms": h.ban_ttl.as_millis() as u64,
            "probe_path": h.probe_path,
            "timeout_ms": h.timeout.as_millis() as u64,
        },
        "discovery": discovery_json(route),
        "peers": route.peers.iter().map(|p| json!({
            "name": p.config.name,
            // None: its host name has not resolved (yet); never chosen.
            "address": p.addr.map(|a| a.to_string()),
            "ready": p.is_usable(now),
            "failing": p.state.is_failing(),
            "banned_for_ms": p.state.banned_for_ms(now),
            "probe_path": p.config.probe_path.as_deref().unwrap_or(&h.probe_path),
        })).collect::<Vec<_>>(),
    })
}

/// What the route's discovery found: each listed host name's address or
/// why it has none, and `peers_from`'s endpoints.
fn discovery_json(route: &Route) -> Value {
    let found = route.runtime.found.lock();
    let hosts: Vec<Value> = found
        .hosts
        .iter()
        .map(|(host, answer)| {
            json!({
                "host": host,
                "address": answer.addr.map(|a| a.to_string()),
                "resolved": answer.addr.is_some(),
                "last_error": answer.error,
            })
        })
        .collect();
    let peers_from = route.config.peers_from.as_ref().map(|from| {
        let source = match &from.source {
            crate::config::PeerSource::Dns { name, port } => {
                json!({"kind": "dns", "host": name, "port": port})
            }
            crate::config::PeerSource::Kubernetes(k) => json!({
                "kind": "kubernetes",
                "namespace": k.namespace,
                "selector": k.selector,
            }),
        };
        json!({
            "source": source,
            "endpoints": found.set.as_ref().map(Vec::len),
            "last_error": found.set_error,
        })
    });
    json!({"hosts": hosts, "peers_from": peers_from})
}

fn active_conns(route: &Route) -> Value {
    let peers: Vec<Value> = route
        .peers
        .iter()
        .map(|p| json!({"name": p.config.name, "in_flight": p.state.in_flight(), "max_concurrency": p.config.max_concurrency}))
        .collect();
    let total: u32 = route.peers.iter().map(|p| p.state.in_flight()).sum();
    json!({"route": route.config.name, "total": total, "peers": peers})
}

fn sessions(route: &Route) -> Value {
    let now = now_ms();
    let table = &route.runtime.sessions;
    let per_peer = route.sessions_per_peer();
    json!({
        "route": route.config.name,
        "total": table.len(),
        "oldest_age_ms": table.oldest_age_ms(now),
        "idle_timeout_s": route.config.balancing.idle_timeout.as_secs(),
        "per_peer": route.peers.iter().zip(per_peer).map(|(p, n)| json!({
            "name": p.config.name,
            "sessions": n,
        })).collect::<Vec<_>>(),
    })
}

fn route_debug(route: &Route, query: &str) -> Value {
    let raw = crate::query::raw_pieces(query)
        .find_map(|kv| kv.strip_prefix("sid="))
        .map(percent_decode)
        .unwrap_or_default();
    // Hash it exactly as a request header would be hashed.
    let mut headers = http::HeaderMap::new();
    let session = http::HeaderValue::from_bytes(&raw).ok().and_then(|v| {
        headers.insert("x-session-id", v);
        extract_session(&headers, &[], None)
    });
    match session {
        Some(sid) => {
            let all: Vec<usize> = (0..route.peers.len()).collect();
            let mut out = balance::explain(route, &all, &sid);
            out["source"] = json!("query:sid");
            out
        }
        None => {
            json!({"error": {"type": "invalid_request", "message": "pass a non-blank session id as ?sid=…"}})
        }
    }
}

/// A query value as a browser or curl encodes it: `%XX` escapes and `+`
/// for a space.
fn percent_decode(s: &str) -> Vec<u8> {
    let spaced = s.replace('+', " ");
    percent_encoding::percent_decode_str(&spaced).collect()
}

#[cfg(test)]
mod tests {
    use super::{percent_decode, preview, redact_addresses, respond, ENDPOINTS};
    use crate::config::{GatewayConfig, Overrides};
    use crate::registry::Registry;

    /// A registry with one route `chat` whose file ends with `extra`.
    fn registry(dir: &std::path::Path, extra: &str) -> Registry {
        std::fs::write(
            dir.join("chat.yaml"),
            format!("peers:\n  - {{name: a, host: 127.0.0.1, port: 9}}\n{extra}"),
        )
        .unwrap();
        let overrides = Overrides {
            routes_dir: Some(dir.to_path_buf()),
            ..Overrides::default()
        };
        let gw =
            GatewayConfig::parse(std::path::Path::new("gateway.yaml"), "", &overrides).unwrap();
        let registry = Registry::new(gw);
        registry.reload();
        registry
    }

    #[test]
    fn preview_follows_options_and_toggles() {
        let dir = tempfile::tempdir().unwrap();
        let body = br#"{"messages":[{"role":"system","content":"x-anthropic-billing-header: cc_version=1; cch=ab12;"},{"role":"assistant","tool_calls":[{"id":"functions.f:3"}]}]}"#;
        let reg = registry(dir.path(), "cch_strip: true\n");
        let route = reg.route("chat").unwrap();
        let p = preview(&route, body);
        assert_eq!(p["route"], "chat");
        assert_eq!(p["changed"], true);
        assert_eq!(p["cch_strip"]["on"], true);
        assert_eq!(p["cch_stripped"]["removed"], " cch=ab12;");
        assert_eq!(p["kimi_normalize"]["on"], false);
        assert_eq!(p["kimi_ids_renumbered"], 0, "kimi_normalize is off");
        // The runtime toggles decide, both ways.
        route.runtime.toggles.cch_strip.set(false);
        route.runtime.toggles.kimi_normalize.set(true);
        let p = preview(&route, body);
        assert_eq!(p["cch_stripped"], serde_json::Value::Null);
        assert_eq!(p["kimi_ids_renumbered"], 1);
        assert_eq!(p["kimi_renamed"][0]["to"], "functions.f:0");
        assert_eq!(p["kimi_normalize"]["source"], "runtime");
    }

    #[test]
    fn no_endpoint_answer_shows_an_address_or_a_key_path_once_redacted() {
        let dir = tempfile::tempdir().unwrap();
        let keys = dir.path().join("secret-keys");
        std::fs::write(&keys, "k:o\n").unwrap();
        let extra = format!(
            "  - {{name: b, host: 10.9.8.7, port: 9123}}\napi_keys_file: {}\n\
             peers_from: {{kubernetes: {{namespace: n, selector: s, port: 1, \
             api: \"https://10.9.8.7:9123\", service_account_dir: /secret-kube}}}}\n",
            keys.display()
        );
        let reg = registry(dir.path(), &extra);
        let route = reg.route("chat").unwrap();
        let gets: Vec<&str> = ENDPOINTS
            .iter()
            .filter(|e| !e.starts_with("POST"))
            .map(|e| e.split(['[', '?']).next().unwrap())
            .collect();
        assert!(gets.len() >= 12, "{gets:?}");
        for path in gets {
            let mut v = respond(&route, &reg, path).unwrap_or_else(|| panic!("{path}"));
            let before = v.to_string();
            redact_addresses(&mut v);
            let after = v.to_string();
            for secret in ["10.9.8.7", "9123", "secret-keys", "secret-kube"] {
                assert!(!after.contains(secret), "{path} shows {secret}: {after}");
            }
            if path == "/_route_state" || path == "/_route_opts" {
                // Control: there was something to hide, and names stay.
                assert!(before.contains("10.9.8.7"), "{path}: {before}");
                if path == "/_route_opts" {
                    assert!(before.contains("secret-kube"), "{path}: {before}");
                }
                assert!(after.contains("\"b\""), "{path}: {after}");
            }
        }
    }

    #[test]
    fn decodes_percent_and_plus() {
        assert_eq!(percent_decode("a%20b+c"), b"a b c");
        assert_eq!(percent_decode("%zz%4"), b"%zz%4");
        assert_eq!(percent_decode("%41"), b"A");
    }
}
