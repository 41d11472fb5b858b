//! The file formats as written: what `gateway.yaml` and `routes/<name>.yaml`
//! may contain, with `deny_unknown_fields` so a typo is an error with a line.
//! Nothing outside `config` sees these; `gateway.rs` and `route.rs` turn
//! them into validated values (the split River keeps between its TOML and
//! its internal config).

use super::units::{Dur, Flag, Size};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::PathBuf;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct GatewayFile {
    pub listen: Option<String>,
    pub admin_listen: Option<String>,
    pub routes_dir: Option<PathBuf>,
    pub api_keys_file: Option<PathBuf>,
    pub threads: Option<usize>,
    pub work_stealing: Option<Flag>,
    pub grace_period: Option<Dur>,
    pub max_body_size: Option<Size>,
    pub postprocess_default: Option<String>,
    pub client_idle_timeout: Option<Dur>,
    pub client_header_timeout: Option<Dur>,
    pub status_endpoints: Option<String>,
    pub load_rate_limit: Option<Flag>,
    pub watch: Option<Flag>,
    pub bodylog: Option<BodylogFile>,
    pub session_store: Option<SessionStoreFile>,
}

/// `session_store:` in gateway.yaml: where session bindings live.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SessionStoreFile {
    pub kind: Option<String>,
    pub url: Option<String>,
    pub username: Option<String>,
    pub password_file: Option<PathBuf>,
    pub key_prefix: Option<String>,
    pub timeout: Option<Dur>,
    pub pool_size: Option<usize>,
}

/// `bodylog:` in gateway.yaml: where request and response bodies go.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct BodylogFile {
    pub listener: Option<String>,
    pub queue_frames: Option<usize>,
    pub queue_bytes: Option<Size>,
    pub sample_pct: Option<i64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RouteFile {
    pub peers: Option<Vec<PeerFile>>,
    pub peers_by_model: Option<BTreeMap<String, Vec<String>>>,
    pub max_body_size: Option<Size>,
    pub balancing: Option<BalancingFile>,
    pub health: Option<HealthFile>,
    pub engine_metrics: Option<EngineMetricsFile>,
    pub timeouts: Option<TimeoutsFile>,
    pub routed_headers: Option<Flag>,
    pub api_keys_file: Option<PathBuf>,
    pub reject_rules: Option<serde_yaml::Value>,
    pub reject_rules_enabled: Option<Flag>,
    pub postprocess: Option<String>,
    pub include_usage: Option<Flag>,
    pub cch_strip: Option<Flag>,
    pub kimi_normalize: Option<Flag>,
    pub forward_client_key: Option<Flag>,
    pub allow_upgrade: Option<Flag>,
    pub queue_timeout: Option<Dur>,
    pub ttft_window: Option<Dur>,
    pub tps_window: Option<Dur>,
    pub ttft_limit_ms: Option<f64>,
    pub ttft_limit_by_model: Option<BTreeMap<String, f64>>,
    pub tps_limit_tps: Option<f64>,
    /// Read as plain YAML: one bad entry drops the table (with a warning)
    /// instead of refusing the whole route file, as the seed does.
    pub ttft_metrics: Option<serde_yaml::Value>,
    pub tps_metrics: Option<serde_yaml::Value>,
    pub ewma_alpha: Option<f64>,
    pub ewma_ttl: Option<Dur>,
    pub tps_min_tokens: Option<u64>,
    pub tps_min_decode_s: Option<f64>,
    pub probes: Option<u32>,
    pub probe_window: Option<Dur>,
    pub load_rate_limit: Option<Flag>,
    pub adaptive_cc: Option<Flag>,
    pub adaptive_cc_min: Option<f64>,
    pub adaptive_cc_init: Option<f64>,
    pub adaptive_cc_init_frac: Option<f64>,
    pub adaptive_cc_hold_when_idle: Option<Flag>,
    pub adaptive_cc_use_ttft: Option<Flag>,
    pub session_prio: Option<Flag>,
    pub session_prio_r_new: Option<f64>,
    pub session_prio_full_turn: Option<u64>,
    pub session_prio_severe: Option<f64>,
    pub session_prio_release: Option<f64>,
    pub session_prio_t1_probes: Option<u32>,
    pub session_prio_warn_frac: Option<f64>,
    pub session_prio_table: Option<Vec<PrioBucketFile>>,
    pub rt_limit_factor: Option<f64>,
    pub engine_api_key_file: Option<PathBuf>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PeerFile {
    pub name: String,
    pub host: String,
    pub port: i64,
    pub priority: Option<i32>,
    pub max_concurrency: Option<i64>,
    pub probe_path: Option<String>,
    pub kv_capacity_tokens: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct BalancingFile {
    pub mode: Option<String>,
    pub session_affinity: Option<SessionAffinityFile>,
    pub cross_tier_fallback: Option<Flag>,
    /// Deprecated by the session table: accepted so old files still load.
    pub max_load_percent: Option<serde_yaml::Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SessionAffinityFile {
    pub headers: Option<Vec<String>>,
    pub idle_timeout: Option<Dur>,
    pub live_window: Option<Dur>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct HealthFile {
    pub interval: Option<Dur>,
    pub ban_ttl: Option<Dur>,
    pub probe_path: Option<String>,
    pub timeout: Option<Dur>,
    pub enabled: Option<Flag>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum EngineMetricsFile {
    Switch(Flag),
    Settings(EngineMetricsSettingsFile),
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct EngineMetricsSettingsFile {
    pub interval: Option<Dur>,
    pub kv_full_threshold: Option<f64>,
    pub path: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct TimeoutsFile {
    pub connect: Option<Dur>,
    pub read: Option<Dur>,
    pub idle: Option<Dur>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PrioBucketFile {
    pub min_turn: u64,
    pub share: f64,
    pub tol: Option<f64>,
}
