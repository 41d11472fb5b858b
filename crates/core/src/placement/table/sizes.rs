//! The size a session of the route grows to, learned from the sessions
//! that ended: what a young session is expected to hold on its engine.
//! Unknown (0) until enough have ended, and sessions count at today's
//! size meanwhile. A prior of the largest session seen evened out the
//! first burst's layout but cost a cell of issue 42's family 3-4x its p95
//! (uniform on engines with KV 1.05x the working set: every session
//! counted at 60k from the start, evictions not yet happening were priced
//! into the first placements), so it was taken out again.
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

    /// The context a session of this route grows to; 0 while unknown.
    pub(super) fn typical(&self) -> u64 {
        self.typical.load(Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mean_of_recent_endings_once_there_are_enough() {
        let s = EndedSizes::default();
        for t in [50_000, 60_000, 55_000] {
            s.record(t);
        }
        assert_eq!(s.typical(), 0, "three endings say too little");
        s.record(59_000);
        assert_eq!(s.typical(), 56_000);
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
