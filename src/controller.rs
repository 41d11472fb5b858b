//! The one background service: signals (SIGHUP reload, SIGTERM drain) and,
//! per route, the health probe / engine scrape / session sweep tasks.
//!
//! Pingora cannot add services after `run_forever`, so per-route work is
//! tasks this service starts and stops itself after each reload.

use crate::lifecycle;
use crate::metrics::metrics;
use crate::registry::{Registry, ReloadReport};
use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::signal::unix::{signal, SignalKind};

pub struct Controller {
    registry: Arc<Registry>,
    grace_period: Duration,
    tasks: crate::health::Tasks,
}

impl Controller {
    pub fn new(registry: Arc<Registry>, grace_period: Duration) -> Self {
        Controller {
            registry,
            grace_period,
            tasks: crate::health::Tasks::default(),
        }
    }
}

/// Logs a reload's outcome and counts it. Errors name the file and line.
pub fn log_reload(report: &ReloadReport) {
    for w in &report.warnings {
        log::warn!("{w}");
    }
    for e in &report.errors {
        log::error!("route file rejected, previous version kept: {e}");
    }
    log::info!(
        "routes: added {:?}, changed {:?}, removed {:?}, unchanged {}, errors {}",
        report.added,
        report.changed,
        report.removed,
        report.unchanged.len(),
        report.errors.len()
    );
    let result = if report.ok() { "ok" } else { "error" };
    metrics().reloads.with_label_values(&[result]).inc();
}

/// Pingora's own graceful shutdown sleeps the whole grace period even when
/// nothing is in flight. This watcher ends the process as soon as the last
/// request finishes (at most `grace` after SIGTERM, when Pingora's own timer
/// takes over and cancels what is left).
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
                    // Pingora's grace timer ends now as well and cancels the rest.
                    log::warn!("grace period over with {active} request(s) still running");
                    return;
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
        loop {
            tokio::select! {
                _ = hup.recv() => {
                    log::info!("SIGHUP: reloading routes from {}", self.registry.gateway().routes_dir.display());
                    let registry = Arc::clone(&self.registry);
                    match tokio::task::spawn_blocking(move || registry.reload()).await {
                        Ok(report) => log_reload(&report),
                        Err(e) => log::error!("reload task failed: {e}"),
                    }
                    self.tasks.sync(&self.registry);
                }
                _ = term.recv() => {
                    log::info!("SIGTERM: draining for at most {:?}", self.grace_period);
                    spawn_drain_watcher(self.grace_period);
                }
                _ = shutdown.changed() => {
                    if *shutdown.borrow() {
                        spawn_drain_watcher(self.grace_period);
                        return;
                    }
                }
            }
        }
    }
}
