//! `bodylog:` in gateway.yaml (and `BODYLOG_LISTENER_HOST`) → where body-log
//! frames go, or nothing at all.

use super::file::BodylogFile;
use super::spans::KeyLines;
use super::ConfigError;
use std::fmt;
use std::path::Path;

pub const BODYLOG_ENV: &str = "BODYLOG_LISTENER_HOST";
pub const DEFAULT_BODYLOG_PORT: u16 = 9999;
pub const DEFAULT_QUEUE_FRAMES: usize = 1024;
pub const DEFAULT_QUEUE_BYTES: u64 = 64 << 20;

/// Where the listener is: a host name or IP, resolved at every connect (a
/// Kubernetes Service name keeps working when its pod moves).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BodylogTarget {
    pub host: String,
    pub port: u16,
}

impl fmt::Display for BodylogTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

impl BodylogTarget {
    /// `host[:port]`, `[v6][:port]` or a bare IPv6 address; the port
    /// defaults to 9999.
    pub fn parse(text: &str) -> Result<Self, String> {
        let text = text.trim();
        let bad = || format!("{text:?} is not host[:port] (e.g. bodylog:9999)");
        let (host, port) = if let Some(rest) = text.strip_prefix('[') {
            let (host, after) = rest.split_once(']').ok_or_else(bad)?;
            match after {
                "" => (host, None),
                _ => (host, Some(after.strip_prefix(':').ok_or_else(bad)?)),
            }
        } else if text.parse::<std::net::Ipv6Addr>().is_ok() {
            (text, None)
        } else {
            match text.rsplit_once(':') {
                Some((host, port)) => (host, Some(port)),
                None => (text, None),
            }
        };
        let port = match port {
            None => DEFAULT_BODYLOG_PORT,
            Some(p) => p.parse::<u16>().ok().filter(|&p| p > 0).ok_or_else(bad)?,
        };
        let plausible = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_' | b':');
        if host.is_empty() || !host.bytes().all(plausible) {
            return Err(bad());
        }
        Ok(BodylogTarget {
            host: host.to_string(),
            port,
        })
    }
}

/// Body logging as configured; absent when no listener is set.
#[derive(Debug, Clone, PartialEq)]
pub struct BodylogConfig {
    pub target: BodylogTarget,
    /// Frames waiting for the sender at most; past it new frames are dropped.
    pub queue_frames: usize,
    /// Bytes waiting for the sender at most (a frame can be ~4 MiB).
    pub queue_bytes: u64,
    /// Percentage of proxied requests captured (a runtime toggle may override).
    pub sample_pct: u8,
}

