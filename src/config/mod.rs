//! Configuration: `gateway.yaml` and `routes/<name>.yaml` → validated values.
//!
//! The file formats (`*File` structs, `deny_unknown_fields`) are kept apart from
//! the validated values the rest of the gateway uses (`GatewayConfig`,
//! `RouteConfig`), so defaults and cross-field checks live in one place and
//! nothing downstream has to handle a half-valid config.

mod access_log;
mod admin;
mod bodylog;
pub mod catalog;
mod error;
mod file;
mod gateway;
pub mod resolver;
mod route;
mod spans;
pub mod store;
pub mod tenants;
mod tls;
mod tracing;
pub mod units;

pub use access_log::{AccessLogConfig, AccessLogTarget, TraceMode, DEFAULT_QUEUE_LINES};
pub use admin::{AdminAccess, ADMIN_PATHS};
pub use bodylog::{BodylogConfig, BodylogTarget, BODYLOG_ENV, DEFAULT_BODYLOG_PORT};
pub use error::ConfigError;
pub use gateway::{
    GatewayConfig, Overrides, StatusAccess, API_KEYS_ENV, DEFAULT_API_KEYS_FILE,
    DEFAULT_CLIENT_HEADER_TIMEOUT, DEFAULT_CLIENT_IDLE_TIMEOUT, DEFAULT_GRACE_PERIOD,
    DEFAULT_MAX_BODY_SIZE, DEFAULT_MAX_HEADER_SIZE, DEFAULT_TENANT_HEADER, MAX_HEADER_SIZE_BOUNDS,
};
pub use route::{
    route_name_of, valid_route_name, AdaptiveConfig, Balancing, ConcurrencyFrom,
    EngineMetricsConfig, HealthConfig, Mode, PeerConfig, PeerSource, PeersFrom, Protection,
    RouteConfig, SessionPrio, Timeouts, DEFAULT_MAX_CONCURRENCY, MAX_IDLE_TIMEOUT,
    MIN_IDLE_TIMEOUT,
};
pub use tls::TlsConfig;
pub use tracing::{CollectorEndpoint, TracingConfig};

use std::path::{Path, PathBuf};

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

/// The keys a route file may hold, as its parser knows them (serde's own
/// field lists): the top level and the `protection:` sections, dotted. The
/// catalog's coverage test then cannot fall behind a field added to a file
/// struct.
#[cfg(test)]
pub(crate) fn route_file_fields() -> Vec<String> {
    use file::{
        AdaptiveFile, EwmaFile, ProtectionFile, RouteFile, SessionPrioFile, TpsFile, TtftFile,
    };
    use serde_aux::serde_introspection::serde_introspect as fields;
    let sections: [(&str, &[&str]); 6] = [
        ("protection", fields::<ProtectionFile>()),
        ("protection.ttft", fields::<TtftFile>()),
        ("protection.tps", fields::<TpsFile>()),
        ("protection.ewma", fields::<EwmaFile>()),
        ("protection.adaptive", fields::<AdaptiveFile>()),
        ("protection.session_prio", fields::<SessionPrioFile>()),
    ];
    let top = fields::<RouteFile>().iter().map(|f| f.to_string());
    let nested = sections
        .iter()
        .flat_map(|(at, names)| names.iter().map(move |f| format!("{at}.{f}")));
    top.chain(nested).collect()
}

#[cfg(test)]
mod tests;
