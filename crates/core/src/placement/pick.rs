//! Stateless pickers: least connections, rendezvous hashing and mode `hash`,
//! plus the least-loaded choice the session table rules share.

use std::cmp::{Ordering, Reverse};

use super::{PeerId, PeerLoad, Placement, PlacementKind, Reason};
use crate::hash::mix64;

/// The ready peer with the lowest `in_flight / max_concurrency`.
///
/// Saturated peers (`in_flight >= max_concurrency`) are chosen only when every
/// ready peer is saturated. Ties are broken by `rand`, which the caller draws
/// fresh per request: a fixed order would send every burst of equally loaded
/// picks to the same peer before its counters catch up.
pub fn least_conn(peers: &[PeerLoad], rand: u64) -> Option<PeerId> {
    let any_unsaturated = peers.iter().any(|p| p.ready && !p.saturated());
    let candidates = || {
        peers
            .iter()
            .filter(move |p| p.ready && (!any_unsaturated || !p.saturated()))
    };
    let best = candidates().min_by(|a, b| compare_utilisation(a, b))?;
    let tied = || candidates().filter(move |p| compare_utilisation(p, best).is_eq());
    let tie_count = tied().count() as u64;
    let pick = usize::try_from(rand % tie_count.max(1)).unwrap_or(0);
    tied().nth(pick).or(Some(best)).map(|p| p.id)
}

/// Compares `in_flight / max_concurrency` exactly, by cross-multiplying in u64.
fn compare_utilisation(a: &PeerLoad, b: &PeerLoad) -> Ordering {
    // A peer configured with no slots is always saturated; counting it as one
    // slot keeps the ratio finite for the all-saturated case.
    let a_max = u64::from(a.max_concurrency.max(1));
    let b_max = u64::from(b.max_concurrency.max(1));
    (u64::from(a.in_flight) * b_max).cmp(&(u64::from(b.in_flight) * a_max))
}

/// Rendezvous weight of a peer for a session.
///
/// Keyed on the `PeerId`, which the registry assigns per (route, host:port) and
/// keeps across reloads, so a session's home changes only when the home itself
/// leaves; adding or removing any other peer leaves it alone. Two gateway
/// processes agree on homes as long as their registries assigned the same ids,
/// which holds when they load the same route files in the same order.
fn rendezvous_weight(sid: u64, id: PeerId) -> (u64, Reverse<PeerId>) {
    // The id breaks (astronomically rare) weight ties the same way everywhere.
    (mix64(sid, u64::from(id)), Reverse(id))
}

/// The session's rendezvous (highest random weight) home among the ready peers.
pub fn rendezvous(sid: u64, peers: &[PeerLoad]) -> Option<PeerId> {
    peers
        .iter()
        .filter(|p| p.ready)
        .max_by_key(|p| rendezvous_weight(sid, p.id))
        .map(|p| p.id)
}

/// Mode `hash`: the session's rendezvous home, unless it cannot take the request.
///
/// The home is computed over every configured peer, ready or not, so that a
/// session's home does not silently change while it is down. When the home is
/// not ready the session goes to its next rendezvous choice among the ready
/// peers (`HashFallback`, `NotReady`): that choice is as stable as the home, so
/// the session keeps one warm cache during the outage instead of being spread
/// over every peer by least connections. When the chosen peer is saturated the
/// request goes by least connections (`HashFallback`, `Waiting`), unless every
/// other ready peer is saturated too, in which case it stays put.
pub fn hash_place(sid: u64, peers: &[PeerLoad], rand: u64) -> Option<Placement> {
    let home = peers.iter().max_by_key(|p| rendezvous_weight(sid, p.id))?;
    let (chosen, not_ready_reason) = if home.ready {
        (home, None)
    } else {
        let next = peers
            .iter()
            .filter(|p| p.ready)
            .max_by_key(|p| rendezvous_weight(sid, p.id))?;
        (next, Some(Reason::NotReady))
    };
    let kind_for_chosen = if not_ready_reason.is_some() {
        PlacementKind::HashFallback
    } else {
        PlacementKind::Hash
    };
    if !chosen.saturated() {
        return Some(Placement {
            peer: chosen.id,
            kind: kind_for_chosen,
            reason: not_ready_reason,
        });
    }
    let others_have_room = peers
        .iter()
        .any(|p| p.ready && p.id != chosen.id && !p.saturated());
    if !others_have_room {
        return Some(Placement {
            peer: chosen.id,
            kind: kind_for_chosen,
            reason: not_ready_reason,
        });
    }
    least_conn(peers, rand).map(|peer| Placement {
        peer,
        kind: PlacementKind::HashFallback,
        reason: Some(not_ready_reason.unwrap_or(Reason::Waiting)),
    })
}

