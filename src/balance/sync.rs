//! The cluster sync: the background task that shares this replica's
//! placement state through the session store (`crate::store`, which knows
//! nothing of routes). It keeps the connections open, publishes this
//! replica's in-flight and cold prompt tokens per peer and reads the
//! others' (every `session_store.sync_interval`, 50 ms by default),
//! publishes and reads the live sessions (every `SESSIONS_EVERY`-th time,
//! 250 ms; a replica's numbers expire `load_ttl_ms` after its last publish,
//! 1.5 s, so a replica that died stops counting within that bound),
//! shares the tenants' budget windows at the sessions' pace
//! (`tenants/shared.rs`), writes back the sessions placed while Redis was
//! away, and sweeps old sync times. It runs through a drain (`server.rs` `UntilExit`), until
//! the process exits: a draining replica's streams still load their
//! engines, and the others must go on counting them.
//!
//! Staleness: another replica's in-flight is at most one interval old
//! when published plus one interval until it is read here, so
//! placement's cluster in-flight lags by at most ~0.1 s; its live sessions
//! by at most ~0.5 s. In-flight goes at the faster pace because it is what
//! a spill weighs, turn by turn: at 250 ms, two replicas' TTFT p95 on the
//! agent replay was 12-16 % over one replica's, at 50 ms level with it
//! (BENCHMARKS.md, scale-out). Sessions change only at a session's first
//! turn or a move, and their list grows with the cluster, so they keep the
//! slower pace.

use crate::clock::now_ms;
use crate::registry::{Registry, Route};
use crate::store::binding::{live_key, load_key, replicas_key, StoredBinding};
use crate::store::{RedisStore, SessionStore};
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// Live sessions go out every this many in-flight publishes (250 ms).
const SESSIONS_EVERY: u64 = 5;
const LOAD_TTL_MS: u64 = 1_500;
/// Past this many live sessions a replica publishes none (the others then
/// see only its in-flight): the list would cost more than it tells.
const MAX_PUBLISHED_SESSIONS: usize = 50_000;
/// Sync times are swept every this many publishes (10 s).
const SWEEP_EVERY: u64 = 200;

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
        let load_ttl = load_ttl_ms(redis.sync_interval());
        let mut tick = tokio::time::interval(redis.sync_interval());
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut ticks = 0u64;
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = shutdown.changed() => return,
            }
            ticks += 1;
            let sessions = ticks % SESSIONS_EVERY == 1;
            // Redis away: reconnect and retry at the slower pace, so an
            // outage costs what it cost before the in-flight got faster.
            if !sessions && !redis.is_up() {
                continue;
            }
            redis.ensure_connected().await;
            let was_up = redis.is_up();
            let now = now_ms();
            let snapshot = self.registry.snapshot();
            for route in snapshot.values() {
                exchange_load(redis, route, now, sessions, load_ttl).await;
            }
            // Without a tenants file there are no budgets to share.
            if sessions && self.registry.tenants().tracked() {
                crate::tenants::shared::exchange(redis, self.registry.tenants(), now, load_ttl)
                    .await;
            }
            if redis.is_up() {
                write_back(redis, &self.registry, now).await;
            } else if was_up {
                // Down now: the other replicas' numbers are of no use.
                self.registry.tenants().set_elsewhere(&HashMap::new(), now);
                for route in snapshot.values() {
                    for p in &route.peers {
                        p.state.set_remote_in_flight(0);
                        p.state.set_remote_cold_backlog_tokens(0);
                        p.state.note_remote_claims(0, 0, 0);
                        p.state.clear_cluster_bound();
                    }
                }
            }
            if ticks.is_multiple_of(SWEEP_EVERY) {
                // Sync times outlive the trust window only to pace TTL
                // refreshes; a day-old one paces nothing.
                redis.sweep_synced(now, 24 * 3_600_000);
            }
        }
    }
}

/// Publishes this replica's in-flight and cold prompt tokens per peer of
/// `route` and (with `sessions`) its live sessions, and sums the other live
/// replicas' into each peer's `remote_in_flight`, its
/// `remote_cold_backlog_tokens` and (with `sessions`) cluster-wide bound
/// sessions. A session live on several replicas (its turns went through
/// each) counts once: the union of the published session hashes is what is
/// bound.
/// How long a replica's published numbers count: 1.5 s, or 30 syncs where
/// the interval is set longer, so that a replica alive is never taken for
/// gone between two publishes.
fn load_ttl_ms(sync_interval: Duration) -> u64 {
    let interval = u64::try_from(sync_interval.as_millis()).unwrap_or(u64::MAX);
    LOAD_TTL_MS.max(interval.saturating_mul(30))
}

