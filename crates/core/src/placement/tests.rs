//! One test per load-aware placement rule, clock injected. Every "does not
//! move" test has a control next to it that does move, so a test cannot pass
//! merely because nothing ever moves.

use super::*;

const T0: u64 = 1_700_000_000_000;
const SECOND: u64 = 1_000;
const MINUTE: u64 = 60 * SECOND;

/// A peer without fresh engine metrics carrying `in_flight` requests.
fn blind(id: PeerId, in_flight: u32) -> PeerLoad {
    PeerLoad {
        in_flight,
        ..PeerLoad::idle(id, 64)
    }
}

/// A peer with fresh engine metrics; its load is `running + waiting`.
fn fresh(id: PeerId, running: u32, waiting: u32) -> PeerLoad {
    PeerLoad {
        engine: Some(EngineLoad {
            running,
            waiting,
            kv_usage: 0.5,
        }),
        ..PeerLoad::idle(id, 64)
    }
}

fn kv_full(peer: PeerLoad) -> PeerLoad {
    let engine = peer.engine.unwrap_or_default();
    PeerLoad {
        engine: Some(EngineLoad {
            kv_usage: 0.99,
            ..engine
        }),
        kv_full: true,
        ..peer
    }
}

fn not_ready(peer: PeerLoad) -> PeerLoad {
    PeerLoad {
        ready: false,
        ..peer
    }
}

fn table() -> SessionTable {
    SessionTable::new(TableConfig::default())
}

fn at(peer: PeerId, kind: PlacementKind, reason: Option<Reason>) -> Option<Placement> {
    Some(Placement { peer, kind, reason })
}

fn sticky(peer: PeerId) -> Option<Placement> {
    at(peer, PlacementKind::Sticky, None)
}

/// Binds `sid` to `peer` as a new session by making it the only idle one.
fn admitted(peer: PeerId, kind: PlacementKind) -> Admission {
    Admission::Placed(Placement {
        peer,
        kind,
        reason: None,
    })
}

fn bind(table: &SessionTable, sid: u64, peer: PeerId, ids: &[PeerId], now: u64) {
    let peers: Vec<PeerLoad> = ids
        .iter()
        .map(|&id| blind(id, if id == peer { 0 } else { 1_000 }))
        .collect();
    assert_eq!(
        table.place(sid, &peers, now),
        at(peer, PlacementKind::New, None)
    );
}

/// `place` and `peek` must agree; `peek` must not change what `place` sees.
fn place_checked(
    table: &SessionTable,
    sid: u64,
    peers: &[PeerLoad],
    now: u64,
) -> Option<Placement> {
    let peeked = table.peek(sid, peers, now);
    assert_eq!(table.peek(sid, peers, now), peeked, "peek is not pure");
    let placed = table.place(sid, peers, now);
    assert_eq!(peeked.as_ref().map(|(p, _)| *p), placed);
    placed
}

#[test]
fn new_session_goes_to_least_loaded_ready_peer_and_is_remembered() {
    let t = table();
    let peers = [
        blind(1, 5),
        blind(2, 2),
        not_ready(blind(3, 0)),
        blind(4, 3),
    ];
    assert_eq!(
        place_checked(&t, 10, &peers, T0),
        at(2, PlacementKind::New, None)
    );
    assert_eq!(t.len(), 1);
    assert_eq!(place_checked(&t, 10, &peers, T0 + SECOND), sticky(2));
    assert_eq!(t.bindings_per_peer(), vec![(2, 1)]);
}

#[test]
fn new_session_counts_engine_load_not_only_in_flight() {
    let t = table();
    // Peer 1 has few requests from this gateway but a long engine queue.
    let peers = [
        PeerLoad {
            in_flight: 1,
            ..fresh(1, 10, 5)
        },
        blind(2, 4),
    ];
    assert_eq!(
        place_checked(&t, 1, &peers, T0),
        at(2, PlacementKind::New, None)
    );
}

#[test]
fn new_sessions_avoid_kv_full_peers() {
    let t = table();
    let peers = [kv_full(fresh(1, 0, 0)), fresh(2, 6, 0)];
    assert_eq!(
        place_checked(&t, 1, &peers, T0),
        at(2, PlacementKind::New, None)
    );
    // Control: without the KV flag the idle peer wins.
    let peers = [fresh(1, 0, 0), fresh(2, 6, 0)];
    assert_eq!(
        place_checked(&t, 2, &peers, T0),
        at(1, PlacementKind::New, None)
    );
}

#[test]
fn known_session_stays_while_lightly_loaded() {
    let t = table();
    bind(&t, 1, 1, &[1, 2], T0);
    // Busier than the other peer and even queuing, but under the margin.
    let peers = [fresh(1, 5, 2), fresh(2, 4, 0)];
    for n in 0..100 {
        assert_eq!(place_checked(&t, 1, &peers, T0 + n * SECOND), sticky(1));
    }
}

#[test]
fn spills_at_the_threshold_and_not_one_request_before() {
    let t = table();
    bind(&t, 1, 1, &[1, 2, 3], T0);
    let other = fresh(2, 3, 0);
    let busier = fresh(3, 9, 0);
    // Load 5 running + 1 waiting = 6 = 3 + 4 - 1: one request short.
    let one_short = [fresh(1, 5, 1), other, busier];
    assert_eq!(place_checked(&t, 1, &one_short, T0), sticky(1));
    // Load 7 = 3 + 4: spills to the least-loaded peer.
    let at_threshold = [fresh(1, 6, 1), other, busier];
    assert_eq!(
        place_checked(&t, 1, &at_threshold, T0),
        at(2, PlacementKind::Spill, Some(Reason::Waiting))
    );
    assert_eq!(t.bindings_per_peer(), vec![(1, 0), (2, 1)]);
}

#[test]
fn fresh_metrics_with_nothing_waiting_never_spill_for_load() {
    let t = table();
    bind(&t, 1, 1, &[1, 2], T0);
    let idle_queue = [fresh(1, 40, 0), fresh(2, 0, 0)];
    assert_eq!(place_checked(&t, 1, &idle_queue, T0), sticky(1));
    // Control: one request waiting and the same gap moves it.
    let queued = [fresh(1, 40, 1), fresh(2, 0, 0)];
    assert_eq!(
        place_checked(&t, 1, &queued, T0),
        at(2, PlacementKind::Spill, Some(Reason::Waiting))
    );
}

#[test]
fn without_fresh_metrics_the_margin_is_eight() {
    let t = table();
    bind(&t, 1, 1, &[1, 2], T0);
    assert_eq!(
        place_checked(&t, 1, &[blind(1, 10), blind(2, 3)], T0),
        sticky(1)
    );
    assert_eq!(
        place_checked(&t, 1, &[blind(1, 11), blind(2, 3)], T0),
        at(2, PlacementKind::Spill, Some(Reason::Waiting))
    );
}

