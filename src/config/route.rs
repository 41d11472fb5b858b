//! `routes/<name>.yaml` → [`RouteConfig`]: one validated route. `parse`
//! reads as the file's sections, each validated by its own function.

use super::file::{
    keys_set, AdaptiveFile, BalancingFile, EngineMetricsFile, EngineMetricsSettingsFile,
    HealthFile, PeerFile, ProtectionFile, RouteFile, SessionPrioFile, TimeoutsFile,
};
use super::gateway::GatewayConfig;
use super::spans::KeyLines;
use super::units::Flag;
use super::ConfigError;
pub use crate::protect::config::{AdaptiveConfig, Protection, SessionPrio};
use crate::protect::limits::{metric_limit, MetricLimit};
use crate::protect::meter::MeterConfig;
use crate::protect::window::{Folds, MAX_FOLDS};
use crate::reject::RuleSet;
use crate::stream::postprocess::Handler;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
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
    pub probe_path: Option<String>,
    /// The engine's KV capacity in tokens, for KV-aware admission; when
    /// unset, read from the engine's metrics (`vllm:cache_config_info`,
    /// `sglang:max_total_num_tokens`) where it reports it.
    pub kv_capacity_tokens: Option<u64>,
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
    /// A session used within this long counts as holding KV on its engine.
    pub live_window: Duration,
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
    /// generation needs a generous value, and each write of a long prompt
    /// to an engine that stopped reading it.
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
    /// Content reject rules, compiled. An invalid rule is dropped (the
    /// route still serves) and its error kept in `reject_rule_errors`.
    pub reject_rules: Arc<RuleSet>,
    /// One error per dropped rule, naming it: logged at load, fatal for
    /// `llm-gateway check`.
    pub reject_rule_errors: Vec<String>,
    pub reject_rules_enabled: bool,
    /// None: responses pass unchanged.
    pub postprocess: Option<Handler>,
    /// Add `stream_options.include_usage` to streaming requests that lack it.
    pub include_usage: bool,
    /// Remove the per-request `cch=<hash>;` field from Claude Code's billing
    /// line at the start of the system prompt (`crate::rewrite::cch`).
    pub cch_strip: bool,
    /// Renumber Kimi tool-call ids by first appearance (`crate::rewrite::kimi`).
    pub kimi_normalize: bool,
    /// Send the client's `Authorization`/`x-api-key` on to the engine. Off by
    /// default: a key the gateway checks is the client's credential for the
    /// gateway, not for the engines behind it.
    pub forward_client_key: bool,
    /// Let a request with `Upgrade` (WebSocket, h2c) through and an
    /// engine's `101 Switching Protocols` turn the connection into a raw
    /// tunnel. Off by default: past a 101 nothing the gateway checks (the
    /// `/v1/` restriction, body limits, rules) applies any more.
    pub allow_upgrade: bool,
    /// How long a request that no peer can take (every slot busy, or a new
    /// session that fits no engine's KV) waits for room before its 429.
    /// Zero answers at once.
    pub queue_timeout: Duration,
    /// TTFT and decode-rate measurement and the gates on them.
    pub protection: Protection,
    /// A file whose first line is the key the engines expect; sent as
    /// `Authorization: Bearer <key>` in place of the client's.
    pub engine_api_key_file: Option<PathBuf>,
    /// Values dropped or ignored, to log at load; the route still serves.
    pub warnings: Vec<String>,
    /// Keys written in a deprecated spelling, each with its place now
    /// (logged at load, printed by `check`).
    pub deprecations: Vec<String>,
    /// The option keys the file wrote (`/_route_opts` tells them apart
    /// from defaults).
    pub keys_set: Vec<String>,
}

