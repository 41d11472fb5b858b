//! Storage, expiry and concurrency of the session table.

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
