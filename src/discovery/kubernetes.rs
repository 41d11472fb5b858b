//! Placeholder until the EndpointSlice watcher lands: the types the route
//! config and discovery use.

/// What a route's `peers_from: {kubernetes: …}` asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct KubernetesSource {
    pub namespace: String,
    pub selector: String,
    pub port: PortRef,
    pub api: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum PortRef {
    Number(u16),
    Name(String),
}

/// One ready engine endpoint.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Endpoint {
    pub name: String,
    pub addr: std::net::SocketAddr,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Found {
    Endpoints(Vec<Endpoint>),
    Error(String),
}

pub async fn watch(_source: KubernetesSource, out: tokio::sync::mpsc::Sender<Found>) {
    let _ = out.send(Found::Error("not built yet".into())).await;
}
