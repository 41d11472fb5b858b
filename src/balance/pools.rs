//! Which peers a request may use: its model's pool, then the most preferred
//! priority tier with a ready member.

use crate::errors::ErrorResponse;
use crate::registry::Route;

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

/// Has an address and is not banned.
pub(super) fn usable(route: &Route, i: usize, now: u64) -> bool {
    route.peers[i].is_usable(now)
}

pub(super) fn has_room(route: &Route, i: usize) -> bool {
    let p = &route.peers[i];
    p.state.in_flight() < p.config.max_concurrency
}

/// `in_flight / max_concurrency`, for the overflow and retry orders.
pub(super) fn load_ratio(route: &Route, i: usize) -> f64 {
    let p = &route.peers[i];
    p.state.in_flight() as f64 / p.config.max_concurrency.max(1) as f64
}

/// What the placement rules see: the candidates, plus the pool's peers that
/// are not ready. The rules never choose those, but they must know them: a
/// `hash` session whose home is down falls back (and says so), and a
/// session bound to a banned peer migrates because it is not ready, not
/// because it left the config.
pub fn rule_view(route: &Route, pool: &[usize], cands: &[usize], now: u64) -> Vec<usize> {
    let mut view = cands.to_vec();
    view.extend(pool.iter().filter(|&&i| !usable(route, i, now)));
    view
}

/// The ready peers placement chooses among: the most preferred priority
/// tier that has a ready member (lower `priority` value first). With
/// `cross_tier_fallback`, tiers whose ready members are all at their limit
/// overflow into the next tier down.
pub fn candidates(route: &Route, pool: &[usize], now: u64) -> Vec<usize> {
    let mut ready: Vec<usize> = pool
        .iter()
        .copied()
        .filter(|&i| usable(route, i, now))
        .collect();
    ready.sort_by_key(|&i| route.peers[i].config.priority);
    // The tiers kept are a prefix of the sorted list: cut it in place.
    let mut kept = 0;
    for tier in
        ready.chunk_by(|&a, &b| route.peers[a].config.priority == route.peers[b].config.priority)
    {
        kept += tier.len();
        let tier_full = tier.iter().all(|&i| !has_room(route, i));
        if !(route.config.balancing.cross_tier_fallback && tier_full) {
            break;
        }
    }
    ready.truncate(kept);
    ready
}
