//! `llm-gateway bench`: replay of coding-agent sessions through the gateway.
//!
//! A run is scenarios (`scenario.rs`: presets over the workload and the
//! engines; `options.rs` the flags, `plan.rs` what they resolve to) times
//! modes; each (scenario, mode) pair is a cell (`cell_spec.rs` which cells,
//! `cell.rs` how one runs). Per cell: fresh
//! simulated engines (cold caches), a gateway child process with one route
//! over them in that mode (none for the `reference` cell, where the client
//! places sessions itself, `reference.rs`), and the scenario's seeded
//! workload (`workload.rs`; its text `text.rs`, a session's history
//! `conversation.rs`) replayed by one task per session slot over a
//! keep-alive connection (`session.rs`, `client.rs`). Each cell runs for
//! `--duration`; requests started in the first `--warmup` are not measured
//! (the run opens with every slot's first, pre-aged session arriving cold
//! everywhere). Measured per cell: TTFT, per-request decode speed, output
//! tokens/s, prompt cache hit rate, prefill against a perfect cache and how
//! sessions were bound to engines (`analysis.rs`), how the gateway
//! recognised sessions (its `X-Routed-Session` against the bench's own
//! sessions; `--session-id`, `ids.rs`, decides how requests name theirs),
//! errors, the gateway's placement counters (spills, migrations) over the
//! measured window, and how the engines' load was spread (`window.rs`);
//! `result.rs` makes a cell's result of all that. Progress goes to stderr
//! every few seconds; the results are printed as markdown or JSON
//! (`report/`); `--plot` draws them (`plot.rs`).
//!
//! With `--router-cmd` the one cell of each scenario runs an external
//! router (`router.rs`) where the gateway would be: same engines, same
//! workload, the engine of each request told from the engine's answer.
//! `--peers` adds such router cells after the others, the real peer
//! routers (`peers.rs`: vllm-router, sglang-router, nginx), and the report
//! compares every cell with the best of them and the reference cell
//! (`versus.rs`).
//!
//! With `--replicas N` a gateway cell runs N gateways, each request sent to
//! one of them; `--session-store redis` gives them a shared redis-server
//! (`gateway.rs`), `--redis-delay` puts a latency relay in front of it
//! (`redis_relay.rs`) and `--redis-stop-at` kills it inside the measured
//! window (`cell.rs`).
//!
//! Everything listens on 127.0.0.1; the gateway process (or the router's
//! process group) is killed on every way out (see `gateway.rs`,
//! `router.rs`), Ctrl-C and SIGTERM included.

mod analysis;
mod cell;
mod cell_spec;
mod client;
mod conversation;
mod family;
mod gateway;
mod ids;
mod options;
mod peers;
mod plan;
mod plot;
mod process;
mod progress;
mod record;
mod redis_relay;
mod reference;
mod report;
mod result;
mod router;
mod scenario;
mod session;
mod stats;
mod text;
mod versus;
mod window;
mod workload;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

pub use options::BenchArgs;
use options::Options;
use plan::{fmt_secs, Plan};
use progress::Progress;
pub use record::Record;
use result::{ScenarioResult, MAX_ERROR_RATE};
pub use window::{Lag, LoadSamples};
use workload::Workload;

/// Entry point of `llm-gateway bench`; returns the process exit code
/// (2 for arguments that clap accepted but that do not fit together).
pub fn run(args: BenchArgs) -> i32 {
    let opts = match args.resolve() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("llm-gateway bench: {e}");
            return 2;
        }
    };
    let plans = match plan::plans(&opts) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("llm-gateway bench: {e}");
            return 2;
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("bench")
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("llm-gateway bench: cannot start the runtime: {e}");
            return 1;
        }
    };
    let code = rt.block_on(async move {
        tokio::select! {
            code = run_plan(opts, plans) => code,
            signal = interrupted() => {
                // Dropping `run` drops the gateway process guard and the
                // engines of the mode in progress, which stops them.
                eprintln!("llm-gateway bench: {signal}, stopping");
                130
            }
        }
    });
    rt.shutdown_timeout(Duration::from_secs(2));
    code
}

