//! The model's parts, one behaviour a test, each with a control that
//! shows the same setup deciding the other way when the one fact differs.

use super::*;
use crate::placement::{Bound, EngineLoad, EngineSpeed};

fn engine(id: PeerId) -> PeerLoad {
    PeerLoad::idle(id, 64)
}

fn timed(peer: PeerLoad, prefill_us: f32) -> PeerLoad {
    PeerLoad {
        speed: EngineSpeed {
            prefill_us: Some(prefill_us),
            completions_per_s: Some(10.0),
            ..peer.speed
        },
        ..peer
    }
}

/// `sessions` live sessions holding `today` tokens in all, expected to
/// grow to `projected`.
fn holding(peer: PeerLoad, sessions: u32, today: u64, projected: u64) -> PeerLoad {
    PeerLoad {
        bound: Bound {
            projected_tokens: projected,
            ..Bound::whole(sessions, today)
        },
        ..peer
    }
}

fn with_kv(peer: PeerLoad, tokens: u64) -> PeerLoad {
    PeerLoad {
        kv_capacity_tokens: Some(tokens),
        ..peer
    }
}

fn route(typical_session: u64) -> RouteModel {
    RouteModel {
        prefill_us: Some(50.0),
        tpot_us: None,
        completions_per_s: None,
        typical_session,
        admit_permille: 900,
    }
}

fn new_session(tokens: u64) -> Ask {
    Ask {
        tokens,
        ..Ask::default()
    }
}

fn chosen(peers: &[PeerLoad], ask: &Ask, route: &RouteModel) -> Option<PeerId> {
    choose(peers, ask, route, 0, |p| p.ready).map(|(p, _)| p.id)
}

#[test]
fn a_young_session_is_placed_by_what_its_engine_will_hold() {
    // Engine 1's six sessions restarted a moment ago: 4k each today, but
    // this route's sessions end at 58k. Engine 2 holds five older ones,
    // 50k each. By today's sizes engine 1 is nearly empty; by what the
    // sessions will hold, it carries one more.
    let young = holding(engine(1), 6, 24_000, 6 * 58_000);
    let older = holding(engine(2), 5, 250_000, 5 * 58_000);
    let peers = [timed(young, 50.0), timed(older, 50.0)];
    assert_eq!(chosen(&peers, &new_session(4_000), &route(58_000)), Some(2));
    // Control: sessions that stay as small as they are (the projection is
    // today's size) make engine 1 the lighter one.
    let young = holding(engine(1), 6, 24_000, 24_000);
    let older = holding(engine(2), 5, 250_000, 250_000);
    let peers = [timed(young, 50.0), timed(older, 50.0)];
    assert_eq!(chosen(&peers, &new_session(4_000), &route(4_000)), Some(1));
}

#[test]
fn what_a_binding_would_evict_outweighs_a_faster_prefill() {
    // Engine 1 prefills a little faster (a 16k prompt: 640 ms against 800
    // ms) but has 200k of KV, and its four sessions will hold 232k: with
    // one more, 110k past the 180k line, 22k of every turn there evicted
    // (880 ms). Engine 2's 600k of KV has room for its five and one more.
    let small = with_kv(holding(engine(1), 4, 100_000, 4 * 58_000), 200_000);
    let large = with_kv(holding(engine(2), 5, 150_000, 5 * 58_000), 600_000);
    let peers = [timed(small, 40.0), timed(large, 50.0)];
    let ask = new_session(16_000);
    let (_, e1) = choose(&peers, &ask, &route(58_000), 0, |p| p.id == 1).expect("engine 1");
    assert_eq!(e1.evicts_tokens, 22_000);
    assert_eq!(chosen(&peers, &ask, &route(58_000)), Some(2));
    // Control: with capacity unknown nothing is evicted anywhere; the
    // prefills are near-equal and engine 1 holds less.
    let blind = |p: PeerLoad| PeerLoad {
        kv_capacity_tokens: None,
        ..p
    };
    let peers = [blind(peers[0]), blind(peers[1])];
    let (_, e1) = choose(&peers, &ask, &route(58_000), 0, |p| p.id == 1).expect("engine 1");
    assert_eq!(e1.evicts_tokens, 0);
    assert_eq!(chosen(&peers, &ask, &route(58_000)), Some(1));
}

