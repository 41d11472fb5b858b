//! A route's TTFT and decode-rate measurement: one series per model pool
//! (`"_"` for a route without pools) and one per peer, each a window folded
//! into an EWMA (see `window`) plus the window's histogram. Written at the
//! end of each 2xx stream; read by the gates and the status endpoints.

use super::gate::ProbeBudget;
use super::window::{Buckets, Fold, Folds, Values, Windowed, TPS_BUCKETS, TTFT_MS_BUCKETS};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The measurement settings (route options, with the OpenResty gateway's defaults).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MeterConfig {
    pub ttft_window_ms: u64,
    pub tps_window_ms: u64,
    /// The default percentile, or the folds of the route's metric table.
    pub ttft_folds: Folds,
    pub tps_folds: Folds,
    pub alpha: f64,
    pub ttl_ms: u64,
    pub tps_min_tokens: u64,
    pub tps_min_decode_ms: u64,
}

impl Default for MeterConfig {
    fn default() -> Self {
        MeterConfig {
            ttft_window_ms: 20_000,
            tps_window_ms: 20_000,
            ttft_folds: Folds::one(Fold::Percentile(80.0)),
            tps_folds: Folds::one(Fold::Percentile(20.0)),
            alpha: 0.3,
            ttl_ms: 60_000,
            tps_min_tokens: 16,
            tps_min_decode_ms: 500,
        }
    }
}

/// What one finished 2xx stream tells.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct StreamTiming {
    /// Request sent upstream → first content frame.
    pub ttft: Option<Duration>,
    /// First → last content frame.
    pub decode: Option<Duration>,
    /// `completion_tokens` of the last usage the stream reported.
    pub completion_tokens: Option<u64>,
    /// Content frames counted, the fallback when no usage came.
    pub content_frames: u64,
}

/// The decode-rate sample of a stream, or why there is none.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum TpsSample {
    Tokens(f64),
    /// Fewer than `tps_min_tokens`, or under `tps_min_decode_ms` of decode.
    TooShort,
    NoTiming,
}

/// Tokens per second over the decode. Without a usage frame the content
/// frames are counted instead (one token each, as engines stream).
pub fn tps_sample(t: &StreamTiming, cfg: &MeterConfig) -> TpsSample {
    let Some(decode) = t.decode else {
        return TpsSample::NoTiming;
    };
    let tokens = t.completion_tokens.unwrap_or(t.content_frames);
    if tokens < cfg.tps_min_tokens || decode < Duration::from_millis(cfg.tps_min_decode_ms) {
        return TpsSample::TooShort;
    }
    TpsSample::Tokens(tokens as f64 / decode.as_secs_f64())
}

#[derive(Debug, Clone)]
struct Series {
    ttft: Windowed,
    tps: Windowed,
    ttft_hist: Buckets,
    tps_hist: Buckets,
}

impl Series {
    fn new(cfg: &MeterConfig) -> Self {
        Series {
            ttft: Windowed::new(cfg.ttft_window_ms, cfg.ttft_folds, cfg.alpha),
            tps: Windowed::new(cfg.tps_window_ms, cfg.tps_folds, cfg.alpha),
            ttft_hist: Buckets::new(TTFT_MS_BUCKETS),
            tps_hist: Buckets::new(TPS_BUCKETS),
        }
    }
}

/// Which series a sample feeds.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scope {
    Pool(String),
    Peer(String),
}

/// A [`Scope`] by reference: what a lookup takes, so a request's gate
/// check names its pool without building a `String`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScopeRef<'a> {
    Pool(&'a str),
    Peer(&'a str),
}

impl Scope {
    pub fn as_ref(&self) -> ScopeRef<'_> {
        match self {
            Scope::Pool(p) => ScopeRef::Pool(p),
            Scope::Peer(p) => ScopeRef::Peer(p),
        }
    }
}

/// The series by scope, one map per kind so both are looked up by `&str`.
#[derive(Debug, Default)]
struct SeriesMap {
    pools: HashMap<String, Series>,
    peers: HashMap<String, Series>,
}