async fn interrupted() -> &'static str {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        r = tokio::signal::ctrl_c() => match r {
            Ok(()) => "interrupted",
            // No handler, no interruption to report: wait forever.
            Err(_) => std::future::pending().await,
        },
        () = term => "terminated",
    }
}

async fn run_plan(opts: Options, plans: Vec<Plan>) -> i32 {
    let started = std::time::Instant::now();
    let results = match run_cells(&opts, plans).await {
        Ok(r) => r,
        Err(code) => return code,
    };
    let elapsed = started.elapsed();
    report_and_judge(&opts, &results, elapsed)
}

/// Every scenario's cells, in order; the exit code on the first failure
/// (said on stderr).
async fn run_cells(opts: &Options, plans: Vec<Plan>) -> Result<Vec<ScenarioResult>, i32> {
    let exe = if opts.needs_gateway() {
        match opts.gateway.clone().map_or_else(std::env::current_exe, Ok) {
            Ok(exe) => exe,
            Err(e) => {
                eprintln!("llm-gateway bench: cannot find the gateway binary: {e}");
                return Err(1);
            }
        }
    } else {
        PathBuf::new()
    };
    // Looked for once, so every scenario runs (and skips) the same peers.
    let (found, skipped) = if opts.peers.is_empty() {
        (Vec::new(), Vec::new())
    } else {
        peers::find(
            &opts.peers,
            &peers::dir(),
            std::env::var_os("PATH").as_deref(),
        )
    };
    let cells = cell_spec::cells(opts, &found);
    let mut progress = Progress::new(plans.len() * cells.len(), opts.duration);
    eprintln!(
        "llm-gateway bench: {} scenario(s) x {} cell(s) = {} cells, ~{} in all",
        plans.len(),
        cells.len(),
        progress.total(),
        fmt_secs(Duration::from_secs(progress.remaining_s(0.0).round() as u64)),
    );
    let mut results = Vec::new();
    for plan in plans {
        eprintln!("\n== scenario {}\n{}\n", plan.label(), plan.describe());
        if let Some(d) = plan.draw {
            eprintln!("engines of family draw {}: {}\n", d.label(), d.flags());
        }
        let workload = Arc::new(Workload::new(plan.workload.clone()));
        let mut done = Vec::new();
        for cell in &cells {
            let cell_started = std::time::Instant::now();
            match cell::run_mode(&plan, &workload, cell, &exe, &progress).await {
                Ok(r) => {
                    eprintln!("{}", report::progress_line(&plan.label(), &r));
                    done.push(r);
                }
                Err(e) => {
                    eprintln!(
                        "llm-gateway bench: cell {}/{} failed: {e}",
                        plan.label(),
                        cell.name
                    );
                    return Err(1);
                }
            }
            progress.cell_done(cell_started.elapsed());
        }
        results.push(ScenarioResult {
            plan,
            cells: done,
            peers: found
                .iter()
                .map(|f| (f.peer.name.to_string(), f.describe()))
                .collect(),
            skipped_peers: skipped.clone(),
        });
    }
    Ok(results)
}

