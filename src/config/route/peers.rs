//! `peers:`, `peers_from:` and `peers_by_model:`: the engines, the set
//! they are discovered from, and the model pools over them.

use super::locator::Locator;
use super::settings::{
    ConcurrencyFrom, PeerConfig, PeerSource, PeersFrom, DEFAULT_MAX_CONCURRENCY,
};
use crate::config::file::{PeerFile, PeerTlsFile, PeersFromFile};
use crate::config::units::flag;
use crate::config::ConfigError;
use crate::discovery::kubernetes::{KubernetesSource, PortRef};
use crate::engine_tls::{EngineTls, TlsSettings, NO_TLS};
use std::collections::BTreeMap;
use std::sync::Arc;

/// The listed peers. None listed and no `peers_from` is not an error: the
/// route loads and answers 503 until a reload gives it some, as the
/// OpenResty gateway degrades an empty route (a route file written ahead of
/// its engines); the warning says so at load and in `check`.
pub(super) fn parse_peers(
    at: &Locator,
    raw: Option<Vec<PeerFile>>,
    discovered: bool,
    warnings: &mut Vec<String>,
) -> Result<Vec<PeerConfig>, ConfigError> {
    let raw_peers = raw.unwrap_or_default();
    if raw_peers.is_empty() && !discovered {
        warnings.push(
            "the route has no peers: it answers 503 (no_healthy_upstream) until a reload lists some under peers (or peers_from finds them)".into(),
        );
    }
    let mut peers: Vec<PeerConfig> = Vec::with_capacity(raw_peers.len());
    for (i, p) in raw_peers.into_iter().enumerate() {
        let line = at.line(&format!("peers[{i}]"));
        if p.name.trim().is_empty() {
            return Err(at.error(line, format!("peers[{i}]: name must not be empty")));
        }
        if p.host.trim().is_empty() {
            return Err(at.error(
                line,
                format!("peers[{i}] {}: host must not be empty", p.name),
            ));
        }
        let what = format!("peers[{i}] {}", p.name);
        let port = port(at, line, &what, p.port)?;
        let (max_concurrency, max_concurrency_from) =
            max_concurrency(at, line, &what, p.max_concurrency)?;
        probe_path(at, line, &what, p.probe_path.as_deref())?;
        let tls_line = at.line(&format!("peers[{i}].tls")).or(line);
        let tls = peer_tls(at, tls_line, &what, p.tls, Some(&p.host))?;
        let peer = PeerConfig {
            name: p.name,
            host: p.host,
            port,
            priority: p.priority.unwrap_or(0),
            max_concurrency,
            max_concurrency_from,
            probe_path: p.probe_path,
            kv_capacity_tokens: p.kv_capacity_tokens.filter(|&n| n > 0),
            tls,
        };
        if let Some(prev) = peers.iter().find(|q| q.name == peer.name) {
            return Err(at.error(
                line,
                format!(
                    "peers[{i}]: duplicate peer name {:?} (also {})",
                    peer.name,
                    prev.address()
                ),
            ));
        }
        if peers.iter().any(|q| q.address() == peer.address()) {
            return Err(at.error(
                line,
                format!(
                    "peers[{i}] {}: duplicate peer address {}",
                    peer.name,
                    peer.address()
                ),
            ));
        }
        peers.push(peer);
    }

    Ok(peers)
}

/// A peer's `max_concurrency` and where it comes from: the default
/// unless set (the engine's slots may take its place when the route is
/// built: [`PeerConfig::with_engine_slots`]).
fn max_concurrency(
    at: &Locator,
    line: Option<usize>,
    what: &str,
    raw: Option<i64>,
) -> Result<(u32, ConcurrencyFrom), ConfigError> {
    match raw {
        None => Ok((DEFAULT_MAX_CONCURRENCY, ConcurrencyFrom::Default)),
        Some(n) if (1..=1_000_000).contains(&n) => Ok((n as u32, ConcurrencyFrom::Route)),
        Some(n) => Err(at.error(
            line,
            format!("{what}: max_concurrency {n} out of range 1..1000000"),
        )),
    }
}

fn probe_path(
    at: &Locator,
    line: Option<usize>,
    what: &str,
    path: Option<&str>,
) -> Result<(), ConfigError> {
    match path {
        Some(path) if !path.starts_with('/') => {
            Err(at.error(line, format!("{what}: probe_path must start with '/'")))
        }
        _ => Ok(()),
    }
}

fn port(at: &Locator, line: Option<usize>, what: &str, raw: i64) -> Result<u16, ConfigError> {
    u16::try_from(raw)
        .ok()
        .filter(|&port| port != 0)
        .ok_or_else(|| at.error(line, format!("{what}: port {raw} out of range 1..65535")))
}

