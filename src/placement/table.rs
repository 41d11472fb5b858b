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
//!
//! Expiry: each shard keeps a lower bound on the oldest `last_seen` it holds.
//! Inserts lower it, refreshes leave it alone (they only make entries newer),
//! and a scan of the shard resets it to the exact oldest. A shard is scanned
//! only when that bound says something in it can have expired, so a full
//! table with a client sending a fresh id per request costs a few atomic loads
//! per request, not an O(n) scan under a lock.
//!
//! Counts: per-peer binding counts are atomics, reserved with a conditional
//! increment before an insert, so the per-peer cap is exact and checked in O(1).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering::Relaxed};

use arc_swap::ArcSwap;
use parking_lot::{Mutex, RwLock};
use std::sync::Arc;

use super::load::rendezvous;
use super::rules::{self, Limits, Remembered, Verdict};
use super::{Bound, KvRoom, PeerId, PeerLoad, Placement, PlacementKind, Reason, WHOLE};

/// Enough shards that worker threads (a few dozen at most) rarely meet on one
/// lock, few enough that a scan's per-shard fixed costs stay negligible.
const SHARD_COUNT: usize = 64;
const SHARD_BITS: u32 = SHARD_COUNT.trailing_zeros();
const TICK_MS: u64 = 100;
/// Shard bound of an empty shard: nothing in it can expire.
const EMPTY_SHARD: u32 = u32::MAX;
/// Largest tick stored, so `tick + 1` (the moved-at encoding) never overflows.
const MAX_TICK: u32 = u32::MAX - 1;

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

/// What the caller knows about the request being placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Incoming {
    /// Context tokens of this request, as far as the gateway can tell
    /// before the engine answers (prompt bytes / 4).
    pub tokens: u64,
    /// A new session that fits no peer's KV may wait for room (the route has
    /// an admission queue) instead of being placed anyway.
    pub may_wait: bool,
}

/// The outcome of one placement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    Placed(Placement),
    NoReadyPeer,
    /// A new session fits no ready peer's KV; asked with `may_wait` only.
    NoKvRoom,
}

/// One remembered session, 20 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Binding {
    peer: PeerId,
    /// Tick of its last turn's start or end, whichever is later.
    last_seen: u32,
    /// Tick of the last move plus one; 0 when the session never moved.
    moved_at_plus_one: u32,
    /// The session's context tokens as last seen (its prompt plus the reply).
    tokens: u32,
    /// Tick its last turn ended plus one; 0 before any turn ended.
    answered_plus_one: u32,
}

impl Binding {
    fn moved_at(&self) -> Option<u32> {
        self.moved_at_plus_one.checked_sub(1)
    }

    fn answered_at(&self) -> Option<u32> {
        self.answered_plus_one.checked_sub(1)
    }

    /// A turn started after the last one ended (or none has ended yet).
    fn in_flight(&self) -> bool {
        self.answered_at()
            .is_none_or(|answered| self.last_seen > answered)
    }
}

type ShardMap = HashMap<u64, Binding, ahash::RandomState>;

/// Aligned to a cache line so that neighbouring shards' locks and bounds do
/// not share one, which would make uncontended shards contend in hardware.
#[repr(align(64))]
struct Shard {
    map: Mutex<ShardMap>,
    /// Lower bound on the oldest `last_seen` in `map`, `EMPTY_SHARD` when it
    /// holds nothing. Written only under `map`'s lock; read without it.
    oldest_bound: AtomicU32,
}

