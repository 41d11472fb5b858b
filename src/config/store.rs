//! `session_store:` in gateway.yaml → where session bindings live: this
//! process's table (`local`, the default and the fallback) or Redis, shared
//! by every replica.

use super::file::SessionStoreFile;
use super::spans::KeyLines;
use super::ConfigError;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub const DEFAULT_KEY_PREFIX: &str = "llmgw:";
pub const DEFAULT_STORE_TIMEOUT: Duration = Duration::from_millis(20);
/// How often a replica publishes its load and reads the others': at 250 ms,
/// two replicas' TTFT p95 on the agent replay was 12-16 % over one
/// replica's, at 50 ms level with it (BENCHMARKS.md, scale-out).
pub const DEFAULT_SYNC_INTERVAL: Duration = Duration::from_millis(50);

#[derive(Debug, Clone, PartialEq)]
pub enum SessionStoreConfig {
    Local,
    Redis(RedisStoreConfig),
}

#[derive(Debug, Clone, PartialEq)]
pub struct RedisStoreConfig {
    /// `redis://host:port/db` (or `rediss://`); credentials, if any, come
    /// from `username` and `password_file`, never from a logged URL.
    pub url: String,
    pub username: Option<String>,
    pub password_file: Option<PathBuf>,
    pub key_prefix: String,
    /// The most a request waits on Redis before it is placed from the local
    /// table instead.
    pub timeout: Duration,
    pub pool_size: usize,
    /// How often this replica publishes its load and reads the others'.
    pub sync_interval: Duration,
    /// A first placement's claim is read back by the other replicas' next
    /// first placements until a sync has carried it (`balance/shared.rs`);
    /// off only to measure what that is worth.
    pub share_claims: bool,
}

pub(super) fn resolve(
    path: &Path,
    text: &str,
    file: Option<&SessionStoreFile>,
) -> Result<SessionStoreConfig, ConfigError> {
    let Some(file) = file else {
        return Ok(SessionStoreConfig::Local);
    };
    // `key` within the section; "" for the section itself.
    let at = |key: &str, message: String| {
        let place = match key {
            "" => "session_store".to_string(),
            key => format!("session_store.{key}"),
        };
        ConfigError::new(path, KeyLines::of(text).line(&place), message)
    };
    match file.kind.as_deref().map(str::trim) {
        None | Some("local") => Ok(SessionStoreConfig::Local),
        Some("redis") => {
            let url = file
                .url
                .clone()
                .ok_or_else(|| at("", "session_store.kind redis needs a url".into()))?;
            let client = redis::Client::open(url.as_str());
            if let Err(e) = client {
                return Err(at(
                    "url",
                    format!("session_store.url is not a Redis URL: {:?}", e.kind()),
                ));
            }
            if url.contains('@') {
                return Err(at(
                    "url",
                    "session_store.url must not carry credentials (they would reach logs): use username and password_file".into(),
                ));
            }
            let timeout = file.timeout.map_or(DEFAULT_STORE_TIMEOUT, |d| d.0);
            if timeout.is_zero() || timeout > Duration::from_secs(5) {
                return Err(at(
                    "timeout",
                    "session_store.timeout must be between 1ms and 5s".into(),
                ));
            }
            let pool_size = file.pool_size.unwrap_or(1);
            if pool_size == 0 || pool_size > 64 {
                return Err(at(
                    "pool_size",
                    "session_store.pool_size must be between 1 and 64".into(),
                ));
            }
            let sync_interval = file.sync_interval.map_or(DEFAULT_SYNC_INTERVAL, |d| d.0);
            if sync_interval < Duration::from_millis(10) || sync_interval > Duration::from_secs(60)
            {
                return Err(at(
                    "sync_interval",
                    "session_store.sync_interval must be between 10ms and 60s".into(),
                ));
            }
            Ok(SessionStoreConfig::Redis(RedisStoreConfig {
                url,
                username: file.username.clone(),
                password_file: file.password_file.clone(),
                key_prefix: file
                    .key_prefix
                    .clone()
                    .unwrap_or_else(|| DEFAULT_KEY_PREFIX.into()),
                timeout,
                pool_size,
                sync_interval,
                share_claims: super::units::flag(file.share_claims, true),
            }))
        }
        Some(other) => Err(at(
            "kind",
            format!("session_store.kind {other:?} is not local or redis"),
        )),
    }
}