#[test]
fn spilled_session_does_not_return_home() {
    let t = table();
    bind(&t, 1, 1, &[1, 2], T0);
    assert_eq!(
        place_checked(&t, 1, &[fresh(1, 8, 2), fresh(2, 0, 0)], T0),
        at(2, PlacementKind::Spill, Some(Reason::Waiting))
    );
    // Long after the cooldown, home is idle again and the new peer is busier,
    // but not backed up: the session keeps its new (now warm) cache.
    let later = T0 + 10 * MINUTE;
    let home_idle = [fresh(1, 0, 0), fresh(2, 3, 0)];
    for n in 0..10 {
        assert_eq!(
            place_checked(&t, 1, &home_idle, later + n * SECOND),
            sticky(2)
        );
    }
    // Control: once the new peer is backed up, the session moves again.
    let backed_up = [fresh(1, 0, 0), fresh(2, 3, 1)];
    assert_eq!(
        place_checked(&t, 1, &backed_up, later + 20 * SECOND),
        at(1, PlacementKind::Spill, Some(Reason::Waiting))
    );
}

#[test]
fn cooldown_holds_then_releases_at_sixty_seconds() {
    let t = table();
    bind(&t, 1, 1, &[1, 2], T0);
    let backed_up_on_1 = [fresh(1, 10, 2), fresh(2, 0, 0)];
    assert_eq!(
        place_checked(&t, 1, &backed_up_on_1, T0),
        at(2, PlacementKind::Spill, Some(Reason::Waiting))
    );
    let backed_up_on_2 = [fresh(1, 0, 0), fresh(2, 10, 2)];
    assert_eq!(
        place_checked(&t, 1, &backed_up_on_2, T0 + 59_900),
        sticky(2)
    );
    assert_eq!(
        place_checked(&t, 1, &backed_up_on_2, T0 + 60 * SECOND),
        at(1, PlacementKind::Spill, Some(Reason::Waiting))
    );
}

#[test]
fn cooldown_also_holds_kv_full_moves() {
    let t = table();
    bind(&t, 1, 1, &[1, 2], T0);
    assert_eq!(
        place_checked(&t, 1, &[fresh(1, 10, 2), fresh(2, 0, 0)], T0),
        at(2, PlacementKind::Spill, Some(Reason::Waiting))
    );
    let kv_full_on_2 = [fresh(1, 3, 0), kv_full(fresh(2, 4, 1))];
    assert_eq!(
        place_checked(&t, 1, &kv_full_on_2, T0 + 30 * SECOND),
        sticky(2)
    );
    assert_eq!(
        place_checked(&t, 1, &kv_full_on_2, T0 + 61 * SECOND),
        at(1, PlacementKind::Spill, Some(Reason::KvFull))
    );
}

#[test]
fn kv_full_with_nothing_waiting_stays() {
    let t = table();
    bind(&t, 1, 1, &[1, 2], T0);
    let full_not_queuing = [kv_full(fresh(1, 3, 0)), fresh(2, 0, 0)];
    assert_eq!(place_checked(&t, 1, &full_not_queuing, T0), sticky(1));
    // Even far busier than its peers, with nothing queued it stays.
    let very_busy = [kv_full(fresh(1, 60, 0)), fresh(2, 0, 0)];
    assert_eq!(place_checked(&t, 1, &very_busy, T0), sticky(1));
    // Control: the same peer with one request queued sheds the session to a
    // peer with KV room that is no busier.
    let full_and_queuing = [kv_full(fresh(1, 3, 1)), fresh(2, 2, 0)];
    assert_eq!(
        place_checked(&t, 1, &full_and_queuing, T0),
        at(2, PlacementKind::Spill, Some(Reason::KvFull))
    );
}

#[test]
fn kv_full_and_queuing_moves_only_to_a_peer_no_busier() {
    let t = table();
    bind(&t, 1, 1, &[1, 2, 3], T0);
    // Load 10 with 1 waiting: under the waiting margin to everyone.
    let home = kv_full(fresh(1, 9, 1));
    let busier = [home, fresh(2, 11, 0), fresh(3, 12, 0)];
    assert_eq!(place_checked(&t, 1, &busier, T0), sticky(1));
    // A KV-full peer with less load is no escape either.
    let only_full_room = [home, kv_full(fresh(2, 0, 0)), fresh(3, 11, 0)];
    assert_eq!(place_checked(&t, 1, &only_full_room, T0), sticky(1));
    // Control: an equally loaded peer with KV room takes it, and of two such
    // peers the less loaded one.
    let no_busier = [home, fresh(2, 10, 0), fresh(3, 9, 0)];
    assert_eq!(
        place_checked(&t, 1, &no_busier, T0),
        at(3, PlacementKind::Spill, Some(Reason::KvFull))
    );
}

#[test]
fn all_peers_kv_full() {
    let t = table();
    let all_full = [
        kv_full(fresh(1, 5, 3)),
        kv_full(fresh(2, 2, 0)),
        kv_full(fresh(3, 30, 9)),
    ];
    // New sessions still get the least-loaded ready peer.
    assert_eq!(
        place_checked(&t, 1, &all_full, T0),
        at(2, PlacementKind::New, None)
    );
    // Known sessions stay, even when backed up: no peer has KV room to take them.
    bind(&t, 2, 3, &[1, 2, 3], T0);
    assert_eq!(place_checked(&t, 2, &all_full, T0), sticky(3));
    // Control: once one peer has KV room again, the backed-up session moves.
    let one_with_room = [all_full[0], fresh(2, 2, 0), all_full[2]];
    assert_eq!(
        place_checked(&t, 2, &one_with_room, T0),
        at(2, PlacementKind::Spill, Some(Reason::Waiting))
    );
}

#[test]
fn single_peer() {
    let t = table();
    let alone = [fresh(1, 60, 50)];
    assert_eq!(
        place_checked(&t, 1, &alone, T0),
        at(1, PlacementKind::New, None)
    );
    assert_eq!(
        place_checked(&t, 1, &[kv_full(fresh(1, 60, 50))], T0),
        sticky(1)
    );
    assert_eq!(place_checked(&t, 1, &[not_ready(alone[0])], T0), None);
    assert_eq!(place_checked(&t, 2, &[not_ready(alone[0])], T0), None);
    assert_eq!(place_checked(&t, 2, &[], T0), None);
    // The binding survives an outage with nowhere else to go.
    assert_eq!(place_checked(&t, 1, &alone, T0 + SECOND), sticky(1));
    assert_eq!(t.len(), 1);
}