pub const DEFAULT_LIVE_WINDOW: Duration = Duration::from_secs(10);
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
        let mut at = Locator {
            path,
            lines: KeyLines::of(text),
            adopted: Vec::new(),
        };
        if !valid_route_name(name) {
            return Err(at.error(
                None,
                format!("route name {name:?} (from the file name) must be letters, digits, '-', '_' or '.', not starting with '_' or '.'"),
            ));
        }
        let mut file: RouteFile =
            serde_yaml::from_str(text).map_err(|e| ConfigError::from_yaml(path, e))?;
        at.adopted = file.adopt_flat_keys().map_err(|(flat, nested)| {
            at.at_key(
                flat,
                format!("{flat} and {nested} are both set; keep {nested} ({flat} is its deprecated spelling)"),
            )
        })?;
        let deprecations = at
            .adopted
            .iter()
            .map(|(flat, nested)| match at.line(nested) {
                Some(line) => format!("{flat} (line {line}) is deprecated: write it as {nested}"),
                None => format!("{flat} is deprecated: write it as {nested}"),
            })
            .collect();
        let mut warnings = Vec::new();
        let protection = parse_protection(&at, &file.protection, &mut warnings)?;
        let peers = parse_peers(&at, file.peers)?;
        let peers_by_model = parse_model_pools(&at, &peers, file.peers_by_model)?;
        let balancing = parse_balancing(&at, file.balancing.unwrap_or_default(), &mut warnings)?;
        let health = parse_health(&at, file.health.unwrap_or_default())?;
        let engine_metrics = parse_engine_metrics(&at, file.engine_metrics)?;
        let timeouts = parse_timeouts(file.timeouts.unwrap_or_default());
        let (reject_rules, reject_rule_errors) =
            RuleSet::compile(&parse_reject_rules(&at, file.reject_rules)?);
        let postprocess = parse_postprocess(&at, file.postprocess.as_deref(), gateway)?;
        Ok(RouteConfig {
            name: name.to_string(),
            file: path.to_path_buf(),
            peers,
            peers_by_model,
            max_body_size: file
                .max_body_size
                .map(|s| s.0)
                .unwrap_or(gateway.max_body_size),
            balancing,
            health,
            engine_metrics,
            timeouts,
            routed_headers: flag(file.routed_headers, true),
            api_keys_file: file.api_keys_file,
            reject_rules: Arc::new(reject_rules),
            reject_rule_errors,
            reject_rules_enabled: flag(file.reject_rules_enabled, true),
            postprocess,
            include_usage: flag(file.include_usage, false),
            cch_strip: flag(file.cch_strip, false),
            kimi_normalize: flag(file.kimi_normalize, false),
            forward_client_key: flag(file.forward_client_key, false),
            allow_upgrade: flag(file.allow_upgrade, false),
            queue_timeout: file.queue_timeout.map_or(Duration::ZERO, |d| d.0),
            protection,
            engine_api_key_file: file.engine_api_key_file,
            warnings,
            deprecations,
            keys_set: keys_set(text),
        })
    }
}

/// A `ttft_metrics` / `tps_metrics` table, or `None` (with a warning) when
/// any entry is bad: the route then falls back to its static limit.
fn metric_table(
    key: String,
    raw: Option<&serde_yaml::Value>,
    warnings: &mut Vec<String>,
) -> Option<Vec<MetricLimit>> {
    let raw = raw?;
    let entry = |v: &serde_yaml::Value| -> Result<MetricLimit, String> {
        let map = v.as_mapping().ok_or("an entry must be a mapping")?;
        for k in map.keys() {
            if !matches!(k.as_str(), Some("metric" | "q" | "threshold")) {
                return Err(format!("unknown key {k:?}"));
            }
        }
        let metric = v
            .get("metric")
            .and_then(serde_yaml::Value::as_str)
            .ok_or("metric must be pNN or avg")?;
        let number = |name: &str| -> Result<Option<f64>, String> {
            match v.get(name) {
                None => Ok(None),
                Some(x) => x
                    .as_f64()
                    .map(Some)
                    .ok_or(format!("{name} must be a number")),
            }
        };
        metric_limit(metric, number("q")?, number("threshold")?)
    };
    let parsed: Result<Vec<MetricLimit>, String> = match raw.as_sequence() {
        Some(rows) if rows.is_empty() => Err("the table is empty".into()),
        Some(rows) if rows.len() > MAX_FOLDS => Err(format!(
            "at most {MAX_FOLDS} entries ({} given)",
            rows.len()
        )),
        Some(rows) => rows
            .iter()
            .enumerate()
            .map(|(i, row)| entry(row).map_err(|e| format!("entry {}: {e}", i + 1)))
            .collect(),
        None => Err("must be a list of {metric, q, threshold}".into()),
    };
    match parsed {
        Ok(table) => Some(table),
        Err(e) => {
            warnings.push(format!(
                "{key} dropped ({e}); the route's static limit applies"
            ));
            None
        }
    }
}

