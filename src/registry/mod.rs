//! The live route table and the runtime state that outlives a reload.
//!
//! A request takes one `Arc<RouteTable>` snapshot and keeps it to the end, so
//! a reload never changes a request mid-flight. Runtime state (in-flight
//! counts, bans, engine load, the session table, toggles) lives in
//! `RouteRuntime`, keyed by route name and, per peer, by `host:port`: a
//! reload hands the same state to every peer that is still configured and
//! drops it for the rest.
//!
//! Who writes what: `reload` (at start, then only the controller's
//! `Controller::reload`, on SIGHUP or a file-watch burst) swaps the table
//! and re-reads key files; `rediscovered` (a route's discovery task, when
//! an address changed) swaps in one route rebuilt on the same config; the
//! request path takes in-flight slots and bans peers it cannot reach; the
//! health tasks ban, unban and record engine samples; the toggle endpoints
//! flip `Toggles`.

mod keys;
mod peer;
mod room;
mod route;
mod toggles;

pub use keys::KeyState;
pub use peer::{EngineSample, InFlightGuard, PeerState, ProbeVerdict};
pub use room::{QueuePlace, RoomSignal};
pub use route::{host_header, Route, RoutePeer, RouteRuntime};
pub use toggles::{Toggle, Toggles, TOGGLE_NAMES};

use crate::auth::KeyFileStatus;
use crate::config::{ConfigError, GatewayConfig, RouteConfig};
use arc_swap::ArcSwap;
use parking_lot::Mutex;
use route::{live_peers, table_config};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

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
    /// The notices (deprecated keys, route warnings) of the files added or
    /// changed; an unchanged file's were reported when it last changed.
    pub warnings: Vec<String>,
    /// The tenants file failed; the version in force is kept.
    pub tenants_error: Option<ConfigError>,
}

impl ReloadReport {
    pub fn ok(&self) -> bool {
        self.errors.is_empty() && self.tenants_error.is_none()
    }
}

/// Owns the current route table and the runtime registry behind it.
pub struct Registry {
    table: ArcSwap<RouteTable>,
    runtimes: Mutex<HashMap<String, Arc<RouteRuntime>>>,
    gateway: GatewayConfig,
    /// Serialises reloads (SIGHUP can arrive while one is running).
    reload_lock: Mutex<()>,
    shared_keys: ArcSwap<KeyState>,
    /// Each key file's state as last logged, by path: a reload logs a file
    /// only when what it read differs (`reload_keys`).
    logged_keys: Mutex<HashMap<std::path::PathBuf, Arc<KeyState>>>,
    /// Where session bindings are shared with other replicas; set once at
    /// start (local until then, and in tests that never set it).
    store: std::sync::OnceLock<Arc<crate::store::SessionStore>>,
    /// The key of every route's content index (`route::content_key`).
    content_key: (u64, u64),
    /// The tenants file in force and every tenant's budgets (gateway-wide).
    tenants: crate::tenants::Tenants,
}

impl Registry {
    pub fn new(gateway: GatewayConfig) -> Self {
        Registry {
            table: ArcSwap::from_pointee(HashMap::new()),
            runtimes: Mutex::new(HashMap::new()),
            // Read (and logged) by the first reload, like every later one.
            shared_keys: ArcSwap::from_pointee(KeyState {
                path: gateway.api_keys_file.clone(),
                status: KeyFileStatus::Missing,
                keys: None,
                scope: "shared",
                problem: None,
                warnings: Vec::new(),
            }),
            logged_keys: Mutex::new(HashMap::new()),
            content_key: route::content_key(&gateway.session_store),
            gateway,
            reload_lock: Mutex::new(()),
            store: std::sync::OnceLock::new(),
            tenants: Default::default(),
        }
    }

    pub fn tenants(&self) -> &crate::tenants::Tenants {
        &self.tenants
    }

    /// The session store in force (`local` unless one was set at start).
    /// Borrowed, not cloned: every request reads it.
    pub fn store(&self) -> &Arc<crate::store::SessionStore> {
        self.store
            .get_or_init(|| Arc::new(crate::store::SessionStore::local()))
    }

