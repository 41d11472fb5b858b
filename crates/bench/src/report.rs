//! Per-cell results: computed from the request records and the window
//! snapshots, printed as a markdown table per scenario or JSON.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{json, Value};

use super::analysis::{self, PrefillBound, Recognition, Spread};
use super::stats::percentile;
use crate::cell::{CellKind, CellSpec};
use crate::ids::SessionIdMode;
use crate::options::REFERENCE;
use crate::peers::Skipped;
use crate::plan::{fmt_secs, Plan};
use crate::record::Record;
use crate::window::{placements_by_reason, Window};
use llm_gateway_prom::sum;

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
    for s in after.placements.iter().filter(|s| {
        s.name == "llm_gateway_placements_total" && s.label("route") == Some(crate::ROUTE)
    }) {
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
    let recognition =
        matches!(cell.kind, CellKind::Gateway).then(|| analysis::recognition(records, is_measured));
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
        .filter(|(_, c)| errors_expected || c.error_rate() <= crate::MAX_ERROR_RATE)
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

/// The best-peer table of a scenario, or a line saying there is none
/// (nothing when no cell could have been one).
fn best_peer_markdown(plan: &Plan, results: &[ModeResult]) -> String {
    let candidates = results.iter().any(|r| r.peer || r.mode == REFERENCE);
    let Some(best) = best_peer(results, plan.scenario.errors_expected()).map(|i| &results[i])
    else {
        return if candidates || !plan.opts.peers.is_empty() {
            "\nNo best peer: no peer cell and no reference cell completed a request within the \
             error limit, so no ratios.\n"
                .into()
        } else {
            String::new()
        };
    };
    let x = |v: Option<f64>| opt(v, |v| format!("{v:.2}x"));
    let mut out = format!(
        "\nBest peer: **{}** (lowest TTFT p95 among the peer routers and the reference cell, \
         {}). Each cell against it: TTFT p95 and p99 as ratios (below 1 is better), cache hit \
         in points, output tok/s as a ratio; and each cell's TTFT p95 and p99 over the same \
         percentiles of its perfect-cache bound (each measured request's new tokens alone on an \
         idle engine).\n\n\
         | cell | TTFT p95 vs best peer | TTFT p99 vs best peer | cache hit vs best peer \
         | output tok/s vs best peer | TTFT p95 / bound | TTFT p99 / bound |\n\
         |---|--:|--:|--:|--:|--:|--:|\n",
        best.mode,
        opt(best.ttft_p95, |v| format!("{v:.3} s")),
    );
    for r in results {
        let v = vs_best(r, best);
        let over = |a: Option<f64>, b: Option<f64>| {
            x(a.zip(b).filter(|(_, b)| *b > 0.0).map(|(a, b)| a / b))
        };
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} |\n",
            r.mode,
            x(v.p95),
            x(v.p99),
            opt(v.hit_points, |p| format!("{p:+.1} pts")),
            x(v.tok_s),
            over(r.ttft_p95, r.ttft_bound_p95),
            over(r.ttft_p99, r.ttft_bound_p99),
        ));
    }
    out
}

fn vs_best_json(v: VsBest) -> Value {
    json!({"p95": v.p95, "p99": v.p99, "hit_points": v.hit_points, "tok_s": v.tok_s})
}

fn opt(v: Option<f64>, f: impl Fn(f64) -> String) -> String {
    v.map_or_else(|| "-".to_string(), f)
}

fn pct(v: Option<f64>) -> String {
    opt(v, |v| format!("{:.1}%", v * 100.0))
}

fn list(v: &[f64]) -> String {
    v.iter()
        .map(|x| format!("{x:.1}"))
        .collect::<Vec<_>>()
        .join("/")
}

