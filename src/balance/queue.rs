//! The admission queue: a request that no peer can take now (every slot of
//! the pool busy, or a new session that fits no engine's KV) waits for room
//! up to the route's `queue_timeout` instead of being refused at once. A 429
//! loses an agent's whole session (and its cache); a short wait loses
//! nothing. Warm turns (sessions already bound to an engine, or parked off
//! an engine over its KV) go before new sessions for a quarter of the
//! timeout, then a new session tries alongside them; new sessions go in
//! arrival order. A warm turn whose own engine is full waits here for it
//! (on a route without a queue too) as long as its cold prefill elsewhere
//! would take, before it overflows. Waiters wake whenever a slot is
//! released, a session leaves its engine's live window, or the process
//! starts draining. On a route with `fair_share` the waiters go by class
//! and tenant (`registry/room.rs`), and while anyone waits a newcomer
//! queues too rather than taking the room a waiter was woken for.

use super::{place_with, Demand, Placed, Refusal};
use crate::lifecycle;
use crate::registry::Route;
use std::time::{Duration, Instant};

/// A placed request and how long it waited for room.
pub struct Granted {
    pub placed: Placed,
    pub waited: Option<Duration>,
    /// What the fair queue charged its tenant when it released it.
    pub fair_charged: f64,
}

/// A refusal, and how long the request waited before it.
pub struct Refused {
    pub error: crate::errors::ErrorResponse,
    pub waited: Option<Duration>,
}

/// Places the request, waiting for room when the route has a queue. The
/// future may be dropped at any point (the client went away): its place in
/// the queue goes with it.
pub async fn place_or_wait(route: &Route, demand: &Demand<'_>) -> Result<Granted, Refused> {
    let (label, session) = (demand.label, demand.session);
    let timeout = route.config.queue_timeout;
    let may_wait = !timeout.is_zero();
    let now = crate::clock::now_ms();
    let fair = demand.fair.filter(|_| route.config.fair_queue());
    let signal = &route.runtime.queue;
    let hold =
        fair.is_some_and(|(tag, _)| signal.note_tenant(&tag.name, now)) && held(route, demand, now);
    let mut wait_for = if may_wait {
        timeout
    } else {
        route.config.fair_hold_timeout
    };
    // Decided before the first try: a try that finds no free slot may
    // already have bound a new session to its engine. Only a queue (or a
    // hold) asks; without one the only turn that waits is a warm one, for
    // its own engine (below), and a request placed at once, the rule,
    // pays no look-up in the session table.
    let mut warm = (may_wait || hold)
        && session.is_some_and(|sid| route.runtime.sessions.is_bound(sid.hash, now));
    // With waiters on a fair route, the order decides who has the room:
    // a newcomer trying first would take it from the one it woke.
    // (Without a queue only held requests wait, each for its own engine.)
    let first_try = (!hold && (fair.is_none() || !may_wait || !signal.anyone_waits()))
        .then(|| place_with(route, demand, may_wait));
    match first_try {
        None => {}
        Some(Ok(placed)) => {
            return Ok(Granted {
                placed,
                waited: None,
                fair_charged: 0.0,
            })
        }
        Some(Err(Refusal::Full(error, gate))) if !may_wait => {
            return Err(refused_full(route, label, error, gate, None))
        }
        Some(Err(Refusal::NoReadyPeer(error))) => {
            // Nothing to wait for: no peer is up.
            return Err(Refused {
                error,
                waited: None,
            });
        }
        Some(Err(Refusal::Full(..))) => {}
        // Without a queue a warm turn still waits for its own engine, as
        // long as going cold elsewhere would cost.
        Some(Err(Refusal::WarmHomeBusy(_, worth))) if !may_wait => {
            // Its engine is its home: the session is bound.
            wait_for = worth;
            warm = true;
        }
        Some(Err(Refusal::WarmHomeBusy(..))) => {}
    }
    let started = Instant::now();
    let deadline = tokio::time::Instant::now() + wait_for;
    let precedence = if hold && !may_wait { wait_for } else { timeout };
    let place = signal.enter(warm, now, warm_precedence(precedence), fair, label);
    let _held = hold.then(|| signal.hold());
    loop {
        let notified = signal.notify().notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        // Warm turns go first, for a while; new sessions in arrival order.
        let now = crate::clock::now_ms();
        let its_turn = place.may_try(now);
        if its_turn && hold && held(route, demand, now) {
            // Its engine's prompts ahead are still too many: the next
            // first token there wakes it.
            place.found_no_room();
        } else if its_turn {
            let demand = Demand {
                waited: started.elapsed(),
                ..*demand
            };
            match place_with(route, &demand, may_wait) {
                Ok(placed) => {
                    return Ok(Granted {
                        fair_charged: place.placed(demand.tokens),
                        placed,
                        waited: Some(started.elapsed()),
                    })
                }
                Err(Refusal::NoReadyPeer(error)) => {
                    return Err(Refused {
                        error,
                        waited: Some(started.elapsed()),
                    })
                }
                // Without a queue, held only for a busy engine: a full
                // pool is refused at once, as it would have been unheld.
                Err(Refusal::Full(error, gate)) if !may_wait && hold => {
                    return Err(refused_full(
                        route,
                        label,
                        error,
                        gate,
                        Some(started.elapsed()),
                    ))
                }
                Err(Refusal::Full(..) | Refusal::WarmHomeBusy(..)) => place.found_no_room(),
            }
        }
        if lifecycle::is_draining() {
            break;
        }
        tokio::select! {
            _ = &mut notified => {}
            _ = tokio::time::sleep_until(deadline) => break,
        }
    }
    // Out of time (or draining): what it would have had without a queue. A
    // new session that only lacked KV room is placed anyway if a slot is
    // free; a warm turn overflows if anywhere has room.
    let waited = Some(started.elapsed());
    let last_try = Demand {
        waited: Duration::MAX,
        ..*demand
    };
    match place_with(route, &last_try, false) {
        Ok(placed) => Ok(Granted {
            placed,
            waited,
            fair_charged: 0.0,
        }),
        Err(Refusal::NoReadyPeer(error)) => Err(Refused { error, waited }),
        Err(Refusal::Full(error, gate)) => Err(refused_full(route, label, error, gate, waited)),
        Err(Refusal::WarmHomeBusy(error, _)) => Err(refused_full(
            route,
            label,
            error,
            crate::protect::gate::Gate::Concurrency,
            waited,
        )),
    }
}