/// Prints the results and draws the plot; the exit code they make.
fn report_and_judge(opts: &Options, results: &[ScenarioResult], elapsed: Duration) -> i32 {
    if opts.json {
        let mut report = report::json(results, elapsed);
        // One engine profile for the whole run, beside the scenarios.
        report["engine_profile"] = opts.engine_profile.name().into();
        println!("{report}");
    } else {
        println!("{}", report::markdown(results, elapsed));
    }
    let mut code = 0;
    if let Some(path) = &opts.plot {
        match plot::draw(path, results) {
            Ok(()) => eprintln!("llm-gateway bench: wrote {}", path.display()),
            Err(e) => {
                eprintln!("llm-gateway bench: cannot draw {}: {e}", path.display());
                code = 1;
            }
        }
    }
    let over_limit = |peer: bool| -> Vec<String> {
        results
            .iter()
            .filter(|s| !s.plan.scenario.errors_expected())
            .flat_map(|s| {
                s.cells
                    .iter()
                    .filter(move |r| r.peer == peer && r.error_rate() > MAX_ERROR_RATE)
                    .map(move |r| format!("{}/{}", s.plan.label(), r.mode))
            })
            .collect()
    };
    // A peer is measured, not tested: its errors are in the report only.
    let peer_errors = over_limit(true);
    if !peer_errors.is_empty() {
        eprintln!(
            "llm-gateway bench: more than {:.0}% errors in peer cell(s), reported, not failing \
             the run: {}",
            MAX_ERROR_RATE * 100.0,
            peer_errors.join(", ")
        );
    }
    let failed = over_limit(false);
    if !failed.is_empty() {
        eprintln!(
            "llm-gateway bench: more than {:.0}% errors in: {}",
            MAX_ERROR_RATE * 100.0,
            failed.join(", ")
        );
        code = 1;
    }
    code
}

#[cfg(test)]
mod tests {
    use super::*;

    /// nginx's path, or None: then a loud skip outside CI, a failure under
    /// CI (`./dev test` installs nginx-light there).
    fn nginx() -> Option<PathBuf> {
        let path = std::env::var_os("PATH");
        match peers::locate(peers::Program::Nginx, &peers::dir(), path.as_deref()) {
            Ok(p) => Some(p),
            Err(why) => {
                assert!(
                    std::env::var_os("CI").is_none(),
                    "CI is set but {why}: `./dev test` installs nginx-light"
                );
                eprintln!(
                    "\n!!!!! SKIPPED: the nginx peer cell test needs nginx ({why}). It FAILS \
                     under CI. !!!!!\n"
                );
                None
            }
        }
    }

    /// A real run: the reference cell, then nginx as a peer router on the
    /// same engines and workload, through the run's own path.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_run_with_the_nginx_peer_after_the_reference_cell() {
        if nginx().is_none() {
            return;
        }
        let opts = options::tests::parse(
            "--quick --peers nginx-hash --modes reference --scenario uniform --engine-profile slots --engines 2 \
             --sessions 4",
        )
        .expect("options");
        let plans = plan::plans(&opts).expect("plans");
        let results = run_cells(&opts, plans).await.expect("the run");
        let s = &results[0];
        let names: Vec<&str> = s.cells.iter().map(|c| c.mode.as_str()).collect();
        assert_eq!(names, vec!["reference", "nginx-hash"]);
        assert!(s.skipped_peers.is_empty());
        let nginx = &s.cells[1];
        assert!(nginx.peer && nginx.router && !s.cells[0].peer);
        assert!(nginx.requests > 0 && nginx.errors_total == 0, "{nginx:?}");
        // nginx forwarded to the engines: each request's engine came from
        // its response id, and the header's hash kept sessions in place.
        let engines_used = nginx.new_sessions_per_peer.values().filter(|n| **n > 0);
        assert!(
            engines_used.count() >= 1,
            "{:?}",
            nginx.new_sessions_per_peer
        );
        assert!(!nginx.new_sessions_per_peer.contains_key("?"));
        assert_eq!(nginx.switch_rate, Some(0.0));
        let best = versus::best_peer(&s.cells, false).expect("a best peer");
        let j = report::json(&results, Duration::ZERO);
        assert_eq!(j["scenarios"][0]["best_peer"], s.cells[best].mode.as_str());
        assert!(j["scenarios"][0]["modes"][1]["vs_best_peer"]["p95"].is_number());
        // Peer errors do not fail the run, nor does this one.
        assert_eq!(report_and_judge(&opts, &results, Duration::ZERO), 0);
    }
}
