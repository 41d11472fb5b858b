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
    pub peer_metrics_grace: Option<Dur>,
    pub max_body_size: Option<Size>,
    pub max_header_size: Option<Size>,
    pub postprocess_default: Option<String>,
    pub client_idle_timeout: Option<Dur>,
    pub client_header_timeout: Option<Dur>,
    pub status_endpoints: Option<String>,
    pub load_rate_limit: Option<Flag>,
    pub watch: Option<Flag>,
    pub bodylog: Option<BodylogFile>,
    pub session_store: Option<SessionStoreFile>,
    pub resolver: Option<ResolverFile>,
    pub access_log: Option<AccessLogFile>,
    pub trace_context: Option<String>,
    pub tracing: Option<TracingFile>,
    pub tls: Option<TlsFile>,
    pub h2c: Option<Flag>,
    pub tenants_file: Option<PathBuf>,
    pub tenant_header: Option<String>,
    pub admin: Option<AdminFile>,
}

/// `admin:` in gateway.yaml: who may read the admin listener.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct AdminFile {
    pub token_file: Option<PathBuf>,
    pub open_paths: Option<Vec<String>>,
}

/// `tls:` in gateway.yaml: the main listener's certificate and key files.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct TlsFile {
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
}

/// `access_log:` in gateway.yaml: a JSON line per finished request.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct AccessLogFile {
    pub path: Option<String>,
    pub queue_lines: Option<usize>,
}

/// `tracing:` in gateway.yaml: OpenTelemetry spans over OTLP/HTTP.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct TracingFile {
    pub endpoint: Option<String>,
    pub sampling_ratio: Option<f64>,
    pub queue_spans: Option<usize>,
    pub batch_spans: Option<usize>,
    pub export_interval: Option<Dur>,
    pub timeout: Option<Dur>,
    pub service_name: Option<String>,
}

/// `resolver:` in gateway.yaml: how engine host names are looked up.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ResolverFile {
    pub nameservers: Option<Vec<String>>,
    pub min_ttl: Option<Dur>,
    pub max_ttl: Option<Dur>,
    pub hosts_file: Option<std::path::PathBuf>,
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
    pub sync_interval: Option<Dur>,
    pub share_claims: Option<Flag>,
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
    pub peers_from: Option<PeersFromFile>,
    pub peers_by_model: Option<BTreeMap<String, Vec<String>>>,
    pub max_body_size: Option<Size>,
    #[serde(default)]
    pub balancing: BalancingFile,
    #[serde(default)]
    pub health: HealthFile,
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
    pub fair_share: Option<Flag>,
    pub fair_hold_depth: Option<u32>,
    pub fair_hold_timeout: Option<Dur>,
    /// The load gates: TTFT and decode-rate shedding, probes, adaptive
    /// concurrency, session turn priority, the rate-limit switch.
    #[serde(default)]
    pub protection: ProtectionFile,
    // The first, flat spelling of the protection keys (the OpenResty
    // gateway's names), still read so that no deployed file breaks;
    // `adopt_flat_keys` moves each under `protection:`.
    pub ttft_window: Option<Dur>,
    pub tps_window: Option<Dur>,
    pub ttft_limit_ms: Option<f64>,
    pub ttft_limit_by_model: Option<BTreeMap<String, f64>>,
    pub tps_limit_tps: Option<f64>,
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
    pub adaptive_cc_inc: Option<f64>,
    pub adaptive_cc_dec: Option<f64>,
    pub adaptive_cc_pressure_frac: Option<f64>,
    pub adaptive_cc_slack_frac: Option<f64>,
    pub adaptive_cc_abs: Option<f64>,
    pub adaptive_cc_min_frac: Option<f64>,
    pub adaptive_cc_ttl: Option<Dur>,
    pub adaptive_cc_interval: Option<Dur>,
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
    // The OpenResty gateway's names for options kept elsewhere here, read
    // so that its route files move over: `adopt_former_keys` moves each to
    // its place, and the inline key table is read apart (`FORMER_KEYS`).
    pub health_check_interval: Option<Dur>,
    pub health_ban_ttl: Option<Dur>,
    pub health_probe_path: Option<String>,
    pub cross_tier_fallback: Option<Flag>,
    pub api_keys: Option<BTreeMap<String, String>>,
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
    pub tls: Option<PeerTlsFile>,
}

/// A peer's `tls:` (or `peers_from`'s): the engine is reached over TLS.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PeerTlsFile {
    pub sni: Option<String>,
    pub ca_file: Option<PathBuf>,
    pub client_cert: Option<PathBuf>,
    pub client_key: Option<PathBuf>,
    pub verify: Option<Flag>,
}

