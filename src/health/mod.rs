//! A route's background tasks, owned by the controller ([`Tasks`]):
//!
//! - per peer, the health probe and the engine metrics scrape (load, KV
//!   capacity from `/metrics`, else llama.cpp's `/props`, else learned
//!   from the KV-usage gauge; llama.cpp's slots from `/props`, which
//!   rebuild the route once for a peer whose route sets no
//!   `max_concurrency`);
//! - per route, the session sweeper (every second: the live recount, each
//!   engine's completion rate, the pools' in-flight for `/_cluster_avg`,
//!   a wake-up for the admission queue; every 30 s, expired sessions and
//!   what the content index no longer needs) and, with adaptive
//!   concurrency, its tick (`Route::adaptive_tick`);
//! - per route runtime, the discovery task (`crate::discovery`), which
//!   outlives the rebuilds it asks for.
//!
//! A new version of a route (a reload that changed it, a rebuild its
//! discovery asked for) bumps its generation: [`Tasks::sync`] starts the
//! new generation's tasks, and the old ones stop by themselves.
//!
//! Probe semantics (from the OpenResty gateway): 2xx → ready (unban); 429 or
//! a timeout → alive but busy, left as is (banning a busy peer would remove
//! capacity exactly when it is under load); anything else → banned for
//! `ban_ttl`, re-banned while it keeps failing.

pub mod client;
pub mod prom;

use crate::clock::now_ms;
use crate::config::ConcurrencyFrom;
use crate::placement::CapacitySource;
use crate::registry::{ProbeVerdict, Registry, Route};
use client::GetError;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// The per-route background tasks (probes, scrapes, the session sweeper),
/// owned by the controller.
#[derive(Default)]
pub struct Tasks {
    /// Route name → generation whose tasks are running.
    started: Mutex<HashMap<String, usize>>,
    /// Route name → the runtime its discovery task serves (one task per
    /// runtime, whatever its generation: a rebuild it asks for must not
    /// stop it).
    discovering: Mutex<HashMap<String, std::sync::Weak<crate::registry::RouteRuntime>>>,
    /// Made on first use, in the runtime the tasks run on.
    resolver: std::sync::OnceLock<Option<Arc<crate::discovery::resolver::Resolver>>>,
}

impl Tasks {
    /// Starts tasks for routes that are new or changed since the last call.
    /// Tasks of an older generation notice and stop by themselves, so a
    /// reload never has to abort anything mid-probe.
    pub fn sync(self: &Arc<Self>, registry: &Arc<Registry>) {
        self.discover(registry);
        sync_tasks(self, &mut self.started.lock(), registry)
    }

    /// A discovery task for every route runtime that has none.
    fn discover(self: &Arc<Self>, registry: &Arc<Registry>) {
        let resolver = self.resolver.get_or_init(|| {
            crate::discovery::resolver::Resolver::new(&registry.gateway().resolver)
                .inspect_err(|e| {
                    log::error!("discovery: {e}; peer host names are not looked up again")
                })
                .ok()
                .map(Arc::new)
        });
        let Some(resolver) = resolver else { return };
        let snapshot = registry.snapshot();
        let mut discovering = self.discovering.lock();
        discovering.retain(|name, _| snapshot.contains_key(name));
        for (name, route) in snapshot.iter() {
            let running = discovering
                .get(name)
                .and_then(std::sync::Weak::upgrade)
                .is_some_and(|r| Arc::ptr_eq(&r, &route.runtime));
            if !running {
                discovering.insert(name.clone(), Arc::downgrade(&route.runtime));
                let tasks = Arc::clone(self);
                crate::discovery::spawn(
                    Arc::clone(registry),
                    Arc::clone(resolver),
                    name.clone(),
                    Arc::clone(&route.runtime),
                    Box::new(move |registry| tasks.sync(registry)),
                );
            }
        }
    }
}

