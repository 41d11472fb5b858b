//! A route's protection settings as validated from its file (the route
//! file's `protection:` section), and the one decision they make alone:
//! which limit a gate holds its EWMA against. `config` builds them;
//! `RouteProtection` (`route.rs`) applies them.

use super::aimd::Coefficients;
use super::limits::{judge_table, Direction, Judged, LimitSource, MetricLimit};
use super::meter::{MeterConfig, Reading};
use std::time::Duration;

/// The load gates of a route: what is measured, and the limits.
#[derive(Debug, Clone, PartialEq)]
pub struct Protection {
    pub meter: MeterConfig,
    /// TTFT EWMA (ms) at which new requests are refused; per model below.
    pub ttft_limit_ms: f64,
    pub ttft_limit_by_model: Vec<(String, f64)>,
    /// Decode-rate floor (tok/s); `None`: no decode-rate gate.
    pub tps_limit_tps: Option<f64>,
    /// Declared metric tables: each entry a fold of the window with its own
    /// threshold; they replace the static limits and the runtime overrides.
    pub ttft_metrics: Option<Vec<MetricLimit>>,
    pub tps_metrics: Option<Vec<MetricLimit>>,
    /// The route's layer of the load-based 429s' master switch (`None`:
    /// the gateway's).
    pub load_rate_limit: Option<bool>,
    /// Adaptive concurrency: the pool's limit moves by AIMD between its
    /// bounds (opt-in; while on, the decode-rate floor steers it and sheds
    /// nothing itself). Kept, validated, while off: `/_route_opts` shows
    /// what the route set. Read through [`Protection::adaptive_on`].
    pub adaptive: AdaptiveConfig,
    /// Session turn priority: the gates grade by turn bucket.
    pub session_prio: SessionPrio,
    /// Requests per `probe_window` that pass a tripped gate.
    pub probes: u32,
    pub probe_window: Duration,
}

/// The adaptive limit's settings: its switch, bounds and start point, and
/// the AIMD internals (the OpenResty gateway's values unless the route sets
/// them).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdaptiveConfig {
    pub enabled: bool,
    /// Floor in slots; default `max(1, floor(min_frac × static max))` per pool.
    pub min: Option<f64>,
    /// Start point in slots, or as a fraction of the static max.
    pub init: Option<f64>,
    pub init_frac: Option<f64>,
    pub hold_when_idle: bool,
    pub use_ttft: bool,
    pub coefficients: Coefficients,
    /// A limit not moved for this long starts again at init, unless the
    /// route holds it when idle.
    pub ttl_ms: u64,
    /// Time between two steps.
    pub interval_ms: u64,
}

/// The OpenResty gateway's: 300 s without a step expires a limit.
pub const DEFAULT_ADAPTIVE_TTL_MS: u64 = 300_000;

impl Default for AdaptiveConfig {
    fn default() -> Self {
        AdaptiveConfig {
            enabled: false,
            min: None,
            init: None,
            init_frac: None,
            hold_when_idle: true,
            use_ttft: true,
            coefficients: Coefficients::default(),
            ttl_ms: DEFAULT_ADAPTIVE_TTL_MS,
            interval_ms: MeterConfig::default().tps_window_ms,
        }
    }
}

impl AdaptiveConfig {
    /// The AIMD parameters for a pool whose static limit is `max`. An init
    /// outside `[min, max]` falls back to `min`.
    pub fn params(&self, max: f64) -> super::aimd::AimdParams {
        let mut p = super::aimd::AimdParams::with(max, &self.coefficients);
        if let Some(min) = self.min {
            p.min = min.clamp(1.0, max.max(1.0));
        }
        let init = self.init.or(self.init_frac.map(|f| (f * max).floor()));
        p.init = init.filter(|i| (p.min..=max).contains(i)).unwrap_or(p.min);
        p.hold_when_idle = self.hold_when_idle;
        p.use_ttft = self.use_ttft;
        p
    }
}

/// Session turn priority settings (the OpenResty gateway's `session_prio_*`).
#[derive(Debug, Clone, PartialEq)]
pub struct SessionPrio {
    /// As configured; the runtime toggle may override.
    pub enabled: bool,
    pub table: Vec<super::prio::Bucket>,
    pub rt_limit_factor: f64,
    pub severe: f64,
    pub release: f64,
    pub t1_probes: u32,
    pub warn_frac: f64,
}

impl Protection {
    /// The adaptive limit's settings when the route turned it on.
    pub fn adaptive_on(&self) -> Option<&AdaptiveConfig> {
        Some(&self.adaptive).filter(|a| a.enabled)
    }

    /// The static TTFT limit for `model`: its own, else the route's.
    pub fn ttft_limit_for(&self, model: Option<&str>) -> (f64, LimitSource) {
        model
            .and_then(|m| self.ttft_limit_by_model.iter().find(|(name, _)| name == m))
            .map_or((self.ttft_limit_ms, LimitSource::Route), |(_, limit)| {
                (*limit, LimitSource::Model)
            })
    }

    /// What the TTFT gate holds against its limit: the metric table's worst
    /// entry, else the P80 against the runtime override, the model's or the
    /// route's limit.
    pub fn judge_ttft(
        &self,
        reading: &Reading,
        model: Option<&str>,
        runtime: Option<f64>,
    ) -> Judged {
        if let Some(j) = self
            .ttft_metrics
            .as_deref()
            .and_then(|t| judge_table(&reading.ttft_all, t, Direction::Above))
        {
            return j;
        }
        let (limit, source) = match runtime {
            Some(v) => (v, LimitSource::Runtime),
            None => self.ttft_limit_for(model),
        };
        Judged {
            ewma: reading.ttft_ms,
            limit,
            fold: self.meter.ttft_folds.as_slice()[0],
            source,
        }
    }

    /// The decode-rate gate's view; `None` without any floor.
    pub fn judge_tps(&self, reading: &Reading, runtime: Option<f64>) -> Option<Judged> {
        if let Some(j) = self
            .tps_metrics
            .as_deref()
            .and_then(|t| judge_table(&reading.tps_all, t, Direction::Below))
        {
            return Some(j);
        }
        let (limit, source) = match (runtime, self.tps_limit_tps) {
            (Some(v), _) => (v, LimitSource::Runtime),
            (None, Some(v)) => (v, LimitSource::Route),
            (None, None) => return None,
        };
        Some(Judged {
            ewma: reading.tps,
            limit,
            fold: self.meter.tps_folds.as_slice()[0],
            source,
        })
    }
}
