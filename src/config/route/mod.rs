//! `routes/<name>.yaml` → [`RouteConfig`]: one validated route. `parse`
//! reads as the file's sections, each validated by its own function:
//! `peers.rs`, `protection.rs`, and `sections.rs` for the rest. What they
//! make is in `settings.rs`; `locator.rs` points their errors at a line.

use super::file::{keys_set, RouteFile, FORMER_KEYS};
use super::gateway::GatewayConfig;
use super::spans::KeyLines;
use super::units::flag;
use super::ConfigError;
use crate::auth::KeySet;
pub use crate::protect::config::{AdaptiveConfig, Protection, SessionPrio};
use crate::reject::RuleSet;
use crate::stream::postprocess::Handler;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// The fair hold is off unless a route sets a depth: on issue 43's
/// noisy-neighbor bench with nothing else configured (KV overcommitted,
/// BENCHMARKS.md) a depth of 4 cost 12 % of the output and 13 points of
/// cache hit and 12 changed nothing: there the quiet tenant's tail is its
/// own evicted context, which no order of release gives back.
pub const DEFAULT_FAIR_HOLD_DEPTH: u32 = 0;

/// The longest a request is held for a busy engine: past it, the engine's
/// own queue is no worse a place to wait, and nothing is refused for it.
pub const DEFAULT_FAIR_HOLD_TIMEOUT: Duration = Duration::from_secs(30);

mod locator;
mod peers;
mod protection;
mod sections;
mod settings;

use locator::Locator;
use peers::{parse_model_pools, parse_peers, parse_peers_from};
use protection::parse_protection;
use sections::{
    parse_balancing, parse_engine_metrics, parse_health, parse_postprocess, parse_reject_rules,
    parse_timeouts,
};
pub use settings::{
    Balancing, ConcurrencyFrom, EngineMetricsConfig, HealthConfig, Mode, PeerConfig, PeerSource,
    PeersFrom, Timeouts, DEFAULT_MAX_CONCURRENCY, MAX_IDLE_TIMEOUT, MIN_IDLE_TIMEOUT,
};

/// A validated route.
#[derive(Debug, Clone, PartialEq)]
pub struct RouteConfig {
    pub name: String,
    pub file: PathBuf,
    /// The peers the file lists (a route's live peers are these and the
    /// ones `peers_from` finds: `Route::peers`).
    pub peers: Vec<PeerConfig>,
    pub peers_from: Option<PeersFrom>,
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
    /// The route's own keys written in its file, the OpenResty gateway's
    /// inline `api_keys` table (deprecated: `api_keys_file` is the way).
    pub api_keys: Option<KeySet>,
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
    /// Release the queue by priority class, then by tenant, the one with
    /// the fewest weighted tokens served first (`crate::fair`); off, in
    /// arrival order (warm turns first).
    pub fair_share: bool,
    /// With `fair_share` and more than one tenant sending: a streamed
    /// request whose engine already has this many awaiting their first
    /// token waits at the gateway (released in the fair order as they get
    /// it) rather than in the engine's own first-come queue. 0 (the
    /// default): never.
    pub fair_hold_depth: u32,
    /// The longest such a hold lasts; then the request goes on as placed.
    pub fair_hold_timeout: Duration,
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
    /// Whether requests wait in a queue released by class and tenant:
    /// `fair_share` on a route that has a queue, or holds requests back
    /// from busy engines while tenants share it.
    pub fn fair_queue(&self) -> bool {
        self.fair_share && (!self.queue_timeout.is_zero() || self.fair_hold_depth > 0)
    }

    /// Whether the route has keys of its own (a key file, or the inline
    /// table) rather than the gateway's shared file.
    pub fn has_own_keys(&self) -> bool {
        self.api_keys_file.is_some() || self.api_keys.is_some()
    }

