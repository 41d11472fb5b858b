//! Explanations: what `place` would do, and why, changing nothing.

use std::sync::atomic::Ordering::Relaxed;

use super::{table_full, SessionTable};
use crate::placement::incoming::Incoming;
use crate::placement::model::{self, Ask, Estimate, RouteModel};
use crate::placement::rules::{self, Verdict};
use crate::placement::{PeerId, PeerLoad, Placement, PlacementKind, Reason};

impl SessionTable {
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
            ..Incoming::default()
        };
        let config = self.config.load();
        let limits = config.limits(self.median_live_tokens.load(Relaxed), self.model(peers));
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

    /// The model's estimate on each of `peers` for a request of `incoming`
    /// (of session `sid`, when it has a live binding: its home, and what it
    /// held there), and what the model knew of the route; changing nothing.
    pub fn estimates(
        &self,
        sid: Option<u64>,
        incoming: Incoming,
        peers: &[PeerLoad],
        now_ms: u64,
    ) -> (RouteModel, Vec<Estimate>) {
        let now = self.tick(now_ms);
        let binding = sid.and_then(|sid| {
            let map = self.shard(sid).map.lock();
            map.get(&sid)
                .copied()
                .filter(|b| !self.expired(b.last_seen, now))
        });
        let held = binding.map_or(0, |b| u64::from(b.tokens));
        let ask = Ask {
            tokens: incoming.tokens.max(held),
            home: binding.map(|b| b.peer),
            held,
            prefix: incoming.prefix,
        };
        let route = self.model(peers);
        let estimates = model::weigh(peers, &ask, &route, |p| p.ready)
            .into_iter()
            .map(|(_, e)| e)
            .collect();
        (route, estimates)
    }
}
