//! A route's "room may have freed" signal: an in-flight slot was released,
//! a session left its engine's live window, or the process began draining.
//! Requests waiting in the route's admission queue (`crate::balance`) sleep
//! on it; the request path pays one atomic load per released slot when
//! nobody waits.

use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::sync::Notify;

#[derive(Debug, Default)]
pub struct RoomSignal {
    /// Waiters for a warm turn (a session already bound to an engine) and
    /// for a new session; warm turns are placed first.
    waiting_warm: AtomicUsize,
    waiting_new: AtomicUsize,
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
    /// (placed, timed out, or the client went away).
    pub fn enter(&self, warm: bool) -> QueuePlace<'_> {
        self.counter(warm).fetch_add(1, Ordering::AcqRel);
        QueuePlace { signal: self, warm }
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
}

impl Drop for QueuePlace<'_> {
    fn drop(&mut self) {
        self.signal
            .counter(self.warm)
            .fetch_sub(1, Ordering::AcqRel);
        // A new session holding back behind this warm turn may go now.
        self.signal.room_may_have_freed();
    }
}
