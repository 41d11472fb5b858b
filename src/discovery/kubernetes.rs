//! A route's engines from Kubernetes: the ready endpoints of the
//! EndpointSlices that match a label selector, listed once, then watched.
//!
//! The protocol is the API server's list-then-watch (API concepts, "Efficient
//! detection of changes"): a LIST gives the slices and a resourceVersion; a
//! WATCH from that version streams newline-delimited events. A watch that ends
//! or breaks resumes from the last version seen, so nothing is missed and
//! nothing is listed again; only a 410 Gone (the version fell out of the
//! server's history) costs a new LIST.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use serde::Deserialize;
use serde_json::value::RawValue;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::mpsc::Sender;

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

/// Lists the matching EndpointSlices, then watches them, forever: sends
/// `Found::Endpoints` after the list and after every change that alters the
/// ready set (not on bookmarks or no-op changes), `Found::Error` when a
/// list/watch fails (then retries with backoff 1 s doubling to 30 s). After
/// an error, the first list or watch the server accepts sends the set again,
/// unchanged or not, so the owner knows the error is over (a quiet cluster may
/// send no change for hours). Ends when the receiver is dropped.
pub async fn watch(source: KubernetesSource, out: Sender<Found>) {
    let account = source
        .service_account_dir
        .as_deref()
        .unwrap_or(Path::new(SERVICE_ACCOUNT));
    let access = match Access::for_api(source.api.as_deref(), account) {
        Ok(access) => access,
        Err(e) => {
            log::error!("kubernetes discovery {}: {e}", describe(&source));
            // Nothing to retry: the environment or the URL will not change under us.
            let _ = out.send(Found::Error(e)).await;
            out.closed().await;
            return;
        }
    };
    watch_with(source, access, out).await
}

/// Where the API server is and how to reach it.
#[derive(Debug, Clone, PartialEq)]
struct Access {
    /// To connect to: a host name or an IP address (no brackets).
    host: String,
    port: u16,
    /// The Host header: host and port, an IPv6 address in brackets.
    authority: String,
    /// A path prefix before `/apis/…` (a proxy's), without a trailing slash.
    prefix: String,
    /// Read at every connect: the kubelet rotates projected tokens.
    token_file: Option<PathBuf>,
    /// Some: TLS, the server's certificate verified against this CA bundle.
    ca_file: Option<PathBuf>,
}

const SERVICE_ACCOUNT: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

impl Access {
    fn for_api(api: Option<&str>, account: &Path) -> Result<Access, String> {
        match api {
            None => Access::in_cluster(
                std::env::var("KUBERNETES_SERVICE_HOST").ok(),
                std::env::var("KUBERNETES_SERVICE_PORT").ok(),
                account,
            ),
            Some(url) => Access::from_url(url, account),
        }
    }

    fn in_cluster(
        host: Option<String>,
        port: Option<String>,
        account: &Path,
    ) -> Result<Access, String> {
        let host = host
            .filter(|h| !h.is_empty())
            .ok_or("KUBERNETES_SERVICE_HOST is not set: not in a cluster, and no api URL given")?;
        let port = match port.as_deref() {
            None | Some("") => 443,
            Some(p) => p
                .parse::<u16>()
                .map_err(|_| format!("KUBERNETES_SERVICE_PORT {p:?} is not a port"))?,
        };
        let authority = match host.parse::<IpAddr>() {
            Ok(IpAddr::V6(ip)) => format!("[{ip}]:{port}"),
            _ => format!("{host}:{port}"),
        };
        Ok(Access {
            host,
            port,
            authority,
            prefix: String::new(),
            token_file: Some(account.join("token")),
            ca_file: Some(account.join("ca.crt")),
        })
    }

    fn from_url(url: &str, account: &Path) -> Result<Access, String> {
        let uri: http::Uri = url.parse().map_err(|e| format!("api URL {url:?}: {e}"))?;
        let tls = match uri.scheme_str() {
            Some("http") => false,
            Some("https") => true,
            _ => return Err(format!("api URL {url:?}: not http:// or https://")),
        };
        let authority = uri
            .authority()
            .ok_or_else(|| format!("api URL {url:?}: no host"))?;
        if authority.as_str().contains('@') {
            return Err(format!(
                "api URL {url:?}: credentials in a URL are not used"
            ));
        }
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let port = authority.port_u16().unwrap_or(if tls { 443 } else { 80 });
        Ok(Access {
            authority: authority.as_str().to_string(),
            host,
            port,
            prefix: uri.path().trim_end_matches('/').to_string(),
            token_file: tls.then(|| account.join("token")),
            ca_file: tls.then(|| account.join("ca.crt")),
        })
    }
}

