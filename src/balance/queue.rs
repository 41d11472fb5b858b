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
    let mut wait_for = timeout;
    // Decided before the first try: a try that finds no free slot may
    // already have bound a new session to its engine. Only a queue asks;
    // without one the only turn that waits is a warm one, for its own
    // engine (below), and a request placed at once, the rule, pays no
    // look-up in the session table.
    let now = crate::clock::now_ms();
    let mut warm =
        may_wait && session.is_some_and(|sid| route.runtime.sessions.is_bound(sid.hash, now));
    let fair = demand.fair.filter(|_| route.config.fair_queue());
    let signal = &route.runtime.queue;
    // With waiters on a fair route, the order decides who has the room:
    // a newcomer trying first would take it from the one it woke.
    let first_try =
        (fair.is_none() || !signal.anyone_waits()).then(|| place_with(route, demand, may_wait));
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
    let place = signal.enter(warm, now, warm_precedence(timeout), fair, label);
    loop {
        let notified = signal.notify().notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        // Warm turns go first, for a while; new sessions in arrival order.
        if place.may_try(crate::clock::now_ms()) {
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
