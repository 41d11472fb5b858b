//! A route's "room may have freed" signal: an in-flight slot was released
//! (`InFlightGuard`), an adaptive limit rose, or the route's sweeper
//! recounted the live sessions (once a second: a session may have left its
//! engine's live window, and a waiter sees a drain that began). Requests
//! waiting in the route's admission queue (`crate::balance`) sleep on it,
//! warm turns first, new sessions in arrival order; the request path pays
//! one atomic load per released slot when nobody waits.

use parking_lot::Mutex;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use tokio::sync::Notify;

#[derive(Debug, Default)]
pub struct RoomSignal {
    /// Waiters for a warm turn (a session already bound to an engine) and
    /// for a new session; warm turns are placed first.
    waiting_warm: AtomicUsize,
    waiting_new: AtomicUsize,
    /// Tickets of the new sessions waiting, oldest first: they are placed
    /// in arrival order. New sessions all ask for about the same room (a
    /// newcomer is counted at the pool's mean session size), so one in
    /// front never blocks a smaller one behind it for long; left to race on
    /// each wake-up instead, some won every time and others waited out the
    /// whole timeout and were then placed without room.
    new_tickets: Mutex<BTreeSet<u64>>,
    next_ticket: AtomicU64,
    notify: Notify,
}

impl RoomSignal {
    /// Wakes every waiter so each tries to place itself again.
    pub fn room_may_have_freed(&self) {
        if self.waiting_warm.load(Ordering::Acquire) + self.waiting_new.load(Ordering::Acquire) > 0
        {
            self.notify.notify_waiters();
        }
    }

    pub fn notify(&self) -> &Notify {
        &self.notify
    }

    /// (warm, new) requests waiting now.
    pub fn waiting(&self) -> (usize, usize) {
        (
            self.waiting_warm.load(Ordering::Acquire),
            self.waiting_new.load(Ordering::Acquire),
        )
    }

    /// Counts the caller as waiting until the returned place is dropped
    /// (placed, timed out, or the client went away). A new session entering
    /// at `now_ms` lets warm turns go first for `precedence_ms`, then tries
    /// alongside them.
    pub fn enter(&self, warm: bool, now_ms: u64, precedence_ms: u64) -> QueuePlace<'_> {
        self.counter(warm).fetch_add(1, Ordering::AcqRel);
        let ticket = (!warm).then(|| {
            let ticket = self.next_ticket.fetch_add(1, Ordering::Relaxed);
            self.new_tickets.lock().insert(ticket);
            ticket
        });
        QueuePlace {
            signal: self,
            warm,
            ticket,
            warm_first_until_ms: now_ms.saturating_add(precedence_ms),
        }
    }

    fn counter(&self, warm: bool) -> &AtomicUsize {
        if warm {
            &self.waiting_warm
        } else {
            &self.waiting_new
        }
    }
}

/// One request's place in the queue; dropping it leaves the queue.
#[derive(Debug)]
pub struct QueuePlace<'a> {
    signal: &'a RoomSignal,
    warm: bool,
    ticket: Option<u64>,
    /// A new session: until when waiting warm turns go before it.
    warm_first_until_ms: u64,
}

impl QueuePlace<'_> {
    /// Whether this waiter may try for room now: a warm turn always; a new
    /// session when it arrived before every other new session still
    /// waiting, and no warm turn waits or it has given them precedence long
    /// enough. Without that bound, a fleet kept busy by warm turns left new
    /// sessions waiting out the whole queue timeout (the replay bench's
    /// overload tail on vLLM-like engines).
    pub fn may_try(&self, now_ms: u64) -> bool {
        let Some(ticket) = self.ticket else {
            return true;
        };
        let warm_first = self.signal.waiting_warm.load(Ordering::Acquire) > 0
            && now_ms < self.warm_first_until_ms;
        !warm_first && self.signal.new_tickets.lock().first() == Some(&ticket)
    }
}

impl Drop for QueuePlace<'_> {
    fn drop(&mut self) {
        if let Some(ticket) = self.ticket {
            self.signal.new_tickets.lock().remove(&ticket);
        }
        self.signal
            .counter(self.warm)
            .fetch_sub(1, Ordering::AcqRel);
        // A new session holding back behind this warm turn may go now.
        self.signal.room_may_have_freed();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_sessions_try_in_arrival_order_and_after_every_warm_turn() {
        let signal = RoomSignal::default();
        let first = signal.enter(false, 0, 1_000);
        let second = signal.enter(false, 0, 1_000);
        assert!(first.may_try(0));
        assert!(!second.may_try(0), "the later new session waits its turn");
        let warm = signal.enter(true, 0, 1_000);
        assert!(warm.may_try(0));
        assert!(!first.may_try(0), "a warm turn goes before any new session");
        drop(warm);
        assert!(first.may_try(0));
        // Leaving the queue (placed, timed out, hung up) hands the turn on.
        drop(first);
        assert!(second.may_try(0));
        assert_eq!(signal.waiting(), (0, 1));
        drop(second);
        assert_eq!(signal.waiting(), (0, 0));
    }

    #[test]
    fn warm_turns_go_first_only_for_a_bounded_time() {
        let signal = RoomSignal::default();
        let new = signal.enter(false, 10_000, 2_000);
        let behind = signal.enter(false, 10_500, 2_000);
        let _warm = signal.enter(true, 10_000, 2_000);
        assert!(!new.may_try(11_999), "warm turns first while it is young");
        assert!(new.may_try(12_000), "then it tries alongside them");
        assert!(
            !behind.may_try(13_000),
            "still in arrival order among new sessions"
        );
        // The control: with no warm turn waiting, precedence never applies.
        let quiet = RoomSignal::default();
        let alone = quiet.enter(false, 10_000, 60_000);
        assert!(alone.may_try(10_000));
    }
}
