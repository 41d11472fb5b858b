//! Which peers a request may use (model pool, priority tier) and which one it
//! gets (the route's placement mode), with its in-flight slot reserved.
//!
//! The placement rules themselves are pure and live in `crate::placement`;
//! this module turns live peer state into their input and their output into a
//! reserved slot or an error response.

use crate::clock::now_ms;
use crate::config::Mode;
use crate::errors::ErrorResponse;
use crate::placement::{self, PeerLoad, Placement, PlacementKind};
use crate::registry::{InFlightGuard, Route};
use crate::session::SessionId;
use std::cell::Cell;

/// What placement decided, for X-Routed-Mode and the placements metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// X-Routed-Mode: new, sticky, spill, migrated, table_full, hash,
    /// hash_fallback, least_conn, round_robin or overflow.
    pub mode: &'static str,
    pub reason: Option<&'static str>,
}

pub struct Choice {
    pub peer: usize,
    pub slot: InFlightGuard,
    pub decision: Decision,
}

/// The peers serving `model`. A route without `peers_by_model` serves any
/// model with all its peers; one with it needs a known model.
pub fn model_pool(route: &Route, model: Option<&str>) -> Result<Vec<usize>, ErrorResponse> {
    let pools = &route.config.peers_by_model;
    if pools.is_empty() {
        return Ok((0..route.peers.len()).collect());
    }
    match model.and_then(|m| pools.iter().find(|(name, _)| name == m)) {
        Some((_, peers)) => Ok(peers.clone()),
        None => {
            let supported: Vec<&str> = pools.iter().map(|(m, _)| m.as_str()).collect();
            let message = match model {
                Some(m) => format!("model {m:?} is not served by route {:?}", route.name()),
                None => format!(
                    "route {:?} needs a \"model\" in the request body",
                    route.name()
                ),
            };
            Err(ErrorResponse::new(400, "unknown_model", message).with("supported", supported))
        }
    }
}

fn usable(route: &Route, i: usize, now: u64) -> bool {
    let p = &route.peers[i];
    p.addr.is_some() && p.state.is_ready(now)
}

fn has_room(route: &Route, i: usize) -> bool {
    let p = &route.peers[i];
    p.state.in_flight() < p.config.max_concurrency
}

/// The peers placement chooses among: the most preferred priority tier that
/// has a ready member (lower `priority` value first). With
/// `cross_tier_fallback`, tiers whose ready members are all at their limit
/// overflow into the next tier down.
pub fn candidates(route: &Route, pool: &[usize], now: u64) -> Vec<usize> {
    let mut ready: Vec<usize> = pool
        .iter()
        .copied()
        .filter(|&i| usable(route, i, now))
        .collect();
    ready.sort_by_key(|&i| route.peers[i].config.priority);
    let mut out = Vec::with_capacity(ready.len());
    for tier in
        ready.chunk_by(|&a, &b| route.peers[a].config.priority == route.peers[b].config.priority)
    {
        out.extend_from_slice(tier);
        let tier_full = tier.iter().all(|&i| !has_room(route, i));
        if !(route.config.balancing.cross_tier_fallback && tier_full) {
            break;
        }
    }
    out
}

/// Chooses a peer for a new request and reserves its slot.
/// No ready peer → 503; every candidate at its limit → 429.
pub fn choose(
    route: &Route,
    pool: &[usize],
    session: Option<&SessionId>,
) -> Result<Choice, ErrorResponse> {
    let now = now_ms();
    let cands = candidates(route, pool, now);
    if cands.is_empty() {
        return Err(ErrorResponse::no_ready_peer(route.name()));
    }
    let loads = route.peer_loads(&cands, now);
    let placement = place(route, &loads, session, now);
    let placed = placement.and_then(|(id, decision)| {
        let (i, p) = route.peer_by_id(id)?;
        p.state
            .try_acquire(p.config.max_concurrency)
            .map(|slot| Choice {
                peer: i,
                slot,
                decision,
            })
    });
    if let Some(choice) = placed {
        return Ok(choice);
    }
    // The placed peer is at its limit: this one request goes to the
    // least-loaded candidate with room, the session's binding stays.
    let mut by_load = cands.clone();
    by_load.sort_by(|&a, &b| load_ratio(route, a).total_cmp(&load_ratio(route, b)));
    for i in by_load {
        let p = &route.peers[i];
        if let Some(slot) = p.state.try_acquire(p.config.max_concurrency) {
            let decision = Decision {
                mode: "overflow",
                reason: Some("saturated"),
            };
            return Ok(Choice {
                peer: i,
                slot,
                decision,
            });
        }
    }
    let limit: u32 = cands
        .iter()
        .map(|&i| route.peers[i].config.max_concurrency)
        .sum();
    let in_flight: u32 = cands
        .iter()
        .map(|&i| route.peers[i].state.in_flight())
        .sum();
    Err(ErrorResponse::new(
        429,
        "concurrency_limit",
        format!("route {:?} is at its concurrency limit", route.name()),
    )
    .with("limit", limit)
    .with("in_flight", in_flight)
    .with("healthy_peers", cands.len())
    .retry_after(1))
}