fn parse_protection(
    at: &Locator,
    file: &ProtectionFile,
    warnings: &mut Vec<String>,
) -> Result<Protection, ConfigError> {
    let d = MeterConfig::default();
    let ms =
        |v: Option<super::units::Dur>, default: u64| v.map_or(default, |d| d.0.as_millis() as u64);
    let positive = |path: &str, v: Option<f64>| -> Result<Option<f64>, ConfigError> {
        match v {
            Some(x) if !(x.is_finite() && x > 0.0) => Err(at.at_key(
                path,
                format!("{} must be a positive number", at.written(path)),
            )),
            other => Ok(other),
        }
    };
    let (ttft, tps) = (&file.ttft, &file.tps);
    let alpha = file.ewma.alpha.unwrap_or(d.alpha);
    if !alpha.is_finite() {
        let path = "protection.ewma.alpha";
        return Err(at.at_key(path, format!("{} must be a number", at.written(path))));
    }
    let ttft_metrics = metric_table(
        at.written("protection.ttft.metrics"),
        ttft.metrics.as_ref(),
        warnings,
    );
    let tps_metrics = metric_table(
        at.written("protection.tps.metrics"),
        tps.metrics.as_ref(),
        warnings,
    );
    let folds = |table: &Option<Vec<MetricLimit>>, default: Folds| {
        table
            .as_deref()
            .and_then(|t| Folds::of(&t.iter().map(|m| m.fold).collect::<Vec<_>>()))
            .unwrap_or(default)
    };
    let meter = MeterConfig {
        ttft_folds: folds(&ttft_metrics, d.ttft_folds),
        tps_folds: folds(&tps_metrics, d.tps_folds),
        ttft_window_ms: ms(ttft.window, d.ttft_window_ms).max(1),
        tps_window_ms: ms(tps.window, d.tps_window_ms).max(1),
        // Clamped as the OpenResty gateway does rather than refused: 1.5
        // means "all in".
        alpha: alpha.clamp(0.0, 1.0),
        ttl_ms: ms(file.ewma.ttl, d.ttl_ms).max(1),
        tps_min_tokens: tps.min_tokens.unwrap_or(d.tps_min_tokens),
        tps_min_decode_ms: positive("protection.tps.min_decode_s", tps.min_decode_s)?
            .map_or(d.tps_min_decode_ms, |s| (s * 1000.0) as u64),
    };
    let mut by_model = Vec::new();
    for (model, limit) in ttft.limit_by_model.clone().unwrap_or_default() {
        let limit = positive("protection.ttft.limit_by_model", Some(limit))?.unwrap_or(limit);
        by_model.push((model, limit));
    }
    let floor_set = tps.limit_tps.is_some() || tps.metrics.is_some();
    Ok(Protection {
        meter,
        ttft_limit_ms: positive("protection.ttft.limit_ms", ttft.limit_ms)?.unwrap_or(30_000.0),
        ttft_limit_by_model: by_model,
        tps_limit_tps: positive("protection.tps.limit_tps", tps.limit_tps)?,
        ttft_metrics,
        tps_metrics,
        load_rate_limit: file.rate_limit.map(|f| f.0),
        adaptive: adaptive_config(at, &file.adaptive, floor_set)?,
        session_prio: session_prio(at, &file.session_prio)?,
        probes: file.probes.unwrap_or(5),
        probe_window: file.probe_window.map_or(Duration::from_secs(10), |d| d.0),
    })
}

