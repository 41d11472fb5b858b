//! Which peers a request may use and which one it gets.

use crate::errors::ErrorResponse;
use crate::registry::{now_ms, InFlightGuard, Route};

/// Indices of the peers this request may use.
pub fn pool(route: &Route) -> Vec<usize> {
    (0..route.peers.len()).collect()
}

fn usable(route: &Route, i: usize, now: u64) -> bool {
    let p = &route.peers[i];
    p.addr.is_some() && p.state.is_ready(now)
}

/// The ready peer with the fewest requests in flight relative to its limit,
/// with its slot reserved. No ready peer → 503; all ready peers at their
/// limit → 429.
pub fn first(route: &Route, pool: &[usize]) -> Result<(usize, InFlightGuard), ErrorResponse> {
    let now = now_ms();
    let mut ready: Vec<usize> = pool.iter().copied().filter(|&i| usable(route, i, now)).collect();
    if ready.is_empty() {
        return Err(ErrorResponse::no_ready_peer(route.name()));
    }
    ready.sort_by(|&a, &b| load_ratio(route, a).total_cmp(&load_ratio(route, b)));
    for i in ready.iter().copied() {
        let p = &route.peers[i];
        if let Some(slot) = p.state.try_acquire(p.config.max_concurrency) {
            return Ok((i, slot));
        }
    }
    let limit: u32 = ready.iter().map(|&i| route.peers[i].config.max_concurrency).sum();
    let in_flight: u32 = ready.iter().map(|&i| route.peers[i].state.in_flight()).sum();
    Err(ErrorResponse::new(429, "concurrency_limit", format!("route {:?} is at its concurrency limit", route.name()))
        .with("limit", limit)
        .with("in_flight", in_flight)
        .with("healthy_peers", ready.len())
        .retry_after(1))
}

fn load_ratio(route: &Route, i: usize) -> f64 {
    let p = &route.peers[i];
    p.state.in_flight() as f64 / p.config.max_concurrency.max(1) as f64
}

/// The next peer for a retry: ready, not tried yet, with a free slot.
pub fn retry(route: &Route, pool: &[usize], tried: &[usize]) -> Option<(usize, InFlightGuard)> {
    let now = now_ms();
    let mut candidates: Vec<usize> = pool
        .iter()
        .copied()
        .filter(|i| !tried.contains(i) && usable(route, *i, now))
        .collect();
    candidates.sort_by(|&a, &b| load_ratio(route, a).total_cmp(&load_ratio(route, b)));
    candidates.into_iter().find_map(|i| {
        let p = &route.peers[i];
        p.state.try_acquire(p.config.max_concurrency).map(|slot| (i, slot))
    })
}

pub fn has_untried_ready(route: &Route, pool: &[usize], tried: &[usize]) -> bool {
    let now = now_ms();
    pool.iter().any(|i| !tried.contains(i) && usable(route, *i, now))
}