#[test]
fn not_ready_peer_moves_its_sessions_at_once_and_they_stay_moved() {
    let t = table();
    bind(&t, 1, 1, &[1, 2, 3], T0);
    // Just spilled to 2: the cooldown is running.
    assert_eq!(
        place_checked(&t, 1, &[blind(1, 30), blind(2, 0), blind(3, 5)], T0),
        at(2, PlacementKind::Spill, Some(Reason::Waiting))
    );
    let two_down = [blind(1, 4), not_ready(blind(2, 0)), blind(3, 2)];
    assert_eq!(
        place_checked(&t, 1, &two_down, T0 + SECOND),
        at(3, PlacementKind::Migrated, Some(Reason::NotReady))
    );
    // Peer 2 is back and idle; the session stays where it went.
    let two_back = [blind(1, 4), blind(2, 0), blind(3, 2)];
    assert_eq!(place_checked(&t, 1, &two_back, T0 + 2 * SECOND), sticky(3));
    assert_eq!(t.bindings_per_peer(), vec![(1, 0), (2, 0), (3, 1)]);
}

#[test]
fn removed_peer_moves_its_sessions_at_once() {
    let t = table();
    bind(&t, 1, 7, &[7, 8, 9], T0);
    let peers = [blind(8, 3), blind(9, 1)];
    assert_eq!(
        place_checked(&t, 1, &peers, T0),
        at(9, PlacementKind::Migrated, Some(Reason::NotReady))
    );
    // Control: with its peer present and ready it would have stayed.
    bind(&t, 2, 7, &[7, 8, 9], T0);
    assert_eq!(
        place_checked(&t, 2, &[blind(7, 3), blind(9, 1)], T0),
        sticky(7)
    );
}

#[test]
fn migration_prefers_a_peer_with_kv_room() {
    let t = table();
    bind(&t, 1, 1, &[1, 2, 3], T0);
    let peers = [
        not_ready(blind(1, 0)),
        kv_full(fresh(2, 0, 0)),
        fresh(3, 5, 0),
    ];
    assert_eq!(
        place_checked(&t, 1, &peers, T0),
        at(3, PlacementKind::Migrated, Some(Reason::NotReady))
    );
}

#[test]
fn full_table_falls_back_to_the_hash_home_unremembered() {
    let t = SessionTable::new(TableConfig {
        max_sessions_per_peer: 2,
        ..TableConfig::default()
    });
    let peers = [blind(1, 0), blind(2, 9)];
    assert_eq!(
        place_checked(&t, 1, &peers, T0),
        at(1, PlacementKind::New, None)
    );
    assert_eq!(
        place_checked(&t, 2, &peers, T0),
        at(1, PlacementKind::New, None)
    );
    for sid in 3..40u64 {
        let home = rendezvous(sid, &peers).expect("a ready peer");
        let expected = at(home, PlacementKind::TableFull, Some(Reason::TableFull));
        assert_eq!(place_checked(&t, sid, &peers, T0), expected);
        // Not remembered: the next request is judged afresh, to the same home.
        assert_eq!(place_checked(&t, sid, &peers, T0 + SECOND), expected);
    }
    assert_eq!(t.len(), 2);
    assert_eq!(t.bindings_per_peer(), vec![(1, 2)]);
    // Control: once peer 2 is the least loaded, new sessions are remembered there.
    let peers = [blind(1, 9), blind(2, 0)];
    assert_eq!(
        place_checked(&t, 50, &peers, T0),
        at(2, PlacementKind::New, None)
    );
    assert_eq!(t.len(), 3);
}

#[test]
fn spill_onto_a_full_peer_stays_instead() {
    let t = SessionTable::new(TableConfig {
        max_sessions_per_peer: 1,
        ..TableConfig::default()
    });
    bind(&t, 1, 1, &[1, 2], T0);
    bind(&t, 2, 2, &[1, 2], T0);
    let backed_up = [fresh(1, 10, 2), fresh(2, 0, 0)];
    assert_eq!(place_checked(&t, 1, &backed_up, T0), sticky(1));
    // Control: room on peer 2 lets it spill.
    t.set_config(TableConfig {
        max_sessions_per_peer: 2,
        ..TableConfig::default()
    });
    assert_eq!(
        place_checked(&t, 1, &backed_up, T0),
        at(2, PlacementKind::Spill, Some(Reason::Waiting))
    );
}

#[test]
fn herd_on_a_kv_full_peer_does_not_move_onto_busier_peers() {
    let t = table();
    let ids = [1, 2, 3];
    for sid in 0..48 {
        bind(&t, sid, 1, &ids, T0);
    }
    // 48 agents on a KV-full, queuing peer; both others are busier.
    let home = kv_full(fresh(1, 45, 3));
    let busier = [home, fresh(2, 50, 0), fresh(3, 60, 0)];
    for sid in 0..48 {
        assert_eq!(place_checked(&t, sid, &busier, T0 + MINUTE), sticky(1));
    }

    // Control, played out: peer 2 starts less busy, and every move shifts one
    // request from peer 1 to peer 2. Moves stop once peer 2 would be busier.
    let mut home = kv_full(fresh(1, 45, 3));
    let mut other = fresh(2, 20, 0);
    let mut moved = 0;
    for sid in 0..48 {
        let placed = place_checked(&t, sid, &[home, other, fresh(3, 60, 0)], T0 + 2 * MINUTE)
            .expect("a ready peer");
        if placed.peer == 2 {
            assert_eq!(placed.kind, PlacementKind::Spill);
            moved += 1;
            if let (Some(h), Some(o)) = (home.engine.as_mut(), other.engine.as_mut()) {
                h.running -= 1;
                o.running += 1;
            }
        } else {
            assert_eq!(Some(placed), sticky(1));
        }
    }
    assert!(moved > 0 && moved < 48, "moved {moved}");
    // Each move needed the target no busier than home before it, so after
    // the last one the target is at most the moved request above home.
    assert!(
        other.load() <= home.load() + 2,
        "{} vs {}",
        other.load(),
        home.load()
    );
    assert_eq!(t.bindings_per_peer(), vec![(1, 48 - moved), (2, moved)]);
}

