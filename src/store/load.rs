//! The shared store's background task: keeps the connections open,
//! publishes this replica's in-flight per peer and reads the others'
//! (every `PUBLISH_MS`; a replica's numbers expire `LOAD_TTL_MS` after its
//! last publish, so a replica that died stops counting within that bound),
//! writes back the sessions placed while Redis was away, and sweeps old
//! sync times.
//!
//! Staleness: another replica's in-flight is at most `PUBLISH_MS` old when
//! published plus one `PUBLISH_MS` until it is read here, so placement's
//! cluster view lags by at most ~0.5 s.

use super::binding::{load_key, replicas_key, StoredBinding};
use super::{RedisStore, SessionStore};
use crate::clock::now_ms;
use crate::registry::{Registry, Route};
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

pub const PUBLISH_MS: u64 = 250;
pub const LOAD_TTL_MS: u64 = 1_500;

pub struct StoreService {
    pub store: Arc<SessionStore>,
    pub registry: Arc<Registry>,
}

#[async_trait::async_trait]
impl BackgroundService for StoreService {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let Some(redis) = self.store.redis() else {
            return;
        };
        let mut tick = tokio::time::interval(Duration::from_millis(PUBLISH_MS));
        let mut ticks = 0u64;
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = shutdown.changed() => return,
            }
            ticks += 1;
            redis.ensure_connected().await;
            let was_up = redis.is_up();
            let now = now_ms();
            let snapshot = self.registry.snapshot();
            for route in snapshot.values() {
                exchange_load(redis, route, now).await;
            }
            if redis.is_up() {
                write_back(redis, &self.registry, now).await;
            } else if was_up {
                // Down now: the other replicas' numbers are of no use.
                for route in snapshot.values() {
                    for p in &route.peers {
                        p.state.set_remote_in_flight(0);
                    }
                }
            }
            if ticks.is_multiple_of(40) {
                // Sync times outlive the trust window only to pace TTL
                // refreshes; a day-old one paces nothing.
                redis.sweep_synced(now, 24 * 3_600_000);
            }
        }
    }
}

/// Publishes this replica's in-flight per peer of `route` and sums the
/// other live replicas' into each peer's `remote_in_flight`.
async fn exchange_load(redis: &RedisStore, route: &Route, now: u64) {
    let prefix = redis.prefix();
    let name = route.name();
    let mine = load_key(prefix, name, &redis.replica);
    let replicas = replicas_key(prefix, name);
    let mut pipe = redis::pipe();
    let hset = pipe.cmd("HSET").arg(&mine);
    for p in &route.peers {
        hset.arg(&p.state.address).arg(p.state.in_flight());
    }
    pipe.ignore()
        .cmd("PEXPIRE")
        .arg(&mine)
        .arg(LOAD_TTL_MS)
        .ignore()
        .cmd("ZADD")
        .arg(&replicas)
        .arg(now)
        .arg(&redis.replica)
        .ignore()
        .cmd("ZREMRANGEBYSCORE")
        .arg(&replicas)
        .arg("-inf")
        .arg(now.saturating_sub(LOAD_TTL_MS))
        .ignore()
        .cmd("PEXPIRE")
        .arg(&replicas)
        .arg(LOAD_TTL_MS * 4)
        .ignore()
        .cmd("ZRANGE")
        .arg(&replicas)
        .arg(0)
        .arg(-1);
    let Some((others,)): Option<(Vec<String>,)> = redis.pipeline("load_publish", &pipe).await
    else {
        return;
    };
    let others: Vec<String> = others.into_iter().filter(|r| *r != redis.replica).collect();
    let mut sums: HashMap<String, u32> = HashMap::new();
    if !others.is_empty() {
        let mut read = redis::pipe();
        for other in &others {
            read.cmd("HGETALL").arg(load_key(prefix, name, other));
        }
        let Some(loads): Option<Vec<HashMap<String, u32>>> =
            redis.pipeline("load_read", &read).await
        else {
            return;
        };
        for load in loads {
            for (addr, n) in load {
                *sums.entry(addr).or_default() += n;
            }
        }
    }
    for p in &route.peers {
        p.state
            .set_remote_in_flight(sums.get(&p.state.address).copied().unwrap_or(0));
    }
}

/// Writes back the bindings placed while Redis was away, never over a
/// binding another replica wrote meanwhile (set-if-absent; the loser adopts
/// the winner for its next turn).
async fn write_back(redis: &RedisStore, registry: &Registry, now: u64) {
    let dirty = redis.take_dirty();
    if dirty.is_empty() {
        return;
    }
    let mut written = 0usize;
    for (route_name, sid) in dirty {
        let Some(route) = registry.route(&route_name) else {
            continue;
        };
        let Some(stored) = local_binding(&route, sid, now) else {
            continue;
        };
        let ttl = route.config.balancing.idle_timeout;
        match redis.set_if_absent(&route_name, sid, &stored, ttl).await {
            Ok(None) => written += 1,
            Ok(Some(winner)) => {
                super::adopt(&route, sid, &winner, now);
            }
            Err(()) => {
                redis.mark_dirty(&route_name, sid);
                break;
            }
        }
    }
    if written > 0 {
        log::info!("session store: wrote back {written} binding(s) placed while Redis was away");
    }
}

/// This replica's binding of `sid`, as the store writes it.
pub fn local_binding(route: &Route, sid: u64, now: u64) -> Option<StoredBinding> {
    let (peer, moved_ago) = route.runtime.sessions.binding_of(sid, now)?;
    let (_, p) = route.peer_by_id(peer)?;
    Some(StoredBinding {
        peer: p.state.address.clone(),
        bound_at_ms: now,
        moved_at_ms: moved_ago.map_or(0, |ago| now.saturating_sub(ago).max(1)),
        last_seen_ms: now,
    })
}
