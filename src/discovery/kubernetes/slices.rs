//! The API's EndpointSlices as a list or a watch event gives them (only
//! the fields read), and the ready endpoints the slices add up to.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};

use serde::Deserialize;
use serde_json::value::RawValue;

use super::source::{Endpoint, PortRef};

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Meta {
    #[serde(default)]
    pub(super) name: String,
    #[serde(default)]
    pub(super) resource_version: String,
}

#[derive(Debug, Deserialize)]
pub(super) struct SliceList {
    #[serde(default)]
    pub(super) metadata: Meta,
    // `null` for an empty list in some servers' encodings.
    #[serde(default)]
    pub(super) items: Option<Vec<Slice>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Slice {
    #[serde(default)]
    pub(super) metadata: Meta,
    #[serde(default)]
    pub(super) address_type: String,
    // Go encodes an empty slice as `null`.
    #[serde(default)]
    pub(super) endpoints: Option<Vec<SliceEndpoint>>,
    #[serde(default)]
    pub(super) ports: Option<Vec<SlicePort>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct SliceEndpoint {
    #[serde(default)]
    pub(super) addresses: Vec<String>,
    #[serde(default)]
    pub(super) conditions: Conditions,
    #[serde(default)]
    pub(super) target_ref: Option<TargetRef>,
}

#[derive(Debug, Default, Deserialize)]
pub(super) struct Conditions {
    #[serde(default)]
    pub(super) ready: Option<bool>,
    #[serde(default)]
    pub(super) terminating: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
pub(super) struct TargetRef {
    #[serde(default)]
    pub(super) kind: String,
    #[serde(default)]
    pub(super) name: String,
}

#[derive(Debug, Default, Deserialize)]
pub(super) struct SlicePort {
    #[serde(default)]
    pub(super) name: Option<String>,
    #[serde(default)]
    pub(super) port: Option<i64>,
}

#[derive(Debug, Deserialize)]
pub(super) struct WatchEvent<'a> {
    #[serde(rename = "type")]
    pub(super) kind: String,
    #[serde(borrow)]
    pub(super) object: &'a RawValue,
}

/// The object of an ERROR event, and the body of a refused request.
#[derive(Debug, Default, Deserialize)]
pub(super) struct Status {
    #[serde(default)]
    pub(super) code: u16,
    #[serde(default)]
    pub(super) reason: String,
    #[serde(default)]
    pub(super) message: String,
}

// ---- the pure part: slices to endpoints, events applied ----

/// The ready endpoints of one slice, for the port asked for.
pub(super) fn slice_endpoints(slice: &Slice, port: &PortRef) -> Vec<Endpoint> {
    // FQDN slices are deprecated and have no defined semantics.
    if !matches!(slice.address_type.as_str(), "IPv4" | "IPv6") {
        return Vec::new();
    }
    let port = match port {
        PortRef::Number(n) => *n,
        PortRef::Name(wanted) => {
            // An unnamed port's name is "" (the API's default).
            let found = slice
                .ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref().unwrap_or("") == wanted)
                .and_then(|p| p.port)
                .and_then(|p| u16::try_from(p).ok())
                .filter(|p| *p != 0);
            match found {
                Some(p) => p,
                None => return Vec::new(),
            }
        }
    };
    let mut out = Vec::new();
    for endpoint in slice.endpoints.iter().flatten() {
        // `ready` unset means ready, `terminating` unset means not (the
        // EndpointConditions docs). `ready` already excludes terminating pods,
        // except where the Service publishes not-ready addresses; a pod on its
        // way out is skipped even then, since a session placed on it is lost.
        let ready = endpoint.conditions.ready.unwrap_or(true);
        let terminating = endpoint.conditions.terminating.unwrap_or(false);
        if !ready || terminating {
            continue;
        }
        let pod = endpoint
            .target_ref
            .as_ref()
            .filter(|t| t.kind == "Pod" && !t.name.is_empty())
            .map(|t| t.name.as_str());
        for address in &endpoint.addresses {
            let Ok(ip) = address.parse::<IpAddr>() else {
                log::debug!(
                    "kubernetes discovery: slice {}: {address:?} is not an IP address",
                    slice.metadata.name
                );
                continue;
            };
            let addr = SocketAddr::new(ip, port);
            out.push(Endpoint {
                name: pod.map_or_else(|| addr.to_string(), str::to_string),
                addr,
            });
        }
    }
    out
}

/// What one watch event did.
#[derive(Debug, PartialEq)]
pub(super) enum Applied {
    /// A slice added, changed or deleted, a bookmark, or an event of a type
    /// not known here; the stream is now at this resourceVersion, if it said.
    At(Option<String>),
    /// 410: the version watched from is too old; only a new LIST helps.
    Gone,
    /// An ERROR event other than 410, or a line that is not an event.
    Failed(String),
}

/// The matching slices' ready endpoints, by slice name.
#[derive(Debug, Default)]
pub(super) struct Slices {
    pub(super) by_name: HashMap<String, Vec<Endpoint>>,
}

impl Slices {
    pub(super) fn from_list(items: &[Slice], port: &PortRef) -> Slices {
        let by_name = items
            .iter()
            .map(|s| (s.metadata.name.clone(), slice_endpoints(s, port)))
            .collect();
        Slices { by_name }
    }

