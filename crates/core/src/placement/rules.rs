//! The load-aware placement rules as a pure function of what the table
//! remembers about a session and the peers' loads at this instant.
//!
//! Kept apart from the table so that the table owns storage, locking and time,
//! and these rules can be read (and reasoned about) on one screen.
//!
//! Where a session starts (new, or its engine gone) and whether it leaves a
//! ready home are decided by the model ([`super::model`]): the expected
//! time to its first token on each engine, with what binding it there
//! evicts. Whether to leave a home needs the home's queue in time, which
//! the model has once the engine's completion rate and the route's
//! prefill speed are learned; until then the seed's margins decide (a
//! spill needs a queue and a gap of `spill_margin` requests to the
//! least-loaded other peer, `spill_margin_blind` without engine metrics).

use super::incoming::Incoming;
use super::model::{self, Ask, Estimate, RouteModel};
use super::pick::{least_bound, least_loaded};
use super::{KvRoom, PeerId, PeerLoad, Reason};

/// The tunables the rules read, copied out of the table config per call.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Limits {
    pub spill_margin: u32,
    pub spill_margin_blind: u32,
    pub cooldown_ms: u64,
    /// What KV admission measures a peer against.
    pub room: KvRoom,
    /// What the model knows of the route.
    pub model: RouteModel,
}

/// What the table remembers about a live session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Remembered {
    pub peer: PeerId,
    /// Time since the session last moved; `None` if it never has.
    pub since_move_ms: Option<u64>,
    /// The context it held there after its last turn.
    pub held: u64,
}

/// What should happen to the session's binding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Verdict {
    NoReadyPeer,
    /// A new session fits no ready peer's KV: it should wait for room.
    NoRoom,
    New {
        to: PeerId,
    },
    Stay {
        on: PeerId,
    },
    Spill {
        from: PeerId,
        to: PeerId,
        reason: Reason,
    },
    Migrate {
        from: PeerId,
        to: PeerId,
    },
    /// A known session whose home is over its KV and that fits nowhere
    /// else: it lets go of its binding and waits for room like a new one.
    Park {
        from: PeerId,
    },
}

/// The remembered peer's state, kept for the explanation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct HomeState {
    pub load: u32,
    pub waiting: u32,
    pub fresh: bool,
    pub kv_full: bool,
}

/// The facts behind a verdict, turned into prose only by `peek`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Why {
    NoReadyPeer,
    NoKvFit,
    NewSession {
        chosen: Estimate,
        kv_room: bool,
    },
    HomeGone {
        still_configured: bool,
        chosen: Estimate,
    },
    /// The model compared the home with the best other engine.
    Estimated {
        home: Estimate,
        best: Estimate,
        lifetime: model::Lifetime,
    },
    /// The model: no other engine has KV room for the session.
    NoRoomElsewhere {
        home: Estimate,
    },
    /// The model: even at the fastest engine's speed a move would not be
    /// worth it over the session's life.
    NothingClearlyBetter {
        home: Estimate,
        floor_ms: f32,
    },
    OnlyReadyPeer,
    Cooldown {
        left_ms: u64,
    },
    NoKvRoomElsewhere {
        home: HomeState,
    },
    BackedUp {
        home: HomeState,
        target_load: u32,
        margin: u32,
    },
    KvFullShed {
        home: HomeState,
        target_load: u32,
    },
    Overcommitted {
        held: u64,
        capacity: u64,
    },
    NotBackedUp {
        home: HomeState,
        target_load: u32,
        margin: u32,
    },
}

