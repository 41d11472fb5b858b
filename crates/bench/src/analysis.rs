//! What a cell's own request records say beyond latency: how much it
//! prefilled against what a perfect prefix cache would have, and how evenly
//! sessions (and their context) were bound to engines over time. Pure, so
//! every mode, the reference cell included, is judged by the same code from
//! the same kind of records.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::record::Record;

/// Prompt tokens the engines computed, against the fewest a perfect prefix
/// cache (one that forgets nothing and is shared by every engine) would have.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefillBound {
    /// Σ (prompt - cached) of the counted requests.
    pub prefilled: u64,
    /// Σ of what each of them had new: see [`prefill_bound`].
    pub bound: u64,
}

impl PrefillBound {
    /// prefilled / bound: 1.0 is a perfect cache; the excess is re-prefill.
    pub fn ratio(&self) -> Option<f64> {
        (self.bound > 0).then(|| self.prefilled as f64 / self.bound as f64)
    }
}

/// Over the successful requests for which `counted` holds: a turn's bound
/// is its prompt minus the previous successful turn of the same session
/// (prompt + completion: the whole history it re-sends), that is only the
/// new user message and the role tokens around it. A session's first turn
/// in the records has all of its prompt new except the shared system
/// prompt, which only the cell's first request has to compute (a perfect
/// cache shares it from then on, even with requests already in flight).
/// The simulated engine caches prompts only, in whole blocks, so even a
/// perfectly sticky cell sits a little above the bound: it re-prefills the
/// last reply and a partial block every turn. Only a retried turn can beat
/// its bound, when the failed attempt had already been prefilled where the
/// retry lands (the records do not say how far a failed attempt got).
pub fn prefill_bound(
    records: &[Record],
    system_tokens: u64,
    counted: impl Fn(&Record) -> bool,
) -> PrefillBound {
    let mut ok: Vec<&Record> = records
        .iter()
        .filter(|r| r.ok && r.usage.is_some())
        .collect();
    ok.sort_by_key(|r| (r.slot, r.generation, r.start));
    let first_start = ok.iter().map(|r| r.start).min();
    let mut out = PrefillBound::default();
    let mut prev: Option<&Record> = None;
    for r in ok {
        let Some(u) = r.usage else { continue };
        let same_session = prev.is_some_and(|p| (p.slot, p.generation) == (r.slot, r.generation));
        let known = match prev.and_then(|p| p.usage).filter(|_| same_session) {
            Some(p) => p.prompt_tokens + p.completion_tokens,
            None if first_start.is_some_and(|s| s < r.start) => system_tokens,
            None => 0,
        };
        if counted(r) {
            out.prefilled += u.prompt_tokens.saturating_sub(u.cached_tokens);
            out.bound += u.prompt_tokens.saturating_sub(known);
        }
        prev = Some(r);
    }
    out
}

/// What one engine holds at one moment, as the client saw it: the live
/// sessions whose last turn went there, and their context (that turn's
/// prompt + completion).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Bound {
    pub sessions: u32,
    pub tokens: u64,
}

/// Per time in `times` (offsets from the cell's start), per engine, what
/// was bound there. A slot's session is live from its first request until
/// the slot starts the next session; it is bound to the engine of its last
/// successful turn started by then (placement happens at the start).
pub fn bindings(records: &[Record], engines: usize, times: &[Duration]) -> Vec<Vec<Bound>> {
    let mut slots: BTreeMap<u32, Vec<&Record>> = BTreeMap::new();
    for r in records.iter().filter(|r| !r.cut) {
        slots.entry(r.slot).or_default().push(r);
    }
    for v in slots.values_mut() {
        v.sort_by_key(|r| r.start);
    }
    times
        .iter()
        .map(|&t| {
            let mut per_engine = vec![Bound::default(); engines];
            for recs in slots.values() {
                let started = recs.partition_point(|r| r.start <= t);
                let Some(current) = started.checked_sub(1).map(|i| recs[i]) else {
                    continue;
                };
                let last_ok = recs[..started]
                    .iter()
                    .rev()
                    .take_while(|r| r.generation == current.generation)
                    .find(|r| r.ok && r.engine.is_some());
                if let Some(r) = last_ok {
                    if let Some(b) = r.engine.and_then(|e| per_engine.get_mut(e)) {
                        b.sessions += 1;
                        b.tokens += r.usage.map_or(0, |u| u.prompt_tokens + u.completion_tokens);
                    }
                }
            }
            per_engine
        })
        .collect()
}

/// How uneven a per-engine quantity was: at each sample its minimum and
/// maximum over engines; here their means over the samples and the
/// extremes over all samples.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spread {
    pub min_mean: f64,
    pub max_mean: f64,
    pub min: f64,
    pub max: f64,
}

pub fn spread(samples: &[Vec<f64>]) -> Option<Spread> {
    let mut n = 0usize;
    let (mut min_sum, mut max_sum) = (0.0, 0.0);
    let (mut min, mut max) = (f64::INFINITY, f64::NEG_INFINITY);
    for s in samples.iter().filter(|s| !s.is_empty()) {
        let lo = s.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        n += 1;
        min_sum += lo;
        max_sum += hi;
        min = min.min(lo);
        max = max.max(hi);
    }
    (n > 0).then(|| Spread {
        min_mean: min_sum / n as f64,
        max_mean: max_sum / n as f64,
        min,
        max,
    })
}

