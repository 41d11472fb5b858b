//! One cell: engines, gateway replicas (or an external router), the
//! session slots over the window, and the result.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::task::JoinSet;
use tokio::time::{sleep, sleep_until, timeout_at, Instant};

use crate::cell_spec::{CellKind, CellSpec};
use crate::client;
use crate::gateway::{self, GatewayProcess, RouteSpec, TempDir, ROUTE};
use crate::ids::SessionIds;
use crate::plan::{fmt_secs, Plan};
use crate::progress::{self, Progress};
use crate::record::{write_records, Record};
use crate::redis_relay::RedisRelay;
use crate::reference::Placer;
use crate::result::{summarize, ModeResult};
use crate::router::{Fill, RouterProcess};
use crate::session::{slot_task, Ctx, Target};
use crate::stats::CpuOf;
use crate::window::{
    probe_lag, sample_kv, sample_load, scrape, snapshot, LiveStats, Probe, Window,
};
use crate::workload::Workload;
use llm_gateway_sim::{spawn_engines_with, SimCluster};

/// After a cell's duration, in-flight requests get this long to finish
/// before they are cut (cut requests are reported, not counted as errors).
const DRAIN: Duration = Duration::from_secs(30);
const PROGRESS_EVERY: Duration = Duration::from_secs(5);

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

/// Runs one (scenario, cell) pair: each step below is one function.
pub(crate) async fn run_mode(
    plan: &Plan,
    workload: &Arc<Workload>,
    cell: &CellSpec<'_>,
    exe: &Path,
    progress: &Progress,
) -> Result<ModeResult, String> {
    let cell_started = std::time::Instant::now();
    let mode = cell.name;
    let label = format!("{}/{mode}", plan.label());
    announce(&label, cell.kind);
    let mut engines = Engines::start(plan).await?;
    let mut gateways = Gateways::start(plan, cell, exe, &engines.addrs).await?;
    let ctx = open_cell(plan, workload, gateways.target(plan, &engines.addrs));
    let _ticker = AbortOnDrop(tokio::spawn(report_progress(
        Arc::clone(&ctx),
        label.clone(),
        progress.view(),
        cell_started,
    )));
    let tasks = spawn_slots(&ctx, plan);
    let window = observe(plan, &ctx, &mut gateways, &mut engines, &label).await?;
    let cut = drain(&ctx, tasks, &label).await;
    gateways.stop()?;
    // Redis and the gateways' directory go before the engines.
    drop(gateways);
    drop(engines);
    let records = keep_records(&ctx, plan, mode)?;
    Ok(summarize(cell, plan, &records, cut, &window))
}

fn announce(label: &str, kind: CellKind) {
    eprintln!(
        "== {label}: starting engines{}",
        match kind {
            CellKind::Reference => "",
            CellKind::Router(_) | CellKind::Peer(_) => " and router",
            CellKind::Gateway | CellKind::Compare(_) => " and gateway",
        }
    );
}

/// The cell's fresh simulated engines (cold caches).
struct Engines {
    cluster: SimCluster,
    addrs: Vec<SocketAddr>,
    /// Their stats, for the load sampler; swapped on a failover restart.
    live: LiveStats,
}

impl Engines {
    async fn start(plan: &Plan) -> Result<Engines, String> {
        let configs = plan.engines.clone();
        let cluster = tokio::task::spawn_blocking(move || spawn_engines_with(configs, 0))
            .await
            .map_err(|e| format!("engine start-up panicked: {e}"))?
            .map_err(|e| format!("cannot start simulated engines: {e}"))?;
        let addrs = cluster.addrs();
        let live: LiveStats = Arc::new(Mutex::new(
            cluster.engines.iter().map(|e| e.stats.clone()).collect(),
        ));
        Ok(Engines {
            cluster,
            addrs,
            live,
        })
    }
}

/// The gateway replicas of a gateway cell (none for the reference cell),
/// the Redis they share if any, and their directory; or, with
/// `--router-cmd`, the external router in their place.
struct Gateways {
    // Fields drop in order: the replicas or the router, then the relay to
    // Redis and Redis, then the directory they ran in.
    replicas: Vec<GatewayProcess>,
    router: Option<RouterProcess>,
    relay: Option<RedisRelay>,
    redis: Option<gateway::RedisProcess>,
    dir: Option<TempDir>,
}

