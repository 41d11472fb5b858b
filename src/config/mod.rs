//! Configuration: `gateway.yaml` and `routes/<name>.yaml` → validated values.
//!
//! The file formats (`*File` structs, `deny_unknown_fields`) are kept apart from
//! the validated values the rest of the gateway uses (`GatewayConfig`,
//! `RouteConfig`), so defaults and cross-field checks live in one place and
//! nothing downstream has to handle a half-valid config.

mod bodylog;
pub mod catalog;
mod file;
mod gateway;
mod route;
pub mod store;
pub mod units;

pub use bodylog::{BodylogConfig, BodylogTarget, BODYLOG_ENV, DEFAULT_BODYLOG_PORT};
pub use gateway::{
    GatewayConfig, Overrides, StatusAccess, API_KEYS_ENV, DEFAULT_API_KEYS_FILE,
    DEFAULT_CLIENT_HEADER_TIMEOUT, DEFAULT_CLIENT_IDLE_TIMEOUT, DEFAULT_GRACE_PERIOD,
    DEFAULT_MAX_BODY_SIZE,
};
pub use route::{
    route_name_of, valid_route_name, AdaptiveConfig, Balancing, EngineMetricsConfig, HealthConfig,
    Mode, PeerConfig, Protection, RouteConfig, SessionPrio, Timeouts, MAX_IDLE_TIMEOUT,
    MIN_IDLE_TIMEOUT,
};

use std::fmt;
use std::path::{Path, PathBuf};

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
    pub(super) fn new(file: &Path, line: Option<usize>, message: impl Into<String>) -> Self {
        ConfigError {
            file: file.to_path_buf(),
            line,
            message: message.into(),
        }
    }

    /// serde_yaml reports "... at line L column C"; keep its line, drop the
    /// duplicate location from the message.
    pub(super) fn from_yaml(file: &Path, err: serde_yaml::Error) -> Self {
        let line = err.location().map(|l| l.line());
        let mut message = err.to_string();
        if let Some(idx) = message.find(" at line ") {
            message.truncate(idx);
        }
        ConfigError::new(file, line, message)
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
pub(super) fn find_key_line(text: &str, key: &str) -> Option<usize> {
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
pub(super) fn peer_item_line(text: &str, index: usize) -> Option<usize> {
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

/// The top-level keys a route file may hold, as its parser knows them:
/// serde names them all when it refuses an unknown one, so the catalog's
/// coverage test cannot fall behind a field added to `RouteFile`.
#[cfg(test)]
pub(crate) fn route_file_fields() -> Vec<String> {
    let err = serde_yaml::from_str::<file::RouteFile>("__no_such_option__: 1")
        .expect_err("an unknown key is refused");
    let text = err.to_string();
    let list = text.split("expected one of").nth(1).unwrap_or_default();
    list.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod tests;
