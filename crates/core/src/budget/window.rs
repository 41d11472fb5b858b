//! A sliding one-minute window of counts (tokens or requests), in one-second
//! buckets, clock-injected: every call takes the time in milliseconds.
//!
//! Sixty buckets rather than a log of every event: a tenant sending
//! thousands of requests a minute costs the same 60 counters, and the
//! window is exact to within the second the oldest bucket spans (under 2 %
//! of a minute, inside the 5 % aim for a limit).
//! A bucket keeps what was charged in its second, so a request reconciled
//! when it ends adjusts the second it was charged in, as long as that
//! second is still in the window: a long stream's tokens slide out when
//! its admission does, not a minute after it ended.

/// Buckets in the window, one per second.
pub const WINDOW_SECONDS: u64 = 60;
const SLOTS: usize = WINDOW_SECONDS as usize;
pub const WINDOW_MS: u64 = WINDOW_SECONDS * 1000;

#[derive(Debug, Clone)]
pub struct SlidingWindow {
    slots: [u64; SLOTS],
    /// The second (since the clock's epoch) of the newest bucket written.
    newest: u64,
}

impl Default for SlidingWindow {
    fn default() -> Self {
        SlidingWindow {
            slots: [0; SLOTS],
            newest: 0,
        }
    }
}

fn second(ms: u64) -> u64 {
    ms / 1000
}

fn slot(second: u64) -> usize {
    (second % WINDOW_SECONDS) as usize
}

impl SlidingWindow {
    /// Empties the buckets of the seconds between the newest written and
    /// `now_ms`'s (they are the ones the window has slid past).
    fn advance(&mut self, now_ms: u64) {
        let now = second(now_ms);
        if now <= self.newest {
            return;
        }
        let gap = (now - self.newest).min(WINDOW_SECONDS);
        for s in (now + 1 - gap)..=now {
            self.slots[slot(s)] = 0;
        }
        self.newest = now;
    }

    /// Whether `at_ms`'s bucket is still in the window at `now_ms`.
    fn holds(&self, at_ms: u64, now_ms: u64) -> bool {
        let (at, now) = (second(at_ms), second(now_ms));
        at <= now && now - at < WINDOW_SECONDS
    }

    /// The count over the last minute.
    pub fn used(&mut self, now_ms: u64) -> u64 {
        self.advance(now_ms);
        self.slots
            .iter()
            .fold(0u64, |sum, n| sum.saturating_add(*n))
    }

    pub fn add(&mut self, now_ms: u64, n: u64) {
        self.advance(now_ms);
        let s = &mut self.slots[slot(second(now_ms))];
        *s = s.saturating_add(n);
    }

    /// Moves what was charged at `at_ms` by `delta`: in its own bucket
    /// while that is in the window (never below zero), else, for more, in
    /// the current one (less than an expired charge has nothing to give
    /// back).
    pub fn adjust(&mut self, at_ms: u64, now_ms: u64, delta: i64) {
        self.advance(now_ms);
        if self.holds(at_ms, now_ms) {
            let s = &mut self.slots[slot(second(at_ms))];
            *s = s.saturating_add_signed(delta);
        } else if delta > 0 {
            self.add(now_ms, delta.unsigned_abs());
        }
    }

    /// Milliseconds from `now_ms` until the window's count has fallen to
    /// `target` or below, as its oldest buckets slide out (0 when it
    /// already has).
    pub fn until_at_most(&mut self, now_ms: u64, target: u64) -> u64 {
        let mut left = self.used(now_ms);
        if left <= target {
            return 0;
        }
        let now = second(now_ms);
        // Oldest second first: `now - 59` leaves the window first.
        for age in (0..WINDOW_SECONDS).rev() {
            let Some(s) = now.checked_sub(age) else {
                continue;
            };
            left = left.saturating_sub(self.slots[slot(s)]);
            if left <= target {
                let leaves_at = (s + WINDOW_SECONDS) * 1000;
                return leaves_at.saturating_sub(now_ms);
            }
        }
        WINDOW_MS
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_count_stays_a_minute_then_slides_out() {
        let mut w = SlidingWindow::default();
        w.add(1_000, 10);
        w.add(30_500, 5);
        assert_eq!(w.used(60_999), 15, "both still in the minute");
        assert_eq!(w.used(61_000), 5, "the first one's second has left");
        assert_eq!(w.used(90_000), 0);
        // Control: nothing written, nothing counted, however far the clock goes.
        let mut idle = SlidingWindow::default();
        assert_eq!(idle.used(1_000_000), 0);
    }

    #[test]
    fn a_long_gap_empties_every_bucket() {
        let mut w = SlidingWindow::default();
        for s in 0..60 {
            w.add(s * 1000, 1);
        }
        assert_eq!(w.used(59_000), 60);
        assert_eq!(w.used(59_000 + 3_600_000), 0);
        w.add(59_000 + 3_600_000, 2);
        assert_eq!(w.used(59_000 + 3_600_000), 2);
    }

    #[test]
    fn an_adjustment_lands_in_the_charged_second_while_it_is_in_the_window() {
        let mut w = SlidingWindow::default();
        w.add(10_000, 100);
        w.adjust(10_000, 40_000, -60);
        assert_eq!(w.used(40_000), 40);
        // It slides out with its admission's second, not the end's.
        assert_eq!(w.used(70_000), 0);
        // Control: an adjustment after the charge left the window adds only more.
        let mut late = SlidingWindow::default();
        late.add(10_000, 100);
        late.adjust(10_000, 80_000, -60);
        assert_eq!(late.used(80_000), 0);
        late.adjust(10_000, 80_000, 25);
        assert_eq!(late.used(80_000), 25);
    }

    #[test]
    fn a_bucket_never_goes_below_zero() {
        let mut w = SlidingWindow::default();
        w.add(5_000, 10);
        w.add(6_000, 10);
        w.adjust(5_000, 7_000, -50);
        assert_eq!(w.used(7_000), 10, "the other second's count is untouched");
    }

    #[test]
    fn the_wait_is_until_enough_old_buckets_have_left() {
        let mut w = SlidingWindow::default();
        w.add(0, 50);
        w.add(20_000, 30);
        w.add(40_000, 20);
        // At 45 s: 100 in the window. Down to 50 once second 0 leaves (60 s),
        // to 20 once second 20 leaves (80 s).
        assert_eq!(w.until_at_most(45_000, 50), 15_000);
        assert_eq!(w.until_at_most(45_000, 20), 35_000);
        assert_eq!(w.until_at_most(45_000, 0), 55_000);
        // Control: already low enough, no wait.
        assert_eq!(w.until_at_most(45_000, 100), 0);
    }
}
