//! The pure placement rules: `load_aware` (the session table), `hash` and
//! `least_conn`. `crate::balance` turns live peer state into their input and
//! their output into a reserved slot.
//!
//! Everything here is pure and clock-injected: callers pass a snapshot of the
//! route's peers ([`PeerLoad`]) and the current time in milliseconds, so every
//! rule is unit-tested without a network or a real clock. The rules follow the
//! load-aware session table design (a published session-table change whose
//! measured gains this gateway set out to keep):
//! a session stays on the replica holding its prefix cache unless that replica
//! is actually backed up, because every needless move re-prefills a long
//! conversation on a cold replica.
//!
//! Load of a peer ([`PeerLoad::load`]) is the requests in flight through this
//! gateway, raised to the engine's own `running + waiting` when its metrics
//! are fresh. The maximum of the two is used because each misses something:
//! `in_flight` sees requests admitted a moment ago that the last scrape has
//! not, and the engine sees traffic from other gateway replicas and requests
//! this gateway has already stopped counting.

mod capacity;
pub mod cold_cost;
mod incoming;
pub mod model;
mod pick;
mod rules;
mod speed;
mod table;

pub use capacity::{CapacityLearner, CapacitySource};
pub use cold_cost::ColdCost;
pub use incoming::Incoming;
pub use model::{Ask, Estimate, Prefix, RouteModel};
pub use pick::{hash_place, least_conn, rendezvous};
pub use speed::{prefill_us_at_least, EngineSpeed, SpeedLearner};
pub use table::{Admission, SessionTable, TableConfig};

/// Stable id of a peer, assigned by the registry per (route, host:port) in order
/// of first appearance, and kept across reloads.
pub type PeerId = u32;

/// The engine's own view of its load, from its Prometheus metrics.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct EngineLoad {
    /// Requests queued in the engine, not yet scheduled.
    pub waiting: u32,
    /// Requests the engine is decoding or prefilling.
    pub running: u32,
    /// KV-cache usage, 0.0 to 1.0.
    pub kv_usage: f64,
}

/// One peer of a route, as the placement rules see it at this instant.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PeerLoad {
    pub id: PeerId,
    /// Not banned, not failing probes, still configured.
    pub ready: bool,
    /// Requests in flight through this gateway.
    pub in_flight: u32,
    /// The prompt tokens of the cold requests this gateway sent here (new
    /// sessions, moved ones) that have not had their first token yet:
    /// prefill a newcomer's own waits behind. vLLM admits every prompt as
    /// running and prefills them in chunks in turn, so its metrics show no
    /// queue while a newcomer waits.
    pub backlog_tokens: u64,
    /// How fast the engine has been, learned from its answers.
    pub speed: EngineSpeed,
    pub max_concurrency: u32,
    /// `Some` only while the engine metrics are fresh (read within two scrape
    /// intervals); stale numbers would steer sessions by a past that is gone.
    pub engine: Option<EngineLoad>,
    /// Engine metrics fresh and KV usage at or above the route's threshold.
    pub kv_full: bool,
    /// The sessions bound here that are live (used within the table's live
    /// window), and their context tokens: what the engine holds between
    /// turns, when nothing of theirs is in flight.
    pub bound: Bound,
    /// The engine's KV capacity in tokens (configured, or read from its
    /// metrics); `None`: unknown, so KV-aware admission does not apply.
    pub kv_capacity_tokens: Option<u64>,
}

/// What KV admission measures a peer against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvRoom {
    /// Share of the capacity (per mille) live sessions may fill.
    pub admit_permille: u32,
    /// Context a live session is expected to hold: the median of the
    /// route's live sessions (0 while none is known). The median, not the
    /// mean: a few long agent contexts among many short chats would make
    /// every chat look like a tenth of an agent.
    pub expected_session: u64,
}

/// A session certain to come back, in the thousandths
/// [`Bound::returning_milli`] counts.
pub const WHOLE: u32 = 1000;

/// Live sessions bound to a peer and their context tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Bound {
    pub sessions: u32,
    /// The same sessions, each weighted (in thousandths) by its chance of
    /// coming back: what placement ranks peers by.
    pub returning_milli: u64,
    pub tokens: u64,
    /// Their tokens, each session's weighted by its chance of coming back:
    /// the working set KV admission protects.
    pub returning_tokens: u64,
    /// The same, each session counted at the size it is expected to grow
    /// to (the route's typical session, or its own when more): what the
    /// engine will hold, which is what a new binding is weighed against.
    pub projected_tokens: u64,
}

impl Bound {
    /// `sessions` certain to come back (another replica's, a test's).
    pub fn whole(sessions: u32, tokens: u64) -> Self {
        Bound {
            sessions,
            returning_milli: u64::from(sessions) * u64::from(WHOLE),
            tokens,
            returning_tokens: tokens,
            projected_tokens: tokens,
        }
    }
}

impl PeerLoad {
    /// A ready peer with nothing in flight and no engine metrics.
    pub fn idle(id: PeerId, max_concurrency: u32) -> Self {
        PeerLoad {
            id,
            ready: true,
            in_flight: 0,
            backlog_tokens: 0,
            speed: EngineSpeed::default(),
            max_concurrency,
            engine: None,
            kv_full: false,
            bound: Bound::default(),
            kv_capacity_tokens: None,
        }
    }

