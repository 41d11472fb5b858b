//! Which limit a load gate holds its EWMA against, pure. Highest first:
//! a route's declared metric table (`ttft_metrics` / `tps_metrics`: several
//! folds of the same window, each with its own threshold), a runtime
//! override (`/_ttft_limit?ms=`, `/_tps_limit?tps=`, expiring), the
//! per-model static limit, the route's static limit.

use super::window::{Fold, Values};
use std::sync::atomic::{AtomicU64, Ordering};

/// A runtime override lasts this long unless the call names a `ttl`: long
/// enough for an incident, short enough that a forgotten one goes away.
pub const DEFAULT_OVERRIDE_TTL_S: u64 = 7_200;

/// One entry of a metric table: a fold of the window and its threshold.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MetricLimit {
    pub fold: Fold,
    pub threshold: f64,
}

/// One row as a route file writes it: `{metric: p95, threshold: 8000}`,
/// `{metric: p, q: 95, threshold: 8000}` or `{metric: avg, threshold: …}`.
pub fn metric_limit(
    metric: &str,
    q: Option<f64>,
    threshold: Option<f64>,
) -> Result<MetricLimit, String> {
    let threshold = match threshold {
        Some(t) if t.is_finite() && t > 0.0 => t,
        Some(t) => return Err(format!("threshold {t} must be a positive number")),
        None => return Err("an entry needs a threshold".into()),
    };
    let named = metric.trim().to_ascii_lowercase();
    let fold = match (named.as_str(), q) {
        ("p", Some(q)) => Fold::parse(&format!("p{q}")),
        (_, q) => match (Fold::parse(&named), q) {
            // A `q` beside a `pNN` must say the same.
            (Some(Fold::Percentile(p)), Some(q)) if p != q => None,
            (Some(Fold::Avg), Some(_)) => None,
            (fold, _) => fold,
        },
    };
    let fold = fold
        .ok_or_else(|| format!("metric {metric:?} (q {q:?}) is not pNN (0 < NN <= 100) or avg"))?;
    Ok(MetricLimit { fold, threshold })
}

/// Where the limit in force comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitSource {
    MetricTable,
    Runtime,
    Model,
    Route,
}

impl LimitSource {
    pub fn as_str(self) -> &'static str {
        match self {
            LimitSource::MetricTable => "metric_table",
            LimitSource::Runtime => "runtime",
            LimitSource::Model => "model",
            LimitSource::Route => "route",
        }
    }
}

/// Which way a gate trips: TTFT at or above its limit, decode rate at or
/// below its floor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    Above,
    Below,
}

/// What a gate judges: an EWMA, the limit it is held against, the fold it
/// came from and where the limit comes from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Judged {
    pub ewma: Option<f64>,
    pub limit: f64,
    pub fold: Fold,
    pub source: LimitSource,
}

impl Judged {
    /// How far along to its limit the EWMA is: 1.0 at the limit, above 1
    /// past it (for a floor, the inverse ratio); `None` without a value.
    pub fn pressure(&self, dir: Direction) -> Option<f64> {
        let v = self.ewma?;
        Some(match dir {
            Direction::Above => v / self.limit,
            Direction::Below if v <= 0.0 => f64::INFINITY,
            Direction::Below => self.limit / v,
        })
    }

    /// The gate trips at `line` (1.0: the limit itself).
    pub fn tripped(&self, dir: Direction, line: f64) -> bool {
        self.pressure(dir).is_some_and(|p| p >= line)
    }
}

/// The entry of a metric table that is nearest to (or furthest past) its
/// threshold: a table trips when any of its entries does, and a graded
/// gate grades by the worst one.
pub fn judge_table(values: &Values, table: &[MetricLimit], dir: Direction) -> Option<Judged> {
    table
        .iter()
        .zip(values.iter())
        .map(|(entry, &ewma)| Judged {
            ewma,
            limit: entry.threshold,
            fold: entry.fold,
            source: LimitSource::MetricTable,
        })
        .max_by(|a, b| {
            let p = |j: &Judged| j.pressure(dir).unwrap_or(f64::NEG_INFINITY);
            p(a).total_cmp(&p(b))
        })
}

/// A runtime override of a limit, with its expiry; unset until a call sets
/// it. Two atomics rather than a lock: the gates read it on every request,
/// and a reader that sees a new value with an old expiry (or the reverse)
/// only holds for one request.
#[derive(Debug)]
pub struct Override {
    value_bits: AtomicU64,
    expires_ms: AtomicU64,
}

/// A NaN pattern no caller can set (values are checked positive).
const UNSET: u64 = u64::MAX;

impl Default for Override {
    fn default() -> Self {
        Override {
            value_bits: AtomicU64::new(UNSET),
            expires_ms: AtomicU64::new(0),
        }
    }
}