    /// Sets the session store; only the first call counts.
    pub fn set_store(&self, store: Arc<crate::store::SessionStore>) {
        let _ = self.store.set(store);
    }

    pub fn shared_keys(&self) -> Arc<KeyState> {
        self.shared_keys.load_full()
    }

    /// The key file in force for `route`: its own, else the shared one.
    pub fn keys_for(&self, route: &Route) -> Arc<KeyState> {
        match route.runtime.keys.load_full() {
            Some(own) if route.config.has_own_keys() => own,
            _ => self.shared_keys(),
        }
    }

    pub fn gateway(&self) -> &GatewayConfig {
        &self.gateway
    }

    /// The current table; cheap (one Arc clone, no lock).
    pub fn snapshot(&self) -> Arc<RouteTable> {
        self.table.load_full()
    }

    /// Every API key file the current table reads, the shared one first,
    /// and the tenants file: besides `routes_dir`, what a reload re-reads
    /// and so what the file watch follows.
    pub fn key_files(&self) -> Vec<std::path::PathBuf> {
        let mut files = vec![self.gateway.api_keys_file.clone()];
        files.extend(self.gateway.tenants_file.clone());
        for route in self.table.load().values() {
            if let Some(own) = &route.config.api_keys_file {
                if !files.contains(own) {
                    files.push(own.clone());
                }
            }
        }
        files
    }

    pub fn route(&self, name: &str) -> Option<Arc<Route>> {
        self.table.load().get(name).cloned()
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
                    if let Some(prev) = old.get(&name).filter(|prev| prev.config == config) {
                        // Its notices were reported when it last changed
                        // (they are part of the config): a reload of an
                        // untouched file repeats none, as with key files.
                        report.unchanged.push(name.clone());
                        next.insert(name, Arc::clone(prev));
                        continue;
                    }
                    report.warnings.extend(
                        config
                            .notices()
                            .map(|w| format!("{}: {w}", config.file.display())),
                    );
                    if old.contains_key(&name) {
                        report.changed.push(name.clone());
                    } else {
                        report.added.push(name.clone());
                    }
                    next.insert(name, self.build_route(config));
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
        match self.tenants.reload(self.gateway.tenants_file.as_deref()) {
            Ok(true) => {
                let config = self.tenants.config();
                if let Some(file) = &config.file {
                    log::info!(
                        "tenants file {}: {} tenant(s) named, limits {}",
                        file.display(),
                        config.tenants.len(),
                        if config.is_unlimited() {
                            "none"
                        } else {
                            "in force"
                        }
                    );
                }
            }
            Ok(false) => {}
            Err(e) => report.tenants_error = Some(e),
        }
        report.added.sort();
        report.changed.sort();
        report.removed.sort();
        report.unchanged.sort();
        self.table.store(Arc::new(next));
        // A changed route may name other hosts: its discovery task looks
        // now, once the table it reads holds the new version. (An added
        // route has a new runtime, whose new task looks at once anyway; a
        // poke there would only spend the task's first forced lookup, and
        // delay the one a refused connection asks for.)
        let table = self.table.load();
        for name in &report.changed {
            if let Some(route) = table.get(name) {
                route.runtime.rediscover.notify_one();
            }
        }
        report
    }

    /// Builds route `name` again from its config in force after its
    /// discovery task found a change of address (a reload in between is
    /// kept: its config, the new findings); false when the route is gone.
    /// Under the reload lock, held for the build only (no file is read).
    pub fn rediscovered(&self, name: &str) -> bool {
        let _serial = self.reload_lock.lock();
        let old = self.snapshot();
        let Some(route) = old.get(name) else {
            return false;
        };
        let rebuilt = self.build_route(route.config.clone());
        let mut next = (*old).clone();
        next.insert(name.to_string(), rebuilt);
        self.table.store(Arc::new(next));
        true
    }

