//! What a Kubernetes watch is asked for (a route's `peers_from:
//! {kubernetes: …}`) and what it tells its owner: the ready endpoints.

use std::net::SocketAddr;
use std::path::PathBuf;

/// What a route's `peers_from: {kubernetes: …}` asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct KubernetesSource {
    pub namespace: String,
    /// A label selector on the EndpointSlices, e.g. "app=vllm" (an EndpointSlice carries its Service's labels, plus `kubernetes.io/service-name`).
    pub selector: String,
    /// The engine port: a number, or the name of a port in the slices.
    pub port: PortRef,
    /// The API server's base URL; None: in-cluster (KUBERNETES_SERVICE_HOST / _PORT, the service account token and CA). An `http://` URL (tests, `kubectl proxy`) is used without TLS or token; an `https://` one with the service account's token and CA.
    pub api: Option<String>,
    /// Where the service account's `token` and `ca.crt` are; None: where the
    /// kubelet mounts them, /var/run/secrets/kubernetes.io/serviceaccount.
    /// Another directory lets the gateway run outside the cluster with a
    /// token and CA copied from it.
    pub service_account_dir: Option<PathBuf>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum PortRef {
    Number(u16),
    Name(String),
}

/// One ready engine endpoint.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Endpoint {
    /// The pod's name (`targetRef.name` where it is a Pod), else the address: stable across gateway restarts.
    pub name: String,
    pub addr: SocketAddr,
}

/// What the watcher tells its owner.
#[derive(Debug, Clone, PartialEq)]
pub enum Found {
    /// The full set of ready endpoints now, sorted, deduplicated by address.
    Endpoints(Vec<Endpoint>),
    /// The API could not be read (message for /_health_status and the log); the last set stays in force.
    Error(String),
}
