//! One route version (validated config + its peers) and the per-route
//! runtime state that outlives reloads.

use super::keys::KeyState;
use super::peer::PeerState;
use super::room::RoomSignal;
use super::toggles::Toggles;
use crate::config::{PeerConfig, RouteConfig};
use crate::placement::{PeerId, SessionTable, TableConfig};
use crate::protect::route::{PoolLoad, RouteProtection};
use arc_swap::ArcSwapOption;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

/// A configured peer of the current route version with its runtime state.
#[derive(Debug)]
pub struct RoutePeer {
    pub config: PeerConfig,
    pub state: Arc<PeerState>,
    /// Resolved at load time so the request path never blocks on DNS; None
    /// when the host did not resolve (the peer is then never chosen).
    pub addr: Option<SocketAddr>,
    /// This peer's request-path metric handles, resolved once.
    pub metrics: crate::metrics::PeerMetrics,
    /// `X-Routed-Peer` and the upstream `Host`, built at load so a request
    /// clones them instead of formatting; `None` when the name (or host)
    /// is no valid header value, and the request path then builds it as
    /// before (and fails the same way).
    pub routed_peer: Option<http::HeaderValue>,
    pub host_header: Option<http::HeaderValue>,
}

impl RoutePeer {
    pub fn new(config: PeerConfig, state: Arc<PeerState>, addr: Option<SocketAddr>) -> Self {
        RoutePeer {
            routed_peer: http::HeaderValue::from_str(&config.name).ok(),
            host_header: http::HeaderValue::from_str(&host_header(&config)).ok(),
            config,
            state,
            addr,
            metrics: Default::default(),
        }
    }
}

impl RoutePeer {
    /// Can take a request: it has an address (its host name resolved) and
    /// is not banned.
    pub fn is_usable(&self, now_ms: u64) -> bool {
        self.addr.is_some() && self.state.is_ready(now_ms)
    }
}

/// The `Host` the engine receives: its own host and port.
pub fn host_header(config: &PeerConfig) -> String {
    format!("{}:{}", config.host, config.port)
}

/// Per-route state that survives reloads.
pub struct RouteRuntime {
    peers: Mutex<HashMap<String, Arc<PeerState>>>,
    /// Where each session is bound, its context tokens, and the live
    /// sessions per peer. Written by placement (`balance`, and
    /// `balance/shared.rs` / `balance/sync.rs` adopting what other replicas
    /// decided), by `proxy/response/record.rs` at a turn's end (its
    /// tokens), by the route's sweeper (`health/`: the live recount every
    /// second, expiry every 30 s) and by a rebuild that drops a peer
    /// (`forget_peer`).
    pub sessions: SessionTable,
    /// Conversations recognised by content (used when the route has
    /// `session_affinity.content` on), Responses API response ids, and the
    /// engines each shared template was sent to (`balance/prefix.rs`).
    pub content: crate::session::content::ContentIndex,
    /// Wakes the route's admission queue when room may have freed.
    pub queue: Arc<RoomSignal>,
    /// The load gates' measurements, counters, adaptive limits and
    /// runtime overrides, touched only through its verbs: `judge` (the
    /// load gates, `proxy/guards/gates.rs`), the `count…` verbs (the
    /// guards, placement, `proxy/mod.rs` for the turn, `proxy/response/record.rs`
    /// for the streams), `tick` (`Route::adaptive_tick`, driven from
    /// `health/`), `overrides` (`/_ttft_limit`, `/_tps_limit`) and
    /// `reset_counts` (`/_429_status?reset=1`).
    pub protection: RouteProtection,
    /// Prompt and cached prompt tokens the engines reported, for the cache
    /// hit rate in `/_session_status`.
    pub prompt_tokens: std::sync::atomic::AtomicU64,
    pub cached_tokens: std::sync::atomic::AtomicU64,
    /// In-flight per pool sampled every second, for `/_cluster_avg`.
    pub cluster_avg: Mutex<HashMap<String, ClusterAvg>>,
    /// Bumped on every reload that changes this route; background tasks of an
    /// older generation stop by themselves.
    pub generation: AtomicUsize,
    /// What a cold prompt costs on the route's engines, from the turns that
    /// started cold (`proxy/response/record.rs`): how long a warm turn waits
    /// for its full engine before it overflows (`balance::reserve`).
    pub cold_cost: Mutex<crate::placement::ColdCost>,
    /// Turn counter of the round_robin baseline mode.
    pub round_robin: AtomicUsize,
    /// Runtime overrides set through the `/_…_toggle` endpoints; they
    /// outlive reloads until `?reset=1`.
    pub toggles: Toggles,
    /// The route's own key file, re-read on every reload (None: shared keys).
    pub(super) keys: ArcSwapOption<KeyState>,
    /// What the route's discovery task last found: its listed peers' host
    /// names resolved, `peers_from`'s endpoints (`discovery/`).
    pub found: Mutex<crate::discovery::found::Found>,
    /// Wakes the discovery task before its next scheduled look: an engine
    /// refused a connection (it may have moved), a probe could not connect,
    /// or a reload changed the route.
    pub rediscover: tokio::sync::Notify,
}