fn sync_tasks(tasks: &Arc<Tasks>, started: &mut HashMap<String, usize>, registry: &Arc<Registry>) {
    let snapshot = registry.snapshot();
    started.retain(|name, _| snapshot.contains_key(name));
    for (name, route) in snapshot.iter() {
        let generation = route.runtime.generation.load(Ordering::Acquire);
        if started.get(name) == Some(&generation) {
            continue;
        }
        started.insert(name.clone(), generation);
        for index in 0..route.peers.len() {
            if route.config.health.enabled {
                tokio::spawn(probe_loop(
                    Arc::clone(registry),
                    Arc::clone(route),
                    index,
                    generation,
                ));
            }
            if route.config.engine_metrics.is_some() {
                tokio::spawn(scrape_loop(
                    Arc::clone(tasks),
                    Arc::clone(registry),
                    Arc::clone(route),
                    index,
                    generation,
                ));
            }
        }
        if let Some(adaptive) = route.config.protection.adaptive_on() {
            let every = Duration::from_millis(adaptive.interval_ms.max(50));
            let (route, registry) = (Arc::clone(route), Arc::clone(registry));
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(every);
                tick.tick().await;
                while current(&registry, &route, generation) {
                    tick.tick().await;
                    route.adaptive_tick(now_ms());
                    // A raised limit is room for whoever waits.
                    route.runtime.queue.room_may_have_freed();
                }
            });
        }
        let sweeper_route = Arc::clone(route);
        let sweeper_registry = Arc::clone(registry);
        tokio::spawn(async move {
            // Every second the live counts are recounted (sessions age out
            // of the live window), each engine's completion rate is taken,
            // each pool's in-flight is sampled for `/_cluster_avg`, and
            // waiters get a look at the room that frees; every 30 s expired
            // sessions are swept, and what the content index no longer
            // needs.
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            tick.tick().await;
            let mut seconds = 0u64;
            while current(&sweeper_registry, &sweeper_route, generation) {
                tick.tick().await;
                seconds += 1;
                let sessions = &sweeper_route.runtime.sessions;
                if seconds.is_multiple_of(30) {
                    sessions.sweep(now_ms());
                    sweeper_route.runtime.content.sweep(now_ms());
                }
                sessions.refresh_live(now_ms());
                for peer in &sweeper_route.peers {
                    peer.state.tick_speed(now_ms());
                }
                sweeper_route.sample_cluster_avg(now_ms());
                sweeper_route.runtime.queue.room_may_have_freed();
            }
        });
    }
}

/// Whether `route` at `generation` is still the live version.
fn current(registry: &Registry, route: &Route, generation: usize) -> bool {
    route.runtime.generation.load(Ordering::Acquire) == generation
        && registry
            .route(route.name())
            .is_some_and(|live| Arc::ptr_eq(&live.runtime, &route.runtime))
}

