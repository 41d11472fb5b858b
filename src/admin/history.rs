//! The dashboard's short history, pure and clock-injected: one point per
//! `every_ms`, the last `cap` kept, stored column by column.
//!
//! Counters are read from what the gateway already counts (monotonic
//! atomics, the Prometheus counters) and kept as the delta since the
//! previous point, so the request path pays nothing for the history and a
//! late sample only widens its interval instead of inventing a spike.
//! Gauges are kept as read. A series is named by a key, `group/name`
//! (`placements/new/none/<peer>`, `ttft_ewma_ms/<pool>`): the `group/`
//! prefix is stripped exactly once, so a pool named `org/model` stays
//! whole. A counter that leaves (a gone peer's, removed from `/metrics`)
//! has no value from then on, which is no count rather than a reset.

use std::collections::{BTreeMap, VecDeque};

/// The increase of a monotonic counter from `prev` to `cur`. A counter
/// that went down was reset (`/_429_status?reset=1`, a route removed and
/// re-added): everything it holds now is new, as Prometheus' `rate` reads it.
pub fn counter_delta(prev: u64, cur: u64) -> u64 {
    if cur >= prev {
        cur - prev
    } else {
        cur
    }
}

#[derive(Debug, Clone)]
pub struct History {
    every_ms: u64,
    cap: usize,
    t_ms: VecDeque<u64>,
    /// The interval each point covers; 0 for the first (no rate yet).
    dt_ms: VecDeque<u64>,
    /// The counters as last read, to take the next deltas from.
    last: Option<(u64, BTreeMap<String, u64>)>,
    deltas: BTreeMap<String, VecDeque<Option<u64>>>,
    gauges: BTreeMap<String, VecDeque<Option<f64>>>,
}

impl History {
    pub fn new(every_ms: u64, cap: usize) -> Self {
        History {
            every_ms: every_ms.max(1),
            cap: cap.max(2),
            t_ms: VecDeque::new(),
            dt_ms: VecDeque::new(),
            last: None,
            deltas: BTreeMap::new(),
            gauges: BTreeMap::new(),
        }
    }

    pub fn every_ms(&self) -> u64 {
        self.every_ms
    }

    pub fn len(&self) -> usize {
        self.t_ms.len()
    }

    pub fn is_empty(&self) -> bool {
        self.t_ms.is_empty()
    }

    pub fn t_ms(&self) -> Vec<u64> {
        self.t_ms.iter().copied().collect()
    }

    /// Whether a point is due at `now_ms`. A tenth of the interval early
    /// still counts, so a timer that fires a hair early does not skip a
    /// whole interval.
    pub fn due(&self, now_ms: u64) -> bool {
        match &self.last {
            None => true,
            Some((t, _)) => now_ms.saturating_sub(*t) + self.every_ms / 10 >= self.every_ms,
        }
    }

    /// Adds a point if one is due: the counters' deltas since the last
    /// point and the gauges as given. Returns whether it added one.
    pub fn record(
        &mut self,
        now_ms: u64,
        counters: BTreeMap<String, u64>,
        gauges: BTreeMap<String, f64>,
    ) -> bool {
        if !self.due(now_ms) {
            return false;
        }
        let n = self.t_ms.len();
        let (dt, deltas): (u64, BTreeMap<String, u64>) = match &self.last {
            None => (0, BTreeMap::new()),
            Some((t, prev)) => (
                now_ms.saturating_sub(*t),
                counters
                    .iter()
                    .map(|(k, &v)| {
                        // A counter first seen now started at zero with
                        // its series: all of it is new.
                        let before = prev.get(k).copied().unwrap_or(0);
                        (k.clone(), counter_delta(before, v))
                    })
                    .collect(),
            ),
        };
        push_column(&mut self.deltas, n, deltas);
        push_column(&mut self.gauges, n, gauges);
        self.t_ms.push_back(now_ms);
        self.dt_ms.push_back(dt);
        self.last = Some((now_ms, counters));
        while self.t_ms.len() > self.cap {
            self.t_ms.pop_front();
            self.dt_ms.pop_front();
            pop_column(&mut self.deltas);
            pop_column(&mut self.gauges);
        }
        true
    }

