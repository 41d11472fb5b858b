//! Runtime state of one peer, shared by every worker thread and carried
//! across reloads. Keyed by route and address (`host:port`; for a listed
//! host name, with the address it resolved to, so an engine at a new
//! address starts afresh: `registry/route.rs` `live_peers`).
//!
//! - In-flight slots ([`InFlightGuard`]), the prompt tokens they carry, and
//!   of those the requests still before their first token and the cold
//!   prompts among them (the backlog a newcomer waits behind, released by
//!   [`InFlightGuard::first_token`] from `response_body_filter`); the cold
//!   tokens taken in so far, which tell how long a template sent here stays
//!   cached (`balance/prefix.rs`). Written by the request path.
//! - Readiness: bans from the request path (a refused connection, a broken
//!   exchange) and from the health probes.
//! - The engine's last metrics and its KV capacity, published (`/metrics`,
//!   llama.cpp's `/props`) or learned from its KV-usage gauge
//!   (`CapacityLearner`, `placement/capacity.rs`), and its slots (llama.cpp's
//!   `/props`): the health scrapes.
//! - The engine's speeds (`SpeedLearner`, `placement/speed.rs`): prefill
//!   and decode learned from each 2xx stream's timing
//!   ([`PeerState::learn_first_token`], [`PeerState::learn_decode`], from
//!   `proxy/response/record.rs`), its completion rate once a second
//!   ([`PeerState::tick_speed`], the route's sweeper).
//! - The other replicas' in-flight here and the cluster's sessions bound
//!   here (shared session store only: `balance/sync.rs`).
//!
//! Read by `balance` (`balance/snapshot.rs` turns it into placement's
//! `PeerLoad`) and by the status endpoints.

use super::room::RoomSignal;
use crate::placement::cold_cost::MIN_NEW_TOKENS;
use crate::placement::{
    prefill_us_at_least, CapacityLearner, CapacitySource, EngineLoad, EngineSpeed, PeerId,
    SpeedLearner,
};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Last engine metrics read from a peer's `/metrics`.
#[derive(Debug, Clone, Copy)]
pub struct EngineSample {
    pub load: EngineLoad,
    pub read_at_ms: u64,
    /// The peer's completion count when the sample was read.
    pub completed_at_read: u64,
    /// Waiting requests seen in this AND the previous scrape (the smaller
    /// count), 0 when the previous scrape is missing or too old. A queue
    /// that shows up in one sample only is a burst the engine absorbs on
    /// its own; moving a session for it costs a cold prefill of its whole
    /// context (measured in the replay bench: such spills cost load_aware
    /// its lead on TTFT p95).
    pub sustained_waiting: u32,
}

/// What a peer's last health probe said (`/_health_status`): the OpenResty
/// gateway's three outcomes. `Busy` (a 429, or no answer within the
/// probe's timeout) leaves the peer as it was: alive, not banned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeVerdict {
    Ready = 1,
    Busy = 2,
    Down = 3,
}

impl ProbeVerdict {
    pub fn as_str(self) -> &'static str {
        match self {
            ProbeVerdict::Ready => "ready",
            ProbeVerdict::Busy => "busy",
            ProbeVerdict::Down => "down",
        }
    }

    fn from_u8(v: u8) -> Option<Self> {
        [ProbeVerdict::Ready, ProbeVerdict::Busy, ProbeVerdict::Down]
            .into_iter()
            .find(|p| *p as u8 == v)
    }
}