/// A pool's in-flight over the last 5 minutes, in 30 s buckets.
pub type ClusterAvg = crate::protect::rolling::Rolling<10>;
pub const CLUSTER_AVG_BUCKET_MS: u64 = 30_000;

impl RouteRuntime {
    /// (prompt, cached) tokens reported so far.
    pub fn prompt_tokens(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        (
            self.prompt_tokens.load(Relaxed),
            self.cached_tokens.load(Relaxed),
        )
    }

    pub(super) fn new(config: &RouteConfig, content_key: (u64, u64)) -> Self {
        RouteRuntime {
            peers: Mutex::new(HashMap::new()),
            sessions: SessionTable::new(table_config(config)),
            content: crate::session::content::ContentIndex::new(
                content_key,
                config.balancing.content.unwrap_or_default(),
            ),
            queue: Arc::default(),
            protection: RouteProtection::default(),
            prompt_tokens: Default::default(),
            cached_tokens: Default::default(),
            cluster_avg: Mutex::new(HashMap::new()),
            generation: AtomicUsize::new(0),
            cold_cost: Mutex::default(),
            round_robin: AtomicUsize::new(0),
            toggles: Toggles::default(),
            keys: ArcSwapOption::empty(),
            found: Mutex::default(),
            rediscover: tokio::sync::Notify::new(),
        }
    }

    /// The state for `address`, created on first sight. Its id is the
    /// address's stable hash, so every replica and every restart gives a
    /// peer the same id whatever order it saw the peers in: mode `hash`
    /// ranks peers by it, and two replicas with different reload histories
    /// must send a session to the same engine. A removed peer's bindings go
    /// with it (`forget_peer`), so an address that comes back under the
    /// same id inherits none. Two addresses of one route whose hashes
    /// collide (one in four billion) take the next free id.
    pub(super) fn peer_state(&self, address: &str) -> Arc<PeerState> {
        let mut peers = self.peers.lock();
        if let Some(p) = peers.get(address) {
            return Arc::clone(p);
        }
        let mut id = crate::hash::stable_hash64(address.as_bytes()) as u32;
        while peers.values().any(|p| p.id == id) {
            id = id.wrapping_add(1);
        }
        let p = Arc::new(PeerState::in_route(
            id,
            address.to_string(),
            Arc::clone(&self.queue),
        ));
        peers.insert(address.to_string(), Arc::clone(&p));
        p
    }