    /// Per-second rates of the counters under `group/`, summed by what
    /// `by` makes of the rest of their key; `None` where a point has no
    /// interval or none of its counters.
    pub fn rates(
        &self,
        group: &str,
        by: impl Fn(&str) -> String,
    ) -> BTreeMap<String, Vec<Option<f64>>> {
        let mut out: BTreeMap<String, Vec<Option<f64>>> = BTreeMap::new();
        for (rest, column) in under(&self.deltas, group) {
            let series = out
                .entry(by(rest))
                .or_insert_with(|| vec![None; self.len()]);
            for (i, (d, &dt)) in column.iter().zip(&self.dt_ms).enumerate() {
                if let (Some(d), true) = (d, dt > 0) {
                    let rate = *d as f64 * 1000.0 / dt as f64;
                    series[i] = Some(series[i].unwrap_or(0.0) + rate);
                }
            }
        }
        out
    }

    /// The gauges under `group/`, by the rest of their key.
    pub fn gauges(&self, group: &str) -> BTreeMap<String, Vec<Option<f64>>> {
        under(&self.gauges, group)
            .map(|(rest, c)| (rest.to_string(), c.iter().copied().collect()))
            .collect()
    }

    /// One gauge by its whole key (all `None` when never recorded).
    pub fn gauge(&self, key: &str) -> Vec<Option<f64>> {
        match self.gauges.get(key) {
            Some(c) => c.iter().copied().collect(),
            None => vec![None; self.len()],
        }
    }

    /// Each counter under `group/` summed over the whole history.
    pub fn totals(&self, group: &str) -> BTreeMap<String, u64> {
        under(&self.deltas, group)
            .map(|(rest, c)| (rest.to_string(), c.iter().flatten().sum()))
            .filter(|(_, n)| *n > 0)
            .collect()
    }

    /// `num / den` per point, from the two counters' deltas (the cache
    /// hit rate: cached over prompt tokens); `None` where `den` did not move.
    pub fn ratio(&self, num: &str, den: &str) -> Vec<Option<f64>> {
        let get = |k: &str, i: usize| self.deltas.get(k).and_then(|c| c[i]);
        (0..self.len())
            .map(|i| match (get(num, i), get(den, i)) {
                (Some(n), Some(d)) if d > 0 => Some(n as f64 / d as f64),
                _ => None,
            })
            .collect()
    }
}

/// The series under `group/`, with the prefix stripped once.
fn under<'a, V>(
    columns: &'a BTreeMap<String, V>,
    group: &'a str,
) -> impl Iterator<Item = (&'a str, &'a V)> + 'a {
    columns.iter().filter_map(move |(k, c)| {
        let rest = k.strip_prefix(group)?.strip_prefix('/')?;
        Some((rest, c))
    })
}

/// Appends one point's values; a series new at this point is `None`
/// before it, a series missing from it is `None` at it.
fn push_column<V: Copy>(
    columns: &mut BTreeMap<String, VecDeque<Option<V>>>,
    n: usize,
    mut values: BTreeMap<String, V>,
) {
    for (k, c) in columns.iter_mut() {
        c.push_back(values.remove(k));
    }
    for (k, v) in values {
        let mut c: VecDeque<Option<V>> = std::iter::repeat_n(None, n).collect();
        c.push_back(Some(v));
        columns.insert(k, c);
    }
}

