//! The route file's other sections: balancing, health, engine metrics,
//! timeouts, reject rules and post-processing.

use super::locator::Locator;
use super::settings::{
    Balancing, EngineMetricsConfig, HealthConfig, Mode, Timeouts, DEFAULT_LIVE_WINDOW,
    MAX_IDLE_TIMEOUT, MIN_IDLE_TIMEOUT,
};
use crate::config::file::{
    BalancingFile, ContentFile, EngineMetricsFile, EngineMetricsSettingsFile, HealthFile,
    TimeoutsFile,
};
use crate::config::gateway::GatewayConfig;
use crate::config::units::flag;
use crate::config::units::Flag;
use crate::config::ConfigError;
use crate::session::content::ContentConfig;
use crate::stream::postprocess::Handler;
use std::time::Duration;

pub(super) fn parse_balancing(
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

    let content = parse_content(at, mode, affinity.content, idle_timeout)?;
    Ok(Balancing {
        mode,
        session_headers,
        idle_timeout,
        live_window,
        cross_tier_fallback: flag(bal.cross_tier_fallback, false),
        content,
    })
}

/// Content recognition: on by default in the modes that keep sessions.
fn parse_content(
    at: &Locator,
    mode: Mode,
    file: Option<ContentFile>,
    idle_timeout: Duration,
) -> Result<Option<ContentConfig>, ConfigError> {
    let settings = match file {
        Some(ContentFile::Switch(Flag(false))) => return Ok(None),
        Some(ContentFile::Switch(Flag(true))) | None => Default::default(),
        Some(ContentFile::Settings(s)) => s,
    };
    if !matches!(mode, Mode::LoadAware | Mode::Hash) {
        return Ok(None);
    }
    let defaults = ContentConfig::default();
    let max_nodes = settings.max_blocks.unwrap_or(defaults.max_nodes);
    if !(1_000..=50_000_000).contains(&max_nodes) {
        return Err(at.at_key(
            "balancing.session_affinity.content.max_blocks",
            "balancing.session_affinity.content.max_blocks must be between 1000 and 50000000"
                .into(),
        ));
    }
    Ok(Some(ContentConfig {
        template_fanout: settings.template_fanout.unwrap_or(defaults.template_fanout),
        idle_ms: u64::try_from(idle_timeout.as_millis()).unwrap_or(u64::MAX),
        max_nodes,
    }))
}

pub(super) fn parse_health(at: &Locator, h: HealthFile) -> Result<HealthConfig, ConfigError> {
    let health = HealthConfig {
        enabled: h.enabled.map(|f| f.0).unwrap_or(true),
        interval: h.interval.map(|d| d.0).unwrap_or(Duration::from_secs(5)),
        ban_ttl: h.ban_ttl.map(|d| d.0).unwrap_or(Duration::from_secs(30)),
        probe_path: h.probe_path.unwrap_or_else(|| "/health".into()),
        timeout: h.timeout.map(|d| d.0).unwrap_or(Duration::from_secs(2)),
    };
    // Named as the file wrote them: `health_check_interval` and
    // `health_probe_path` are the OpenResty gateway's spellings.
    if health.interval < Duration::from_millis(50) {
        let key = "health.interval";
        return Err(at.at_key(key, format!("{} must be at least 50ms", at.written(key))));
    }
    if !health.probe_path.starts_with('/') {
        let key = "health.probe_path";
        return Err(at.at_key(key, format!("{} must start with '/'", at.written(key))));
    }

    Ok(health)
}

pub(super) fn parse_engine_metrics(
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

pub(super) fn parse_timeouts(t: TimeoutsFile) -> Timeouts {
    Timeouts {
        connect: t.connect.map(|d| d.0).unwrap_or(Duration::from_secs(5)),
        read: t.read.map(|d| d.0).unwrap_or(Duration::from_secs(600)),
        idle: t.idle.map(|d| d.0).unwrap_or(Duration::from_secs(60)),
    }
}

pub(super) fn parse_reject_rules(
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

pub(super) fn parse_postprocess(
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