impl Gateways {
    async fn start(
        plan: &Plan,
        cell: &CellSpec<'_>,
        exe: &Path,
        engine_addrs: &[SocketAddr],
    ) -> Result<Gateways, String> {
        let mut g = Gateways {
            replicas: Vec::new(),
            router: None,
            relay: None,
            redis: None,
            dir: None,
        };
        if let CellKind::Reference = cell.kind {
            return Ok(g);
        }
        let mode = cell.name;
        let tag = format!("{}-{mode}", plan.label().replace(' ', "-"));
        let dir = g
            .dir
            .insert(TempDir::new(&tag).map_err(|e| format!("cannot create a temp dir: {e}"))?);
        match cell.kind {
            CellKind::Router(spec) => {
                g.router = Some(RouterProcess::start(&spec.command, engine_addrs, &dir.0).await?);
                return Ok(g);
            }
            CellKind::Peer(found) => {
                let command = |fill: &Fill, prefix: &Path| found.prepare(fill, prefix);
                g.router = Some(RouterProcess::start_with(&command, engine_addrs, &dir.0).await?);
                return Ok(g);
            }
            CellKind::Reference | CellKind::Gateway | CellKind::Compare(_) => {}
        }
        // A `--compare` cell is another build of the gateway, in load_aware.
        let (exe, mode) = match cell.kind {
            CellKind::Compare(path) => (path, "load_aware"),
            _ => (exe, mode),
        };
        if plan.opts.session_store == "redis" {
            let redis = gateway::RedisProcess::start(&dir.0).await?;
            if !plan.opts.redis_delay.is_zero() {
                g.relay = Some(
                    RedisRelay::start(redis.addr, plan.opts.redis_delay)
                        .await
                        .map_err(|e| format!("cannot start the relay to Redis: {e}"))?,
                );
            }
            g.redis = Some(redis);
        }
        let relay = g.relay.as_ref().map(|r| r.addr);
        let gateway_extra = g
            .redis
            .as_ref()
            .map(|r| r.gateway_yaml(relay))
            .unwrap_or_default();
        let noisy = plan.scenario == crate::scenario::Scenario::NoisyNeighbor;
        let mut route = gateway::route_yaml(&RouteSpec {
            mode,
            engines: engine_addrs,
            max_concurrency: plan.opts.max_concurrency.unwrap_or(if noisy {
                crate::scenario::noisy_max_concurrency(plan.sessions_per_engine)
            } else {
                256
            }),
        });
        if noisy {
            route = gateway::merge_extra(&route, crate::scenario::NOISY_QUEUE_TIMEOUT)?;
        }
        if let Some(extra) = &plan.opts.route_extra {
            route = gateway::merge_extra(&route, extra)?;
        }
        for r in 0..plan.opts.replicas {
            let own = dir.0.join(format!("replica-{r}"));
            std::fs::create_dir_all(own.join("routes"))
                .map_err(|e| format!("cannot create {}: {e}", own.display()))?;
            let gw =
                GatewayProcess::start(exe, &own, ROUTE, &route, plan.opts.threads, &gateway_extra)
                    .await?;
            wait_for_route(&gw).await?;
            g.replicas.push(gw);
        }
        // Let the first engine-metrics scrape land so load_aware starts
        // with fresh engine numbers, as it would in steady state.
        sleep(Duration::from_millis(500)).await;
        Ok(g)
    }

    /// Where the cell's requests go: the router, the replicas, else the
    /// engines.
    fn target(&self, plan: &Plan, engine_addrs: &[SocketAddr]) -> Target {
        if let Some(r) = &self.router {
            return Target::Router {
                addr: r.addr,
                engines: engine_addrs.to_vec(),
            };
        }
        match self.replicas.first() {
            Some(g) => Target::Gateway {
                addrs: self.replicas.iter().map(|g| g.listen).collect(),
                host: g.listen.to_string(),
                path: format!("/{ROUTE}/v1/chat/completions"),
                next: AtomicU64::new(plan.opts.seed),
            },
            None => Target::Direct {
                engines: engine_addrs.to_vec(),
                placer: Placer::new(engine_addrs.len()),
            },
        }
    }

    /// Each replica's admin address and pid, or the router's process
    /// group, for the window's snapshots.
    fn probes(&self) -> Vec<Probe> {
        let router = self.router.iter().map(|r| Probe {
            admin: None,
            cpu: CpuOf::Group(r.pgid()),
        });
        self.replicas
            .iter()
            .map(|g| Probe {
                admin: Some(g.admin),
                cpu: CpuOf::Process(g.pid()),
            })
            .chain(router)
            .collect()
    }

    /// Stops the replicas or the router; an error if one had died during
    /// the run, or a router's process outlived the kill.
    fn stop(&mut self) -> Result<(), String> {
        if let Some(r) = self.router.as_mut() {
            let alive = r.alive();
            let log_tail = r.log_tail();
            let left = r.stop();
            if !alive {
                return Err(format!(
                    "the router exited during the run: {}\nlog:\n{log_tail}",
                    r.command
                ));
            }
            if !left.is_empty() {
                return Err(format!(
                    "router processes {left:?} (group {}) outlived SIGKILL",
                    r.pgid()
                ));
            }
        }
        for g in self.replicas.iter_mut() {
            let alive = g.alive();
            let log_tail = g.log_tail();
            g.stop();
            if !alive {
                return Err(format!("the gateway died during the run; log:\n{log_tail}"));
            }
        }
        Ok(())
    }
}

