//! Latency and decode-rate measurement, pure and clock-injected: samples
//! are collected per window, a closed window is folded to one value (a
//! percentile, or the mean), and the folded values feed an EWMA that
//! expires when no sample arrives for its TTL (fail-open: an expired EWMA
//! sheds nothing). Histograms count samples in fixed buckets for status
//! endpoints and metrics.

/// How a window's samples become one value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Fold {
    /// The nearest-rank percentile `q` (0–100): P80 of TTFT, P20 of decode
    /// rate, so a slow minority moves the value where a mean would hide it.
    Percentile(f64),
    Avg,
}

impl Fold {
    /// `p80`, `p20`, `avg` (as route files write it).
    pub fn parse(text: &str) -> Option<Fold> {
        let t = text.trim().to_ascii_lowercase();
        if t == "avg" || t == "mean" {
            return Some(Fold::Avg);
        }
        let q: f64 = t.strip_prefix('p')?.parse().ok()?;
        (q > 0.0 && q <= 100.0).then_some(Fold::Percentile(q))
    }

    /// As route files and 429 bodies spell it: `p80`, `p99.9`, `avg`.
    pub fn name(self) -> String {
        match self {
            Fold::Avg => "avg".into(),
            Fold::Percentile(q) => format!("p{q}"),
        }
    }

    /// The folded value of `samples` (reordered in place); `None` if empty.
    pub fn apply(self, samples: &mut [f64]) -> Option<f64> {
        if samples.is_empty() {
            return None;
        }
        match self {
            Fold::Avg => Some(samples.iter().sum::<f64>() / samples.len() as f64),
            Fold::Percentile(q) => {
                samples.sort_unstable_by(f64::total_cmp);
                let rank = ((q / 100.0) * samples.len() as f64).ceil() as usize;
                Some(samples[rank.clamp(1, samples.len()) - 1])
            }
        }
    }
}

/// An exponentially weighted moving average of folded window values.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Ewma {
    value: Option<f64>,
    /// When the last window that fed it closed.
    updated_ms: u64,
}

impl Ewma {
    /// `alpha × v + (1 − alpha) × old`; the first value is taken as is.
    pub fn update(&mut self, v: f64, alpha: f64, now_ms: u64) {
        let alpha = alpha.clamp(0.0, 1.0);
        self.value = Some(match self.value {
            Some(old) => alpha * v + (1.0 - alpha) * old,
            None => v,
        });
        self.updated_ms = now_ms;
    }

    /// The value, unless no window fed it for `ttl_ms`.
    pub fn get(&self, now_ms: u64, ttl_ms: u64) -> Option<f64> {
        self.value
            .filter(|_| now_ms.saturating_sub(self.updated_ms) < ttl_ms)
    }

    pub fn clear(&mut self) {
        self.value = None;
    }
}

/// A window is folded at most this many ways: the default percentile, or
/// the entries of a route's metric table (a fixed bound keeps a reading a
/// plain array, so the gates read it without allocating).
pub const MAX_FOLDS: usize = 4;

/// The folds of one series, first the one status pages show as "the" EWMA.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Folds {
    list: [Fold; MAX_FOLDS],
    len: usize,
}

impl Folds {
    pub fn one(fold: Fold) -> Self {
        Folds {
            list: [fold; MAX_FOLDS],
            len: 1,
        }
    }

    /// `None` when `folds` is empty or longer than `MAX_FOLDS`.
    pub fn of(folds: &[Fold]) -> Option<Self> {
        let first = *folds.first()?;
        if folds.len() > MAX_FOLDS {
            return None;
        }
        let mut list = [first; MAX_FOLDS];
        list[..folds.len()].copy_from_slice(folds);
        Some(Folds {
            list,
            len: folds.len(),
        })
    }

    pub fn as_slice(&self) -> &[Fold] {
        &self.list[..self.len]
    }
}

