//! Each cell against the scenario's best peer: which cell that is, and
//! the ratios both reports print.

use crate::options::REFERENCE;
use crate::result::{ModeResult, MAX_ERROR_RATE};

/// A cell against the scenario's best peer.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct VsBest {
    /// TTFT p95 and p99 over the best peer's (below 1 is better).
    pub p95: Option<f64>,
    pub p99: Option<f64>,
    /// Cache hit minus the best peer's, in percentage points.
    pub hit_points: Option<f64>,
    /// Output tok/s over the best peer's.
    pub tok_s: Option<f64>,
}

/// The best peer of a scenario's cells: the lowest TTFT p95 among the peer
/// cells and the reference cell (the client-side sticky router, a peer
/// that needs no proxy). A cell without a p95 has no claim, nor, where
/// errors are not the scenario's point, one with more errors than the run
/// tolerates: a peer that fails requests can look fast on the rest.
pub fn best_peer(cells: &[ModeResult], errors_expected: bool) -> Option<usize> {
    cells
        .iter()
        .enumerate()
        .filter(|(_, c)| c.peer || c.mode == REFERENCE)
        .filter(|(_, c)| errors_expected || c.error_rate() <= MAX_ERROR_RATE)
        .filter_map(|(i, c)| c.ttft_p95.map(|p| (i, p)))
        // The first of equals: the order the cells ran in breaks ties.
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(i, _)| i)
}

pub fn vs_best(c: &ModeResult, best: &ModeResult) -> VsBest {
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    };
    VsBest {
        p95: ratio(c.ttft_p95, best.ttft_p95),
        p99: ratio(c.ttft_p99, best.ttft_p99),
        hit_points: c
            .cache_hit
            .zip(best.cache_hit)
            .map(|(a, b)| (a - b) * 100.0),
        tok_s: ratio(Some(c.output_tok_s), Some(best.output_tok_s)),
    }
}