/// The peer passing `eligible` that holds the least: fewest live bound
/// sessions (each weighted by its chance of coming back, see
/// [`Bound::returning_milli`]) plus requests (load as in
/// [`PeerLoad::load`]), then context tokens. What an engine is holding
/// between turns matters as much as what is in flight: by requests alone a
/// new session can land on an engine whose idle sessions will all be back
/// in a second. Requests still count on top: a slow engine keeps each turn
/// in flight longer, so it carries more at any moment for the same
/// sessions and gets fewer new ones; and the cold prompts still
/// prefilling there count on top, by their size (a session's worth of
/// context per median session), since the newcomer's prefill queues
/// behind them (the replay on vLLM-like engines put new sessions behind a
/// slow engine's backlog of cold prefills, 16-19 s to their first token,
/// and stacked a failed engine's sessions on one survivor). The sessions
/// count as many as the context they hold in sessions of `unit` tokens
/// (the route's median live session; 0: not counted), when that is more: a
/// few long agent contexts fill an engine's KV like many chats, and
/// counting them as one session each stacked three of them on one engine
/// of the skewed replay, whose KV then evicted their prefixes every turn;
/// where sessions are alike the count is the sessions' (adding the two
/// instead balanced tokens at the cost of sessions: 9 and 7 per engine on
/// uniform, and its p95 1.2-1.3x). Exact ties go to tokens.
pub(super) fn least_bound(
    sid: u64,
    peers: &[PeerLoad],
    unit: u64,
    eligible: impl Fn(&PeerLoad) -> bool,
) -> Option<&PeerLoad> {
    // The cold prompts still prefilling, by their size in sessions.
    let cold_milli = |p: &PeerLoad| match unit {
        0 => 0,
        unit => p.backlog_tokens.saturating_mul(u64::from(super::WHOLE)) / unit,
    };
    let held = |p: &PeerLoad| match unit {
        0 => 0,
        unit => {
            p.bound
                .returning_tokens
                .saturating_mul(u64::from(super::WHOLE))
                / unit
        }
    };
    peers.iter().filter(|p| eligible(p)).min_by_key(|p| {
        (
            p.bound
                .returning_milli
                .max(held(p))
                .saturating_add(u64::from(p.load()) * u64::from(super::WHOLE))
                .saturating_add(cold_milli(p)),
            p.bound.tokens,
            Reverse(rendezvous_weight(sid, p.id)),
        )
    })
}

