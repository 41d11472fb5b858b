//! The connection's two timers: the idle wait between requests and the
//! engine's silence, each one timer per connection moved only when it
//! fires.

use std::future::Future;
use std::pin::Pin;
use std::task::Context;
use std::time::Duration;

/// The wait for a next request, bounded with one timer per connection and
/// one clock read per wait. The timer is moved only when it fires: a wait
/// that begins while it is set for an earlier wait's deadline (sooner)
/// leaves it, and when it fires the wait's own deadline is checked and the
/// timer set to it. So a connection serving requests moves its timer about
/// once per limit, not once per request, and an idle one is woken at most
/// twice per wait; it closes at its limit (tokio's timer granularity
/// aside). A quarter-limit tick with no clock read cost more: 5,000 idle
/// connections took 0.1-0.2 s more CPU over 44 s than Pingora's timer
/// (`benches/idle_connections.sh`).
#[derive(Debug, Default)]
pub(super) struct IdleWatch {
    pub(super) alarm: Alarm,
    /// The head epoch of the wait below.
    pub(super) epoch: u32,
    /// When that wait began (as first seen pending).
    pub(super) since: Option<tokio::time::Instant>,
}

/// A connection's timer for one watch, made once and moved only when it
/// must: shared by [`EngineWatch`] and [`IdleWatch`].
#[derive(Debug, Default)]
pub(super) struct Alarm {
    pub(super) timer: Option<Pin<Box<tokio::time::Sleep>>>,
    /// The task the timer wakes.
    pub(super) waker: Option<std::task::Waker>,
}

impl Alarm {
    /// Set, not yet fired, and waking this task: nothing to check before
    /// it fires (its state only, no poll).
    pub(super) fn pending_for(&self, cx: &Context<'_>) -> bool {
        self.timer.as_ref().is_some_and(|t| !t.is_elapsed())
            && self.waker.as_ref().is_some_and(|k| k.will_wake(cx.waker()))
    }

    pub(super) fn fired(&self) -> bool {
        self.timer.as_ref().is_some_and(|t| t.is_elapsed())
    }

    /// Wakes this task by `due`: a timer already set for sooner is left.
    pub(super) fn wake_by(&mut self, due: tokio::time::Instant, cx: &mut Context<'_>) {
        match &mut self.timer {
            Some(t) if t.deadline() <= due && !t.is_elapsed() => {}
            Some(t) => t.as_mut().reset(due),
            None => self.timer = Some(Box::pin(tokio::time::sleep_until(due))),
        }
        if let Some(t) = &mut self.timer {
            // Registers the task's waker; not ready, as `due` is ahead.
            let _ = t.as_mut().poll(cx);
        }
        self.waker = Some(cx.waker().clone());
    }
}

/// The engine's deadline as the wrapper keeps it. The timer is checked by
/// its state on most reads and polled only when it fired, was just set, or
/// the task polling changed; it is set at most a quarter of the limit
/// ahead, and each time it fires the write count says whether the answer
/// moved since the last time: a silence is caught within a quarter of the
/// limit after it ran out, never before, with no clock read per write.
#[derive(Debug, Default)]
pub(super) struct EngineWatch {
    /// The attempt this watch belongs to (see `engine_attempt`).
    pub(super) attempt: u32,
    pub(super) limit: Duration,
    /// When the exchange last moved, as far as the checks know.
    pub(super) moved_at: Option<tokio::time::Instant>,
    /// `writes` at the last check.
    pub(super) writes_seen: u64,
    pub(super) alarm: Alarm,
}
