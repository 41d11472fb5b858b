//! `llm-gateway bench`: replay of coding-agent sessions through the gateway.
//!
//! A run is scenarios (`scenario.rs`: presets over the workload and the
//! engines) times modes; each (scenario, mode) pair is a cell. Per cell:
//! fresh simulated engines (cold caches), a gateway child process with one
//! route over them in that mode (none for the `reference` cell, where the
//! client places sessions itself, `reference.rs`), and the scenario's seeded
//! workload (`workload.rs`) replayed by one task per session slot over a
//! keep-alive connection (`client.rs`). Each cell runs for `--duration`;
//! requests started in the first `--warmup` are not measured (the run opens
//! with every slot's first, pre-aged session arriving cold everywhere).
//! Measured per cell: TTFT, per-request decode speed, output tokens/s,
//! prompt cache hit rate, prefill against a perfect cache and how sessions
//! were bound to engines (`analysis.rs`), errors, the gateway's placement
//! counters (spills, migrations) over the measured window, and how the
//! engines' load was spread. Progress goes to stderr every few seconds;
//! `--plot` draws the results (`plot.rs`).
//!
//! Everything listens on 127.0.0.1; the gateway process is killed on every
//! way out (see `gateway.rs`), Ctrl-C and SIGTERM included.

mod analysis;
mod client;
mod gateway;
mod options;
mod plot;
mod progress;
mod reference;
mod report;
mod scenario;
mod stats;
mod workload;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::task::JoinSet;
use tokio::time::{sleep, sleep_until, timeout_at, Instant};

use client::{Conn, Exchange, Usage};
use gateway::{GatewayProcess, RouteSpec, TempDir};
use llm_gateway_sim::{spawn_engines_with, EngineStats};
pub use options::BenchArgs;
use options::{fmt_secs, Options, Plan, REFERENCE};
use progress::Progress;
use reference::Placer;
use report::{ModeResult, ScenarioResult};
use stats::Sample;
use workload::Workload;