fn session_prio(at: &Locator, file: &SessionPrioFile) -> Result<SessionPrio, ConfigError> {
    use crate::protect::prio::{default_table, validate_table, Bucket};
    let refuse =
        |path: &str, what: &str| at.at_key(path, format!("{} must be {what}", at.written(path)));
    let severe = file.severe.unwrap_or(1.5);
    if severe.is_nan() || severe < 1.0 {
        return Err(refuse("protection.session_prio.severe", "at least 1"));
    }
    let r_new = file.r_new.unwrap_or(0.85);
    if r_new.is_nan() || r_new <= 0.0 || r_new > 1.0 {
        return Err(refuse("protection.session_prio.r_new", "in (0, 1]"));
    }
    let table = match &file.table {
        None => default_table(r_new, file.full_turn.unwrap_or(32), severe),
        Some(rows) => {
            let n = rows.len();
            let table: Vec<Bucket> = rows
                .iter()
                .enumerate()
                .map(|(i, r)| Bucket {
                    min_turn: r.min_turn,
                    share: r.share,
                    tol: r.tol.unwrap_or(if n > 1 {
                        1.0 + (severe - 1.0) * i as f64 / (n - 1) as f64
                    } else {
                        severe
                    }),
                })
                .collect();
            let path = "protection.session_prio.table";
            validate_table(&table)
                .map_err(|e| at.at_key(path, format!("{}: {e}", at.written(path))))?;
            table
        }
    };
    let in_range = |path: &str, v: Option<f64>, default: f64, ok: fn(f64) -> bool, what: &str| {
        let v = v.unwrap_or(default);
        if ok(v) {
            Ok(v)
        } else {
            Err(refuse(path, &format!("{what} (got {v})")))
        }
    };
    if file.full_turn == Some(0) {
        return Err(refuse("protection.session_prio.full_turn", "at least 1"));
    }
    Ok(SessionPrio {
        enabled: flag(file.enabled, false),
        table,
        rt_limit_factor: in_range(
            "protection.session_prio.rt_limit_factor",
            file.rt_limit_factor,
            1.0,
            |v| v.is_finite() && v > 0.0,
            "a positive number",
        )?,
        severe,
        release: in_range(
            "protection.session_prio.release",
            file.release,
            0.9,
            |v| v > 0.0 && v <= 1.0,
            "in (0, 1]",
        )?,
        t1_probes: file.t1_probes.unwrap_or(1),
        warn_frac: in_range(
            "protection.session_prio.warn_frac",
            file.warn_frac,
            0.2,
            |v| (0.0..=1.0).contains(&v),
            "in [0, 1]",
        )?,
    })
}

/// Adaptive concurrency is on by default when a decode-rate floor is set.
fn adaptive_config(
    at: &Locator,
    file: &AdaptiveFile,
    floor_set: bool,
) -> Result<Option<AdaptiveConfig>, ConfigError> {
    let on = flag(file.enabled, floor_set);
    // Checked even while off, so a bad value is found before it is used.
    if file.min.is_some_and(|m| m.is_nan() || m < 1.0) {
        let path = "protection.adaptive.min";
        return Err(at.at_key(path, format!("{} must be at least 1", at.written(path))));
    }
    if !on {
        return Ok(None);
    }
    Ok(Some(AdaptiveConfig {
        min: file.min,
        init: file.init,
        init_frac: file.init_frac,
        hold_when_idle: flag(file.hold_when_idle, true),
        use_ttft: flag(file.use_ttft, true),
    }))
}

fn flag(value: Option<Flag>, default: bool) -> bool {
    value.map(|f| f.0).unwrap_or(default)
}

/// Errors found after the YAML layer point at the line of the key they are
/// about (from the parser's positions, `spans.rs`) and name it as the file
/// wrote it: a flat protection key keeps its own name and line.
struct Locator<'a> {
    path: &'a Path,
    lines: KeyLines,
    /// The (flat, nested) protection keys this file wrote flat.
    adopted: Vec<(&'static str, &'static str)>,
}

