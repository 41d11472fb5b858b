//! `gateway.yaml` → [`GatewayConfig`]: the process-wide settings.

use super::bodylog::{self, BodylogConfig, BODYLOG_ENV};
use super::file::GatewayFile;
use super::spans::KeyLines;
use super::ConfigError;
use crate::stream::postprocess::Handler;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub const DEFAULT_MAX_BODY_SIZE: u64 = 10 << 20;
pub const DEFAULT_MAX_HEADER_SIZE: usize = 64 << 10;
/// `max_header_size`'s bounds. Under 1 KiB an ordinary client's head (a
/// key, a user agent, a few `x-` headers) would not fit; Pingora refuses
/// heads over 1 MiB itself (with a bare 400), so more would mean nothing.
pub const MAX_HEADER_SIZE_BOUNDS: std::ops::RangeInclusive<usize> = (1 << 10)..=(1 << 20);
pub const DEFAULT_GRACE_PERIOD: Duration = Duration::from_secs(30);
/// How long the `/metrics` series of a peer that left its route stay: past
/// Prometheus' default scrape interval several times over, so a scrape sees
/// their last values, and as long as its staleness window.
pub const DEFAULT_PEER_METRICS_GRACE: Duration = Duration::from_secs(300);
pub const DEFAULT_API_KEYS_FILE: &str = "/etc/llm-gateway/keys/api-keys";
pub const API_KEYS_ENV: &str = "LLM_GATEWAY_API_KEYS_FILE";

/// The validated gateway-wide settings.
#[derive(Debug, Clone)]
pub struct GatewayConfig {
    pub listen: SocketAddr,
    pub admin_listen: SocketAddr,
    pub routes_dir: PathBuf,
    pub api_keys_file: PathBuf,
    /// Whether a missing `api_keys_file` is a fault (logged at ERROR: the
    /// gateway runs without authentication). Not a file option: true
    /// unless the caller says otherwise, as `llm-gateway demo` does, which
    /// runs without keys on purpose.
    pub key_file_expected: bool,
    pub threads: usize,
    /// Whether the proxy's threads steal each other's tasks (Pingora's
    /// default). Off, each client connection stays on the thread it was
    /// given at random: a stream costs fewer instructions (no cross-thread
    /// wake-ups) but one thread can be left with the heavier connections.
    pub work_stealing: bool,
    pub grace_period: Duration,
    /// How long the per-peer `/metrics` series of a peer that left its
    /// route (a rollout's old pod, a peer taken out of the file) stay, with
    /// their last values, before they are removed (`metrics.rs`
    /// `forget_gone_peers`).
    pub peer_metrics_grace: Duration,
    pub max_body_size: u64,
    /// The largest request head (request line, headers, the blank line
    /// after them), in bytes, the gateway serves; a larger one is answered
    /// 431 and never reaches an engine.
    pub max_header_size: usize,
    /// Post-processing handler for routes that name none.
    pub postprocess_default: Option<Handler>,
    /// How long a client's keep-alive connection may sit idle between
    /// requests before the gateway closes it (whole seconds, at least 1).
    pub client_idle_timeout: Duration,
    /// How long a request head may take from its first byte to its blank
    /// line: a client dribbling a head (slowloris) is closed after it.
    pub client_header_timeout: Duration,
    /// Who may read the read-only `/_…` status endpoints on the main listener.
    pub status_endpoints: StatusAccess,
    /// The gateway-wide default of the load-based 429s' master switch.
    pub load_rate_limit: bool,
    /// Reload on a change in `routes_dir` or a key file's directory, as
    /// SIGHUP does (`watch.rs`); SIGHUP works either way.
    pub watch: bool,
    /// Body logging, when a listener is set (file or `BODYLOG_LISTENER_HOST`).
    pub bodylog: Option<BodylogConfig>,
    /// Where session bindings live: this process, or Redis for every replica.
    pub session_store: super::store::SessionStoreConfig,
    /// How engine host names are looked up and how often again.
    pub resolver: super::resolver::ResolverConfig,
    /// A JSON line per finished request, when set (`accesslog/`).
    pub access_log: Option<super::AccessLogConfig>,
    /// TLS on the main listener, when set (`tls.rs`); plain HTTP otherwise.
    pub tls: Option<super::TlsConfig>,
    /// Cleartext HTTP/2 with prior knowledge on a listener without TLS
    /// (over TLS, ALPN offers h2 whatever this says).
    pub h2c: bool,
    /// What the gateway does with W3C trace context (`trace_context.rs`);
    /// `start` unless the file says otherwise when `tracing` is set.
    pub trace_context: super::TraceMode,
    /// OpenTelemetry spans to a collector, when set (`otlp/`).
    pub tracing: Option<super::TracingConfig>,
    /// The tenants file (`config/tenants.rs`), reloaded with the routes;
    /// `None`: tenants are neither limited nor counted (`Tenants::tracked`).
    pub tenants_file: Option<PathBuf>,
    /// Where a request names its tenant when no API key does (keys off).
    pub tenant_header: http::HeaderName,
    /// Who may read the admin listener (`admin:`): everyone, or a bearer
    /// token's holders but on the paths left open.
    pub admin: super::AdminAccess,
}

/// llm-d's name for it (its flow control's fairness id), so that clients
/// written for llm-d's gateway name their tenant here too.
pub const DEFAULT_TENANT_HEADER: &str = "x-gateway-inference-fairness-id";

