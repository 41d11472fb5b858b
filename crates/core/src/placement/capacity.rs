//! An engine's KV capacity in tokens: where it came from, and how to learn
//! it when the engine does not publish it.
//!
//! vLLM and SGLang publish their capacity in `/metrics`; llama.cpp publishes
//! a per-slot context in `/props`; an engine behind another proxy, or an
//! SGLang build without `sglang:max_total_num_tokens`, publishes nothing but
//! a KV-usage gauge. Without a capacity, KV-aware admission cannot apply and
//! placement goes blind to how full an engine is (the replay bench measured
//! TTFT p95 4.5x worse than with it). The gauge alone still says a lot: the
//! gateway knows the prompts it has in flight on the engine, and usage is
//! those tokens over the capacity. [`CapacityLearner`] divides one by the
//! other at every scrape and keeps the median of the recent quotients.

use std::collections::VecDeque;

/// The median of a window of recent samples, once it holds `at_least`: one
/// sample can catch an engine mid-change, the median of several cannot be
/// moved by a few outliers.
pub(super) fn median_of_recent(samples: &VecDeque<u64>, at_least: usize) -> Option<u64> {
    if samples.len() < at_least.max(1) {
        return None;
    }
    let mut sorted: Vec<u64> = samples.iter().copied().collect();
    sorted.sort_unstable();
    Some(sorted[sorted.len() / 2])
}

/// Where a peer's KV capacity came from, most trusted first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CapacitySource {
    /// The route file's `kv_capacity_tokens`.
    Configured,
    /// The engine's `/metrics` (`vllm:cache_config_info`, `sglang:max_total_num_tokens`).
    Metrics,
    /// llama.cpp's `/props` (`n_ctx` per slot times `total_slots`).
    Props,
    /// Learned from the KV-usage gauge against the tokens in flight there.
    Learned,
}

impl CapacitySource {
    pub fn as_str(&self) -> &'static str {
        match self {
            CapacitySource::Configured => "configured",
            CapacitySource::Metrics => "metrics",
            CapacitySource::Props => "props",
            CapacitySource::Learned => "learned",
        }
    }
}

/// Quotients kept: at a 1 s scrape, the last half minute.
const WINDOW: usize = 31;
/// Quotients needed before the estimate is used: one scrape can catch a
/// request the engine has already freed or not yet admitted.
const MIN_SAMPLES: usize = 5;
/// Below this usage the gauge's rounding and the engine's own overheads
/// swamp the signal; above the upper bound the engine may be preempting,
/// and usage no longer grows with what is sent.
const USABLE_USAGE: std::ops::RangeInclusive<f64> = 0.05..=0.95;
/// Fewer tokens in flight than this say nothing reliable about capacity.
const MIN_TOKENS: u64 = 512;

/// Learns a capacity from (tokens in flight, reported usage) pairs. Prompts
/// that share a prefix on the engine occupy its blocks once but count once
/// per request here, so the estimate errs high, on the side of admitting.
#[derive(Debug, Default, Clone)]
pub struct CapacityLearner {
    quotients: VecDeque<u64>,
}

impl CapacityLearner {
    /// One scrape's reading: the engine reported `kv_usage` (0 to 1) while
    /// the gateway had `tokens_in_flight` prompt tokens on it. Readings the
    /// quotient would be noise for are ignored.
    pub fn observe(&mut self, tokens_in_flight: u64, kv_usage: f64) {
        if tokens_in_flight < MIN_TOKENS || !USABLE_USAGE.contains(&kv_usage) {
            return;
        }
        if self.quotients.len() == WINDOW {
            self.quotients.pop_front();
        }
        self.quotients
            .push_back((tokens_in_flight as f64 / kv_usage) as u64);
    }

    /// The median of the recent quotients, once there are enough.
    pub fn estimate(&self) -> Option<u64> {
        median_of_recent(&self.quotients, MIN_SAMPLES)
    }

    /// Forgets what was learned (the engine behind the address restarted,
    /// and may run with another capacity).
    pub fn reset(&mut self) {
        self.quotients.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn learns_the_median_quotient_after_enough_readings() {
        let mut l = CapacityLearner::default();
        for _ in 0..MIN_SAMPLES - 1 {
            l.observe(40_000, 0.4);
        }
        assert_eq!(l.estimate(), None, "too few readings yet");
        l.observe(40_000, 0.4);
        assert_eq!(l.estimate(), Some(100_000));
        // One reading that caught a request the engine had already freed
        // (usage low for what is in flight) does not move the median.
        l.observe(40_000, 0.08);
        assert_eq!(l.estimate(), Some(100_000));
    }

    #[test]
    fn readings_without_signal_are_ignored_with_a_control() {
        let mut ignored = CapacityLearner::default();
        let mut kept = CapacityLearner::default();
        for _ in 0..MIN_SAMPLES {
            ignored.observe(100, 0.5); // too few tokens
            ignored.observe(10_000, 0.01); // usage in the noise
            ignored.observe(10_000, 0.99); // engine full: may be preempting
            ignored.observe(10_000, f64::NAN);
            kept.observe(10_000, 0.5); // the control: the same tokens, usable usage
        }
        assert_eq!(ignored.estimate(), None);
        assert_eq!(kept.estimate(), Some(20_000));
    }

    #[test]
    fn the_window_follows_a_changed_engine_and_reset_forgets() {
        let mut l = CapacityLearner::default();
        for _ in 0..WINDOW {
            l.observe(10_000, 0.5);
        }
        for _ in 0..WINDOW / 2 + 1 {
            l.observe(10_000, 0.25);
        }
        assert_eq!(l.estimate(), Some(40_000), "the newer half wins");
        l.reset();
        assert_eq!(l.estimate(), None);
    }
}