async fn probe_loop(registry: Arc<Registry>, route: Arc<Route>, index: usize, generation: usize) {
    let cfg = route.config.health.clone();
    let peer = &route.peers[index];
    let Some(addr) = peer.addr else { return };
    let path = peer
        .config
        .probe_path
        .clone()
        .unwrap_or(cfg.probe_path.clone());
    let mut tick = tokio::time::interval(cfg.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while current(&registry, &route, generation) {
        tick.tick().await;
        let outcome = client::get(&peer.config, addr, &path, cfg.timeout, 4096).await;
        let state = &peer.state;
        match outcome {
            Ok((status, _)) if (200..300).contains(&status) => {
                if state.is_failing() || !state.is_ready(now_ms()) {
                    log::info!(
                        "route {} peer {}: probe ok, ready again",
                        route.name(),
                        peer.config.name
                    );
                }
                state.unban();
                state.record_probe(ProbeVerdict::Ready);
            }
            Err(GetError::Connect(e)) if crate::errors::local_shortage_io(&e).is_some() => {
                // The gateway could not open the probe's socket: its own
                // shortage says nothing about the peer, which stays as it is.
                log::warn!(
                    "route {} peer {}: probe not sent, the gateway is short of sockets ({e})",
                    route.name(),
                    peer.config.name
                );
            }
            Ok((429, _)) | Err(GetError::Timeout) => {
                log::debug!(
                    "route {} peer {}: busy (429/timeout), not banned",
                    route.name(),
                    peer.config.name
                );
                state.record_probe(ProbeVerdict::Busy);
            }
            other => {
                if matches!(other, Err(GetError::Connect(_))) {
                    // Nothing listens there any more: the engine may have
                    // moved, so its name is looked up again now.
                    route.runtime.rediscover.notify_one();
                }
                let why = match other {
                    Ok((status, _)) => format!("status {status}"),
                    Err(e) => e.reason(),
                };
                if state.is_ready(now_ms()) {
                    log::warn!(
                        "route {} peer {}: probe failed ({why}), banned for {:?}",
                        route.name(),
                        peer.config.name,
                        cfg.ban_ttl
                    );
                }
                state.ban(now_ms(), cfg.ban_ttl);
                state.note_failure(why);
                state.record_probe(ProbeVerdict::Down);
            }
        }
    }
}

async fn scrape_loop(
    tasks: Arc<Tasks>,
    registry: Arc<Registry>,
    route: Arc<Route>,
    index: usize,
    generation: usize,
) {
    let Some(cfg) = route.config.engine_metrics.clone() else {
        return;
    };
    let peer = &route.peers[index];
    let Some(addr) = peer.addr else { return };
    let mut tick = tokio::time::interval(cfg.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut warned = false;
    let mut props_asked_at: Option<u64> = None;
    while current(&registry, &route, generation) {
        tick.tick().await;
        // A scrape slower than its interval would be stale on arrival.
        let timeout = cfg.interval.max(Duration::from_millis(200));
        // A failed scrape leaves the last sample to go stale on its own.
        let Ok((200, body)) = client::get(&peer.config, addr, &cfg.path, timeout, 4 << 20).await
        else {
            continue;
        };
        let text = String::from_utf8_lossy(&body);
        if let Some(tokens) = prom::parse_kv_capacity(&text) {
            peer.state
                .record_kv_capacity(tokens, CapacitySource::Metrics);
        }
        let load = prom::parse_engine_load(&text);
        match load {
            Some(load) => peer.state.record_engine(load, now_ms(), cfg.max_age_ms()),
            None if !warned => {
                warned = true;
                log::warn!("route {} peer {}: {} has no vLLM, SGLang or llama.cpp load metrics; placement uses in-flight counts only", route.name(), peer.config.name, cfg.path);
            }
            None => {}
        }
        let wants_capacity =
            peer.config.kv_capacity_tokens.is_none() && !peer.state.published_kv_capacity();
        let wants_slots = peer.config.max_concurrency_from == ConcurrencyFrom::Default
            && peer.state.engine_slots().is_none();
        if !wants_capacity && !wants_slots {
            continue;
        }
        // llama.cpp publishes its context and its slots in `/props`, not in
        // its metrics: asked once a minute until it answers (another
        // engine answers 404, cheaply); capacity no engine publishes is
        // learned from the gauge.
        let now = now_ms();
        if props_asked_at.is_none_or(|at| now.saturating_sub(at) >= PROPS_EVERY_MS) {
            props_asked_at = Some(now);
            if let Ok((200, props)) =
                client::get(&peer.config, addr, "/props", timeout, 1 << 20).await
            {
                let slots = prom::parse_props_slots(&props);
                if slots.is_some_and(|n| peer.state.record_engine_slots(n)) && wants_slots {
                    // The peer's limit is part of its route's version: the
                    // route is built again with it, and this generation's
                    // tasks give way to the next's.
                    if registry.rediscovered(route.name()) {
                        tasks.sync(&registry);
                    }
                    return;
                }
                if let Some(tokens) = prom::parse_props_capacity(&props) {
                    peer.state.record_kv_capacity(tokens, CapacitySource::Props);
                    continue;
                }
            }
        }
        if let (Some(load), true) = (load, wants_capacity) {
            peer.state.learn_kv_capacity(load.kv_usage);
        }
    }
}

/// How often an engine without a capacity in its metrics is asked for
/// llama.cpp's `/props`.
const PROPS_EVERY_MS: u64 = 60_000;
