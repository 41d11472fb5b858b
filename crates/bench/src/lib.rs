//! `llm-gateway bench`: replay of coding-agent sessions through the gateway.
//!
//! For each placement mode, in one run: fresh simulated engines (cold
//! caches), a gateway child process with one route over them in that mode,
//! and the same seeded workload (`workload.rs`) replayed by one task per
//! session slot over a keep-alive connection (`client.rs`). Each mode runs
//! for `--duration`; requests started in the first `--warmup` are not
//! measured (the run opens with every slot's first, pre-aged session arriving
//! cold everywhere). Measured per mode: TTFT, per-request decode speed,
//! output tokens/s, prompt cache hit rate, errors, the gateway's placement
//! counters (spills, migrations) over the measured window, and how the
//! engines' load was spread.
//!
//! Everything listens on 127.0.0.1; the gateway process is killed on every
//! way out (see `gateway.rs`), Ctrl-C and SIGTERM included.

mod client;
mod gateway;
mod options;
mod report;
mod stats;
mod workload;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::task::JoinSet;
use tokio::time::{sleep, sleep_until, timeout_at, Instant};

use client::{Conn, Usage};
use gateway::{GatewayProcess, RouteSpec, TempDir};
use llm_gateway_sim::{spawn_engines, EngineHandle};
pub use options::BenchArgs;
use options::{Options, Plan};
use report::ModeResult;
use stats::Sample;
use workload::Workload;

const ROUTE: &str = "bench";
const MODEL: &str = "sim-model";
/// A request taking longer than this is an error, whatever the mode.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);
/// After a mode's duration, in-flight requests get this long to finish
/// before they are cut (cut requests are reported, not counted as errors).
const DRAIN: Duration = Duration::from_secs(30);
const SAMPLE_EVERY: Duration = Duration::from_millis(100);
/// Error share above which the run exits non-zero.
const MAX_ERROR_RATE: f64 = 0.01;

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
            code = run_plan(opts) => code,
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

async fn run_plan(opts: Options) -> i32 {
    let exe = match opts.gateway.clone().map_or_else(std::env::current_exe, Ok) {
        Ok(exe) => exe,
        Err(e) => {
            eprintln!("llm-gateway bench: cannot find the gateway binary: {e}");
            return 1;
        }
    };
    let plan = Plan::new(opts);
    let started = std::time::Instant::now();
    eprintln!("llm-gateway bench\n{}\n", plan.describe());
    let workload = Arc::new(Workload::new(plan.workload.clone()));
    let mut results = Vec::new();
    for mode in &plan.opts.modes {
        eprintln!("== {mode}: starting engines and gateway");
        match run_mode(&plan, &workload, mode, &exe).await {
            Ok(r) => {
                eprintln!("{}", report::progress_line(&r));
                results.push(r);
            }
            Err(e) => {
                eprintln!("llm-gateway bench: mode {mode} failed: {e}");
                return 1;
            }
        }
    }
    let elapsed = started.elapsed();
    if plan.opts.json {
        println!("{}", report::json(&plan, &results, elapsed));
    } else {
        println!("{}", report::markdown(&plan, &results, elapsed));
    }
    let failed: Vec<&str> = results
        .iter()
        .filter(|r| r.error_rate() > MAX_ERROR_RATE)
        .map(|r| r.mode.as_str())
        .collect();
    if failed.is_empty() {
        0
    } else {
        eprintln!(
            "llm-gateway bench: more than {:.0}% errors in: {}",
            MAX_ERROR_RATE * 100.0,
            failed.join(", ")
        );
        1
    }
}

/// One finished (or failed, or cut) request.
#[derive(Debug, Clone)]
pub struct Record {
    pub slot: u32,
    /// Offsets from the start of the mode.
    pub start: Duration,
    pub end: Duration,
    pub ok: bool,
    /// Still running when the drain ended; neither success nor error.
    pub cut: bool,
    pub error: Option<String>,
    pub ttft: Option<Duration>,
    pub decode_tok_per_s: Option<f64>,
    pub usage: Option<Usage>,
    pub peer: Option<String>,
    pub routed_mode: Option<String>,
    /// The first request of its session: a new-session placement.
    pub first_of_session: bool,
    /// For a later request: whether it landed on another peer than the
    /// session's previous successful one.
    pub switched_peer: Option<bool>,
}

/// What the session tasks share.
struct Ctx {
    workload: Arc<Workload>,
    gateway: SocketAddr,
    host: String,
    path: String,
    start: Instant,
    end: Instant,
    hard_end: Instant,
    records: Mutex<Vec<Record>>,
    in_flight: AtomicU64,
}

/// A point-in-time view for window differences.
pub(crate) struct Snapshot {
    pub at: Instant,
    pub placements: Vec<Sample>,
    pub engines: Vec<Vec<Sample>>,
    pub gateway_cpu: Option<f64>,
    pub bench_cpu: Option<f64>,
}