    /// Re-reads every key file (rotation without restart). In-flight
    /// requests already passed their check and are unaffected.
    fn reload_keys(&self, table: &RouteTable) {
        let shared = Arc::new(KeyState::load(&self.gateway.api_keys_file, "shared"));
        let mut read = vec![Arc::clone(&shared)];
        let shared_used = table.is_empty() || table.values().any(|r| !r.config.has_own_keys());
        let mut all_enforced = !shared_used || shared.enforced().is_some();
        self.shared_keys.store(shared);
        for route in table.values() {
            let config = &route.config;
            let own = match (&config.api_keys_file, &config.api_keys) {
                (Some(path), _) => Some(Arc::new(KeyState::load(path, "route"))),
                (None, Some(keys)) => Some(Arc::new(KeyState::inline(&config.file, keys.clone()))),
                (None, None) => None,
            };
            if let Some(state) = &own {
                all_enforced &= state.enforced().is_some();
                read.push(Arc::clone(state));
            }
            route.runtime.keys.store(own);
        }
        self.log_key_changes(read);
        crate::metrics::metrics()
            .api_keys_configured
            .set(all_enforced as i64);
    }

    /// Logs each key file whose state differs from what was last logged
    /// for its path (every file at the first reload), once per path however
    /// many routes share it. A file no longer read is forgotten, so it is
    /// logged again if it comes back.
    fn log_key_changes(&self, read: Vec<Arc<KeyState>>) {
        let expected = self.gateway.key_file_expected;
        let mut logged = self.logged_keys.lock();
        let mut seen: HashMap<std::path::PathBuf, Arc<KeyState>> = HashMap::new();
        for state in read {
            if seen.contains_key(&state.path) {
                continue;
            }
            let unchanged = logged
                .get(&state.path)
                .is_some_and(|last| last.same_as(&state));
            if !unchanged {
                for (level, line) in state.report(expected) {
                    log::log!(level, "{line}");
                }
            }
            seen.insert(state.path.clone(), state);
        }
        *logged = seen;
    }

    fn build_route(&self, config: RouteConfig) -> Arc<Route> {
        let runtime = {
            let mut runtimes = self.runtimes.lock();
            Arc::clone(
                runtimes
                    .entry(config.name.clone())
                    .or_insert_with(|| Arc::new(RouteRuntime::new(&config, self.content_key))),
            )
        };
        let live = live_peers(&config, &runtime.found.lock());
        let keys: Vec<String> = live.iter().map(|(_, key, _)| key.clone()).collect();
        for gone in runtime.retain_peers(&keys) {
            runtime.sessions.forget_peer(gone);
        }
        runtime.sessions.set_config(table_config(&config));
        if let Some(content) = config.balancing.content {
            runtime.content.set_config(content);
        }
        runtime.generation.fetch_add(1, Ordering::AcqRel);
        let peers = live
            .into_iter()
            .map(|(pc, key, addr)| {
                let state = runtime.peer_state(&key);
                let pc = pc.with_engine_slots(state.engine_slots());
                RoutePeer::new(pc, state, addr)
            })
            .collect();
        for e in &config.reject_rule_errors {
            log::error!("{}: reject rule dropped: {e}", config.file.display());
        }
        let engine_auth = config
            .engine_api_key_file
            .as_deref()
            .and_then(read_engine_key);
        Arc::new(Route {
            engine_auth,
            config,
            peers,
            runtime,
            metrics: Default::default(),
        })
    }
}

/// The engines' key: the first non-blank line of the file. An unreadable or
/// empty file is logged and sends no key (the engine then refuses, loudly).
fn read_engine_key(path: &std::path::Path) -> Option<http::HeaderValue> {
    let text = std::fs::read_to_string(path)
        .inspect_err(|e| log::error!("engine_api_key_file {}: {e}", path.display()))
        .ok()?;
    let key = text.lines().map(str::trim).find(|l| !l.is_empty());
    let value = key.and_then(|k| http::HeaderValue::from_str(&format!("Bearer {k}")).ok());
    if value.is_none() {
        log::error!(
            "engine_api_key_file {}: no usable key on its first line",
            path.display()
        );
    }
    value.map(|mut v| {
        v.set_sensitive(true);
        v
    })
}