    /// Whether a session of `tokens` more fits the engine's KV with what it
    /// holds already, by `room`'s measure, counted two ways that must both
    /// stay within the line: the working set now (the live sessions bound
    /// here by this gateway, each by its chance of coming back, or what the
    /// engine reports in use if more: it also sees other gateways' traffic,
    /// but not idle cached prefixes) plus the newcomer; and the live
    /// sessions likely to come back, the newcomer included, at the expected
    /// size. A young session is small today but grows every turn, and
    /// admitting by today's sizes alone fills an engine with sessions that
    /// outgrow its KV together. A session that has likely ended weighs
    /// little: the engine's LRU evicts its prefix first, at no one's cost.
    /// Unknown capacity always fits.
    pub fn fits(&self, tokens: u64, room: KvRoom) -> bool {
        self.kv_capacity_tokens.is_none_or(|cap| {
            let reported = self.engine.map_or(0.0, |e| e.kv_usage.clamp(0.0, 1.0));
            let now = self
                .bound
                .returning_tokens
                .max((reported * cap as f64) as u64);
            let projected = self
                .bound
                .returning_milli
                .saturating_add(u64::from(WHOLE))
                .saturating_mul(room.expected_session)
                / u64::from(WHOLE);
            let line = cap.saturating_mul(u64::from(room.admit_permille)) / 1000;
            now.saturating_add(tokens).max(projected) <= line
        })
    }

    /// The live sessions likely to come back hold more context than the
    /// engine's KV (when known): it is evicting some of their prefixes
    /// between turns.
    pub fn overcommitted(&self) -> bool {
        self.kv_capacity_tokens
            .is_some_and(|cap| self.bound.returning_tokens > cap)
    }

    /// Requests this peer carries: `max(in_flight, running + waiting)` with
    /// fresh engine metrics, else `in_flight` (see the module docs for why).
    pub fn load(&self) -> u32 {
        match self.engine {
            Some(engine) => self
                .in_flight
                .max(engine.running.saturating_add(engine.waiting)),
            None => self.in_flight,
        }
    }

    /// Requests the engine reports queued; 0 without fresh metrics.
    pub fn waiting(&self) -> u32 {
        self.engine.map_or(0, |engine| engine.waiting)
    }

    /// Every gateway slot is taken (a peer with no slots is always saturated).
    pub fn saturated(&self) -> bool {
        self.in_flight >= self.max_concurrency
    }
}

/// How a placement was decided; `as_str` is the metrics label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PlacementKind {
    /// A session seen for the first time, now remembered.
    New,
    /// A known session on its remembered peer.
    Sticky,
    /// A known session moved off a backed-up peer.
    Spill,
    /// A known session moved because its peer is not ready or gone.
    Migrated,
    /// The chosen peer had no room in the table: hash home, not remembered.
    TableFull,
    /// Mode `hash`: the rendezvous home.
    Hash,
    /// Mode `hash`: the home was not ready or saturated; least connections.
    HashFallback,
    /// No session id (or a mode that ignores sessions): least connections.
    LeastConn,
    /// Mode `round_robin`: the next ready peer in turn (a benchmark baseline).
    RoundRobin,
    /// The placed peer was at `max_concurrency`: this one request went to the
    /// least-loaded peer with room; the session's binding stays.
    Overflow,
}

impl PlacementKind {
    /// A turn placed where its conversation is not cached: a new session,
    /// or one moved off its engine (spilled, migrated, overflowed). Its
    /// whole prompt is computed there.
    pub fn is_cold(&self) -> bool {
        matches!(
            self,
            PlacementKind::New
                | PlacementKind::Spill
                | PlacementKind::Migrated
                | PlacementKind::Overflow
        )
    }

    pub fn as_str(&self) -> &'static str {
        match self {
            PlacementKind::New => "new",
            PlacementKind::Sticky => "sticky",
            PlacementKind::Spill => "spill",
            PlacementKind::Migrated => "migrated",
            PlacementKind::TableFull => "table_full",
            PlacementKind::Hash => "hash",
            PlacementKind::HashFallback => "hash_fallback",
            PlacementKind::LeastConn => "least_conn",
            PlacementKind::RoundRobin => "round_robin",
            PlacementKind::Overflow => "overflow",
        }
    }
}

/// Why a session left its peer (or its hash home); `as_str` is the metrics label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// The peer was backed up: requests queued (or, in mode `hash`, every
    /// gateway slot taken, so the request would have queued).
    Waiting,
    /// The peer's KV cache was full while it had requests queued.
    KvFull,
    /// The live sessions bound to the peer held more context than its KV.
    KvOvercommit,
    /// The peer is banned, failing probes or no longer configured.
    NotReady,
    /// The session table had no room for the chosen peer.
    TableFull,
    /// Every gateway slot of the placed peer was taken.
    Saturated,
}

impl Reason {
    pub fn as_str(&self) -> &'static str {
        match self {
            Reason::Waiting => "waiting",
            Reason::KvFull => "kv_full",
            Reason::KvOvercommit => "kv_overcommit",
            Reason::NotReady => "not_ready",
            Reason::TableFull => "table_full",
            Reason::Saturated => "saturated",
        }
    }
}

/// Where one request goes, and why: the one decision type of the gateway
/// (X-Routed-Mode is `kind`, the placements metric has `kind` and `reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    pub peer: PeerId,
    pub kind: PlacementKind,
    pub reason: Option<Reason>,
}

#[cfg(test)]
mod tests;