#[test]
fn between_engines_caching_alike_a_backlog_passes_and_what_they_hold_decides() {
    // Two cold engines: engine 2 holds a session less but has 24k tokens
    // of cold prompts still prefilling (600 ms): they will be done in a
    // moment, the extra session on engine 1 stays for its life.
    let more = timed(holding(engine(1), 6, 48_000, 48_000), 50.0);
    let busy = PeerLoad {
        backlog_tokens: 24_000,
        ..timed(holding(engine(2), 5, 40_000, 40_000), 50.0)
    };
    assert_eq!(
        chosen(&[more, busy], &new_session(8_000), &route(0)),
        Some(2)
    );
    // Control: when engine 1 caches the request's prefix, the same backlog
    // is a wait against a saving, and the saving wins.
    let ask = Ask {
        prefix: Some(Prefix::new(7_000, [1])),
        ..new_session(8_000)
    };
    assert_eq!(chosen(&[more, busy], &ask, &route(0)), Some(1));
}

#[test]
fn where_kv_is_ample_a_backlog_is_a_wait_and_not_set_aside_for_balance() {
    // The engines of the test above with 400k of KV each: the fuller would
    // hold 143 permille with the session, far under half its 900 line.
    // Balancing what they hold evicts nothing for a long while, so engine
    // 2's 600 ms of cold prompts ahead is a wait like any other, and
    // engine 1 starts the session sooner.
    let more = with_kv(timed(holding(engine(1), 6, 48_000, 48_000), 50.0), 400_000);
    let busy = PeerLoad {
        backlog_tokens: 24_000,
        ..with_kv(timed(holding(engine(2), 5, 40_000, 40_000), 50.0), 400_000)
    };
    assert_eq!(
        chosen(&[more, busy], &new_session(8_000), &route(0)),
        Some(1)
    );
    // Control: with 100k of KV each engine 1 would hold 571 permille, past
    // half its line; the backlog passes and the lighter engine 2 takes it.
    let more = with_kv(more, 100_000);
    let busy = with_kv(busy, 100_000);
    assert_eq!(
        chosen(&[more, busy], &new_session(8_000), &route(0)),
        Some(2)
    );
}

#[test]
fn with_capacity_unknown_engines_are_balanced_by_what_they_hold() {
    let peers = [
        timed(holding(engine(1), 7, 200_000, 7 * 40_000), 50.0),
        timed(holding(engine(2), 6, 210_000, 6 * 40_000), 50.0),
        timed(holding(engine(3), 8, 150_000, 8 * 40_000), 50.0),
    ];
    assert_eq!(chosen(&peers, &new_session(3_000), &route(40_000)), Some(2));
    // Control: a queue at engine 2 longer than the tolerance sends the
    // session to the next lightest.
    let queued = PeerLoad {
        engine: Some(EngineLoad {
            waiting: 20,
            running: 40,
            kv_usage: 0.5,
        }),
        ..peers[1]
    };
    let peers = [peers[0], queued, peers[2]];
    assert_eq!(chosen(&peers, &new_session(3_000), &route(40_000)), Some(1));
}

