//! How fast one engine is, learned from its own answers: what a prompt
//! token costs it to prefill, what an output token costs it to decode, and
//! how often it finishes a request. Placement's model
//! ([`super::model`]) reads these instead of assuming every engine is as
//! fast as the route's average: a throttled GPU, a smaller card or a
//! busier neighbour shows in what the engine does, whatever it publishes.
//!
//! Pure and clock-injected: the caller hands in durations and a
//! millisecond clock.

use std::collections::VecDeque;
use std::time::Duration;

use super::cold_cost::MIN_NEW_TOKENS;

/// Samples kept per series: the last few dozen turns, so a change of
/// engine or load shows within a minute of traffic.
const WINDOW: usize = 31;
/// Samples a series needs before it is used.
const MIN_SAMPLES: usize = 3;
/// The prefill speed is the lower quartile of its samples, not the median:
/// prompts that arrive together share the engine's prefill (vLLM chunks
/// them in turn), so each first token waits for the others too, more than
/// the backlog the sample is corrected for; the least crowded samples are
/// nearest the engine's own speed, and the model adds the crowd itself.
const PREFILL_QUANTILE: f64 = 0.25;
/// Output tokens below which a stream says little about decode speed
/// (its first interval is mostly scheduling).
const MIN_DECODED: u64 = 8;
/// The completion rate's time constant: a rate follows a change of load
/// within a few seconds and is not moved by one burst.
const RATE_TAU_MS: f64 = 5_000.0;
/// The rate is reported once this much time has been watched and this many
/// requests finished in it: before the first answers of a burst of long
/// turns come back, no completion says the engine is slow, not stuck.
const RATE_WARMUP_MS: u64 = 3_000;
const RATE_WARMUP_COMPLETIONS: u64 = 4;

/// What placement knows of one engine's speed at this instant; `None`
/// where nothing has been learned yet.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct EngineSpeed {
    /// Time to first token per prompt token the engine had to compute,
    /// counting the prefill queued ahead of the request (µs per token, in
    /// the gateway's token estimate).
    pub prefill_us: Option<f32>,
    /// Time per output token after the first (µs).
    pub tpot_us: Option<f32>,
    /// Requests this gateway saw the engine finish per second.
    pub completions_per_s: Option<f32>,
    /// Not timed yet, and a cold prompt sent there has waited this long
    /// per token of its work without its first token: the engine is at
    /// least this slow, whatever the others are (µs per token).
    pub prefill_us_at_least: Option<f32>,
}

/// The prefill speed a first token still awaited says an engine has at
/// least: `waited_ms` for `work` tokens (its own cold tokens and half the
/// backlog it was sent behind, as [`SpeedLearner::observe_first_token`]
/// counts a first token that came; a prompt under `MIN_NEW_TOKENS` is no
/// probe, as it is no sample).
pub fn prefill_us_at_least(waited_ms: u64, work: u64) -> f32 {
    waited_ms as f32 * 1_000.0 / work.max(1) as f32
}

/// Learns one engine's [`EngineSpeed`]. Placement reads it for every
/// engine on every request, so the medians are taken when a sample
/// arrives, not when they are read.
#[derive(Debug, Default, Clone)]
pub struct SpeedLearner {
    prefill_us: VecDeque<u64>,
    tpot_us: VecDeque<u64>,
    /// The two windows' figures (prefill: its lower quartile; time per
    /// output token: its median), as of their last sample.
    prefill_median: Option<f32>,
    tpot_median: Option<f32>,
    /// Completions per second, smoothed; with the clock and count it was
    /// last updated at, and since when it has been watched.
    rate: f64,
    last: Option<(u64, u64)>,
    /// When watching began, and the count then.
    watched_since: Option<(u64, u64)>,
}

/// Adds `sample` to `window` and returns the window's quantile `at` (0.5:
/// the median) once it holds enough samples; sorted on the stack.
fn push(window: &mut VecDeque<u64>, sample: u64, at: f64) -> Option<f32> {
    if window.len() == WINDOW {
        window.pop_front();
    }
    window.push_back(sample);
    if window.len() < MIN_SAMPLES {
        return None;
    }
    let mut sorted = [0u64; WINDOW];
    for (slot, v) in sorted.iter_mut().zip(window.iter()) {
        *slot = *v;
    }
    let sorted = &mut sorted[..window.len()];
    sorted.sort_unstable();
    let i = ((sorted.len() - 1) as f64 * at).round() as usize;
    Some(sorted[i] as f32)
}

impl SpeedLearner {
    /// A request's first token came `ttft` after it was sent, with
    /// `new_tokens` of its prompt not cached on the engine and `ahead`
    /// tokens of other cold prompts still prefilling there when it was
    /// placed. Those were on average half done, so the request waited for
    /// half of them: the model adds the backlog the same way it learns it.
    pub fn observe_first_token(&mut self, new_tokens: u64, ahead: u64, ttft: Duration) {
        if new_tokens < MIN_NEW_TOKENS {
            return;
        }
        let work = new_tokens.saturating_add(ahead / 2);
        let us = u64::try_from(ttft.as_micros()).unwrap_or(u64::MAX) / work.max(1);
        self.prefill_median = push(&mut self.prefill_us, us, PREFILL_QUANTILE);
    }

    /// A stream decoded `tokens` output tokens in `decode` after its first.
    pub fn observe_decode(&mut self, tokens: u64, decode: Duration) {
        if tokens < MIN_DECODED {
            return;
        }
        let us = u64::try_from(decode.as_micros()).unwrap_or(u64::MAX) / (tokens - 1);
        self.tpot_median = push(&mut self.tpot_us, us, 0.5);
    }