const ROUTE: &str = "bench";
const MODEL: &str = "sim-model";
/// Where the reference cell sends requests: the engines' own API.
const DIRECT_PATH: &str = "/v1/chat/completions";
/// A request taking longer than this is an error, whatever the mode.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);
/// After a cell's duration, in-flight requests get this long to finish
/// before they are cut (cut requests are reported, not counted as errors).
const DRAIN: Duration = Duration::from_secs(30);
const SAMPLE_EVERY: Duration = Duration::from_millis(100);
/// How often the sessions bound to each engine are counted from the records.
const BINDINGS_EVERY: Duration = Duration::from_millis(500);
const PROGRESS_EVERY: Duration = Duration::from_secs(5);
/// How often each engine's KV gauge is scraped over the window.
const KV_EVERY: Duration = Duration::from_secs(1);
/// Error share above which the run exits non-zero (in scenarios where
/// errors are not the point, see `Scenario::errors_expected`).
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
    let needs_gateway = opts.modes.iter().any(|m| m != REFERENCE);
    let exe = if needs_gateway {
        match opts.gateway.clone().map_or_else(std::env::current_exe, Ok) {
            Ok(exe) => exe,
            Err(e) => {
                eprintln!("llm-gateway bench: cannot find the gateway binary: {e}");
                return 1;
            }
        }
    } else {
        PathBuf::new()
    };
    let plans = match opts
        .scenarios
        .iter()
        .map(|&s| Plan::for_scenario(opts.clone(), s).map_err(|e| format!("scenario {s}: {e}")))
        .collect::<Result<Vec<Plan>, String>>()
    {
        Ok(p) => p,
        Err(e) => {
            eprintln!("llm-gateway bench: {e}");
            return 2;
        }
    };
    let started = std::time::Instant::now();
    let mut progress = Progress::new(plans.len() * opts.modes.len(), opts.duration);
    eprintln!(
        "llm-gateway bench: {} scenario(s) x {} mode(s) = {} cells, ~{} in all",
        plans.len(),
        opts.modes.len(),
        progress.total(),
        fmt_secs(Duration::from_secs(progress.remaining_s(0.0).round() as u64)),
    );
    let mut results = Vec::new();
    for plan in plans {
        eprintln!("\n== scenario {}\n{}\n", plan.scenario, plan.describe());
        let workload = Arc::new(Workload::new(plan.workload.clone()));
        let mut cells = Vec::new();
        for mode in &plan.opts.modes {
            let cell_started = std::time::Instant::now();
            match run_mode(&plan, &workload, mode, &exe, &progress).await {
                Ok(r) => {
                    eprintln!("{}", report::progress_line(plan.scenario.name(), &r));
                    cells.push(r);
                }
                Err(e) => {
                    eprintln!(
                        "llm-gateway bench: cell {}/{mode} failed: {e}",
                        plan.scenario
                    );
                    return 1;
                }
            }
            progress.cell_done(cell_started.elapsed());
        }
        results.push(ScenarioResult { plan, cells });
    }
    let elapsed = started.elapsed();
    if opts.json {
        println!("{}", report::json(&results, elapsed));
    } else {
        println!("{}", report::markdown(&results, elapsed));
    }
    let mut code = 0;
    if let Some(path) = &opts.plot {
        match plot::draw(path, &results) {
            Ok(()) => eprintln!("llm-gateway bench: wrote {}", path.display()),
            Err(e) => {
                eprintln!("llm-gateway bench: cannot draw {}: {e}", path.display());
                code = 1;
            }
        }
    }
    let failed: Vec<String> = results
        .iter()
        .filter(|s| !s.plan.scenario.errors_expected())
        .flat_map(|s| {
            s.cells
                .iter()
                .filter(|r| r.error_rate() > MAX_ERROR_RATE)
                .map(move |r| format!("{}/{}", s.plan.scenario, r.mode))
        })
        .collect();
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

/// One finished (or failed, or cut) request.
#[derive(Debug, Clone, Default)]
pub struct Record {
    pub slot: u32,
    /// The slot's session: (slot, generation) names it.
    pub generation: u32,
    pub turn: u32,
    /// Offsets from the start of the cell.
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
    /// The engine that served it: from `x-routed-peer` through the gateway,
    /// the client's own choice in the reference cell.
    pub engine: Option<usize>,
    pub routed_mode: Option<String>,
    /// Time the gateway held it in its admission queue (`x-routed-queued-ms`).
    pub queued_ms: Option<u64>,
    /// The first request of its session: a new-session placement.
    pub first_of_session: bool,
    /// For a later request: whether it landed on another peer than the
    /// session's previous successful one.
    pub switched_peer: Option<bool>,
}

/// Where a cell's requests go.
enum Target {
    /// One gateway, or replicas each request picks one of at random.
    Gateway {
        addrs: Vec<SocketAddr>,
        host: String,
        path: String,
        next: AtomicU64,
    },
    /// The reference cell: straight to the engines, placed by the client.
    Direct {
        engines: Vec<SocketAddr>,
        placer: Placer,
    },
}