/// The state the session slots share, its clock starting now.
fn open_cell(plan: &Plan, workload: &Arc<Workload>, target: Target) -> Arc<Ctx> {
    let start = Instant::now();
    let end = start + plan.opts.duration;
    Arc::new(Ctx {
        workload: Arc::clone(workload),
        target,
        ids: SessionIds {
            mode: plan.opts.session_id,
            share: plan.opts.id_share,
            seed: plan.opts.seed,
        },
        start,
        end,
        hard_end: end + DRAIN,
        records: Mutex::new(Vec::new()),
        in_flight: AtomicU64::new(0),
    })
}

fn spawn_slots(ctx: &Arc<Ctx>, plan: &Plan) -> JoinSet<()> {
    let mut tasks = JoinSet::new();
    for slot in 0..plan.slots() as u32 {
        tasks.spawn(slot_task(Arc::clone(ctx), slot));
    }
    tasks
}

/// The measured window: samplers over it, snapshots at its two ends, and
/// the scenario's failover and `--redis-stop-at` inside it.
async fn observe(
    plan: &Plan,
    ctx: &Ctx,
    gateways: &mut Gateways,
    engines: &mut Engines,
    label: &str,
) -> Result<Window, String> {
    let (start, end) = (ctx.start, ctx.end);
    let warm = start + plan.warmup;
    let addrs = engines.addrs.clone();
    let sampler = tokio::spawn(sample_load(
        Arc::clone(&engines.live),
        plan.engine.max_running as i64,
        start,
        warm,
        end,
    ));
    let lag_probe = tokio::spawn(probe_lag(warm, end));
    let kv_sampler = tokio::spawn(sample_kv(addrs.clone(), warm, end));
    let gw_probe = gateways.probes();
    sleep_until(warm).await;
    let before = snapshot(&gw_probe, &addrs).await;
    let mut retired = Vec::new();
    let failover = async {
        let Some(f) = plan.failover else {
            return Ok(());
        };
        let i = f.engine;
        sleep_until(start + f.at).await;
        retired.push((i, scrape(addrs[i]).await));
        engines.cluster.engines[i].shutdown();
        eprintln!(
            "   {label}: e{i} shut down (connections refused) for {}",
            fmt_secs(f.outage)
        );
        sleep_until(start + f.back()).await;
        let fresh = engines
            .cluster
            .restart(i)
            .await
            .map_err(|e| format!("cannot restart e{i} on {}: {e}", addrs[i]))?;
        engines.live.lock()[i] = fresh.stats.clone();
        eprintln!("   {label}: e{i} back, with an empty cache");
        Ok::<(), String>(())
    };
    let redis_stop = async {
        let (Some(at), Some(redis)) = (plan.opts.redis_stop_at, gateways.redis.as_mut()) else {
            return;
        };
        sleep_until(warm + at).await;
        redis.kill();
        eprintln!(
            "   {label}: redis-server killed {} into the measured window",
            fmt_secs(at)
        );
    };
    let (failed_over, ()) = tokio::join!(failover, redis_stop);
    failed_over?;
    sleep_until(end).await;
    let after = snapshot(&gw_probe, &addrs).await;
    Ok(Window {
        before,
        after,
        retired,
        load: sampler.await.unwrap_or_default(),
        kv_committed: kv_sampler.await.unwrap_or_default(),
        lag: lag_probe.await.unwrap_or_default(),
    })
}

/// Lets the requests in flight finish until the hard end; returns how many
/// were cut.
async fn drain(ctx: &Ctx, mut tasks: JoinSet<()>, label: &str) -> u64 {
    eprintln!(
        "   {label}: window over, draining {} in-flight request(s)",
        ctx.in_flight.load(Ordering::Relaxed)
    );
    let drained = timeout_at(ctx.hard_end + Duration::from_secs(1), async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        let n = ctx.in_flight.load(Ordering::Relaxed);
        tasks.abort_all();
        n
    } else {
        0
    }
}

/// The cell's records, also appended to `--records` when given.
fn keep_records(ctx: &Ctx, plan: &Plan, mode: &str) -> Result<Vec<Record>, String> {
    let records = std::mem::take(&mut *ctx.records.lock());
    if let Some(path) = &plan.opts.records {
        write_records(path, &plan.label(), mode, &records)
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    Ok(records)
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
