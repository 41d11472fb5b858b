//! The live route table and the runtime state that outlives a reload.
//!
//! A request takes one `Arc<RouteTable>` snapshot and keeps it to the end, so
//! a reload never changes a request mid-flight. Runtime state (in-flight
//! counts, bans, engine load, the session table) lives in `RouteRuntime`,
//! keyed by route name and, per peer, by `host:port`: a reload hands the same
//! state to every peer that is still configured and drops it for the rest.

use crate::auth::{KeyFileStatus, KeySet};
use crate::config::{ConfigError, GatewayConfig, PeerConfig, RouteConfig};
use crate::placement::{EngineLoad, PeerId, PeerLoad, SessionTable, TableConfig};
use crate::reject::RuleSet;
use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Last engine metrics read from a peer's `/metrics`.
#[derive(Debug, Clone, Copy)]
pub struct EngineSample {
    pub load: EngineLoad,
    pub read_at_ms: u64,
    /// The peer's completion count when the sample was read.
    pub completed_at_read: u64,
    /// Waiting requests seen in this AND the previous scrape (the smaller
    /// count), 0 when the previous scrape is missing or too old. A queue
    /// that shows up in one sample only is a burst the engine absorbs on
    /// its own; moving a session for it costs a cold prefill of its whole
    /// context (measured in the replay bench: such spills cost load_aware
    /// its lead on TTFT p95).
    pub sustained_waiting: u32,
}

/// The engine's queue as it must be now: every request this gateway saw
/// finish since the sample freed a running slot, which admits one waiting
/// request (continuous batching). Without this, a queue that drained right
/// after a scrape keeps looking backed up for up to two scrape intervals,
/// and sessions spill needlessly, each re-prefilling its whole context on a
/// cold peer.
pub fn discount_completed(load: EngineLoad, completed: u64) -> EngineLoad {
    let completed = u32::try_from(completed).unwrap_or(u32::MAX);
    let from_waiting = completed.min(load.waiting);
    EngineLoad {
        waiting: load.waiting - from_waiting,
        running: load.running.saturating_sub(completed - from_waiting),
        kv_usage: load.kv_usage,
    }
}

/// Runtime state of one peer (route + host:port). Shared by all worker threads.
#[derive(Debug)]
pub struct PeerState {
    pub id: PeerId,
    pub address: String,
    in_flight: AtomicU32,
    /// Requests finished (slots released) since the peer was first seen.
    completed: AtomicU64,
    /// 0 = not banned; else `now_ms()` until which the peer is not ready.
    banned_until_ms: AtomicU64,
    /// Set by a failing probe or a live connect failure, cleared by a passing probe.
    failing: AtomicBool,
    engine: Mutex<Option<EngineSample>>,
}

impl PeerState {
    fn new(id: PeerId, address: String) -> Self {
        PeerState {
            id,
            address,
            in_flight: AtomicU32::new(0),
            completed: AtomicU64::new(0),
            banned_until_ms: AtomicU64::new(0),
            failing: AtomicBool::new(false),
            engine: Mutex::new(None),
        }
    }