    /// The union over the slices, sorted, one endpoint per address (a pod
    /// can appear in two slices while the controller moves it).
    pub(super) fn ready_set(&self) -> Vec<Endpoint> {
        let mut by_addr: BTreeMap<SocketAddr, &str> = BTreeMap::new();
        for endpoint in self.by_name.values().flatten() {
            by_addr
                .entry(endpoint.addr)
                .and_modify(|name| *name = (*name).min(endpoint.name.as_str()))
                .or_insert(endpoint.name.as_str());
        }
        let mut set: Vec<Endpoint> = by_addr
            .into_iter()
            .map(|(addr, name)| Endpoint {
                name: name.to_string(),
                addr,
            })
            .collect();
        set.sort();
        set
    }

    pub(super) fn apply(&mut self, line: &[u8], port: &PortRef) -> Applied {
        let event: WatchEvent = match serde_json::from_slice(line) {
            Ok(e) => e,
            Err(e) => return Applied::Failed(format!("a watch event that is not one: {e}")),
        };
        let slice = || serde_json::from_str::<Slice>(event.object.get());
        match event.kind.as_str() {
            "ADDED" | "MODIFIED" => match slice() {
                Ok(s) => {
                    self.by_name
                        .insert(s.metadata.name.clone(), slice_endpoints(&s, port));
                    Applied::At(Some(s.metadata.resource_version).filter(|v| !v.is_empty()))
                }
                Err(e) => Applied::Failed(format!("a {} slice that is not one: {e}", event.kind)),
            },
            "DELETED" => match slice() {
                Ok(s) => {
                    self.by_name.remove(&s.metadata.name);
                    Applied::At(Some(s.metadata.resource_version).filter(|v| !v.is_empty()))
                }
                Err(e) => Applied::Failed(format!("a DELETED slice that is not one: {e}")),
            },
            // Only the version moves: nothing of ours changed up to it.
            "BOOKMARK" => match slice() {
                Ok(s) => Applied::At(Some(s.metadata.resource_version).filter(|v| !v.is_empty())),
                Err(e) => Applied::Failed(format!("a BOOKMARK that is not one: {e}")),
            },
            "ERROR" => {
                let status: Status = serde_json::from_str(event.object.get()).unwrap_or_default();
                if status.code == 410 {
                    Applied::Gone
                } else {
                    Applied::Failed(format!(
                        "watch ERROR {} {}: {}",
                        status.code, status.reason, status.message
                    ))
                }
            }
            other => {
                log::debug!("kubernetes discovery: watch event of type {other:?} ignored");
                Applied::At(None)
            }
        }
    }
}

// ---- the HTTP exchange ----
