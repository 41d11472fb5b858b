//! The main background service (the others, `server.rs` assembles: the
//! body-log sender, the dashboard's sampler, the session-store sync):
//! signals (SIGHUP reload, SIGTERM drain), the file watch (`watch.rs`:
//! reload on change) and, per route, the tasks of `health/` (probes,
//! engine scrapes, the session sweeper, discovery), which it owns
//! ([`crate::health::Tasks`]).
//!
//! Every reload after the first, whoever asks for it, runs through
//! [`Controller::reload`] in this service's loop, one at a time, counted by
//! its trigger.
//!
//! Pingora cannot add services after `run_forever`, so per-route work is
//! tasks this service starts and stops itself after each reload.
//!
//! SIGTERM starts the drain watcher: the process exits as soon as nothing
//! is in flight (after up to 2 s for body-log frames still queued), and at
//! `grace_period` at the latest, cutting what is left and logging how much
//! (Pingora's own grace timer, a second later, is only a backstop).

use crate::lifecycle;
use crate::metrics::metrics;
use crate::registry::{Registry, ReloadReport};
use crate::watch::{Burst, ConfigWatch, Targets};
use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;

pub struct Controller {
    registry: Arc<Registry>,
    grace_period: Duration,
    tasks: Arc<crate::health::Tasks>,
}

impl Controller {
    /// Draining has begun: every admission queue's waiters take their last
    /// try now rather than at the next released slot or sweeper tick.
    fn wake_queues(&self) {
        for route in self.registry.snapshot().values() {
            route.runtime.queue.room_may_have_freed();
        }
    }

    pub fn new(registry: Arc<Registry>, grace_period: Duration) -> Self {
        Controller {
            registry,
            grace_period,
            tasks: Arc::default(),
        }
    }
}

/// Who asked for a reload: the `trigger` label of `llm_gateway_reloads_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    Start,
    Signal,
    Watch,
}

impl Trigger {
    pub fn label(self) -> &'static str {
        match self {
            Trigger::Start => "start",
            Trigger::Signal => "signal",
            Trigger::Watch => "watch",
        }
    }
}

/// Logs a reload's outcome and counts it. Errors name the file and line.
pub fn log_reload(report: &ReloadReport, trigger: Trigger) {
    for w in &report.warnings {
        log::warn!("{w}");
    }
    for e in &report.errors {
        log::error!("route file rejected, previous version kept: {e}");
    }
    if let Some(e) = &report.tenants_error {
        log::error!("tenants file rejected, previous version kept: {e}");
    }
    log::info!(
        "reload ({}): routes added {:?}, changed {:?}, removed {:?}, unchanged {}, errors {}",
        trigger.label(),
        report.added,
        report.changed,
        report.removed,
        report.unchanged.len(),
        report.errors.len() + usize::from(report.tenants_error.is_some())
    );
    let result = if report.ok() { "ok" } else { "error" };
    metrics()
        .reloads
        .with_label_values(&[trigger.label(), result])
        .inc();
}

impl Controller {
    /// The one reload path after startup: SIGHUP and the file watch both
    /// end here. Re-reads routes and key files, then restarts the per-route
    /// tasks of what changed.
    async fn reload(&self, trigger: Trigger) {
        let registry = Arc::clone(&self.registry);
        match tokio::task::spawn_blocking(move || registry.reload()).await {
            Ok(report) => log_reload(&report, trigger),
            Err(e) => log::error!("reload task failed: {e}"),
        }
        self.tasks.sync(&self.registry);
    }

    /// What the watch should follow for the table now loaded.
    fn targets(&self) -> Targets {
        Targets::new(
            &self.registry.gateway().routes_dir,
            &self.registry.key_files(),
        )
    }

    /// Starts the file watch when gateway.yaml asks for it. A watch that
    /// cannot start leaves SIGHUP as the way to reload.
    fn start_watch(&self) -> Option<(ConfigWatch, mpsc::Receiver<Burst>)> {
        if !self.registry.gateway().watch {
            log::info!("watch: off; SIGHUP reloads routes and key files");
            crate::metrics::metrics().watching.set(0);
            return None;
        }
        match ConfigWatch::start(self.targets()) {
            Ok(started) => {
                log::info!(
                    "watch: reloading on changes in {} and the key files' directories (debounce {:?})",
                    self.registry.gateway().routes_dir.display(),
                    crate::watch::DEBOUNCE
                );
                Some(started)
            }
            Err(e) => {
                log::error!("watch: cannot start the file watch ({e}); reload with SIGHUP");
                crate::metrics::metrics().watching.set(0);
                None
            }
        }
    }

