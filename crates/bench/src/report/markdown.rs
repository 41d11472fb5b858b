//! The results as markdown: a table per scenario, the session-recognition
//! and best-peer tables, the notes under them, and the one line per cell
//! printed while the run goes on.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::analysis::{self, PrefillBound, Recognition, Spread};
use crate::ids::SessionIdMode;
use crate::options::REFERENCE;
use crate::plan::{fmt_secs, Plan};
use crate::result::{ModeResult, ScenarioResult};
use crate::versus::{best_peer, vs_best};

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

/// 1234567 as "1.23M", 45678 as "45.7k".
pub(super) fn tokens(n: f64) -> String {
    if n >= 1e6 {
        format!("{:.2}M", n / 1e6)
    } else if n >= 1e3 {
        format!("{:.1}k", n / 1e3)
    } else {
        format!("{n:.0}")
    }
}

/// "min-max (extremes)" of a spread, each value through `f`.
pub(super) fn spread(s: Option<Spread>, f: impl Fn(f64) -> String) -> String {
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

pub(super) fn prefill(p: &PrefillBound) -> String {
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
        out.push_str(&format!("\n### Scenario {}\n\n", s.plan.label()));
        if let Some(d) = s.plan.draw {
            out.push_str(&format!("Engines: `{}`\n\n", d.flags()));
        }
        out.push_str(&peers_markdown(s));
        out.push_str(&scenario_markdown(&s.plan, &s.cells));
        out.push_str(&best_peer_markdown(&s.plan, &s.cells));
    }
    out.push_str(&super::family::markdown(scenarios));
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

pub(super) fn scenario_markdown(plan: &Plan, results: &[ModeResult]) -> String {
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
