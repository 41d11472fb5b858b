//! Per-mode results: computed from the request records and the window
//! snapshots, printed as a markdown table or JSON.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{json, Value};

use super::options::{fmt_secs, Plan};
use super::stats::{percentile, sum};
use super::{placements_by_reason, Record, Window};

#[derive(Debug, Clone, Default)]
pub struct ModeResult {
    pub mode: String,
    pub window_s: f64,
    /// Requests started in the measured window (successful or not).
    pub requests: usize,
    pub errors: usize,
    /// Every request of the mode, warm-up included (cut ones excluded).
    pub requests_total: usize,
    pub errors_total: usize,
    pub cut: u64,
    pub first_error: Option<String>,
    pub ttft_p50: Option<f64>,
    pub ttft_p95: Option<f64>,
    pub ttft_p99: Option<f64>,
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
    pub spills: BTreeMap<String, f64>,
    pub migrations: BTreeMap<String, f64>,
    /// Every placement kind the gateway counted over the window.
    pub placements: BTreeMap<String, f64>,
    /// Later requests of a session that landed on another peer than its
    /// previous one.
    pub switch_rate: Option<f64>,
    /// Peer of each session's first request, whole run.
    pub new_sessions_per_peer: BTreeMap<String, usize>,
    /// Mean requests in each engine (queued or running) over the window.
    pub engine_load: Vec<f64>,
    /// Mean requests queued beyond max_running in each engine.
    pub engine_queue: Vec<f64>,
    /// Gateway CPU over the window, in cores.
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
    mode: &str,
    plan: &Plan,
    records: &[Record],
    cut: u64,
    observed: &Window,
) -> ModeResult {
    let (before, after) = (&observed.before, &observed.after);
    let (load, lag) = (&observed.load, &observed.lag);
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
    let mut new_sessions_per_peer = BTreeMap::new();
    for r in done.iter().filter(|r| r.ok && r.first_of_session) {
        let peer = r.peer.clone().unwrap_or_else(|| "?".into());
        *new_sessions_per_peer.entry(peer).or_insert(0) += 1;
    }
    let window = after.at.saturating_duration_since(before.at).as_secs_f64();
    let engine_delta = |name: &str| -> f64 {
        after
            .engines
            .iter()
            .zip(&before.engines)
            .map(|(a, b)| sum(a, name, &[]) - sum(b, name, &[]))
            .sum()
    };
    let generated = engine_delta("vllm:generation_tokens_total");
    let queried = engine_delta("vllm:prefix_cache_queries_total");
    let hits = engine_delta("vllm:prefix_cache_hits_total");
    let cpu = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if window > 0.0 => Some((a - b) / window),
        _ => None,
    };
    let mut placements = BTreeMap::new();
    for s in after.placements.iter().filter(|s| {
        s.name == "llm_gateway_placements_total" && s.label("route") == Some(super::ROUTE)
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
    ModeResult {
        mode: mode.to_string(),
        window_s: window,
        requests: measured.len(),
        errors: measured.iter().filter(|r| !r.ok).count(),
        requests_total: done.len(),
        errors_total: done.iter().filter(|r| !r.ok).count(),
        cut,
        first_error: done.iter().find_map(|r| r.error.clone()),
        ttft_p50: percentile(&ttft, 50.0),
        ttft_p95: percentile(&ttft, 95.0),
        ttft_p99: percentile(&ttft, 99.0),
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
        spills: placements_by_reason(&before.placements, &after.placements, "spill"),
        migrations: placements_by_reason(&before.placements, &after.placements, "migrated"),
        placements,
        switch_rate: (!switches.is_empty())
            .then(|| switches.iter().filter(|s| **s).count() as f64 / switches.len() as f64),
        new_sessions_per_peer,
        engine_load: per_engine(&load.in_engine),
        engine_queue: per_engine(&load.queued),
        gateway_cpu: cpu(after.gateway_cpu, before.gateway_cpu),
        bench_cpu: cpu(after.bench_cpu, before.bench_cpu),
        lag_p99: percentile(&lag.samples, 99.0),
        lag_max: percentile(&lag.samples, 100.0),
        stalled_s: lag.stalled_s,
    }
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

pub fn progress_line(r: &ModeResult) -> String {
    format!(
        "   {}: {} requests ({} errors), TTFT p95 {}, cache hit {}, moves {:.0}{}",
        r.mode,
        r.requests,
        r.errors,
        opt(r.ttft_p95, |v| format!("{v:.3} s")),
        pct(r.cache_hit),
        r.moves(),
        if r.stalled() {
            format!(" (WARNING: bench process stalled {:.1} s)", r.stalled_s)
        } else {
            String::new()
        }
    )
}

pub fn markdown(plan: &Plan, results: &[ModeResult], elapsed: Duration) -> String {
    let mut out = String::new();
    out.push_str("## llm-gateway bench\n\n");
    for line in plan.describe().lines() {
        out.push_str(&format!("- {line}\n"));
    }
    out.push_str(&format!(
        "- total run time {} for {} mode(s)\n\n",
        fmt_secs(Duration::from_secs(elapsed.as_secs())),
        results.len()
    ));
    out.push_str(
        "| mode | requests | errors | TTFT p50 | TTFT p95 | TTFT p99 | decode p50 / p5 (tok/s) \
         | output tok/s | cache hit | moves | spills by reason | peer switches \
         | new sessions per peer | engine load (mean) | queued (mean) | gateway CPU |\n",
    );
    out.push_str("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|--:|---|---|---|--:|\n");
    for r in results {
        let secs = |v: Option<f64>| opt(v, |v| format!("{v:.3} s"));
        let new_sessions = r
            .new_sessions_per_peer
            .values()
            .map(|n| n.to_string())
            .collect::<Vec<_>>()
            .join("/");
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} / {} | {:.0} | {} | {:.0} | {} | {} | {} | {} | {} | {} |\n",
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
            r.moves(),
            reasons(&r.spills),
            pct(r.switch_rate),
            if new_sessions.is_empty() { "-".into() } else { new_sessions },
            list(&r.engine_load),
            list(&r.engine_queue),
            opt(r.gateway_cpu, |v| format!("{v:.2} cores")),
        ));
    }
    out.push_str(
        "\nColumns: requests started in the measured window (after warm-up); TTFT from request \
         start to the first content frame; decode = completion tokens after the first over the \
         time from first to last frame, per request (p5 = slowest 5%); output tok/s and the \
         engine-side cache hit from the engines' counters over the window; cache hit = Σ cached \
         / Σ prompt tokens of the requests' usage frames; moves = the gateway's spill + migrated \
         placements over the window; peer switches = later turns that landed on another engine \
         than the session's previous turn; new sessions per peer = engine of each session's \
         first request (e0/e1/...), whole run; engine load and queue = requests in each engine \
         and queued beyond max_running, sampled every 100 ms; gateway CPU from \
         /proc/<pid>/stat over the window.\n",
    );
    out.push_str(
        "\nThe simulated engine prefills each sequence in its own slot; while any sequence \
         prefills, every sequence decoding on that engine slows by the prefill interference \
         factor per prefill in progress (chunked prefill shares the GPU step). Cold prefills of \
         sessions that lost their cache therefore show up in the decode p5 column; batch size \
         itself does not slow decoding.\n",
    );
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
        if let Some(i) = r.load_imbalance() {
            extra.push(format!("load imbalance (max/mean) {i:.2}"));
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
    out
}