    pub fn in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::Relaxed)
    }

    pub fn is_ready(&self, now_ms: u64) -> bool {
        let until = self.banned_until_ms.load(Ordering::Relaxed);
        until == 0 || now_ms >= until
    }

    /// Remaining ban, for the status endpoints.
    pub fn banned_for_ms(&self, now_ms: u64) -> u64 {
        self.banned_until_ms
            .load(Ordering::Relaxed)
            .saturating_sub(now_ms)
    }

    pub fn ban(&self, now_ms: u64, ttl: Duration) {
        self.failing.store(true, Ordering::Relaxed);
        self.banned_until_ms
            .store(now_ms + ttl.as_millis().max(1) as u64, Ordering::Relaxed);
    }

    pub fn unban(&self) {
        self.failing.store(false, Ordering::Relaxed);
        self.banned_until_ms.store(0, Ordering::Relaxed);
    }

    pub fn is_failing(&self) -> bool {
        self.failing.load(Ordering::Relaxed)
    }

    /// Stores a scrape; `max_gap_ms` is how old the previous one may be to
    /// count as consecutive (two scrape intervals).
    pub fn record_engine(&self, load: EngineLoad, now_ms: u64, max_gap_ms: u64) {
        let mut slot = self.engine.lock();
        let sustained_waiting = match *slot {
            Some(prev) if now_ms.saturating_sub(prev.read_at_ms) <= max_gap_ms => {
                prev.load.waiting.min(load.waiting)
            }
            _ => 0,
        };
        *slot = Some(EngineSample {
            load,
            read_at_ms: now_ms,
            completed_at_read: self.completed.load(Ordering::Acquire),
            sustained_waiting,
        });
    }

    /// Requests that finished on this peer since `sample` was read.
    pub fn completed_since(&self, sample: &EngineSample) -> u64 {
        self.completed
            .load(Ordering::Acquire)
            .saturating_sub(sample.completed_at_read)
    }

    pub fn engine_sample(&self) -> Option<EngineSample> {
        *self.engine.lock()
    }

    /// Reserves an in-flight slot unless the peer already carries `limit`.
    /// One atomic read-modify-write, so the limit holds across worker threads.
    pub fn try_acquire(self: &Arc<Self>, limit: u32) -> Option<InFlightGuard> {
        self.in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |n| {
                (n < limit).then_some(n + 1)
            })
            .ok()
            .map(|_| InFlightGuard {
                peer: Arc::clone(self),
            })
    }
}

/// An in-flight slot on a peer. Dropping it releases the slot, so every exit
/// path of a request (local response, connect failure, upstream death, client
/// disconnect, a panic unwinding the task) gives it back.
#[derive(Debug)]
pub struct InFlightGuard {
    peer: Arc<PeerState>,
}

impl InFlightGuard {
    pub fn peer(&self) -> &Arc<PeerState> {
        &self.peer
    }
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        self.peer.in_flight.fetch_sub(1, Ordering::AcqRel);
        self.peer.completed.fetch_add(1, Ordering::AcqRel);
    }
}

/// A configured peer of the current route version with its runtime state.
#[derive(Debug)]
pub struct RoutePeer {
    pub config: PeerConfig,
    pub state: Arc<PeerState>,
    /// Resolved at load time so the request path never blocks on DNS; None
    /// when the host did not resolve (the peer is then never chosen).
    pub addr: Option<SocketAddr>,
}

/// Per-route state that survives reloads.
pub struct RouteRuntime {
    peers: Mutex<HashMap<String, Arc<PeerState>>>,
    next_peer_id: AtomicU32,
    pub sessions: SessionTable,
    /// Bumped on every reload that changes this route; background tasks of an
    /// older generation stop by themselves.
    pub generation: AtomicUsize,
    /// Turn counter of the round_robin baseline mode.
    pub round_robin: AtomicUsize,
    /// Runtime overrides set through the `/_…_toggle` endpoints; they
    /// outlive reloads until `?reset=1`.
    pub toggles: Toggles,
    /// The route's own key file, re-read on every reload (None: shared keys).
    keys: RwLock<Option<Arc<KeyState>>>,
}

/// A switch that the route config sets and a runtime toggle may override.
#[derive(Debug, Default)]
pub struct Toggle(std::sync::atomic::AtomicU8);

impl Toggle {
    const UNSET: u8 = 0;
    const OFF: u8 = 1;
    const ON: u8 = 2;

    /// The value in force and where it comes from ("config" or "runtime").
    pub fn effective(&self, configured: bool) -> (bool, &'static str) {
        match self.0.load(Ordering::Relaxed) {
            Self::OFF => (false, "runtime"),
            Self::ON => (true, "runtime"),
            _ => (configured, "config"),
        }
    }

