//! `access_log:` and `trace_context:` in gateway.yaml → whether and where a
//! line per request is written, and what the gateway does with W3C trace
//! context (`trace_context.rs`).

use super::file::AccessLogFile;
use super::spans::KeyLines;
use super::ConfigError;
use std::path::{Path, PathBuf};

/// Lines waiting for the writer at most; more are dropped (counted). At a
/// few hundred bytes a line, 8192 hold a burst of seconds at thousands of
/// requests a second while a slow disk catches up, in a few MiB.
pub const DEFAULT_QUEUE_LINES: usize = 8192;

/// Where access-log lines go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AccessLogTarget {
    /// The process's standard output (its own logs go to standard error).
    Stdout,
    /// A file, appended to, opened again after SIGHUP (log rotation).
    File(PathBuf),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccessLogConfig {
    pub target: AccessLogTarget,
    pub queue_lines: usize,
}

/// `trace_context:` what the gateway does with a request's W3C trace
/// context.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TraceMode {
    /// Continue a valid incoming `traceparent`, else start a trace: the
    /// engine always gets one.
    Start,
    /// Continue a valid incoming `traceparent`; without one the engine
    /// gets none (the default without `tracing:`: a request without a
    /// trace costs nothing more, and with no span exporter a trace started
    /// here would be known only to the engine and the access log).
    #[default]
    Continue,
    /// Neither read nor write trace headers: the client's go to the engine
    /// untouched.
    Off,
}

impl TraceMode {
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "start" => Some(TraceMode::Start),
            "continue" => Some(TraceMode::Continue),
            "off" => Some(TraceMode::Off),
            _ => None,
        }
    }
}

pub(super) fn resolve(
    path: &Path,
    text: &str,
    file: Option<&AccessLogFile>,
) -> Result<Option<AccessLogConfig>, ConfigError> {
    let Some(file) = file else {
        return Ok(None);
    };
    let lines = KeyLines::of(text);
    let target = match file.path.as_deref() {
        None | Some("") | Some("off") => return Ok(None),
        Some("stdout") | Some("-") => AccessLogTarget::Stdout,
        Some(p) => AccessLogTarget::File(PathBuf::from(p)),
    };
    let queue_lines = file.queue_lines.unwrap_or(DEFAULT_QUEUE_LINES);
    if !(1..=1 << 20).contains(&queue_lines) {
        return Err(ConfigError::new(
            path,
            lines.line("access_log.queue_lines"),
            "access_log.queue_lines must be between 1 and 1048576",
        ));
    }
    Ok(Some(AccessLogConfig {
        target,
        queue_lines,
    }))
}

/// `trace_context:` as written, else `start` when spans are exported
/// (`exporting`), else `continue`.
pub(super) fn trace_mode(
    path: &Path,
    text: &str,
    name: Option<&str>,
    exporting: bool,
) -> Result<TraceMode, ConfigError> {
    let Some(name) = name else {
        return Ok(if exporting {
            TraceMode::Start
        } else {
            TraceMode::default()
        });
    };
    TraceMode::from_name(name).ok_or_else(|| {
        ConfigError::new(
            path,
            KeyLines::of(text).line("trace_context"),
            format!("trace_context: {name:?} is not one of start, continue, off"),
        )
    })
}