/// A connect and the response head.
const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// The LIST's body, after its head.
const LIST_BODY_TIMEOUT: Duration = Duration::from_secs(30);
/// A LIST larger than this is refused rather than held in memory.
const MAX_LIST_BYTES: usize = 64 << 20;
/// The server ends a watch after this long (it picks a shorter one if it wants); the watch then resumes.
const WATCH_SERVER_TIMEOUT_SECS: u32 = 240;
/// Silence on a watch longer than the server's own timeout means the connection is dead.
const WATCH_IDLE: Duration = Duration::from_secs(300);
/// One watch event; a longer line is an error rather than unbounded memory.
const MAX_LINE_BYTES: usize = 4 << 20;
/// A status body read for its message only.
const MAX_STATUS_BYTES: usize = 64 << 10;
const BACKOFF_FIRST: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// A watch the server ends sooner than this (without a failure) is resumed
/// only once this much time has passed, so a server that ends every watch
/// at once is not asked again in a tight loop.
const MIN_WATCH: Duration = Duration::from_secs(1);

// ---- the API objects: only the fields read ----

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Meta {
    #[serde(default)]
    name: String,
    #[serde(default)]
    resource_version: String,
}

#[derive(Debug, Deserialize)]
struct SliceList {
    #[serde(default)]
    metadata: Meta,
    // `null` for an empty list in some servers' encodings.
    #[serde(default)]
    items: Option<Vec<Slice>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Slice {
    #[serde(default)]
    metadata: Meta,
    #[serde(default)]
    address_type: String,
    // Go encodes an empty slice as `null`.
    #[serde(default)]
    endpoints: Option<Vec<SliceEndpoint>>,
    #[serde(default)]
    ports: Option<Vec<SlicePort>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SliceEndpoint {
    #[serde(default)]
    addresses: Vec<String>,
    #[serde(default)]
    conditions: Conditions,
    #[serde(default)]
    target_ref: Option<TargetRef>,
}

#[derive(Debug, Default, Deserialize)]
struct Conditions {
    #[serde(default)]
    ready: Option<bool>,
    #[serde(default)]
    terminating: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
struct TargetRef {
    #[serde(default)]
    kind: String,
    #[serde(default)]
    name: String,
}

#[derive(Debug, Default, Deserialize)]
struct SlicePort {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    port: Option<i64>,
}

#[derive(Debug, Deserialize)]
struct WatchEvent<'a> {
    #[serde(rename = "type")]
    kind: String,
    #[serde(borrow)]
    object: &'a RawValue,
}

/// The object of an ERROR event, and the body of a refused request.
#[derive(Debug, Default, Deserialize)]
struct Status {
    #[serde(default)]
    code: u16,
    #[serde(default)]
    reason: String,
    #[serde(default)]
    message: String,
}

// ---- the pure part: slices to endpoints, events applied ----

/// The ready endpoints of one slice, for the port asked for.
fn slice_endpoints(slice: &Slice, port: &PortRef) -> Vec<Endpoint> {
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
enum Applied {
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
struct Slices {
    by_name: HashMap<String, Vec<Endpoint>>,
}

impl Slices {
    fn from_list(items: &[Slice], port: &PortRef) -> Slices {
        let by_name = items
            .iter()
            .map(|s| (s.metadata.name.clone(), slice_endpoints(s, port)))
            .collect();
        Slices { by_name }
    }

    /// The union over the slices, sorted, one endpoint per address (a pod
    /// can appear in two slices while the controller moves it).
    fn ready_set(&self) -> Vec<Endpoint> {
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

    fn apply(&mut self, line: &[u8], port: &PortRef) -> Applied {
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

/// Why a request failed: a 410 needs a new LIST, anything else a retry.
#[derive(Debug)]
enum Failure {
    Gone,
    Other(String),
}

/// Aborts the connection's task when the exchange is dropped, so a watch
/// given up (the receiver gone, a timeout) leaves no socket behind.
struct ConnTask(tokio::task::JoinHandle<()>);

impl Drop for ConnTask {
    fn drop(&mut self) {
        self.0.abort();
    }
}

struct Exchange {
    status: http::StatusCode,
    body: Incoming,
    _conn: ConnTask,
}

/// The bearer token, read now: never logged, never put in an error.
async fn read_token(path: &Path) -> Result<String, String> {
    let text = tokio::fs::read_to_string(path)
        .await
        .map_err(|e| format!("reading the service account token {}: {e}", path.display()))?;
    let token = text.trim();
    if token.is_empty() {
        return Err(format!(
            "the service account token {} is empty",
            path.display()
        ));
    }
    Ok(token.to_string())
}

fn tls_connector(ca_file: &Path) -> Result<tokio_rustls::TlsConnector, String> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::CertificateDer;
    let mut roots = rustls::RootCertStore::empty();
    let certs = CertificateDer::pem_file_iter(ca_file)
        .map_err(|e| format!("reading the CA {}: {e}", ca_file.display()))?;
    for cert in certs {
        let cert = cert.map_err(|e| format!("reading the CA {}: {e}", ca_file.display()))?;
        roots
            .add(cert)
            .map_err(|e| format!("a CA certificate in {}: {e}", ca_file.display()))?;
    }
    if roots.is_empty() {
        return Err(format!("the CA {} holds no certificate", ca_file.display()));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

/// One GET on a fresh connection, up to its response head.
async fn get(access: &Access, path_and_query: &str) -> Result<Exchange, String> {
    let token = match &access.token_file {
        Some(path) => Some(read_token(path).await?),
        None => None,
    };
    let mut request = http::Request::builder()
        .method(http::Method::GET)
        .uri(path_and_query)
        .header(http::header::HOST, &access.authority)
        .header(http::header::ACCEPT, "application/json")
        .header(http::header::USER_AGENT, "llm-gateway")
        .body(Empty::<Bytes>::new())
        .map_err(|e| format!("building the request: {e}"))?;
    if let Some(token) = token {
        let mut value = http::HeaderValue::from_str(&format!("Bearer {token}"))
            .map_err(|_| "the service account token is not a valid header value".to_string())?;
        value.set_sensitive(true);
        request
            .headers_mut()
            .insert(http::header::AUTHORIZATION, value);
    }
    let exchange = async {
        let tcp = TcpStream::connect((access.host.as_str(), access.port))
            .await
            .map_err(|e| format!("connecting to {}: {e}", access.authority))?;
        let _ = tcp.set_nodelay(true);
        match &access.ca_file {
            None => send(tcp, request).await,
            Some(ca_file) => {
                let connector = tls_connector(ca_file)?;
                let name = rustls_pki_types::ServerName::try_from(access.host.clone())
                    .map_err(|e| format!("TLS name {:?}: {e}", access.host))?;
                let tls = connector
                    .connect(name, tcp)
                    .await
                    .map_err(|e| format!("TLS with {}: {e}", access.authority))?;
                send(tls, request).await
            }
        }
    };
    tokio::time::timeout(HEAD_TIMEOUT, exchange)
        .await
        .map_err(|_| {
            format!(
                "no response head from {} within {} s",
                access.authority,
                HEAD_TIMEOUT.as_secs()
            )
        })?
}

async fn send<S>(io: S, request: http::Request<Empty<Bytes>>) -> Result<Exchange, String>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|e| format!("HTTP handshake: {e}"))?;
    let conn = ConnTask(tokio::spawn(async move {
        if let Err(e) = conn.await {
            log::debug!("kubernetes discovery: connection ended: {e}");
        }
    }));
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| format!("request: {e}"))?;
    let status = response.status();
    Ok(Exchange {
        status,
        body: response.into_body(),
        _conn: conn,
    })
}

/// A refused request, described by its status and the Status body's message.
async fn refusal(exchange: Exchange) -> Failure {
    if exchange.status == http::StatusCode::GONE {
        return Failure::Gone;
    }
    let body = tokio::time::timeout(
        HEAD_TIMEOUT,
        Limited::new(exchange.body, MAX_STATUS_BYTES).collect(),
    )
    .await;
    let message = match body {
        Ok(Ok(body)) => serde_json::from_slice::<Status>(&body.to_bytes())
            .map(|s| s.message)
            .unwrap_or_default(),
        _ => String::new(),
    };
    let message: String = message.chars().take(300).collect();
    Failure::Other(format!("HTTP {}: {message}", exchange.status))
}

/// A namespace as one path segment.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

fn slices_path(access: &Access, source: &KubernetesSource, watch_from: Option<&str>) -> String {
    let mut query = form_urlencoded::Serializer::new(String::new());
    query.append_pair("labelSelector", &source.selector);
    if let Some(rv) = watch_from {
        query
            .append_pair("watch", "1")
            .append_pair("resourceVersion", rv)
            .append_pair("allowWatchBookmarks", "true")
            .append_pair("timeoutSeconds", &WATCH_SERVER_TIMEOUT_SECS.to_string());
    }
    format!(
        "{}/apis/discovery.k8s.io/v1/namespaces/{}/endpointslices?{}",
        access.prefix,
        utf8_percent_encode(&source.namespace, SEGMENT),
        query.finish()
    )
}

fn describe(source: &KubernetesSource) -> String {
    format!("{}/{}", source.namespace, source.selector)
}

// ---- the loop ----

/// How one list or watch ended.
enum Outcome {
    /// The watch ended without a failure: watch again from where it was.
    Resume,
    /// 410 Gone: list again.
    Relist,
    Failed(String),
    /// The receiver is gone.
    Closed,
}

struct Watcher {
    source: KubernetesSource,
    access: Access,
    out: Sender<Found>,
    slices: Slices,
    /// Where the next watch starts; None: the next request is a LIST.
    version: Option<String>,
    /// The set last sent, to send only changes.
    sent: Option<Vec<Endpoint>>,
    /// An error was sent and nothing has succeeded since.
    failing: bool,
    /// The last outcome was a 410 and no event came since: a second one
    /// waits its backoff, so a server that refuses every watch is not
    /// listed in a tight loop.
    gone_again: bool,
    backoff: Duration,
}

async fn watch_with(source: KubernetesSource, access: Access, out: Sender<Found>) {
    let closed = out.clone();
    let mut watcher = Watcher {
        source,
        access,
        out,
        slices: Slices::default(),
        version: None,
        sent: None,
        failing: false,
        gone_again: false,
        backoff: BACKOFF_FIRST,
    };
    // A watch can be silent for minutes; the receiver's drop ends it at once.
    tokio::select! {
        _ = closed.closed() => {}
        _ = watcher.run() => {}
    }
}

impl Watcher {
    async fn run(&mut self) {
        loop {
            let outcome = match self.version.clone() {
                None => self.list().await,
                Some(version) => self.watch_from(version).await,
            };
            match outcome {
                Outcome::Resume => {}
                Outcome::Relist => {
                    log::info!(
                        "kubernetes discovery {}: resourceVersion expired (410), listing again",
                        describe(&self.source)
                    );
                    self.version = None;
                    if self.gone_again {
                        tokio::time::sleep(self.next_backoff()).await;
                    }
                    self.gone_again = true;
                }
                Outcome::Failed(message) => {
                    log::warn!("kubernetes discovery {}: {message}", describe(&self.source));
                    self.failing = true;
                    if self.out.send(Found::Error(message)).await.is_err() {
                        return;
                    }
                    tokio::time::sleep(self.next_backoff()).await;
                }
                Outcome::Closed => return,
            }
        }
    }

    fn next_backoff(&mut self) -> Duration {
        let delay = self.backoff;
        self.backoff = (self.backoff * 2).min(BACKOFF_MAX);
        delay
    }

    /// The server answered: backoff starts over, and an error outstanding is
    /// ended by the set sent again.
    async fn answered(&mut self) -> bool {
        self.backoff = BACKOFF_FIRST;
        if self.failing {
            return self.publish(true).await;
        }
        true
    }

    /// Sends the ready set if `always` or if it changed; false once the receiver is gone.
    async fn publish(&mut self, always: bool) -> bool {
        let set = self.slices.ready_set();
        if !always && self.sent.as_ref() == Some(&set) {
            return true;
        }
        self.failing = false;
        self.sent = Some(set.clone());
        self.out.send(Found::Endpoints(set)).await.is_ok()
    }

    async fn list(&mut self) -> Outcome {
        let path = slices_path(&self.access, &self.source, None);
        let exchange = match get(&self.access, &path).await {
            Ok(e) => e,
            Err(e) => return Outcome::Failed(format!("list: {e}")),
        };
        if exchange.status != http::StatusCode::OK {
            return match refusal(exchange).await {
                Failure::Gone => Outcome::Failed("list: HTTP 410 Gone".to_string()),
                Failure::Other(e) => Outcome::Failed(format!("list: {e}")),
            };
        }
        let body = tokio::time::timeout(
            LIST_BODY_TIMEOUT,
            Limited::new(exchange.body, MAX_LIST_BYTES).collect(),
        )
        .await;
        let body = match body {
            Ok(Ok(body)) => body.to_bytes(),
            Ok(Err(e)) => return Outcome::Failed(format!("list: reading the body: {e}")),
            Err(_) => {
                return Outcome::Failed(format!(
                    "list: the body took over {} s",
                    LIST_BODY_TIMEOUT.as_secs()
                ))
            }
        };
        let list: SliceList = match serde_json::from_slice(&body) {
            Ok(list) => list,
            Err(e) => return Outcome::Failed(format!("list: not an EndpointSliceList: {e}")),
        };
        let items = list.items.unwrap_or_default();
        self.slices = Slices::from_list(&items, &self.source.port);
        self.version = Some(list.metadata.resource_version);
        self.backoff = BACKOFF_FIRST;
        let set_len = self.slices.ready_set().len();
        log::info!(
            "kubernetes discovery {}: {} slices, {set_len} ready endpoints",
            describe(&self.source),
            items.len()
        );
        if !self.publish(true).await {
            return Outcome::Closed;
        }
        Outcome::Resume
    }

    async fn watch_from(&mut self, version: String) -> Outcome {
        let path = slices_path(&self.access, &self.source, Some(&version));
        let started = Instant::now();
        let exchange = match get(&self.access, &path).await {
            Ok(e) => e,
            Err(e) => return Outcome::Failed(format!("watch: {e}")),
        };
        if exchange.status != http::StatusCode::OK {
            return match refusal(exchange).await {
                Failure::Gone => Outcome::Relist,
                Failure::Other(e) => Outcome::Failed(format!("watch: {e}")),
            };
        }
        if !self.answered().await {
            return Outcome::Closed;
        }
        let mut body = exchange.body;
        let mut pending = BytesMut::new();
        // Bytes of `pending` already known to hold no newline.
        let mut scanned = 0;
        loop {
            let frame = match tokio::time::timeout(WATCH_IDLE, body.frame()).await {
                Err(_) => {
                    return Outcome::Failed(format!(
                        "watch: nothing for {} s",
                        WATCH_IDLE.as_secs()
                    ))
                }
                Ok(None) => break,
                Ok(Some(Err(e))) => return Outcome::Failed(format!("watch broke: {e}")),
                Ok(Some(Ok(frame))) => frame,
            };
            let Ok(data) = frame.into_data() else {
                continue;
            };
            pending.extend_from_slice(&data);
            while let Some(at) = memchr::memchr(b'\n', &pending[scanned..]) {
                let line = pending.split_to(scanned + at + 1);
                scanned = 0;
                match self.event(&line[..line.len() - 1]).await {
                    Some(outcome) => return outcome,
                    None => continue,
                }
            }
            scanned = pending.len();
            if pending.len() > MAX_LINE_BYTES {
                return Outcome::Failed(format!(
                    "watch: an event over {} MiB",
                    MAX_LINE_BYTES >> 20
                ));
            }
        }
        // A last line without its newline is cut, not complete: dropped.
        if started.elapsed() < MIN_WATCH {
            tokio::time::sleep(MIN_WATCH - started.elapsed()).await;
        }
        Outcome::Resume
    }

    /// Applies one line of a watch; Some when the watch must end.
    async fn event(&mut self, line: &[u8]) -> Option<Outcome> {
        if line.iter().all(u8::is_ascii_whitespace) {
            return None;
        }
        match self.slices.apply(line, &self.source.port) {
            Applied::At(version) => {
                self.gone_again = false;
                if let Some(version) = version {
                    self.version = Some(version);
                }
                if !self.publish(false).await {
                    return Some(Outcome::Closed);
                }
                None
            }
            Applied::Gone => Some(Outcome::Relist),
            Applied::Failed(e) => Some(Outcome::Failed(format!("watch: {e}"))),
        }
    }
}

#[cfg(test)]
mod tests;