async fn snapshot(gw: SocketAddr, gw_pid: u32, engines: &[SocketAddr]) -> Snapshot {
    let at = Instant::now();
    let gateway_cpu = stats::cpu_seconds(gw_pid);
    let bench_cpu = stats::cpu_seconds(std::process::id());
    let scrape = |addr: SocketAddr| async move {
        match client::get(addr, "/metrics", Duration::from_secs(3)).await {
            Ok((200, body)) => stats::parse_prometheus(&String::from_utf8_lossy(&body)),
            _ => Vec::new(),
        }
    };
    let placements = scrape(gw).await;
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
    pub load: LoadSamples,
    pub lag: Lag,
}

/// Engine load sampled from the simulator's own counters.
#[derive(Debug, Default, Clone)]
pub struct LoadSamples {
    pub samples: u64,
    /// Per engine: Σ requests in the engine (queued or running).
    pub in_engine: Vec<u64>,
    /// Per engine: Σ requests queued beyond max_running.
    pub queued: Vec<u64>,
}

async fn sample_load(
    engines: Vec<EngineHandle>,
    max_running: i64,
    from: Instant,
    until: Instant,
) -> LoadSamples {
    let mut s = LoadSamples {
        in_engine: vec![0; engines.len()],
        queued: vec![0; engines.len()],
        ..LoadSamples::default()
    };
    sleep_until(from).await;
    let mut tick = tokio::time::interval(SAMPLE_EVERY);
    while Instant::now() < until {
        tick.tick().await;
        s.samples += 1;
        for (i, e) in engines.iter().enumerate() {
            let n = e.stats.in_flight.load(Ordering::Relaxed).max(0);
            s.in_engine[i] += n as u64;
            s.queued[i] += (n - max_running).max(0) as u64;
        }
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

async fn probe_lag(from: Instant, until: Instant) -> Lag {
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

async fn run_mode(
    plan: &Plan,
    workload: &Arc<Workload>,
    mode: &str,
    exe: &Path,
) -> Result<ModeResult, String> {
    let n = plan.opts.engines;
    let cfg = plan.engine.clone();
    let cluster = tokio::task::spawn_blocking(move || spawn_engines(n, 0, cfg))
        .await
        .map_err(|e| format!("engine start-up panicked: {e}"))?
        .map_err(|e| format!("cannot start simulated engines: {e}"))?;
    let engine_addrs = cluster.addrs();
    let dir = TempDir::new(mode).map_err(|e| format!("cannot create a temp dir: {e}"))?;
    let route = gateway::route_yaml(&RouteSpec {
        mode,
        engines: &engine_addrs,
        max_concurrency: 256,
    });
    let mut gw = GatewayProcess::start(exe, &dir.0, ROUTE, &route, plan.opts.threads).await?;
    // Let the first engine-metrics scrape land so load_aware starts with
    // fresh engine numbers, as it would in steady state.
    sleep(Duration::from_millis(500)).await;

    let start = Instant::now();
    let warm = start + plan.warmup;
    let end = start + plan.opts.duration;
    let ctx = Arc::new(Ctx {
        workload: Arc::clone(workload),
        gateway: gw.listen,
        host: gw.listen.to_string(),
        path: format!("/{ROUTE}/v1/chat/completions"),
        start,
        end,
        hard_end: end + DRAIN,
        records: Mutex::new(Vec::new()),
        in_flight: AtomicU64::new(0),
    });
    let mut tasks = JoinSet::new();
    for slot in 0..plan.slots() as u32 {
        tasks.spawn(slot_task(Arc::clone(&ctx), slot));
    }
    let sampler = tokio::spawn(sample_load(
        cluster.engines.clone(),
        plan.engine.max_running as i64,
        warm,
        end,
    ));
    let lag_probe = tokio::spawn(probe_lag(warm, end));
    sleep_until(warm).await;
    let before = snapshot(gw.admin, gw.pid, &engine_addrs).await;
    sleep_until(end).await;
    let after = snapshot(gw.admin, gw.pid, &engine_addrs).await;
    let load = sampler.await.unwrap_or_default();
    let lag = lag_probe.await.unwrap_or_default();
    eprintln!(
        "   {mode}: window over, draining {} in-flight request(s)",
        ctx.in_flight.load(Ordering::Relaxed)
    );
    let drained = timeout_at(ctx.hard_end + Duration::from_secs(1), async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    let cut = if drained.is_err() {
        let n = ctx.in_flight.load(Ordering::Relaxed);
        tasks.abort_all();
        n
    } else {
        0
    };
    let gateway_alive = gw.alive();
    let log_tail = gw.log_tail();
    gw.stop();
    drop(cluster);
    if !gateway_alive {
        return Err(format!("the gateway died during the run; log:\n{log_tail}"));
    }
    let records = std::mem::take(&mut *ctx.records.lock());
    if let Some(path) = &plan.opts.records {
        write_records(path, mode, &records)
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    let window = Window {
        before,
        after,
        load,
        lag,
    };
    Ok(report::summarize(mode, plan, &records, cut, &window))
}

/// One session slot: sessions one after another, each turn after the
/// previous reply and a think pause, until the mode's end.
async fn slot_task(ctx: Arc<Ctx>, slot: u32) {
    let w = Arc::clone(&ctx.workload);
    sleep_until(ctx.start + w.start_offset(slot)).await;
    let mut conv = w.initial_conversation(slot);
    let mut conn: Option<Conn> = None;
    let mut last_peer: Option<String> = None;
    let mut first = true;
    loop {
        if Instant::now() >= ctx.end {
            return;
        }
        let plan = w.turn(slot, conv.generation, conv.next_turn);
        if !w.fits(&conv, &plan) {
            conv = w.conversation(slot, conv.generation + 1);
            last_peer = None;
            first = true;
            continue;
        }
        conv.push("user", plan.user);
        let body = conv.body(MODEL, plan.max_tokens);
        let started = Instant::now();
        let mut record = Record {
            slot,
            start: started - ctx.start,
            end: Duration::ZERO,
            ok: false,
            cut: false,
            error: None,
            ttft: None,
            decode_tok_per_s: None,
            usage: None,
            peer: None,
            routed_mode: None,
            first_of_session: first,
            switched_peer: None,
        };
        ctx.in_flight.fetch_add(1, Ordering::Relaxed);
        let deadline = (started + REQUEST_TIMEOUT).min(ctx.hard_end);
        let outcome = timeout_at(deadline, async {
            if conn.is_none() {
                conn = Some(
                    Conn::connect(ctx.gateway)
                        .await
                        .map_err(|e| format!("connect: {e}"))?,
                );
            }
            let c = conn.as_mut().ok_or("no connection")?;
            Ok::<_, String>(
                c.post_stream(
                    &ctx.host,
                    &ctx.path,
                    &[("x-session-id", conv.id.as_str())],
                    &body,
                    started,
                )
                .await,
            )
        })
        .await;
        ctx.in_flight.fetch_sub(1, Ordering::Relaxed);
        record.end = started.elapsed() + record.start;
        match outcome {
            Err(_) if Instant::now() >= ctx.hard_end => {
                record.cut = true;
                ctx.records.lock().push(record);
                return;
            }
            Err(_) => {
                conn = None;
                record.error = Some(format!("no complete response in {REQUEST_TIMEOUT:?}"));
            }
            Ok(Err(e)) => {
                conn = None;
                record.error = Some(e);
            }
            Ok(Ok((ex, reusable))) => {
                if !reusable {
                    conn = None;
                }
                if let Some(head) = &ex.head {
                    record.peer = head.header("x-routed-peer").map(str::to_string);
                    record.routed_mode = head.header("x-routed-mode").map(str::to_string);
                }
                record.ttft = ex.timer.first_content;
                record.decode_tok_per_s = ex.timer.decode_tok_per_s();
                record.usage = ex.timer.usage;
                record.error = ex.error;
                record.ok = record.error.is_none();
                if record.ok {
                    conv.push("assistant", ex.timer.content);
                }
            }
        }
        if record.ok {
            if !first {
                record.switched_peer = Some(record.peer != last_peer);
            }
            last_peer = record.peer.clone();
            conv.next_turn += 1;
            first = false;
        } else {
            // The turn is retried after the pause, as an agent would.
            conv.pop();
        }
        let failed = !record.ok;
        ctx.records.lock().push(record);
        let pause = if failed {
            plan.think.max(Duration::from_millis(200))
        } else {
            plan.think
        };
        if Instant::now() + pause >= ctx.end {
            return;
        }
        sleep(pause).await;
    }
}

/// Appends the mode's requests to `path`, one JSON object per line.
fn write_records(path: &std::path::Path, mode: &str, records: &[Record]) -> std::io::Result<()> {
    use std::io::Write;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    let mut out = std::io::BufWriter::new(file);
    for r in records {
        let line = serde_json::json!({
            "mode": mode,
            "slot": r.slot,
            "start_s": r.start.as_secs_f64(),
            "end_s": r.end.as_secs_f64(),
            "ok": r.ok,
            "cut": r.cut,
            "error": r.error,
            "ttft_s": r.ttft.map(|d| d.as_secs_f64()),
            "decode_tok_s": r.decode_tok_per_s,
            "prompt_tokens": r.usage.map(|u| u.prompt_tokens),
            "cached_tokens": r.usage.map(|u| u.cached_tokens),
            "completion_tokens": r.usage.map(|u| u.completion_tokens),
            "peer": r.peer,
            "routed_mode": r.routed_mode,
            "first_of_session": r.first_of_session,
            "switched_peer": r.switched_peer,
        });
        writeln!(out, "{line}")?;
    }
    out.flush()
}

/// Placement counters for `kind` over the window, by reason.
fn placements_by_reason(before: &[Sample], after: &[Sample], kind: &str) -> BTreeMap<String, f64> {
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
