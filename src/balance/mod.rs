//! The one home of peer choice: which peer a request gets, with its
//! in-flight slot reserved, and why.
//!
//! - `pools`: the model's pool and the active priority tier (candidates);
//! - `snapshot`: live peer state turned into the pure rules' input;
//! - `prefix`: which engines hold a request's shared prefix;
//! - this file: the route's mode applied (`crate::placement` holds the pure
//!   rules and the session table), overflow when the placed peer is full,
//!   retries after a refused connection;
//! - `explain`: the same decision described, changing nothing.
//!
//! One verb (place) and one decision type ([`Placement`]) for every mode:
//! round-robin and overflow are kinds of it like sticky and spill.
//! Where new admission work goes: gates that refuse before a peer is chosen
//! live in `proxy/guards`; limits on a peer's slots (adaptive concurrency)
//! live here, next to `try_acquire`.

mod explain;
pub mod forks;
mod pools;
pub mod prefix;
mod queue;
pub mod shared;
mod snapshot;
pub mod sync;

pub use explain::{estimates, explain};
pub use pools::{candidates, model_pool, rule_view};
pub use queue::{place_or_wait, Granted, Refused};
#[cfg(test)]
pub(crate) use snapshot::half_full;
pub use snapshot::{discount_completed, kv_capacity, peer_loads};

use crate::clock::now_ms;
use crate::config::Mode;
use crate::errors::ErrorResponse;
use crate::placement::{self, Admission, Incoming, PeerLoad, Placement, PlacementKind, Reason};
use crate::protect::gate::Gate;
use crate::registry::{InFlightGuard, Route};
use crate::session::SessionId;
use pools::{load_ratio, usable};
use std::cell::Cell;

/// A placed request: the peer (index into `route.peers`), its reserved
/// slot, and the decision.
pub struct Placed {
    pub peer: usize,
    pub slot: InFlightGuard,
    pub placement: Placement,
}

/// What a request asks of the pool.
#[derive(Debug, Clone, Copy)]
pub struct Demand<'a> {
    /// Indices into `route.peers` (the model's pool) and the pool's label.
    pub pool: &'a [usize],
    pub label: &'a str,
    pub session: Option<&'a SessionId>,
    /// Context tokens, as estimated before the engine counts them.
    pub tokens: u64,
    /// A prefix of the request recently sent to some engines (a template
    /// shared with other conversations), cached there.
    pub prefix: Option<placement::Prefix>,
    /// The rate-limit switch: with it off, no limit refuses.
    pub limits_on: bool,
    /// The session-priority share of the limit this request may fill (1.0
    /// without session priority).
    pub share: f64,
    /// How long the request has waited for room so far: a warm turn whose
    /// engine is full goes cold elsewhere only once this reaches its cold
    /// prefill's cost there ([`placement::ColdCost`]).
    pub waited: std::time::Duration,
    /// Its tenant's tag and each lower class's minimum share, for a route
    /// that releases its queue fairly (`registry/room.rs`).
    pub fair: Option<(&'a crate::tenants::Tag, f64)>,
}

/// Why a request could not be placed now.
pub enum Refusal {
    /// No ready peer: 503, nothing to wait for.
    NoReadyPeer(ErrorResponse),
    /// Every candidate at its limit, or (waiting allowed) a new session that
    /// fits no engine's KV: 429, or a wait in the admission queue. The gate
    /// is what `/_429_status` counts it as.
    Full(ErrorResponse, Gate),
    /// A warm turn's engine has no free slot and waiting for one beats its
    /// cold prefill elsewhere, for up to this long in all; the error is
    /// what it gets if nothing frees and nowhere else has room.
    WarmHomeBusy(ErrorResponse, std::time::Duration),
}

/// Places a request of `tokens` context tokens and reserves its slot. With
/// `may_wait`, a new session that fits no engine's KV is refused (to wait)
/// rather than placed anyway. With `limits_on` false (the rate-limit switch
/// is off) a request that finds every slot taken goes to the least-loaded
/// candidate past its limit, and the trip is counted.
pub fn place_with(route: &Route, demand: &Demand, may_wait: bool) -> Result<Placed, Refusal> {
    let mut placed = reserve(route, demand, may_wait)?;
    // What a learned KV capacity is measured against.
    placed.slot.carry_tokens(demand.tokens);
    if placed.placement.kind.is_cold() {
        count_cold(&mut placed, demand);
    }
    Ok(placed)
}

/// A cold turn's prompt is prefill ahead on its engine until its first
/// token; a template's newcomer placed where the template is cached
/// prefills only what follows it.
pub fn count_cold(placed: &mut Placed, demand: &Demand) {
    let cached = demand
        .prefix
        .filter(|p| p.held_on(placed.placement.peer))
        .map_or(0, |p| p.tokens.min(demand.tokens));
    placed.slot.cold_prefill(demand.tokens - cached);
}

