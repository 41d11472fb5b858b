//! What placement sees of each peer at this instant ([`PeerLoad`]): the
//! gateway's in-flight count, readiness, and the engine's own metrics while
//! they are fresh, with the engine's queue corrected for what finished since
//! the scrape.

use crate::placement::{CapacitySource, EngineLoad, PeerLoad};
use crate::registry::{Route, RoutePeer};

/// The load view placement works on, for the peers of `route` at `indices`.
pub fn peer_loads(route: &Route, indices: &[usize], now_ms: u64) -> Vec<PeerLoad> {
    let engine_cfg = route.config.engine_metrics.as_ref();
    let bound_of = |id| route.runtime.sessions.live_of(id);
    indices
        .iter()
        .filter_map(|&i| route.peers.get(i))
        .map(|p| {
            let fresh = engine_cfg.and_then(|cfg| {
                let sample = p.state.engine_sample()?;
                (now_ms.saturating_sub(sample.read_at_ms) <= cfg.max_age_ms()).then(|| {
                    let queue = EngineLoad {
                        waiting: sample.sustained_waiting,
                        ..sample.load
                    };
                    discount_completed(queue, p.state.completed_since(&sample))
                })
            });
            let kv_full = match (fresh, engine_cfg) {
                (Some(load), Some(cfg)) => load.kv_usage >= cfg.kv_full_threshold,
                _ => false,
            };
            PeerLoad {
                id: p.state.id,
                // A peer whose host did not resolve can never be chosen.
                ready: p.is_usable(now_ms),
                // With a shared session store, the whole cluster's load.
                in_flight: p.state.in_flight() + p.state.remote_requests(now_ms),
                // The cluster's: another replica's cold prompts are
                // prefill ahead of a request here all the same.
                backlog_tokens: p.state.cold_backlog_tokens() + p.state.remote_cold_tokens(now_ms),
                speed: p.state.speed_at(now_ms),
                max_concurrency: p.config.max_concurrency,
                engine: fresh,
                kv_full,
                // With a shared store, the cluster's live sessions (each
                // counted once), not only those whose turns came through here.
                bound: p.state.bound(bound_of(p.state.id), now_ms),
                kv_capacity_tokens: kv_working_set_capacity(p),
            }
        })
        .collect()
}

/// A peer's KV capacity and where it came from: the route file, else what
/// the engine published, else what was learned from its KV-usage gauge.
pub fn kv_capacity(p: &RoutePeer) -> Option<(u64, CapacitySource)> {
    match p.config.kv_capacity_tokens {
        Some(tokens) => Some((tokens, CapacitySource::Configured)),
        None => p.state.kv_capacity(),
    }
}

/// The capacity KV-aware placement measures live sessions against. Not
/// llama.cpp's `/props` one: that is its slots' context, what runs at once;
/// between turns a session's cache leaves its slot for the server's prompt
/// cache in host memory (`--cache-ram`, 8 GiB by default) and comes back
/// from there, so live sessions far beyond the slots' context stay cached
/// (measured on the real server: new sessions held in the admission queue
/// for its whole timeout while both engines sat idle).
fn kv_working_set_capacity(p: &RoutePeer) -> Option<u64> {
    kv_capacity(p)
        .filter(|&(_, source)| source != CapacitySource::Props)
        .map(|(tokens, _)| tokens)
}

/// The engine's queue as it must be now: every request this gateway saw
/// finish since the sample freed a running slot, which admits one waiting
/// request (continuous batching). Without this, a queue that drained right
/// after a scrape keeps looking backed up for up to two scrape intervals,
/// and sessions spill needlessly, each re-prefilling its whole context on a
/// cold peer.
pub fn discount_completed(load: EngineLoad, completed: u64) -> EngineLoad {
    let completed = u32::try_from(completed).unwrap_or(u32::MAX);
    let from_waiting = completed.min(load.waiting);
    EngineLoad {
        waiting: load.waiting - from_waiting,
        running: load.running.saturating_sub(completed - from_waiting),
        kv_usage: load.kv_usage,
    }
}

/// A sample for the tests of what reads engine loads: this queue, KV half used.
#[cfg(test)]
pub(crate) fn half_full(waiting: u32, running: u32) -> EngineLoad {
    EngineLoad {
        waiting,
        running,
        kv_usage: 0.5,
    }
}

#[cfg(test)]
mod tests {
    use super::half_full as load;
    use super::*;

    #[test]
    fn completions_since_a_scrape_drain_the_queue_first() {
        assert_eq!(discount_completed(load(3, 6), 0), load(3, 6));
        assert_eq!(discount_completed(load(3, 6), 2), load(1, 6));
        assert_eq!(discount_completed(load(3, 6), 5), load(0, 4));
        assert_eq!(discount_completed(load(3, 6), 100), load(0, 0));
        assert_eq!(discount_completed(load(1, 1), u64::MAX), load(0, 0));
    }
}
