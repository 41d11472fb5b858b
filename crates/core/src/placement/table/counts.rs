//! What live sessions add to their peer's counts: when a binding counts as
//! live (`LiveRule`), one session's share (`Share`) and a peer's sums
//! (`LiveCounts`), apart from the table code that keeps them (`live.rs`).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};

use super::binding::Binding;
use crate::placement::{Bound, WHOLE};

/// When a session counts as live on its peer, in ticks.
#[derive(Debug, Clone, Copy)]
pub(super) struct LiveRule {
    /// Before its first answer: the configured window since the turn began.
    pub(super) configured_ticks: u64,
    /// After an answer: the configured window, or the learned one if shorter.
    pub(super) after_answer_ticks: u64,
    /// A turn in flight holds its KV however long it runs; the idle timeout
    /// bounds one whose end was never seen.
    pub(super) in_flight_ticks: u64,
}

impl LiveRule {
    /// Whether `binding` left the live window after an answer between the
    /// two ticks (after `from`, up to `to`): its session ended then.
    pub(super) fn left_between(&self, binding: &Binding, from: u32, to: u32) -> bool {
        match binding.answered_at() {
            Some(answered) if !binding.in_flight() => {
                let left = u64::from(answered).saturating_add(self.after_answer_ticks);
                u64::from(from) < left && left <= u64::from(to)
            }
            _ => false,
        }
    }

    pub(super) fn holds(&self, binding: &Binding, now: u32) -> bool {
        let since = |t: u32| u64::from(now.saturating_sub(t));
        match binding.answered_at() {
            Some(answered) if !binding.in_flight() => since(answered) < self.after_answer_ticks,
            Some(_) => since(binding.last_seen) < self.in_flight_ticks,
            None => since(binding.last_seen) < self.configured_ticks,
        }
    }
}

/// A peer's [`Bound`], in atomics: placements add to it as they go, the
/// recount stores it whole.
#[derive(Debug, Default)]
pub(super) struct LiveCounts {
    pub(super) sessions: AtomicU32,
    pub(super) returning_milli: AtomicU64,
    pub(super) tokens: AtomicU64,
    pub(super) returning_tokens: AtomicU64,
    pub(super) projected_tokens: AtomicU64,
}

impl LiveCounts {
    pub(super) fn load(&self) -> Bound {
        Bound {
            sessions: self.sessions.load(Relaxed),
            returning_milli: self.returning_milli.load(Relaxed),
            tokens: self.tokens.load(Relaxed),
            returning_tokens: self.returning_tokens.load(Relaxed),
            projected_tokens: self.projected_tokens.load(Relaxed),
        }
    }

    pub(super) fn store(&self, bound: Bound) {
        self.sessions.store(bound.sessions, Relaxed);
        self.returning_milli.store(bound.returning_milli, Relaxed);
        self.tokens.store(bound.tokens, Relaxed);
        self.returning_tokens.store(bound.returning_tokens, Relaxed);
        self.projected_tokens.store(bound.projected_tokens, Relaxed);
    }

    /// Replaces one session's `was` share with `is` (racing placements
    /// may interleave; the recount corrects any drift every second).
    pub(super) fn change(&self, was: Share, is: Share) {
        let shift = |c: &AtomicU64, was: u64, is: u64| {
            if was != is {
                let _ = c.fetch_update(Relaxed, Relaxed, |n| {
                    Some(n.saturating_add(is).saturating_sub(was))
                });
            }
        };
        if was.sessions != is.sessions {
            let _ = self.sessions.fetch_update(Relaxed, Relaxed, |n| {
                Some(n.saturating_add(is.sessions).saturating_sub(was.sessions))
            });
        }
        let milli = |s: Share| u64::from(s.returning_milli);
        shift(&self.returning_milli, milli(was), milli(is));
        let tokens = |s: Share| u64::from(s.tokens);
        shift(&self.tokens, tokens(was), tokens(is));
        shift(
            &self.returning_tokens,
            was.returning_tokens(),
            is.returning_tokens(),
        );
        shift(
            &self.projected_tokens,
            was.returning(was.projected),
            is.returning(is.projected),
        );
    }
}

/// What one session adds to its peer's [`Bound`]; all zero when it is not live.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Share {
    pub(super) sessions: u32,
    /// Its chance of coming back, in thousandths (see `live_share`).
    pub(super) returning_milli: u32,
    pub(super) tokens: u32,
    /// The size it is expected to grow to: its own, or the route's typical
    /// session when that is more.
    pub(super) projected: u32,
}

impl Share {
    pub(super) fn returning(&self, tokens: u32) -> u64 {
        u64::from(tokens) * u64::from(self.returning_milli) / u64::from(WHOLE)
    }

    pub(super) fn returning_tokens(&self) -> u64 {
        self.returning(self.tokens)
    }

    pub(super) fn add_to(&self, bound: &mut Bound) {
        bound.sessions = bound.sessions.saturating_add(self.sessions);
        bound.returning_milli += u64::from(self.returning_milli);
        bound.tokens += u64::from(self.tokens);
        bound.returning_tokens += self.returning_tokens();
        bound.projected_tokens += self.returning(self.projected);
    }
}