    pub fn is_on(&self, configured: bool) -> bool {
        self.effective(configured).0
    }

    pub fn set(&self, on: bool) {
        self.0
            .store(if on { Self::ON } else { Self::OFF }, Ordering::Relaxed);
    }

    pub fn reset(&self) {
        self.0.store(Self::UNSET, Ordering::Relaxed);
    }
}

#[derive(Debug, Default)]
pub struct Toggles {
    pub reject_rules: Toggle,
    pub include_usage: Toggle,
    pub postprocess: Toggle,
}

impl Toggles {
    pub fn by_name(&self, name: &str) -> Option<&Toggle> {
        match name {
            "reject_rules" => Some(&self.reject_rules),
            "include_usage" => Some(&self.include_usage),
            "postprocess" => Some(&self.postprocess),
            _ => None,
        }
    }
}

/// An API key file as last read.
#[derive(Debug)]
pub struct KeyState {
    pub path: PathBuf,
    pub status: KeyFileStatus,
    pub keys: Option<KeySet>,
    /// "shared" (gateway.yaml / env) or "route" (the route's api_keys_file).
    pub scope: &'static str,
}

impl KeyState {
    fn load(path: &Path, scope: &'static str) -> Self {
        let (status, keys) = KeySet::load(path);
        KeyState {
            path: path.to_path_buf(),
            status,
            keys,
            scope,
        }
    }

    /// Keys are enforced only when a readable file holds at least one key;
    /// otherwise requests pass (deliberate fail-open, logged loudly).
    pub fn enforced(&self) -> Option<&KeySet> {
        self.keys.as_ref().filter(|k| !k.is_empty())
    }
}

impl RouteRuntime {
    fn new(config: &RouteConfig) -> Self {
        RouteRuntime {
            peers: Mutex::new(HashMap::new()),
            next_peer_id: AtomicU32::new(0),
            sessions: SessionTable::new(table_config(config)),
            generation: AtomicUsize::new(0),
            round_robin: AtomicUsize::new(0),
            toggles: Toggles::default(),
            keys: RwLock::new(None),
        }
    }

    /// The state for `address`, created on first sight. Ids are never reused
    /// within a route, so a binding to a removed peer can never point at a new one.
    fn peer_state(&self, address: &str) -> Arc<PeerState> {
        let mut peers = self.peers.lock();
        if let Some(p) = peers.get(address) {
            return Arc::clone(p);
        }
        let id = self.next_peer_id.fetch_add(1, Ordering::Relaxed);
        let p = Arc::new(PeerState::new(id, address.to_string()));
        peers.insert(address.to_string(), Arc::clone(&p));
        p
    }

    /// Drops state of peers no longer configured and returns their ids.
    fn retain_peers(&self, keep: &[String]) -> Vec<PeerId> {
        let mut peers = self.peers.lock();
        let gone: Vec<PeerId> = peers
            .iter()
            .filter(|(addr, _)| !keep.contains(addr))
            .map(|(_, p)| p.id)
            .collect();
        peers.retain(|addr, _| keep.contains(addr));
        gone
    }
}

fn resolve(host: &str, port: u16) -> Option<SocketAddr> {
    use std::net::ToSocketAddrs;
    if let Ok(ip) = host.parse::<std::net::IpAddr>() {
        return Some(SocketAddr::new(ip, port));
    }
    match (host, port).to_socket_addrs() {
        Ok(mut addrs) => addrs.next(),
        Err(e) => {
            log::error!("peer {host}:{port}: cannot resolve ({e}); it will not be used until a reload resolves it");
            None
        }
    }
}

fn table_config(config: &RouteConfig) -> TableConfig {
    TableConfig {
        idle_timeout_ms: config.balancing.idle_timeout.as_millis() as u64,
        ..TableConfig::default()
    }
}

