//! Live accounting: which bound sessions hold KV on their peer now, and
//! what they add to its counts.

use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;

use super::binding::{Binding, ShardMap, TICK_MS};
use super::counts::{LiveCounts, LiveRule, Share};
use super::SessionTable;
use crate::placement::{Bound, PeerId, WHOLE};

impl SessionTable {
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
        let last = self.last_recount.swap(now, Relaxed);
        for shard in self.shards.iter() {
            let map = shard.map.lock();
            for binding in map.values() {
                if !rule.holds(binding, now) {
                    if rule.left_between(binding, last, now) {
                        self.ended.record(binding.tokens);
                    }
                    continue;
                }
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

    /// The median context of the live sessions (0 while none is known), as
    /// of the last recount.
    pub fn median_live_tokens(&self) -> u64 {
        self.median_live_tokens.load(Relaxed)
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
        let typical = u32::try_from(self.ended.typical()).unwrap_or(u32::MAX);
        Share {
            sessions: 1,
            returning_milli,
            tokens: binding.tokens,
            projected: binding.tokens.max(typical),
        }
    }

    /// The live window in force after an answer, in milliseconds: learned
    /// or configured.
    pub fn live_window_ms(&self) -> u64 {
        self.live_rule().after_answer_ticks.saturating_mul(TICK_MS)
    }

    /// What `binding` adds to its peer's counts now.
    pub(super) fn share_of(&self, binding: &Binding, now: u32) -> Share {
        if !self.is_live(binding, now) {
            return Share::default();
        }
        self.live_share(binding, now)
    }

    pub(super) fn share_in(&self, map: &ShardMap, sid: u64, now: u32) -> Share {
        map.get(&sid)
            .map_or(Share::default(), |b| self.share_of(b, now))
    }

    /// Drops `sid`'s binding to `from` and what it counted there, live
    /// share included.
    pub(super) fn forget(&self, map: &mut ShardMap, sid: u64, from: PeerId, was: Share) {
        if map.remove(&sid).is_some() {
            self.total.fetch_sub(1, Relaxed);
            self.release(from, 1);
            self.live_change(from, was, Share::default());
        }
    }

    /// One session's share of `peer`'s counts went from `was` to `is`.
    pub(super) fn live_change(&self, peer: PeerId, was: Share, is: Share) {
        if was == is {
            return;
        }
        if let Some(c) = self.live.read().get(&peer) {
            return c.change(was, is);
        }
        self.live.write().entry(peer).or_default().change(was, is);
    }

    pub(super) fn live_move(&self, from: PeerId, was: Share, to: PeerId, is: Share) {
        self.live_change(from, was, Share::default());
        self.live_change(to, Share::default(), is);
    }
}