fn reserve(route: &Route, demand: &Demand, may_wait: bool) -> Result<Placed, Refusal> {
    let Demand {
        pool,
        label,
        session,
        tokens,
        prefix,
        limits_on,
        share,
        waited,
        fair: _,
    } = *demand;
    let now = now_ms();
    let cands = candidates(route, pool, now);
    if cands.is_empty() {
        return Err(Refusal::NoReadyPeer(if route.peers.is_empty() {
            ErrorResponse::no_peers(route.name())
        } else {
            ErrorResponse::no_ready_peer(route.name())
        }));
    }
    let adaptive = route.adaptive_limit(label, pool);
    if adaptive.is_some() || share < 1.0 {
        let (max, in_flight) = route.pool_load(pool);
        let limit = adaptive.unwrap_or(max);
        let factor = route.config.protection.session_prio.rt_limit_factor;
        let ceiling = crate::protect::prio::ceiling(limit, factor, share) as f64;
        if in_flight >= ceiling.min(limit.floor()) {
            // The plain limit had room: only the bucket's share refused.
            let gate = if in_flight < limit.floor() {
                Gate::SessionPrio
            } else {
                Gate::Concurrency
            };
            if limits_on {
                let mut err = concurrency_limit(route, &cands);
                if let Some(a) = adaptive {
                    err = err.with("adaptive_cc", a.floor());
                }
                if share < 1.0 {
                    err = err.with("session_prio_ceiling", ceiling);
                }
                return Err(Refusal::Full(err, gate));
            }
            route.runtime.protection.count(gate, false);
        }
    }
    let loads = peer_loads(route, &rule_view(route, pool, &cands, now), now);
    let incoming = Incoming {
        tokens,
        may_wait,
        prefix,
    };
    let placement = match apply_mode(route, &loads, session, incoming, now) {
        Admission::NoKvRoom => {
            return Err(Refusal::Full(
                concurrency_limit(route, &cands),
                Gate::Concurrency,
            ))
        }
        Admission::NoReadyPeer => None,
        Admission::Placed(placement) => Some(placement),
    };
    let warm_home = placement.is_some_and(|p| p.kind == PlacementKind::Sticky);
    let placed = placement.and_then(|placement| {
        let (i, p) = route.peer_by_id(placement.peer)?;
        p.state
            .try_acquire(p.config.max_concurrency)
            .map(|slot| Placed {
                peer: i,
                slot,
                placement,
            })
    });
    if let Some(placed) = placed {
        return Ok(placed);
    }
    if warm_home {
        let worth = route.runtime.cold_cost.lock().worth_waiting(tokens);
        if waited < worth {
            return Err(Refusal::WarmHomeBusy(
                concurrency_limit(route, &cands),
                worth,
            ));
        }
    }
    if let Some(placed) = overflow(route, &cands, |p| p.config.max_concurrency) {
        return Ok(placed);
    }
    if !limits_on {
        route.runtime.protection.count(Gate::Concurrency, false);
        if let Some(placed) = overflow(route, &cands, |_| u32::MAX) {
            return Ok(placed);
        }
    }
    Err(Refusal::Full(
        concurrency_limit(route, &cands),
        Gate::Concurrency,
    ))
}

/// The placed peer is at its limit (a warm turn's, after waiting as long as
/// going cold costs): this one request goes to the least-loaded candidate
/// with room, the session's binding stays.
fn overflow(
    route: &Route,
    cands: &[usize],
    limit: impl Fn(&crate::registry::RoutePeer) -> u32,
) -> Option<Placed> {
    let mut by_load = cands.to_vec();
    by_load.sort_by(|&a, &b| load_ratio(route, a).total_cmp(&load_ratio(route, b)));
    by_load.into_iter().find_map(|i| {
        let p = &route.peers[i];
        let slot = p.state.try_acquire(limit(p))?;
        Some(Placed {
            peer: i,
            slot,
            placement: Placement {
                peer: p.state.id,
                kind: PlacementKind::Overflow,
                reason: Some(Reason::Saturated),
            },
        })
    })
}

fn concurrency_limit(route: &Route, cands: &[usize]) -> ErrorResponse {
    let limit: u32 = cands
        .iter()
        .map(|&i| route.peers[i].config.max_concurrency)
        .sum();
    let in_flight: u32 = cands
        .iter()
        .map(|&i| route.peers[i].state.in_flight())
        .sum();
    ErrorResponse::new(
        429,
        "concurrency_limit",
        format!("route {:?} is at its concurrency limit", route.name()),
    )
    .with("limit", limit)
    .with("in_flight", in_flight)
    .with("healthy_peers", cands.len())
    .retry_after(1)
}

/// The route's placement mode over live loads.
fn apply_mode(
    route: &Route,
    loads: &[PeerLoad],
    session: Option<&SessionId>,
    incoming: Incoming,
    now: u64,
) -> Admission {
    let placed = |p: Option<Placement>| p.map_or(Admission::NoReadyPeer, Admission::Placed);
    let plain = |peer, kind| Placement {
        peer,
        kind,
        reason: None,
    };
    match (route.config.balancing.mode, session) {
        (Mode::RoundRobin, _) => {
            let ready: Vec<&PeerLoad> = loads.iter().filter(|l| l.ready).collect();
            let turn = route
                .runtime
                .round_robin
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            placed(
                ready
                    .get(turn % ready.len().max(1))
                    .map(|next| plain(next.id, PlacementKind::RoundRobin)),
            )
        }
        (Mode::LeastConn, _) | (_, None) => placed(
            placement::least_conn(loads, next_random())
                .map(|id| plain(id, PlacementKind::LeastConn)),
        ),
        (Mode::Hash, Some(sid)) => placed(placement::hash_place(sid.hash, loads, next_random())),
        (Mode::LoadAware, Some(sid)) => route
            .runtime
            .sessions
            .place_session(sid.hash, incoming, loads, now),
    }
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