/// Runtime state of one peer (route + host:port). Shared by all worker threads.
#[derive(Debug)]
pub struct PeerState {
    pub id: PeerId,
    pub address: String,
    in_flight: AtomicU32,
    /// Of those, the streamed requests that have not had their first token
    /// yet: prompts queued or prefilling in the engine. (A response not
    /// streamed comes whole, its first token with its last: no telling its
    /// prefill from its decode, so it is not counted.)
    awaiting_first: AtomicU32,
    /// Of those, the estimated prompt tokens of the cold ones (a new or
    /// moved session's turn): prefill work still ahead of the engine.
    cold_backlog_tokens: AtomicU64,
    /// The estimated prompt tokens of the requests in flight (what their
    /// slots carry): the gauge's other side when capacity is learned.
    in_flight_tokens: AtomicU64,
    /// Requests finished (slots released) since the peer was first seen.
    completed: AtomicU64,
    /// Prompt tokens sent here cold since the peer was first seen: what the
    /// engine has had to find KV for, evicting its least recently used
    /// prefixes (how long a prefix sent here stays cached).
    intake: AtomicU64,
    /// 0 = not banned; else `now_ms()` until which the peer is not ready.
    banned_until_ms: AtomicU64,
    /// Set by a failing probe or a live connect failure, cleared by a passing probe.
    failing: AtomicBool,
    /// Why the peer is failing, as the last probe or connection that
    /// failed said (`/_health_status`); cleared with `failing`.
    failure: Mutex<Option<String>>,
    /// The last probe's [`ProbeVerdict`] (0: none yet).
    last_probe: AtomicU8,
    engine: Mutex<Option<EngineSample>>,
    /// KV capacity in tokens the engine last published (0: never), in its
    /// metrics or its `/props`, and which (`published_from`). Static for an
    /// engine's life, so it stays valid after its load sample goes stale.
    kv_capacity_tokens: AtomicU64,
    published_from: Mutex<CapacitySource>,
    /// How many requests the engine runs at once, as it says (llama.cpp's
    /// `/props` `total_slots`; 0: unknown): a route that sets no
    /// `max_concurrency` takes it (`PeerConfig::with_engine_slots`).
    engine_slots: AtomicU32,
    /// The capacity learned from the engine's KV-usage gauge, for an engine
    /// that publishes none.
    learner: Mutex<CapacityLearner>,
    /// How fast the engine has been: its prefill per token, its time per
    /// output token and its completions per second (`placement::speed`).
    speed: Mutex<SpeedLearner>,
    /// While the engine is not timed: the first cold prompt sent there
    /// still awaiting its first token (when it was sent, ms; its work in
    /// tokens), whose wait bounds how fast the engine can be.
    untimed_probe: Mutex<Option<(u64, u64)>>,
    /// The route's queue signal, told whenever a slot here is released.
    room: Arc<RoomSignal>,
    /// Requests in flight to this peer through the other gateway replicas,
    /// as they last published it (shared session store only; 0 otherwise).
    remote_in_flight: AtomicU32,
    /// The prompt tokens the other replicas have sent here cold and still
    /// await the first token of, as they last published it: prefill ahead
    /// of a request here wherever it was placed (shared store only).
    remote_cold_backlog_tokens: AtomicU64,
    /// The first turns the other replicas claimed here that no sync had
    /// carried yet when this replica last read the claims, and until when
    /// they count (`balance/shared.rs`).
    remote_claimed_requests: AtomicU32,
    remote_claimed_tokens: AtomicU64,
    remote_claimed_until_ms: AtomicU64,
    /// The cluster's live sessions on this peer (each counted once over every
    /// replica), as of the store task's last exchange, with this replica's
    /// own count at that moment, so placement can add what changed here
    /// since. `cluster_at_ms` 0: no cluster view (local store).
    cluster_sessions: AtomicU32,
    cluster_tokens: AtomicU64,
    local_sessions_then: AtomicU32,
    local_tokens_then: AtomicU64,
    cluster_at_ms: AtomicU64,
    /// How long the cluster view counts after its exchange: two of the
    /// replicas' load TTLs, then this replica's own count.
    cluster_valid_ms: AtomicU64,
}

impl PeerState {
    #[cfg(test)]
    pub(super) fn new(id: PeerId, address: String) -> Self {
        Self::in_route(id, address, Arc::default())
    }

    /// A peer outside any route, for other modules' unit tests.
    #[cfg(test)]
    pub fn for_tests(address: &str) -> Self {
        Self::in_route(0, address.to_string(), Arc::default())
    }

