//! Configuration: `gateway.yaml` and `routes/<name>.yaml` → validated values.
//!
//! The file formats (`*File` structs, `deny_unknown_fields`) are kept apart from
//! the validated values the rest of the gateway uses (`GatewayConfig`,
//! `RouteConfig`), so defaults and cross-field checks live in one place and
//! nothing downstream has to handle a half-valid config.

pub mod units;

use crate::postprocess::Handler;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;
use units::{Dur, Flag, Size};

pub const DEFAULT_MAX_BODY_SIZE: u64 = 10 << 20;
pub const DEFAULT_GRACE_PERIOD: Duration = Duration::from_secs(30);
pub const DEFAULT_API_KEYS_FILE: &str = "/etc/llm-gateway/api-keys";
pub const API_KEYS_ENV: &str = "LLM_GATEWAY_API_KEYS_FILE";

/// A config error with the file and, where it can be told, the line.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigError {
    pub file: PathBuf,
    pub line: Option<usize>,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "{}:{}: {}", self.file.display(), line, self.message),
            None => write!(f, "{}: {}", self.file.display(), self.message),
        }
    }
}

impl std::error::Error for ConfigError {}

impl ConfigError {
    fn new(file: &Path, line: Option<usize>, message: impl Into<String>) -> Self {
        ConfigError {
            file: file.to_path_buf(),
            line,
            message: message.into(),
        }
    }

    /// serde_yaml reports "... at line L column C"; keep its line, drop the
    /// duplicate location from the message.
    fn from_yaml(file: &Path, err: serde_yaml::Error) -> Self {
        let line = err.location().map(|l| l.line());
        let mut message = err.to_string();
        if let Some(idx) = message.find(" at line ") {
            message.truncate(idx);
        }
        ConfigError::new(file, line, message)
    }
}

// ---------------------------------------------------------------- gateway.yaml

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct GatewayFile {
    listen: Option<String>,
    admin_listen: Option<String>,
    routes_dir: Option<PathBuf>,
    api_keys_file: Option<PathBuf>,
    threads: Option<usize>,
    grace_period: Option<Dur>,
    max_body_size: Option<Size>,
    postprocess_default: Option<String>,
}

/// The validated gateway-wide settings.
#[derive(Debug, Clone)]
pub struct GatewayConfig {
    pub listen: SocketAddr,
    pub admin_listen: SocketAddr,
    pub routes_dir: PathBuf,
    pub api_keys_file: PathBuf,
    pub threads: usize,
    pub grace_period: Duration,
    pub max_body_size: u64,
    /// Post-processing handler for routes that name none.
    pub postprocess_default: Option<Handler>,
}

/// Command-line values that take precedence over the file.
#[derive(Debug, Default, Clone)]
pub struct Overrides {
    pub listen: Option<String>,
    pub admin_listen: Option<String>,
    pub routes_dir: Option<PathBuf>,
}

impl GatewayConfig {
    /// Reads `path` (a missing file is an error: the caller asked for it) and
    /// applies `overrides` and the environment.
    pub fn load(path: &Path, overrides: &Overrides) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError::new(path, None, format!("cannot read: {e}")))?;
        Self::parse(path, &text, overrides)
    }

    pub fn parse(path: &Path, text: &str, overrides: &Overrides) -> Result<Self, ConfigError> {
        let file: GatewayFile = if text.trim().is_empty() {
            GatewayFile::default()
        } else {
            serde_yaml::from_str(text).map_err(|e| ConfigError::from_yaml(path, e))?
        };
        let addr = |key: &str, given: Option<&String>, default: &str| {
            let raw = given.map(String::as_str).unwrap_or(default);
            raw.parse::<SocketAddr>().map_err(|_| {
                ConfigError::new(
                    path,
                    find_key_line(text, key),
                    format!("{key}: {raw:?} is not an address like 0.0.0.0:8080"),
                )
            })
        };
        let listen = addr(
            "listen",
            overrides.listen.as_ref().or(file.listen.as_ref()),
            "0.0.0.0:8080",
        )?;
        let admin_listen = addr(
            "admin_listen",
            overrides
                .admin_listen
                .as_ref()
                .or(file.admin_listen.as_ref()),
            "0.0.0.0:8090",
        )?;
        let threads = file.threads.unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
        });
        if threads == 0 || threads > 1024 {
            return Err(ConfigError::new(
                path,
                find_key_line(text, "threads"),
                "threads must be between 1 and 1024",
            ));
        }
        let api_keys_file = std::env::var_os(API_KEYS_ENV)
            .map(PathBuf::from)
            .or(file.api_keys_file)
            .unwrap_or_else(|| PathBuf::from(DEFAULT_API_KEYS_FILE));
        let postprocess_default = match file.postprocess_default.as_deref() {
            None | Some("") | Some("none") => None,
            Some(name) => Some(Handler::from_name(name).ok_or_else(|| {
                ConfigError::new(
                    path,
                    find_key_line(text, "postprocess_default"),
                    format!("postprocess_default: unknown handler {name:?} (strip_actual_usage, vllm_format, none)"),
                )
            })?),
        };
        Ok(GatewayConfig {
            postprocess_default,
            listen,
            admin_listen,
            routes_dir: overrides
                .routes_dir
                .clone()
                .or(file.routes_dir)
                .unwrap_or_else(|| PathBuf::from("routes")),
            api_keys_file,
            threads,
            grace_period: file
                .grace_period
                .map(|d| d.0)
                .unwrap_or(DEFAULT_GRACE_PERIOD),
            max_body_size: file
                .max_body_size
                .map(|s| s.0)
                .unwrap_or(DEFAULT_MAX_BODY_SIZE),
        })
    }
}