pub const DEFAULT_CLIENT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
pub const DEFAULT_CLIENT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// `status_endpoints`: who may read the read-only `/_…` endpoints of the
/// main listener (a route's `/<route>/_route_state` and the others,
/// `/_route_inspect`, `/_bodylog_status`). Whatever the mode, engine
/// addresses, the body-log target and key file paths in their answers are
/// shown to loopback callers only, and toggles stay loopback-only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StatusAccess {
    /// Anyone (the default, as before the option existed).
    #[default]
    Open,
    /// A caller with a valid API key for the route (the shared key file
    /// for gateway-wide endpoints), or a loopback caller.
    Key,
    /// Loopback callers only (127.0.0.1, ::1).
    Loopback,
}

impl StatusAccess {
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "open" => Some(StatusAccess::Open),
            "key" => Some(StatusAccess::Key),
            "loopback" => Some(StatusAccess::Loopback),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            StatusAccess::Open => "open",
            StatusAccess::Key => "key",
            StatusAccess::Loopback => "loopback",
        }
    }
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
        let lines = KeyLines::of(text);
        let addr = |key: &str, given: Option<&String>, default: &str| {
            let raw = given.map(String::as_str).unwrap_or(default);
            raw.parse::<SocketAddr>().map_err(|_| {
                ConfigError::new(
                    path,
                    lines.line(key),
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
                lines.line("threads"),
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
                    lines.line("postprocess_default"),
                    format!("postprocess_default: unknown handler {name:?} (strip_actual_usage, vllm_format, none)"),
                )
            })?),
        };
        let client_idle_timeout = file
            .client_idle_timeout
            .map_or(DEFAULT_CLIENT_IDLE_TIMEOUT, |d| d.0);
        if client_idle_timeout < Duration::from_secs(1) || client_idle_timeout.subsec_nanos() != 0 {
            return Err(ConfigError::new(
                path,
                lines.line("client_idle_timeout"),
                "client_idle_timeout must be a whole number of seconds, at least 1s",
            ));
        }
        let client_header_timeout = file
            .client_header_timeout
            .map_or(DEFAULT_CLIENT_HEADER_TIMEOUT, |d| d.0);
        // Under 100 ms a head on a slow link would not make it; over 10
        // minutes the deadline no longer bounds what a slowloris holds.
        if !(Duration::from_millis(100)..=Duration::from_secs(600)).contains(&client_header_timeout)
        {
            return Err(ConfigError::new(
                path,
                lines.line("client_header_timeout"),
                "client_header_timeout must be between 100ms and 10m",
            ));
        }
        let max_header_size = match file.max_header_size.map(|s| usize::try_from(s.0)) {
            None => DEFAULT_MAX_HEADER_SIZE,
            Some(Ok(size)) if MAX_HEADER_SIZE_BOUNDS.contains(&size) => size,
            Some(_) => {
                return Err(ConfigError::new(
                    path,
                    lines.line("max_header_size"),
                    "max_header_size must be between 1k and 1m (the request line and headers, in bytes)",
                ))
            }
        };
        let peer_metrics_grace = file
            .peer_metrics_grace
            .map_or(DEFAULT_PEER_METRICS_GRACE, |d| d.0);
        if peer_metrics_grace > Duration::from_secs(24 * 3600) {
            return Err(ConfigError::new(
                path,
                lines.line("peer_metrics_grace"),
                "peer_metrics_grace must be at most 24h",
            ));
        }
        let status_endpoints = match file.status_endpoints.as_deref() {
            None => StatusAccess::default(),
            Some(name) => StatusAccess::from_name(name).ok_or_else(|| {
                ConfigError::new(
                    path,
                    lines.line("status_endpoints"),
                    format!("status_endpoints: {name:?} is not one of open, key, loopback"),
                )
            })?,
        };
        let tenant_header = file
            .tenant_header
            .as_deref()
            .unwrap_or(DEFAULT_TENANT_HEADER);
        let tenant_header =
            http::HeaderName::from_bytes(tenant_header.as_bytes()).map_err(|_| {
                ConfigError::new(
                    path,
                    lines.line("tenant_header"),
                    format!("tenant_header: {tenant_header:?} is not a header name"),
                )
            })?;
        // With an exporter, a request that brings no trace gets one: its
        // span would otherwise be lost to the collector.
        let trace_context = super::access_log::trace_mode(
            path,
            text,
            file.trace_context.as_deref(),
            file.tracing.is_some(),
        )?;
        let tracing = super::tracing::resolve(path, text, file.tracing.as_ref(), trace_context)?;
        let bodylog_env = std::env::var(BODYLOG_ENV).ok();
        let bodylog = bodylog::resolve(path, text, file.bodylog.as_ref(), bodylog_env.as_deref())?;
        Ok(GatewayConfig {
            watch: file.watch.is_none_or(|f| f.0),
            work_stealing: file.work_stealing.is_none_or(|f| f.0),
            bodylog,
            session_store: super::store::resolve(path, text, file.session_store.as_ref())?,
            resolver: super::resolver::resolve(path, text, file.resolver.as_ref())?,
            access_log: super::access_log::resolve(path, text, file.access_log.as_ref())?,
            tls: super::tls::resolve(path, text, file.tls.as_ref())?,
            admin: super::admin::resolve(path, text, file.admin.as_ref())?,
            trace_context,
            tracing,
            load_rate_limit: file.load_rate_limit.is_none_or(|f| f.0),
            h2c: file.h2c.is_some_and(|f| f.0),
            tenants_file: file.tenants_file,
            tenant_header,
            client_idle_timeout,
            client_header_timeout,
            max_header_size,
            status_endpoints,
            postprocess_default,
            listen,
            admin_listen,
            routes_dir: overrides
                .routes_dir
                .clone()
                .or(file.routes_dir)
                .unwrap_or_else(|| PathBuf::from("routes")),
            api_keys_file,
            key_file_expected: true,
            threads,
            peer_metrics_grace,
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