#[test]
fn peek_explains_and_changes_nothing() {
    let t = table();
    let peers = [fresh(1, 8, 2), fresh(2, 0, 0)];
    let (placement, why) = t.peek(1, &peers, T0).expect("a ready peer");
    assert_eq!(
        placement,
        Placement {
            peer: 2,
            kind: PlacementKind::New,
            reason: None
        }
    );
    assert!(why.contains("unknown session"), "{why}");
    assert!(t.is_empty());

    bind(&t, 1, 1, &[1, 2], T0);
    let (placement, why) = t.peek(1, &peers, T0).expect("a ready peer");
    assert_eq!(placement.kind, PlacementKind::Spill);
    assert!(why.contains("backed up"), "{why}");
    // Peeking did not move it: a calm peer set still finds it on peer 1.
    assert_eq!(t.place(1, &[fresh(1, 0, 0), fresh(2, 0, 0)], T0), sticky(1));
    let (_, why) = t
        .peek(1, &[fresh(1, 1, 0), fresh(2, 0, 0)], T0)
        .expect("a ready peer");
    assert!(why.contains("stays"), "{why}");
    assert_eq!(t.peek(1, &[not_ready(peers[0])], T0), None);
}

#[test]
fn peek_does_not_refresh_last_seen() {
    let t = SessionTable::new(TableConfig {
        idle_timeout_ms: MINUTE,
        ..TableConfig::default()
    });
    let peers = [blind(1, 0)];
    t.place(1, &peers, T0);
    for n in 1..10 {
        t.peek(1, &peers, T0 + n * 10 * SECOND);
    }
    assert_eq!(
        t.place(1, &peers, T0 + MINUTE),
        at(1, PlacementKind::New, None)
    );
}

#[test]
fn labels() {
    let kinds = [
        (PlacementKind::New, "new"),
        (PlacementKind::Sticky, "sticky"),
        (PlacementKind::Spill, "spill"),
        (PlacementKind::Migrated, "migrated"),
        (PlacementKind::TableFull, "table_full"),
        (PlacementKind::Hash, "hash"),
        (PlacementKind::HashFallback, "hash_fallback"),
        (PlacementKind::LeastConn, "least_conn"),
    ];
    for (kind, label) in kinds {
        assert_eq!(kind.as_str(), label);
    }
    let reasons = [
        (Reason::Waiting, "waiting"),
        (Reason::KvFull, "kv_full"),
        (Reason::NotReady, "not_ready"),
        (Reason::TableFull, "table_full"),
        (Reason::KvOvercommit, "kv_overcommit"),
    ];
    for (reason, label) in reasons {
        assert_eq!(reason.as_str(), label);
    }
}

// ---- what is bound: session- and token-weighted placement, KV admission

fn holding(peer: PeerLoad, sessions: u32, tokens: u64) -> PeerLoad {
    PeerLoad {
        bound: Bound::whole(sessions, tokens),
        ..peer
    }
}

/// A table that has learned its clients think 1 s between turns: 300 gaps
/// from sessions of `turns` turns each, whose last answers (one per
/// session) were never followed by a turn. The sessions are on peer 9 and
/// long out of the live window by `T0 + 100 s`.
fn table_thinking_one_second(turns: u64) -> SessionTable {
    let t = SessionTable::new(TableConfig {
        live_window_ms: 10 * SECOND,
        ..TableConfig::default()
    });
    let peers = [blind(9, 0)];
    let sessions = 300 / (turns - 1);
    for sid in 100_000..100_000 + sessions {
        for turn in 0..turns {
            let at = T0 + turn * SECOND;
            t.place(sid, &peers, at);
            t.turn_ended(sid, Some(1_000), at);
        }
    }
    t.refresh_live(T0 + turns * SECOND);
    assert_eq!(t.live_window_ms(), 2 * SECOND);
    t
}

#[test]
fn a_session_idle_past_its_clients_usual_think_time_weighs_less_until_it_returns() {
    // Sessions of 4 turns: 100 of 400 answers ended a session.
    let t = table_thinking_one_second(4);
    let peers = [blind(1, 0)];
    let start = T0 + 100 * SECOND;
    for sid in [1, 2, 3, 4] {
        t.place(sid, &peers, start);
    }
    t.turn_ended(1, Some(4_000), start);
    t.turn_ended(2, Some(4_000), start + 500);
    t.turn_ended(3, Some(4_000), start + 1_500);
    // 4's turn is still running.
    let now = start + 1_500;
    t.refresh_live(now);
    let bound = t.live_of(1);
    assert_eq!(bound.sessions, 4, "all four are inside the live window");
    assert_eq!(
        bound.tokens,
        3 * 4_000,
        "4's size is unknown until it answers"
    );
    // Of 403 answers, 300 were followed by a turn and 103 were not (the 100
    // sessions that ended and the three just answered). 1 has been idle
    // 1.5 s, longer than every gap seen: gone. 2 has been idle 1 s, the
    // usual gap, and half the bucket counts as longer: 150 / (150 + 103).
    // 3 has just answered: 300 / (300 + 103). 4 is in flight: whole.
    assert_eq!(bound.returning_milli, 592 + 744 + 1_000);
    assert_eq!(bound.returning_tokens, 2_368 + 2_976);
    // 1 returns after all: it counts whole again at once, not at the next
    // recount.
    assert_eq!(t.place(1, &peers, now), sticky(1));
    assert_eq!(t.live_of(1).returning_milli, 1_000 + 592 + 744 + 1_000);

    // Where sessions seldom end (11 turns: 31 of 331 answers not followed
    // by a turn), the same idle time weighs more: 150 / (150 + 31).
    let t = table_thinking_one_second(11);
    t.place(2, &peers, start);
    t.turn_ended(2, Some(4_000), start + 500);
    t.refresh_live(now);
    assert_eq!(t.live_of(1).returning_milli, 828);

    // Control: before the table has learned any gaps, every live session
    // counts whole.
    let fresh = table();
    for sid in [1, 2] {
        fresh.place(sid, &peers, T0);
        fresh.turn_ended(sid, Some(4_000), T0);
    }
    fresh.refresh_live(T0 + 5 * SECOND);
    assert_eq!(fresh.live_of(1), Bound::whole(2, 8_000));
}

#[test]
fn a_new_session_goes_where_the_bound_sessions_are_likely_gone() {
    let start = T0 + 100 * SECOND;
    let only = |id| [blind(id, 0)];
    let view = |t: &SessionTable| {
        t.refresh_live(start + 1_500);
        [1, 2].map(|id| PeerLoad {
            bound: t.live_of(id),
            ..blind(id, 0)
        })
    };
    // Peer 1: five sessions answered 1.5 s ago (longer than any gap seen);
    // peer 2: three answered just now.
    let t = table_thinking_one_second(4);
    for (sid, peer, answered) in [(1, 1, start), (11, 2, start + 1_500)] {
        let count = if peer == 1 { 5 } else { 3 };
        for sid in sid..sid + count {
            t.place(sid, &only(peer), answered);
            t.turn_ended(sid, Some(4_000), answered);
        }
    }
    let peers = view(&t);
    assert_eq!((peers[0].bound.sessions, peers[1].bound.sessions), (5, 3));
    assert_eq!(
        t.place(50, &peers, start + 1_500),
        at(1, PlacementKind::New, None)
    );
    // Control: with peer 1's sessions answered as recently as peer 2's,
    // the peer with fewer sessions gets the newcomer.
    let t = table_thinking_one_second(4);
    for (sid, peer) in [(1, 1), (11, 2)] {
        let count = if peer == 1 { 5 } else { 3 };
        for sid in sid..sid + count {
            t.place(sid, &only(peer), start + 1_500);
            t.turn_ended(sid, Some(4_000), start + 1_500);
        }
    }
    assert_eq!(
        t.place(50, &view(&t), start + 1_500),
        at(2, PlacementKind::New, None)
    );
}

