//! The status endpoints of the route's state: its peers and their engines
//! (`/_route_state`, `/_health_status`), the options it runs with
//! (`/_route_opts`), its sessions and queue (`/_session_status`,
//! `/_sessions`, `/_active_conns`), and what a placement would do
//! (`/_route_debug`).

use crate::balance;
use crate::clock::now_ms;
use crate::registry::{Registry, Route};
use crate::session::extract_session;
use serde_json::{json, Value};

use super::switches::toggles_json;

/// The last scrape as read; `fresh` is whether placement uses it (the
/// decision `Route::peer_loads` made, not a second computation of it).
pub(super) fn peer_engine_json(route: &Route, i: usize, fresh: bool, now: u64) -> Value {
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
pub(super) fn store_json(registry: &Registry) -> Value {
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

pub(super) fn route_state(route: &Route, registry: &Registry) -> Value {
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
            // Through the other replicas, as they last published it (a
            // shared session store only; 0 otherwise).
            "remote_in_flight": p.state.remote_requests(now),
            "awaiting_first_token": p.state.awaiting_first_token(),
            "cold_prefill_tokens": p.state.cold_backlog_tokens(),
            "remote_cold_prefill_tokens": p.state.remote_cold_tokens(now),
            "max_concurrency": p.config.max_concurrency,
            // route, default, or engine_slots (llama.cpp's own slots, the
            // limit of a peer whose route sets none).
            "max_concurrency_source": p.config.max_concurrency_from.as_str(),
            "engine_slots": p.state.engine_slots(),
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
            // What the sessions bound here will hold, each at the size the
            // route's sessions end at when more than today's.
            "projected_tokens": loads[i].bound.projected_tokens,
            "speed": {
                "prefill_us_per_token": loads[i].speed.prefill_us,
                "tpot_us": loads[i].speed.tpot_us,
                "completions_per_s": loads[i].speed.completions_per_s,
            },
        })).collect::<Vec<_>>(),
        // The placement model's estimate on each ready peer for a new
        // session of the route's typical size.
        "placement_model": balance::estimates(route, &all, None, typical_request(route), None),
    })
}

/// A new session of the size this route's sessions end at (8,192 tokens
/// while none has).
fn typical_request(route: &Route) -> u64 {
    match route.runtime.sessions.typical_session() {
        0 => crate::placement::model::UNKNOWN_SESSION_TOKENS,
        n => n,
    }
}

/// The catalog with the values this route runs with: tunables under
/// `options`, engine internals under `advanced`, and the derived adaptive
/// bounds per pool.
pub(super) fn route_opts(route: &Route) -> Value {
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
    let adaptive: Vec<Value> = match c.protection.adaptive_on() {
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

/// Session turn priority: the table in force, admits and refusals per
/// bucket, requests without a usable header, and the route's cache hit rate.
pub(super) fn session_status(route: &Route) -> Value {
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

pub(super) fn queue_json(route: &Route) -> Value {
    let (warm, new) = route.runtime.queue.waiting();
    json!({
        "timeout_ms": route.config.queue_timeout.as_millis() as u64,
        "waiting_warm": warm,
        "waiting_new": new,
    })
}

pub(super) fn health_status(route: &Route, registry: &Registry) -> Value {
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
            // ready, busy (a 429 or a timeout: not banned) or down; null
            // before the first probe answered.
            "last_probe": p.state.last_probe().map(|v| v.as_str()),
            // Why it is failing, as its last failed probe or connection
            // said ("status 503", "TLS: certificate verify failed:
            // UnknownIssuer"); null once a probe passes.
            "last_error": p.state.failure(),
            "tls": p.config.tls.is_some(),
        })).collect::<Vec<_>>(),
    })
}

/// What the route's discovery found: each listed host name's address or
/// why it has none, and `peers_from`'s endpoints.
pub(super) fn discovery_json(route: &Route) -> Value {
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

pub(super) fn active_conns(route: &Route) -> Value {
    let peers: Vec<Value> = route
        .peers
        .iter()
        .map(|p| json!({"name": p.config.name, "in_flight": p.state.in_flight(), "max_concurrency": p.config.max_concurrency}))
        .collect();
    let total: u32 = route.peers.iter().map(|p| p.state.in_flight()).sum();
    json!({"route": route.config.name, "total": total, "peers": peers})
}

pub(super) fn sessions(route: &Route) -> Value {
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

pub(super) fn route_debug(route: &Route, query: &str) -> Value {
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
pub(super) fn percent_decode(s: &str) -> Vec<u8> {
    let spaced = s.replace('+', " ");
    percent_encoding::percent_decode_str(&spaced).collect()
}
