//! The per-route session table: which peer each live session is bound to.
//!
//! Storage: `SHARD_COUNT` shards, each a `parking_lot::Mutex` around a hash map
//! from the session hash to a 20-byte [`Binding`]. A session's shard is chosen
//! by a per-process keyed hash of its id, and every map uses its own keyed
//! hasher too: session hashes are public (`X-Routed-Session`) and unkeyed, so
//! a client could otherwise craft ids that pile into one shard or one probe
//! chain.
//!
//! Each verdict is made while holding the session's shard lock, so racing
//! first requests of one session serialise: the first inserts, the rest find
//! its binding and stick to it. Locks are held for a map lookup plus a pass
//! over the peer list, never for a scan, except by expiry scans, which lock one
//! shard at a time.
//!
//! Time: the caller passes `now_ms` (any monotonic-enough millisecond clock);
//! the table stores deciseconds since the first `now_ms` it saw, as `u32`
//! (13 years of uptime). Decisecond steps are far below the one-minute scale of
//! both the idle timeout and the cooldown, and halve the entry size compared
//! with `u64` milliseconds.

mod binding;
mod counts;
mod explain;
mod live;
mod sizes;
mod slots;
mod storage;
mod think_gaps;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering::Relaxed};

use arc_swap::ArcSwap;
use parking_lot::{Mutex, RwLock};
use std::sync::Arc;

use super::incoming::Incoming;
use super::model::RouteModel;
use super::pick::rendezvous;
use super::rules::{self, Limits, Verdict};
use super::{KvRoom, PeerId, PeerLoad, Placement, PlacementKind, Reason};

use binding::{touch, Binding, Shard, ShardMap, EMPTY_SHARD, SHARD_COUNT, TICK_MS};
use counts::{LiveCounts, Share};
use sizes::EndedSizes;
use think_gaps::ThinkGaps;

/// Tunables of one route's table; `set_config` applies a reload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableConfig {
    /// A session unused for this long is forgotten.
    pub idle_timeout_ms: u64,
    /// Past this many bindings on a peer, new sessions whose chosen peer it is
    /// go to their hash home unremembered.
    pub max_sessions_per_peer: usize,
    /// After a move, no further move for pressure for this long.
    pub cooldown_ms: u64,
    /// With fresh engine metrics: spill when queuing and at least this many
    /// requests above the least-loaded other peer with KV room.
    pub spill_margin: u32,
    /// Without fresh engine metrics: spill when at least this many requests
    /// above it (wider, as in-flight counts alone cannot see a queue).
    pub spill_margin_blind: u32,
    /// A bound session counts as live on its peer (holding KV there between
    /// turns) while a turn is in flight and for this long after its last
    /// answer at most: the table learns how long its clients think between
    /// turns and uses twice their 90th percentile when that is shorter (see
    /// `ThinkGaps`).
    pub live_window_ms: u64,
    /// A peer takes a new session only while its live sessions' tokens plus
    /// the newcomer's stay within this share (per mille) of its KV capacity,
    /// and so do its live sessions, the newcomer included, counted at the
    /// median size of the route's live sessions (`PeerLoad::fits`).
    pub kv_admit_permille: u32,
}

impl Default for TableConfig {
    fn default() -> Self {
        TableConfig {
            idle_timeout_ms: 30 * 60 * 1000,
            max_sessions_per_peer: 100_000,
            cooldown_ms: 60_000,
            spill_margin: 4,
            spill_margin_blind: 8,
            live_window_ms: 10_000,
            kv_admit_permille: 900,
        }
    }
}

/// The outcome of one placement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    Placed(Placement),
    NoReadyPeer,
    /// A new session fits no ready peer's KV; asked with `may_wait` only.
    NoKvRoom,
}

impl TableConfig {
    fn limits(&self, expected_session: u64, model: RouteModel) -> Limits {
        Limits {
            spill_margin: self.spill_margin,
            spill_margin_blind: self.spill_margin_blind,
            cooldown_ms: self.cooldown_ms,
            room: KvRoom {
                admit_permille: self.kv_admit_permille,
                expected_session,
            },
            model: RouteModel {
                admit_permille: self.kv_admit_permille,
                ..model
            },
        }
    }
}

