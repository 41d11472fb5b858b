//! What a prompt costs where it is not cached, learned from the turns that
//! started cold: time to first token per prompt token the engine had to
//! compute (counted as the gateway estimates a request's tokens, the unit
//! a waiting turn is weighed in).
//!
//! A warm session whose engine has no free slot can go elsewhere at once
//! (`overflow`) or wait for its engine. Elsewhere it is cold: its whole
//! context is prefilled again (on llama.cpp's CPU build a 4k-token context
//! is 6.5 s cold and 0.07 s cached). Waiting costs until a slot frees,
//! which on a busy engine is usually one decode away. So the warm turn
//! waits for its engine as long as its cold prefill elsewhere would take,
//! and overflows only after that: by then the move cannot be the slower
//! choice by more than the wait already spent. Without samples the cost is
//! unknown and the turn overflows at once, as it always did.

use std::collections::VecDeque;
use std::time::Duration;

/// Samples kept: the last few dozen cold turns, so a change of engine or
/// load shows within a minute of traffic.
const WINDOW: usize = 31;
/// Samples needed before the estimate is used.
const MIN_SAMPLES: usize = 3;
/// A cold turn with fewer new tokens than this is timed mostly by the
/// engine's fixed cost per request, not by prefill.
pub const MIN_NEW_TOKENS: u64 = 256;
/// The longest a warm turn waits for its engine, however long its context:
/// past this a client's own timeouts start to bite.
pub const MAX_WAIT: Duration = Duration::from_secs(30);

/// Cold prefill cost per token (microseconds), the median of recent cold
/// turns. TTFT includes the engine's queue, which is what a moved turn
/// would meet too.
#[derive(Debug, Default, Clone)]
pub struct ColdCost {
    us_per_token: VecDeque<u64>,
}

impl ColdCost {
    /// One turn's first token came `ttft` after it was sent, with
    /// `new_tokens` of its prompt not in the engine's cache.
    pub fn observe(&mut self, new_tokens: u64, ttft: Duration) {
        if new_tokens < MIN_NEW_TOKENS {
            return;
        }
        let us = u64::try_from(ttft.as_micros()).unwrap_or(u64::MAX) / new_tokens;
        if self.us_per_token.len() == WINDOW {
            self.us_per_token.pop_front();
        }
        self.us_per_token.push_back(us);
    }

    /// The median cost per cold token, once enough turns are in.
    pub fn us_per_token(&self) -> Option<u64> {
        super::capacity::median_of_recent(&self.us_per_token, MIN_SAMPLES)
    }

    /// How long a warm turn of `tokens` context tokens should wait for its
    /// engine before it goes cold elsewhere: its cold prefill there, at most
    /// [`MAX_WAIT`]; zero while the cost is unknown.
    pub fn worth_waiting(&self, tokens: u64) -> Duration {
        self.us_per_token().map_or(Duration::ZERO, |us| {
            Duration::from_micros(us.saturating_mul(tokens)).min(MAX_WAIT)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_warm_turn_waits_as_long_as_its_cold_prefill_would_take() {
        let mut cost = ColdCost::default();
        // 4,000 new tokens in 6.5 s, three times: 1,625 µs a token.
        for _ in 0..3 {
            cost.observe(4_000, ms(6_500));
        }
        assert_eq!(cost.us_per_token(), Some(1_625));
        assert_eq!(cost.worth_waiting(2_000), ms(3_250));
        assert_eq!(cost.worth_waiting(100_000), MAX_WAIT, "bounded");
    }

    #[test]
    fn unknown_cost_waits_not_at_all() {
        let mut cost = ColdCost::default();
        assert_eq!(cost.worth_waiting(4_000), Duration::ZERO);
        cost.observe(4_000, ms(6_500));
        cost.observe(4_000, ms(6_500));
        assert_eq!(cost.worth_waiting(4_000), Duration::ZERO, "two samples");
        // Short prompts are timed by the engine's fixed cost: not samples.
        cost.observe(100, ms(500));
        assert_eq!(cost.worth_waiting(4_000), Duration::ZERO);
        // The control: a third long one makes it known.
        cost.observe(4_000, ms(6_500));
        assert!(cost.worth_waiting(4_000) > Duration::ZERO);
    }

    #[test]
    fn the_median_of_the_recent_window_follows_the_engine() {
        let mut cost = ColdCost::default();
        for _ in 0..WINDOW {
            cost.observe(1_000, ms(100)); // a fast engine: 100 µs a token
        }
        assert_eq!(cost.us_per_token(), Some(100));
        // One outlier (a turn queued behind others) moves nothing.
        cost.observe(1_000, ms(60_000));
        assert_eq!(cost.us_per_token(), Some(100));
        // The engine slows down for good: the window follows.
        for _ in 0..=WINDOW / 2 {
            cost.observe(1_000, ms(2_000));
        }
        assert_eq!(cost.us_per_token(), Some(2_000));
    }
}