impl SeriesMap {
    fn kind<'n>(&mut self, scope: ScopeRef<'n>) -> (&mut HashMap<String, Series>, &'n str) {
        match scope {
            ScopeRef::Pool(name) => (&mut self.pools, name),
            ScopeRef::Peer(name) => (&mut self.peers, name),
        }
    }

    fn get_mut(&mut self, scope: ScopeRef<'_>) -> Option<&mut Series> {
        let (map, name) = self.kind(scope);
        map.get_mut(name)
    }

    /// The series of `scope`, created (and its name copied) on first use only.
    fn get_or_insert(&mut self, scope: ScopeRef<'_>, cfg: &MeterConfig) -> &mut Series {
        let (map, name) = self.kind(scope);
        if !map.contains_key(name) {
            map.insert(name.to_string(), Series::new(cfg));
        }
        map.get_mut(name).expect("inserted above")
    }

    fn scopes(&self) -> Vec<Scope> {
        let pools = self.pools.keys().cloned().map(Scope::Pool);
        pools
            .chain(self.peers.keys().cloned().map(Scope::Peer))
            .collect()
    }
}

/// The EWMAs of one series now, for gates and status.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Reading {
    /// The first fold's EWMA (the default percentile, or the metric table's
    /// first entry).
    pub ttft_ms: Option<f64>,
    pub tps: Option<f64>,
    /// Every fold's EWMA, in the order of `MeterConfig`'s folds.
    pub ttft_all: Values,
    pub tps_all: Values,
    /// Samples in the windows still open.
    pub ttft_pending: usize,
    pub tps_pending: usize,
}

/// One series as the status endpoints show it.
#[derive(Debug, Clone, PartialEq)]
pub struct SeriesStatus {
    pub scope: Scope,
    pub reading: Reading,
    /// `(upper bound, count)`, TTFT in milliseconds.
    pub ttft_histogram: Vec<(f64, u64)>,
    pub tps_histogram: Vec<(f64, u64)>,
}

#[derive(Debug, Default)]
pub struct Meter {
    series: Mutex<SeriesMap>,
    nousage: AtomicU64,
    /// Probe budgets of the tripped gates, per gate and pool.
    probes: Mutex<HashMap<&'static str, HashMap<String, std::sync::Arc<ProbeBudget>>>>,
}

impl Meter {
    /// Feeds one stream's timing into its pool's and its peer's series.
    pub fn record(
        &self,
        cfg: &MeterConfig,
        pool: &str,
        peer: &str,
        timing: &StreamTiming,
        now_ms: u64,
    ) -> Option<f64> {
        if timing.completion_tokens.is_none() && timing.decode.is_some() {
            self.nousage.fetch_add(1, Ordering::Relaxed);
        }
        let tps = match tps_sample(timing, cfg) {
            TpsSample::Tokens(v) => Some(v),
            _ => None,
        };
        let ttft_ms = timing.ttft.map(|d| d.as_secs_f64() * 1000.0);
        let mut series = self.series.lock();
        for scope in [ScopeRef::Pool(pool), ScopeRef::Peer(peer)] {
            let s = series.get_or_insert(scope, cfg);
            if let Some(v) = ttft_ms {
                s.ttft.add(v, now_ms);
                s.ttft_hist.add(v);
            }
            if let Some(v) = tps {
                s.tps.add(v, now_ms);
                s.tps_hist.add(v);
            }
        }
        tps
    }

    /// The EWMAs of `scope` now (closing windows whose time is up).
    pub fn reading(&self, scope: ScopeRef<'_>, ttl_ms: u64, now_ms: u64) -> Reading {
        let mut series = self.series.lock();
        let Some(s) = series.get_mut(scope) else {
            return Reading::default();
        };
        s.ttft.roll(now_ms);
        s.tps.roll(now_ms);
        let (ttft_all, tps_all) = (s.ttft.values(now_ms, ttl_ms), s.tps.values(now_ms, ttl_ms));
        Reading {
            ttft_ms: ttft_all[0],
            tps: tps_all[0],
            ttft_all,
            tps_all,
            ttft_pending: s.ttft.pending().len(),
            tps_pending: s.tps.pending().len(),
        }
    }