#[test]
fn sessions_likely_gone_leave_room_in_the_kv_a_newcomer_may_take() {
    let start = T0 + 100 * SECOND;
    let engine = || with_capacity(blind(1, 0), 100_000);
    // Six sessions of 20k on an engine of 100k (admission line 90k).
    let filled = |answered: u64| {
        let t = table_thinking_one_second(4);
        for sid in 1..=6 {
            t.place(sid, &[engine()], answered);
            t.turn_ended(sid, Some(20_000), answered);
        }
        t.refresh_live(start + 1_500);
        let peer = PeerLoad {
            bound: t.live_of(1),
            ..engine()
        };
        (t, peer)
    };
    // Answered 1.5 s ago, longer than any gap the clients leave: likely
    // ended, and the engine's LRU will evict them first. They still count
    // as live (their prefixes are there), but the newcomer fits.
    let (t, peer) = filled(start);
    assert_eq!(peer.bound.sessions, 6);
    assert_eq!(peer.bound.returning_tokens, 0);
    assert_eq!(
        t.place_session(50, incoming(12_000, true), &[peer], start + 1_500),
        admitted(1, PlacementKind::New)
    );
    // Control: answered just now, each comes back with chance
    // 300 / (300 + 106) (the six answers are not yet followed by a turn),
    // 88.6k of returning context: the newcomer waits for room.
    let (t, peer) = filled(start + 1_500);
    assert_eq!(peer.bound.returning_tokens, 6 * 14_760);
    assert_eq!(
        t.place_session(50, incoming(12_000, true), &[peer], start + 1_500),
        Admission::NoKvRoom
    );
}

fn with_capacity(peer: PeerLoad, tokens: u64) -> PeerLoad {
    PeerLoad {
        kv_capacity_tokens: Some(tokens),
        ..peer
    }
}

fn incoming(tokens: u64, may_wait: bool) -> Incoming {
    Incoming {
        tokens,
        may_wait,
        ..Incoming::default()
    }
}

#[test]
fn a_new_session_avoids_the_engine_holding_more_even_when_in_flight_favours_it() {
    let t = table();
    // Peer 1 is idle in flight but holds live sessions between their turns;
    // peer 2 has a request in flight and holds nothing.
    let peers = [holding(blind(1, 0), 6, 180_000), holding(blind(2, 1), 0, 0)];
    assert_eq!(
        t.place_session(10, incoming(1_000, false), &peers, T0),
        Admission::Placed(Placement {
            peer: 2,
            kind: PlacementKind::New,
            reason: None
        })
    );
    // More sessions of the same total weighs too.
    let peers = [
        holding(blind(1, 0), 8, 50_000),
        holding(blind(2, 0), 4, 50_000),
    ];
    assert_eq!(t.place(11, &peers, T0), at(2, PlacementKind::New, None));
    // Control: with equal bindings, in-flight decides.
    let peers = [
        holding(blind(1, 0), 5, 100_000),
        holding(blind(2, 1), 5, 100_000),
    ];
    assert_eq!(t.place(12, &peers, T0), at(1, PlacementKind::New, None));
    let peers = [
        holding(blind(1, 3), 5, 100_000),
        holding(blind(2, 1), 5, 100_000),
    ];
    assert_eq!(t.place(13, &peers, T0), at(2, PlacementKind::New, None));
}

#[test]
fn a_new_session_avoids_an_engine_that_is_slower_by_what_it_does() {
    let t = table();
    // Peer 1 holds one session fewer, but its first tokens have been
    // coming 2.5x slower per prompt token than peer 2's (a throttled or
    // smaller card): the newcomer's prefill there costs 1 s against 0.4 s.
    let timed = |peer: PeerLoad, prefill_us: f32| PeerLoad {
        speed: EngineSpeed {
            prefill_us: Some(prefill_us),
            ..EngineSpeed::default()
        },
        ..peer
    };
    let slow = timed(holding(blind(1, 4), 4, 40_000), 125.0);
    let idle = timed(holding(blind(2, 0), 5, 50_000), 50.0);
    assert_eq!(
        t.place_session(90, incoming(8_000, false), &[slow, idle], T0),
        Admission::Placed(Placement {
            peer: 2,
            kind: PlacementKind::New,
            reason: None
        })
    );
    // Control: alike in speed, the engine holding less takes it.
    let quiet = timed(holding(blind(1, 0), 4, 40_000), 50.0);
    assert_eq!(
        t.place_session(91, incoming(8_000, false), &[quiet, idle], T0),
        Admission::Placed(Placement {
            peer: 1,
            kind: PlacementKind::New,
            reason: None
        })
    );
}

#[test]
fn a_new_session_avoids_the_engine_carrying_more_requests_for_its_sessions() {
    let t = table();
    // Peer 1 has one session fewer but keeps every one of its turns in
    // flight (a slow engine); peer 2's sessions are between turns.
    let slow = holding(blind(1, 4), 4, 40_000);
    let idle = holding(blind(2, 0), 5, 50_000);
    assert_eq!(
        t.place(90, &[slow, idle], T0),
        at(2, PlacementKind::New, None)
    );
    // Control: with nothing in flight, the fewer sessions win.
    let quiet = holding(blind(1, 0), 4, 40_000);
    assert_eq!(
        t.place(91, &[quiet, idle], T0),
        at(1, PlacementKind::New, None)
    );
}

#[test]
fn an_engine_whose_working_set_would_pass_its_kv_gets_no_new_session_while_another_has_room() {
    let t = table();
    // 90 % of 200k is the admission line. Peer 1 holds fewer sessions and
    // nothing in flight, but already 175k (183k with the newcomer).
    let full = with_capacity(holding(blind(1, 0), 2, 175_000), 200_000);
    let roomy = with_capacity(holding(blind(2, 5), 3, 20_000), 200_000);
    assert_eq!(
        t.place_session(20, incoming(8_000, false), &[full, roomy], T0),
        Admission::Placed(Placement {
            peer: 2,
            kind: PlacementKind::New,
            reason: None
        })
    );
    // Control: with room for the newcomer it is the better home again.
    let fits = with_capacity(holding(blind(1, 0), 3, 60_000), 100_000);
    let busier = with_capacity(holding(blind(2, 5), 9, 70_000), 100_000);
    assert_eq!(
        t.place_session(21, incoming(8_000, false), &[fits, busier], T0),
        Admission::Placed(Placement {
            peer: 1,
            kind: PlacementKind::New,
            reason: None
        })
    );
}