/// One EWMA per fold, in the order of the folds.
pub type Values = [Option<f64>; MAX_FOLDS];

/// Samples of the current window and the EWMAs the closed ones fed.
#[derive(Debug, Clone, PartialEq)]
pub struct Windowed {
    pub window_ms: u64,
    pub folds: Folds,
    pub alpha: f64,
    start_ms: Option<u64>,
    samples: Vec<f64>,
    ewmas: [Ewma; MAX_FOLDS],
}

/// A window keeps at most this many samples (the first ones of a burst);
/// beyond it the fold would cost more than it tells.
const MAX_SAMPLES: usize = 8192;

impl Windowed {
    pub fn new(window_ms: u64, folds: Folds, alpha: f64) -> Self {
        Windowed {
            window_ms: window_ms.max(1),
            folds,
            alpha,
            start_ms: None,
            samples: Vec::new(),
            ewmas: [Ewma::default(); MAX_FOLDS],
        }
    }

    pub fn add(&mut self, sample: f64, now_ms: u64) {
        self.roll(now_ms);
        self.start_ms.get_or_insert(now_ms);
        if self.samples.len() < MAX_SAMPLES && sample.is_finite() {
            self.samples.push(sample);
        }
    }

    /// Closes the window if its time is up: its samples feed the EWMAs.
    pub fn roll(&mut self, now_ms: u64) {
        let Some(start) = self.start_ms else {
            return;
        };
        if now_ms.saturating_sub(start) < self.window_ms {
            return;
        }
        for (fold, ewma) in self.folds.as_slice().iter().zip(&mut self.ewmas) {
            if let Some(v) = fold.apply(&mut self.samples) {
                ewma.update(v, self.alpha, now_ms);
            }
        }
        self.samples.clear();
        self.start_ms = None;
    }

    /// The first fold's EWMA.
    pub fn ewma(&self) -> &Ewma {
        &self.ewmas[0]
    }

    /// Every fold's EWMA now (`None` past `ttl_ms` without a window).
    pub fn values(&self, now_ms: u64, ttl_ms: u64) -> Values {
        let mut out = [None; MAX_FOLDS];
        for (v, ewma) in out.iter_mut().zip(&self.ewmas[..self.folds.len]) {
            *v = ewma.get(now_ms, ttl_ms);
        }
        out
    }

    /// Samples in the window still open.
    pub fn pending(&self) -> &[f64] {
        &self.samples
    }
}

/// Counts in fixed buckets (upper bounds, ascending) plus one overflow
/// bucket whose bound is twice the last.
#[derive(Debug, Clone, PartialEq)]
pub struct Buckets {
    bounds: &'static [f64],
    counts: Vec<u64>,
}

/// TTFT buckets in milliseconds, as the OpenResty gateway uses.
pub const TTFT_MS_BUCKETS: &[f64] = &[
    250.0, 500.0, 1000.0, 1500.0, 2000.0, 3000.0, 5000.0, 8000.0, 12000.0, 20000.0, 30000.0,
    50000.0, 80000.0,
];
/// Decode-rate buckets in tokens per second.
pub const TPS_BUCKETS: &[f64] = &[
    5.0, 10.0, 15.0, 20.0, 25.0, 30.0, 40.0, 50.0, 75.0, 100.0, 150.0, 200.0, 300.0,
];

impl Buckets {
    pub fn new(bounds: &'static [f64]) -> Self {
        Buckets {
            bounds,
            counts: vec![0; bounds.len() + 1],
        }
    }

    pub fn add(&mut self, v: f64) {
        let i = self.bounds.partition_point(|&b| b < v);
        self.counts[i.min(self.bounds.len())] += 1;
    }