    /// After a reload: the watch follows the new table's key files, and a
    /// directory watched again after a gap gets one more reload for what
    /// changed unseen.
    async fn follow(&self, watch: &mut Option<ConfigWatch>) {
        let Some(w) = watch.as_mut() else {
            return;
        };
        if w.sync(self.targets()) {
            self.reload(Trigger::Watch).await;
            w.sync(self.targets());
        }
    }
}

/// The next burst of changes, or never when there is no watch.
async fn next_burst(bursts: &mut Option<mpsc::Receiver<Burst>>) -> Burst {
    match bursts {
        Some(rx) => match rx.recv().await {
            Some(burst) => burst,
            None => std::future::pending().await,
        },
        None => std::future::pending().await,
    }
}

/// Pingora's own graceful shutdown sleeps the whole grace period even when
/// nothing is in flight. This watcher ends the process as soon as the last
/// request finishes, and at the latest `grace` after SIGTERM, when it cuts
/// what is left and says how much (Pingora's own timer is only a backstop,
/// see `server::run`: when it fired first, the process exited before the
/// cut was logged).
///
/// Both SIGTERM and Pingora's own shutdown broadcast start it (whichever the
/// select sees first); only the first call does anything.
fn spawn_drain_watcher(grace: Duration) {
    if !lifecycle::start_draining() {
        return;
    }
    let started = Instant::now();
    let spawned = std::thread::Builder::new()
        .name("drain-watcher".into())
        .spawn(move || {
            // Let Pingora close its listeners before counting: a request
            // accepted in that instant is then counted too.
            std::thread::sleep(Duration::from_millis(100));
            loop {
                let active = lifecycle::active_requests();
                if active == 0 {
                    lifecycle::wait_for_output(Duration::from_secs(2));
                    log::info!("drained after {:?}, exiting", started.elapsed());
                    std::process::exit(0);
                }
                if started.elapsed() >= grace {
                    // Their clients see the connection close without the
                    // stream's end: a cut, never a fake clean finish.
                    log::warn!(
                        "grace period over with {active} request(s) still running: cut, exiting"
                    );
                    std::process::exit(0);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
    if let Err(e) = spawned {
        log::error!("cannot start drain watcher ({e}); waiting the full grace period");
    }
}

#[async_trait]
impl BackgroundService for Controller {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let (mut hup, mut term) = match (
            signal(SignalKind::hangup()),
            signal(SignalKind::terminate()),
        ) {
            (Ok(h), Ok(t)) => (h, t),
            (Err(e), _) | (_, Err(e)) => {
                log::error!("cannot install signal handlers: {e}; SIGHUP reload disabled");
                let _ = shutdown.changed().await;
                return;
            }
        };
        self.tasks.sync(&self.registry);
        let (mut watch, mut bursts) = match self.start_watch() {
            Some((w, rx)) => (Some(w), Some(rx)),
            None => (None, None),
        };
        let mut retry = tokio::time::interval(crate::watch::RETRY);
        retry.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = hup.recv() => {
                    log::info!("SIGHUP: reloading routes from {}", self.registry.gateway().routes_dir.display());
                    self.reload(Trigger::Signal).await;
                    self.follow(&mut watch).await;
                }
                burst = next_burst(&mut bursts) => {
                    log::info!("watch: changed {burst}: reloading");
                    self.reload(Trigger::Watch).await;
                    self.follow(&mut watch).await;
                }
                _ = retry.tick(), if watch.as_ref().is_some_and(ConfigWatch::incomplete) => {
                    self.follow(&mut watch).await;
                }
                _ = term.recv() => {
                    log::info!("SIGTERM: draining for at most {:?}", self.grace_period);
                    spawn_drain_watcher(self.grace_period);
                    self.wake_queues();
                }
                _ = shutdown.changed() => {
                    if *shutdown.borrow() {
                        spawn_drain_watcher(self.grace_period);
                        self.wake_queues();
                        return;
                    }
                }
            }
        }
    }
}