    /// What to tell at load (and in `check`) of a route that loaded: keys
    /// in a deprecated spelling, then values dropped or ignored.
    pub fn notices(&self) -> impl Iterator<Item = &String> {
        self.deprecations.iter().chain(&self.warnings)
    }

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
        let mut at = Locator::new(path, KeyLines::of(text));
        if !valid_route_name(name) {
            return Err(at.error(
                None,
                format!("route name {name:?} (from the file name) must be letters, digits, '-', '_' or '.', not starting with '_' or '.'"),
            ));
        }
        let mut file: RouteFile =
            serde_yaml::from_str(text).map_err(|e| ConfigError::from_yaml(path, e))?;
        at.adopted = file.adopt_former_keys().map_err(|(old, new)| {
            at.at_key(
                old,
                format!(
                    "{old} and {new} are both set; keep {new} ({old} is its deprecated spelling)"
                ),
            )
        })?;
        let mut warnings = Vec::new();
        let api_keys = inline_api_keys(&mut at, &mut file, &mut warnings)?;
        let deprecations = at
            .adopted
            .iter()
            .map(|&(old, new)| deprecation(&at, old, new))
            .collect();
        let protection = parse_protection(&at, &file.protection, &mut warnings)?;
        let peers_from = parse_peers_from(&at, file.peers_from)?;
        let peers = parse_peers(&at, file.peers, peers_from.is_some(), &mut warnings)?;
        if peers_from.is_some() && file.peers_by_model.is_some() {
            return Err(at.at_key(
                "peers_by_model",
                "peers_by_model names peers, and peers_from's are only known at run time: a route with peers_from serves every model from all its peers".into(),
            ));
        }
        let peers_by_model = parse_model_pools(&at, &peers, file.peers_by_model)?;
        let balancing = parse_balancing(&at, file.balancing, &mut warnings)?;
        let health = parse_health(&at, file.health)?;
        let engine_metrics = parse_engine_metrics(&at, file.engine_metrics)?;
        let timeouts = parse_timeouts(file.timeouts.unwrap_or_default());
        let (reject_rules, reject_rule_errors) =
            RuleSet::compile(&parse_reject_rules(&at, file.reject_rules)?);
        let postprocess = parse_postprocess(&at, file.postprocess.as_deref(), gateway)?;
        Ok(RouteConfig {
            name: name.to_string(),
            file: path.to_path_buf(),
            peers,
            peers_from,
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
            api_keys,
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
            fair_share: flag(file.fair_share, true),
            fair_hold_depth: file.fair_hold_depth.unwrap_or(DEFAULT_FAIR_HOLD_DEPTH),
            fair_hold_timeout: file
                .fair_hold_timeout
                .map_or(DEFAULT_FAIR_HOLD_TIMEOUT, |d| d.0),
            protection,
            engine_api_key_file: file.engine_api_key_file,
            warnings,
            deprecations,
            keys_set: keys_set(text),
        })
    }
}

/// What a route is told about a key written by its former name: where to
/// write it now and, when that is only the closest option, how it differs.
fn deprecation(at: &Locator, old: &str, new: &str) -> String {
    let unlike = FORMER_KEYS
        .iter()
        .find(|f| f.old == old)
        .and_then(|f| f.unlike)
        .map_or(String::new(), |how| {
            format!(" (no exact equivalent: {how})")
        });
    match at.line(new) {
        Some(line) => format!("{old} (line {line}) is deprecated: write it as {new}{unlike}"),
        None => format!("{old} is deprecated: write it as {new}{unlike}"),
    }
}

/// The OpenResty gateway's inline `api_keys: {key: owner}` table: the
/// route's keys, as its own key file's would be. An empty table leaves the
/// route without keys, open as an empty key file does (and as the OpenResty
/// gateway's empty table did). Written with `api_keys_file` too, refused.
fn inline_api_keys(
    at: &mut Locator,
    file: &mut RouteFile,
    warnings: &mut Vec<String>,
) -> Result<Option<KeySet>, ConfigError> {
    let Some(table) = file.api_keys.take() else {
        return Ok(None);
    };
    if file.api_keys_file.is_some() {
        return Err(at.at_key(
            "api_keys",
            "api_keys and api_keys_file are both set; keep api_keys_file (api_keys, the inline table, is deprecated)".into(),
        ));
    }
    at.adopted.push(("api_keys", "api_keys_file"));
    let (keys, notes) = KeySet::from_table(table.iter().map(|(k, o)| (k.as_str(), o.as_str())));
    warnings.extend(notes.into_iter().map(|n| format!("api_keys: {n}")));
    if keys.is_empty() {
        warnings.push("api_keys holds no usable key: the route's authentication is OFF".into());
    }
    Ok(Some(keys))
}