/// A table whose live sessions (on a peer outside the test's pool) hold
/// `tokens` each: their median is what a young session is expected to
/// grow to.
fn table_with_live_sessions_of(tokens: u64) -> SessionTable {
    let t = table();
    let elsewhere = [blind(9, 0)];
    for sid in 1_000..1_031u64 {
        t.place(sid, &elsewhere, T0);
        t.turn_ended(sid, Some(tokens), T0);
    }
    t.refresh_live(T0);
    t
}

#[test]
fn young_sessions_count_at_the_routes_median_size() {
    // The route's live sessions hold 10k each. Peers 1 and 2 each hold 10
    // young ones (20k in all today), so with the newcomer they will soon
    // hold 110k: past 90 % of their 100k. Peer 3 is full already.
    let t = table_with_live_sessions_of(10_000);
    let young = |id| with_capacity(holding(blind(id, 0), 10, 20_000), 100_000);
    let full = with_capacity(holding(blind(3, 0), 2, 180_000), 200_000);
    assert_eq!(
        t.place_session(70, incoming(3_000, true), &[young(1), young(2), full], T0),
        Admission::NoKvRoom
    );
    // Control: where live sessions hold 2k, the same young peers have room.
    let t = table_with_live_sessions_of(2_000);
    assert!(matches!(
        t.place_session(70, incoming(3_000, true), &[young(1), young(2), full], T0),
        Admission::Placed(Placement {
            kind: PlacementKind::New,
            ..
        })
    ));
}

#[test]
fn a_new_session_that_fits_nowhere_waits_when_it_may_and_is_placed_when_it_may_not() {
    let t = table();
    let peers = [
        with_capacity(holding(blind(1, 0), 4, 95_000), 100_000),
        with_capacity(holding(blind(2, 0), 4, 92_000), 100_000),
    ];
    assert_eq!(
        t.place_session(30, incoming(5_000, true), &peers, T0),
        Admission::NoKvRoom
    );
    assert!(t.is_empty(), "a waiting session is not bound");
    // Control: without a queue it goes to the engine holding the least.
    assert_eq!(
        t.place_session(30, incoming(5_000, false), &peers, T0),
        Admission::Placed(Placement {
            peer: 2,
            kind: PlacementKind::New,
            reason: None
        })
    );
    // Unknown capacity always fits.
    let unknown = [holding(blind(1, 0), 40, 9_000_000)];
    assert!(matches!(
        t.place_session(31, incoming(5_000, true), &unknown, T0),
        Admission::Placed(_)
    ));
}

#[test]
fn a_warm_turn_on_an_engine_over_its_kv_moves_where_it_fits() {
    let t = table();
    bind(&t, 50, 1, &[1, 2], T0);
    // Peer 1's live sessions hold 120k against a KV of 100k: it is evicting.
    let over = with_capacity(holding(blind(1, 0), 6, 120_000), 100_000);
    let roomy = with_capacity(holding(blind(2, 5), 3, 40_000), 100_000);
    assert_eq!(
        t.place_session(50, incoming(20_000, false), &[over, roomy], T0 + SECOND),
        Admission::Placed(Placement {
            peer: 2,
            kind: PlacementKind::Spill,
            reason: Some(Reason::KvOvercommit)
        })
    );
    // Control: the same engine inside its KV keeps the session, even with
    // the other idler.
    let t = table();
    bind(&t, 51, 1, &[1, 2], T0);
    let inside = with_capacity(holding(blind(1, 0), 6, 95_000), 100_000);
    assert_eq!(
        t.place_session(51, incoming(20_000, false), &[inside, roomy], T0 + SECOND),
        Admission::Placed(Placement {
            peer: 1,
            kind: PlacementKind::Sticky,
            reason: None
        })
    );
    // Nor does it move within the cooldown of an earlier move.
    let t = table();
    bind(&t, 52, 1, &[1, 2], T0);
    let moved = t.place_session(52, incoming(20_000, false), &[over, roomy], T0 + SECOND);
    assert!(matches!(moved, Admission::Placed(p) if p.peer == 2));
    let over_2 = with_capacity(holding(blind(2, 0), 6, 120_000), 100_000);
    let roomy_1 = with_capacity(holding(blind(1, 5), 3, 40_000), 100_000);
    assert_eq!(
        t.place_session(
            52,
            incoming(20_000, false),
            &[roomy_1, over_2],
            T0 + 2 * SECOND
        ),
        Admission::Placed(Placement {
            peer: 2,
            kind: PlacementKind::Sticky,
            reason: None
        })
    );
}

#[test]
fn a_session_longer_than_its_engines_excess_stays_where_most_of_it_is_cached() {
    // Peer 1 is over its KV by 20k: the engine evicts at most that much of
    // a session, tail first, so a 30k session keeps 10k+ cached at home and
    // a move would re-prefill all 30k.
    let t = table();
    bind(&t, 53, 1, &[1, 2], T0);
    t.turn_ended(53, Some(30_000), T0);
    let over = with_capacity(holding(blind(1, 0), 6, 120_000), 100_000);
    let roomy = with_capacity(holding(blind(2, 5), 3, 40_000), 200_000);
    assert_eq!(
        t.place_session(53, incoming(30_000, true), &[over, roomy], T0 + SECOND),
        admitted(1, PlacementKind::Sticky),
        "neither moved nor let go to wait"
    );
    // Control: a session no longer than the excess, which the engine
    // evicts whole, moves where it fits.
    bind(&t, 54, 1, &[1, 2], T0);
    t.turn_ended(54, Some(20_000), T0);
    assert_eq!(
        t.place_session(54, incoming(20_000, true), &[over, roomy], T0 + SECOND),
        Admission::Placed(Placement {
            peer: 2,
            kind: PlacementKind::Spill,
            reason: Some(Reason::KvOvercommit)
        })
    );
}

/// Peer 1 holds 120k against a KV of 100k; peer 2 has no room either.
fn over_full_with_no_room_elsewhere() -> [PeerLoad; 2] {
    [
        with_capacity(holding(blind(1, 0), 6, 120_000), 100_000),
        with_capacity(holding(blind(2, 0), 6, 95_000), 100_000),
    ]
}