/// Drops the oldest point, and any series it leaves without a value (a
/// peer or pool gone for the whole window).
fn pop_column<V>(columns: &mut BTreeMap<String, VecDeque<Option<V>>>) {
    columns.retain(|_, c| {
        c.pop_front();
        c.iter().any(Option::is_some)
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map<V: Copy>(kv: &[(&str, V)]) -> BTreeMap<String, V> {
        kv.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    #[test]
    fn a_counter_that_went_down_was_reset_and_all_it_holds_is_new() {
        assert_eq!(counter_delta(10, 15), 5);
        assert_eq!(counter_delta(10, 10), 0);
        assert_eq!(counter_delta(10, 3), 3);
    }

    #[test]
    fn points_come_once_per_interval_with_rates_from_the_counters_deltas() {
        let mut h = History::new(5_000, 10);
        assert!(h.record(
            0,
            map(&[("placements/new/none", 4)]),
            map(&[("in_flight", 1.0)])
        ));
        // Too early (a tenth of the interval early is allowed, this is not).
        assert!(!h.record(4_000, map(&[("placements/new/none", 9)]), BTreeMap::new()));
        assert!(h.record(
            4_600,
            map(&[("placements/new/none", 14)]),
            map(&[("in_flight", 3.0)])
        ));
        // A late point widens its interval: 10 more over 10 s is 1/s, no spike.
        assert!(h.record(14_600, map(&[("placements/new/none", 24)]), BTreeMap::new()));
        assert_eq!(h.t_ms(), vec![0, 4_600, 14_600]);
        let rates = h.rates("placements", |rest| rest.to_string());
        assert_eq!(
            rates["new/none"],
            vec![None, Some(10.0 * 1000.0 / 4_600.0), Some(1.0)],
            "the first point has no interval; the counts before it are not a rate"
        );
        assert_eq!(h.gauge("in_flight"), vec![Some(1.0), Some(3.0), None]);
        assert_eq!(h.totals("placements"), map(&[("new/none", 20)]));
    }

    #[test]
    fn rates_sum_by_group_and_a_series_new_midway_starts_with_all_it_counted() {
        let mut h = History::new(1_000, 10);
        h.record(0, map(&[("placements/new/none", 0)]), BTreeMap::new());
        h.record(1_000, map(&[("placements/new/none", 2)]), BTreeMap::new());
        h.record(
            2_000,
            map(&[
                ("placements/new/none", 3),
                ("placements/spill/waiting", 4),
                ("placements/spill/kv_full", 1),
            ]),
            BTreeMap::new(),
        );
        let kind = |rest: &str| rest.split('/').next().unwrap_or(rest).to_string();
        let by_kind = h.rates("placements", kind);
        assert_eq!(by_kind["new"], vec![None, Some(2.0), Some(1.0)]);
        assert_eq!(by_kind["spill"], vec![None, None, Some(5.0)]);
        // Another group's prefix is not a match by accident.
        assert!(h.rates("place", |r| r.to_string()).is_empty());
    }

    #[test]
    fn the_oldest_points_leave_and_a_series_without_values_left_goes_with_them() {
        let mut h = History::new(1_000, 3);
        h.record(
            0,
            BTreeMap::new(),
            map(&[("in_flight", 1.0), ("ttft_ewma_ms/org/model", 900.0)]),
        );
        for t in 1..=3 {
            h.record(
                t * 1_000,
                BTreeMap::new(),
                map(&[("in_flight", t as f64 + 1.0)]),
            );
        }
        assert_eq!(h.len(), 3);
        assert_eq!(h.t_ms(), vec![1_000, 2_000, 3_000]);
        assert_eq!(h.gauge("in_flight"), vec![Some(2.0), Some(3.0), Some(4.0)]);
        assert!(
            h.gauges("ttft_ewma_ms").is_empty(),
            "gone with its last value"
        );
        // Control: while a value is left the series stays, its name whole.
        let mut h = History::new(1_000, 3);
        h.record(
            0,
            BTreeMap::new(),
            map(&[("ttft_ewma_ms/org/model", 900.0)]),
        );
        h.record(1_000, BTreeMap::new(), BTreeMap::new());
        assert_eq!(
            h.gauges("ttft_ewma_ms")["org/model"],
            vec![Some(900.0), None]
        );
    }

    #[test]
    fn the_hit_rate_is_cached_over_prompt_tokens_per_interval() {
        let mut h = History::new(1_000, 10);
        let tokens = |p: u64, c: u64| map(&[("tokens/prompt", p), ("tokens/cached", c)]);
        h.record(0, tokens(100, 0), BTreeMap::new());
        h.record(1_000, tokens(1_100, 800), BTreeMap::new());
        h.record(2_000, tokens(1_100, 800), BTreeMap::new());
        assert_eq!(
            h.ratio("tokens/cached", "tokens/prompt"),
            vec![None, Some(0.8), None],
            "no prompt tokens in an interval is no hit rate, not zero"
        );
    }
}
