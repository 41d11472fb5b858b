//! A remembered session (20 bytes) and the shards that hold them: the
//! table's data, apart from the code that reads and writes it
//! (`storage.rs`, `live.rs`, `mod.rs`), which all use it.

use std::collections::HashMap;
use std::sync::atomic::AtomicU32;

use parking_lot::Mutex;

use crate::placement::PeerId;

/// Enough shards that worker threads (a few dozen at most) rarely meet on one
/// lock, few enough that a scan's per-shard fixed costs stay negligible.
pub(super) const SHARD_COUNT: usize = 64;
pub(super) const SHARD_BITS: u32 = SHARD_COUNT.trailing_zeros();
pub(super) const TICK_MS: u64 = 100;
/// Shard bound of an empty shard: nothing in it can expire.
pub(super) const EMPTY_SHARD: u32 = u32::MAX;
/// Largest tick stored, so `tick + 1` (the moved-at encoding) never overflows.
pub(super) const MAX_TICK: u32 = u32::MAX - 1;

/// One remembered session, 20 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Binding {
    pub(super) peer: PeerId,
    /// Tick of its last turn's start or end, whichever is later.
    pub(super) last_seen: u32,
    /// Tick of the last move plus one; 0 when the session never moved.
    pub(super) moved_at_plus_one: u32,
    /// The session's context tokens as last seen (its prompt plus the reply).
    pub(super) tokens: u32,
    /// Tick its last turn ended plus one; 0 before any turn ended.
    pub(super) answered_plus_one: u32,
}

impl Binding {
    pub(super) fn moved_at(&self) -> Option<u32> {
        self.moved_at_plus_one.checked_sub(1)
    }

    pub(super) fn answered_at(&self) -> Option<u32> {
        self.answered_plus_one.checked_sub(1)
    }

    /// A turn started after the last one ended (or none has ended yet).
    pub(super) fn in_flight(&self) -> bool {
        self.answered_at()
            .is_none_or(|answered| self.last_seen > answered)
    }
}

pub(super) type ShardMap = HashMap<u64, Binding, ahash::RandomState>;

/// Aligned to a cache line so that neighbouring shards' locks and bounds do
/// not share one, which would make uncontended shards contend in hardware.
#[repr(align(64))]
pub(super) struct Shard {
    pub(super) map: Mutex<ShardMap>,
    /// Lower bound on the oldest `last_seen` in `map`, `EMPTY_SHARD` when it
    /// holds nothing. Written only under `map`'s lock; read without it.
    pub(super) oldest_bound: AtomicU32,
}

/// Refreshes a live session's `last_seen`; never moves it backwards when
/// callers' clocks race.
pub(super) fn touch(map: &mut ShardMap, sid: u64, now: u32) {
    if let Some(binding) = map.get_mut(&sid) {
        binding.last_seen = binding.last_seen.max(now);
    }
}