pub(super) fn decide(
    sid: u64,
    remembered: Option<Remembered>,
    peers: &[PeerLoad],
    limits: Limits,
    incoming: Incoming,
) -> (Verdict, Why) {
    // Exact ties between engines (alike in every respect the model weighs)
    // go by the session's hash, so what /_route_debug and /_route_inspect
    // predict is what placement does; near ones by what the engines hold.
    let rand = sid;
    let admit = limits.room;
    let Some(remembered) = remembered else {
        let ask = Ask {
            tokens: incoming.tokens,
            prefix: incoming.prefix,
            ..Ask::default()
        };
        return match best_home(peers, &ask, incoming, admit, &limits.model, rand) {
            Some((to, chosen)) => (
                Verdict::New { to: to.id },
                Why::NewSession {
                    chosen,
                    kv_room: !to.kv_full,
                },
            ),
            None if peers.iter().any(|p| p.ready) => (Verdict::NoRoom, Why::NoKvFit),
            None => (Verdict::NoReadyPeer, Why::NoReadyPeer),
        };
    };

    let from = remembered.peer;
    let ask = Ask {
        tokens: incoming.tokens.max(remembered.held),
        home: Some(from),
        held: remembered.held,
        prefix: incoming.prefix,
    };
    let Some(home) = peers.iter().find(|p| p.id == from && p.ready) else {
        // The session loses its cache wherever it goes, so it is placed like
        // a new one (but never left waiting: its turn was already admitted
        // once); the cooldown only guards against moves for pressure.
        let no_wait = Incoming {
            may_wait: false,
            ..incoming
        };
        let cold = Ask { home: None, ..ask };
        return match best_home(peers, &cold, no_wait, admit, &limits.model, rand) {
            Some((to, chosen)) => (
                Verdict::Migrate { from, to: to.id },
                Why::HomeGone {
                    still_configured: peers.iter().any(|p| p.id == from),
                    chosen,
                },
            ),
            None => (Verdict::NoReadyPeer, Why::NoReadyPeer),
        };
    };
    let stay = Verdict::Stay { on: from };

    if !peers.iter().any(|p| p.ready && p.id != from) {
        return (stay, Why::OnlyReadyPeer);
    }
    if let Some(since_move_ms) = remembered.since_move_ms {
        if since_move_ms < limits.cooldown_ms {
            let left_ms = limits.cooldown_ms - since_move_ms;
            return (stay, Why::Cooldown { left_ms });
        }
    }
    let home_estimate = model::estimate(home, &ask, &limits.model);
    if model_knows_the_wait(home, &home_estimate, &limits.model) {
        return by_estimate(home, &ask, &home_estimate, peers, limits, incoming, rand);
    }
    by_margins(
        sid,
        home,
        peers,
        limits,
        Incoming {
            tokens: ask.tokens,
            ..incoming
        },
    )
}

/// Whether the model can weigh staying against moving: the home's queue is
/// known in time (no queue, or a completion rate to drain it at) and the
/// route's prefill speed has been timed, so a wait and a cold prefill are
/// in one unit.
fn model_knows_the_wait(home: &PeerLoad, estimate: &Estimate, model: &RouteModel) -> bool {
    estimate.queue_known && (model.prefill_us.is_some() || home.speed.prefill_us.is_some())
}

/// Stay or move by the model: the home's expected time (its queue, and
/// the prefill of what it no longer holds of the session) against the
/// best other engine's with KV room (the whole context cold, and what it
/// evicts there); a move only when that is clearly better.
fn by_estimate(
    home: &PeerLoad,
    ask: &Ask,
    home_estimate: &Estimate,
    peers: &[PeerLoad],
    limits: Limits,
    incoming: Incoming,
    rand: u64,
) -> (Verdict, Why) {
    let from = home.id;
    // Elsewhere the request pays at least its tokens not in a shared prefix
    // at the fastest engine's speed: when even that would not make a move
    // worth it over the session's life, no engine is, and none is weighed
    // (the common warm turn costs one estimate, not one per engine).
    if !home.overcommitted() {
        let fastest_us = peers
            .iter()
            .filter(|p| p.ready && p.id != from)
            .map(|p| model::prefill_speed(p, &limits.model))
            .fold(f32::INFINITY, f32::min);
        let shared = ask.prefix.map_or(0, |p| p.tokens);
        let floor_ms = model::least_move_ms(ask, &limits.model, shared, fastest_us);
        if floor_ms >= model::stay_ms(home_estimate, ask, &limits.model) {
            let why = Why::NothingClearlyBetter {
                home: *home_estimate,
                floor_ms,
            };
            return (Verdict::Stay { on: from }, why);
        }
    }
    let cold = Ask { home: None, ..*ask };
    let fits = |p: &PeerLoad| p.fits(ask.tokens, limits.room);
    let best = model::choose(peers, &cold, &limits.model, rand, |p| {
        p.ready && p.id != from && !p.kv_full && fits(p)
    });
    let Some((to, best)) = best else {
        if home.overcommitted() && incoming.may_wait && !holds_half(ask.tokens, home) {
            let why = Why::Overcommitted {
                held: home.bound.returning_tokens,
                capacity: home.kv_capacity_tokens.unwrap_or(0),
            };
            return (Verdict::Park { from }, why);
        }
        let why = Why::NoRoomElsewhere {
            home: *home_estimate,
        };
        return (Verdict::Stay { on: from }, why);
    };
    let lifetime = model::lifetime(home_estimate, &best, ask, &limits.model);
    let why = Why::Estimated {
        home: *home_estimate,
        best,
        lifetime,
    };
    if !lifetime.moves() {
        return (Verdict::Stay { on: from }, why);
    }
    let reason = if home_estimate.cached_tokens < ask.held.min(ask.tokens) {
        Reason::KvOvercommit
    } else if home.kv_full {
        Reason::KvFull
    } else {
        Reason::Waiting
    };
    let spill = Verdict::Spill {
        from,
        to: to.id,
        reason,
    };
    (spill, why)
}