async fn exchange_load(redis: &RedisStore, route: &Route, now: u64, sessions: bool, ttl: u64) {
    let prefix = redis.prefix();
    let name = route.name();
    let mine = load_key(prefix, name, &redis.replica);
    let replicas = replicas_key(prefix, name);
    let table = &route.runtime.sessions;
    let live = if sessions {
        table.live_sessions(now)
    } else {
        Vec::new()
    };
    let addr_of = |id| route.peer_by_id(id).map(|(_, p)| p.state.address.as_str());
    let mut pipe = redis::pipe();
    if sessions {
        let mut blob = String::new();
        if live.len() <= MAX_PUBLISHED_SESSIONS {
            for (peer, sid, tokens) in &live {
                if let Some(addr) = addr_of(*peer) {
                    blob.push_str(&format!("{sid:016x} {addr} {tokens}\n"));
                }
            }
        }
        pipe.cmd("SET")
            .arg(live_key(prefix, name, &redis.replica))
            .arg(&blob)
            .arg("PX")
            .arg(ttl)
            .ignore();
    }
    let hset = pipe.cmd("HSET").arg(&mine);
    for p in &route.peers {
        hset.arg(&p.state.address).arg(p.state.in_flight());
        hset.arg(cold_field(&p.state.address))
            .arg(p.state.cold_backlog_tokens());
    }
    pipe.ignore().cmd("PEXPIRE").arg(&mine).arg(ttl).ignore();
    redis.roll_call(&mut pipe, &replicas, now, ttl, true);
    let Some((roll,)): Option<(Vec<String>,)> = redis.pipeline("load_publish", &pipe).await else {
        return;
    };
    let others = redis.others(roll);
    let mut sums: HashMap<String, u64> = HashMap::new();
    // session → (peer address, tokens): this replica's view first.
    let mut bound: HashMap<u64, (String, u64)> = live
        .iter()
        .filter_map(|(peer, sid, tokens)| {
            Some((*sid, (addr_of(*peer)?.to_string(), u64::from(*tokens))))
        })
        .collect();
    if !others.is_empty() {
        let mut read = redis::pipe();
        for other in &others {
            read.cmd("HGETALL").arg(load_key(prefix, name, other));
            if sessions {
                read.cmd("GET").arg(live_key(prefix, name, other));
            }
        }
        let Some(replies): Option<Vec<redis::Value>> = redis.pipeline("load_read", &read).await
        else {
            return;
        };
        let mut replies = replies.into_iter();
        while let Some(load) = replies.next() {
            let load: HashMap<String, u64> =
                redis::FromRedisValue::from_redis_value(load).unwrap_or_default();
            for (addr, n) in load {
                *sums.entry(addr).or_default() += n;
            }
            if !sessions {
                continue;
            }
            let published: Option<String> = replies
                .next()
                .and_then(|v| redis::FromRedisValue::from_redis_value(v).ok());
            for (sid, addr, tokens) in published.iter().flat_map(|s| parse_live(s)) {
                bound.entry(sid).or_insert((addr, tokens));
            }
        }
    }
    let sum = |field: &str| sums.get(field).copied().unwrap_or(0);
    for p in &route.peers {
        let in_flight = u32::try_from(sum(&p.state.address)).unwrap_or(u32::MAX);
        p.state.set_remote_in_flight(in_flight);
        p.state
            .set_remote_cold_backlog_tokens(sum(&cold_field(&p.state.address)));
    }
    if !sessions {
        return;
    }
    let mut per_peer: HashMap<&str, crate::placement::Bound> = HashMap::new();
    for (addr, tokens) in bound.values() {
        let b = per_peer.entry(addr.as_str()).or_default();
        *b = crate::placement::Bound::whole(b.sessions + 1, b.tokens + tokens);
    }
    for p in &route.peers {
        let cluster = per_peer
            .get(p.state.address.as_str())
            .copied()
            .unwrap_or_default();
        p.state
            .set_cluster_bound(cluster, table.live_of(p.state.id), now, 2 * ttl);
    }
}

/// The load hash's field for a peer's cold prompt tokens before their first
/// token, beside the peer's in-flight under its address. A replica of an
/// earlier version sums it under an address no peer has: no harm.
fn cold_field(address: &str) -> String {
    format!("cold:{address}")
}

/// The lines `exchange_load` publishes: `<sid hex> <host:port> <tokens>`;
/// a line that does not parse is skipped.
fn parse_live(text: &str) -> impl Iterator<Item = (u64, String, u64)> + '_ {
    text.lines().filter_map(|line| {
        let mut parts = line.split(' ');
        let sid = u64::from_str_radix(parts.next()?, 16).ok()?;
        let addr = parts.next().filter(|a| !a.is_empty())?.to_string();
        let tokens = parts.next()?.parse().ok()?;
        Some((sid, addr, tokens))
    })
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
                adopt(&route, sid, &winner, 0, now);
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

/// Makes the local table follow a binding another replica wrote; a peer
/// this replica does not have (a route file not yet reloaded here) is
/// ignored, and the local placement rules decide. `held`: the context the
/// turn adopting it sends (0 off a turn), which its engine is taken to
/// hold at least (`SessionTable::assume_held`).
pub fn adopt(route: &Route, sid: u64, b: &StoredBinding, held: u64, now_ms: u64) -> bool {
    let Some(p) = route.peers.iter().find(|p| p.state.address == b.peer) else {
        return false;
    };
    route
        .runtime
        .sessions
        .adopt(sid, p.state.id, b.moved_ago_ms(now_ms), now_ms);
    if held > 0 {
        route.runtime.sessions.assume_held(sid, held, now_ms);
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn published_live_sessions_parse_back_and_bad_lines_are_skipped() {
        let text = "00000000000000ff 10.0.0.1:8000 1200\nnot a line\n0000000000000001 h:1 x\n0000000000000002 h:2 7\n";
        let parsed: Vec<_> = parse_live(text).collect();
        assert_eq!(
            parsed,
            vec![
                (255, "10.0.0.1:8000".to_string(), 1200),
                (2, "h:2".to_string(), 7)
            ]
        );
    }

    #[test]
    fn the_cluster_view_adds_what_changed_here_since_and_ages_out() {
        use crate::placement::Bound;
        let state = crate::registry::PeerState::for_tests("h:1");
        let local = Bound::whole;
        // No cluster view yet: the local count.
        assert_eq!(state.bound(local(2, 20), 1_000), local(2, 20));
        // 10 sessions across the cluster, 2 of them here at the exchange;
        // since then one more was placed here.
        state.set_cluster_bound(local(10, 100), local(2, 20), 1_000, 3_000);
        assert_eq!(state.bound(local(3, 30), 1_200), local(11, 110));
        // A stale view (Redis away) gives way to the local count.
        assert_eq!(state.bound(local(3, 30), 5_000), local(3, 30));
    }
}
