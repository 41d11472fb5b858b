//! Storage and expiry of the bindings.
//!
//! Expiry: each shard keeps a lower bound on the oldest `last_seen` it holds.
//! Inserts lower it, refreshes leave it alone (they only make entries newer),
//! and a scan of the shard resets it to the exact oldest. A shard is scanned
//! only when that bound says something in it can have expired, so a full
//! table with a client sending a fresh id per request costs a few atomic loads
//! per request, not an O(n) scan under a lock.

use std::sync::atomic::Ordering::Relaxed;

use super::binding::{Binding, Shard, ShardMap, EMPTY_SHARD, MAX_TICK, SHARD_BITS, TICK_MS};
use super::SessionTable;
use crate::placement::rules::Remembered;
use crate::placement::PeerId;

impl SessionTable {
    /// Removes every expired session and returns how many. Shards whose bound
    /// says nothing in them can have expired are skipped without locking, so
    /// this costs `SHARD_COUNT` atomic loads when there is nothing to do.
    pub fn sweep(&self, now_ms: u64) -> usize {
        self.sweep_ticks(self.tick(now_ms))
    }

    pub(super) fn sweep_ticks(&self, now: u32) -> usize {
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

    pub(super) fn shard(&self, sid: u64) -> &Shard {
        let index = (self.shard_selector.hash_one(sid) >> (u64::BITS - SHARD_BITS)) as usize;
        // The index is below SHARD_COUNT by construction; `min` keeps any
        // future change of the constants from turning into a panic.
        &self.shards[index.min(self.shards.len() - 1)]
    }

    pub(super) fn tick(&self, now_ms: u64) -> u32 {
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

    pub(super) fn expired(&self, last_seen: u32, now: u32) -> bool {
        let idle_ms = self.config.load().idle_timeout_ms;
        u64::from(now.saturating_sub(last_seen)) * TICK_MS >= idle_ms
    }

    fn shard_may_hold_expired(&self, shard: &Shard, now: u32) -> bool {
        let bound = shard.oldest_bound.load(Relaxed);
        bound != EMPTY_SHARD && self.expired(bound, now)
    }

    pub(super) fn may_hold_expired(&self, now: u32) -> bool {
        self.shards
            .iter()
            .any(|shard| self.shard_may_hold_expired(shard, now))
    }

    pub(super) fn remembered(&self, binding: Binding, now: u32) -> Remembered {
        Remembered {
            peer: binding.peer,
            since_move_ms: binding
                .moved_at()
                .map(|moved_at| u64::from(now.saturating_sub(moved_at)) * TICK_MS),
            held: u64::from(binding.tokens),
        }
    }

    /// The session's binding if it is live; an expired one is removed here so
    /// that a session returning after its idle timeout is placed afresh.
    pub(super) fn live_binding(
        &self,
        map: &mut ShardMap,
        sid: u64,
        now: u32,
    ) -> Option<Remembered> {
        let binding = *map.get(&sid)?;
        if self.expired(binding.last_seen, now) {
            map.remove(&sid);
            self.total.fetch_sub(1, Relaxed);
            self.release(binding.peer, 1);
            return None;
        }
        Some(self.remembered(binding, now))
    }

    pub(super) fn rebind(&self, map: &mut ShardMap, sid: u64, from: PeerId, to: PeerId, now: u32) {
        if let Some(binding) = map.get_mut(&sid) {
            binding.peer = to;
            binding.last_seen = binding.last_seen.max(now);
            binding.moved_at_plus_one = now + 1;
        }
        self.release(from, 1);
    }
}

fn count_for(counts: &mut Vec<(PeerId, usize)>, peer: PeerId) {
    match counts.iter_mut().find(|(p, _)| *p == peer) {
        Some((_, count)) => *count += 1,
        None => counts.push((peer, 1)),
    }
}
