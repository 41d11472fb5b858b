//! Priority classes at the load gates: the lowest class present is refused
//! first. Each request's class (its rank, 0 the highest) is noted as seen;
//! a tripped gate refuses a request of the lowest class seen in the last
//! [`PRESENCE_MS`] at its limit, and each class above it only once the
//! gate is [`LINE_STEP`] further past the limit per class between them.
//! With one class present it is the lowest, and the gate is as before.
//! The session-priority grading applies after, inside a class.

use std::sync::atomic::{AtomicU64, Ordering};

/// Ranks kept apart; a lower class than the last is counted as the last.
pub const MAX_CLASSES: usize = 8;
/// How long a class counts as present after its last request.
pub const PRESENCE_MS: u64 = 10_000;
/// How much further past its limit (as a pressure, 1.0 the limit) a gate
/// must be to refuse a class one step above the lowest present.
pub const LINE_STEP: f64 = 0.25;

/// When each class's last request was judged (milliseconds + 1; 0 never).
#[derive(Debug, Default)]
pub struct ClassPresence {
    seen: [AtomicU64; MAX_CLASSES],
}

impl ClassPresence {
    pub fn seen(&self, rank: usize, now_ms: u64) {
        self.seen[rank.min(MAX_CLASSES - 1)].store(now_ms.saturating_add(1), Ordering::Relaxed);
    }

    /// The lowest class (highest rank) with a request in the last
    /// [`PRESENCE_MS`].
    pub fn lowest_present(&self, now_ms: u64) -> Option<usize> {
        self.seen.iter().rposition(|at| {
            let at = at.load(Ordering::Relaxed);
            at > 0 && now_ms.saturating_sub(at - 1) < PRESENCE_MS
        })
    }

    /// The line (1.0: the limit) past which a gate refuses class `rank`.
    pub fn line(&self, rank: usize, now_ms: u64) -> f64 {
        let rank = rank.min(MAX_CLASSES - 1);
        let above = self
            .lowest_present(now_ms)
            .map_or(0, |lowest| lowest.saturating_sub(rank));
        1.0 + LINE_STEP * above as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_above_the_lowest_present_have_a_higher_line() {
        let p = ClassPresence::default();
        p.seen(0, 1_000);
        assert_eq!(p.line(0, 1_000), 1.0, "alone, interactive is the lowest");
        p.seen(2, 2_000);
        assert_eq!(p.lowest_present(2_000), Some(2));
        assert_eq!(p.line(0, 2_000), 1.5);
        assert_eq!(p.line(1, 2_000), 1.25);
        assert_eq!(p.line(2, 2_000), 1.0);
        // Batch gone for PRESENCE_MS: interactive is the lowest again.
        assert_eq!(p.line(0, 2_000 + PRESENCE_MS), 1.0);
    }
}
