//! A route's settings section by section, as validated: its balancing
//! mode, peers and `peers_from`, health probes, engine metrics and
//! timeouts, and their bounds.

use crate::engine_tls::EngineTls;
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The session table: stick to where the cache is, move only under real pressure.
    LoadAware,
    /// Rendezvous hashing of the session id over the ready peers.
    Hash,
    /// Ignore sessions; lowest in-flight / max_concurrency.
    LeastConn,
    /// Ignore sessions; rotate over the ready peers. A baseline for benchmarks.
    RoundRobin,
}

impl Mode {
    pub fn parse(text: &str) -> Option<Mode> {
        match text.trim().to_ascii_lowercase().replace('-', "_").as_str() {
            "load_aware" | "loadaware" => Some(Mode::LoadAware),
            "hash" => Some(Mode::Hash),
            "least_conn" | "leastconn" => Some(Mode::LeastConn),
            "round_robin" | "roundrobin" => Some(Mode::RoundRobin),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Mode::LoadAware => "load_aware",
            Mode::Hash => "hash",
            Mode::LeastConn => "least_conn",
            Mode::RoundRobin => "round_robin",
        }
    }
}

/// One engine endpoint of a route.
#[derive(Debug, Clone, PartialEq)]
pub struct PeerConfig {
    pub name: String,
    pub host: String,
    pub port: u16,
    /// Lower value = preferred tier (0 is the primary tier), as in Envoy.
    pub priority: i32,
    pub max_concurrency: u32,
    /// Where `max_concurrency` comes from: the route file, the default, or
    /// (set when the route is built) the engine's own slots.
    pub max_concurrency_from: ConcurrencyFrom,
    pub probe_path: Option<String>,
    /// The engine's KV capacity in tokens, for KV-aware admission; when
    /// unset, read from the engine's metrics (`vllm:cache_config_info`,
    /// `sglang:max_total_num_tokens`) where it reports it.
    pub kv_capacity_tokens: Option<u64>,
    /// The engine is reached over TLS: requests, probes and scrapes alike
    /// (`engine_tls.rs`). None: plain HTTP.
    pub tls: Option<Arc<EngineTls>>,
}

/// Where a peer's `max_concurrency` comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConcurrencyFrom {
    /// `max_concurrency` in the route file (a peer's, or `peers_from`'s).
    Route,
    /// Not set: [`DEFAULT_MAX_CONCURRENCY`].
    Default,
    /// Not set, and the engine says how many requests it runs at once
    /// (llama.cpp's `/props` `total_slots`): it queues the rest itself, so
    /// a lower limit here would only add a queue in front of its own.
    EngineSlots,
}

impl ConcurrencyFrom {
    pub fn as_str(self) -> &'static str {
        match self {
            ConcurrencyFrom::Route => "route",
            ConcurrencyFrom::Default => "default",
            ConcurrencyFrom::EngineSlots => "engine_slots",
        }
    }
}

/// A peer's `max_concurrency` when neither the route nor the engine says.
pub const DEFAULT_MAX_CONCURRENCY: u32 = 64;

impl PeerConfig {
    /// The peer with the engine's slot count as its limit, when the route
    /// sets none.
    pub fn with_engine_slots(mut self, slots: Option<u32>) -> Self {
        if let (ConcurrencyFrom::Default, Some(slots)) = (self.max_concurrency_from, slots) {
            self.max_concurrency = slots;
            self.max_concurrency_from = ConcurrencyFrom::EngineSlots;
        }
        self
    }

    /// The identity runtime state is keyed by across reloads.
    pub fn address(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }
}

/// `peers_from:`: a set of engines found at run time (`discovery/`), each
/// a peer with these settings, named after its pod or its address.
#[derive(Debug, Clone, PartialEq)]
pub struct PeersFrom {
    pub source: PeerSource,
    pub priority: i32,
    pub max_concurrency: u32,
    pub max_concurrency_from: ConcurrencyFrom,
    pub probe_path: Option<String>,
    pub kv_capacity_tokens: Option<u64>,
    /// Each peer's TLS (its `sni`, unless set, the DNS name; an
    /// EndpointSlice endpoint's is its address).
    pub tls: Option<Arc<EngineTls>>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum PeerSource {
    /// Every address of a name (a headless Service), at one port.
    Dns { name: String, port: u16 },
    /// The ready endpoints of the EndpointSlices a label selector matches.
    Kubernetes(crate::discovery::kubernetes::KubernetesSource),
}

impl PeersFrom {
    /// The peer for one discovered endpoint.
    pub fn peer(&self, name: String, addr: std::net::SocketAddr) -> PeerConfig {
        PeerConfig {
            name,
            host: addr.ip().to_string(),
            port: addr.port(),
            priority: self.priority,
            max_concurrency: self.max_concurrency,
            max_concurrency_from: self.max_concurrency_from,
            probe_path: self.probe_path.clone(),
            kv_capacity_tokens: self.kv_capacity_tokens,
            tls: self.tls.clone(),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Balancing {
    pub mode: Mode,
    /// Route-specific session headers, tried before the built-in ones.
    pub session_headers: Vec<http::HeaderName>,
    pub idle_timeout: Duration,
    /// A session used within this long counts as holding KV on its engine.
    pub live_window: Duration,
    pub cross_tier_fallback: bool,
    /// Conversations recognised by content for requests that name no
    /// session (`None`: off). Its `idle_ms` is `idle_timeout`'s.
    pub content: Option<crate::session::content::ContentConfig>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct HealthConfig {
    pub enabled: bool,
    pub interval: Duration,
    pub ban_ttl: Duration,
    pub probe_path: String,
    pub timeout: Duration,
}

#[derive(Debug, Clone, PartialEq)]
pub struct EngineMetricsConfig {
    pub interval: Duration,
    pub kv_full_threshold: f64,
    pub path: String,
}

impl EngineMetricsConfig {
    /// A sample is fresh, and two samples are consecutive, within two
    /// scrape intervals: one slow or lost scrape does not blind placement.
    pub fn max_age_ms(&self) -> u64 {
        2 * self.interval.as_millis() as u64
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Timeouts {
    pub connect: Duration,
    /// Also bounds the wait for the response header, so a non-stream
    /// generation needs a generous value, and each write of a long prompt
    /// to an engine that stopped reading it.
    pub read: Duration,
    pub idle: Duration,
}

pub const DEFAULT_LIVE_WINDOW: Duration = Duration::from_secs(10);
pub const MIN_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
pub const MAX_IDLE_TIMEOUT: Duration = Duration::from_secs(24 * 3600);