/// The route's placement rule over live loads; None only if no peer is ready.
fn place(
    route: &Route,
    loads: &[PeerLoad],
    session: Option<&SessionId>,
    now: u64,
) -> Option<(u32, Decision)> {
    let from = |p: Placement| {
        let mode = p.kind.as_str();
        (
            p.peer,
            Decision {
                mode,
                reason: p.reason.map(|r| r.as_str()),
            },
        )
    };
    let least = |loads: &[PeerLoad]| {
        placement::least_conn(loads, next_random()).map(|id| {
            (
                id,
                Decision {
                    mode: "least_conn",
                    reason: None,
                },
            )
        })
    };
    match (route.config.balancing.mode, session) {
        (Mode::RoundRobin, _) => {
            let ready: Vec<&PeerLoad> = loads.iter().filter(|l| l.ready).collect();
            let turn = route
                .runtime
                .round_robin
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let pick = ready.get(turn % ready.len().max(1))?;
            Some((
                pick.id,
                Decision {
                    mode: "round_robin",
                    reason: None,
                },
            ))
        }
        (Mode::LeastConn, _) | (_, None) => least(loads),
        (Mode::Hash, Some(sid)) => placement::hash_place(sid.hash, loads, next_random()).map(from),
        (Mode::LoadAware, Some(sid)) => {
            route.runtime.sessions.place(sid.hash, loads, now).map(from)
        }
    }
}

/// What `choose` would decide for `session`, without changing anything.
pub fn explain(route: &Route, pool: &[usize], session: &SessionId) -> serde_json::Value {
    let now = now_ms();
    let cands = candidates(route, pool, now);
    let loads = route.peer_loads(&cands, now);
    let name_of = |id: u32| {
        route
            .peer_by_id(id)
            .map(|(_, p)| p.config.name.clone())
            .unwrap_or_default()
    };
    let candidates: Vec<String> = cands
        .iter()
        .map(|&i| route.peers[i].config.name.clone())
        .collect();
    let (peer, mode, reason, why) = match route.config.balancing.mode {
        Mode::LoadAware => match route.runtime.sessions.peek(session.hash, &loads, now) {
            Some((p, why)) => (
                Some(name_of(p.peer)),
                p.kind.as_str(),
                p.reason.map(|r| r.as_str()),
                why,
            ),
            None => (None, "none", None, "no ready peer".to_string()),
        },
        Mode::Hash => match placement::hash_place(session.hash, &loads, 0) {
            Some(p) if p.kind == PlacementKind::Hash => (
                Some(name_of(p.peer)),
                "hash",
                None,
                "rendezvous home is ready and has room".into(),
            ),
            Some(p) => (
                Some(name_of(p.peer)),
                p.kind.as_str(),
                None,
                "home not ready: next rendezvous choice; home saturated: least-connections".into(),
            ),
            None => (None, "none", None, "no ready peer".into()),
        },
        Mode::LeastConn | Mode::RoundRobin => (
            None,
            route.config.balancing.mode.as_str(),
            None,
            "mode ignores sessions".into(),
        ),
    };
    serde_json::json!({
        "session": session.hex(),
        "source": session.source.as_str(),
        "mode": route.config.balancing.mode.as_str(),
        "candidates": candidates,
        "decision": {"peer": peer, "kind": mode, "reason": reason},
        "why": why,
    })
}

fn load_ratio(route: &Route, i: usize) -> f64 {
    let p = &route.peers[i];
    p.state.in_flight() as f64 / p.config.max_concurrency.max(1) as f64
}

/// The next peer for a retry: ready, not tried yet, with a free slot.
pub fn retry(route: &Route, pool: &[usize], tried: &[usize]) -> Option<(usize, InFlightGuard)> {
    let now = now_ms();
    let mut untried: Vec<usize> = candidates(route, pool, now)
        .into_iter()
        .filter(|i| !tried.contains(i))
        .collect();
    untried.sort_by(|&a, &b| load_ratio(route, a).total_cmp(&load_ratio(route, b)));
    untried.into_iter().find_map(|i| {
        let p = &route.peers[i];
        p.state
            .try_acquire(p.config.max_concurrency)
            .map(|slot| (i, slot))
    })
}

pub fn has_untried_ready(route: &Route, pool: &[usize], tried: &[usize]) -> bool {
    let now = now_ms();
    pool.iter()
        .any(|i| !tried.contains(i) && usable(route, *i, now))
}

/// A cheap per-thread random number for tie-breaking (xorshift64*). Not
/// for anything security-related.
fn next_random() -> u64 {
    thread_local! {
        static STATE: Cell<u64> = Cell::new({
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0x9E37_79B9_7F4A_7C15);
            let tid = std::thread::current().id();
            crate::hash::stable_hash64(format!("{t}{tid:?}").as_bytes()) | 1
        });
    }
    STATE.with(|s| {
        let mut x = s.get();
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        s.set(x);
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    })
}