    /// Every series with its reading and histograms, for `/_ttft_status`
    /// and `/_tps_status`.
    pub fn snapshot(&self, ttl_ms: u64, now_ms: u64) -> Vec<SeriesStatus> {
        let scopes = self.series.lock().scopes();
        let mut out: Vec<_> = scopes
            .into_iter()
            .map(|scope| {
                let reading = self.reading(scope.as_ref(), ttl_ms, now_ms);
                let mut series = self.series.lock();
                let (ttft, tps) = series
                    .get_mut(scope.as_ref())
                    .map(|s| (s.ttft_hist.counts(), s.tps_hist.counts()))
                    .unwrap_or_default();
                SeriesStatus {
                    scope,
                    reading,
                    ttft_histogram: ttft,
                    tps_histogram: tps,
                }
            })
            .collect();
        out.sort_by(|a, b| a.scope.cmp(&b.scope));
        out
    }

    /// The probe budget of `gate` (`ttft`, `tps`) for `pool`.
    pub fn probe_budget(&self, pool: &str, gate: &'static str) -> std::sync::Arc<ProbeBudget> {
        let mut probes = self.probes.lock();
        let pools = probes.entry(gate).or_default();
        if let Some(budget) = pools.get(pool) {
            return std::sync::Arc::clone(budget);
        }
        std::sync::Arc::clone(pools.entry(pool.to_string()).or_default())
    }

    /// Streams that ended without a usage frame (their decode rate came
    /// from counting content frames).
    pub fn nousage(&self) -> u64 {
        self.nousage.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timing(tokens: Option<u64>, frames: u64, decode_ms: u64) -> StreamTiming {
        StreamTiming {
            ttft: Some(Duration::from_millis(300)),
            decode: Some(Duration::from_millis(decode_ms)),
            completion_tokens: tokens,
            content_frames: frames,
        }
    }

    #[test]
    fn decode_rate_needs_enough_tokens_and_time() {
        let cfg = MeterConfig::default();
        assert_eq!(
            tps_sample(&timing(Some(15), 15, 1_000), &cfg),
            TpsSample::TooShort
        );
        assert_eq!(
            tps_sample(&timing(Some(16), 16, 1_000), &cfg),
            TpsSample::Tokens(16.0)
        );
        assert_eq!(
            tps_sample(&timing(Some(100), 100, 499), &cfg),
            TpsSample::TooShort
        );
        // Without usage, the content frames count.
        assert_eq!(
            tps_sample(&timing(None, 40, 2_000), &cfg),
            TpsSample::Tokens(20.0)
        );
        let no_decode = StreamTiming {
            decode: None,
            ..timing(Some(40), 40, 0)
        };
        assert_eq!(tps_sample(&no_decode, &cfg), TpsSample::NoTiming);
    }

    #[test]
    fn samples_feed_the_pool_and_the_peer_and_nousage_is_counted() {
        let cfg = MeterConfig::default();
        let m = Meter::default();
        m.record(&cfg, "_", "e0", &timing(Some(40), 40, 2_000), 0);
        m.record(&cfg, "_", "e1", &timing(None, 40, 2_000), 1_000);
        assert_eq!(m.nousage(), 1);
        let pool = ScopeRef::Pool("_");
        assert_eq!(m.reading(pool, cfg.ttl_ms, 1_000).ttft_pending, 2);
        let r = m.reading(pool, cfg.ttl_ms, 20_000);
        assert_eq!(r.ttft_ms, Some(300.0));
        assert_eq!(r.tps, Some(20.0));
        let peer = m.reading(ScopeRef::Peer("e0"), cfg.ttl_ms, 20_000);
        assert_eq!(peer.tps, Some(20.0));
        // A pool and a peer of the same name are two series.
        assert_eq!(m.reading(ScopeRef::Peer("_"), cfg.ttl_ms, 20_000).tps, None);
        let scopes: Vec<Scope> = m
            .snapshot(cfg.ttl_ms, 20_000)
            .into_iter()
            .map(|s| s.scope)
            .collect();
        assert_eq!(
            scopes,
            [
                Scope::Pool("_".into()),
                Scope::Peer("e0".into()),
                Scope::Peer("e1".into())
            ]
        );
    }
}