/// One route version: immutable config plus shared runtime state.
pub struct Route {
    pub config: RouteConfig,
    pub peers: Vec<RoutePeer>,
    pub runtime: Arc<RouteRuntime>,
    /// `config.reject_rules` compiled; invalid rules were dropped (and logged).
    pub rules: RuleSet,
}

impl Route {
    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// The load view placement works on, for the peers at `indices`.
    pub fn peer_loads(&self, indices: &[usize], now_ms: u64) -> Vec<PeerLoad> {
        let engine_cfg = self.config.engine_metrics.as_ref();
        indices
            .iter()
            .filter_map(|&i| self.peers.get(i))
            .map(|p| {
                let fresh = engine_cfg.and_then(|cfg| {
                    let sample = p.state.engine_sample()?;
                    (now_ms.saturating_sub(sample.read_at_ms) <= cfg.max_age_ms()).then(|| {
                        let queue = EngineLoad {
                            waiting: sample.sustained_waiting,
                            ..sample.load
                        };
                        discount_completed(queue, p.state.completed_since(&sample))
                    })
                });
                let kv_full = match (fresh, engine_cfg) {
                    (Some(load), Some(cfg)) => load.kv_usage >= cfg.kv_full_threshold,
                    _ => false,
                };
                PeerLoad {
                    id: p.state.id,
                    ready: p.state.is_ready(now_ms),
                    in_flight: p.state.in_flight(),
                    max_concurrency: p.config.max_concurrency,
                    engine: fresh,
                    kv_full,
                }
            })
            .collect()
    }

    /// The key file in force for this route: its own, else the shared one.
    pub fn keys(&self, registry: &Registry) -> Arc<KeyState> {
        match &*self.runtime.keys.read() {
            Some(own) if self.config.api_keys_file.is_some() => Arc::clone(own),
            _ => registry.shared_keys(),
        }
    }

    /// Remembered sessions per peer, in the order of `peers`.
    pub fn sessions_per_peer(&self) -> Vec<usize> {
        let bindings = self.runtime.sessions.bindings_per_peer();
        self.peers
            .iter()
            .map(|p| {
                bindings
                    .iter()
                    .find(|(id, _)| *id == p.state.id)
                    .map_or(0, |(_, n)| *n)
            })
            .collect()
    }

    pub fn peer_by_id(&self, id: PeerId) -> Option<(usize, &RoutePeer)> {
        self.peers
            .iter()
            .enumerate()
            .find(|(_, p)| p.state.id == id)
    }
}

pub type RouteTable = HashMap<String, Arc<Route>>;

/// What a reload did, for logs, metrics and tests.
#[derive(Debug, Default, Clone)]
pub struct ReloadReport {
    pub added: Vec<String>,
    pub changed: Vec<String>,
    pub removed: Vec<String>,
    pub unchanged: Vec<String>,
    /// Files that failed; their route keeps its previous version (or stays absent).
    pub errors: Vec<ConfigError>,
    pub warnings: Vec<String>,
}

impl ReloadReport {
    pub fn ok(&self) -> bool {
        self.errors.is_empty()
    }
}

/// Owns the current route table and the runtime registry behind it.
pub struct Registry {
    table: RwLock<Arc<RouteTable>>,
    runtimes: Mutex<HashMap<String, Arc<RouteRuntime>>>,
    gateway: GatewayConfig,
    /// Serialises reloads (SIGHUP can arrive while one is running).
    reload_lock: Mutex<()>,
    shared_keys: RwLock<Arc<KeyState>>,
}

impl Registry {
    pub fn new(gateway: GatewayConfig) -> Self {
        Registry {
            table: RwLock::new(Arc::new(HashMap::new())),
            runtimes: Mutex::new(HashMap::new()),
            // Read (and logged) by the first reload, like every later one.
            shared_keys: RwLock::new(Arc::new(KeyState {
                path: gateway.api_keys_file.clone(),
                status: KeyFileStatus::Missing,
                keys: None,
                scope: "shared",
            })),
            gateway,
            reload_lock: Mutex::new(()),
        }
    }

