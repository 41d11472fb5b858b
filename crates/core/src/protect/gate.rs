//! The load gates' bookkeeping, pure: which gate refused (`Gate`), the
//! counts per gate, and the probe budget that lets a few requests through a tripped
//! gate each window so the EWMA can see the engine recover (a gate that
//! refused everything would never measure again and never reopen).

use parking_lot::Mutex;

/// Up to `probes` requests per `window_ms` pass a tripped gate.
#[derive(Debug, Default)]
pub struct ProbeBudget {
    /// (start of the current window, probes used in it); no window before
    /// the first probe.
    state: Mutex<Option<(u64, u32)>>,
}

impl ProbeBudget {
    /// Probes taken in the current window (0 once it has passed).
    pub fn used(&self, now_ms: u64, window_ms: u64) -> u32 {
        match *self.state.lock() {
            Some((start, used)) if now_ms.saturating_sub(start) < window_ms.max(1) => used,
            _ => 0,
        }
    }

    /// Takes a probe slot if the current window has one left.
    pub fn take(&self, now_ms: u64, window_ms: u64, probes: u32) -> bool {
        let mut state = self.state.lock();
        let (start, used) = match *state {
            Some((start, used)) if now_ms.saturating_sub(start) < window_ms.max(1) => (start, used),
            _ => (now_ms, 0),
        };
        let granted = used < probes;
        *state = Some((start, used + u32::from(granted)));
        granted
    }
}

/// Why a load-based (or content) 429 happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    Concurrency,
    Ttft,
    Tps,
    Rule,
    /// A concurrency refusal that only session priority's share caused: the
    /// plain limit had room, the bucket's ceiling had none.
    SessionPrio,
}

impl Gate {
    pub const ALL: [Gate; 5] = [
        Gate::Concurrency,
        Gate::Ttft,
        Gate::Tps,
        Gate::Rule,
        Gate::SessionPrio,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Gate::Concurrency => "concurrency",
            Gate::Ttft => "ttft",
            Gate::Tps => "tps",
            Gate::Rule => "rule",
            Gate::SessionPrio => "session_prio",
        }
    }
}

/// Counts per gate: real refusals, or the trips a switched-off gate let
/// through.
#[derive(Debug, Default)]
pub struct GateCounts([std::sync::atomic::AtomicU64; 5]);

impl GateCounts {
    pub fn add(&self, gate: Gate) {
        self.0[gate as usize].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn get(&self, gate: Gate) -> u64 {
        self.0[gate as usize].load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn total(&self) -> u64 {
        Gate::ALL.iter().map(|&g| self.get(g)).sum()
    }

    pub fn reset(&self) {
        for c in &self.0 {
            c.store(0, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn five_probes_per_window_then_the_next_window_gives_five_more() {
        let b = ProbeBudget::default();
        let passed = (0..12).filter(|i| b.take(1_000 + i, 10_000, 5)).count();
        assert_eq!(passed, 5);
        assert!(!b.take(10_999, 10_000, 5));
        assert!(b.take(11_000, 10_000, 5), "a new window");
    }
}