pub fn json(plan: &Plan, results: &[ModeResult], elapsed: Duration) -> Value {
    let e = &plan.engine;
    let w = &plan.workload;
    let modes: Vec<Value> = results
        .iter()
        .map(|r| {
            json!({
                "mode": r.mode,
                "window_s": r.window_s,
                "requests": r.requests,
                "errors": r.errors,
                "requests_total": r.requests_total,
                "errors_total": r.errors_total,
                "error_rate": r.error_rate(),
                "cut": r.cut,
                "first_error": r.first_error,
                "ttft_s": {"p50": r.ttft_p50, "p95": r.ttft_p95, "p99": r.ttft_p99},
                "decode_tok_s": {"p50": r.decode_p50, "p5": r.decode_p5},
                "output_tok_s": r.output_tok_s,
                "cache_hit": r.cache_hit,
                "cache_hit_engine": r.cache_hit_engine,
                "prompt_tokens": r.prompt_tokens,
                "cached_tokens": r.cached_tokens,
                "moves": r.moves(),
                "spills": r.spills,
                "migrations": r.migrations,
                "placements": r.placements,
                "peer_switch_rate": r.switch_rate,
                "new_sessions_per_peer": r.new_sessions_per_peer,
                "engine_load_mean": r.engine_load,
                "engine_queue_mean": r.engine_queue,
                "load_imbalance": r.load_imbalance(),
                "gateway_cpu_cores": r.gateway_cpu,
                "bench_cpu_cores": r.bench_cpu,
                "timer_lag_s": {"p99": r.lag_p99, "max": r.lag_max, "stalled": r.stalled_s},
                "unreliable_stall": r.stalled(),
            })
        })
        .collect();
    json!({
        "parameters": {
            "engines": plan.opts.engines,
            "sessions_per_engine": plan.opts.sessions_per_engine,
            "duration_s": plan.opts.duration.as_secs_f64(),
            "warmup_s": plan.warmup.as_secs_f64(),
            "seed": plan.opts.seed,
            "gateway_threads": plan.opts.threads,
            "workload": {
                "system_tokens": w.system_tokens,
                "user_tokens": [w.user_tokens.0, w.user_tokens.1],
                "max_tokens": [w.max_tokens.0, w.max_tokens.1],
                "think_ms": [w.think_ms.0, w.think_ms.1],
                "max_context": w.max_context,
            },
            "engine": {
                "max_running": e.max_running,
                "kv_capacity_tokens": e.kv_capacity_tokens,
                "prefill_us_per_token": e.prefill_us_per_token,
                "decode_ms_per_token": e.decode_ms_per_token,
                "block_tokens": e.block_tokens,
            },
        },
        "elapsed_s": elapsed.as_secs_f64(),
        "modes": modes,
    })
}
