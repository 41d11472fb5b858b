//! Per-cell results: computed from a cell's request records and what was
//! observed around its measured window (`window.rs`), and the error share
//! above which the run fails.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::analysis::{self, PrefillBound, Recognition, Spread};
use crate::cell_spec::{CellKind, CellSpec};
use crate::gateway::ROUTE;
use crate::peers::Skipped;
use crate::plan::Plan;
use crate::record::Record;
use crate::stats::percentile;
use crate::window::{placements_by_reason, Window};
use llm_gateway_prom::sum;

/// Error share above which the run exits non-zero (in scenarios where
/// errors are not the point, see `Scenario::errors_expected`).
pub(crate) const MAX_ERROR_RATE: f64 = 0.01;

/// How often the sessions bound to each engine are counted from the records.
const BINDINGS_EVERY: Duration = Duration::from_millis(500);

/// One scenario's plan and its cells, in the order they ran.
pub struct ScenarioResult {
    pub plan: Plan,
    pub cells: Vec<ModeResult>,
    /// The peer cells' commands (name, command) and the peers not found.
    pub peers: Vec<(String, String)>,
    pub skipped_peers: Vec<Skipped>,
}

#[derive(Debug, Clone, Default)]
pub struct ModeResult {
    pub mode: String,
    /// The cell ran an external router (`--router-cmd`; `mode` is its
    /// label) or a peer: no gateway counters, no routed sessions.
    pub router: bool,
    /// A peer router of `--peers`: a candidate for the best peer, and its
    /// errors do not fail the run.
    pub peer: bool,
    pub window_s: f64,
    /// Requests started in the measured window (successful or not).
    pub requests: usize,
    pub errors: usize,
    /// Every request of the mode, warm-up included (cut ones excluded).
    pub requests_total: usize,
    pub errors_total: usize,
    /// Measured errors by kind (`status 429`, `connect`, `cut`, ...).
    pub error_kinds: BTreeMap<String, usize>,
    pub cut: u64,
    pub first_error: Option<String>,
    /// TTFT of every measured successful request, seconds (for the plot).
    pub ttft_samples: Vec<f64>,
    pub ttft_p50: Option<f64>,
    pub ttft_p95: Option<f64>,
    pub ttft_p99: Option<f64>,
    /// The same percentiles of what each measured request would have
    /// waited with a perfect prefix cache on an idle engine.
    pub ttft_bound_p95: Option<f64>,
    pub ttft_bound_p99: Option<f64>,
    pub decode_p50: Option<f64>,
    pub decode_p5: Option<f64>,
    /// Generated tokens per second over the window, from engine counters.
    pub output_tok_s: f64,
    /// Σ cached / Σ prompt tokens from the measured requests' usage frames.
    pub cache_hit: Option<f64>,
    /// The same from the engines' prefix-cache counters over the window.
    pub cache_hit_engine: Option<f64>,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    /// Prefill of the measured requests against a perfect prefix cache.
    pub prefill: PrefillBound,
    /// Live sessions bound to each engine, and their context tokens, over
    /// the window (client-side, from the engine of each session's last turn).
    pub sessions_spread: Option<Spread>,
    pub tokens_spread: Option<Spread>,
    pub spills: BTreeMap<String, f64>,
    pub migrations: BTreeMap<String, f64>,
    /// Every placement kind the gateway counted over the window.
    pub placements: BTreeMap<String, f64>,
    /// Later requests of a session that landed on another peer than its
    /// previous one.
    pub switch_rate: Option<f64>,
    /// Peer of each session's first request, whole run.
    pub new_sessions_per_peer: BTreeMap<String, usize>,
    /// How the gateway attached the measured requests to sessions, against
    /// the ground truth; None for the reference cell.
    pub recognition: Option<Recognition>,
    /// Mean requests in each engine (queued or running) over the window.
    pub engine_load: Vec<f64>,
    /// Mean requests queued beyond max_running in each engine.
    pub engine_queue: Vec<f64>,
    /// Mean share of each engine's KV committed to running sequences.
    pub kv_committed: Vec<Option<f64>>,
    /// Requests in each engine every 100 ms: (seconds since the cell's
    /// start, per engine).
    pub load_series: Vec<(f64, Vec<u32>)>,
    /// Gateway CPU over the window, in cores (a router cell: its process
    /// group's).
    pub gateway_cpu: Option<f64>,
    /// This process (client and engines) over the window, in cores.
    pub bench_cpu: Option<f64>,
    /// Timer lateness in this process over the window: p99 and max, seconds.
    pub lag_p99: Option<f64>,
    pub lag_max: Option<f64>,
    /// Σ of timer lateness beyond 50 ms: how long the machine stalled us.
    pub stalled_s: f64,
}