/// The engine index of a peer name from the generated route (`e0`, `e1`, ...).
pub fn engine_index(peer: &str) -> Option<usize> {
    peer.strip_prefix('e')?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::Usage;

    fn s(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    /// An ok request of session (slot, generation) on `engine`.
    fn rec(slot: u32, generation: u32, start: u64, engine: usize, u: (u64, u64, u64)) -> Record {
        Record {
            slot,
            generation,
            start: s(start),
            end: s(start + 1),
            ok: true,
            engine: Some(engine),
            peer: Some(format!("e{engine}")),
            usage: Some(Usage {
                prompt_tokens: u.0,
                cached_tokens: u.1,
                completion_tokens: u.2,
            }),
            ..Record::default()
        }
    }

    #[test]
    fn bound_counts_only_each_turns_new_suffix() {
        let records = vec![
            // Session (0, 0): 1000 prompt (500 of it system), 100 back; then
            // 1300 = 1100 known + 200 new; then 1600 = 1400 + 200.
            rec(0, 0, 0, 0, (1000, 0, 100)),
            rec(0, 0, 2, 0, (1300, 1000, 100)),
            rec(0, 0, 4, 1, (1600, 0, 100)),
            // A failed retry carries no usage and changes nothing.
            Record {
                slot: 0,
                generation: 0,
                start: s(3),
                ok: false,
                ..Record::default()
            },
            // Session (1, 0) starts after the first request: only its system
            // prompt is known.
            rec(1, 0, 3, 1, (700, 500, 50)),
        ];
        let all = prefill_bound(&records, 500, |_| true);
        // prefilled: 1000 + 300 + 1600 + 200; bound: 1000 + 200 + 200 + 200.
        assert_eq!(
            all,
            PrefillBound {
                prefilled: 3100,
                bound: 1600
            }
        );
        assert!((all.ratio().unwrap() - 3100.0 / 1600.0).abs() < 1e-9);
        // Counting only later requests still uses earlier ones as history.
        let late = prefill_bound(&records, 500, |r| r.start >= s(3));
        assert_eq!(
            late,
            PrefillBound {
                prefilled: 1800,
                bound: 400
            }
        );
        assert_eq!(PrefillBound::default().ratio(), None);
    }

    #[test]
    fn the_system_prompt_is_new_only_to_the_first_request() {
        // Both open the cell cold; the second, in flight before the first
        // ended, still shares the system prompt in a perfect cache.
        let records = vec![
            rec(0, 0, 0, 0, (3000, 0, 100)),
            Record {
                start: Duration::from_millis(500),
                ..rec(1, 0, 0, 1, (4000, 2000, 100))
            },
        ];
        let b = prefill_bound(&records, 2000, |_| true);
        assert_eq!((b.prefilled, b.bound), (5000, 5000));
    }

    #[test]
    fn bindings_follow_the_last_turn_and_end_with_the_session() {
        let records = vec![
            rec(0, 0, 0, 0, (100, 0, 10)),
            rec(0, 0, 5, 1, (200, 0, 10)),
            // Slot 0 starts its next session at 8; its first turn fails.
            Record {
                slot: 0,
                generation: 1,
                start: s(8),
                ..Record::default()
            },
            rec(0, 1, 9, 0, (50, 0, 5)),
            rec(1, 0, 1, 0, (300, 0, 30)),
        ];
        let times = [s(0), s(2), s(6), s(8), s(10)];
        let b = bindings(&records, 2, &times);
        let at =
            |i: usize| -> Vec<(u32, u64)> { b[i].iter().map(|x| (x.sessions, x.tokens)).collect() };
        assert_eq!(at(0), vec![(1, 110), (0, 0)]);
        assert_eq!(at(1), vec![(2, 440), (0, 0)]);
        // Slot 0's session moved to e1.
        assert_eq!(at(2), vec![(1, 330), (1, 210)]);
        // Its next session is not bound anywhere until a turn succeeds.
        assert_eq!(at(3), vec![(1, 330), (0, 0)]);
        assert_eq!(at(4), vec![(2, 385), (0, 0)]);
    }

    #[test]
    fn spread_is_min_and_max_over_engines_then_over_time() {
        let samples = vec![vec![1.0, 3.0, 2.0], vec![2.0, 2.0, 2.0], vec![]];
        let sp = spread(&samples).unwrap();
        assert_eq!((sp.min_mean, sp.max_mean), (1.5, 2.5));
        assert_eq!((sp.min, sp.max), (1.0, 3.0));
        assert_eq!(spread(&[]), None);
    }

    #[test]
    fn peer_names_map_to_engine_indices() {
        assert_eq!(engine_index("e0"), Some(0));
        assert_eq!(engine_index("e12"), Some(12));
        assert_eq!(engine_index("x1"), None);
        assert_eq!(engine_index("e"), None);
    }
}
