//! The learned think-gap statistics of a route's sessions.

use std::sync::atomic::{AtomicU32, Ordering::Relaxed};

use crate::placement::WHOLE;

/// How long sessions of this route stay away between an answer and their
/// next turn, as a histogram of recent gaps. A session that ended never
/// comes back, yet a fixed live window keeps counting it for the whole
/// window: on the overload bench a session ends every ~2 s, so a 10 s
/// window counted ~5 ended sessions of up to 60k tokens each against the
/// KV that admission and the over-KV check see. A
/// window of twice the 90th percentile of real gaps lets an ended session
/// go within a few seconds and still keeps one that is thinking. The same
/// gaps, with the answers never followed by one, give a session inside the
/// window its chance of coming back (`returning_milli`).
#[derive(Debug, Default)]
pub(super) struct ThinkGaps {
    counts: [AtomicU32; GAP_BUCKETS.len()],
    samples: AtomicU32,
    /// The learned window in ticks; 0 until enough gaps were seen.
    window_ticks: AtomicU32,
    /// Answers given, decayed with `counts`: those never followed by a gap
    /// are the sessions that ended.
    answers: AtomicU32,
    /// Per gap bucket, the chance (thousandths) that a session idle for a
    /// time in that bucket since its answer comes back (see `update`).
    /// Valid while `window_ticks` is set.
    returning_milli: [AtomicU32; GAP_BUCKETS.len()],
}

/// Upper bounds (ticks of 100 ms) of the gap buckets; the last is open.
const GAP_BUCKETS: [u32; 16] = [
    1,
    2,
    3,
    5,
    7,
    10,
    15,
    20,
    30,
    50,
    70,
    100,
    150,
    200,
    300,
    u32::MAX,
];
/// Gaps before the learned window is used; halved each time it is reached,
/// so the histogram follows the clients as they change.
const GAP_SAMPLES: u32 = 256;
/// Shortest learned window: one second, ten ticks.
const MIN_WINDOW_TICKS: u32 = 10;

impl ThinkGaps {
    pub(super) fn record(&self, gap_ticks: u32) {
        let bucket = GAP_BUCKETS
            .iter()
            .position(|&bound| gap_ticks <= bound)
            .unwrap_or(GAP_BUCKETS.len() - 1);
        self.counts[bucket].fetch_add(1, Relaxed);
        if self.samples.fetch_add(1, Relaxed) + 1 >= 2 * GAP_SAMPLES {
            // Decay: older gaps and answers weigh half. Racing recorders may
            // each halve; every halving covers gaps and answers alike, and
            // only their proportions are read.
            for c in self.counts.iter().chain([&self.answers]) {
                let _ = c.fetch_update(Relaxed, Relaxed, |n| Some(n / 2));
            }
            self.samples.store(GAP_SAMPLES, Relaxed);
        }
    }

    /// Recomputes the window from the histogram (the sweeper, every second).
    pub(super) fn update(&self) {
        let counts: Vec<u32> = self.counts.iter().map(|c| c.load(Relaxed)).collect();
        let total: u64 = counts.iter().map(|&c| u64::from(c)).sum();
        if total < u64::from(GAP_SAMPLES) {
            return;
        }
        let mut seen = 0u64;
        let p90 = counts
            .iter()
            .zip(GAP_BUCKETS)
            .find_map(|(&c, bound)| {
                seen += u64::from(c);
                (seen * 10 >= total * 9).then_some(bound)
            })
            .unwrap_or(u32::MAX);
        let window = p90.saturating_mul(2).max(MIN_WINDOW_TICKS);
        // Of the answers, `total` were followed by a gap and `ended` were
        // not. A session idle for x came back later with weight
        // `total * S(x)` (S: the share of gaps longer than x) or ended with
        // weight `ended`, so it comes back with chance
        // total*S(x) / (total*S(x) + ended). Where x falls inside a bucket
        // half of that bucket's gaps count as longer (2 * total * S(x) =
        // 2 * longer + in_bucket), as the histogram does not say where in
        // the bucket they fell. Answers still inside their think time count
        // as ended until their gap is recorded: a bias towards "gone" of
        // the sessions thinking now against the hundreds of answers counted.
        let ended = u64::from(self.answers.load(Relaxed)).saturating_sub(total);
        let mut longer = total;
        for (chance, &c) in self.returning_milli.iter().zip(&counts) {
            longer -= u64::from(c);
            let back = longer * 2 + u64::from(c);
            let milli = (back * u64::from(WHOLE))
                .checked_div(back + 2 * ended)
                .map_or(WHOLE, |m| u32::try_from(m).unwrap_or(WHOLE));
            chance.store(milli, Relaxed);
        }
        self.window_ticks.store(window, Relaxed);
    }

    pub(super) fn record_answer(&self) {
        self.answers.fetch_add(1, Relaxed);
    }

    /// The chance (thousandths) that a session idle for `idle_ticks` since
    /// its answer comes back: whole until the gaps are learned.
    pub(super) fn returning_milli(&self, idle_ticks: u32) -> u32 {
        if self.window().is_none() {
            return WHOLE;
        }
        let bucket = GAP_BUCKETS
            .iter()
            .position(|&bound| idle_ticks <= bound)
            .unwrap_or(GAP_BUCKETS.len() - 1);
        self.returning_milli[bucket].load(Relaxed)
    }

    /// The learned window in ticks, if there is one.
    pub(super) fn window(&self) -> Option<u32> {
        Some(self.window_ticks.load(Relaxed)).filter(|&w| w > 0)
    }
}