impl ModeResult {
    pub fn error_rate(&self) -> f64 {
        if self.requests_total == 0 {
            // A mode that could not complete a single request failed.
            return 1.0;
        }
        self.errors_total as f64 / self.requests_total as f64
    }

    /// The machine starved the bench during the window badly enough to
    /// distort latencies.
    pub fn stalled(&self) -> bool {
        self.stalled_s > 1.0 || self.lag_max.is_some_and(|m| m > 0.5)
    }

    pub fn moves(&self) -> f64 {
        self.spills
            .values()
            .chain(self.migrations.values())
            .fold(0.0, |a, b| a + b)
    }

    /// Busiest engine's mean load over the mean of all engines.
    pub fn load_imbalance(&self) -> Option<f64> {
        let max = self.engine_load.iter().copied().fold(f64::NAN, f64::max);
        let mean = self.engine_load.iter().sum::<f64>() / self.engine_load.len().max(1) as f64;
        (mean > 0.0).then(|| max / mean)
    }
}

pub fn summarize(
    cell: &CellSpec,
    plan: &Plan,
    records: &[Record],
    cut: u64,
    observed: &Window,
) -> ModeResult {
    let (before, after) = (&observed.before, &observed.after);
    let (load, lag) = (&observed.load, &observed.lag);
    let is_measured = |r: &Record| !r.cut && r.start >= plan.warmup && r.start < plan.opts.duration;
    let warm = plan.warmup;
    let end = plan.opts.duration;
    let done: Vec<&Record> = records.iter().filter(|r| !r.cut).collect();
    let measured: Vec<&Record> = done
        .iter()
        .copied()
        .filter(|r| r.start >= warm && r.start < end)
        .collect();
    let ok: Vec<&Record> = measured.iter().copied().filter(|r| r.ok).collect();
    let secs = |d: Option<Duration>| d.map(|d| d.as_secs_f64());
    let ttft: Vec<f64> = ok.iter().filter_map(|r| secs(r.ttft)).collect();
    let decode: Vec<f64> = ok.iter().filter_map(|r| r.decode_tok_per_s).collect();
    let prompt_tokens: u64 = ok
        .iter()
        .filter_map(|r| r.usage)
        .map(|u| u.prompt_tokens)
        .sum();
    let cached_tokens: u64 = ok
        .iter()
        .filter_map(|r| r.usage)
        .map(|u| u.cached_tokens)
        .sum();
    let switches: Vec<bool> = ok.iter().filter_map(|r| r.switched_peer).collect();
    // Every engine, so an engine that got no new session shows as 0.
    let mut new_sessions_per_peer: BTreeMap<String, usize> = (0..plan.opts.engines)
        .map(|i| (format!("e{i}"), 0))
        .collect();
    for r in done.iter().filter(|r| r.ok && r.first_of_session) {
        let peer = r.peer.clone().unwrap_or_else(|| "?".into());
        *new_sessions_per_peer.entry(peer).or_insert(0) += 1;
    }
    let window = after.at.saturating_duration_since(before.at).as_secs_f64();
    // An engine replaced in the window counted up to its shutdown, and its
    // replacement from zero.
    let engine_delta = |name: &str| -> f64 {
        after
            .engines
            .iter()
            .zip(&before.engines)
            .enumerate()
            .map(|(i, (a, b))| {
                let b = sum(b, name, &[]);
                let a = sum(a, name, &[]);
                match observed.retired.iter().find(|(j, _)| *j == i) {
                    Some((_, r)) => sum(r, name, &[]) - b + a,
                    None => a - b,
                }
            })
            .sum()
    };
    // The simulator's own names, the same under every engine profile.
    let generated = engine_delta("sim:generation_tokens_total");
    let queried = engine_delta("sim:prefix_cache_queries_total");
    let hits = engine_delta("sim:prefix_cache_hits_total");
    let cpu = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if window > 0.0 => Some((a - b) / window),
        _ => None,
    };
    let mut placements = BTreeMap::new();
    for s in after
        .placements
        .iter()
        .filter(|s| s.name == "llm_gateway_placements_total" && s.label("route") == Some(ROUTE))
    {
        let prev: f64 = before
            .placements
            .iter()
            .filter(|b| b.name == s.name && b.labels == s.labels)
            .map(|b| b.value)
            .sum();
        let kind = s.label("kind").unwrap_or("?").to_string();
        *placements.entry(kind).or_insert(0.0) += s.value - prev;
    }
    placements.retain(|_, v| *v > 0.0);
    let per_engine = |v: &[u64]| -> Vec<f64> {
        v.iter()
            .map(|&x| x as f64 / load.samples.max(1) as f64)
            .collect()
    };
    let mut error_kinds = BTreeMap::new();
    for r in measured.iter().filter(|r| !r.ok) {
        *error_kinds
            .entry(error_kind(r.error.as_deref().unwrap_or("")))
            .or_insert(0) += 1;
    }
    let prefill = analysis::prefill_bound(records, plan.workload.system_tokens as u64, is_measured);
    let ttft_bound = |p: f64| {
        let idle = |new| plan.engine.idle_ttft(new);
        analysis::ttft_bound(
            records,
            plan.workload.system_tokens as u64,
            is_measured,
            idle,
            p,
        )
    };
    // A router names no session: nothing to recognise, nothing to claim.
    let router = cell.kind.is_router();
    let recognition = cell
        .kind
        .is_gateway()
        .then(|| analysis::recognition(records, is_measured));
    let times: Vec<Duration> = std::iter::successors(Some(warm), |t| Some(*t + BINDINGS_EVERY))
        .take_while(|t| *t < end)
        .collect();
    let bound = analysis::bindings(records, plan.opts.engines, &times);
    let sessions: Vec<Vec<f64>> = bound
        .iter()
        .map(|s| s.iter().map(|b| f64::from(b.sessions)).collect())
        .collect();
    let tokens: Vec<Vec<f64>> = bound
        .iter()
        .map(|s| s.iter().map(|b| b.tokens as f64).collect())
        .collect();
    ModeResult {
        mode: cell.name.to_string(),
        router,
        peer: matches!(cell.kind, CellKind::Peer(_)),
        window_s: window,
        requests: measured.len(),
        errors: measured.iter().filter(|r| !r.ok).count(),
        requests_total: done.len(),
        errors_total: done.iter().filter(|r| !r.ok).count(),
        error_kinds,
        cut,
        first_error: done.iter().find_map(|r| r.error.clone()),
        ttft_samples: ttft.clone(),
        ttft_p50: percentile(&ttft, 50.0),
        ttft_p95: percentile(&ttft, 95.0),
        ttft_p99: percentile(&ttft, 99.0),
        ttft_bound_p95: ttft_bound(95.0),
        ttft_bound_p99: ttft_bound(99.0),
        decode_p50: percentile(&decode, 50.0),
        decode_p5: percentile(&decode, 5.0),
        output_tok_s: if window > 0.0 {
            generated / window
        } else {
            0.0
        },
        cache_hit: (prompt_tokens > 0).then(|| cached_tokens as f64 / prompt_tokens as f64),
        cache_hit_engine: (queried > 0.0).then(|| hits / queried),
        prompt_tokens,
        cached_tokens,
        prefill,
        sessions_spread: analysis::spread(&sessions),
        tokens_spread: analysis::spread(&tokens),
        spills: placements_by_reason(&before.placements, &after.placements, "spill"),
        migrations: placements_by_reason(&before.placements, &after.placements, "migrated"),
        placements,
        switch_rate: (!switches.is_empty())
            .then(|| switches.iter().filter(|s| **s).count() as f64 / switches.len() as f64),
        new_sessions_per_peer,
        recognition,
        engine_load: per_engine(&load.in_engine),
        engine_queue: per_engine(&load.queued),
        load_series: load.series.clone(),
        kv_committed: observed.kv_committed.clone(),
        gateway_cpu: cpu(after.gateway_cpu, before.gateway_cpu),
        bench_cpu: cpu(after.bench_cpu, before.bench_cpu),
        lag_p99: percentile(&lag.samples, 99.0),
        lag_max: percentile(&lag.samples, 100.0),
        stalled_s: lag.stalled_s,
    }
}

/// What kind of error a client saw, from the record's message.
pub fn error_kind(error: &str) -> String {
    if let Some(rest) = error.strip_prefix("status ") {
        let code: String = rest.chars().take_while(char::is_ascii_digit).collect();
        return format!("status {code}");
    }
    // "connect: ..." through the gateway, "connect e1: ..." to an engine.
    if error.starts_with("connect:") || error.starts_with("connect e") {
        return "connect".into();
    }
    if error.starts_with("no complete response") {
        return "timeout".into();
    }
    if error.contains("closed") || error.contains("cut") || error.starts_with("read:") {
        return "cut".into();
    }
    "other".into()
}