/// `peers_from:` in a route file: one peer per address of a DNS name, or
/// per ready endpoint of the EndpointSlices a selector matches; the other
/// keys are what a `peers:` entry may set, for each of them.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PeersFromFile {
    pub dns: Option<String>,
    pub kubernetes: Option<KubernetesFile>,
    pub port: Option<i64>,
    pub priority: Option<i32>,
    pub max_concurrency: Option<i64>,
    pub probe_path: Option<String>,
    pub kv_capacity_tokens: Option<u64>,
    pub tls: Option<PeerTlsFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct KubernetesFile {
    pub namespace: String,
    pub selector: String,
    pub port: serde_yaml::Value,
    pub api: Option<String>,
    pub service_account_dir: Option<PathBuf>,
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
    pub content: Option<ContentFile>,
}

/// `balancing.session_affinity.content`: `on` / `off`, or its settings
/// (which switch it on).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum ContentFile {
    Switch(Flag),
    Settings(ContentSettingsFile),
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ContentSettingsFile {
    pub template_fanout: Option<u16>,
    pub max_blocks: Option<usize>,
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

/// `protection:` in a route file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ProtectionFile {
    #[serde(default)]
    pub ttft: TtftFile,
    #[serde(default)]
    pub tps: TpsFile,
    #[serde(default)]
    pub ewma: EwmaFile,
    pub probes: Option<u32>,
    pub probe_window: Option<Dur>,
    pub rate_limit: Option<Flag>,
    #[serde(default)]
    pub adaptive: AdaptiveFile,
    #[serde(default)]
    pub session_prio: SessionPrioFile,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct TtftFile {
    pub limit_ms: Option<f64>,
    pub limit_by_model: Option<BTreeMap<String, f64>>,
    /// Read as plain YAML: one bad entry drops the table (with a warning)
    /// instead of refusing the whole route file, as the OpenResty gateway
    /// this one follows does.
    pub metrics: Option<serde_yaml::Value>,
    pub window: Option<Dur>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct TpsFile {
    pub limit_tps: Option<f64>,
    pub metrics: Option<serde_yaml::Value>,
    pub window: Option<Dur>,
    pub min_tokens: Option<u64>,
    pub min_decode_s: Option<f64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct EwmaFile {
    pub alpha: Option<f64>,
    pub ttl: Option<Dur>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct AdaptiveFile {
    pub enabled: Option<Flag>,
    pub min: Option<f64>,
    pub init: Option<f64>,
    pub init_frac: Option<f64>,
    pub hold_when_idle: Option<Flag>,
    pub use_ttft: Option<Flag>,
    // The AIMD internals (`/_route_opts` serves them under `advanced`).
    pub inc: Option<f64>,
    pub dec: Option<f64>,
    pub pressure_frac: Option<f64>,
    pub slack_frac: Option<f64>,
    pub abs: Option<f64>,
    pub min_frac: Option<f64>,
    pub ttl: Option<Dur>,
    pub interval: Option<Dur>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SessionPrioFile {
    pub enabled: Option<Flag>,
    pub r_new: Option<f64>,
    pub full_turn: Option<u64>,
    pub severe: Option<f64>,
    pub release: Option<f64>,
    pub t1_probes: Option<u32>,
    pub warn_frac: Option<f64>,
    pub table: Option<Vec<PrioBucketFile>>,
    pub rt_limit_factor: Option<f64>,
}

/// A key the OpenResty gateway's route files, or this gateway's first flat
/// format, spell otherwise, and its place now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FormerKey {
    pub old: &'static str,
    /// Dotted, as written in a route file.
    pub new: &'static str,
    /// When `new` is not the same option but the closest there is: how it
    /// differs, for the deprecation warning.
    pub unlike: Option<&'static str>,
}

/// Pairs each former key of `RouteFile` with its place now, once, for both
/// the table that `check` and `/_route_opts` name them from and the move
/// into the nested sections. `moved` keys take the same value at their new
/// place; `read_apart` ones are read by the route's parser (their value has
/// another shape there).
macro_rules! former_keys {
    (
        moved { $($old:ident => $first:ident $(. $rest:ident)* $(, unlike $note:literal)?;)* }
        read_apart { $($apart:ident => $apart_new:ident, unlike $apart_note:literal;)* }
    ) => {
        /// Every former key and its place now.
        pub const FORMER_KEYS: &[FormerKey] = &[
            $(FormerKey {
                old: stringify!($old),
                new: concat!(stringify!($first) $(, ".", stringify!($rest))*),
                unlike: former_keys!(@note $($note)?),
            },)*
            $(FormerKey {
                old: stringify!($apart),
                new: stringify!($apart_new),
                unlike: Some($apart_note),
            },)*
        ];

        impl RouteFile {
            /// Moves every `moved` former key the file wrote to its place,
            /// returning the (old, new) pairs it moved; `Err` names the first
            /// key written both ways.
            pub(super) fn adopt_former_keys(
                &mut self,
            ) -> Result<Vec<(&'static str, &'static str)>, (&'static str, &'static str)> {
                let mut moved = Vec::new();
                $(
                    if let Some(v) = self.$old.take() {
                        let names = (
                            stringify!($old),
                            concat!(stringify!($first) $(, ".", stringify!($rest))*),
                        );
                        let slot = &mut self.$first $(.$rest)*;
                        if slot.is_some() {
                            return Err(names);
                        }
                        *slot = Some(v);
                        moved.push(names);
                    }
                )*
                Ok(moved)
            }
        }
    };
    (@note) => { None };
    (@note $note:literal) => { Some($note) };
}

former_keys! {
    moved {
        ttft_limit_ms => protection.ttft.limit_ms;
        ttft_limit_by_model => protection.ttft.limit_by_model;
        ttft_metrics => protection.ttft.metrics;
        ttft_window => protection.ttft.window;
        tps_limit_tps => protection.tps.limit_tps;
        tps_metrics => protection.tps.metrics;
        tps_window => protection.tps.window;
        tps_min_tokens => protection.tps.min_tokens;
        tps_min_decode_s => protection.tps.min_decode_s;
        ewma_alpha => protection.ewma.alpha;
        ewma_ttl => protection.ewma.ttl;
        probes => protection.probes;
        probe_window => protection.probe_window;
        load_rate_limit => protection.rate_limit;
        adaptive_cc => protection.adaptive.enabled;
        adaptive_cc_min => protection.adaptive.min;
        adaptive_cc_init => protection.adaptive.init;
        adaptive_cc_init_frac => protection.adaptive.init_frac;
        adaptive_cc_hold_when_idle => protection.adaptive.hold_when_idle;
        adaptive_cc_use_ttft => protection.adaptive.use_ttft;
        adaptive_cc_inc => protection.adaptive.inc;
        adaptive_cc_dec => protection.adaptive.dec;
        adaptive_cc_pressure_frac => protection.adaptive.pressure_frac;
        adaptive_cc_slack_frac => protection.adaptive.slack_frac;
        adaptive_cc_abs => protection.adaptive.abs;
        adaptive_cc_min_frac => protection.adaptive.min_frac;
        adaptive_cc_ttl => protection.adaptive.ttl;
        adaptive_cc_interval => protection.adaptive.interval;
        session_prio => protection.session_prio.enabled;
        session_prio_r_new => protection.session_prio.r_new;
        session_prio_full_turn => protection.session_prio.full_turn;
        session_prio_severe => protection.session_prio.severe;
        session_prio_release => protection.session_prio.release;
        session_prio_t1_probes => protection.session_prio.t1_probes;
        session_prio_warn_frac => protection.session_prio.warn_frac;
        session_prio_table => protection.session_prio.table;
        rt_limit_factor => protection.session_prio.rt_limit_factor;
        health_check_interval => health.interval;
        health_ban_ttl => health.ban_ttl;
        health_probe_path => health.probe_path;
        cross_tier_fallback => balancing.cross_tier_fallback,
            unlike "the OpenResty gateway's sends a request that failed on a tier (a 5xx or no connection) to the next tier at once; here a refused connection is retried on another ready peer, the next tier's once its own has none, whatever this option, and balancing.cross_tier_fallback lets a full tier spill into the next";
    }
    read_apart {
        api_keys => api_keys_file,
            unlike "keys are not written in a route file here; move them to a file of key:owner entries, one per line, and name it with api_keys_file (meanwhile these keys are the route's)";
    }
}

/// The dotted keys a route file's text sets (`peers[].x` when any peer
/// sets `x`), as written, so `/_route_opts` can say which values the route
/// chose.
pub fn keys_set(text: &str) -> Vec<String> {
    let Ok(doc) = serde_yaml::from_str::<serde_yaml::Value>(text) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    collect(&doc, "", &mut out);
    if let Some(peers) = doc.get("peers").and_then(|p| p.as_sequence()) {
        for peer in peers.iter().filter_map(|p| p.as_mapping()) {
            for k in peer.keys().filter_map(|k| k.as_str()) {
                out.push(format!("peers[].{k}"));
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// The sections of a route file: mappings whose keys are options.
const SECTIONS: &[&str] = &[
    "balancing",
    "balancing.session_affinity",
    "health",
    "engine_metrics",
    "timeouts",
    "protection",
    "protection.ttft",
    "protection.tps",
    "protection.ewma",
    "protection.adaptive",
    "protection.session_prio",
];

fn collect(v: &serde_yaml::Value, prefix: &str, out: &mut Vec<String>) {
    let Some(map) = v.as_mapping() else {
        return;
    };
    for (k, child) in map {
        let Some(k) = k.as_str() else { continue };
        let key = if prefix.is_empty() {
            k.to_string()
        } else {
            format!("{prefix}.{k}")
        };
        // Only the option sections nest; a map-valued option is one key.
        if SECTIONS.contains(&key.as_str()) && child.is_mapping() {
            collect(child, &key, out);
        } else {
            out.push(key);
        }
    }
}
