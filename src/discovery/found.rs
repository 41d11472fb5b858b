//! What discovery found for one route, kept in its runtime
//! (`RouteRuntime::found`): each host name's address and the endpoints of
//! `peers_from`, with why the last look failed.

use super::kubernetes::Endpoint;
use std::collections::BTreeMap;
use std::net::IpAddr;

/// What discovery last found for one route.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Found {
    /// Each listed peer's host name (not an address) → what it resolved to.
    pub hosts: BTreeMap<String, HostAnswer>,
    /// `peers_from`'s endpoints: None until first found.
    pub set: Option<Vec<Endpoint>>,
    /// Why the last look at `peers_from` failed, if it did (the set found
    /// before stays in force).
    pub set_error: Option<String>,
}

#[derive(Debug, Default, Clone, PartialEq)]
pub struct HostAnswer {
    /// The first of its addresses, sorted; kept when a later lookup fails
    /// (the health probe, not a DNS hiccup, judges the engine).
    pub addr: Option<IpAddr>,
    /// Why the last lookup failed, if it did.
    pub error: Option<String>,
}

impl Found {
    /// Whether `other` gives the route other peers: a changed address
    /// rebuilds the route, an error noted beside the same ones only shows.
    pub(super) fn same_addresses(&self, other: &Found) -> bool {
        self.set == other.set
            && self.hosts.len() == other.hosts.len()
            && self
                .hosts
                .iter()
                .zip(&other.hosts)
                .all(|((h, a), (g, b))| h == g && a.addr == b.addr)
    }

    /// The address `host` stands for: itself when it is one.
    pub fn addr_of(&self, host: &str) -> Option<IpAddr> {
        host.parse()
            .ok()
            .or_else(|| self.hosts.get(host).and_then(|a| a.addr))
    }
}
