//! The size a session of the route grows to, learned from the sessions
//! that ended: what a young session is expected to hold on its engine.
//! Before enough have ended, the largest context a session of the route
//! has held: a route serves one kind of client, and its sessions reach
//! what one of them reached. Without it, sessions that start together
//! (a fleet of agents, a restart) were counted at today's sizes, and an
//! engine given one long session took fewer of the young ones that grow
//! as long (issue 42's family: 9/7/6/10 of 32 where 8 each was right).
//!
//! A session is taken to have ended when it leaves the live window after
//! an answer (its client stopped coming back); the context it held then is
//! its size. The mean of the recent ones, not the median: placement adds
//! these up per engine, and a sum of expected sizes needs the mean (a few
//! long agent sessions among many chats weigh what they weigh).

use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Ended sessions kept: enough that one odd session moves the mean little,
/// few enough that a change of clients shows within a few dozen endings.
const WINDOW: usize = 64;
/// Endings needed before the mean is used.
const MIN_ENDED: usize = 4;

#[derive(Debug, Default)]
pub(super) struct EndedSizes {
    sizes: Mutex<VecDeque<u32>>,
    /// The mean of `sizes` once there are enough, else 0; read per placement.
    typical: AtomicU64,
    /// The largest context a session of the route has held: the prior
    /// for the size sessions grow to before any has ended.
    largest: AtomicU64,
}

impl EndedSizes {
    pub(super) fn record(&self, tokens: u32) {
        if tokens == 0 {
            return;
        }
        let mut sizes = self.sizes.lock();
        if sizes.len() == WINDOW {
            sizes.pop_front();
        }
        sizes.push_back(tokens);
        let typical = if sizes.len() < MIN_ENDED {
            0
        } else {
            sizes.iter().map(|&t| u64::from(t)).sum::<u64>() / sizes.len() as u64
        };
        self.typical.store(typical, Relaxed);
    }

    /// A live session holds `tokens`.
    pub(super) fn saw(&self, tokens: u64) {
        if self.largest.load(Relaxed) < tokens {
            self.largest.fetch_max(tokens, Relaxed);
        }
    }

    /// The context a session of this route grows to; 0 while no session
    /// has held any.
    pub(super) fn typical(&self) -> u64 {
        match self.typical.load(Relaxed) {
            0 => self.largest.load(Relaxed),
            n => n,
        }
    }

    /// Whether [`typical`](Self::typical) is learned from ended sessions
    /// rather than the largest one seen.
    pub(super) fn learned(&self) -> bool {
        self.typical.load(Relaxed) > 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mean_of_recent_endings_once_there_are_enough_the_largest_seen_before() {
        let s = EndedSizes::default();
        for t in [50_000, 60_000, 55_000] {
            s.record(t);
        }
        assert_eq!(s.typical(), 0, "three endings say too little");
        s.saw(61_000);
        s.saw(20_000);
        assert_eq!(s.typical(), 61_000, "the largest seen stands in");
        assert!(!s.learned());
        s.record(59_000);
        assert_eq!(s.typical(), 56_000);
        assert!(s.learned());
        // An adopted session never served here has no size: not an ending.
        s.record(0);
        assert_eq!(s.typical(), 56_000);
        // The window follows the clients.
        for _ in 0..WINDOW {
            s.record(8_000);
        }
        assert_eq!(s.typical(), 8_000);
    }
}