    pub(super) fn in_route(id: PeerId, address: String, room: Arc<RoomSignal>) -> Self {
        PeerState {
            id,
            address,
            in_flight: AtomicU32::new(0),
            awaiting_first: AtomicU32::new(0),
            cold_backlog_tokens: AtomicU64::new(0),
            in_flight_tokens: AtomicU64::new(0),
            completed: AtomicU64::new(0),
            intake: AtomicU64::new(0),
            banned_until_ms: AtomicU64::new(0),
            failing: AtomicBool::new(false),
            failure: Mutex::new(None),
            last_probe: AtomicU8::new(0),
            engine: Mutex::new(None),
            kv_capacity_tokens: AtomicU64::new(0),
            published_from: Mutex::new(CapacitySource::Metrics),
            engine_slots: AtomicU32::new(0),
            learner: Mutex::default(),
            speed: Mutex::default(),
            untimed_probe: Mutex::default(),
            room,
            remote_in_flight: AtomicU32::new(0),
            remote_cold_backlog_tokens: AtomicU64::new(0),
            remote_claimed_requests: AtomicU32::new(0),
            remote_claimed_tokens: AtomicU64::new(0),
            remote_claimed_until_ms: AtomicU64::new(0),
            cluster_sessions: AtomicU32::new(0),
            cluster_tokens: AtomicU64::new(0),
            local_sessions_then: AtomicU32::new(0),
            local_tokens_then: AtomicU64::new(0),
            cluster_at_ms: AtomicU64::new(0),
            cluster_valid_ms: AtomicU64::new(0),
        }
    }

    pub fn in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Requests in flight here that have not had their first token yet.
    pub fn awaiting_first_token(&self) -> u32 {
        self.awaiting_first.load(Ordering::Relaxed)
    }

    /// The prompt tokens of cold requests here still before their first token.
    pub fn cold_backlog_tokens(&self) -> u64 {
        self.cold_backlog_tokens.load(Ordering::Relaxed)
    }

    /// Prompt tokens sent here cold so far (see `intake`).
    pub fn intake(&self) -> u64 {
        self.intake.load(Ordering::Relaxed)
    }

    /// The other replicas' in-flight to this peer (see `balance/sync.rs`).
    pub fn remote_in_flight(&self) -> u32 {
        self.remote_in_flight.load(Ordering::Relaxed)
    }

    pub fn set_remote_in_flight(&self, n: u32) {
        self.remote_in_flight.store(n, Ordering::Relaxed);
    }

    /// The other replicas' cold prompt tokens here before their first
    /// token (see `balance/sync.rs`).
    pub fn remote_cold_backlog_tokens(&self) -> u64 {
        self.remote_cold_backlog_tokens.load(Ordering::Relaxed)
    }

    pub fn set_remote_cold_backlog_tokens(&self, tokens: u64) {
        self.remote_cold_backlog_tokens
            .store(tokens, Ordering::Relaxed);
    }

    /// The first turns the other replicas claimed here lately (how many,
    /// their prompt tokens), read back with a first placement's claim:
    /// counted until `until_ms`, by when a sync carries them.
    pub fn note_remote_claims(&self, requests: u32, tokens: u64, until_ms: u64) {
        self.remote_claimed_requests
            .store(requests, Ordering::Relaxed);
        self.remote_claimed_tokens.store(tokens, Ordering::Relaxed);
        self.remote_claimed_until_ms
            .store(until_ms, Ordering::Relaxed);
    }

    /// The other replicas' cold prompt tokens here: as last synced, or
    /// what they claimed here since, when that is more. The larger, not
    /// the sum: a claim a sync already carried would count twice.
    pub fn remote_cold_tokens(&self, now_ms: u64) -> u64 {
        let synced = self.remote_cold_backlog_tokens();
        if !self.claims_count(now_ms) {
            return synced;
        }
        synced.max(self.remote_claimed_tokens.load(Ordering::Relaxed))
    }

    /// The other replicas' requests in flight here, as
    /// [`remote_cold_tokens`](Self::remote_cold_tokens) counts their tokens.
    pub fn remote_requests(&self, now_ms: u64) -> u32 {
        let synced = self.remote_in_flight();
        if !self.claims_count(now_ms) {
            return synced;
        }
        synced.max(self.remote_claimed_requests.load(Ordering::Relaxed))
    }

    fn claims_count(&self, now_ms: u64) -> bool {
        now_ms < self.remote_claimed_until_ms.load(Ordering::Relaxed)
    }

    /// Records the cluster's live sessions on this peer (`cluster`) and this
    /// replica's own count at the same moment (`local`).
    pub fn set_cluster_bound(
        &self,
        cluster: crate::placement::Bound,
        local: crate::placement::Bound,
        now_ms: u64,
        valid_ms: u64,
    ) {
        self.cluster_valid_ms.store(valid_ms, Ordering::Relaxed);
        self.cluster_sessions
            .store(cluster.sessions, Ordering::Relaxed);
        self.cluster_tokens.store(cluster.tokens, Ordering::Relaxed);
        self.local_sessions_then
            .store(local.sessions, Ordering::Relaxed);
        self.local_tokens_then
            .store(local.tokens, Ordering::Relaxed);
        self.cluster_at_ms.store(now_ms.max(1), Ordering::Relaxed);
    }