// ---------------------------------------------------------------- routes/<name>.yaml

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RouteFile {
    peers: Option<Vec<PeerFile>>,
    peers_by_model: Option<BTreeMap<String, Vec<String>>>,
    max_body_size: Option<Size>,
    balancing: Option<BalancingFile>,
    health: Option<HealthFile>,
    engine_metrics: Option<EngineMetricsFile>,
    timeouts: Option<TimeoutsFile>,
    routed_headers: Option<Flag>,
    api_keys_file: Option<PathBuf>,
    reject_rules: Option<serde_yaml::Value>,
    reject_rules_enabled: Option<Flag>,
    postprocess: Option<String>,
    include_usage: Option<Flag>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PeerFile {
    name: String,
    host: String,
    port: i64,
    priority: Option<i32>,
    max_concurrency: Option<i64>,
    probe_path: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct BalancingFile {
    mode: Option<String>,
    session_affinity: Option<SessionAffinityFile>,
    cross_tier_fallback: Option<Flag>,
    /// Deprecated by the session table: accepted so old files still load.
    max_load_percent: Option<serde_yaml::Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct SessionAffinityFile {
    headers: Option<Vec<String>>,
    idle_timeout: Option<Dur>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct HealthFile {
    interval: Option<Dur>,
    ban_ttl: Option<Dur>,
    probe_path: Option<String>,
    timeout: Option<Dur>,
    enabled: Option<Flag>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum EngineMetricsFile {
    Switch(Flag),
    Settings(EngineMetricsSettingsFile),
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct EngineMetricsSettingsFile {
    interval: Option<Dur>,
    kv_full_threshold: Option<f64>,
    path: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct TimeoutsFile {
    connect: Option<Dur>,
    read: Option<Dur>,
    idle: Option<Dur>,
}

/// How a route places requests that carry a session id.
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
    pub probe_path: Option<String>,
}

impl PeerConfig {
    /// The identity runtime state is keyed by across reloads.
    pub fn address(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Balancing {
    pub mode: Mode,
    /// Route-specific session headers, tried before the built-in ones.
    pub session_headers: Vec<http::HeaderName>,
    pub idle_timeout: Duration,
    pub cross_tier_fallback: bool,
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
    /// generation needs a generous value.
    pub read: Duration,
    pub idle: Duration,
}

/// A validated route.
#[derive(Debug, Clone, PartialEq)]
pub struct RouteConfig {
    pub name: String,
    pub file: PathBuf,
    pub peers: Vec<PeerConfig>,
    /// model name → indices into `peers`. Empty: one pool, any model.
    pub peers_by_model: Vec<(String, Vec<usize>)>,
    pub max_body_size: u64,
    pub balancing: Balancing,
    pub health: HealthConfig,
    pub engine_metrics: Option<EngineMetricsConfig>,
    pub timeouts: Timeouts,
    pub routed_headers: bool,
    /// The route's own key file instead of the gateway's shared one.
    pub api_keys_file: Option<PathBuf>,
    /// Content reject rules as written (compiled when the route is built;
    /// an invalid rule is dropped there, not here).
    pub reject_rules: serde_json::Value,
    pub reject_rules_enabled: bool,
    /// None: responses pass unchanged.
    pub postprocess: Option<Handler>,
    /// Add `stream_options.include_usage` to streaming requests that lack it.
    pub include_usage: bool,
    /// Deprecation notices to log at load; the route still serves.
    pub warnings: Vec<String>,
}

pub const MIN_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
pub const MAX_IDLE_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// A route name is the first path segment, so it must be URL-safe and must
/// not collide with the `/_…` endpoints.
pub fn valid_route_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with('_')
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
}

/// The route name a file in `routes/` serves, or None if the file is not a route file.
pub fn route_name_of(path: &Path) -> Option<String> {
    let ext = path.extension()?.to_str()?;
    if ext != "yaml" && ext != "yml" {
        return None;
    }
    let stem = path.file_stem()?.to_str()?;
    Some(stem.to_string())
}

impl RouteConfig {
    pub fn load(path: &Path, gateway: &GatewayConfig) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError::new(path, None, format!("cannot read: {e}")))?;
        let name = route_name_of(path)
            .ok_or_else(|| ConfigError::new(path, None, "route files must end in .yaml"))?;
        Self::parse(&name, path, &text, gateway)
    }

    pub fn parse(
        name: &str,
        path: &Path,
        text: &str,
        gateway: &GatewayConfig,
    ) -> Result<Self, ConfigError> {
        let err = |line: Option<usize>, msg: String| ConfigError::new(path, line, msg);
        if !valid_route_name(name) {
            return Err(err(
                None,
                format!("route name {name:?} (from the file name) must be letters, digits, '-', '_' or '.', not starting with '_' or '.'"),
            ));
        }
        let file: RouteFile =
            serde_yaml::from_str(text).map_err(|e| ConfigError::from_yaml(path, e))?;
        let mut warnings = Vec::new();

        let raw_peers = match file.peers {
            Some(p) if !p.is_empty() => p,
            _ => {
                return Err(err(
                    find_key_line(text, "peers"),
                    "peers: a route needs at least one peer".into(),
                ))
            }
        };
        let mut peers: Vec<PeerConfig> = Vec::with_capacity(raw_peers.len());
        for (i, p) in raw_peers.into_iter().enumerate() {
            let line = peer_item_line(text, i);
            if p.name.trim().is_empty() {
                return Err(err(line, format!("peers[{i}]: name must not be empty")));
            }
            if p.host.trim().is_empty() {
                return Err(err(
                    line,
                    format!("peers[{i}] {}: host must not be empty", p.name),
                ));
            }
            let port = u16::try_from(p.port)
                .ok()
                .filter(|&port| port != 0)
                .ok_or_else(|| {
                    err(
                        line,
                        format!(
                            "peers[{i}] {}: port {} out of range 1..65535",
                            p.name, p.port
                        ),
                    )
                })?;
            let max_concurrency = match p.max_concurrency {
                None => 64,
                Some(n) if (1..=1_000_000).contains(&n) => n as u32,
                Some(n) => {
                    return Err(err(
                        line,
                        format!(
                            "peers[{i}] {}: max_concurrency {n} out of range 1..1000000",
                            p.name
                        ),
                    ))
                }
            };
            if let Some(path) = &p.probe_path {
                if !path.starts_with('/') {
                    return Err(err(
                        line,
                        format!("peers[{i}] {}: probe_path must start with '/'", p.name),
                    ));
                }
            }
            let peer = PeerConfig {
                name: p.name,
                host: p.host,
                port,
                priority: p.priority.unwrap_or(0),
                max_concurrency,
                probe_path: p.probe_path,
            };
            if let Some(prev) = peers.iter().find(|q| q.name == peer.name) {
                return Err(err(
                    line,
                    format!(
                        "peers[{i}]: duplicate peer name {:?} (also {})",
                        peer.name,
                        prev.address()
                    ),
                ));
            }
            if peers.iter().any(|q| q.address() == peer.address()) {
                return Err(err(
                    line,
                    format!(
                        "peers[{i}] {}: duplicate peer address {}",
                        peer.name,
                        peer.address()
                    ),
                ));
            }
            peers.push(peer);
        }

        let mut peers_by_model = Vec::new();
        for (model, names) in file.peers_by_model.unwrap_or_default() {
            let line = find_key_line(text, &model);
            if names.is_empty() {
                return Err(err(line, format!("peers_by_model.{model}: lists no peers")));
            }
            let mut idx = Vec::with_capacity(names.len());
            for n in names {
                match peers.iter().position(|p| p.name == n) {
                    Some(i) if !idx.contains(&i) => idx.push(i),
                    Some(_) => {
                        return Err(err(
                            line,
                            format!("peers_by_model.{model}: peer {n:?} listed twice"),
                        ))
                    }
                    None => {
                        return Err(err(
                            line,
                            format!("peers_by_model.{model}: unknown peer {n:?}"),
                        ))
                    }
                }
            }
            peers_by_model.push((model, idx));
        }

        let bal = file.balancing.unwrap_or_default();
        let mode = match bal.mode.as_deref() {
            None => Mode::LoadAware,
            Some(m) => Mode::parse(m).ok_or_else(|| {
                err(
                    find_key_line(text, "mode"),
                    format!("balancing.mode: {m:?} is not one of load_aware, hash, least_conn, round_robin"),
                )
            })?,
        };
        let affinity = bal.session_affinity;
        if affinity.is_some() && !matches!(mode, Mode::LoadAware | Mode::Hash) {
            return Err(err(
                find_key_line(text, "session_affinity"),
                format!(
                    "balancing.session_affinity requires mode load_aware or hash (mode is {})",
                    mode.as_str()
                ),
            ));
        }
        if bal.max_load_percent.is_some() {
            warnings.push(
                "balancing.max_load_percent is deprecated and ignored: load_aware placement uses the session table".into(),
            );
        }
        let affinity = affinity.unwrap_or_default();
        let mut session_headers = Vec::new();
        for h in affinity.headers.unwrap_or_default() {
            let parsed = http::HeaderName::from_bytes(h.trim().as_bytes()).map_err(|_| {
                err(
                    find_key_line(text, "headers"),
                    format!("balancing.session_affinity.headers: {h:?} is not a header name"),
                )
            })?;
            session_headers.push(parsed);
        }
        let idle_timeout = affinity
            .idle_timeout
            .map(|d| d.0)
            .unwrap_or(Duration::from_secs(30 * 60));
        if !(MIN_IDLE_TIMEOUT..=MAX_IDLE_TIMEOUT).contains(&idle_timeout) {
            return Err(err(
                find_key_line(text, "idle_timeout"),
                "balancing.session_affinity.idle_timeout must be between 1m and 24h".into(),
            ));
        }

        let h = file.health.unwrap_or_default();
        let health = HealthConfig {
            enabled: h.enabled.map(|f| f.0).unwrap_or(true),
            interval: h.interval.map(|d| d.0).unwrap_or(Duration::from_secs(5)),
            ban_ttl: h.ban_ttl.map(|d| d.0).unwrap_or(Duration::from_secs(30)),
            probe_path: h.probe_path.unwrap_or_else(|| "/health".into()),
            timeout: h.timeout.map(|d| d.0).unwrap_or(Duration::from_secs(2)),
        };
        if health.interval < Duration::from_millis(50) {
            return Err(err(
                find_key_line(text, "interval"),
                "health.interval must be at least 50ms".into(),
            ));
        }
        if !health.probe_path.starts_with('/') {
            return Err(err(
                find_key_line(text, "probe_path"),
                "health.probe_path must start with '/'".into(),
            ));
        }

        let engine_metrics = match file.engine_metrics {
            Some(EngineMetricsFile::Switch(Flag(false))) => None,
            Some(EngineMetricsFile::Switch(Flag(true))) | None => {
                Some(EngineMetricsSettingsFile::default())
            }
            Some(EngineMetricsFile::Settings(s)) => Some(s),
        }
        .map(|s| EngineMetricsConfig {
            interval: s.interval.map(|d| d.0).unwrap_or(Duration::from_secs(1)),
            kv_full_threshold: s.kv_full_threshold.unwrap_or(0.98),
            path: s.path.unwrap_or_else(|| "/metrics".into()),
        });
        if let Some(m) = &engine_metrics {
            if !(0.0..=1.0).contains(&m.kv_full_threshold) || m.kv_full_threshold.is_nan() {
                return Err(err(
                    find_key_line(text, "kv_full_threshold"),
                    "engine_metrics.kv_full_threshold must be between 0 and 1".into(),
                ));
            }
            if m.interval < Duration::from_millis(50) {
                return Err(err(
                    find_key_line(text, "interval"),
                    "engine_metrics.interval must be at least 50ms".into(),
                ));
            }
        }

        let t = file.timeouts.unwrap_or_default();
        let timeouts = Timeouts {
            connect: t.connect.map(|d| d.0).unwrap_or(Duration::from_secs(5)),
            read: t.read.map(|d| d.0).unwrap_or(Duration::from_secs(600)),
            idle: t.idle.map(|d| d.0).unwrap_or(Duration::from_secs(60)),
        };

        let reject_rules = match file.reject_rules {
            None | Some(serde_yaml::Value::Null) => serde_json::Value::Array(Vec::new()),
            Some(v) => serde_json::to_value(v).map_err(|e| {
                err(
                    find_key_line(text, "reject_rules"),
                    format!("reject_rules: {e}"),
                )
            })?,
        };
        if !reject_rules.is_array() {
            return Err(err(
                find_key_line(text, "reject_rules"),
                "reject_rules must be a list of rules".into(),
            ));
        }
        let postprocess = match file.postprocess.as_deref() {
            None => gateway.postprocess_default,
            Some("none") | Some("") => None,
            Some(name) => Some(Handler::from_name(name).ok_or_else(|| {
                err(
                    find_key_line(text, "postprocess"),
                    format!("postprocess: unknown handler {name:?} (strip_actual_usage, vllm_format, none)"),
                )
            })?),
        };
        Ok(RouteConfig {
            api_keys_file: file.api_keys_file,
            reject_rules,
            reject_rules_enabled: file.reject_rules_enabled.map(|f| f.0).unwrap_or(true),
            postprocess,
            include_usage: file.include_usage.map(|f| f.0).unwrap_or(false),
            name: name.to_string(),
            file: path.to_path_buf(),
            peers,
            peers_by_model,
            max_body_size: file
                .max_body_size
                .map(|s| s.0)
                .unwrap_or(gateway.max_body_size),
            balancing: Balancing {
                mode,
                session_headers,
                idle_timeout,
                cross_tier_fallback: bal.cross_tier_fallback.map(|f| f.0).unwrap_or(false),
            },
            health,
            engine_metrics,
            timeouts,
            routed_headers: file.routed_headers.map(|f| f.0).unwrap_or(true),
            warnings,
        })
    }
}

/// A route name with its parsed file, or why the file was rejected.
pub type LoadedRoute = (String, Result<RouteConfig, ConfigError>);

/// Loads every route file in `dir`. Each file stands alone: one broken file
/// does not stop the others. Files are visited in name order so errors and
/// logs are deterministic.
pub fn load_routes_dir(
    dir: &Path,
    gateway: &GatewayConfig,
) -> Result<Vec<LoadedRoute>, ConfigError> {
    let entries = std::fs::read_dir(dir)
        .map_err(|e| ConfigError::new(dir, None, format!("cannot read routes directory: {e}")))?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file() && route_name_of(p).is_some())
        .collect();
    files.sort();
    let mut out = Vec::with_capacity(files.len());
    let mut seen = std::collections::HashSet::new();
    for path in files {
        let Some(name) = route_name_of(&path) else {
            continue;
        };
        if !seen.insert(name.clone()) {
            out.push((
                name.clone(),
                Err(ConfigError::new(
                    &path,
                    None,
                    format!("route {name:?} is defined twice (.yaml and .yml)"),
                )),
            ));
            continue;
        }
        out.push((name, RouteConfig::load(&path, gateway)));
    }
    Ok(out)
}

/// Best-effort line of `key:` for errors found after parsing (the YAML layer
/// has no spans by then).
fn find_key_line(text: &str, key: &str) -> Option<usize> {
    text.lines()
        .position(|l| {
            let t = l
                .trim_start()
                .trim_start_matches("- ")
                .trim_start_matches('{');
            t.starts_with(key) && t[key.len()..].trim_start().starts_with(':')
        })
        .map(|i| i + 1)
}

/// Line of the `index`-th item of the top-level `peers:` list.
fn peer_item_line(text: &str, index: usize) -> Option<usize> {
    let lines: Vec<&str> = text.lines().collect();
    let start = lines.iter().position(|l| l.starts_with("peers:"))?;
    let mut item_indent = None;
    let mut seen = 0;
    for (i, line) in lines.iter().enumerate().skip(start + 1) {
        let trimmed = line.trim_start();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let indent = line.len() - trimmed.len();
        if indent == 0 && !trimmed.starts_with('-') {
            break;
        }
        if trimmed.starts_with('-') && item_indent.is_none_or(|ii| ii == indent) {
            item_indent = Some(indent);
            if seen == index {
                return Some(i + 1);
            }
            seen += 1;
        }
    }
    None
}

#[cfg(test)]
mod tests;