    /// The engine had finished `completed` requests in all at `now_ms`
    /// (called about once a second).
    pub fn tick(&mut self, now_ms: u64, completed: u64) {
        let was_warm = self.warm();
        let (since, first) = *self.watched_since.get_or_insert((now_ms, completed));
        if let Some((at, count)) = self.last {
            let dt = now_ms.saturating_sub(at);
            if dt == 0 {
                return;
            }
            let now_rate = completed.saturating_sub(count) as f64 * 1_000.0 / dt as f64;
            let alpha = 1.0 - (-(dt as f64) / RATE_TAU_MS).exp();
            self.rate += alpha * (now_rate - self.rate);
        }
        self.last = Some((now_ms, completed));
        if !was_warm && self.warm() {
            // The smoothing started from nothing: it begins at the mean
            // rate over the warm-up instead.
            let watched = now_ms.saturating_sub(since).max(1) as f64;
            self.rate = completed.saturating_sub(first) as f64 * 1_000.0 / watched;
        }
    }

    /// Watched long enough, and long enough for answers to come back.
    fn warm(&self) -> bool {
        match (self.watched_since, self.last) {
            (Some((since, first)), Some((at, count))) => {
                at.saturating_sub(since) >= RATE_WARMUP_MS
                    && count.saturating_sub(first) >= RATE_WARMUP_COMPLETIONS
            }
            _ => false,
        }
    }

    pub fn speed(&self) -> EngineSpeed {
        let watched = self.warm();
        EngineSpeed {
            prefill_us: self.prefill_median,
            tpot_us: self.tpot_median,
            completions_per_s: watched.then_some(self.rate as f32),
            prefill_us_at_least: None,
        }
    }

    /// Forgets everything (the engine behind the address restarted).
    pub fn reset(&mut self) {
        *self = SpeedLearner::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_slow_engine_is_known_by_its_first_tokens() {
        let mut fast = SpeedLearner::default();
        let mut slow = SpeedLearner::default();
        for _ in 0..MIN_SAMPLES {
            fast.observe_first_token(4_000, 0, ms(200)); // 50 µs a token
            slow.observe_first_token(4_000, 0, ms(500)); // 125 µs a token
        }
        assert_eq!(fast.speed().prefill_us, Some(50.0));
        assert_eq!(slow.speed().prefill_us, Some(125.0));
    }

    #[test]
    fn the_backlog_ahead_counts_half_and_short_prompts_are_no_samples() {
        let mut l = SpeedLearner::default();
        // 2,000 new tokens behind 4,000 of others' cold prompts: 4,000 of
        // work in 200 ms.
        for _ in 0..MIN_SAMPLES {
            l.observe_first_token(2_000, 4_000, ms(200));
        }
        assert_eq!(l.speed().prefill_us, Some(50.0));
        // A short prompt's time is the engine's fixed cost: not a sample.
        let mut short = SpeedLearner::default();
        for _ in 0..MIN_SAMPLES {
            short.observe_first_token(100, 0, ms(200));
        }
        assert_eq!(short.speed().prefill_us, None);
        // Control: the same count of long prompts is.
        short.observe_first_token(1_000, 0, ms(50));
        short.observe_first_token(1_000, 0, ms(50));
        short.observe_first_token(1_000, 0, ms(50));
        assert_eq!(short.speed().prefill_us, Some(50.0));
    }

    #[test]
    fn decode_speed_is_per_token_after_the_first() {
        let mut l = SpeedLearner::default();
        for _ in 0..MIN_SAMPLES {
            l.observe_decode(101, ms(2_000)); // 100 intervals of 20 ms
            l.observe_decode(2, ms(500)); // too short to say
        }
        assert_eq!(l.speed().tpot_us, Some(20_000.0));
    }

    #[test]
    fn the_completion_rate_follows_the_engine_after_a_warm_up() {
        let mut l = SpeedLearner::default();
        let mut done = 0;
        l.tick(0, done);
        assert_eq!(l.speed().completions_per_s, None);
        // Long first turns: nothing finished for five seconds is no rate.
        for s in 1..=5 {
            l.tick(s * 1_000, done);
        }
        assert_eq!(l.speed().completions_per_s, None, "no answer back yet");
        // Ten completions a second for a minute.
        for s in 6..=65 {
            done += 10;
            l.tick(s * 1_000, done);
        }
        let rate = l.speed().completions_per_s.expect("watched long enough");
        assert!((rate - 10.0).abs() < 0.1, "{rate}");
        // The engine stalls: the rate falls within seconds, not at once.
        l.tick(66_000, done);
        let after_one = l.speed().completions_per_s.expect("rate");
        assert!(after_one > 7.0 && after_one < 9.5, "{after_one}");
        for s in 67..=85 {
            l.tick(s * 1_000, done);
        }
        assert!(l.speed().completions_per_s.expect("rate") < 0.5);
        l.reset();
        assert_eq!(l.speed(), EngineSpeed::default());
    }

    #[test]
    fn prompts_crowded_together_do_not_make_an_engine_look_slow() {
        let mut l = SpeedLearner::default();
        // A burst: most first tokens waited for prompts placed after them
        // (4x the engine's 50 µs a token); a third were alone.
        for i in 0..24 {
            let ms = if i % 3 == 0 { 200 } else { 800 };
            l.observe_first_token(4_000, 0, Duration::from_millis(ms));
        }
        assert_eq!(l.speed().prefill_us, Some(50.0));
        // Control: when most are alone, the crowded ones move nothing.
        let mut calm = SpeedLearner::default();
        for i in 0..24 {
            let ms = if i % 3 == 0 { 800 } else { 200 };
            calm.observe_first_token(4_000, 0, Duration::from_millis(ms));
        }
        assert_eq!(calm.speed().prefill_us, Some(50.0));
    }
}
