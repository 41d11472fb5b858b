//! Slot reservation: each peer's binding count against its cap.
//!
//! Counts: per-peer binding counts are atomics, reserved with a conditional
//! increment before an insert, so the per-peer cap is exact and checked in O(1).

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use super::SessionTable;
use crate::placement::PeerId;

impl SessionTable {
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

    /// Takes one of `peer`'s `cap` binding slots; false when none is left.
    pub(super) fn reserve(&self, peer: PeerId, cap: usize) -> bool {
        let increment = |count: usize| (count < cap).then_some(count + 1);
        if let Some(count) = self.per_peer.read().get(&peer) {
            return count.fetch_update(Relaxed, Relaxed, increment).is_ok();
        }
        let mut per_peer = self.per_peer.write();
        let count = per_peer.entry(peer).or_insert_with(|| AtomicUsize::new(0));
        count.fetch_update(Relaxed, Relaxed, increment).is_ok()
    }

    /// Counts a binding against `peer` whatever its cap (an adopted one).
    pub(super) fn force_reserve(&self, peer: PeerId) {
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

    pub(super) fn has_room(&self, peer: PeerId, cap: usize) -> bool {
        let count = self
            .per_peer
            .read()
            .get(&peer)
            .map_or(0, |count| count.load(Relaxed));
        count < cap
    }

    pub(super) fn release(&self, peer: PeerId, n: usize) {
        if let Some(count) = self.per_peer.read().get(&peer) {
            // Saturating: a binding inserted for a peer while `forget_peer`
            // dropped its counter must not wrap the recreated one.
            let _ = count.fetch_update(Relaxed, Relaxed, |c| Some(c.saturating_sub(n)));
        }
    }
}