/// The env value wins over the file's `listener` (an empty one counts as
/// unset); the other keys only apply when some listener is set.
pub(super) fn resolve(
    path: &Path,
    text: &str,
    file: Option<&BodylogFile>,
    env: Option<&str>,
) -> Result<Option<BodylogConfig>, ConfigError> {
    let at = |key: &str, message: String| {
        ConfigError::new(
            path,
            KeyLines::of(text).line(&format!("bodylog.{key}")),
            format!("bodylog.{message}"),
        )
    };
    let queue_frames = file.and_then(|f| f.queue_frames);
    if queue_frames == Some(0) {
        return Err(at("queue_frames", "queue_frames must be at least 1".into()));
    }
    let queue_bytes = file.and_then(|f| f.queue_bytes.as_ref()).map(|s| s.0);
    if queue_bytes.is_some_and(|b| b < 1 << 20) {
        return Err(at("queue_bytes", "queue_bytes must be at least 1m".into()));
    }
    let sample_pct = match file.and_then(|f| f.sample_pct) {
        None => 100,
        Some(p) if (0..=100).contains(&p) => p as u8,
        Some(p) => {
            return Err(at(
                "sample_pct",
                format!("sample_pct: {p} is not a percentage (0-100)"),
            ))
        }
    };
    let env = env.map(str::trim).filter(|v| !v.is_empty());
    let target = match (env, file.and_then(|f| f.listener.as_deref())) {
        (Some(value), _) => BodylogTarget::parse(value).map_err(|e| {
            ConfigError::new(Path::new(BODYLOG_ENV), None, format!("environment: {e}"))
        })?,
        (None, Some(value)) if !value.trim().is_empty() => {
            BodylogTarget::parse(value).map_err(|e| at("listener", format!("listener: {e}")))?
        }
        _ => return Ok(None),
    };
    Ok(Some(BodylogConfig {
        target,
        queue_frames: queue_frames.unwrap_or(DEFAULT_QUEUE_FRAMES),
        queue_bytes: queue_bytes.unwrap_or(DEFAULT_QUEUE_BYTES),
        sample_pct,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(text: &str) -> Result<(String, u16), String> {
        BodylogTarget::parse(text).map(|t| (t.host, t.port))
    }

    #[test]
    fn targets_take_host_and_optional_port() {
        assert_eq!(target("bodylog"), Ok(("bodylog".into(), 9999)));
        assert_eq!(target(" 10.0.0.5:7000 "), Ok(("10.0.0.5".into(), 7000)));
        assert_eq!(target("[::1]:7000"), Ok(("::1".into(), 7000)));
        assert_eq!(target("[::1]"), Ok(("::1".into(), 9999)));
        assert_eq!(target("::1"), Ok(("::1".into(), 9999)));
        for bad in [
            "",
            ":80",
            "h:0",
            "h:70000",
            "h:x",
            "tcp://h:1",
            "h 1",
            "[::1",
            "[::1]x",
        ] {
            assert!(target(bad).is_err(), "{bad:?}");
        }
        let shown = BodylogTarget::parse("[::1]:5").unwrap().to_string();
        assert_eq!(shown, "[::1]:5");
    }

    fn file(yaml: &str) -> BodylogFile {
        serde_yaml::from_str(yaml).unwrap()
    }

    #[test]
    fn env_overrides_the_file_and_unset_means_off() {
        let p = Path::new("g.yaml");
        let f = file("listener: a:1\n");
        let from_file = resolve(p, "", Some(&f), None).unwrap().unwrap();
        assert_eq!(from_file.target.to_string(), "a:1");
        assert_eq!(from_file.sample_pct, 100);
        let from_env = resolve(p, "", Some(&f), Some("b")).unwrap().unwrap();
        assert_eq!(from_env.target.to_string(), "b:9999");
        assert_eq!(resolve(p, "", None, None).unwrap(), None);
        assert_eq!(resolve(p, "", None, Some("  ")).unwrap(), None);
        let only_env = resolve(p, "", None, Some("c:2")).unwrap().unwrap();
        assert_eq!(only_env.queue_frames, DEFAULT_QUEUE_FRAMES);
        let e = resolve(p, "", None, Some("c:x")).unwrap_err();
        assert!(e.to_string().contains(BODYLOG_ENV), "{e}");
    }

    #[test]
    fn bad_values_name_their_line() {
        let p = Path::new("g.yaml");
        for (yaml, key) in [
            ("bodylog:\n  listener: \"h:0\"\n", "listener"),
            ("bodylog:\n  listener: h\n  sample_pct: 101\n", "sample_pct"),
            (
                "bodylog:\n  listener: h\n  queue_frames: 0\n",
                "queue_frames",
            ),
            (
                "bodylog:\n  listener: h\n  queue_bytes: 1k\n",
                "queue_bytes",
            ),
        ] {
            let section: std::collections::BTreeMap<String, BodylogFile> =
                serde_yaml::from_str(yaml).unwrap();
            let e = resolve(p, yaml, section.get("bodylog"), None).unwrap_err();
            let line = yaml.lines().position(|l| l.trim_start().starts_with(key));
            assert_eq!(e.line, line.map(|l| l + 1), "{yaml}: {e}");
            assert!(e.message.contains(key), "{e}");
        }
    }
}
