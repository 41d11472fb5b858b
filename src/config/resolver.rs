//! `resolver:` in gateway.yaml → how engine host names are looked up and
//! how often they are looked up again (`discovery/`).

use super::file::ResolverFile;
use super::spans::KeyLines;
use super::ConfigError;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A record's TTL is kept within these bounds: under the floor a name
/// with TTL 0 would be looked up on every pass; over the ceiling an
/// engine that moved would be dialled at its old address for hours.
pub const DEFAULT_MIN_TTL: Duration = Duration::from_secs(5);
pub const DEFAULT_MAX_TTL: Duration = Duration::from_secs(60);
/// Where names are looked up before any name server, as glibc does.
pub const DEFAULT_HOSTS_FILE: &str = "/etc/hosts";

#[derive(Debug, Clone, PartialEq)]
pub struct ResolverConfig {
    /// Name servers to ask (UDP, then TCP); empty: the system's
    /// (`/etc/resolv.conf`, and `/etc/hosts` first).
    pub nameservers: Vec<SocketAddr>,
    pub min_ttl: Duration,
    pub max_ttl: Duration,
    /// Answered before any name server, and read again when it changes
    /// (`discovery/resolver.rs`).
    pub hosts_file: PathBuf,
}

impl Default for ResolverConfig {
    fn default() -> Self {
        ResolverConfig {
            nameservers: Vec::new(),
            min_ttl: DEFAULT_MIN_TTL,
            max_ttl: DEFAULT_MAX_TTL,
            hosts_file: PathBuf::from(DEFAULT_HOSTS_FILE),
        }
    }
}

impl ResolverConfig {
    /// When a lookup valid for `ttl` is next repeated.
    pub fn next_lookup(&self, ttl: Duration) -> Duration {
        ttl.clamp(self.min_ttl, self.max_ttl)
    }
}

pub(super) fn resolve(
    path: &Path,
    text: &str,
    file: Option<&ResolverFile>,
) -> Result<ResolverConfig, ConfigError> {
    let Some(file) = file else {
        return Ok(ResolverConfig::default());
    };
    let lines = KeyLines::of(text);
    let mut nameservers = Vec::new();
    for server in file.nameservers.iter().flatten() {
        let addr = server
            .parse::<SocketAddr>()
            .or_else(|_| server.parse().map(|ip| SocketAddr::new(ip, 53)))
            .map_err(|_| {
                ConfigError::new(
                    path,
                    lines.line("resolver.nameservers"),
                    format!("resolver.nameservers: {server:?} is not an IP address (with or without :port)"),
                )
            })?;
        nameservers.push(addr);
    }
    let min_ttl = file.min_ttl.map_or(DEFAULT_MIN_TTL, |d| d.0);
    let max_ttl = file.max_ttl.map_or(DEFAULT_MAX_TTL, |d| d.0);
    if min_ttl < Duration::from_millis(100)
        || max_ttl > Duration::from_secs(3600)
        || min_ttl > max_ttl
    {
        return Err(ConfigError::new(
            path,
            lines.line("resolver"),
            "resolver: min_ttl and max_ttl must satisfy 100ms <= min_ttl <= max_ttl <= 1h",
        ));
    }
    Ok(ResolverConfig {
        nameservers,
        min_ttl,
        max_ttl,
        hosts_file: file
            .hosts_file
            .clone()
            .unwrap_or_else(|| PathBuf::from(DEFAULT_HOSTS_FILE)),
    })
}