/// A session holding half its engine's KV or more stays rather than wait
/// unbound: to wait costs it the wait and its whole prefill (an 89k-token
/// agent context parked on the skewed replay waited 2 s, then took 8 s to
/// prefill cold), more than any eviction it suffers by staying, while the
/// light sessions that follow it clear the excess for a fraction of that.
fn holds_half(tokens: u64, home: &PeerLoad) -> bool {
    home.kv_capacity_tokens
        .is_some_and(|cap| tokens.saturating_mul(2) >= cap)
}

/// Where a session starts (or restarts) cold: the model's choice among the
/// ready peers with KV room that fit it, unless one that does not fit is
/// quicker by more than its whole cold prefill there (what it evicts
/// counted in); if none fits, `None` when `may_wait`, else the choice
/// ignoring the fit; if every ready peer is KV-full, the choice among them.
fn best_home<'a>(
    peers: &'a [PeerLoad],
    ask: &Ask,
    incoming: Incoming,
    room: KvRoom,
    route: &RouteModel,
    rand: u64,
) -> Option<(&'a PeerLoad, Estimate)> {
    let fits = |p: &PeerLoad| p.fits(ask.tokens, room);
    let choose =
        |eligible: &dyn Fn(&PeerLoad) -> bool| model::choose(peers, ask, route, rand, eligible);
    if let Some(home) = choose(&|p| p.ready && !p.kv_full && fits(p)) {
        // The engines with room can be the ones nobody should go to: a
        // slow engine deep in cold prompts keeps room because its sessions
        // left it, and drew every new tenant for seconds each while the
        // others were expected to start them in well under one (issue 42's
        // shared-prefix f3, polled from /_route_state).
        let unfit = choose(&|p| p.ready && !p.kv_full && !fits(p));
        return match unfit {
            Some(other) if other.1.total_ms() + other.1.prefill_ms < home.1.total_ms() => {
                Some(other)
            }
            _ => Some(home),
        };
    }
    if incoming.may_wait && peers.iter().any(|p| p.ready) {
        return None;
    }
    choose(&|p| p.ready && !p.kv_full).or_else(|| choose(&|p| p.ready))
}