#[test]
fn a_templates_newcomer_goes_where_the_template_is_until_its_queue_outweighs_the_saving() {
    // An 8k-token prefix was sent to engine 1 a moment ago; the newcomer
    // adds 500 tokens. Cold elsewhere it costs 425 ms; on engine 1, 25 ms.
    let prefix = Prefix::new(8_000, [1]);
    let ask = Ask {
        tokens: 8_500,
        prefix: Some(prefix),
        ..Ask::default()
    };
    let holder = timed(engine(1), 50.0);
    let other = timed(engine(2), 50.0);
    let (_, e) = choose(&[holder, other], &ask, &route(9_000), 0, |p| p.id == 1).expect("1");
    assert_eq!((e.cached_tokens, e.uncached_tokens), (8_000, 500));
    assert_eq!(chosen(&[holder, other], &ask, &route(9_000)), Some(1));
    // The template is hot: newcomers pile up there, 16k tokens of them
    // still prefilling (400 ms), and four queue at 10 completions a
    // second (400 ms): engine 2, cold, is now the quicker start, and the
    // prefix goes there too.
    let piled = PeerLoad {
        backlog_tokens: 16_000,
        engine: Some(EngineLoad {
            waiting: 4,
            running: 60,
            kv_usage: 0.5,
        }),
        ..holder
    };
    assert_eq!(chosen(&[piled, other], &ask, &route(9_000)), Some(2));
    // Control: the same pile-up without the prefix anywhere is no reason
    // to prefer engine 1, and with it on both, engine 2 is simply quicker.
    let cold = Ask {
        prefix: None,
        ..ask
    };
    assert_eq!(chosen(&[holder, other], &cold, &route(9_000)), Some(2));
    let both = Ask {
        prefix: Some(Prefix::new(8_000, [1, 2])),
        ..ask
    };
    assert_eq!(chosen(&[piled, other], &both, &route(9_000)), Some(2));
}

#[test]
fn a_slow_engine_is_known_by_its_answers_and_until_then_by_its_decode() {
    let fast = holding(engine(1), 5, 100_000, 100_000);
    let slow = holding(engine(2), 4, 80_000, 80_000);
    let ask = new_session(8_000);
    // Timed: the slow engine's prefill is 2.5x, 1 s against 0.4 s.
    let peers = [timed(fast, 50.0), timed(slow, 125.0)];
    assert_eq!(chosen(&peers, &ask, &route(20_000)), Some(1));
    // Not timed yet, but decoding 2.5x slower than the route's median:
    // taken to prefill as much slower.
    let decoding = |p: PeerLoad, tpot: f32| PeerLoad {
        speed: EngineSpeed {
            tpot_us: Some(tpot),
            ..EngineSpeed::default()
        },
        ..p
    };
    let route_tpot = RouteModel {
        tpot_us: Some(20_000.0),
        ..route(20_000)
    };
    let peers = [decoding(fast, 20_000.0), decoding(slow, 50_000.0)];
    let (_, e) = choose(&peers, &ask, &route_tpot, 0, |p| p.id == 2).expect("2");
    assert!(!e.timed);
    assert_eq!(e.prefill_us, 125.0);
    assert_eq!(chosen(&peers, &ask, &route_tpot), Some(1));
    // Control: alike in speed, the engine holding less takes it.
    let peers = [timed(fast, 50.0), timed(slow, 50.0)];
    assert_eq!(chosen(&peers, &ask, &route(20_000)), Some(2));
}

#[test]
fn a_home_keeps_what_its_kv_pressure_leaves_of_the_session() {
    // 300k of KV, six live sessions holding 320k between turns: 20k
    // evicted, tails first, each returning turn finding its share gone.
    let home = with_kv(holding(engine(1), 6, 320_000, 320_000), 300_000);
    let ask = Ask {
        tokens: 52_000,
        home: Some(1),
        held: 50_000,
        prefix: None,
    };
    let e = estimate(&timed(home, 50.0), &ask, &route(50_000));
    assert_eq!((e.cached_tokens, e.uncached_tokens), (46_667, 5_333));
    // Control: within its KV the home holds all of it.
    let roomy = with_kv(holding(engine(1), 6, 280_000, 280_000), 300_000);
    let e = estimate(&timed(roomy, 50.0), &ask, &route(50_000));
    assert_eq!((e.cached_tokens, e.uncached_tokens), (50_000, 2_000));
    // Its six sessions hold 280k now: 10k past the 270k line, 1,666 of
    // each turn, which staying costs it beyond what is gone already (what
    // they will hold once grown is not priced at home: see
    // a_young_session_leaves_an_engine_past_its_kv_and_stays_on_one_only_projected_past_it).
    assert_eq!(e.evicts_tokens, 1_666);
}