    pub fn clear_cluster_bound(&self) {
        self.cluster_at_ms.store(0, Ordering::Relaxed);
    }

    /// What is bound here across the cluster: the last exchange's count plus
    /// what this replica's own count did since (a burst of new sessions
    /// placed here between two exchanges is seen at once). `local` without
    /// a cluster view still valid (Redis away: it goes stale).
    pub fn bound(&self, local: crate::placement::Bound, now_ms: u64) -> crate::placement::Bound {
        let at = self.cluster_at_ms.load(Ordering::Relaxed);
        let valid = self.cluster_valid_ms.load(Ordering::Relaxed);
        if at == 0 || now_ms.saturating_sub(at) > valid {
            return local;
        }
        let then_s = self.local_sessions_then.load(Ordering::Relaxed);
        let then_t = self.local_tokens_then.load(Ordering::Relaxed);
        let delta_s = i64::from(local.sessions) - i64::from(then_s);
        let delta_t = local.tokens as i64 - then_t as i64;
        let cluster_s = i64::from(self.cluster_sessions.load(Ordering::Relaxed));
        let cluster_t = self.cluster_tokens.load(Ordering::Relaxed) as i64;
        let sessions = cluster_s + delta_s;
        let tokens = cluster_t + delta_t;
        // Only this replica knows when its own sessions last answered; the
        // other replicas' count whole.
        let others = (cluster_s - i64::from(then_s)).max(0);
        let others_tokens = (cluster_t - then_t as i64).max(0);
        let whole = i64::from(crate::placement::WHOLE);
        let to_u64 = |n: i64| u64::try_from(n.max(0)).unwrap_or(0);
        crate::placement::Bound {
            sessions: u32::try_from(sessions.max(0)).unwrap_or(u32::MAX),
            returning_milli: to_u64(local.returning_milli as i64 + others * whole),
            tokens: to_u64(tokens),
            returning_tokens: to_u64(local.returning_tokens as i64 + others_tokens),
            // The others' sessions at their size today: only this replica
            // knows how its own will grow.
            projected_tokens: to_u64(local.projected_tokens as i64 + others_tokens),
        }
    }

    pub fn is_ready(&self, now_ms: u64) -> bool {
        let until = self.banned_until_ms.load(Ordering::Relaxed);
        until == 0 || now_ms >= until
    }

    /// Remaining ban, for the status endpoints.
    pub fn banned_for_ms(&self, now_ms: u64) -> u64 {
        self.banned_until_ms
            .load(Ordering::Relaxed)
            .saturating_sub(now_ms)
    }

    pub fn ban(&self, now_ms: u64, ttl: Duration) {
        self.failing.store(true, Ordering::Relaxed);
        self.banned_until_ms
            .store(now_ms + ttl.as_millis().max(1) as u64, Ordering::Relaxed);
    }

    pub fn unban(&self) {
        self.failing.store(false, Ordering::Relaxed);
        self.banned_until_ms.store(0, Ordering::Relaxed);
        *self.failure.lock() = None;
    }

    /// Why the peer was last banned (a probe's status or error, a refused
    /// or failed TLS connection), until a passing probe clears it.
    pub fn note_failure(&self, why: String) {
        *self.failure.lock() = Some(why);
    }

    /// [`Self::note_failure`]'s reason while the peer is failing.
    pub fn failure(&self) -> Option<String> {
        self.failure.lock().clone()
    }

    pub fn is_failing(&self) -> bool {
        self.failing.load(Ordering::Relaxed)
    }

    pub fn record_probe(&self, verdict: ProbeVerdict) {
        self.last_probe.store(verdict as u8, Ordering::Relaxed);
    }

    /// The last probe's verdict; None before the first one answered.
    pub fn last_probe(&self) -> Option<ProbeVerdict> {
        ProbeVerdict::from_u8(self.last_probe.load(Ordering::Relaxed))
    }

    /// Stores a scrape; `max_gap_ms` is how old the previous one may be to
    /// count as consecutive (two scrape intervals).
    pub fn record_engine(&self, load: EngineLoad, now_ms: u64, max_gap_ms: u64) {
        let mut slot = self.engine.lock();
        let sustained_waiting = match *slot {
            Some(prev) if now_ms.saturating_sub(prev.read_at_ms) <= max_gap_ms => {
                prev.load.waiting.min(load.waiting)
            }
            _ => 0,
        };
        *slot = Some(EngineSample {
            load,
            read_at_ms: now_ms,
            completed_at_read: self.completed.load(Ordering::Acquire),
            sustained_waiting,
        });
    }