#[test]
fn a_warm_turn_over_kv_with_no_room_anywhere_lets_go_and_waits_only_with_a_queue() {
    let t = table();
    bind(&t, 60, 1, &[1, 2], T0);
    t.turn_ended(60, Some(20_000), T0);
    let peers = over_full_with_no_room_elsewhere();
    // Without a queue moving gains nothing: it stays.
    assert_eq!(
        t.place_session(60, incoming(20_000, false), &peers, T0 + SECOND),
        admitted(1, PlacementKind::Sticky)
    );
    let before = t.live_of(1);
    // With one it lets go of its binding, and its tokens stop counting.
    assert_eq!(
        t.place_session(60, incoming(20_000, true), &peers, T0 + 2 * SECOND),
        Admission::NoKvRoom
    );
    assert!(!t.is_bound(60, T0 + 2 * SECOND));
    let after = t.live_of(1);
    assert_eq!(after.sessions + 1, before.sessions);
    assert_eq!(after.tokens + 20_000, before.tokens);
    // Once room frees it is placed as a new session where it fits.
    let roomy = [
        with_capacity(holding(blind(1, 0), 5, 100_000), 100_000),
        with_capacity(holding(blind(2, 0), 2, 50_000), 100_000),
    ];
    assert_eq!(
        t.place_session(60, incoming(20_000, true), &roomy, T0 + 3 * SECOND),
        admitted(2, PlacementKind::New)
    );
}

#[test]
fn a_session_holding_half_its_engines_kv_stays_rather_than_wait_unbound() {
    let t = table();
    bind(&t, 61, 1, &[1, 2], T0);
    t.turn_ended(61, Some(50_000), T0);
    let peers = over_full_with_no_room_elsewhere();
    assert_eq!(
        t.place_session(61, incoming(50_000, true), &peers, T0 + SECOND),
        admitted(1, PlacementKind::Sticky)
    );
    assert!(t.is_bound(61, T0 + SECOND));
    // Control: just under half, it lets go and waits.
    bind(&t, 62, 1, &[1, 2], T0);
    t.turn_ended(62, Some(49_999), T0);
    assert_eq!(
        t.place_session(62, incoming(49_999, true), &peers, T0 + SECOND),
        Admission::NoKvRoom
    );
}

#[test]
fn a_known_session_is_never_left_waiting_for_kv_room() {
    let t = table();
    bind(&t, 40, 1, &[1, 2], T0);
    let full = [
        with_capacity(holding(not_ready(blind(1, 0)), 4, 99_000), 100_000),
        with_capacity(holding(blind(2, 0), 4, 99_000), 100_000),
    ];
    assert_eq!(
        t.place_session(40, incoming(5_000, true), &full, T0 + SECOND)
            .clone(),
        Admission::Placed(Placement {
            peer: 2,
            kind: PlacementKind::Migrated,
            reason: Some(Reason::NotReady)
        })
    );
}

#[test]
fn live_sessions_and_tokens_follow_placements_turns_and_the_live_window() {
    let t = SessionTable::new(TableConfig {
        live_window_ms: 10 * SECOND,
        ..TableConfig::default()
    });
    let peers = [blind(1, 0), blind(2, 0)];
    let Admission::Placed(first) = t.place_session(50, incoming(1_000, false), &peers, T0) else {
        panic!("placed")
    };
    let live = |t: &SessionTable| t.live_per_peer();
    assert_eq!(live(&t), vec![(first.peer, Bound::whole(1, 1_000))]);
    // The engine's usage after the turn replaces the estimate.
    t.turn_ended(50, Some(3_500), T0 + SECOND);
    assert_eq!(live(&t), vec![(first.peer, Bound::whole(1, 3_500))]);
    // Still live within the window, not after it.
    t.refresh_live(T0 + 10 * SECOND);
    assert_eq!(live(&t)[0].1.sessions, 1);
    t.refresh_live(T0 + 12 * SECOND);
    assert_eq!(live(&t), vec![(first.peer, Bound::default())]);
    // Its next turn makes it live again, with what it held.
    assert_eq!(t.place(50, &peers, T0 + 13 * SECOND), sticky(first.peer));
    assert_eq!(live(&t), vec![(first.peer, Bound::whole(1, 3_500))]);
    // A move carries its weight to the new peer.
    let down = [not_ready(blind(first.peer, 0)), blind(3 - first.peer, 0)];
    assert_eq!(
        t.place(50, &down, T0 + 14 * SECOND).map(|p| p.kind),
        Some(PlacementKind::Migrated)
    );
    let moved = live(&t);
    assert!(moved.contains(&(first.peer, Bound::default())), "{moved:?}");
    assert!(
        moved.contains(&(3 - first.peer, Bound::whole(1, 3_500))),
        "{moved:?}"
    );
}

#[test]
fn kv_in_use_that_the_engine_reports_counts_against_admission_too() {
    let t = table();
    // Nothing bound through this gateway, but the engine says 95% is in use
    // (another gateway's traffic): no room for a new session there.
    let busy_elsewhere = with_capacity(fresh(1, 0, 0), 100_000);
    let busy_elsewhere = PeerLoad {
        engine: busy_elsewhere.engine.map(|e| EngineLoad {
            kv_usage: 0.95,
            ..e
        }),
        ..busy_elsewhere
    };
    let roomy = with_capacity(holding(fresh(2, 3, 0), 2, 20_000), 100_000);
    assert_eq!(
        t.place_session(60, incoming(5_000, false), &[busy_elsewhere, roomy], T0),
        Admission::Placed(Placement {
            peer: 2,
            kind: PlacementKind::New,
            reason: None
        })
    );
    // Control: at half use it has room and, holding nothing, is the better home.
    let half = with_capacity(fresh(1, 0, 0), 100_000);
    assert_eq!(
        t.place_session(61, incoming(5_000, false), &[half, roomy], T0),
        Admission::Placed(Placement {
            peer: 1,
            kind: PlacementKind::New,
            reason: None
        })
    );
}