/// Where each live session of one route runs. `Send + Sync`: one per route,
/// shared by every worker thread.
pub struct SessionTable {
    shards: Box<[Shard]>,
    shard_selector: ahash::RandomState,
    /// Swapped whole by a reload, so a placement sees one version.
    config: ArcSwap<TableConfig>,
    /// The `now_ms` that tick 0 stands for; `u64::MAX` until the first call.
    epoch_ms: AtomicU64,
    /// Bindings per peer. The lock is written only when a peer is first seen
    /// or forgotten; placements take it shared and update the atomics.
    per_peer: RwLock<HashMap<PeerId, AtomicUsize>>,
    total: AtomicUsize,
    shard_scans: AtomicU64,
    /// Live sessions and their tokens per peer: kept up to date on every
    /// placement, recounted exactly by [`SessionTable::refresh_live`] (which
    /// also ages out sessions that left the live window).
    live: RwLock<HashMap<PeerId, LiveCounts>>,
    think: ThinkGaps,
    /// Median context of the live sessions at the last recount: the size a
    /// young session is expected to grow to (KV admission).
    median_live_tokens: AtomicU64,
    /// The sizes sessions ended at: what a young session will hold.
    ended: EndedSizes,
    /// The tick of the last recount: sessions that left the live window
    /// since then ended.
    last_recount: AtomicU32,
}

/// What `peek` and `place` need from one locked look at the session's shard.
enum Attempt {
    Done(Admission),
    /// The target had no room and something may have expired: scan, retry.
    SweepAndRetry,
}

impl SessionTable {
    pub fn new(cfg: TableConfig) -> Self {
        let shards = (0..SHARD_COUNT)
            .map(|_| Shard {
                map: Mutex::new(ShardMap::with_hasher(ahash::RandomState::new())),
                oldest_bound: AtomicU32::new(EMPTY_SHARD),
            })
            .collect();
        SessionTable {
            shards,
            shard_selector: ahash::RandomState::new(),
            config: ArcSwap::from_pointee(cfg),
            epoch_ms: AtomicU64::new(u64::MAX),
            per_peer: RwLock::new(HashMap::new()),
            total: AtomicUsize::new(0),
            shard_scans: AtomicU64::new(0),
            live: RwLock::new(HashMap::new()),
            think: ThinkGaps::default(),
            median_live_tokens: AtomicU64::new(0),
            ended: EndedSizes::default(),
            last_recount: AtomicU32::new(0),
        }
    }

    /// Applies a reload. A shorter idle timeout takes effect at the next sweep
    /// (and at once for sessions looked up); a lower per-peer cap only stops
    /// new bindings, it evicts none.
    pub fn set_config(&self, cfg: TableConfig) {
        self.config.store(Arc::new(cfg));
    }

    pub fn config(&self) -> TableConfig {
        **self.config.load()
    }

    /// What the placement model knows of the route: the median speeds of
    /// the engines timed so far and the size sessions grow to here.
    pub fn model(&self, peers: &[PeerLoad]) -> RouteModel {
        // On the stack: this runs on every placement.
        let median = |speed: fn(&PeerLoad) -> Option<f32>| {
            let mut timed = [0f32; 64];
            let mut n = 0;
            for v in peers.iter().filter_map(speed) {
                if n == timed.len() {
                    break;
                }
                timed[n] = v;
                n += 1;
            }
            let timed = &mut timed[..n];
            if timed.is_empty() {
                return None;
            }
            let mid = timed.len() / 2;
            Some(*timed.select_nth_unstable_by(mid, f32::total_cmp).1)
        };
        RouteModel {
            prefill_us: median(|p| p.speed.prefill_us),
            tpot_us: median(|p| p.speed.tpot_us),
            completions_per_s: median(|p| p.speed.completions_per_s),
            typical_session: self.ended.typical(),
            admit_permille: self.config.load().kv_admit_permille,
        }
    }

    /// The size sessions of this route grow to (0 while unknown).
    pub fn typical_session(&self) -> u64 {
        self.ended.typical()
    }

    /// Places one request of session `sid` and records the outcome. `None`
    /// iff no peer is ready.
    pub fn place(&self, sid: u64, peers: &[PeerLoad], now_ms: u64) -> Option<Placement> {
        match self.place_session(sid, Incoming::default(), peers, now_ms) {
            Admission::Placed(placement) => Some(placement),
            Admission::NoReadyPeer | Admission::NoKvRoom => None,
        }
    }

    /// [`place`](Self::place) for a request of known size, which a new
    /// session may have to wait with (`incoming.may_wait`) when it fits no
    /// peer's KV.
    pub fn place_session(
        &self,
        sid: u64,
        incoming: Incoming,
        peers: &[PeerLoad],
        now_ms: u64,
    ) -> Admission {
        let now = self.tick(now_ms);
        // One retry is enough: the scan resets every bound it visits, so a
        // second attempt would find nothing more to expire.
        for may_sweep in [true, false] {
            match self.try_place(sid, incoming, peers, now, may_sweep) {
                Attempt::Done(admission) => return admission,
                Attempt::SweepAndRetry => {
                    self.sweep_ticks(now);
                }
            }
        }
        table_full(sid, peers).map_or(Admission::NoReadyPeer, Admission::Placed)
    }