    pub fn shared_keys(&self) -> Arc<KeyState> {
        Arc::clone(&self.shared_keys.read())
    }

    pub fn gateway(&self) -> &GatewayConfig {
        &self.gateway
    }

    /// The current table; cheap (one Arc clone under a read lock).
    pub fn snapshot(&self) -> Arc<RouteTable> {
        Arc::clone(&self.table.read())
    }

    pub fn route(&self, name: &str) -> Option<Arc<Route>> {
        self.table.read().get(name).cloned()
    }

    /// Re-reads the routes directory and swaps in the new table. A file that
    /// fails to parse or validate keeps its previous version (or stays absent
    /// if new); a file that disappeared removes its route.
    pub fn reload(&self) -> ReloadReport {
        let _serial = self.reload_lock.lock();
        let mut report = ReloadReport::default();
        let dir = &self.gateway.routes_dir;
        let loaded = match crate::config::load_routes_dir(dir, &self.gateway) {
            Ok(l) => l,
            Err(e) => {
                // An unreadable directory says nothing about which routes
                // should exist: keep serving what we have.
                report.errors.push(e);
                return report;
            }
        };
        let old = self.snapshot();
        let mut next: RouteTable = HashMap::with_capacity(loaded.len());
        for (name, result) in loaded {
            match result {
                Ok(config) => {
                    report.warnings.extend(
                        config
                            .warnings
                            .iter()
                            .map(|w| format!("{}: {w}", config.file.display())),
                    );
                    match old.get(&name) {
                        Some(prev) if prev.config == config => {
                            report.unchanged.push(name.clone());
                            next.insert(name, Arc::clone(prev));
                        }
                        Some(_) => {
                            report.changed.push(name.clone());
                            next.insert(name, self.build_route(config));
                        }
                        None => {
                            report.added.push(name.clone());
                            next.insert(name, self.build_route(config));
                        }
                    }
                }
                Err(e) => {
                    if let Some(prev) = old.get(&name) {
                        next.insert(name, Arc::clone(prev));
                    }
                    report.errors.push(e);
                }
            }
        }
        for name in old.keys() {
            if !next.contains_key(name) {
                report.removed.push(name.clone());
            }
        }
        {
            let mut runtimes = self.runtimes.lock();
            runtimes.retain(|name, _| next.contains_key(name));
        }
        self.reload_keys(&next);
        report.added.sort();
        report.changed.sort();
        report.removed.sort();
        report.unchanged.sort();
        *self.table.write() = Arc::new(next);
        report
    }

    /// Re-reads every key file (rotation without restart). In-flight
    /// requests already passed their check and are unaffected.
    fn reload_keys(&self, table: &RouteTable) {
        let shared = Arc::new(KeyState::load(&self.gateway.api_keys_file, "shared"));
        // KeySet::load has logged a missing, unreadable or empty file.
        let shared_used =
            table.is_empty() || table.values().any(|r| r.config.api_keys_file.is_none());
        let mut all_enforced = !shared_used || shared.enforced().is_some();
        *self.shared_keys.write() = shared;
        for route in table.values() {
            let own = route
                .config
                .api_keys_file
                .as_ref()
                .map(|path| Arc::new(KeyState::load(path, "route")));
            if let Some(state) = &own {
                all_enforced &= state.enforced().is_some();
            }
            *route.runtime.keys.write() = own;
        }
        crate::metrics::metrics()
            .api_keys_configured
            .set(all_enforced as i64);
    }