    /// Drops state of peers no longer configured and returns their ids.
    pub(super) fn retain_peers(&self, keep: &[String]) -> Vec<PeerId> {
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

/// The peers of a route version: the ones its file lists, each at the
/// address its host resolved to (None until it does: never chosen), then
/// one per endpoint `peers_from` found (an address a listed peer already
/// has is left to it). With each, the key of its runtime state: its
/// address, and for a listed host name the name and the address it
/// resolved to, so an engine behind a new address is a new peer.
pub(super) fn live_peers(
    config: &RouteConfig,
    found: &crate::discovery::found::Found,
) -> Vec<(PeerConfig, String, Option<SocketAddr>)> {
    let mut peers: Vec<(PeerConfig, String, Option<SocketAddr>)> = config
        .peers
        .iter()
        .map(|pc| {
            let addr = found
                .addr_of(&pc.host)
                .map(|ip| SocketAddr::new(ip, pc.port));
            let key = match addr {
                Some(addr) if pc.host.parse::<std::net::IpAddr>().is_err() => {
                    format!("{}@{}", pc.address(), addr.ip())
                }
                _ => pc.address(),
            };
            (pc.clone(), key, addr)
        })
        .collect();
    if let (Some(from), Some(set)) = (&config.peers_from, &found.set) {
        for endpoint in set {
            if peers.iter().any(|(_, _, a)| *a == Some(endpoint.addr)) {
                continue;
            }
            // A pod named like a listed peer goes by its address.
            let name = if peers.iter().any(|(p, _, _)| p.name == endpoint.name) {
                endpoint.addr.to_string()
            } else {
                endpoint.name.clone()
            };
            let pc = from.peer(name, endpoint.addr);
            peers.push((pc, endpoint.addr.to_string(), Some(endpoint.addr)));
        }
    }
    peers
}

/// The key of the content indexes' hashes. Replicas sharing a Redis
/// store must agree on it, so it is derived from what they share: the
/// store's address, its key prefix and its password (a secret they all
/// read), none of which reaches Redis in this form. A local store keeps
/// its index to itself: a key random to the process.
pub(super) fn content_key(store: &crate::config::store::SessionStoreConfig) -> (u64, u64) {
    use sha2::{Digest, Sha256};
    use std::hash::BuildHasher;
    let mut digest = Sha256::new();
    digest.update(b"llm-gateway content index v1\0");
    match store {
        crate::config::store::SessionStoreConfig::Redis(redis) => {
            digest.update(redis.url.as_bytes());
            digest.update(b"\0");
            digest.update(redis.key_prefix.as_bytes());
            if let Some(password) = redis
                .password_file
                .as_ref()
                .and_then(|p| std::fs::read(p).ok())
            {
                digest.update(b"\0");
                digest.update(password);
            }
        }
        crate::config::store::SessionStoreConfig::Local => {
            let random = std::collections::hash_map::RandomState::new();
            digest.update(random.hash_one(0u64).to_le_bytes());
            digest.update(random.hash_one(1u64).to_le_bytes());
        }
    }
    let out = digest.finalize();
    let word = |i: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&out[i..i + 8]);
        u64::from_le_bytes(w)
    };
    (word(0), word(8))
}

pub(super) fn table_config(config: &RouteConfig) -> TableConfig {
    TableConfig {
        idle_timeout_ms: config.balancing.idle_timeout.as_millis() as u64,
        live_window_ms: config.balancing.live_window.as_millis() as u64,
        ..TableConfig::default()
    }
}

/// One route version: immutable config plus shared runtime state.
pub struct Route {
    pub config: RouteConfig,
    /// `Authorization` value for the engines, from `engine_api_key_file`
    /// (read at each reload); never logged.
    pub engine_auth: Option<http::HeaderValue>,
    pub peers: Vec<RoutePeer>,
    pub runtime: Arc<RouteRuntime>,
    /// This route version's request-path metric handles, resolved once.
    pub metrics: crate::metrics::RouteMetrics,
}

impl Route {
    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// The prefix-stability transforms in force: the route's options as the
    /// runtime toggles leave them.
    pub fn prefix_transforms(&self) -> crate::rewrite::Options {
        let t = &self.runtime.toggles;
        crate::rewrite::Options {
            cch_strip: t.cch_strip.is_on(self.config.cch_strip),
            kimi_normalize: t.kimi_normalize.is_on(self.config.kimi_normalize),
        }
    }

    /// The load-based 429s' master switch in force, and which layer set it:
    /// the runtime toggle, the route option, or the gateway's default.
    pub fn rate_limit(&self, gateway_default: bool) -> (bool, &'static str) {
        match self.runtime.toggles.rate_limit.effective(false) {
            (on, "runtime") => (on, "runtime"),
            _ => match self.config.protection.load_rate_limit {
                Some(on) => (on, "route"),
                None => (gateway_default, "gateway"),
            },
        }
    }

    /// Counts a gate's trip: a real 429 when the switch is on (true), or a
    /// trip let through when it is off (false).
    pub fn trip(&self, gate: crate::protect::gate::Gate, gateway_default: bool) -> bool {
        let shed = self.rate_limit(gateway_default).0;
        self.runtime.protection.count(gate, shed)
    }

    /// The pools of this route by label, with their peers.
    pub fn pools(&self) -> Vec<(&str, Vec<usize>)> {
        if self.config.peers_by_model.is_empty() {
            return vec![("_", (0..self.peers.len()).collect())];
        }
        self.config
            .peers_by_model
            .iter()
            .map(|(m, idx)| (m.as_str(), idx.clone()))
            .collect()
    }

    /// The pool's summed `max_concurrency` and requests in flight.
    pub fn pool_load(&self, pool: &[usize]) -> (f64, f64) {
        let peers = pool.iter().filter_map(|&i| self.peers.get(i));
        peers.fold((0.0, 0.0), |(max, inf), p| {
            (
                max + f64::from(p.config.max_concurrency),
                inf + f64::from(p.state.in_flight()),
            )
        })
    }