/// The seed's rules, before the model knows the home's wait: a move for
/// KV (the home over its KV) or for pressure (a queue, and a margin of
/// requests over the least-loaded other peer with room).
fn by_margins(
    sid: u64,
    home: &PeerLoad,
    peers: &[PeerLoad],
    limits: Limits,
    incoming: Incoming,
) -> (Verdict, Why) {
    let admit = limits.room;
    let from = home.id;
    let stay = Verdict::Stay { on: from };
    // Over its KV, the home is evicting someone's prefix between turns, and
    // by LRU that is the session idle longest: most likely the one arriving
    // now. Its prefill is paid wherever it goes, so it goes where it fits,
    // or (with a queue) waits for room unbound, which brings the home back
    // inside its KV for the sessions that stay. Without this an over-full
    // engine misses on nearly every turn until sessions end.
    if home.overcommitted() {
        let why = Why::Overcommitted {
            held: home.bound.returning_tokens,
            capacity: home.kv_capacity_tokens.unwrap_or(0),
        };
        let fits_elsewhere =
            |p: &PeerLoad| p.ready && p.id != from && !p.kv_full && p.fits(incoming.tokens, admit);
        // vLLM and SGLang evict a sequence's blocks tail first, so an engine
        // over by `excess` tokens takes at most that much of the arriving
        // session's context; the rest is still cached at home. A session
        // longer than the excess re-prefills less by staying than by moving
        // (the skewed replay on vLLM-like engines moved 63k-token agent
        // contexts that were 85% cached at home: 3.3 s cold each).
        let excess = home
            .bound
            .returning_tokens
            .saturating_sub(home.kv_capacity_tokens.unwrap_or(0));
        let evicted_whole = incoming.tokens <= excess;
        match least_bound(sid, peers, admit.expected_session, fits_elsewhere) {
            Some(to) if evicted_whole => {
                let spill = Verdict::Spill {
                    from,
                    to: to.id,
                    reason: Reason::KvOvercommit,
                };
                return (spill, why);
            }
            // Staying costs it less than moving; the pressure rules below
            // still apply.
            Some(_) => {}
            None => {
                if incoming.may_wait && !holds_half(incoming.tokens, home) {
                    return (Verdict::Park { from }, why);
                }
            }
        }
    }

    let home_state = HomeState {
        load: home.load(),
        waiting: home.waiting(),
        fresh: home.engine.is_some(),
        kv_full: home.kv_full,
    };
    // A move re-prefills the whole conversation; onto a KV-full peer that
    // prefill would also evict someone else's cache and likely queue, so a
    // pressure move only ever goes to a peer with KV room.
    // A move also must not overfill the target's KV with this session.
    let room = |p: &PeerLoad| p.fits(incoming.tokens, admit);
    let Some(target) = least_loaded(sid, peers, |p| {
        p.ready && p.id != from && !p.kv_full && room(p)
    }) else {
        return (stay, Why::NoKvRoomElsewhere { home: home_state });
    };
    let target_load = target.load();
    let spill = |reason| Verdict::Spill {
        from,
        to: target.id,
        reason,
    };

    // With fresh metrics the engine says whether anything is actually queued;
    // blind, only a wider gap in gateway in-flight counts is trusted.
    let (margin, queued) = if home_state.fresh {
        (limits.spill_margin, home_state.waiting > 0)
    } else {
        (limits.spill_margin_blind, true)
    };
    let backed_up = queued && home_state.load >= target_load.saturating_add(margin);
    if backed_up {
        let why = Why::BackedUp {
            home: home_state,
            target_load,
            margin,
        };
        return (spill(Reason::Waiting), why);
    }
    // "No busier" is the floor that stops a herd: without it every session of
    // a KV-full peer would pile onto busier peers and push them to KV-full.
    if home_state.kv_full && home_state.waiting > 0 && target_load <= home_state.load {
        let why = Why::KvFullShed {
            home: home_state,
            target_load,
        };
        return (spill(Reason::KvFull), why);
    }
    let why = Why::NotBackedUp {
        home: home_state,
        target_load,
        margin,
    };
    (stay, why)
}