    fn build_route(&self, config: RouteConfig) -> Arc<Route> {
        let runtime = {
            let mut runtimes = self.runtimes.lock();
            Arc::clone(
                runtimes
                    .entry(config.name.clone())
                    .or_insert_with(|| Arc::new(RouteRuntime::new(&config))),
            )
        };
        let addresses: Vec<String> = config.peers.iter().map(PeerConfig::address).collect();
        for gone in runtime.retain_peers(&addresses) {
            runtime.sessions.forget_peer(gone);
        }
        runtime.sessions.set_config(table_config(&config));
        runtime.generation.fetch_add(1, Ordering::AcqRel);
        let peers = config
            .peers
            .iter()
            .map(|pc| RoutePeer {
                config: pc.clone(),
                state: runtime.peer_state(&pc.address()),
                addr: resolve(&pc.host, pc.port),
            })
            .collect();
        let (rules, rule_errors) = RuleSet::compile(&config.reject_rules);
        for e in rule_errors {
            log::error!("{}: reject rule dropped: {e}", config.file.display());
        }
        Arc::new(Route {
            config,
            peers,
            runtime,
            rules,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(waiting: u32, running: u32) -> EngineLoad {
        EngineLoad {
            waiting,
            running,
            kv_usage: 0.5,
        }
    }

    #[test]
    fn completions_since_a_scrape_drain_the_queue_first() {
        assert_eq!(discount_completed(load(3, 6), 0), load(3, 6));
        assert_eq!(discount_completed(load(3, 6), 2), load(1, 6));
        assert_eq!(discount_completed(load(3, 6), 5), load(0, 4));
        assert_eq!(discount_completed(load(3, 6), 100), load(0, 0));
        assert_eq!(discount_completed(load(1, 1), u64::MAX), load(0, 0));
    }

    #[test]
    fn a_released_slot_counts_as_a_completion_against_the_sample() {
        let peer = Arc::new(PeerState::new(0, "127.0.0.1:1".into()));
        let first = peer.try_acquire(8).expect("slot");
        let second = peer.try_acquire(8).expect("slot");
        peer.record_engine(load(2, 8), 0, 100);
        peer.record_engine(load(2, 8), 1, 100);
        let sample = peer.engine_sample().expect("sample");
        assert_eq!(sample.sustained_waiting, 2);
        assert_eq!(peer.completed_since(&sample), 0);
        drop(first);
        assert_eq!(peer.completed_since(&sample), 1);
        drop(second);
        assert_eq!(
            discount_completed(sample.load, peer.completed_since(&sample)),
            load(0, 8)
        );
        assert_eq!(peer.in_flight(), 0);
    }

    #[test]
    fn the_slot_limit_holds_and_slots_come_back() {
        let peer = Arc::new(PeerState::new(0, "127.0.0.1:1".into()));
        let a = peer.try_acquire(2).expect("first");
        let _b = peer.try_acquire(2).expect("second");
        assert!(peer.try_acquire(2).is_none(), "limit reached");
        drop(a);
        assert!(peer.try_acquire(2).is_some(), "a released slot is reusable");
    }

    #[test]
    fn a_queue_counts_only_when_two_consecutive_scrapes_show_it() {
        let peer = PeerState::new(0, "127.0.0.1:1".into());
        peer.record_engine(load(3, 6), 0, 100);
        assert_eq!(
            peer.engine_sample().unwrap().sustained_waiting,
            0,
            "one sample is a blip"
        );
        peer.record_engine(load(2, 6), 50, 100);
        assert_eq!(
            peer.engine_sample().unwrap().sustained_waiting,
            2,
            "seen twice: the smaller count"
        );
        peer.record_engine(load(0, 6), 100, 100);
        assert_eq!(
            peer.engine_sample().unwrap().sustained_waiting,
            0,
            "drained"
        );
        peer.record_engine(load(4, 6), 150, 100);
        peer.record_engine(load(4, 6), 400, 100);
        assert_eq!(
            peer.engine_sample().unwrap().sustained_waiting,
            0,
            "previous scrape too old to count"
        );
    }
}