#[test]
fn the_live_window_follows_the_clients_think_time_and_a_turn_in_flight_stays_live() {
    let t = SessionTable::new(TableConfig {
        live_window_ms: 10 * SECOND,
        ..TableConfig::default()
    });
    let peers = [blind(1, 0)];
    // 300 sessions each think 1 s between an answer and their next turn.
    for sid in 0..300u64 {
        t.place(sid, &peers, T0);
        t.turn_ended(sid, Some(1_000), T0);
        t.place(sid, &peers, T0 + SECOND);
        t.turn_ended(sid, Some(1_000), T0 + SECOND);
    }
    t.refresh_live(T0 + SECOND);
    assert_eq!(t.live_window_ms(), 2 * SECOND, "twice the 90th percentile");
    let start = T0 + 100 * SECOND;
    let live_at = |now: u64| {
        t.refresh_live(now);
        t.live_of(1).sessions
    };
    // 1000 is answered at once; 1001's turn is still running.
    t.place(1_000, &peers, start);
    t.turn_ended(1_000, Some(5_000), start);
    t.place(1_001, &peers, start - 2 * SECOND);
    t.turn_ended(1_001, Some(5_000), start - 2 * SECOND);
    t.place(1_001, &peers, start);
    assert_eq!(live_at(start + 1_500), 2);
    assert_eq!(live_at(start + 2_500), 1, "answered 2.5 s ago: gone");
    assert_eq!(
        live_at(start + 15 * SECOND),
        1,
        "a turn in flight holds its KV past the configured window too"
    );
    t.turn_ended(1_001, Some(6_000), start + 15 * SECOND);
    assert_eq!(live_at(start + 18 * SECOND), 0);

    // Control: before enough gaps are seen, the configured window holds.
    let fresh = SessionTable::new(TableConfig {
        live_window_ms: 10 * SECOND,
        ..TableConfig::default()
    });
    fresh.place(7, &peers, T0);
    fresh.turn_ended(7, Some(5_000), T0);
    assert_eq!(fresh.live_window_ms(), 10 * SECOND);
    fresh.refresh_live(T0 + 9 * SECOND);
    assert_eq!(fresh.live_of(1).sessions, 1);
    fresh.refresh_live(T0 + 11 * SECOND);
    assert_eq!(fresh.live_of(1).sessions, 0);
}

/// The sessions that ended (left the live window after an answer) teach
/// the route's typical size; a young session then counts on its engine at
/// that size, not at today's.
#[test]
fn young_sessions_count_at_the_size_the_routes_sessions_end_at() {
    let t = SessionTable::new(TableConfig {
        live_window_ms: 10 * SECOND,
        ..TableConfig::default()
    });
    let peers = [blind(1, 0)];
    // Four sessions end at 50k-62k: answered, then gone for good.
    for (sid, tokens) in [(1, 50_000), (2, 56_000), (3, 62_000), (4, 56_000)] {
        t.place_session(sid, incoming(1_000, false), &peers, T0);
        t.turn_ended(sid, Some(tokens), T0 + SECOND);
    }
    t.refresh_live(T0 + 5 * SECOND);
    assert_eq!(t.typical_session(), 0, "still live: nothing ended yet");
    t.refresh_live(T0 + 12 * SECOND);
    assert_eq!(t.typical_session(), 56_000);
    // A new session of 4k counts as the 56k it will hold.
    t.place_session(9, incoming(1_000, false), &peers, T0 + 13 * SECOND);
    t.turn_ended(9, Some(4_000), T0 + 14 * SECOND);
    t.refresh_live(T0 + 15 * SECOND);
    let bound = t.live_of(1);
    assert_eq!((bound.sessions, bound.tokens), (1, 4_000));
    assert_eq!(bound.projected_tokens, 56_000);
    // Control: one already past the typical size counts as itself.
    t.turn_ended(9, Some(70_000), T0 + 16 * SECOND);
    assert_eq!(t.live_of(1).projected_tokens, 70_000);
}

/// An engine the model can weigh: its speeds learned, the queue it
/// reports, `waiting` requests drained at 10 a second.
fn weighed(id: PeerId, running: u32, waiting: u32) -> PeerLoad {
    PeerLoad {
        speed: EngineSpeed {
            prefill_us: Some(50.0),
            completions_per_s: Some(10.0),
            ..EngineSpeed::default()
        },
        ..fresh(id, running, waiting)
    }
}

/// A fork bound next to its parent holds nothing of its own there yet,
/// but the parent's history it starts with is cached there: the model
/// counts that, and the fork stays where a plain newcomer with the same
/// queue ahead would go elsewhere.
#[test]
fn a_fork_next_to_its_parent_stays_for_the_history_they_share() {
    let t = table();
    let parent_engine = weighed(1, 30, 6); // 600 ms of queue
    let idle = weighed(2, 10, 0);
    let peers = [parent_engine, idle];
    t.adopt(70, 1, None, T0);
    let fork = Incoming {
        prefix: Some(Prefix::new(20_000, [1])),
        ..incoming(21_000, false)
    };
    assert_eq!(
        t.place_session(70, fork, &peers, T0 + SECOND),
        Admission::Placed(Placement {
            peer: 1,
            kind: PlacementKind::Sticky,
            reason: None
        })
    );
    // Control: the same bound session with nothing of it cached anywhere
    // moves off the queue.
    t.adopt(71, 1, None, T0);
    assert_eq!(
        t.place_session(71, incoming(21_000, false), &peers, T0 + SECOND),
        Admission::Placed(Placement {
            peer: 2,
            kind: PlacementKind::Spill,
            reason: Some(Reason::Waiting)
        })
    );
}

/// KV admission prefers the engines with room, but not at any price: an
/// engine that keeps room because it is slow and deep in cold prompts
/// (issue 42's shared-prefix f3: its sessions had left it) loses a new
/// session to one past its line that starts it seconds sooner, what it
/// evicts there counted in.
#[test]
fn a_new_session_skips_the_engine_with_room_when_it_is_slower_by_more_than_a_cold_prefill() {
    let t = table();
    let speed = |prefill_us: f32| EngineSpeed {
        prefill_us: Some(prefill_us),
        ..EngineSpeed::default()
    };
    // Peer 1 has KV room; it prefills at 200 µs a token with 40k tokens of
    // cold prompts ahead (4 s). Peer 2 is at its line but prefills the
    // 8k newcomer in 0.4 s.
    let roomy = |prefill_us, backlog_tokens| PeerLoad {
        speed: speed(prefill_us),
        backlog_tokens,
        ..with_capacity(holding(blind(1, 0), 1, 10_000), 200_000)
    };
    let full = PeerLoad {
        speed: speed(50.0),
        ..with_capacity(holding(blind(2, 0), 9, 90_000), 100_000)
    };
    let room = KvRoom {
        admit_permille: TableConfig::default().kv_admit_permille,
        expected_session: 0,
    };
    assert!(!full.fits(8_000, room) && roomy(60.0, 0).fits(8_000, room));
    let peers = [roomy(200.0, 40_000), full];
    assert_eq!(
        t.place_session(20, incoming(8_000, false), &peers, T0),
        admitted(2, PlacementKind::New)
    );
    // Control: an engine with room that is only somewhat slower (60 µs a
    // token, nothing ahead) keeps the newcomer, as admission says.
    let peers = [roomy(60.0, 0), full];
    assert_eq!(
        t.place_session(21, incoming(8_000, false), &peers, T0),
        admitted(1, PlacementKind::New)
    );
}