    /// The adaptive limit in force for `label`, when the route has one.
    pub fn adaptive_limit(&self, label: &str, pool: &[usize]) -> Option<f64> {
        let (max, _) = self.pool_load(pool);
        let p = &self.config.protection;
        self.runtime.protection.adaptive_limit(p, label, max)
    }

    /// Notes a concurrency refusal for the pool's next tick.
    pub fn adaptive_rejected(&self, label: &str) {
        let p = &self.config.protection;
        self.runtime.protection.count_adaptive_refusal(p, label);
    }

    /// One AIMD step for every pool (the route's sweeper calls it every
    /// `protection.adaptive.interval`), on the pools' loads as they are now.
    pub fn adaptive_tick(&self, now_ms: u64) {
        if self.config.protection.adaptive_on().is_none() {
            return;
        }
        let pools = self.pools();
        let loads: Vec<PoolLoad> = pools
            .iter()
            .map(|(label, pool)| {
                let (max, in_flight) = self.pool_load(pool);
                PoolLoad {
                    label,
                    max,
                    in_flight,
                }
            })
            .collect();
        let p = &self.config.protection;
        self.runtime.protection.tick(p, &loads, now_ms);
    }

    /// Samples each pool's in-flight into its rolling average.
    pub fn sample_cluster_avg(&self, now_ms: u64) {
        let mut avg = self.runtime.cluster_avg.lock();
        for (label, pool) in self.pools() {
            let (_, in_flight) = self.pool_load(&pool);
            avg.entry(label.to_string())
                .or_insert_with(|| ClusterAvg::new(CLUSTER_AVG_BUCKET_MS))
                .add(in_flight, now_ms);
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

#[cfg(test)]
mod tests {
    use super::live_peers;
    use crate::config::{GatewayConfig, Overrides, RouteConfig};
    use crate::discovery::found::{Found, HostAnswer};
    use crate::discovery::kubernetes::Endpoint;
    use std::path::Path;

    fn route(text: &str) -> RouteConfig {
        let gw = GatewayConfig::parse(Path::new("g.yaml"), "", &Overrides::default()).unwrap();
        RouteConfig::parse("chat", Path::new("chat.yaml"), text, &gw).unwrap()
    }

    fn endpoint(name: &str, addr: &str) -> Endpoint {
        Endpoint {
            name: name.into(),
            addr: addr.parse().unwrap(),
        }
    }

    #[test]
    fn a_resolved_name_is_keyed_by_its_address_and_discovered_peers_follow_the_listed() {
        let config = route(
            "peers:\n  - {name: a, host: 10.0.0.1, port: 80}\n  - {name: b, host: b.test, port: 80}\n  - {name: c, host: c.test, port: 80}\npeers_from: {dns: pool.test, port: 80}\n",
        );
        let mut found = Found::default();
        found.hosts.insert(
            "b.test".into(),
            HostAnswer {
                addr: Some("10.0.0.2".parse().unwrap()),
                error: None,
            },
        );
        found.hosts.insert(
            "c.test".into(),
            HostAnswer {
                addr: None,
                error: Some("NXDOMAIN".into()),
            },
        );
        found.set = Some(vec![
            // The address listed peer b resolved to: left to b.
            endpoint("10.0.0.2:80", "10.0.0.2:80"),
            // A pod named like a listed peer goes by its address.
            endpoint("a", "10.0.0.9:80"),
            endpoint("10.0.0.7:80", "10.0.0.7:80"),
        ]);
        let peers: Vec<(String, String, Option<String>)> = live_peers(&config, &found)
            .into_iter()
            .map(|(pc, key, addr)| (pc.name, key, addr.map(|a| a.to_string())))
            .collect();
        let s = |x: &str| x.to_string();
        assert_eq!(
            peers,
            vec![
                (s("a"), s("10.0.0.1:80"), Some(s("10.0.0.1:80"))),
                (s("b"), s("b.test:80@10.0.0.2"), Some(s("10.0.0.2:80"))),
                (s("c"), s("c.test:80"), None),
                (s("10.0.0.9:80"), s("10.0.0.9:80"), Some(s("10.0.0.9:80"))),
                (s("10.0.0.7:80"), s("10.0.0.7:80"), Some(s("10.0.0.7:80"))),
            ]
        );
        // Control: b at another address is another peer state.
        found.hosts.get_mut("b.test").unwrap().addr = Some("10.0.0.3".parse().unwrap());
        let (_, key, _) = &live_peers(&config, &found)[1];
        assert_eq!(key, "b.test:80@10.0.0.3");
    }
}