/// Whether a request on a route shared by tenants waits at the gateway
/// rather than in its engine's own queue: the engine it would go to (its
/// session's, else every candidate) already has the route's
/// `fair_hold_depth` streamed prompts awaiting their first token. An
/// engine's queue is first come, first served; held here, the next to go
/// when one of those prompts starts is the fair order's pick
/// (`registry/room.rs`), each first token waking the waiters.
fn held(route: &Route, demand: &Demand<'_>, now: u64) -> bool {
    let depth = route.config.fair_hold_depth;
    let busy = |i: usize| route.peers[i].state.awaiting_first_token() >= depth;
    // The common case first, and without a look-up: no engine is busy.
    if depth == 0 || !demand.pool.iter().any(|&i| busy(i)) {
        return false;
    }
    let home = demand
        .session
        .and_then(|sid| route.runtime.sessions.binding_of(sid.hash, now))
        .and_then(|(peer, _)| route.peer_by_id(peer));
    match home {
        Some((i, _)) => busy(i),
        None => {
            let cands = super::candidates(route, demand.pool, now);
            !cands.is_empty() && cands.into_iter().all(busy)
        }
    }
}

/// How long waiting warm turns go before a new session: a quarter of the
/// queue's timeout, so a new session's wait is bounded too, not only the
/// timeout's last resort.
fn warm_precedence(timeout: Duration) -> u64 {
    u64::try_from(timeout.as_millis() / 4).unwrap_or(u64::MAX)
}

/// A concurrency (or session-priority share) 429: counted as the route's
/// real refusal.
fn refused_full(
    route: &Route,
    label: &str,
    error: crate::errors::ErrorResponse,
    gate: crate::protect::gate::Gate,
    waited: Option<Duration>,
) -> Refused {
    route.adaptive_rejected(label);
    route.runtime.protection.count(gate, true);
    // Counted with the TTFT and decode-rate gates' refusals, so one metric
    // has every load-based 429 by its gate.
    route
        .metrics
        .load_rejections(route.name(), gate.as_str())
        .inc();
    Refused { error, waited }
}
