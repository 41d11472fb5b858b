//! What is observed around a cell's measured window: counters scraped
//! before and after, engine load and KV sampled during, and the process's
//! own timer lag.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::{sleep, sleep_until, Instant};

use crate::client;
use crate::gateway::ROUTE;
use crate::stats::{self, CpuOf};
use llm_gateway_prom::Sample;
use llm_gateway_sim::EngineStats;

const SAMPLE_EVERY: Duration = Duration::from_millis(100);
/// How often each engine's KV gauge is scraped over the window.
const KV_EVERY: Duration = Duration::from_secs(1);

/// A point-in-time view for window differences.
pub(crate) struct Snapshot {
    pub at: Instant,
    pub placements: Vec<Sample>,
    pub engines: Vec<Vec<Sample>>,
    pub gateway_cpu: Option<f64>,
    pub bench_cpu: Option<f64>,
}

pub(crate) async fn scrape(addr: SocketAddr) -> Vec<Sample> {
    match client::get(addr, "/metrics", Duration::from_secs(3)).await {
        Ok((200, body)) => llm_gateway_prom::parse(&String::from_utf8_lossy(&body)),
        _ => Vec::new(),
    }
}

/// What the window's snapshots read of a process between the client and
/// the engines: a gateway replica's admin address (its counters) and pid,
/// or an external router's process group (its CPU only).
pub(crate) struct Probe {
    pub admin: Option<SocketAddr>,
    pub cpu: CpuOf,
}

/// `gateways`: each replica (or the router) of the cell, none in the
/// reference cell. The placement counters of every replica are kept apart
/// by a `replica` label, so a window's difference is taken per replica and
/// then summed; the CPU is the replicas' together.
pub(crate) async fn snapshot(gateways: &[Probe], engines: &[SocketAddr]) -> Snapshot {
    let at = Instant::now();
    let cpus: Vec<f64> = gateways.iter().filter_map(|p| p.cpu.seconds()).collect();
    let gateway_cpu = (!cpus.is_empty()).then(|| cpus.iter().sum());
    let bench_cpu = stats::cpu_seconds(std::process::id());
    let mut placements = Vec::new();
    for (i, probe) in gateways.iter().enumerate() {
        let Some(admin) = probe.admin else { continue };
        placements.extend(scrape(admin).await.into_iter().map(|mut s| {
            s.labels.push(("replica".to_string(), i.to_string()));
            s
        }));
    }
    let mut per_engine = Vec::with_capacity(engines.len());
    for &e in engines {
        per_engine.push(scrape(e).await);
    }
    Snapshot {
        at,
        placements,
        engines: per_engine,
        gateway_cpu,
        bench_cpu,
    }
}

/// What was observed around the measured window.
pub(crate) struct Window {
    pub before: Snapshot,
    pub after: Snapshot,
    /// Engines replaced during the window (failover), with their counters
    /// scraped just before they went down: the replacement counts from zero.
    pub retired: Vec<(usize, Vec<Sample>)>,
    pub load: LoadSamples,
    /// Per engine: mean share of KV committed to running sequences
    /// (`vllm:kv_cache_usage_perc`, `sglang:token_usage`), None if never
    /// scraped or never reported (llama.cpp).
    pub kv_committed: Vec<Option<f64>>,
    pub lag: Lag,
}

pub(crate) async fn sample_kv(
    engines: Vec<SocketAddr>,
    from: Instant,
    until: Instant,
) -> Vec<Option<f64>> {
    let mut sums = vec![(0.0, 0u32); engines.len()];
    sleep_until(from).await;
    let mut tick = tokio::time::interval(KV_EVERY);
    while Instant::now() < until {
        tick.tick().await;
        for (i, &addr) in engines.iter().enumerate() {
            // An engine that is down (failover) has no sample.
            let samples = scrape(addr).await;
            // SGLang's name for the same share; llama.cpp reports none.
            if let Some(s) = samples
                .iter()
                .find(|s| s.name == "vllm:kv_cache_usage_perc" || s.name == "sglang:token_usage")
            {
                sums[i].0 += s.value;
                sums[i].1 += 1;
            }
        }
    }
    sums.into_iter()
        .map(|(sum, n)| (n > 0).then(|| sum / f64::from(n)))
        .collect()
}

/// Engine load sampled from the simulator's own counters.
#[derive(Debug, Default, Clone)]
pub struct LoadSamples {
    pub samples: u64,
    /// Per engine: Σ requests in the engine (queued or running).
    pub in_engine: Vec<u64>,
    /// Per engine: Σ requests queued beyond max_running.
    pub queued: Vec<u64>,
    /// Per sample: seconds since the cell's start, and the requests in each
    /// engine (for the plot).
    pub series: Vec<(f64, Vec<u32>)>,
}

/// The engines' stats, swapped when an engine is restarted.
pub(crate) type LiveStats = Arc<Mutex<Vec<Arc<EngineStats>>>>;

pub(crate) async fn sample_load(
    engines: LiveStats,
    max_running: i64,
    start: Instant,
    from: Instant,
    until: Instant,
) -> LoadSamples {
    let n = engines.lock().len();
    let mut s = LoadSamples {
        in_engine: vec![0; n],
        queued: vec![0; n],
        ..LoadSamples::default()
    };
    sleep_until(from).await;
    let mut tick = tokio::time::interval(SAMPLE_EVERY);
    while Instant::now() < until {
        tick.tick().await;
        s.samples += 1;
        let now: Vec<i64> = engines
            .lock()
            .iter()
            .map(|e| e.in_flight.load(Ordering::Relaxed).max(0))
            .collect();
        for (i, &n) in now.iter().enumerate() {
            s.in_engine[i] += n as u64;
            s.queued[i] += (n - max_running).max(0) as u64;
        }
        let at = start.elapsed().as_secs_f64();
        s.series.push((
            at,
            now.iter().map(|&n| n.min(u32::MAX as i64) as u32).collect(),
        ));
    }
    s
}

/// How late a 10 ms timer fires in this process: a machine-level stall
/// (CPU starvation) delays the client and the engines for every mode alike,
/// and shows here.
#[derive(Debug, Default, Clone)]
pub struct Lag {
    pub samples: Vec<f64>,
    /// Σ lag beyond 50 ms per sample, seconds.
    pub stalled_s: f64,
}

pub(crate) async fn probe_lag(from: Instant, until: Instant) -> Lag {
    const PERIOD: Duration = Duration::from_millis(10);
    let mut lag = Lag::default();
    sleep_until(from).await;
    while Instant::now() < until {
        let t = Instant::now();
        sleep(PERIOD).await;
        let late = t.elapsed().saturating_sub(PERIOD).as_secs_f64();
        lag.samples.push(late);
        if late > 0.05 {
            lag.stalled_s += late;
        }
    }
    lag
}

/// Placement counters for `kind` over the window, by reason.
pub(crate) fn placements_by_reason(
    before: &[Sample],
    after: &[Sample],
    kind: &str,
) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for s in after.iter().filter(|s| {
        s.name == "llm_gateway_placements_total"
            && s.label("route") == Some(ROUTE)
            && s.label("kind") == Some(kind)
    }) {
        let prev: f64 = before
            .iter()
            .filter(|b| b.name == s.name && b.labels == s.labels)
            .map(|b| b.value)
            .sum();
        let reason = s.label("reason").unwrap_or("none").to_string();
        *out.entry(reason).or_insert(0.0) += s.value - prev;
    }
    out.retain(|_, v| *v > 0.0);
    out
}