    /// `(upper bound, count)` per bucket, the overflow bucket's bound being
    /// twice the last.
    pub fn counts(&self) -> Vec<(f64, u64)> {
        let overflow = self.bounds.last().map_or(f64::INFINITY, |b| b * 2.0);
        self.bounds
            .iter()
            .copied()
            .chain(std::iter::once(overflow))
            .zip(self.counts.iter().copied())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn p80_follows_the_slow_minority_where_the_mean_hides_it() {
        let mut s: Vec<f64> = [100.0; 7].into_iter().chain([800.0; 3]).collect();
        assert_eq!(Fold::Percentile(80.0).apply(&mut s.clone()), Some(800.0));
        assert_eq!(Fold::Avg.apply(&mut s), Some(310.0));
        assert_eq!(
            Fold::Percentile(20.0).apply(&mut [3.0, 1.0, 2.0, 4.0, 5.0]),
            Some(1.0)
        );
        assert_eq!(Fold::Avg.apply(&mut []), None);
        assert_eq!(Fold::parse("p80"), Some(Fold::Percentile(80.0)));
        assert_eq!(Fold::parse("avg"), Some(Fold::Avg));
        assert_eq!(Fold::parse("p0"), None);
        assert_eq!(Fold::parse("q80"), None);
    }

    #[test]
    fn the_ewma_appears_when_its_window_closes_and_expires_after_its_ttl() {
        let mut w = Windowed::new(20_000, Folds::one(Fold::Percentile(80.0)), 0.3);
        w.add(1_000.0, 0);
        w.add(3_000.0, 5_000);
        assert_eq!(w.ewma().get(19_999, 60_000), None, "window still open");
        w.roll(20_000);
        assert_eq!(w.ewma().get(20_000, 60_000), Some(3_000.0));
        w.add(1_000.0, 21_000);
        w.roll(41_000);
        let v = w.ewma().get(41_000, 60_000).expect("value");
        assert!((v - (0.3 * 1_000.0 + 0.7 * 3_000.0)).abs() < 1e-9, "{v}");
        // A gap shorter than the TTL keeps it; a longer one expires it.
        assert!(w.ewma().get(41_000 + 59_999, 60_000).is_some());
        assert_eq!(w.ewma().get(41_000 + 60_000, 60_000), None);
    }

    #[test]
    fn a_metric_table_folds_one_window_every_way_it_names() {
        let folds = Folds::of(&[Fold::Percentile(50.0), Fold::Avg, Fold::Percentile(100.0)])
            .expect("three folds");
        let mut w = Windowed::new(1_000, folds, 1.0);
        for v in [100.0, 200.0, 900.0] {
            w.add(v, 0);
        }
        w.roll(1_000);
        assert_eq!(
            w.values(1_000, 60_000),
            [Some(200.0), Some(400.0), Some(900.0), None]
        );
        assert!(Folds::of(&[]).is_none());
        assert!(Folds::of(&[Fold::Avg; MAX_FOLDS + 1]).is_none());
        assert_eq!(Fold::Percentile(99.5).name(), "p99.5");
        assert_eq!(Fold::Avg.name(), "avg");
    }

    #[test]
    fn alpha_is_clamped() {
        let mut e = Ewma::default();
        e.update(10.0, 0.5, 0);
        e.update(20.0, 7.0, 1);
        assert_eq!(e.get(1, 10), Some(20.0));
        e.update(0.0, -1.0, 2);
        assert_eq!(e.get(2, 10), Some(20.0));
    }

    #[test]
    fn one_sample_lands_in_its_own_bucket_and_big_ones_in_the_overflow() {
        let mut b = Buckets::new(TTFT_MS_BUCKETS);
        b.add(700.0);
        let counts = b.counts();
        assert_eq!(counts.iter().map(|c| c.1).sum::<u64>(), 1);
        assert_eq!(counts[2], (1000.0, 1));
        b.add(1e9);
        assert_eq!(*counts.last().unwrap(), (160_000.0, 0));
        assert_eq!(*b.counts().last().unwrap(), (160_000.0, 1));
        b.add(250.0);
        assert_eq!(b.counts()[0], (250.0, 1), "a bound is inclusive");
    }
}