fn reasons(m: &BTreeMap<String, f64>) -> String {
    if m.is_empty() {
        return "-".into();
    }
    m.iter()
        .map(|(k, v)| format!("{k} {v:.0}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The gateway's spill + migrated placements, "-" for a router cell
/// (nothing counted them).
fn moves(r: &ModeResult) -> String {
    if r.router {
        "-".into()
    } else {
        format!("{:.0}", r.moves())
    }
}

pub fn progress_line(scenario: &str, r: &ModeResult) -> String {
    format!(
        "   {scenario}/{}: {} requests ({} errors), TTFT p95 {}, cache hit {}, prefilled {} the \
         perfect-cache bound, moves {}{}{}",
        r.mode,
        r.requests,
        r.errors,
        opt(r.ttft_p95, |v| format!("{v:.3} s")),
        pct(r.cache_hit),
        opt(r.prefill.ratio(), |v| format!("{v:.2}x")),
        moves(r),
        match &r.recognition {
            Some(g) => format!(
                ", sessions recognised {} (wrong {})",
                pct(g.recognised_share()),
                g.wrong
            ),
            None if r.router => ", no routed session (a router)".into(),
            None => String::new(),
        },
        if r.stalled() {
            format!(" (WARNING: bench process stalled {:.1} s)", r.stalled_s)
        } else {
            String::new()
        }
    )
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

/// 1234567 as "1.23M", 45678 as "45.7k".
fn tokens(n: f64) -> String {
    if n >= 1e6 {
        format!("{:.2}M", n / 1e6)
    } else if n >= 1e3 {
        format!("{:.1}k", n / 1e3)
    } else {
        format!("{n:.0}")
    }
}

/// "min-max (extremes)" of a spread, each value through `f`.
fn spread(s: Option<Spread>, f: impl Fn(f64) -> String) -> String {
    match s {
        Some(s) => format!(
            "{}-{} ({}-{})",
            f(s.min_mean),
            f(s.max_mean),
            f(s.min),
            f(s.max)
        ),
        None => "-".into(),
    }
}

fn prefill(p: &PrefillBound) -> String {
    match p.ratio() {
        Some(r) => format!(
            "{} / {} = {r:.2}x",
            tokens(p.prefilled as f64),
            tokens(p.bound as f64)
        ),
        None => "-".into(),
    }
}

pub fn markdown(scenarios: &[ScenarioResult], elapsed: Duration) -> String {
    let mut out = String::new();
    out.push_str("## llm-gateway bench\n\n");
    let cells: usize = scenarios.iter().map(|s| s.cells.len()).sum();
    out.push_str(&format!(
        "Total run time {} for {} scenario(s), {} cell(s).\n",
        fmt_secs(Duration::from_secs(elapsed.as_secs())),
        scenarios.len(),
        cells
    ));
    for s in scenarios {
        out.push_str(&format!("\n### Scenario {}\n\n", s.plan.scenario));
        out.push_str(&peers_markdown(s));
        out.push_str(&scenario_markdown(&s.plan, &s.cells));
        out.push_str(&best_peer_markdown(&s.plan, &s.cells));
    }
    out.push_str(
        "\nColumns: requests started in the measured window (after warm-up); errors = every \
         response the client saw fail (any non-2xx status, 429 included, a transport error, a \
         broken stream or a timeout); TTFT from request start to the first content frame; \
         decode = completion tokens after the first over the time from first to last frame, per \
         request (p5 = slowest 5%); output tok/s and the engine-side cache hit from the engines' \
         counters over the window; cache hit = Σ cached / Σ prompt tokens of the requests' \
         usage frames; prefilled / bound = Σ (prompt - cached) of the measured requests against \
         what a perfect prefix cache shared by all engines would have prefilled (each turn's \
         prompt minus its session's previous prompt + completion; a session's first turn minus \
         the system prompt; a sub-agent's first turn minus its parent's history), so 1.00x is \
         ideal and the simulated engine, which caches prompts \
         only and in whole blocks, leaves even a perfectly sticky cell slightly above it; live \
         sessions and bound tokens per engine = sessions whose last turn went to each engine, \
         and their last prompt + completion, counted by the client every 0.5 s: mean of the \
         least and most loaded engine, extremes in brackets; moves = the gateway's spill + \
         migrated placements over the window; peer switches = later turns that landed on \
         another engine than the session's previous turn; new sessions per peer = engine of \
         each session's first request (e0/e1/...), whole cell; engine load and queue = requests \
         in each engine and queued beyond max_running, sampled every 100 ms; gateway CPU from \
         /proc/<pid>/stat over the window. With several replicas, moves, placements and \
         gateway CPU are every replica's together. A router cell (--router-cmd, or a peer of \
         --peers) runs the external router in the gateway's place: its engine per request from the engine's \
         response id, its CPU its process group's, no moves or session recognition (it \
         counts no placements and names no session). The reference cell runs no gateway: the client sends \
         a session's first turn to the engine with the fewest of its requests in flight (ties: \
         fewest sessions) and later turns to the same engine, re-placing a session whose engine \
         refuses connections.\n",
    );
    out.push_str(
        "\nThe simulated engine prefills each sequence in its own slot; while any sequence \
         prefills, every sequence decoding on that engine slows by the prefill interference \
         factor per prefill in progress (chunked prefill shares the GPU step). Cold prefills of \
         sessions that lost their cache therefore show up in the decode p5 column; batch size \
         itself does not slow decoding.\n",
    );
    out
}

/// The scenario's peer cells, how they ran, and the peers skipped.
fn peers_markdown(s: &ScenarioResult) -> String {
    let mut out = String::new();
    for (name, command) in &s.peers {
        out.push_str(&format!(
            "- peer cell {name}: `{command}`, started per cell on its engines\n"
        ));
    }
    if s.peers.iter().any(|(n, _)| n == "sglang-cache") {
        out.push_str(
            "- sglang-router 0.3.2 sets no TCP_NODELAY on client sockets: on the bench's \
             keep-alive connections its first SSE chunk can wait ~40 ms (Nagle + delayed ACK), \
             which its TTFT includes, as its clients' would\n",
        );
    }
    let hashed = ["vllm-hash", "nginx-hash"];
    if s.plan.opts.session_id != SessionIdMode::Header
        && s.peers.iter().any(|(n, _)| hashed.contains(&n.as_str()))
    {
        out.push_str(&format!(
            "- session ids {}: requests without x-session-id share one hash key, so \
             vllm-hash and nginx-hash send them all to one engine\n",
            s.plan.opts.session_id
        ));
    }
    if !s.peers.is_empty() {
        out.push_str("- a peer's errors are reported but do not fail the run\n");
    }
    for k in &s.skipped_peers {
        out.push_str(&format!("- peer {} SKIPPED: {}\n", k.name, k.reason));
    }
    out
}

fn scenario_markdown(plan: &Plan, results: &[ModeResult]) -> String {
    let mut out = String::new();
    for line in plan.describe().lines() {
        out.push_str(&format!("- {line}\n"));
    }
    if let Some(r) = &plan.opts.router {
        out.push_str(&format!(
            "- router cell {}: `{}`, started per cell on its engines; requests to \
             /v1/chat/completions\n",
            r.label, r.command
        ));
    }
    out.push('\n');
    out.push_str(
        "| cell | requests | errors | TTFT p50 | TTFT p95 | TTFT p99 | decode p50 / p5 (tok/s) \
         | output tok/s | cache hit | prefilled / bound | live sessions per engine \
         | bound tokens per engine | moves | spills by reason | peer switches \
         | new sessions per peer | engine load (mean) | queued (mean) | gateway CPU |\n",
    );
    out.push_str("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|---|--:|---|--:|---|---|---|--:|\n");
    for r in results {
        let secs = |v: Option<f64>| opt(v, |v| format!("{v:.3} s"));
        // In engine order (e2 before e10), other peer names after.
        let mut peers: Vec<(&String, &usize)> = r.new_sessions_per_peer.iter().collect();
        peers.sort_by_key(|(p, _)| (analysis::engine_index(p).unwrap_or(usize::MAX), *p));
        let new_sessions = peers
            .iter()
            .map(|(_, n)| n.to_string())
            .collect::<Vec<_>>()
            .join("/");
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} / {} | {:.0} | {} | {} | {} | {} | {} | {} | {} \
             | {} | {} | {} | {} |\n",
            r.mode,
            r.requests,
            if r.errors_total > r.errors {
                format!("{} ({} in warm-up)", r.errors, r.errors_total - r.errors)
            } else {
                r.errors.to_string()
            },
            secs(r.ttft_p50),
            secs(r.ttft_p95),
            secs(r.ttft_p99),
            opt(r.decode_p50, |v| format!("{v:.1}")),
            opt(r.decode_p5, |v| format!("{v:.1}")),
            r.output_tok_s,
            pct(r.cache_hit),
            prefill(&r.prefill),
            spread(r.sessions_spread, |v| format!("{v:.1}")),
            spread(r.tokens_spread, tokens),
            moves(r),
            reasons(&r.spills),
            pct(r.switch_rate),
            if new_sessions.is_empty() {
                "-".into()
            } else {
                new_sessions
            },
            list(&r.engine_load),
            list(&r.engine_queue),
            opt(r.gateway_cpu, |v| format!("{v:.2} cores")),
        ));
    }
    out.push_str(&recognition_markdown(plan, results));
    for r in results.iter().filter(|r| r.stalled()) {
        out.push_str(&format!(
            "\n**Warning: {}: this process was starved of CPU (timer lag max {:.0} ms, {:.1} s \
             stalled in total); its latency numbers are unreliable. Rerun on a quieter machine.**\n",
            r.mode,
            r.lag_max.unwrap_or(0.0) * 1e3,
            r.stalled_s
        ));
    }
    let mut notes = Vec::new();
    for r in results {
        let mut extra = vec![format!("engine-side cache hit {}", pct(r.cache_hit_engine))];
        if !r.error_kinds.is_empty() {
            let kinds: Vec<String> = r
                .error_kinds
                .iter()
                .map(|(k, n)| format!("{k} x{n}"))
                .collect();
            extra.push(format!("errors by kind: {}", kinds.join(", ")));
        }
        if let Some(i) = r.load_imbalance() {
            extra.push(format!("load imbalance (max/mean) {i:.2}"));
        }
        if r.kv_committed.iter().any(Option::is_some) {
            let kv: Vec<String> = r
                .kv_committed
                .iter()
                .map(|v| opt(*v, |v| format!("{:.0}%", v * 100.0)))
                .collect();
            extra.push(format!(
                "KV committed to running sequences (mean) {}",
                kv.join("/")
            ));
        }
        if !r.placements.is_empty() {
            extra.push(format!("placements {}", reasons(&r.placements)));
        }
        if !r.migrations.is_empty() {
            extra.push(format!("migrations {}", reasons(&r.migrations)));
        }
        if let Some(c) = r.bench_cpu {
            extra.push(format!("bench process (client + engines) CPU {c:.2} cores"));
        }
        if let (Some(p99), Some(max)) = (r.lag_p99, r.lag_max) {
            extra.push(format!(
                "timer lag p99 {:.0} ms, max {:.0} ms, stalled {:.1} s",
                p99 * 1e3,
                max * 1e3,
                r.stalled_s
            ));
        }
        if r.cut > 0 {
            extra.push(format!("{} request(s) cut at the end of the drain", r.cut));
        }
        if let Some(e) = &r.first_error {
            extra.push(format!("first error: {e}"));
        }
        notes.push(format!("- {}: {}", r.mode, extra.join("; ")));
    }
    out.push('\n');
    out.push_str(&notes.join("\n"));
    out.push('\n');
    out
}

/// "a x3, b x1" of the X-Routed-Source counts.
fn sources(m: &BTreeMap<String, usize>) -> String {
    if m.is_empty() {
        return "-".into();
    }
    m.iter()
        .map(|(k, n)| format!("{k} x{n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The session-recognition table of the gateway cells (none without one);
/// for a router cell, that there is nothing to recognise.
fn recognition_markdown(plan: &Plan, results: &[ModeResult]) -> String {
    let routers: Vec<&str> = results
        .iter()
        .filter(|r| r.router)
        .map(|r| r.mode.as_str())
        .collect();
    let cells: Vec<(&ModeResult, &Recognition)> = results
        .iter()
        .filter_map(|r| r.recognition.as_ref().map(|g| (r, g)))
        .collect();
    if cells.is_empty() {
        if routers.is_empty() {
            return String::new();
        }
        return format!(
            "\nSession recognition, session ids: {}: no routed session in {} (an external \
             router sets no X-Routed-* headers; its engines are told from their response ids).\n",
            plan.opts.session_id,
            routers.join(", ")
        );
    }
    let mut out = format!(
        "\nSession recognition, session ids: {}. Later turns = successful measured turns after \
         their session's first; recognised = its X-Routed-Session equals the one its session's \
         previous successful turn got; wrong = it equals one a different session got in the \
         cell, not its fork parent, child or sibling (a turn of two sessions taken for one is \
         both); without an id = the same over the turns that sent no session id; sources = \
         X-Routed-Source of every successful measured request.\n\n\
         | cell | later turns | recognised | wrong | without an id: turns, recognised \
         | X-Routed-Source |\n|---|--:|--:|--:|--:|---|\n",
        plan.opts.session_id
    );
    for (r, g) in cells {
        out.push_str(&format!(
            "| {} | {} | {} | {} ({}) | {} | {} |\n",
            r.mode,
            g.turns,
            pct(g.recognised_share()),
            g.wrong,
            pct(g.wrong_share()),
            if g.anonymous_turns > 0 {
                format!("{}, {}", g.anonymous_turns, pct(g.anonymous_share()))
            } else {
                "-".into()
            },
            sources(&g.sources),
        ));
    }
    out
}

fn recognition_json(g: &Option<Recognition>) -> Value {
    match g {
        Some(g) => json!({
            "later_turns": g.turns,
            "recognised": g.recognised,
            "recognised_share": g.recognised_share(),
            "wrong": g.wrong,
            "wrong_share": g.wrong_share(),
            "anonymous_turns": g.anonymous_turns,
            "anonymous_recognised": g.anonymous_recognised,
            "anonymous_recognised_share": g.anonymous_share(),
            "routed_source": g.sources,
        }),
        None => Value::Null,
    }
}

fn spread_json(s: Option<Spread>) -> Value {
    match s {
        Some(s) => {
            json!({"min_mean": s.min_mean, "max_mean": s.max_mean, "min": s.min, "max": s.max})
        }
        None => Value::Null,
    }
}

fn cell_json(r: &ModeResult, best: Option<&ModeResult>) -> Value {
    let mut v = cell_json_measured(r);
    // Added apart: one json! of every member passes the macro's recursion
    // limit.
    if let Value::Object(m) = &mut v {
        m.insert("peer".into(), r.peer.into());
        m.insert(
            "vs_best_peer".into(),
            best.map_or(Value::Null, |b| vs_best_json(vs_best(r, b))),
        );
    }
    v
}

fn cell_json_measured(r: &ModeResult) -> Value {
    json!({
        "mode": r.mode,
        "router": r.router,
        "window_s": r.window_s,
        "requests": r.requests,
        "errors": r.errors,
        "errors_by_kind": r.error_kinds,
        "requests_total": r.requests_total,
        "errors_total": r.errors_total,
        "error_rate": r.error_rate(),
        "cut": r.cut,
        "first_error": r.first_error,
        "ttft_s": {"p50": r.ttft_p50, "p95": r.ttft_p95, "p99": r.ttft_p99},
        "ttft_perfect_cache_bound_s": {"p95": r.ttft_bound_p95, "p99": r.ttft_bound_p99},
        "decode_tok_s": {"p50": r.decode_p50, "p5": r.decode_p5},
        "output_tok_s": r.output_tok_s,
        "cache_hit": r.cache_hit,
        "cache_hit_engine": r.cache_hit_engine,
        "prompt_tokens": r.prompt_tokens,
        "cached_tokens": r.cached_tokens,
        "prefilled_tokens": r.prefill.prefilled,
        "perfect_cache_bound_tokens": r.prefill.bound,
        "prefilled_over_bound": r.prefill.ratio(),
        "live_sessions_per_engine": spread_json(r.sessions_spread),
        "bound_tokens_per_engine": spread_json(r.tokens_spread),
        "moves": (!r.router).then(|| r.moves()),
        "spills": r.spills,
        "migrations": r.migrations,
        "placements": r.placements,
        "peer_switch_rate": r.switch_rate,
        "new_sessions_per_peer": r.new_sessions_per_peer,
        "session_recognition": recognition_json(&r.recognition),
        "engine_load_mean": r.engine_load,
        "engine_queue_mean": r.engine_queue,
        "kv_committed_mean": r.kv_committed,
        "load_imbalance": r.load_imbalance(),
        "gateway_cpu_cores": r.gateway_cpu,
        "bench_cpu_cores": r.bench_cpu,
        "timer_lag_s": {"p99": r.lag_p99, "max": r.lag_max, "stalled": r.stalled_s},
        "unreliable_stall": r.stalled(),
    })
}

fn parameters_json(plan: &Plan) -> Value {
    let w = &plan.workload;
    let engine = |e: &llm_gateway_sim::EngineConfig| {
        json!({
            "max_running": e.max_running,
            "kv_capacity_tokens": e.kv_capacity_tokens,
            "prefill_us_per_token": e.prefill_us_per_token,
            "decode_ms_per_token": e.decode_ms_per_token,
            "block_tokens": e.block_tokens,
        })
    };
    json!({
        "scenario": plan.scenario.name(),
        "engines": plan.opts.engines,
        "sessions_per_engine": plan.sessions_per_engine,
        "duration_s": plan.opts.duration.as_secs_f64(),
        "warmup_s": plan.warmup.as_secs_f64(),
        "seed": plan.opts.seed,
        "gateway_threads": plan.opts.threads,
        "route_extra": plan.opts.route_extra,
        "replicas": plan.opts.replicas,
        "session_store": plan.opts.session_store,
        "router": plan.opts.router.as_ref().map(|r| json!({
            "label": r.label,
            "command": r.command,
        })),
        "session_id": plan.opts.session_id.name(),
        "id_share": (plan.opts.session_id == SessionIdMode::Mixed).then_some(plan.opts.id_share),
        "workload": {
            "system_tokens": w.system_tokens,
            "user_tokens": [w.user_tokens.0, w.user_tokens.1],
            "max_tokens": [w.max_tokens.0, w.max_tokens.1],
            "think_ms": [w.think_ms.0, w.think_ms.1],
            "max_context": w.max_context,
            "long_sessions": w.long.map(|l| json!({
                "slots": w.long_slots(),
                "user_tokens": [l.user_tokens.0, l.user_tokens.1],
                "max_context": l.max_context,
            })),
            "forks": w.forks.map(|f| json!({
                "one_in": f.one_in,
                "agents": [f.agents.0, f.agents.1],
                "turns": [f.turns.0, f.turns.1],
                "mean_live_per_parent": f.mean_live(),
            })),
        },
        "engine": engine(&plan.engine),
        "per_engine": plan.engines.iter().map(engine).collect::<Vec<_>>(),
        "failover": plan.failover.map(|f| json!({
            "engine": f.engine,
            "at_s": f.at.as_secs_f64(),
            "outage_s": f.outage.as_secs_f64(),
        })),
        "overload": plan.overload.map(|t| json!({
            "turn_busy_s": t.busy_s,
            "in_engine_share": t.in_engine,
            "sequences_per_engine": t.sequences,
            "committed_kv_tokens": t.committed_tokens,
        })),
    })
}

pub fn json(scenarios: &[ScenarioResult], elapsed: Duration) -> Value {
    let scenarios: Vec<Value> = scenarios
        .iter()
        .map(|s| {
            let best = best_peer(&s.cells, s.plan.scenario.errors_expected()).map(|i| &s.cells[i]);
            json!({
                "scenario": s.plan.scenario.name(),
                "parameters": parameters_json(&s.plan),
                "modes": s.cells.iter().map(|c| cell_json(c, best)).collect::<Vec<_>>(),
                "best_peer": best.map(|b| b.mode.as_str()),
                "peers": s.peers.iter().map(|(name, command)| json!({
                    "name": name,
                    "command": command,
                })).collect::<Vec<_>>(),
                "skipped_peers": s.skipped_peers.iter().map(|k| json!({
                    "name": k.name,
                    "reason": k.reason,
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({
        "elapsed_s": elapsed.as_secs_f64(),
        "scenarios": scenarios,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_kinds_group_what_the_client_saw() {
        assert_eq!(error_kind("status 429: {\"error\":1}"), "status 429");
        assert_eq!(error_kind("status 502: bad gateway"), "status 502");
        assert_eq!(error_kind("connect: Connection refused"), "connect");
        assert_eq!(error_kind("connect e0: reset"), "connect");
        assert_eq!(error_kind("no complete response in 120s"), "timeout");
        assert_eq!(error_kind("stream cut: connection closed mid-body"), "cut");
        assert_eq!(
            error_kind("connection closed before the response head"),
            "cut"
        );
        assert_eq!(error_kind("stream had no usage frame"), "other");
    }

    #[test]
    fn a_router_cell_claims_no_recognition_and_no_moves() {
        use crate::router::RouterSpec;
        use crate::window::{Lag, LoadSamples, Snapshot};
        let opts = crate::options::Options {
            duration: Duration::from_secs(10),
            warmup: Some(Duration::from_secs(1)),
            modes: vec!["vllm".into()],
            router: Some(RouterSpec {
                command: "vllm-router --port {port}".into(),
                label: "vllm".into(),
            }),
            ..Default::default()
        };
        let plan = Plan::new(opts);
        let snap = || Snapshot {
            at: tokio::time::Instant::now(),
            placements: Vec::new(),
            engines: Vec::new(),
            gateway_cpu: None,
            bench_cpu: None,
        };
        let window = Window {
            before: snap(),
            after: snap(),
            retired: Vec::new(),
            load: LoadSamples::default(),
            kv_committed: Vec::new(),
            lag: Lag::default(),
        };
        // Two turns of one session on e1, as a router cell records them:
        // the engine from the response id, no X-Routed-* header.
        let turn = |turn: u32, start: u64| Record {
            turn,
            session: "s0".into(),
            start: Duration::from_secs(start),
            end: Duration::from_secs(start + 1),
            ok: true,
            ttft: Some(Duration::from_millis(100)),
            usage: Some(crate::client::Usage {
                prompt_tokens: 1000,
                completion_tokens: 10,
                cached_tokens: 500,
            }),
            engine: Some(1),
            peer: Some("e1".into()),
            first_of_session: turn == 0,
            switched_peer: (turn > 0).then_some(false),
            ..Record::default()
        };
        let spec = plan.opts.router.clone().unwrap();
        let cell = CellSpec {
            name: "vllm",
            kind: CellKind::Router(&spec),
        };
        let r = summarize(&cell, &plan, &[turn(0, 2), turn(1, 4)], 0, &window);
        assert!(r.router && r.recognition.is_none());
        assert_eq!(r.new_sessions_per_peer.get("e1"), Some(&1));
        assert_eq!(r.switch_rate, Some(0.0));
        assert_eq!(r.cache_hit, Some(0.5));
        assert!(progress_line("uniform", &r).contains("moves -, no routed session"));
        let md = scenario_markdown(&plan, std::slice::from_ref(&r));
        assert!(md.contains("no routed session in vllm"), "{md}");
        assert!(
            md.contains("router cell vllm: `vllm-router --port {port}`"),
            "{md}"
        );
        assert!(!md.contains("| recognised |"), "{md}");
        let v = cell_json(&r, None);
        assert_eq!(v["router"], true);
        assert!(v["moves"].is_null() && v["session_recognition"].is_null());
        assert_eq!(parameters_json(&plan)["router"]["label"], "vllm");
        // A gateway cell is as before.
        let mut g = r.clone();
        g.router = false;
        assert!(progress_line("uniform", &g).contains("moves 0"));
    }

    fn cell(mode: &str, peer: bool, p95: Option<f64>, hit: Option<f64>, tok_s: f64) -> ModeResult {
        ModeResult {
            mode: mode.into(),
            router: peer,
            peer,
            requests: 100,
            requests_total: 100,
            ttft_p95: p95,
            ttft_p99: p95.map(|p| p * 2.0),
            cache_hit: hit,
            output_tok_s: tok_s,
            ..ModeResult::default()
        }
    }

    fn scenario(cells: Vec<ModeResult>, peers: &[&str], skipped: &[&str]) -> ScenarioResult {
        let opts = crate::options::Options {
            duration: Duration::from_secs(10),
            warmup: Some(Duration::from_secs(1)),
            peers: crate::peers::PEERS.to_vec(),
            ..Default::default()
        };
        ScenarioResult {
            plan: Plan::new(opts),
            cells,
            peers: peers
                .iter()
                .map(|p| (p.to_string(), format!("{p} --port {{port}}")))
                .collect(),
            skipped_peers: skipped
                .iter()
                .map(|p| Skipped {
                    name: p.to_string(),
                    reason: "x not found on PATH; run benches/peers.sh".into(),
                })
                .collect(),
        }
    }

    #[test]
    fn the_best_peer_is_the_fastest_p95_of_the_peers_and_the_reference() {
        let cells = vec![
            // The fastest cell of all is the gateway's: not a peer.
            cell("load_aware", false, Some(0.2), Some(0.9), 110.0),
            cell(REFERENCE, false, Some(0.8), Some(0.7), 100.0),
            cell("vllm-sticky", true, Some(0.4), Some(0.8), 100.0),
            // Faster still, but no p95 (nothing succeeded): no claim.
            cell("vllm-cache", true, None, None, 0.0),
            cell("nginx-hash", true, Some(0.4), Some(0.5), 50.0),
        ];
        // Ties go to the cell that ran first.
        assert_eq!(best_peer(&cells, false), Some(2));
        let v = vs_best(&cells[0], &cells[2]);
        assert_eq!(v.p95, Some(0.5));
        assert_eq!(v.p99, Some(0.5));
        assert!((v.hit_points.unwrap() - 10.0).abs() < 1e-9, "{v:?}");
        assert_eq!(v.tok_s, Some(1.1));
        // The best against itself: 1x, 0 points.
        assert_eq!(
            vs_best(&cells[2], &cells[2]),
            VsBest {
                p95: Some(1.0),
                p99: Some(1.0),
                hit_points: Some(0.0),
                tok_s: Some(1.0)
            }
        );
        // Nothing to compare: no ratio rather than a division by zero.
        let v = vs_best(&cells[3], &cells[2]);
        assert_eq!(
            (v.p95, v.p99, v.hit_points, v.tok_s),
            (None, None, None, Some(0.0))
        );
        let zero = cell("z", true, Some(0.0), None, 0.0);
        assert_eq!(vs_best(&cells[0], &zero).p95, None);
        assert_eq!(vs_best(&cells[0], &zero).tok_s, None);
        // A peer over the error limit cannot be best where errors are not
        // the point; where they are, it can.
        let mut erring = cells.clone();
        erring[2].errors_total = 10;
        assert_eq!(best_peer(&erring, false), Some(4));
        assert_eq!(best_peer(&erring, true), Some(2));

        let s = scenario(cells, &["vllm-sticky", "sglang-cache"], &["vllm-hash"]);
        let md = markdown(std::slice::from_ref(&s), Duration::from_secs(60));
        assert!(md.contains("Best peer: **vllm-sticky**"), "{md}");
        assert!(
            md.contains("| load_aware | 0.50x | 0.50x | +10.0 pts | 1.10x |"),
            "{md}"
        );
        assert!(md.contains("| vllm-cache | - | - | - | 0.00x |"), "{md}");
        assert!(md.contains("- peer vllm-hash SKIPPED: x not found"), "{md}");
        assert!(md.contains("peer cell vllm-sticky: `vllm-sticky --port {port}`"));
        assert!(md.contains("no TCP_NODELAY"), "{md}");
        assert!(md.contains("do not fail the run"), "{md}");
        let j = json(std::slice::from_ref(&s), Duration::from_secs(60));
        let sc = &j["scenarios"][0];
        assert_eq!(sc["best_peer"], "vllm-sticky");
        assert_eq!(sc["skipped_peers"][0]["name"], "vllm-hash");
        assert_eq!(sc["peers"][1]["name"], "sglang-cache");
        let la = &sc["modes"][0];
        assert_eq!(
            (la["mode"].as_str(), la["peer"].as_bool()),
            (Some("load_aware"), Some(false))
        );
        assert_eq!(la["vs_best_peer"]["p95"], 0.5);
        assert_eq!(la["vs_best_peer"]["tok_s"], 1.1);
        assert_eq!(sc["modes"][2]["peer"], true);
        assert!(sc["modes"][3]["vs_best_peer"]["p95"].is_null());
    }

    #[test]
    fn no_peer_ran_no_best_peer_and_no_ratios() {
        // Every peer skipped, only gateway cells: no best, nothing divided.
        let s = scenario(
            vec![cell("load_aware", false, Some(0.2), Some(0.9), 110.0)],
            &[],
            &["vllm-sticky", "nginx-hash"],
        );
        assert_eq!(best_peer(&s.cells, false), None);
        let md = markdown(std::slice::from_ref(&s), Duration::from_secs(60));
        assert!(md.contains("No best peer"), "{md}");
        assert!(!md.contains("vs best peer"), "{md}");
        assert!(md.contains("- peer nginx-hash SKIPPED"), "{md}");
        let j = json(std::slice::from_ref(&s), Duration::from_secs(60));
        let sc = &j["scenarios"][0];
        assert!(sc["best_peer"].is_null());
        assert!(sc["modes"][0]["vs_best_peer"].is_null());
        assert_eq!(sc["skipped_peers"].as_array().map(Vec::len), Some(2));
        // A reference cell that completed nothing is no best peer either.
        let s = scenario(vec![cell(REFERENCE, false, None, None, 0.0)], &[], &[]);
        assert_eq!(best_peer(&s.cells, false), None);
        assert!(markdown(&[s], Duration::ZERO).contains("No best peer"));
        // Without --peers and without a reference cell: not a word of it.
        let mut s = scenario(vec![cell("hash", false, Some(0.3), None, 1.0)], &[], &[]);
        s.plan.opts.peers.clear();
        let md = markdown(&[s], Duration::ZERO);
        assert!(
            !md.contains("best peer") && !md.contains("Best peer"),
            "{md}"
        );
    }

    #[test]
    fn token_counts_and_spreads_read_at_a_glance() {
        assert_eq!(tokens(950.0), "950");
        assert_eq!(tokens(45_678.0), "45.7k");
        assert_eq!(tokens(1_234_567.0), "1.23M");
        let s = Spread {
            min_mean: 6.04,
            max_mean: 9.96,
            min: 4.0,
            max: 12.0,
        };
        assert_eq!(
            spread(Some(s), |v| format!("{v:.1}")),
            "6.0-10.0 (4.0-12.0)"
        );
        assert_eq!(spread(None, tokens), "-");
        let p = PrefillBound {
            prefilled: 1_500_000,
            bound: 1_000_000,
        };
        assert_eq!(prefill(&p), "1.50M / 1.00M = 1.50x");
    }
}