/// What the session tasks share.
struct Ctx {
    workload: Arc<Workload>,
    target: Target,
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

async fn scrape(addr: SocketAddr) -> Vec<Sample> {
    match client::get(addr, "/metrics", Duration::from_secs(3)).await {
        Ok((200, body)) => stats::parse_prometheus(&String::from_utf8_lossy(&body)),
        _ => Vec::new(),
    }
}

/// `gateways`: each replica's admin address and pid, for a gateway cell.
/// The placement counters of every replica are kept apart by a `replica`
/// label, so a window's difference is taken per replica and then summed;
/// the CPU is the replicas' together.
async fn snapshot(gateways: &[(SocketAddr, u32)], engines: &[SocketAddr]) -> Snapshot {
    let at = Instant::now();
    let cpus: Vec<f64> = gateways
        .iter()
        .filter_map(|&(_, pid)| stats::cpu_seconds(pid))
        .collect();
    let gateway_cpu = (!cpus.is_empty()).then(|| cpus.iter().sum());
    let bench_cpu = stats::cpu_seconds(std::process::id());
    let mut placements = Vec::new();
    for (i, &(admin, _)) in gateways.iter().enumerate() {
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
    /// (`vllm:kv_cache_usage_perc`), None if never scraped.
    pub kv_committed: Vec<Option<f64>>,
    pub lag: Lag,
}

async fn sample_kv(engines: Vec<SocketAddr>, from: Instant, until: Instant) -> Vec<Option<f64>> {
    let mut sums = vec![(0.0, 0u32); engines.len()];
    sleep_until(from).await;
    let mut tick = tokio::time::interval(KV_EVERY);
    while Instant::now() < until {
        tick.tick().await;
        for (i, &addr) in engines.iter().enumerate() {
            // An engine that is down (failover) has no sample.
            let samples = scrape(addr).await;
            if let Some(s) = samples
                .iter()
                .find(|s| s.name == "vllm:kv_cache_usage_perc")
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
type LiveStats = Arc<Mutex<Vec<Arc<EngineStats>>>>;

async fn sample_load(
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

/// Aborts a background task when the cell ends, whichever way it ends.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Prints where the run is every `PROGRESS_EVERY` until aborted.
async fn report_progress(
    ctx: Arc<Ctx>,
    label: String,
    progress: progress::View,
    cell_started: std::time::Instant,
) {
    let mut tick = tokio::time::interval(PROGRESS_EVERY);
    tick.tick().await;
    loop {
        tick.tick().await;
        let (requests, errors) = {
            let r = ctx.records.lock();
            (r.len(), r.iter().filter(|r| !r.ok && !r.cut).count())
        };
        let phase = if Instant::now() < ctx.end {
            format!(
                "{} of {}",
                fmt_secs(Duration::from_secs(ctx.start.elapsed().as_secs())),
                fmt_secs(ctx.end - ctx.start)
            )
        } else {
            "draining".to_string()
        };
        eprintln!(
            "   [{}] {label}: {phase}, {requests} requests ({errors} errors), {} in flight; \
             run {} elapsed, ~{} left",
            progress.position(),
            ctx.in_flight.load(Ordering::Relaxed),
            fmt_secs(Duration::from_secs(progress.run_elapsed().as_secs())),
            fmt_secs(Duration::from_secs(
                progress
                    .remaining_s(cell_started.elapsed().as_secs_f64())
                    .round() as u64
            )),
        );
    }
}

async fn run_mode(
    plan: &Plan,
    workload: &Arc<Workload>,
    mode: &str,
    exe: &Path,
    progress: &Progress,
) -> Result<ModeResult, String> {
    let cell_started = std::time::Instant::now();
    let label = format!("{}/{mode}", plan.scenario);
    let reference = mode == REFERENCE;
    eprintln!(
        "== {label}: starting engines{}",
        if reference { "" } else { " and gateway" }
    );
    let configs = plan.engines.clone();
    let mut cluster = tokio::task::spawn_blocking(move || spawn_engines_with(configs, 0))
        .await
        .map_err(|e| format!("engine start-up panicked: {e}"))?
        .map_err(|e| format!("cannot start simulated engines: {e}"))?;
    let engine_addrs = cluster.addrs();
    let live: LiveStats = Arc::new(Mutex::new(
        cluster.engines.iter().map(|e| e.stats.clone()).collect(),
    ));
    // Declared before the gateway so that it is removed after the gateway
    // stopped (locals drop in reverse order).
    let dir = if reference {
        None
    } else {
        let tag = format!("{}-{mode}", plan.scenario);
        Some(TempDir::new(&tag).map_err(|e| format!("cannot create a temp dir: {e}"))?)
    };
    let redis = match (&dir, plan.opts.session_store.as_str()) {
        (Some(dir), "redis") => Some(gateway::RedisProcess::start(&dir.0).await?),
        _ => None,
    };
    let gateway_extra = redis.as_ref().map(|r| r.gateway_yaml()).unwrap_or_default();
    let mut replicas: Vec<GatewayProcess> = Vec::new();
    if let Some(dir) = &dir {
        let mut route = gateway::route_yaml(&RouteSpec {
            mode,
            engines: &engine_addrs,
            max_concurrency: 256,
        });
        if let Some(extra) = &plan.opts.route_extra {
            route = gateway::merge_extra(&route, extra)?;
        }
        for r in 0..plan.opts.replicas {
            let own = dir.0.join(format!("replica-{r}"));
            std::fs::create_dir_all(own.join("routes"))
                .map_err(|e| format!("cannot create {}: {e}", own.display()))?;
            let g =
                GatewayProcess::start(exe, &own, ROUTE, &route, plan.opts.threads, &gateway_extra)
                    .await?;
            wait_for_route(&g).await?;
            replicas.push(g);
        }
        // Let the first engine-metrics scrape land so load_aware starts
        // with fresh engine numbers, as it would in steady state.
        sleep(Duration::from_millis(500)).await;
    }
    let target = match replicas.first() {
        Some(g) => Target::Gateway {
            addrs: replicas.iter().map(|g| g.listen).collect(),
            host: g.listen.to_string(),
            path: format!("/{ROUTE}/v1/chat/completions"),
            next: AtomicU64::new(plan.opts.seed),
        },
        None => Target::Direct {
            engines: engine_addrs.clone(),
            placer: Placer::new(engine_addrs.len()),
        },
    };
    let gw_probe: Vec<(SocketAddr, u32)> = replicas.iter().map(|g| (g.admin, g.pid)).collect();

    let start = Instant::now();
    let warm = start + plan.warmup;
    let end = start + plan.opts.duration;
    let ctx = Arc::new(Ctx {
        workload: Arc::clone(workload),
        target,
        start,
        end,
        hard_end: end + DRAIN,
        records: Mutex::new(Vec::new()),
        in_flight: AtomicU64::new(0),
    });
    let _ticker = AbortOnDrop(tokio::spawn(report_progress(
        Arc::clone(&ctx),
        label.clone(),
        progress.view(),
        cell_started,
    )));
    let mut tasks = JoinSet::new();
    for slot in 0..plan.slots() as u32 {
        tasks.spawn(slot_task(Arc::clone(&ctx), slot));
    }
    let sampler = tokio::spawn(sample_load(
        Arc::clone(&live),
        plan.engine.max_running as i64,
        start,
        warm,
        end,
    ));
    let lag_probe = tokio::spawn(probe_lag(warm, end));
    let kv_sampler = tokio::spawn(sample_kv(engine_addrs.clone(), warm, end));
    sleep_until(warm).await;
    let before = snapshot(&gw_probe, &engine_addrs).await;
    let mut retired = Vec::new();
    if let Some(f) = plan.failover {
        let i = f.engine;
        sleep_until(start + f.at).await;
        retired.push((i, scrape(engine_addrs[i]).await));
        cluster.engines[i].shutdown();
        eprintln!(
            "   {label}: e{i} shut down (connections refused) for {}",
            fmt_secs(f.outage)
        );
        sleep_until(start + f.back()).await;
        let fresh = cluster
            .restart(i)
            .await
            .map_err(|e| format!("cannot restart e{i} on {}: {e}", engine_addrs[i]))?;
        live.lock()[i] = fresh.stats.clone();
        eprintln!("   {label}: e{i} back, with an empty cache");
    }
    sleep_until(end).await;
    let after = snapshot(&gw_probe, &engine_addrs).await;
    let load = sampler.await.unwrap_or_default();
    let lag = lag_probe.await.unwrap_or_default();
    let kv_committed = kv_sampler.await.unwrap_or_default();
    eprintln!(
        "   {label}: window over, draining {} in-flight request(s)",
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
    for g in replicas.iter_mut() {
        let alive = g.alive();
        let log_tail = g.log_tail();
        g.stop();
        if !alive {
            return Err(format!("the gateway died during the run; log:\n{log_tail}"));
        }
    }
    drop(redis);
    drop(cluster);
    let records = std::mem::take(&mut *ctx.records.lock());
    if let Some(path) = &plan.opts.records {
        write_records(path, plan.scenario.name(), mode, &records)
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    let window = Window {
        before,
        after,
        retired,
        load,
        kv_committed,
        lag,
    };
    Ok(report::summarize(mode, plan, &records, cut, &window))
}

/// Waits until the gateway lists the bench route (it loads route files
/// next to serving `/healthz`); a gateway without the admin listing (an
/// older build) is taken at its word.
async fn wait_for_route(g: &GatewayProcess) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match client::get(g.admin, "/_routes", Duration::from_secs(3)).await {
            Ok((200, body)) if gateway::routes_list(&body, ROUTE) => return Ok(()),
            Ok((200, _)) if Instant::now() < deadline => {}
            Ok((200, _)) => {
                return Err(format!(
                    "the gateway did not load route {ROUTE:?} (check --route-extra); log:\n{}",
                    g.log_tail()
                ))
            }
            _ => return Ok(()),
        }
        sleep(Duration::from_millis(100)).await;
    }
}

/// A replica for the next request: uniform and independent of the session
/// (splitmix64 over a shared counter), as a front without affinity spreads.
fn pick(addrs: &[SocketAddr], next: &AtomicU64) -> SocketAddr {
    let mut z = next.fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    addrs[(z % addrs.len().max(1) as u64) as usize]
}

/// A session slot's way to the engines: its keep-alive connection (to the
/// gateway, or to the engine its session is bound to) and, in the reference
/// cell, that binding.
#[derive(Default)]
struct Route {
    conn: Option<(SocketAddr, Conn)>,
    engine: Option<usize>,
}

impl Route {
    /// The open connection to `addr`, or a new one.
    async fn connection(&mut self, addr: SocketAddr) -> std::io::Result<&mut Conn> {
        let conn = match self.conn.take() {
            Some((a, c)) if a == addr && !c.is_closed() => c,
            _ => Conn::connect(addr).await?,
        };
        Ok(&mut self.conn.insert((addr, conn)).1)
    }
}

impl Ctx {
    /// The slot's session ended (or the slot stopped): unbind it.
    fn end_session(&self, route: &mut Route) {
        if let (Target::Direct { placer, .. }, Some(e)) = (&self.target, route.engine.take()) {
            placer.unbind(e);
        }
    }

    /// One attempt at a turn: the exchange, whether its connection can be
    /// reused, and the engine that served it.
    async fn send(
        &self,
        route: &mut Route,
        session: &str,
        body: &[u8],
        started: Instant,
    ) -> Result<(Exchange, bool, Option<usize>), String> {
        match &self.target {
            Target::Gateway {
                addrs,
                host,
                path,
                next,
            } => {
                let addr = pick(addrs, next);
                let c = route
                    .connection(addr)
                    .await
                    .map_err(|e| format!("connect: {e}"))?;
                let (ex, reusable) = c
                    .post_stream(host, path, &[("x-session-id", session)], body, started)
                    .await;
                let engine = ex
                    .head
                    .as_ref()
                    .and_then(|h| h.header("x-routed-peer"))
                    .and_then(analysis::engine_index);
                Ok((ex, reusable, engine))
            }
            Target::Direct { engines, placer } => {
                // A refused connection re-places the session; each attempt
                // marks an engine down, so this tries every engine at most
                // about once.
                for _ in 0..engines.len() {
                    let e = match route.engine {
                        Some(e) => e,
                        None => {
                            let e = placer.place(Instant::now()).ok_or("no engines")?;
                            route.engine = Some(e);
                            e
                        }
                    };
                    let addr = *engines.get(e).ok_or("bound to an unknown engine")?;
                    let _in_flight = placer.start(e);
                    match route.connection(addr).await {
                        Ok(c) => {
                            let host = addr.to_string();
                            let (ex, reusable) =
                                c.post_stream(&host, DIRECT_PATH, &[], body, started).await;
                            return Ok((ex, reusable, Some(e)));
                        }
                        Err(err) if err.kind() == std::io::ErrorKind::ConnectionRefused => {
                            placer.refused(e, Instant::now());
                            self.end_session(route);
                        }
                        Err(err) => return Err(format!("connect e{e}: {err}")),
                    }
                }
                Err("connect: every engine refused the connection".into())
            }
        }
    }
}

/// One session slot: sessions one after another, each turn after the
/// previous reply and a think pause, until the cell's end.
async fn slot_task(ctx: Arc<Ctx>, slot: u32) {
    let mut route = Route::default();
    run_slot(&ctx, slot, &mut route).await;
    ctx.end_session(&mut route);
}

async fn run_slot(ctx: &Ctx, slot: u32, route: &mut Route) {
    let w = Arc::clone(&ctx.workload);
    sleep_until(ctx.start + w.start_offset(slot)).await;
    let mut conv = w.initial_conversation(slot);
    let mut last_peer: Option<String> = None;
    let mut first = true;
    loop {
        if Instant::now() >= ctx.end {
            return;
        }
        let plan = w.turn(slot, conv.generation, conv.next_turn);
        if !w.fits(slot, &conv, &plan) {
            ctx.end_session(route);
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
            generation: conv.generation,
            turn: conv.next_turn,
            start: started - ctx.start,
            first_of_session: first,
            ..Record::default()
        };
        ctx.in_flight.fetch_add(1, Ordering::Relaxed);
        let deadline = (started + REQUEST_TIMEOUT).min(ctx.hard_end);
        let outcome = timeout_at(deadline, ctx.send(route, &conv.id, &body, started)).await;
        ctx.in_flight.fetch_sub(1, Ordering::Relaxed);
        record.end = started.elapsed() + record.start;
        match outcome {
            Err(_) if Instant::now() >= ctx.hard_end => {
                record.cut = true;
                ctx.records.lock().push(record);
                return;
            }
            Err(_) => {
                route.conn = None;
                record.error = Some(format!("no complete response in {REQUEST_TIMEOUT:?}"));
            }
            Ok(Err(e)) => {
                route.conn = None;
                record.error = Some(e);
            }
            Ok(Ok((ex, reusable, engine))) => {
                if !reusable {
                    route.conn = None;
                }
                record.engine = engine;
                if let Some(head) = &ex.head {
                    record.peer = head.header("x-routed-peer").map(str::to_string);
                    record.routed_mode = head.header("x-routed-mode").map(str::to_string);
                    record.queued_ms = head
                        .header("x-routed-queued-ms")
                        .and_then(|v| v.trim().parse().ok());
                }
                if matches!(ctx.target, Target::Direct { .. }) {
                    record.peer = engine.map(|e| format!("e{e}"));
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

/// Appends the cell's requests to `path`, one JSON object per line.
fn write_records(
    path: &Path,
    scenario: &str,
    mode: &str,
    records: &[Record],
) -> std::io::Result<()> {
    use std::io::Write;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    let mut out = std::io::BufWriter::new(file);
    for r in records {
        let line = serde_json::json!({
            "scenario": scenario,
            "mode": mode,
            "slot": r.slot,
            "generation": r.generation,
            "turn": r.turn,
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
            "engine": r.engine,
            "routed_mode": r.routed_mode,
            "queued_ms": r.queued_ms,
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