impl Locator<'_> {
    fn error(&self, line: Option<usize>, message: String) -> ConfigError {
        ConfigError::new(self.path, line, message)
    }

    /// `path` (dotted, as `protection.ttft.limit_ms`) as the file wrote it.
    fn written(&self, path: &str) -> String {
        self.adopted
            .iter()
            .find(|(_, nested)| *nested == path)
            .map_or(path, |(flat, _)| flat)
            .to_string()
    }

    fn line(&self, path: &str) -> Option<usize> {
        self.lines.line(&self.written(path))
    }

    fn at_key(&self, path: &str, message: String) -> ConfigError {
        self.error(self.line(path), message)
    }
}

fn parse_peers(at: &Locator, raw: Option<Vec<PeerFile>>) -> Result<Vec<PeerConfig>, ConfigError> {
    let raw_peers = match raw {
        Some(p) if !p.is_empty() => p,
        _ => return Err(at.at_key("peers", "peers: a route needs at least one peer".into())),
    };
    let mut peers: Vec<PeerConfig> = Vec::with_capacity(raw_peers.len());
    for (i, p) in raw_peers.into_iter().enumerate() {
        let line = at.line(&format!("peers[{i}]"));
        if p.name.trim().is_empty() {
            return Err(at.error(line, format!("peers[{i}]: name must not be empty")));
        }
        if p.host.trim().is_empty() {
            return Err(at.error(
                line,
                format!("peers[{i}] {}: host must not be empty", p.name),
            ));
        }
        let port = u16::try_from(p.port)
            .ok()
            .filter(|&port| port != 0)
            .ok_or_else(|| {
                at.error(
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
                return Err(at.error(
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
                return Err(at.error(
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
            kv_capacity_tokens: p.kv_capacity_tokens.filter(|&n| n > 0),
        };
        if let Some(prev) = peers.iter().find(|q| q.name == peer.name) {
            return Err(at.error(
                line,
                format!(
                    "peers[{i}]: duplicate peer name {:?} (also {})",
                    peer.name,
                    prev.address()
                ),
            ));
        }
        if peers.iter().any(|q| q.address() == peer.address()) {
            return Err(at.error(
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

    Ok(peers)
}

fn parse_model_pools(
    at: &Locator,
    peers: &[PeerConfig],
    raw: Option<BTreeMap<String, Vec<String>>>,
) -> Result<Vec<(String, Vec<usize>)>, ConfigError> {
    let mut peers_by_model = Vec::new();
    for (model, names) in raw.unwrap_or_default() {
        let line = at.line(&format!("peers_by_model.{model}"));
        if names.is_empty() {
            return Err(at.error(line, format!("peers_by_model.{model}: lists no peers")));
        }
        let mut idx = Vec::with_capacity(names.len());
        for n in names {
            match peers.iter().position(|p| p.name == n) {
                Some(i) if !idx.contains(&i) => idx.push(i),
                Some(_) => {
                    return Err(at.error(
                        line,
                        format!("peers_by_model.{model}: peer {n:?} listed twice"),
                    ))
                }
                None => {
                    return Err(
                        at.error(line, format!("peers_by_model.{model}: unknown peer {n:?}"))
                    )
                }
            }
        }
        peers_by_model.push((model, idx));
    }

    Ok(peers_by_model)
}

fn parse_balancing(
    at: &Locator,
    bal: BalancingFile,
    warnings: &mut Vec<String>,
) -> Result<Balancing, ConfigError> {
    let mode = match bal.mode.as_deref() {
        None => Mode::LoadAware,
        Some(m) => Mode::parse(m).ok_or_else(|| {
            at.error(
                at.line("balancing.mode"),
                format!(
                    "balancing.mode: {m:?} is not one of load_aware, hash, least_conn, round_robin"
                ),
            )
        })?,
    };
    let affinity = bal.session_affinity;
    if affinity.is_some() && !matches!(mode, Mode::LoadAware | Mode::Hash) {
        return Err(at.error(
            at.line("balancing.session_affinity"),
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
            at.error(
                at.line("balancing.session_affinity.headers"),
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
        return Err(at.error(
            at.line("balancing.session_affinity.idle_timeout"),
            "balancing.session_affinity.idle_timeout must be between 1m and 24h".into(),
        ));
    }
    let live_window = affinity.live_window.map_or(DEFAULT_LIVE_WINDOW, |d| d.0);
    if live_window < Duration::from_secs(1) || live_window > idle_timeout {
        return Err(at.at_key(
            "balancing.session_affinity.live_window",
            "balancing.session_affinity.live_window must be between 1s and idle_timeout".into(),
        ));
    }

    Ok(Balancing {
        mode,
        session_headers,
        idle_timeout,
        live_window,
        cross_tier_fallback: flag(bal.cross_tier_fallback, false),
    })
}

fn parse_health(at: &Locator, h: HealthFile) -> Result<HealthConfig, ConfigError> {
    let health = HealthConfig {
        enabled: h.enabled.map(|f| f.0).unwrap_or(true),
        interval: h.interval.map(|d| d.0).unwrap_or(Duration::from_secs(5)),
        ban_ttl: h.ban_ttl.map(|d| d.0).unwrap_or(Duration::from_secs(30)),
        probe_path: h.probe_path.unwrap_or_else(|| "/health".into()),
        timeout: h.timeout.map(|d| d.0).unwrap_or(Duration::from_secs(2)),
    };
    if health.interval < Duration::from_millis(50) {
        return Err(at.error(
            at.line("health.interval"),
            "health.interval must be at least 50ms".into(),
        ));
    }
    if !health.probe_path.starts_with('/') {
        return Err(at.error(
            at.line("health.probe_path"),
            "health.probe_path must start with '/'".into(),
        ));
    }

    Ok(health)
}

fn parse_engine_metrics(
    at: &Locator,
    raw: Option<EngineMetricsFile>,
) -> Result<Option<EngineMetricsConfig>, ConfigError> {
    let engine_metrics = match raw {
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
            return Err(at.error(
                at.line("engine_metrics.kv_full_threshold"),
                "engine_metrics.kv_full_threshold must be between 0 and 1".into(),
            ));
        }
        if m.interval < Duration::from_millis(50) {
            return Err(at.error(
                at.line("engine_metrics.interval"),
                "engine_metrics.interval must be at least 50ms".into(),
            ));
        }
    }

    Ok(engine_metrics)
}

fn parse_timeouts(t: TimeoutsFile) -> Timeouts {
    Timeouts {
        connect: t.connect.map(|d| d.0).unwrap_or(Duration::from_secs(5)),
        read: t.read.map(|d| d.0).unwrap_or(Duration::from_secs(600)),
        idle: t.idle.map(|d| d.0).unwrap_or(Duration::from_secs(60)),
    }
}

fn parse_reject_rules(
    at: &Locator,
    raw: Option<serde_yaml::Value>,
) -> Result<serde_json::Value, ConfigError> {
    let reject_rules = match raw {
        None | Some(serde_yaml::Value::Null) => serde_json::Value::Array(Vec::new()),
        Some(v) => serde_json::to_value(v)
            .map_err(|e| at.error(at.line("reject_rules"), format!("reject_rules: {e}")))?,
    };
    if !reject_rules.is_array() {
        return Err(at.error(
            at.line("reject_rules"),
            "reject_rules must be a list of rules".into(),
        ));
    }
    Ok(reject_rules)
}

fn parse_postprocess(
    at: &Locator,
    raw: Option<&str>,
    gateway: &GatewayConfig,
) -> Result<Option<Handler>, ConfigError> {
    Ok(match raw {
        None => gateway.postprocess_default,
        Some("none") | Some("") => None,
        Some(name) => Some(Handler::from_name(name).ok_or_else(|| {
            at.error(
                at.line("postprocess"),
                format!(
                    "postprocess: unknown handler {name:?} (strip_actual_usage, vllm_format, none)"
                ),
            )
        })?),
    })
}
