//! `peers:` and `peers_by_model:`: the engines and the model pools over them.

use super::Locator;
use super::PeerConfig;
use crate::config::file::PeerFile;
use crate::config::ConfigError;
use std::collections::BTreeMap;

pub(super) fn parse_peers(
    at: &Locator,
    raw: Option<Vec<PeerFile>>,
) -> Result<Vec<PeerConfig>, ConfigError> {
    let raw_peers = match raw {
        Some(p) if !p.is_empty() => p,
        _ => return Err(at.at_key("peers", "peers: a route needs at least one peer".into())),
    };
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
        let port = u16::try_from(p.port)
            .ok()
            .filter(|&port| port != 0)
            .ok_or_else(|| {
                at.error(
                    line,
                    format!(
                        "peers[{i}] {}: port {} out of range 1..65535",
                        p.name, p.port
                    ),
                )
            })?;
        let max_concurrency = match p.max_concurrency {
            None => 64,
            Some(n) if (1..=1_000_000).contains(&n) => n as u32,
            Some(n) => {
                return Err(at.error(
                    line,
                    format!(
                        "peers[{i}] {}: max_concurrency {n} out of range 1..1000000",
                        p.name
                    ),
                ))
            }
        };
        if let Some(path) = &p.probe_path {
            if !path.starts_with('/') {
                return Err(at.error(
                    line,
                    format!("peers[{i}] {}: probe_path must start with '/'", p.name),
                ));
            }
        }
        let peer = PeerConfig {
            name: p.name,
            host: p.host,
            port,
            priority: p.priority.unwrap_or(0),
            max_concurrency,
            probe_path: p.probe_path,
            kv_capacity_tokens: p.kv_capacity_tokens.filter(|&n| n > 0),
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
