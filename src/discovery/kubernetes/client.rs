//! Talking to the API server: where it is and with what credentials (the
//! service account's token and CA), one GET over HTTP/1 (with TLS where the
//! URL says https), and what a refusal says.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use super::slices::Status;
use super::source::KubernetesSource;

/// A connect and the response head.
pub(super) const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// The server ends a watch after this long (it picks a shorter one if it wants); the watch then resumes.
pub(super) const WATCH_SERVER_TIMEOUT_SECS: u32 = 240;
/// A status body read for its message only.
pub(super) const MAX_STATUS_BYTES: usize = 64 << 10;

/// Where the API server is and how to reach it.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Access {
    /// To connect to: a host name or an IP address (no brackets).
    pub(super) host: String,
    pub(super) port: u16,
    /// The Host header: host and port, an IPv6 address in brackets.
    pub(super) authority: String,
    /// A path prefix before `/apis/…` (a proxy's), without a trailing slash.
    pub(super) prefix: String,
    /// Read at every connect: the kubelet rotates projected tokens.
    pub(super) token_file: Option<PathBuf>,
    /// Some: TLS, the server's certificate verified against this CA bundle.
    pub(super) ca_file: Option<PathBuf>,
}

pub(super) const SERVICE_ACCOUNT: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

impl Access {
    pub(super) fn for_api(api: Option<&str>, account: &Path) -> Result<Access, String> {
        match api {
            None => Access::in_cluster(
                std::env::var("KUBERNETES_SERVICE_HOST").ok(),
                std::env::var("KUBERNETES_SERVICE_PORT").ok(),
                account,
            ),
            Some(url) => Access::from_url(url, account),
        }
    }

    pub(super) fn in_cluster(
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

    pub(super) fn from_url(url: &str, account: &Path) -> Result<Access, String> {
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

/// Why a request failed: a 410 needs a new LIST, anything else a retry.
#[derive(Debug)]
pub(super) enum Failure {
    Gone,
    Other(String),
}

/// Aborts the connection's task when the exchange is dropped, so a watch
/// given up (the receiver gone, a timeout) leaves no socket behind.
pub(super) struct ConnTask(tokio::task::JoinHandle<()>);

impl Drop for ConnTask {
    fn drop(&mut self) {
        self.0.abort();
    }
}

pub(super) struct Exchange {
    pub(super) status: http::StatusCode,
    pub(super) body: Incoming,
    pub(super) _conn: ConnTask,
}

/// The bearer token, read now: never logged, never put in an error.
pub(super) async fn read_token(path: &Path) -> Result<String, String> {
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

pub(super) fn tls_connector(ca_file: &Path) -> Result<tokio_rustls::TlsConnector, String> {
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
pub(super) async fn get(access: &Access, path_and_query: &str) -> Result<Exchange, String> {
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

pub(super) async fn send<S>(io: S, request: http::Request<Empty<Bytes>>) -> Result<Exchange, String>
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
pub(super) async fn refusal(exchange: Exchange) -> Failure {
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
pub(super) const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

pub(super) fn slices_path(
    access: &Access,
    source: &KubernetesSource,
    watch_from: Option<&str>,
) -> String {
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