/// `peers_from:`: where the route's discovered peers come from, and the
/// settings each of them gets.
pub(super) fn parse_peers_from(
    at: &Locator,
    raw: Option<PeersFromFile>,
) -> Result<Option<PeersFrom>, ConfigError> {
    let Some(raw) = raw else { return Ok(None) };
    let line = at.line("peers_from");
    let what = "peers_from";
    let source = match (raw.dns, raw.kubernetes) {
        (Some(name), None) => {
            let name = name.trim().trim_end_matches('.').to_string();
            if name.is_empty() || name.parse::<std::net::IpAddr>().is_ok() {
                return Err(at.error(line, "peers_from.dns: a host name, not an address".into()));
            }
            let Some(p) = raw.port else {
                return Err(at.error(line, "peers_from.dns needs port: the engines' port".into()));
            };
            PeerSource::Dns {
                name,
                port: port(at, line, what, p)?,
            }
        }
        (None, Some(k)) => {
            if raw.port.is_some() {
                return Err(at.error(
                    line,
                    "peers_from: with kubernetes, the port goes under kubernetes.port".into(),
                ));
            }
            let port =
                match &k.port {
                    serde_yaml::Value::Number(n) => {
                        PortRef::Number(port(at, line, what, n.as_i64().unwrap_or(-1))?)
                    }
                    serde_yaml::Value::String(name) if !name.trim().is_empty() => {
                        PortRef::Name(name.trim().to_string())
                    }
                    _ => return Err(at.error(
                        line,
                        "peers_from.kubernetes.port: a port number or the name of the slices' port"
                            .into(),
                    )),
                };
            if k.namespace.trim().is_empty() || k.selector.trim().is_empty() {
                return Err(at.error(
                    line,
                    "peers_from.kubernetes: namespace and selector must not be empty".into(),
                ));
            }
            if let Some(api) = &k.api {
                if !(api.starts_with("http://") || api.starts_with("https://")) {
                    return Err(at.error(
                        line,
                        format!(
                            "peers_from.kubernetes.api: {api:?} is not an http:// or https:// URL"
                        ),
                    ));
                }
            }
            if let Some(dir) = &k.service_account_dir {
                // The gateway's working directory is wherever it was started
                // from, not the route file's; a relative path would follow it.
                if !dir.is_absolute() {
                    return Err(at.error(
                        line,
                        format!(
                            "peers_from.kubernetes.service_account_dir: {} is not an absolute path",
                            dir.display()
                        ),
                    ));
                }
                // An http:// API is reached without a token or a CA: the key
                // would be read by nothing, and its writer would believe otherwise.
                if k.api.as_deref().is_some_and(|a| a.starts_with("http://")) {
                    return Err(at.error(
                        line,
                        "peers_from.kubernetes.service_account_dir: an http:// api uses no token \
                         nor CA; only in-cluster or an https:// api does"
                            .into(),
                    ));
                }
            }
            PeerSource::Kubernetes(KubernetesSource {
                namespace: k.namespace.trim().to_string(),
                selector: k.selector.trim().to_string(),
                port,
                api: k.api.map(|a| a.trim_end_matches('/').to_string()),
                service_account_dir: k.service_account_dir,
            })
        }
        _ => return Err(at.error(line, "peers_from: exactly one of dns or kubernetes".into())),
    };
    probe_path(at, line, what, raw.probe_path.as_deref())?;
    let (max_concurrency, max_concurrency_from) =
        max_concurrency(at, line, what, raw.max_concurrency)?;
    // A DNS name is the engines' name; an endpoint slice's addresses are
    // all there is without `sni`.
    let default_sni = match &source {
        PeerSource::Dns { name, .. } => Some(name.as_str()),
        PeerSource::Kubernetes(_) => None,
    };
    let tls_line = at.line("peers_from.tls").or(line);
    let tls = peer_tls(at, tls_line, what, raw.tls, default_sni)?;
    Ok(Some(PeersFrom {
        source,
        priority: raw.priority.unwrap_or(0),
        max_concurrency,
        max_concurrency_from,
        probe_path: raw.probe_path,
        kv_capacity_tokens: raw.kv_capacity_tokens.filter(|&n| n > 0),
        tls,
    }))
}

/// A peer's `tls:` (or `peers_from`'s), its files read now: an error names
/// the file and why. `default_sni`: the name checked when `sni` is not set.
/// A build without TLS refuses it rather than reach the engine in plain
/// text.
fn peer_tls(
    at: &Locator,
    line: Option<usize>,
    what: &str,
    raw: Option<PeerTlsFile>,
    default_sni: Option<&str>,
) -> Result<Option<Arc<EngineTls>>, ConfigError> {
    let Some(raw) = raw else { return Ok(None) };
    if !cfg!(feature = "tls") {
        return Err(at.error(line, format!("{what}: tls: {NO_TLS}")));
    }
    let sni = raw
        .sni
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .or(default_sni.map(str::to_string));
    let settings = TlsSettings {
        sni,
        ca_file: raw.ca_file,
        client_cert: raw.client_cert,
        client_key: raw.client_key,
        verify: flag(raw.verify, true),
    };
    EngineTls::load(settings)
        .map(|tls| Some(Arc::new(tls)))
        .map_err(|e| at.error(line, format!("{what}: tls: {e}")))
}

pub(super) fn parse_model_pools(
    at: &Locator,
    peers: &[PeerConfig],
    raw: Option<BTreeMap<String, Vec<String>>>,
) -> Result<Vec<(String, Vec<usize>)>, ConfigError> {
    let mut peers_by_model = Vec::new();
    for (model, names) in raw.unwrap_or_default() {
        let line = at.line(&format!("peers_by_model.{model}"));
        if names.is_empty() {
            return Err(at.error(line, format!("peers_by_model.{model}: lists no peers")));
        }
        let mut idx = Vec::with_capacity(names.len());
        for n in names {
            match peers.iter().position(|p| p.name == n) {
                Some(i) if !idx.contains(&i) => idx.push(i),
                Some(_) => {
                    return Err(at.error(
                        line,
                        format!("peers_by_model.{model}: peer {n:?} listed twice"),
                    ))
                }
                None => {
                    return Err(
                        at.error(line, format!("peers_by_model.{model}: unknown peer {n:?}"))
                    )
                }
            }
        }
        peers_by_model.push((model, idx));
    }

    Ok(peers_by_model)
}