    /// Requests that finished on this peer since `sample` was read.
    pub fn completed_since(&self, sample: &EngineSample) -> u64 {
        self.completed
            .load(Ordering::Acquire)
            .saturating_sub(sample.completed_at_read)
    }

    /// The capacity the engine published, and where (`Metrics` or `Props`).
    pub fn record_kv_capacity(&self, tokens: u64, source: CapacitySource) {
        *self.published_from.lock() = source;
        self.kv_capacity_tokens.store(tokens, Ordering::Relaxed);
    }

    /// The engine's slots, once it said.
    pub fn engine_slots(&self) -> Option<u32> {
        Some(self.engine_slots.load(Ordering::Relaxed)).filter(|&n| n > 0)
    }

    /// Records the engine's slots; true when that is news (first told, or
    /// a different count).
    pub fn record_engine_slots(&self, slots: u32) -> bool {
        slots > 0 && self.engine_slots.swap(slots, Ordering::Relaxed) != slots
    }

    /// Whether the engine has published its capacity.
    pub fn published_kv_capacity(&self) -> bool {
        self.kv_capacity_tokens.load(Ordering::Relaxed) > 0
    }

    /// One scrape's KV usage, against the tokens in flight here now. Only
    /// while this replica is the engine's only sender it knows: the other
    /// replicas' prompts fill the same KV.
    pub fn learn_kv_capacity(&self, kv_usage: f64) {
        if self.remote_in_flight() > 0 {
            return;
        }
        let tokens = self.in_flight_tokens.load(Ordering::Relaxed);
        self.learner.lock().observe(tokens, kv_usage);
    }

    /// What the engine published, else what was learned.
    pub fn kv_capacity(&self) -> Option<(u64, CapacitySource)> {
        match self.kv_capacity_tokens.load(Ordering::Relaxed) {
            0 => self
                .learner
                .lock()
                .estimate()
                .map(|n| (n, CapacitySource::Learned)),
            n => Some((n, *self.published_from.lock())),
        }
    }

    /// A stream's first token came `ttft` after it was sent, with
    /// `new_tokens` of its prompt not cached here and `ahead` tokens of
    /// cold prompts prefilling here when it was placed.
    pub fn learn_first_token(&self, new_tokens: u64, ahead: u64, ttft: Duration) {
        self.speed
            .lock()
            .observe_first_token(new_tokens, ahead, ttft);
    }

    /// A stream decoded `tokens` output tokens in `decode` after its first.
    pub fn learn_decode(&self, tokens: u64, decode: Duration) {
        self.speed.lock().observe_decode(tokens, decode);
    }

    /// About once a second (the route's sweeper): the completion rate.
    pub fn tick_speed(&self, now_ms: u64) {
        let completed = self.completed.load(Ordering::Acquire);
        self.speed.lock().tick(now_ms, completed);
    }

    /// What has been learned of the engine's speed.
    pub fn speed(&self) -> EngineSpeed {
        self.speed.lock().speed()
    }

    /// [`speed`](Self::speed), and for an engine not timed yet, how slow its
    /// first token still awaited says it is at least.
    pub fn speed_at(&self, now_ms: u64) -> EngineSpeed {
        let mut speed = self.speed();
        if speed.prefill_us.is_none() {
            if let Some((sent_ms, work)) = *self.untimed_probe.lock() {
                speed.prefill_us_at_least =
                    Some(prefill_us_at_least(now_ms.saturating_sub(sent_ms), work));
            }
        }
        speed
    }

    pub fn engine_sample(&self) -> Option<EngineSample> {
        *self.engine.lock()
    }

    /// Reserves an in-flight slot unless the peer already carries `limit`.
    /// One atomic read-modify-write, so the limit holds across worker threads.
    pub fn try_acquire(self: &Arc<Self>, limit: u32) -> Option<InFlightGuard> {
        self.in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |n| {
                (n < limit).then_some(n + 1)
            })
            .ok()
            .map(|_| {
                self.awaiting_first.fetch_add(1, Ordering::AcqRel);
                InFlightGuard {
                    peer: Arc::clone(self),
                    tokens: 0,
                    awaiting_first: true,
                    counted_awaiting: true,
                    cold_tokens: 0,
                    ahead: self.cold_backlog_tokens(),
                    probe: false,
                }
            })
    }
}