/// The least-loaded peer passing `eligible` (load as in [`PeerLoad::load`]).
///
/// Ties go to the peer with the highest rendezvous weight for this session:
/// deterministic per session (so `peek` and `place` agree) yet spread across
/// peers, so a burst of new sessions arriving before any counter moves does
/// not all land on the first peer in the list.
pub(super) fn least_loaded(
    sid: u64,
    peers: &[PeerLoad],
    eligible: impl Fn(&PeerLoad) -> bool,
) -> Option<&PeerLoad> {
    peers
        .iter()
        .filter(|p| eligible(p))
        .min_by_key(|p| (p.load(), Reverse(rendezvous_weight(sid, p.id))))
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::placement::EngineLoad;

    pub(crate) fn peer(id: PeerId, in_flight: u32) -> PeerLoad {
        PeerLoad {
            in_flight,
            ..PeerLoad::idle(id, 64)
        }
    }

    #[test]
    fn a_peer_with_cold_prompts_still_prefilling_holds_more() {
        // Peer 1 has one request more in flight; peer 2 has two sessions'
        // worth of cold prompts that have not had their first token yet.
        let busy = PeerLoad {
            backlog_tokens: 2 * 5_000,
            ..peer(2, 3)
        };
        let peers = [peer(1, 4), busy];
        assert_eq!(
            least_bound(7, &peers, 5_000, |_| true).map(|p| p.id),
            Some(1)
        );
        // Control: the same requests past their first token, decoding.
        let decoding = PeerLoad {
            backlog_tokens: 0,
            ..busy
        };
        let peers = [peer(1, 4), decoding];
        assert_eq!(
            least_bound(7, &peers, 5_000, |_| true).map(|p| p.id),
            Some(2)
        );
    }

    #[test]
    fn long_contexts_count_as_the_sessions_they_weigh() {
        use crate::placement::Bound;
        // Peer 1: two live sessions, long agent contexts (100k tokens);
        // peer 2: three chats (15k). The median session holds 5k.
        let agents = PeerLoad {
            bound: Bound::whole(2, 100_000),
            ..peer(1, 0)
        };
        let chats = PeerLoad {
            bound: Bound::whole(3, 15_000),
            ..peer(2, 0)
        };
        let peers = [agents, chats];
        assert_eq!(
            least_bound(7, &peers, 5_000, |_| true).map(|p| p.id),
            Some(2)
        );
        // Control: sessions alone (no median known yet) favour peer 1.
        assert_eq!(least_bound(7, &peers, 0, |_| true).map(|p| p.id), Some(1));
    }

    #[test]
    fn least_conn_picks_lowest_utilisation_not_lowest_count() {
        let peers = [
            PeerLoad {
                max_concurrency: 10,
                ..peer(1, 5)
            },
            PeerLoad {
                max_concurrency: 100,
                ..peer(2, 20)
            },
        ];
        assert_eq!(least_conn(&peers, 0), Some(2));
        assert_eq!(least_conn(&peers, 1), Some(2));
    }

    #[test]
    fn least_conn_ties_follow_rand_and_cover_every_tied_peer() {
        let peers = [peer(1, 3), peer(2, 1), peer(3, 1), peer(4, 1)];
        let mut seen = std::collections::BTreeSet::new();
        for rand in 0..32u64 {
            seen.insert(least_conn(&peers, rand).expect("a ready peer"));
        }
        assert_eq!(seen.into_iter().collect::<Vec<_>>(), vec![2, 3, 4]);
        assert_ne!(least_conn(&peers, 0), least_conn(&peers, 1));
    }

    #[test]
    fn least_conn_skips_not_ready_and_saturated_unless_nothing_else() {
        let saturated = PeerLoad {
            max_concurrency: 2,
            ..peer(1, 2)
        };
        let not_ready = PeerLoad {
            ready: false,
            ..peer(2, 0)
        };
        let busy = peer(3, 50);
        assert_eq!(least_conn(&[saturated, not_ready, busy], 7), Some(3));
        // Control: with only saturated peers left, the least saturated wins.
        let more_saturated = PeerLoad {
            max_concurrency: 2,
            ..peer(4, 5)
        };
        assert_eq!(
            least_conn(&[more_saturated, saturated, not_ready], 7),
            Some(1)
        );
        let zero_slots = PeerLoad {
            max_concurrency: 0,
            ..peer(5, 0)
        };
        assert_eq!(least_conn(&[zero_slots, busy], 0), Some(3));
        assert_eq!(least_conn(&[zero_slots], 0), Some(5));
        assert_eq!(least_conn(&[not_ready], 0), None);
        assert_eq!(least_conn(&[], 0), None);
    }

    #[test]
    fn rendezvous_home_survives_removing_an_unrelated_peer() {
        let peers: Vec<PeerLoad> = (1..=8).map(|id| peer(id, 0)).collect();
        for sid in 0..2_000u64 {
            let sid = crate::hash::stable_hash64(&sid.to_le_bytes());
            let home = rendezvous(sid, &peers).expect("a ready peer");
            for removed in peers.iter().filter(|p| p.id != home) {
                let rest: Vec<PeerLoad> = peers
                    .iter()
                    .copied()
                    .filter(|p| p.id != removed.id)
                    .collect();
                assert_eq!(rendezvous(sid, &rest), Some(home));
            }
            // Control: removing the home itself does move the session.
            let without_home: Vec<PeerLoad> =
                peers.iter().copied().filter(|p| p.id != home).collect();
            assert_ne!(rendezvous(sid, &without_home), Some(home));
        }
    }

    #[test]
    fn rendezvous_spreads_sessions_evenly() {
        let peers: Vec<PeerLoad> = (1..=4).map(|id| peer(id, 0)).collect();
        let mut counts = [0u32; 5];
        for n in 0..40_000u64 {
            let sid = crate::hash::stable_hash64(&n.to_le_bytes());
            let home = rendezvous(sid, &peers).expect("a ready peer");
            counts[home as usize] += 1;
        }
        for count in &counts[1..] {
            assert!((9_000..11_000).contains(count), "{counts:?}");
        }
    }

    #[test]
    fn rendezvous_ignores_peers_that_are_not_ready() {
        let sid = 42;
        let mut peers: Vec<PeerLoad> = (1..=4).map(|id| peer(id, 0)).collect();
        let home = rendezvous(sid, &peers).expect("a ready peer");
        for p in peers.iter_mut().filter(|p| p.id == home) {
            p.ready = false;
        }
        let next = rendezvous(sid, &peers).expect("a ready peer");
        assert_ne!(next, home);
        for p in peers.iter_mut() {
            p.ready = false;
        }
        assert_eq!(rendezvous(sid, &peers), None);
    }

    #[test]
    fn hash_place_uses_home_then_falls_back() {
        let sid = 7;
        let peers: Vec<PeerLoad> = (1..=4).map(|id| peer(id, 0)).collect();
        let home = rendezvous(sid, &peers).expect("a ready peer");
        assert_eq!(
            hash_place(sid, &peers, 0),
            Some(Placement {
                peer: home,
                kind: PlacementKind::Hash,
                reason: None
            })
        );

        let mut down = peers.clone();
        for p in down.iter_mut().filter(|p| p.id == home) {
            p.ready = false;
        }
        let fallback = hash_place(sid, &down, 0).expect("a ready peer");
        assert_eq!(fallback.kind, PlacementKind::HashFallback);
        assert_eq!(fallback.reason, Some(Reason::NotReady));
        assert_eq!(Some(fallback.peer), rendezvous(sid, &down));
        // The fallback is stable across requests while the home is down.
        assert_eq!(hash_place(sid, &down, 99), Some(fallback));

        let mut saturated = peers.clone();
        for p in saturated.iter_mut() {
            p.in_flight = if p.id == home { 64 } else { 10 };
        }
        let fallback = hash_place(sid, &saturated, 3).expect("a ready peer");
        assert_eq!(fallback.kind, PlacementKind::HashFallback);
        assert_eq!(fallback.reason, Some(Reason::Waiting));
        assert_ne!(fallback.peer, home);

        // Control: when every peer is saturated, moving gains nothing.
        let all_saturated: Vec<PeerLoad> = peers
            .iter()
            .map(|p| PeerLoad {
                in_flight: 64,
                ..*p
            })
            .collect();
        assert_eq!(
            hash_place(sid, &all_saturated, 3).map(|p| (p.peer, p.kind)),
            Some((home, PlacementKind::Hash))
        );

        let none_ready: Vec<PeerLoad> = peers
            .iter()
            .map(|p| PeerLoad { ready: false, ..*p })
            .collect();
        assert_eq!(hash_place(sid, &none_ready, 0), None);
        assert_eq!(hash_place(sid, &[], 0), None);
    }

    #[test]
    fn load_uses_engine_metrics_only_to_raise_in_flight() {
        let base = peer(1, 5);
        assert_eq!(base.load(), 5);
        let engine = |running, waiting| PeerLoad {
            engine: Some(EngineLoad {
                running,
                waiting,
                kv_usage: 0.5,
            }),
            ..base
        };
        assert_eq!(engine(2, 1).load(), 5);
        assert_eq!(engine(6, 3).load(), 9);
        assert_eq!(engine(u32::MAX, 3).load(), u32::MAX);
        assert_eq!(engine(6, 3).waiting(), 3);
        assert_eq!(base.waiting(), 0);
    }

    #[test]
    fn least_loaded_ties_are_spread_by_session() {
        let peers: Vec<PeerLoad> = (1..=4).map(|id| peer(id, 3)).collect();
        let mut seen = std::collections::BTreeSet::new();
        for sid in 0..64u64 {
            let first = least_loaded(sid, &peers, |p| p.ready).map(|p| p.id);
            assert_eq!(first, least_loaded(sid, &peers, |p| p.ready).map(|p| p.id));
            seen.extend(first);
        }
        assert_eq!(seen.len(), 4);
    }
}