/// A session 10k into a route whose sessions end at 58k, adding 2k a
/// turn: 16 turns left at most (24 by its growth, capped).
fn mid_life(home: PeerId) -> Ask {
    Ask {
        tokens: 12_000,
        home: Some(home),
        held: 10_000,
        prefix: None,
    }
}

#[test]
fn a_move_is_worth_its_cold_prefill_only_over_the_turns_it_saves() {
    let route = route(58_000);
    let ask = mid_life(1);
    assert_eq!(turns_left(&ask, &route), 16.0);
    let cold = Ask { home: None, ..ask };
    // A home that prefills at 125 µs a token, another at 50: 250 ms a turn
    // against 100, every turn; a move costs 10k of cold prefill once.
    let slow = timed(engine(1), 125.0);
    let fast = timed(engine(2), 50.0);
    let life = lifetime(
        &estimate(&slow, &ask, &route),
        &estimate(&fast, &cold, &route),
        &ask,
        &route,
    );
    assert!(life.moves(), "{life:?}");
    // Control: the same once the session is near its end (one turn left).
    let old = Ask {
        tokens: 58_000,
        held: 56_000,
        ..ask
    };
    let cold_old = Ask { home: None, ..old };
    let life = lifetime(
        &estimate(&slow, &old, &route),
        &estimate(&fast, &cold_old, &route),
        &old,
        &route,
    );
    assert_eq!(life.turns, 1.0);
    assert!(!life.moves(), "{life:?}");
}

#[test]
fn a_passing_backlog_at_home_is_counted_once_not_every_turn() {
    let route = route(58_000);
    let ask = mid_life(1);
    let cold = Ask { home: None, ..ask };
    // 16k of cold prompts prefilling at home: a 400 ms wait this turn,
    // less than the 500 ms the 10k its home holds would cost cold; counted
    // every turn it would have looked like 6.4 s.
    let busy = PeerLoad {
        backlog_tokens: 16_000,
        ..timed(engine(1), 50.0)
    };
    let idle = timed(engine(2), 50.0);
    let life = lifetime(
        &estimate(&busy, &ask, &route),
        &estimate(&idle, &cold, &route),
        &ask,
        &route,
    );
    assert!(!life.moves(), "{life:?}");
    // Control: a home that reports a queue of 30 at 10 completions a second
    // (3 s this turn) is worth leaving even at the cost of 10k cold.
    let queued = PeerLoad {
        engine: Some(EngineLoad {
            waiting: 30,
            running: 40,
            kv_usage: 0.5,
        }),
        ..timed(engine(1), 50.0)
    };
    let life = lifetime(
        &estimate(&queued, &ask, &route),
        &estimate(&idle, &cold, &route),
        &ask,
        &route,
    );
    assert!(life.moves(), "{life:?}");
}

#[test]
fn sessions_that_start_together_spread_evenly_whatever_the_draw() {
    // 32 sessions arrive on four empty engines within a second, before
    // any has ended (no typical size yet); each placement adds its session
    // to what its engine will hold, as the table does, and its cold prompt
    // to the engine's backlog, which leaves it a whole prompt at a time.
    for rand in [0u64, 1, 7, 0xdead_beef, u64::MAX] {
        let mut peers: Vec<PeerLoad> = (1..=4).map(|id| timed(engine(id), 50.0)).collect();
        for n in 0..32u64 {
            let ask = new_session(8_000);
            let draw = crate::hash::mix64(rand, n);
            let (p, _) = choose(&peers, &ask, &route(0), draw, |p| p.ready).expect("a peer");
            let id = p.id;
            let p = peers.iter_mut().find(|p| p.id == id).expect("chosen peer");
            p.bound.sessions += 1;
            p.bound.returning_milli += u64::from(WHOLE);
            p.bound.projected_tokens += 8_000;
            p.backlog_tokens += 8_000;
            // Meanwhile a prompt here and there has its first token and
            // leaves its engine's backlog whole (another draw decides
            // which): one a placement on average, unevenly.
            for p in peers.iter_mut() {
                if crate::hash::mix64(draw, u64::from(p.id)).is_multiple_of(4) {
                    p.backlog_tokens = p.backlog_tokens.saturating_sub(8_000);
                }
            }
        }
        let counts: Vec<u32> = peers.iter().map(|p| p.bound.sessions).collect();
        assert_eq!(counts, vec![8, 8, 8, 8], "draw {rand}");
    }
    // Control: the draw does decide between engines that are alike in
    // every respect, so it is not always the first.
    let peers: Vec<PeerLoad> = (1..=4).map(|id| timed(engine(id), 50.0)).collect();
    let firsts: std::collections::BTreeSet<PeerId> = (0..64u64)
        .filter_map(|draw| choose(&peers, &new_session(3_000), &route(0), draw, |p| p.ready))
        .map(|(p, _)| p.id)
        .collect();
    assert_eq!(firsts.len(), 4, "{firsts:?}");
}