    fn try_place(
        &self,
        sid: u64,
        incoming: Incoming,
        peers: &[PeerLoad],
        now: u32,
        may_sweep: bool,
    ) -> Attempt {
        let shard = self.shard(sid);
        let mut map = shard.map.lock();
        let remembered = self.live_binding(&mut map, sid, now);
        let known = map.get(&sid).copied();
        let was = known.map_or(Share::default(), |b| self.share_of(&b, now));
        if let Some(answered) = known
            .filter(|b| !b.in_flight())
            .and_then(|b| b.answered_at())
        {
            self.think.record(now.saturating_sub(answered));
        }
        // At least what the session held after its last turn.
        let tokens = known.map_or(incoming.tokens, |b| {
            incoming.tokens.max(u64::from(b.tokens))
        });
        let config = self.config.load();
        let sized = Incoming { tokens, ..incoming };
        let limits = config.limits(self.median_live_tokens.load(Relaxed), self.model(peers));
        let (verdict, _) = rules::decide(sid, remembered, peers, limits, sized);
        let cap = config.max_sessions_per_peer;
        let placed =
            |peer, kind, reason| Attempt::Done(Admission::Placed(Placement { peer, kind, reason }));
        match verdict {
            Verdict::NoReadyPeer => Attempt::Done(Admission::NoReadyPeer),
            Verdict::NoRoom => Attempt::Done(Admission::NoKvRoom),
            Verdict::Stay { on } => {
                touch(&mut map, sid, now);
                self.live_change(on, was, self.share_in(&map, sid, now));
                placed(on, PlacementKind::Sticky, None)
            }
            Verdict::New { to } => {
                if self.reserve(to, cap) {
                    let binding = Binding {
                        peer: to,
                        last_seen: now,
                        moved_at_plus_one: 0,
                        tokens: saturate_u32(tokens),
                        answered_plus_one: 0,
                    };
                    self.live_change(to, Share::default(), self.share_of(&binding, now));
                    map.insert(sid, binding);
                    self.total.fetch_add(1, Relaxed);
                    if now < shard.oldest_bound.load(Relaxed) {
                        shard.oldest_bound.store(now, Relaxed);
                    }
                    return placed(to, PlacementKind::New, None);
                }
                if may_sweep && self.may_hold_expired(now) {
                    return Attempt::SweepAndRetry;
                }
                Attempt::Done(full(sid, peers))
            }
            Verdict::Spill { from, to, reason } => {
                // Moving keeps the table's size; it must not break the other
                // peer's cap though, and staying is still a valid answer.
                if self.reserve(to, cap) {
                    self.rebind(&mut map, sid, from, to, now);
                    self.live_move(from, was, to, self.share_in(&map, sid, now));
                    return placed(to, PlacementKind::Spill, Some(reason));
                }
                touch(&mut map, sid, now);
                self.live_change(from, was, self.share_in(&map, sid, now));
                placed(from, PlacementKind::Sticky, None)
            }
            Verdict::Park { from } => {
                self.forget(&mut map, sid, from, was);
                Attempt::Done(Admission::NoKvRoom)
            }
            Verdict::Migrate { from, to } => {
                if self.reserve(to, cap) {
                    self.rebind(&mut map, sid, from, to, now);
                    self.live_move(from, was, to, self.share_in(&map, sid, now));
                    return placed(to, PlacementKind::Migrated, Some(Reason::NotReady));
                }
                if may_sweep && self.may_hold_expired(now) {
                    return Attempt::SweepAndRetry;
                }
                // Its peer is gone and there is no room elsewhere: forget it,
                // so it is not counted against a peer it no longer uses.
                self.forget(&mut map, sid, from, was);
                Attempt::Done(full(sid, peers))
            }
        }
    }

    /// The peer `sid` is bound to, and how long ago it last moved (`None`:
    /// never), unless it has no live binding.
    pub fn binding_of(&self, sid: u64, now_ms: u64) -> Option<(PeerId, Option<u64>)> {
        let now = self.tick(now_ms);
        let map = self.shard(sid).map.lock();
        let b = map.get(&sid).filter(|b| !self.expired(b.last_seen, now))?;
        let ago = b
            .moved_at()
            .map(|t| u64::from(now.saturating_sub(t)) * TICK_MS);
        Some((b.peer, ago))
    }