/// An in-flight slot on a peer. Dropping it releases the slot, so every exit
/// path of a request (local response, connect failure, upstream death, client
/// disconnect, a panic unwinding the task) gives it back.
#[derive(Debug)]
pub struct InFlightGuard {
    peer: Arc<PeerState>,
    /// The request's estimated prompt tokens, counted in the peer's
    /// `in_flight_tokens` while the slot is held.
    tokens: u64,
    /// Before the first token (the cold backlog and the probe wait for it).
    awaiting_first: bool,
    /// Counted in the peer's `awaiting_first` until the first token: a
    /// streamed request.
    counted_awaiting: bool,
    /// A cold request's prompt tokens, in the peer's `cold_backlog_tokens`
    /// until the first token.
    cold_tokens: u64,
    /// The cold prompts' tokens that were prefilling on the peer when the
    /// slot was taken: what the request waited behind.
    ahead: u64,
    /// The peer's `untimed_probe` is this request's, until its first token.
    probe: bool,
}

impl InFlightGuard {
    pub fn peer(&self) -> &Arc<PeerState> {
        &self.peer
    }

    /// The cold prompts' tokens prefilling on the peer when the slot was taken.
    pub fn backlog_ahead(&self) -> u64 {
        self.ahead
    }

    /// The engine sent the request's first token: it no longer holds a
    /// prompt to prefill ahead of later requests. The first call returns
    /// the prompt's cold tokens (0 for a warm one); later calls `None`.
    pub fn first_token(&mut self) -> Option<u64> {
        if !std::mem::take(&mut self.awaiting_first) {
            return None;
        }
        if std::mem::take(&mut self.counted_awaiting) {
            self.peer.awaiting_first.fetch_sub(1, Ordering::AcqRel);
            self.peer.room.first_token_seen();
        }
        if std::mem::take(&mut self.probe) {
            *self.peer.untimed_probe.lock() = None;
        }
        let cold = std::mem::take(&mut self.cold_tokens);
        self.peer
            .cold_backlog_tokens
            .fetch_sub(cold, Ordering::AcqRel);
        Some(cold)
    }

    /// The response will not be streamed: its first token comes with its
    /// last, so it is no prompt awaiting prefill for the fair hold.
    pub fn not_streamed(&mut self) {
        if std::mem::take(&mut self.counted_awaiting) {
            self.peer.awaiting_first.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// The request starts cold there (no cache of its conversation): its
    /// `tokens` are prefill ahead of anything placed after it, until its
    /// first token.
    pub fn cold_prefill(&mut self, tokens: u64) {
        if self.awaiting_first && self.cold_tokens == 0 {
            self.cold_tokens = tokens;
            self.peer
                .cold_backlog_tokens
                .fetch_add(tokens, Ordering::AcqRel);
            self.peer.intake.fetch_add(tokens, Ordering::Relaxed);
            self.probe_if_untimed();
        }
    }

    /// The first cold prompt on an engine not timed yet becomes its probe.
    fn probe_if_untimed(&mut self) {
        let work = self.cold_tokens + self.ahead / 2;
        if work < MIN_NEW_TOKENS || self.peer.speed().prefill_us.is_some() {
            return;
        }
        let mut probe = self.peer.untimed_probe.lock();
        if probe.is_none() {
            *probe = Some((crate::clock::now_ms(), work));
            self.probe = true;
        }
    }

    /// Counts the request's prompt `tokens` on the peer for as long as the
    /// slot is held (replacing what it carried before).
    pub fn carry_tokens(&mut self, tokens: u64) {
        let counter = &self.peer.in_flight_tokens;
        counter.fetch_add(tokens, Ordering::AcqRel);
        counter.fetch_sub(self.tokens, Ordering::AcqRel);
        self.tokens = tokens;
    }
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        self.first_token();
        self.peer
            .in_flight_tokens
            .fetch_sub(self.tokens, Ordering::AcqRel);
        self.peer.in_flight.fetch_sub(1, Ordering::AcqRel);
        self.peer.completed.fetch_add(1, Ordering::AcqRel);
        self.peer.room.room_may_have_freed();
    }
}

#[cfg(test)]
mod tests;