#[test]
fn a_queue_without_a_learned_completion_rate_is_unknown() {
    let queued = PeerLoad {
        engine: Some(EngineLoad {
            waiting: 3,
            running: 10,
            kv_usage: 0.5,
        }),
        ..engine(1)
    };
    let e = estimate(&queued, &new_session(1_000), &route(0));
    assert!(!e.queue_known);
    // Control: with the rate learned, three waiting at 10 a second is 300 ms.
    let e = estimate(&timed(queued, 50.0), &new_session(1_000), &route(0));
    assert!(e.queue_known);
    assert_eq!(e.queue_ms, 300.0);
}

#[test]
fn a_young_session_leaves_an_engine_past_its_kv_and_stays_on_one_only_projected_past_it() {
    // Nine sessions on 400k of KV holding 450k now: 90k past the 360k line,
    // each returning turn finding 10k of its context gone. Five on another
    // engine hold 150k: room.
    let crowded = timed(
        with_kv(holding(engine(1), 9, 450_000, 9 * 58_000), 400_000),
        50.0,
    );
    let roomy = timed(
        with_kv(holding(engine(2), 5, 150_000, 5 * 58_000), 400_000),
        50.0,
    );
    let at_home = |held: u64| Ask {
        tokens: held + 2_000,
        home: Some(1),
        held,
        prefix: None,
    };
    let route = route(58_000);
    let moves = |home_engine: &PeerLoad, held: u64| {
        let ask = at_home(held);
        let home = estimate(home_engine, &ask, &route);
        let cold = Ask { home: None, ..ask };
        let other = estimate(&roomy, &cold, &route);
        lifetime(&home, &other, &ask, &route).moves()
    };
    // Young (6k): 8k cold elsewhere against what its staying keeps
    // evicting there, turn after turn.
    assert!(moves(&crowded, 6_000));
    // Control: old (55k), the move's cold prefill outweighs it.
    assert!(!moves(&crowded, 55_000));
    // The same nine sessions holding 200k now: they will hold 9 x 58k only
    // if they all grow together; sessions of staggered ages hold about half
    // their end size, so nothing is priced as evicted until the engine
    // holds past its line (a move made for a projection cost a cold
    // prefill on engines with twice the room, issue 42's family f2).
    let projected_only = timed(
        with_kv(holding(engine(1), 9, 200_000, 9 * 58_000), 400_000),
        50.0,
    );
    assert!(!moves(&projected_only, 6_000));
}