impl TableConfig {
    fn limits(&self, expected_session: u64) -> Limits {
        Limits {
            spill_margin: self.spill_margin,
            spill_margin_blind: self.spill_margin_blind,
            cooldown_ms: self.cooldown_ms,
            room: KvRoom {
                admit_permille: self.kv_admit_permille,
                expected_session,
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
}

/// How long sessions of this route stay away between an answer and their
/// next turn, as a histogram of recent gaps. A session that ended never
/// comes back, yet a fixed live window keeps counting it for the whole
/// window: on the overload bench a session ends every ~2 s, so a 10 s
/// window counted ~5 ended sessions of up to 60k tokens each against the
/// KV that admission and the over-KV check see. A
/// window of twice the 90th percentile of real gaps lets an ended session
/// go within a few seconds and still keeps one that is thinking. The same
/// gaps, with the answers never followed by one, give a session inside the
/// window its chance of coming back (`returning_milli`).
#[derive(Debug, Default)]
struct ThinkGaps {
    counts: [AtomicU32; GAP_BUCKETS.len()],
    samples: AtomicU32,
    /// The learned window in ticks; 0 until enough gaps were seen.
    window_ticks: AtomicU32,
    /// Answers given, decayed with `counts`: those never followed by a gap
    /// are the sessions that ended.
    answers: AtomicU32,
    /// Per gap bucket, the chance (thousandths) that a session idle for a
    /// time in that bucket since its answer comes back (see `update`).
    /// Valid while `window_ticks` is set.
    returning_milli: [AtomicU32; GAP_BUCKETS.len()],
}

/// Upper bounds (ticks of 100 ms) of the gap buckets; the last is open.
const GAP_BUCKETS: [u32; 16] = [
    1,
    2,
    3,
    5,
    7,
    10,
    15,
    20,
    30,
    50,
    70,
    100,
    150,
    200,
    300,
    u32::MAX,
];
/// Gaps before the learned window is used; halved each time it is reached,
/// so the histogram follows the clients as they change.
const GAP_SAMPLES: u32 = 256;
/// Shortest learned window: one second, ten ticks.
const MIN_WINDOW_TICKS: u32 = 10;

impl ThinkGaps {
    fn record(&self, gap_ticks: u32) {
        let bucket = GAP_BUCKETS
            .iter()
            .position(|&bound| gap_ticks <= bound)
            .unwrap_or(GAP_BUCKETS.len() - 1);
        self.counts[bucket].fetch_add(1, Relaxed);
        if self.samples.fetch_add(1, Relaxed) + 1 >= 2 * GAP_SAMPLES {
            // Decay: older gaps and answers weigh half. Racing recorders may
            // each halve; every halving covers gaps and answers alike, and
            // only their proportions are read.
            for c in self.counts.iter().chain([&self.answers]) {
                let _ = c.fetch_update(Relaxed, Relaxed, |n| Some(n / 2));
            }
            self.samples.store(GAP_SAMPLES, Relaxed);
        }
    }

    /// Recomputes the window from the histogram (the sweeper, every second).
    fn update(&self) {
        let counts: Vec<u32> = self.counts.iter().map(|c| c.load(Relaxed)).collect();
        let total: u64 = counts.iter().map(|&c| u64::from(c)).sum();
        if total < u64::from(GAP_SAMPLES) {
            return;
        }
        let mut seen = 0u64;
        let p90 = counts
            .iter()
            .zip(GAP_BUCKETS)
            .find_map(|(&c, bound)| {
                seen += u64::from(c);
                (seen * 10 >= total * 9).then_some(bound)
            })
            .unwrap_or(u32::MAX);
        let window = p90.saturating_mul(2).max(MIN_WINDOW_TICKS);
        // Of the answers, `total` were followed by a gap and `ended` were
        // not. A session idle for x came back later with weight
        // `total * S(x)` (S: the share of gaps longer than x) or ended with
        // weight `ended`, so it comes back with chance
        // total*S(x) / (total*S(x) + ended). Where x falls inside a bucket
        // half of that bucket's gaps count as longer (2 * total * S(x) =
        // 2 * longer + in_bucket), as the histogram does not say where in
        // the bucket they fell. Answers still inside their think time count
        // as ended until their gap is recorded: a bias towards "gone" of
        // the sessions thinking now against the hundreds of answers counted.
        let ended = u64::from(self.answers.load(Relaxed)).saturating_sub(total);
        let mut longer = total;
        for (chance, &c) in self.returning_milli.iter().zip(&counts) {
            longer -= u64::from(c);
            let back = longer * 2 + u64::from(c);
            let milli = (back * u64::from(WHOLE))
                .checked_div(back + 2 * ended)
                .map_or(WHOLE, |m| u32::try_from(m).unwrap_or(WHOLE));
            chance.store(milli, Relaxed);
        }
        self.window_ticks.store(window, Relaxed);
    }

    fn record_answer(&self) {
        self.answers.fetch_add(1, Relaxed);
    }

    /// The chance (thousandths) that a session idle for `idle_ticks` since
    /// its answer comes back: whole until the gaps are learned.
    fn returning_milli(&self, idle_ticks: u32) -> u32 {
        if self.window().is_none() {
            return WHOLE;
        }
        let bucket = GAP_BUCKETS
            .iter()
            .position(|&bound| idle_ticks <= bound)
            .unwrap_or(GAP_BUCKETS.len() - 1);
        self.returning_milli[bucket].load(Relaxed)
    }

    /// The learned window in ticks, if there is one.
    fn window(&self) -> Option<u32> {
        Some(self.window_ticks.load(Relaxed)).filter(|&w| w > 0)
    }
}

/// When a session counts as live on its peer, in ticks.
#[derive(Debug, Clone, Copy)]
struct LiveRule {
    /// Before its first answer: the configured window since the turn began.
    configured_ticks: u64,
    /// After an answer: the configured window, or the learned one if shorter.
    after_answer_ticks: u64,
    /// A turn in flight holds its KV however long it runs; the idle timeout
    /// bounds one whose end was never seen.
    in_flight_ticks: u64,
}

impl LiveRule {
    fn holds(&self, binding: &Binding, now: u32) -> bool {
        let since = |t: u32| u64::from(now.saturating_sub(t));
        match binding.answered_at() {
            Some(answered) if !binding.in_flight() => since(answered) < self.after_answer_ticks,
            Some(_) => since(binding.last_seen) < self.in_flight_ticks,
            None => since(binding.last_seen) < self.configured_ticks,
        }
    }
}

/// A peer's [`Bound`], in atomics: placements add to it as they go, the
/// recount stores it whole.
#[derive(Debug, Default)]
struct LiveCounts {
    sessions: AtomicU32,
    returning_milli: AtomicU64,
    tokens: AtomicU64,
    returning_tokens: AtomicU64,
}

impl LiveCounts {
    fn load(&self) -> Bound {
        Bound {
            sessions: self.sessions.load(Relaxed),
            returning_milli: self.returning_milli.load(Relaxed),
            tokens: self.tokens.load(Relaxed),
            returning_tokens: self.returning_tokens.load(Relaxed),
        }
    }

    fn store(&self, bound: Bound) {
        self.sessions.store(bound.sessions, Relaxed);
        self.returning_milli.store(bound.returning_milli, Relaxed);
        self.tokens.store(bound.tokens, Relaxed);
        self.returning_tokens.store(bound.returning_tokens, Relaxed);
    }

    /// Replaces one session's `was` share with `is` (racing placements
    /// may interleave; the recount corrects any drift every second).
    fn change(&self, was: Share, is: Share) {
        let shift = |c: &AtomicU64, was: u64, is: u64| {
            if was != is {
                let _ = c.fetch_update(Relaxed, Relaxed, |n| {
                    Some(n.saturating_add(is).saturating_sub(was))
                });
            }
        };
        if was.sessions != is.sessions {
            let _ = self.sessions.fetch_update(Relaxed, Relaxed, |n| {
                Some(n.saturating_add(is.sessions).saturating_sub(was.sessions))
            });
        }
        let milli = |s: Share| u64::from(s.returning_milli);
        shift(&self.returning_milli, milli(was), milli(is));
        let tokens = |s: Share| u64::from(s.tokens);
        shift(&self.tokens, tokens(was), tokens(is));
        shift(
            &self.returning_tokens,
            was.returning_tokens(),
            is.returning_tokens(),
        );
    }
}

/// What one session adds to its peer's [`Bound`]; all zero when it is not live.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Share {
    sessions: u32,
    /// Its chance of coming back, in thousandths (see `live_share`).
    returning_milli: u32,
    tokens: u32,
}

impl Share {
    fn returning_tokens(&self) -> u64 {
        u64::from(self.tokens) * u64::from(self.returning_milli) / u64::from(WHOLE)
    }

    fn add_to(&self, bound: &mut Bound) {
        bound.sessions = bound.sessions.saturating_add(self.sessions);
        bound.returning_milli += u64::from(self.returning_milli);
        bound.tokens += u64::from(self.tokens);
        bound.returning_tokens += self.returning_tokens();
    }
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
        let tokens = known.map_or(incoming.tokens, |b| u64::from(b.tokens));
        let config = self.config.load();
        let sized = Incoming { tokens, ..incoming };
        let limits = config.limits(self.median_live_tokens.load(Relaxed));
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

    /// Recounts the live sessions and tokens of every peer exactly, so that
    /// sessions that left the live window stop counting, and takes their
    /// median size and the learned live window afresh. O(n), one shard
    /// lock at a time; the route's sweeper calls it every second.
    pub fn refresh_live(&self, now_ms: u64) {
        let now = self.tick(now_ms);
        let mut counts: HashMap<PeerId, Bound> = HashMap::new();
        let mut sizes: Vec<u32> = Vec::new();
        self.think.update();
        let rule = self.live_rule();
        for shard in self.shards.iter() {
            let map = shard.map.lock();
            for binding in map.values().filter(|b| rule.holds(b, now)) {
                self.live_share(binding, now)
                    .add_to(counts.entry(binding.peer).or_default());
                // Adopted from another replica and not yet served here: size unknown.
                if binding.tokens > 0 {
                    sizes.push(binding.tokens);
                }
            }
        }
        let median = match sizes.len() {
            0 => 0,
            n => *sizes.select_nth_unstable(n / 2).1,
        };
        self.median_live_tokens.store(u64::from(median), Relaxed);
        let mut live = self.live.write();
        for (peer, c) in live.iter() {
            c.store(counts.remove(peer).unwrap_or_default());
        }
        for (peer, bound) in counts {
            let c = LiveCounts::default();
            c.store(bound);
            live.insert(peer, c);
        }
    }

    /// Every live session: (peer, session hash, context tokens). O(n); the
    /// shared store's task calls it a few times a second to publish what
    /// this replica holds.
    pub fn live_sessions(&self, now_ms: u64) -> Vec<(PeerId, u64, u32)> {
        let now = self.tick(now_ms);
        let rule = self.live_rule();
        let mut out = Vec::new();
        for shard in self.shards.iter() {
            let map = shard.map.lock();
            out.extend(
                map.iter()
                    .filter(|(_, b)| rule.holds(b, now))
                    .map(|(sid, b)| (b.peer, *sid, b.tokens)),
            );
        }
        out
    }

    /// Live sessions bound to `peer` and their tokens.
    pub fn live_of(&self, peer: PeerId) -> Bound {
        self.live
            .read()
            .get(&peer)
            .map_or(Bound::default(), LiveCounts::load)
    }

    /// Live sessions and their tokens, per peer the table has seen (the
    /// request path reads one peer at a time with [`live_of`](Self::live_of)).
    #[cfg(test)]
    pub fn live_per_peer(&self) -> Vec<(PeerId, Bound)> {
        let live = self.live.read();
        let mut out: Vec<(PeerId, Bound)> =
            live.iter().map(|(peer, c)| (*peer, c.load())).collect();
        out.sort_unstable_by_key(|(peer, _)| *peer);
        out
    }

    /// The liveness rule in force now (read once per scan, not per binding).
    fn live_rule(&self) -> LiveRule {
        let config = self.config.load();
        let configured = config.live_window_ms / TICK_MS;
        let learned = self.think.window().map_or(u64::MAX, u64::from);
        LiveRule {
            configured_ticks: configured,
            after_answer_ticks: configured.min(learned),
            in_flight_ticks: config.idle_timeout_ms / TICK_MS,
        }
    }

    fn is_live(&self, binding: &Binding, now: u32) -> bool {
        self.live_rule().holds(binding, now)
    }

    /// What a session known to be live adds to its peer's counts: one
    /// session, its tokens, and its chance of coming back, in thousandths:
    /// whole while a turn is in flight or before its first answer; after an
    /// answer, what the route's answers say of sessions idle that long
    /// (`ThinkGaps::update`). The live window keeps a session that ended
    /// for up to twice the 90th percentile of gaps; weighed by its chance,
    /// a chat that ended a few seconds ago counts little and one answered a
    /// moment ago nearly whole. Measured on the skewed replay: with whole
    /// counts, engines where chats had just ended looked as full as ever,
    /// and new sessions went to an engine truly holding 11 sessions while
    /// another held 4.
    fn live_share(&self, binding: &Binding, now: u32) -> Share {
        let returning_milli = match binding.answered_at() {
            Some(answered) if !binding.in_flight() => {
                self.think.returning_milli(now.saturating_sub(answered))
            }
            _ => WHOLE,
        };
        Share {
            sessions: 1,
            returning_milli,
            tokens: binding.tokens,
        }
    }

    /// The live window in force after an answer, in milliseconds: learned
    /// or configured.
    pub fn live_window_ms(&self) -> u64 {
        self.live_rule().after_answer_ticks.saturating_mul(TICK_MS)
    }

    /// What `binding` adds to its peer's counts now.
    fn share_of(&self, binding: &Binding, now: u32) -> Share {
        if !self.is_live(binding, now) {
            return Share::default();
        }
        self.live_share(binding, now)
    }

    fn share_in(&self, map: &ShardMap, sid: u64, now: u32) -> Share {
        map.get(&sid)
            .map_or(Share::default(), |b| self.share_of(b, now))
    }

    /// One session's share of `peer`'s counts went from `was` to `is`.
    fn live_change(&self, peer: PeerId, was: Share, is: Share) {
        if was == is {
            return;
        }
        if let Some(c) = self.live.read().get(&peer) {
            return c.change(was, is);
        }
        self.live.write().entry(peer).or_default().change(was, is);
    }

    fn live_move(&self, from: PeerId, was: Share, to: PeerId, is: Share) {
        self.live_change(from, was, Share::default());
        self.live_change(to, Share::default(), is);
    }

    /// The verdict `place` would make now, and why, changing nothing. When
    /// the chosen peer's table share is full, `place` would first run an
    /// expiry scan if one could free room; the explanation says so.
    pub fn peek(&self, sid: u64, peers: &[PeerLoad], now_ms: u64) -> Option<(Placement, String)> {
        let now = self.tick(now_ms);
        let binding = {
            let map = self.shard(sid).map.lock();
            map.get(&sid)
                .copied()
                .filter(|binding| !self.expired(binding.last_seen, now))
        };
        let remembered = binding.map(|b| self.remembered(b, now));
        let incoming = Incoming {
            tokens: binding.map_or(0, |b| u64::from(b.tokens)),
            may_wait: false,
        };
        let config = self.config.load();
        let limits = config.limits(self.median_live_tokens.load(Relaxed));
        let (verdict, why) = rules::decide(sid, remembered, peers, limits, incoming);
        let mut explanation = rules::explain(verdict, why);
        let cap = config.max_sessions_per_peer;
        let placement = |peer, kind, reason| Placement { peer, kind, reason };
        let mut no_room = |to: PeerId| {
            explanation.push_str(&format!(
                "; but peer {to} already holds {cap} sessions, so the session goes to its hash home unremembered"
            ));
            if self.may_hold_expired(now) {
                explanation.push_str(" (unless the expiry scan place() runs first frees room)");
            }
            table_full(sid, peers)
        };
        let result = match verdict {
            Verdict::NoReadyPeer | Verdict::NoRoom | Verdict::Park { .. } => None,
            Verdict::Stay { on } => Some(placement(on, PlacementKind::Sticky, None)),
            Verdict::New { to } if self.has_room(to, cap) => {
                Some(placement(to, PlacementKind::New, None))
            }
            Verdict::Migrate { to, .. } if self.has_room(to, cap) => Some(placement(
                to,
                PlacementKind::Migrated,
                Some(Reason::NotReady),
            )),
            Verdict::New { to } | Verdict::Migrate { to, .. } => no_room(to),
            Verdict::Spill { to, reason, .. } if self.has_room(to, cap) => {
                Some(placement(to, PlacementKind::Spill, Some(reason)))
            }
            Verdict::Spill { from, to, .. } => {
                explanation.push_str(&format!(
                    "; but peer {to} already holds {cap} sessions, so the session stays"
                ));
                Some(placement(from, PlacementKind::Sticky, None))
            }
        };
        result.map(|placement| (placement, explanation))
    }

    /// Whether `sid` is bound to a peer (and not expired): its next turn is
    /// a warm one.
    pub fn is_bound(&self, sid: u64, now_ms: u64) -> bool {
        let now = self.tick(now_ms);
        let map = self.shard(sid).map.lock();
        map.get(&sid)
            .is_some_and(|binding| !self.expired(binding.last_seen, now))
    }

    /// Removes every expired session and returns how many. Shards whose bound
    /// says nothing in them can have expired are skipped without locking, so
    /// this costs `SHARD_COUNT` atomic loads when there is nothing to do.
    pub fn sweep(&self, now_ms: u64) -> usize {
        self.sweep_ticks(self.tick(now_ms))
    }

    fn sweep_ticks(&self, now: u32) -> usize {
        let mut removed_total = 0;
        let mut removed_per_peer: Vec<(PeerId, usize)> = Vec::new();
        for shard in self.shards.iter() {
            if !self.shard_may_hold_expired(shard, now) {
                continue;
            }
            let mut map = shard.map.lock();
            self.shard_scans.fetch_add(1, Relaxed);
            let mut oldest = EMPTY_SHARD;
            map.retain(|_, binding| {
                if self.expired(binding.last_seen, now) {
                    count_for(&mut removed_per_peer, binding.peer);
                    false
                } else {
                    oldest = oldest.min(binding.last_seen);
                    true
                }
            });
            shard.oldest_bound.store(oldest, Relaxed);
            drop(map);
            for (peer, count) in removed_per_peer.drain(..) {
                self.total.fetch_sub(count, Relaxed);
                self.release(peer, count);
                removed_total += count;
            }
        }
        removed_total
    }

    /// Binding counts of every peer the table has bound a session to (zero
    /// counts included, so a gauge can fall to 0), ordered by peer id.
    pub fn bindings_per_peer(&self) -> Vec<(PeerId, usize)> {
        let per_peer = self.per_peer.read();
        let mut counts: Vec<(PeerId, usize)> = per_peer
            .iter()
            .map(|(peer, count)| (*peer, count.load(Relaxed)))
            .collect();
        counts.sort_unstable();
        counts
    }

    /// Remembered sessions, including expired ones not yet swept.
    pub fn len(&self) -> usize {
        self.total.load(Relaxed)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Age of the least recently used session. Exact: it visits every entry,
    /// one shard lock at a time, so call it from metrics or debug endpoints,
    /// never per request. It also tightens each shard's expiry bound.
    pub fn oldest_age_ms(&self, now_ms: u64) -> Option<u64> {
        let now = self.tick(now_ms);
        let mut oldest = EMPTY_SHARD;
        for shard in self.shards.iter() {
            let map = shard.map.lock();
            let shard_oldest = map
                .values()
                .map(|binding| binding.last_seen)
                .min()
                .unwrap_or(EMPTY_SHARD);
            shard.oldest_bound.store(shard_oldest, Relaxed);
            oldest = oldest.min(shard_oldest);
        }
        (oldest != EMPTY_SHARD).then(|| u64::from(now.saturating_sub(oldest)) * TICK_MS)
    }

    /// Drops every binding to a peer that a reload removed. O(n), reloads only.
    /// (Without it those sessions would still migrate on their next request;
    /// this frees their memory and their gauge at once.)
    pub fn forget_peer(&self, id: PeerId) {
        for shard in self.shards.iter() {
            let mut map = shard.map.lock();
            let before = map.len();
            map.retain(|_, binding| binding.peer != id);
            self.total.fetch_sub(before - map.len(), Relaxed);
        }
        self.per_peer.write().remove(&id);
    }

    /// How many shard scans expiry has run (by `sweep` or by a placement that
    /// found its peer's share full); observability for the skip logic.
    pub fn expiry_scans(&self) -> u64 {
        self.shard_scans.load(Relaxed)
    }

    /// Estimate of the heap the table's maps hold, from their capacities and
    /// the std (hashbrown) layout: one entry slot plus one control byte per
    /// bucket, buckets a power of two at most 7/8 full.
    pub fn approx_heap_bytes(&self) -> usize {
        const GROUP_WIDTH: usize = 16;
        let slot = std::mem::size_of::<(u64, Binding)>() + 1;
        self.shards
            .iter()
            .map(|shard| {
                let capacity = shard.map.lock().capacity();
                if capacity == 0 {
                    return 0;
                }
                let buckets = if capacity < 8 {
                    capacity + 1
                } else {
                    (capacity * 8 / 7).next_power_of_two()
                };
                buckets * slot + GROUP_WIDTH
            })
            .sum()
    }

    fn shard(&self, sid: u64) -> &Shard {
        let index = (self.shard_selector.hash_one(sid) >> (u64::BITS - SHARD_BITS)) as usize;
        // The index is below SHARD_COUNT by construction; `min` keeps any
        // future change of the constants from turning into a panic.
        &self.shards[index.min(self.shards.len() - 1)]
    }

    fn tick(&self, now_ms: u64) -> u32 {
        // Load before trying to set: a compare-exchange on every call would
        // pull this cache line exclusive onto every core, on every request.
        let mut epoch = self.epoch_ms.load(Relaxed);
        if epoch == u64::MAX {
            epoch = match self
                .epoch_ms
                .compare_exchange(u64::MAX, now_ms, Relaxed, Relaxed)
            {
                Ok(_) => now_ms,
                Err(set_by_another_thread) => set_by_another_thread,
            };
        }
        let ticks = now_ms.saturating_sub(epoch) / TICK_MS;
        u32::try_from(ticks).unwrap_or(MAX_TICK).min(MAX_TICK)
    }

    fn expired(&self, last_seen: u32, now: u32) -> bool {
        let idle_ms = self.config.load().idle_timeout_ms;
        u64::from(now.saturating_sub(last_seen)) * TICK_MS >= idle_ms
    }

    fn shard_may_hold_expired(&self, shard: &Shard, now: u32) -> bool {
        let bound = shard.oldest_bound.load(Relaxed);
        bound != EMPTY_SHARD && self.expired(bound, now)
    }

    fn may_hold_expired(&self, now: u32) -> bool {
        self.shards
            .iter()
            .any(|shard| self.shard_may_hold_expired(shard, now))
    }

    fn remembered(&self, binding: Binding, now: u32) -> Remembered {
        Remembered {
            peer: binding.peer,
            since_move_ms: binding
                .moved_at()
                .map(|moved_at| u64::from(now.saturating_sub(moved_at)) * TICK_MS),
        }
    }

    /// The session's binding if it is live; an expired one is removed here so
    /// that a session returning after its idle timeout is placed afresh.
    fn live_binding(&self, map: &mut ShardMap, sid: u64, now: u32) -> Option<Remembered> {
        let binding = *map.get(&sid)?;
        if self.expired(binding.last_seen, now) {
            map.remove(&sid);
            self.total.fetch_sub(1, Relaxed);
            self.release(binding.peer, 1);
            return None;
        }
        Some(self.remembered(binding, now))
    }

    /// Drops `sid`'s binding to `from` and what it counted there.
    fn forget(&self, map: &mut ShardMap, sid: u64, from: PeerId, was: Share) {
        if map.remove(&sid).is_some() {
            self.total.fetch_sub(1, Relaxed);
            self.release(from, 1);
            self.live_change(from, was, Share::default());
        }
    }

    fn rebind(&self, map: &mut ShardMap, sid: u64, from: PeerId, to: PeerId, now: u32) {
        if let Some(binding) = map.get_mut(&sid) {
            binding.peer = to;
            binding.last_seen = binding.last_seen.max(now);
            binding.moved_at_plus_one = now + 1;
        }
        self.release(from, 1);
    }

    /// Takes one of `peer`'s `cap` binding slots; false when none is left.
    fn reserve(&self, peer: PeerId, cap: usize) -> bool {
        let increment = |count: usize| (count < cap).then_some(count + 1);
        if let Some(count) = self.per_peer.read().get(&peer) {
            return count.fetch_update(Relaxed, Relaxed, increment).is_ok();
        }
        let mut per_peer = self.per_peer.write();
        let count = per_peer.entry(peer).or_insert_with(|| AtomicUsize::new(0));
        count.fetch_update(Relaxed, Relaxed, increment).is_ok()
    }

    /// Counts a binding against `peer` whatever its cap (an adopted one).
    fn force_reserve(&self, peer: PeerId) {
        if let Some(count) = self.per_peer.read().get(&peer) {
            count.fetch_add(1, Relaxed);
            return;
        }
        let mut per_peer = self.per_peer.write();
        per_peer
            .entry(peer)
            .or_insert_with(|| AtomicUsize::new(0))
            .fetch_add(1, Relaxed);
    }

    fn has_room(&self, peer: PeerId, cap: usize) -> bool {
        let count = self
            .per_peer
            .read()
            .get(&peer)
            .map_or(0, |count| count.load(Relaxed));
        count < cap
    }

    fn release(&self, peer: PeerId, n: usize) {
        if let Some(count) = self.per_peer.read().get(&peer) {
            // Saturating: a binding inserted for a peer while `forget_peer`
            // dropped its counter must not wrap the recreated one.
            let _ = count.fetch_update(Relaxed, Relaxed, |c| Some(c.saturating_sub(n)));
        }
    }
}

/// Refreshes a live session's `last_seen`; never moves it backwards when
/// callers' clocks race.
fn touch(map: &mut ShardMap, sid: u64, now: u32) {
    if let Some(binding) = map.get_mut(&sid) {
        binding.last_seen = binding.last_seen.max(now);
    }
}

fn count_for(counts: &mut Vec<(PeerId, usize)>, peer: PeerId) {
    match counts.iter_mut().find(|(p, _)| *p == peer) {
        Some((_, count)) => *count += 1,
        None => counts.push((peer, 1)),
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
mod tests {
    use super::*;
    use std::sync::{Arc, Barrier};

    const T0: u64 = 1_700_000_000_000;
    const SECOND: u64 = 1_000;
    const MINUTE: u64 = 60 * SECOND;

    fn peers(n: u32) -> Vec<PeerLoad> {
        (1..=n).map(|id| PeerLoad::idle(id, 64)).collect()
    }

    fn with(cfg: TableConfig) -> SessionTable {
        SessionTable::new(cfg)
    }

    fn kind(placement: Option<Placement>) -> Option<PlacementKind> {
        placement.map(|p| p.kind)
    }

    #[test]
    fn an_adopted_binding_is_followed_and_keeps_the_shared_move_time() {
        let t = with(TableConfig::default());
        let p = peers(3);
        // Placed here on one peer, adopted onto another (another replica's
        // decision): the next turn sticks to the adopted one.
        let first = t.place(7, &p, T0).expect("placed").peer;
        let other = if first == 1 { 2 } else { 1 };
        t.adopt(7, other, None, T0 + SECOND);
        let next = t.place(7, &p, T0 + 2 * SECOND).expect("placed");
        assert_eq!((next.peer, next.kind), (other, PlacementKind::Sticky));
        assert_eq!(t.bindings_per_peer().iter().map(|b| b.1).sum::<usize>(), 1);
        assert_eq!(t.binding_of(7, T0 + 2 * SECOND), Some((other, None)));
        // A move 10 s ago elsewhere is 10 s old here too (the cooldown).
        t.adopt(8, 3, Some(10 * SECOND), T0 + MINUTE);
        let (peer, ago) = t.binding_of(8, T0 + MINUTE).expect("bound");
        assert_eq!(peer, 3);
        let ago = ago.expect("moved");
        assert!((9 * SECOND..=11 * SECOND).contains(&ago), "{ago}");
        // Unknown and expired sessions have no binding.
        assert_eq!(t.binding_of(9, T0), None);
        assert_eq!(t.binding_of(7, T0 + 31 * MINUTE), None);
    }

    #[test]
    fn entries_expire_after_idle_timeout_since_last_use() {
        let t = with(TableConfig {
            idle_timeout_ms: 10 * MINUTE,
            ..TableConfig::default()
        });
        let p = peers(2);
        assert_eq!(kind(t.place(1, &p, T0)), Some(PlacementKind::New));
        // Each use pushes the expiry out again.
        for n in 1..=5 {
            let now = T0 + n * 9 * MINUTE;
            assert_eq!(kind(t.place(1, &p, now)), Some(PlacementKind::Sticky));
        }
        let last_use = T0 + 45 * MINUTE;
        assert_eq!(t.sweep(last_use + 10 * MINUTE - SECOND), 0);
        assert_eq!(t.len(), 1);
        assert_eq!(t.sweep(last_use + 10 * MINUTE), 1);
        assert!(t.is_empty());
        assert_eq!(
            t.bindings_per_peer().iter().map(|(_, n)| n).sum::<usize>(),
            0
        );
    }

    #[test]
    fn expired_session_is_placed_afresh_without_a_sweep() {
        let t = with(TableConfig {
            idle_timeout_ms: MINUTE,
            ..TableConfig::default()
        });
        let p = peers(1);
        t.place(1, &p, T0);
        assert_eq!(
            kind(t.place(1, &p, T0 + MINUTE - 100)),
            Some(PlacementKind::Sticky)
        );
        // Control: one idle timeout after the last use it is new again.
        assert_eq!(
            kind(t.place(1, &p, T0 + 2 * MINUTE - 100)),
            Some(PlacementKind::New)
        );
        assert_eq!(t.len(), 1);
        assert_eq!(t.bindings_per_peer(), vec![(1, 1)]);
    }

    #[test]
    fn sweep_skips_every_shard_when_nothing_can_have_expired() {
        let t = with(TableConfig {
            idle_timeout_ms: 30 * MINUTE,
            ..TableConfig::default()
        });
        let p = peers(4);
        for sid in 0..1_000 {
            t.place(sid, &p, T0);
        }
        for n in 0..30 {
            assert_eq!(t.sweep(T0 + n * MINUTE), 0);
        }
        assert_eq!(t.expiry_scans(), 0);
        // Control: once the oldest can have expired, shards are scanned.
        assert_eq!(t.sweep(T0 + 30 * MINUTE), 1_000);
        let scans = t.expiry_scans();
        assert!(scans > 0 && scans <= SHARD_COUNT as u64, "{scans}");
        // Emptied shards are skipped again.
        assert_eq!(t.sweep(T0 + 90 * MINUTE), 0);
        assert_eq!(t.expiry_scans(), scans);
    }

    #[test]
    fn full_table_with_a_fresh_id_per_request_does_not_scan() {
        let cap = 500;
        let t = with(TableConfig {
            max_sessions_per_peer: cap,
            ..TableConfig::default()
        });
        let p = peers(1);
        for sid in 0..cap as u64 {
            assert_eq!(kind(t.place(sid, &p, T0)), Some(PlacementKind::New));
        }
        for sid in 10_000..20_000u64 {
            let now = T0 + (sid - 10_000) * 100;
            assert_eq!(kind(t.place(sid, &p, now)), Some(PlacementKind::TableFull));
        }
        assert_eq!(t.expiry_scans(), 0);
        assert_eq!(t.len(), cap);
        // Control: when the first sessions can have expired, the full table
        // scans once, frees them, and the fresh id is remembered.
        let expired_at = T0 + 30 * MINUTE;
        assert_eq!(
            kind(t.place(99_999, &p, expired_at)),
            Some(PlacementKind::New)
        );
        assert!(t.expiry_scans() > 0);
        assert_eq!(t.len(), 1);
        let scans = t.expiry_scans();
        for sid in 100_000..100_100u64 {
            assert_eq!(kind(t.place(sid, &p, expired_at)), Some(PlacementKind::New));
        }
        assert_eq!(t.expiry_scans(), scans);
    }

    #[test]
    fn shorter_idle_timeout_on_reload_applies_to_the_next_sweep() {
        let t = with(TableConfig::default());
        let p = peers(2);
        for sid in 0..10 {
            t.place(sid, &p, T0);
        }
        assert_eq!(t.sweep(T0 + 5 * MINUTE), 0);
        t.set_config(TableConfig {
            idle_timeout_ms: 2 * MINUTE,
            ..TableConfig::default()
        });
        assert_eq!(t.config().idle_timeout_ms, 2 * MINUTE);
        assert_eq!(t.sweep(T0 + 5 * MINUTE), 10);
    }

    #[test]
    fn forget_peer_drops_its_bindings_and_gauge() {
        let t = with(TableConfig::default());
        let p = peers(2);
        for sid in 0..100 {
            t.place(sid, &p, T0);
        }
        let on_two = t
            .bindings_per_peer()
            .iter()
            .find(|(id, _)| *id == 2)
            .map_or(0, |(_, n)| *n);
        assert!(on_two > 0);
        t.forget_peer(2);
        assert_eq!(t.len(), 100 - on_two);
        assert!(t.bindings_per_peer().iter().all(|(id, _)| *id == 1));
        // A forgotten peer's sessions are simply new next time.
        let only_one = peers(1);
        let placements: Vec<_> = (0..100)
            .map(|sid| kind(t.place(sid, &only_one, T0)))
            .collect();
        let new = placements
            .iter()
            .filter(|k| **k == Some(PlacementKind::New))
            .count();
        assert_eq!(new, on_two);
    }

    #[test]
    fn oldest_age_is_exact() {
        let t = with(TableConfig::default());
        assert_eq!(t.oldest_age_ms(T0), None);
        let p = peers(2);
        t.place(1, &p, T0);
        t.place(2, &p, T0 + 5 * SECOND);
        assert_eq!(t.oldest_age_ms(T0 + 10 * SECOND), Some(10 * SECOND));
        t.place(1, &p, T0 + 8 * SECOND);
        assert_eq!(t.oldest_age_ms(T0 + 10 * SECOND), Some(5 * SECOND));
    }

    #[test]
    fn clock_going_backwards_is_harmless() {
        let t = with(TableConfig::default());
        let p = peers(2);
        t.place(1, &p, T0 + MINUTE);
        assert_eq!(kind(t.place(1, &p, T0)), Some(PlacementKind::Sticky));
        assert_eq!(kind(t.place(2, &p, 0)), Some(PlacementKind::New));
        assert_eq!(t.oldest_age_ms(0), Some(0));
        assert_eq!(t.sweep(0), 0);
        assert_eq!(kind(t.place(3, &p, u64::MAX)), Some(PlacementKind::New));
    }

    #[test]
    fn racing_first_requests_of_one_session_make_one_binding() {
        for round in 0..20u64 {
            let t = Arc::new(with(TableConfig::default()));
            let threads = 8;
            let barrier = Arc::new(Barrier::new(threads));
            let handles: Vec<_> = (0..threads as u32)
                .map(|thread| {
                    let t = Arc::clone(&t);
                    let barrier = Arc::clone(&barrier);
                    std::thread::spawn(move || {
                        // Each thread sees a different peer as least loaded,
                        // so only serialisation can make them agree.
                        let view: Vec<PeerLoad> = (0..threads as u32)
                            .map(|id| PeerLoad {
                                in_flight: if id == thread { 0 } else { 2 },
                                ..PeerLoad::idle(id, 64)
                            })
                            .collect();
                        barrier.wait();
                        t.place(round, &view, T0)
                    })
                })
                .collect();
            let placements: Vec<Placement> = handles
                .into_iter()
                .filter_map(|h| h.join().ok().flatten())
                .collect();
            assert_eq!(placements.len(), threads);
            let new: Vec<&Placement> = placements
                .iter()
                .filter(|p| p.kind == PlacementKind::New)
                .collect();
            assert_eq!(new.len(), 1, "{placements:?}");
            let winner = new[0].peer;
            assert!(
                placements.iter().all(|p| p.peer == winner),
                "{placements:?}"
            );
            assert_eq!(t.len(), 1);
            assert_eq!(
                t.bindings_per_peer().iter().map(|(_, n)| n).sum::<usize>(),
                1
            );
        }
    }

    #[test]
    fn concurrent_sweeper_loses_no_live_session() {
        let t = Arc::new(with(TableConfig {
            idle_timeout_ms: 10 * SECOND,
            ..TableConfig::default()
        }));
        let clock = Arc::new(AtomicU64::new(T0));
        let p = peers(4);
        let live: u64 = 400;
        let dead_base = 1_000_000u64;
        for sid in 0..live {
            t.place(sid, &p, T0);
        }
        for sid in dead_base..dead_base + 2_000 {
            t.place(sid, &p, T0);
        }
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let sweeper = {
            let (t, clock, stop) = (Arc::clone(&t), Arc::clone(&clock), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut removed = 0;
                while !stop.load(Relaxed) {
                    removed += t.sweep(clock.load(Relaxed));
                }
                removed
            })
        };
        // Placers touch every live session once per simulated second; the
        // clock advances 30 idle timeouts in all. The barrier keeps the
        // sweeper's clock from running ahead of a slow placer.
        let workers = 3;
        let step_barrier = Arc::new(Barrier::new(workers));
        let placers: Vec<_> = (0..workers as u64)
            .map(|worker| {
                let (t, clock, p) = (Arc::clone(&t), Arc::clone(&clock), p.clone());
                let step_barrier = Arc::clone(&step_barrier);
                std::thread::spawn(move || {
                    let mut lost = Vec::new();
                    for step in 0..300u64 {
                        let now = T0 + step * SECOND;
                        step_barrier.wait();
                        clock.fetch_max(now, Relaxed);
                        for sid in (worker..live).step_by(workers) {
                            let placed = t.place(sid, &p, now);
                            if placed.map(|p| p.kind) != Some(PlacementKind::Sticky) {
                                lost.push((sid, step, placed));
                            }
                        }
                    }
                    lost
                })
            })
            .collect();
        let lost: Vec<_> = placers
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_default())
            .collect();
        stop.store(true, Relaxed);
        let removed = sweeper.join().unwrap_or(0);
        assert!(lost.is_empty(), "{:?}", &lost[..lost.len().min(5)]);
        assert_eq!(removed, 2_000);
        assert_eq!(t.len(), live as usize);
    }

    #[test]
    fn remembered_session_costs_at_most_64_bytes() {
        let t = with(TableConfig {
            max_sessions_per_peer: usize::MAX,
            ..TableConfig::default()
        });
        let p = peers(4);
        let sessions = 200_000u64;
        for n in 0..sessions {
            t.place(crate::hash::stable_hash64(&n.to_le_bytes()), &p, T0);
        }
        assert_eq!(t.len(), sessions as usize);
        let per_session = t.approx_heap_bytes() as f64 / sessions as f64;
        assert!(per_session <= 64.0, "{per_session:.1} bytes per session");
    }

    #[test]
    fn default_config_matches_the_design() {
        let cfg = TableConfig::default();
        assert_eq!(cfg.idle_timeout_ms, 30 * MINUTE);
        assert_eq!(cfg.max_sessions_per_peer, 100_000);
        assert_eq!(cfg.cooldown_ms, MINUTE);
        assert_eq!((cfg.spill_margin, cfg.spill_margin_blind), (4, 8));
    }
}