    /// Takes a binding decided elsewhere (another replica, through the
    /// shared session store): `sid` is on `peer`, moved `moved_ago_ms` ago
    /// (`None`: never). The session keeps its tokens and last use; the cap
    /// is not checked, since the binding exists already, and a later move
    /// still waits out the cooldown from the shared move time.
    pub fn adopt(&self, sid: u64, peer: PeerId, moved_ago_ms: Option<u64>, now_ms: u64) {
        let now = self.tick(now_ms);
        let moved_plus_one = moved_ago_ms.map_or(0, |ago| {
            now.saturating_sub(u32::try_from(ago / TICK_MS).unwrap_or(u32::MAX)) + 1
        });
        let shard = self.shard(sid);
        let mut map = shard.map.lock();
        match map.get_mut(&sid) {
            Some(b) if b.peer == peer => {
                b.moved_at_plus_one = b.moved_at_plus_one.max(moved_plus_one);
            }
            Some(b) => {
                let from = b.peer;
                let was = self.share_of(b, now);
                b.peer = peer;
                b.moved_at_plus_one = moved_plus_one;
                self.release(from, 1);
                self.force_reserve(peer);
                // Only a live session counts on its new peer too.
                self.live_move(from, was, peer, was);
            }
            None => {
                map.insert(
                    sid,
                    Binding {
                        peer,
                        last_seen: now,
                        moved_at_plus_one: moved_plus_one,
                        tokens: 0,
                        answered_plus_one: 0,
                    },
                );
                self.total.fetch_add(1, Relaxed);
                self.force_reserve(peer);
                self.live_change(peer, Share::default(), self.share_in(&map, sid, now));
                if now < shard.oldest_bound.load(Relaxed) {
                    shard.oldest_bound.store(now, Relaxed);
                }
            }
        }
    }

    /// A turn of the session ended, with its context (its prompt plus the
    /// reply, from the engine's usage) when the answer carried one: what it
    /// holds on its peer until the next turn. Every placed request ends
    /// here, answered or not, so that "in flight" ends with it.
    pub fn turn_ended(&self, sid: u64, tokens: Option<u64>, now_ms: u64) {
        let now = self.tick(now_ms);
        let mut map = self.shard(sid).map.lock();
        let Some(binding) = map.get_mut(&sid) else {
            return;
        };
        let was = self.share_of(binding, now);
        self.think.record_answer();
        if let Some(tokens) = tokens {
            binding.tokens = saturate_u32(tokens);
        }
        binding.last_seen = binding.last_seen.max(now);
        binding.answered_plus_one = binding.last_seen.saturating_add(1);
        let (peer, is) = (binding.peer, self.share_of(binding, now));
        drop(map);
        self.live_change(peer, was, is);
    }

    /// A binding taken from the shared store has no size here: its engine
    /// is taken to hold at least `tokens` of the session (the turn that
    /// brought it), as this replica would know had the session's last turn
    /// come through it. Counted as holding nothing, every such turn looked
    /// cold at home and free to move: two replicas on Redis moved sessions
    /// 8-11 times a run where one gateway moved none (issue 47).
    pub fn assume_held(&self, sid: u64, tokens: u64, now_ms: u64) {
        let now = self.tick(now_ms);
        let mut map = self.shard(sid).map.lock();
        let Some(binding) = map.get_mut(&sid) else {
            return;
        };
        let tokens = saturate_u32(tokens);
        if binding.tokens >= tokens {
            return;
        }
        let was = self.share_of(binding, now);
        binding.tokens = tokens;
        let (peer, is) = (binding.peer, self.share_of(binding, now));
        drop(map);
        self.live_change(peer, was, is);
    }

    /// Whether `sid` is bound to a peer (and not expired): its next turn is
    /// a warm one.
    pub fn is_bound(&self, sid: u64, now_ms: u64) -> bool {
        let now = self.tick(now_ms);
        let map = self.shard(sid).map.lock();
        map.get(&sid)
            .is_some_and(|binding| !self.expired(binding.last_seen, now))
    }
}

fn saturate_u32(n: u64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

fn full(sid: u64, peers: &[PeerLoad]) -> Admission {
    table_full(sid, peers).map_or(Admission::NoReadyPeer, Admission::Placed)
}

/// The rendezvous home, unremembered: the placement for a session the table
/// has no room for. Hashing keeps a repeated id on one peer even so.
fn table_full(sid: u64, peers: &[PeerLoad]) -> Option<Placement> {
    rendezvous(sid, peers).map(|peer| Placement {
        peer,
        kind: PlacementKind::TableFull,
        reason: Some(Reason::TableFull),
    })
}

const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<SessionTable>();
    assert!(std::mem::size_of::<Binding>() == 20);
    assert!(SHARD_COUNT.is_power_of_two());
};

#[cfg(test)]
mod tests;