#[test]
fn a_templates_newcomer_joins_its_holders_batch_while_it_has_room() {
    // f2's figures from issue 42's shared-prefix runs: 37 µs a token, six
    // completions a second, a 26 ms decode step; an 8.4k newcomer whose 8k
    // prefix is on engine 1, which carries four requests more than the
    // others. Its batch has room: the newcomer shares 26 ms steps with
    // them, and the 300 ms prefix it saves there decides.
    let speed = EngineSpeed {
        prefill_us: Some(37.0),
        tpot_us: Some(26_000.0),
        completions_per_s: Some(6.0),
        prefill_us_at_least: None,
    };
    let busy = |id, running, waiting| PeerLoad {
        in_flight: running + waiting,
        speed,
        engine: Some(EngineLoad {
            waiting,
            running,
            kv_usage: 0.5,
        }),
        ..engine(id)
    };
    let ask = Ask {
        tokens: 8_400,
        prefix: Some(Prefix::new(8_000, [1])),
        ..Ask::default()
    };
    let others = [busy(2, 12, 0), busy(3, 12, 0), busy(4, 12, 0)];
    let with_room = [busy(1, 16, 0), others[0], others[1], others[2]];
    assert_eq!(chosen(&with_room, &ask, &route(9_000)), Some(1));
    // Control: the same four requests more, but two of them waiting for a
    // slot in a full batch: each request ahead is a completion's wait
    // (167 ms), more than the prefix saves, and the newcomer starts cold
    // elsewhere.
    let full = [busy(1, 14, 2), others[0], others[1], others[2]];
    assert_ne!(chosen(&full, &ask, &route(9_000)), Some(1));
}

#[test]
fn a_backlog_passes_for_a_long_session_and_not_for_a_short_conversation() {
    // Engine 2 holds a session less but has two cold prompts still
    // prefilling (16k tokens, 400 ms). An agent session that will grow
    // to 80k (ten turns more) pays that wait once in its life: what the
    // engines hold decides, and engine 2 takes it.
    let more = timed(holding(engine(1), 6, 48_000, 48_000), 50.0);
    let busy = PeerLoad {
        backlog_tokens: 16_000,
        ..timed(holding(engine(2), 5, 40_000, 40_000), 50.0)
    };
    assert_eq!(
        chosen(&[more, busy], &new_session(8_000), &route(80_000)),
        Some(2)
    );
    // Control: on a route whose conversations end at about their first
    // turn's size, the wait is most of the conversation's life, and
    // engine 1, with nothing ahead, is the quicker start.
    assert_eq!(
        chosen(&[more, busy], &new_session(8_000), &route(9_000)),
        Some(1)
    );
}

#[test]
fn an_engine_not_timed_yet_is_as_slow_as_its_first_token_still_awaited_says() {
    // A start: engines 1-3 timed at 75 µs a token; engine 4 not yet, and
    // the 8k prompt sent there first has waited 1.3 s (160 µs a token of
    // its work) without its first token. Each has one 8k prompt ahead.
    let ahead = |peer: PeerLoad| PeerLoad {
        backlog_tokens: 8_000,
        in_flight: 1,
        ..peer
    };
    let waiting = |at_least: Option<f32>| PeerLoad {
        speed: EngineSpeed {
            prefill_us_at_least: at_least,
            ..EngineSpeed::default()
        },
        ..ahead(engine(4))
    };
    let starting = RouteModel {
        prefill_us: Some(75.0),
        ..route(9_000)
    };
    let timed_three = [
        ahead(timed(engine(1), 75.0)),
        ahead(timed(engine(2), 75.0)),
        ahead(timed(engine(3), 75.0)),
    ];
    let with = |four: PeerLoad| [timed_three[0], timed_three[1], timed_three[2], four];
    let slow = with(waiting(Some(160.0)));
    let estimate = |peers: &[PeerLoad]| super::estimate(&peers[3], &new_session(8_000), &starting);
    assert!(
        estimate(&slow).prefill_ms > 1_200.0,
        "{:?}",
        estimate(&slow)
    );
    assert_ne!(chosen(&slow, &new_session(8_000), &starting), Some(4));
    // Control: a wait the route's speed explains (40 µs a token so far)
    // leaves engine 4 at the route's speed, as fast as the others; the
    // hash of the session then picks it among equals.
    let on_time = with(waiting(Some(40.0)));
    assert_eq!(
        estimate(&on_time).prefill_ms,
        estimate(&with(waiting(None))).prefill_ms
    );
    let picked: std::collections::HashSet<_> = (0..64u64)
        .filter_map(|rand| choose(&on_time, &new_session(8_000), &starting, rand, |p| p.ready))
        .map(|(p, _)| p.id)
        .collect();
    assert!(picked.contains(&4), "{picked:?}");
}