impl Override {
    /// The value, unless unset or expired at `now_ms`.
    pub fn get(&self, now_ms: u64) -> Option<f64> {
        let bits = self.value_bits.load(Ordering::Relaxed);
        (bits != UNSET && now_ms < self.expires_ms.load(Ordering::Relaxed))
            .then(|| f64::from_bits(bits))
    }

    pub fn set(&self, value: f64, expires_ms: u64) {
        self.expires_ms.store(expires_ms, Ordering::Relaxed);
        self.value_bits.store(value.to_bits(), Ordering::Relaxed);
    }

    pub fn clear(&self) {
        self.value_bits.store(UNSET, Ordering::Relaxed);
    }

    /// When the value in force expires.
    pub fn expires_ms(&self, now_ms: u64) -> Option<u64> {
        self.get(now_ms)
            .map(|_| self.expires_ms.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_rows_name_a_percentile_or_the_mean_with_a_positive_threshold() {
        let p95 = MetricLimit {
            fold: Fold::Percentile(95.0),
            threshold: 8_000.0,
        };
        assert_eq!(metric_limit("p95", None, Some(8_000.0)), Ok(p95));
        assert_eq!(metric_limit("p", Some(95.0), Some(8_000.0)), Ok(p95));
        assert_eq!(metric_limit("P95", Some(95.0), Some(8_000.0)), Ok(p95));
        assert_eq!(
            metric_limit("avg", None, Some(1.0)).map(|m| m.fold),
            Ok(Fold::Avg)
        );
        for (metric, q, threshold) in [
            ("p95", Some(90.0), Some(1.0)),
            ("p", None, Some(1.0)),
            ("p0", None, Some(1.0)),
            ("p101", None, Some(1.0)),
            ("median", None, Some(1.0)),
            ("avg", Some(50.0), Some(1.0)),
            ("p95", None, None),
            ("p95", None, Some(0.0)),
            ("p95", None, Some(f64::NAN)),
        ] {
            assert!(
                metric_limit(metric, q, threshold).is_err(),
                "{metric} {q:?} {threshold:?}"
            );
        }
    }

    #[test]
    fn limits_trip_at_the_threshold_and_not_without_a_value() {
        let j = |ewma: Option<f64>, limit: f64| Judged {
            ewma,
            limit,
            fold: Fold::Avg,
            source: LimitSource::Route,
        };
        assert!(j(Some(30_000.0), 30_000.0).tripped(Direction::Above, 1.0));
        assert!(!j(Some(29_999.0), 30_000.0).tripped(Direction::Above, 1.0));
        assert!(!j(None, 1.0).tripped(Direction::Above, 1.0), "fail-open");
        assert!(j(Some(10.0), 10.0).tripped(Direction::Below, 1.0));
        assert!(!j(Some(10.1), 10.0).tripped(Direction::Below, 1.0));
        assert!(!j(None, 1e9).tripped(Direction::Below, 1.0));
        assert!(
            j(Some(0.0), 10.0).tripped(Direction::Below, 1.5),
            "a stalled decode"
        );
    }

    #[test]
    fn a_table_is_judged_by_its_worst_entry_in_the_gates_direction() {
        let table = [
            MetricLimit {
                fold: Fold::Percentile(80.0),
                threshold: 1_000.0,
            },
            MetricLimit {
                fold: Fold::Avg,
                threshold: 400.0,
            },
        ];
        // p80 at 0.9 of its limit, the mean at 1.25 of its own: the mean.
        let values = [Some(900.0), Some(500.0), None, None];
        let j = judge_table(&values, &table, Direction::Above).expect("judged");
        assert_eq!((j.fold, j.limit, j.ewma), (Fold::Avg, 400.0, Some(500.0)));
        // As floors (tok/s), the p80 is the nearer one: 1000/900 > 400/500.
        let j = judge_table(&values, &table, Direction::Below).expect("judged");
        assert_eq!(j.fold, Fold::Percentile(80.0));
        // An entry without a value never wins over one with a value.
        let j =
            judge_table(&[None, Some(1.0), None, None], &table, Direction::Above).expect("judged");
        assert_eq!(j.fold, Fold::Avg);
        assert!(judge_table(&values, &[], Direction::Above).is_none());
    }

    #[test]
    fn an_override_holds_until_it_expires_or_is_cleared() {
        let o = Override::default();
        assert_eq!(o.get(0), None);
        o.set(500.0, 10_000);
        assert_eq!(o.get(9_999), Some(500.0));
        assert_eq!(o.expires_ms(9_999), Some(10_000));
        assert_eq!(o.get(10_000), None, "expired");
        o.set(700.0, 20_000);
        o.clear();
        assert_eq!(o.get(10_001), None, "cleared");
    }
}