/// Human explanation of a verdict for `/_route_debug`.
pub(super) fn explain(verdict: Verdict, why: Why) -> String {
    match (verdict, why) {
        (_, Why::NoReadyPeer) => "no ready peer".to_owned(),
        (_, Why::NoKvFit) => {
            "unknown session: no ready peer's KV holds it beside the live sessions bound there: waits for room".to_owned()
        }
        (Verdict::New { to }, Why::NewSession { chosen, kv_room }) => {
            let room = if kv_room {
                "with KV room"
            } else {
                "(every ready peer is KV-full)"
            };
            format!(
                "unknown session: the ready peer {room} with the least expected time to first token (near-equal ones: the least held) is {to}: {}",
                describe_estimate(&chosen)
            )
        }
        (Verdict::Migrate { from, to }, Why::HomeGone { still_configured, chosen }) => {
            let state = if still_configured {
                "is not ready"
            } else {
                "is no longer configured"
            };
            format!(
                "remembered peer {from} {state}: moves to peer {to}, the least expected time to first token: {}",
                describe_estimate(&chosen)
            )
        }
        (verdict, Why::Estimated { home, best, lifetime }) => {
            let outcome = match verdict {
                Verdict::Spill { .. } => "a move is worth it: moves",
                _ => "a move is not worth it: stays",
            };
            format!(
                "home {}: {}; best other peer {}: {}; over the {:.1} turns it has left, staying costs {:.0} ms, moving {:.0} ms (and a margin of {:.0} ms); {outcome}",
                home.peer,
                describe_estimate(&home),
                best.peer,
                describe_estimate(&best),
                lifetime.turns,
                lifetime.stay_ms,
                lifetime.move_ms,
                lifetime.margin_ms,
            )
        }
        (_, Why::NothingClearlyBetter { home, floor_ms }) => format!(
            "home {}: {}; a move would cost at least {floor_ms:.0} ms over the turns it has left, no less than staying: stays",
            home.peer,
            describe_estimate(&home)
        ),
        (_, Why::NoRoomElsewhere { home }) => format!(
            "home {}: {}; no other ready peer has KV room for it: stays",
            home.peer,
            describe_estimate(&home)
        ),
        (_, Why::OnlyReadyPeer) => "remembered peer is the only ready peer: stays".to_owned(),
        (_, Why::Cooldown { left_ms }) => {
            format!("moved recently: no move for pressure for another {left_ms} ms: stays")
        }
        (_, Why::NoKvRoomElsewhere { home }) => {
            format!("{}; no other ready peer has KV room: stays", describe(home))
        }
        (Verdict::Spill { to, .. }, Why::BackedUp { home, target_load, margin }) => format!(
            "{}; backed up: load {} >= {target_load} (least-loaded peer {to} with KV room) + {margin}: spills",
            describe(home),
            home.load
        ),
        (Verdict::Spill { to, .. }, Why::KvFullShed { home, target_load }) => format!(
            "{}; KV-full and queuing, peer {to} has KV room and is no busier (load {target_load}): spills",
            describe(home)
        ),
        (Verdict::Spill { to, .. }, Why::Overcommitted { held, capacity }) => format!(
            "remembered peer's live sessions likely to return hold {held} tokens, past its KV of {capacity}: moves to peer {to}, which holds the least and has room"
        ),
        (Verdict::Park { .. }, Why::Overcommitted { held, capacity }) => format!(
            "remembered peer's live sessions likely to return hold {held} tokens, past its KV of {capacity}, and no other peer has room: lets go of its binding and waits for room"
        ),
        (_, Why::NotBackedUp { home, target_load, margin }) => {
            let threshold = target_load.saturating_add(margin);
            let condition = if home.fresh {
                format!("waiting > 0 and load >= {threshold}")
            } else {
                format!("load >= {threshold} (blind margin {margin})")
            };
            format!(
                "{}; least-loaded other peer with KV room has load {target_load}; a spill needs {condition}: stays",
                describe(home)
            )
        }
        (verdict, why) => format!("{verdict:?} because {why:?}"),
    }
}

/// An estimate's parts, in the words `/_route_debug` uses.
fn describe_estimate(e: &Estimate) -> String {
    let speed = if e.timed { "timed" } else { "assumed" };
    format!(
        "{:.0} ms expected (queue {:.0}, prefill ahead {:.0}, its own {:.0} for {} uncached, evicting {} tokens of others {:.0}; {:.0} µs a token, {speed})",
        e.total_ms(),
        e.queue_ms,
        e.backlog_ms,
        e.prefill_ms,
        e.uncached_tokens,
        e.evicts_tokens,
        e.evicts_ms,
        e.prefill_us
    )
}

fn describe(home: HomeState) -> String {
    let metrics = if home.fresh {
        format!("waiting {}", home.waiting)
    } else {
        "no fresh engine metrics".to_owned()
    };
    let kv = if home.kv_full { ", KV-full" } else { "" };
    format!("remembered peer load {} ({metrics}{kv})", home.load)
}
