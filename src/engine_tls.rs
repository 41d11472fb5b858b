//! TLS to engines: a peer's `tls:` in a route file (or `peers_from`'s,
//! which every peer it finds takes), loaded with the route file and used
//! alike by the three ways the gateway reaches an engine: the proxied
//! requests (Pingora's rustls connector, through [`EngineTls::http_peer`]),
//! the health probe and the metrics scrape (`health/client.rs`, through
//! [`EngineTls::connect`]). Same server name, same roots, same client
//! certificate, same verification; a failed handshake is told in the same
//! words by both ([`describe`]), the reason a ban shows in `/_health_status`.
//!
//! It knows nothing of the gateway's other modules: `config` loads it,
//! the proxy and `health` use it. The files are read whenever the route
//! file is (at start and at each reload), so a rotated client certificate
//! or CA is taken at the next reload; connections made with other
//! material are kept apart in Pingora's pool (`group_key`).
//!
//! The proxied side needs Pingora's rustls connector, which only a build
//! with the `tls` feature has: without it `config` refuses a peer's `tls:`
//! ([`NO_TLS`]) and nothing here is ever built.

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, RootCertStore, SignatureScheme};
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// What a build without the `tls` feature says of a peer's `tls:`.
pub const NO_TLS: &str = "this build has no TLS; build with --features tls";

/// A peer's `tls:` as validated: the files it names and how the engine's
/// certificate is checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsSettings {
    /// The name sent (SNI) and verified. None: the peer's address (a
    /// `peers_from: {kubernetes: …}` endpoint's IP).
    pub sni: Option<String>,
    /// PEM: the CA(s) the engine's certificate must chain to. None: the
    /// system's roots.
    pub ca_file: Option<PathBuf>,
    /// PEM: the gateway's certificate (then its intermediates) and its key,
    /// for an engine that asks for one (mTLS).
    pub client_cert: Option<PathBuf>,
    pub client_key: Option<PathBuf>,
    /// Off: any certificate is taken (an encrypted link, no identity).
    pub verify: bool,
}

/// A peer's TLS, loaded: what Pingora's connector and the probes' client
/// are handed.
pub struct EngineTls {
    pub settings: TlsSettings,
    /// A hash of the certificates and key read: two loads of changed files
    /// are different values (a route rebuilt), and Pingora's pool, whose
    /// reuse key leaves the CA out, keeps their connections apart.
    fingerprint: u64,
    /// The probe's and the scrape's client.
    connector: tokio_rustls::TlsConnector,
    #[cfg(feature = "tls")]
    ca: Option<Arc<pingora::protocols::tls::CaType>>,
    #[cfg(feature = "tls")]
    client: Option<Arc<pingora::utils::tls::CertKey>>,
}

impl std::fmt::Debug for EngineTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineTls")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl PartialEq for EngineTls {
    fn eq(&self, other: &Self) -> bool {
        self.settings == other.settings && self.fingerprint == other.fingerprint
    }
}

/// The gateway's certificate chain and key, read and checked to belong together.
struct ClientIdentity {
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
}

impl EngineTls {
    /// Reads the files `settings` names; an error names the file and why.
    pub fn load(settings: TlsSettings) -> Result<EngineTls, String> {
        if let Some(sni) = &settings.sni {
            check_name(sni)?;
        }
        let ca = settings.ca_file.as_deref().map(read_ca).transpose()?;
        // Without a CA file Pingora checks with the system's roots, and
        // builds even `verify: false`'s verifier from them: with none, every
        // connection would fail, and only at run time.
        let system = match &ca {
            None => Some(system_roots()?),
            Some(_) => None,
        };
        let client = match (&settings.client_cert, &settings.client_key) {
            (Some(cert), Some(key)) => Some(read_identity(cert, key)?),
            (None, None) => None,
            _ => return Err("client_cert and client_key go together".into()),
        };
        let mut print = std::collections::hash_map::DefaultHasher::new();
        for cert in ca.iter().flatten() {
            cert.as_ref().hash(&mut print);
        }
        if let Some(id) = &client {
            for cert in &id.chain {
                cert.as_ref().hash(&mut print);
            }
            id.key.secret_der().hash(&mut print);
        }
        let connector = connector(&settings, ca.as_deref(), system, client.as_ref())?;
        Ok(EngineTls {
            fingerprint: print.finish(),
            connector,
            #[cfg(feature = "tls")]
            ca: ca.map(|certs| pingora_ca(&certs)),
            #[cfg(feature = "tls")]
            client: client.map(|id| {
                let chain = id.chain.iter().map(|c| c.as_ref().to_vec()).collect();
                Arc::new(pingora::utils::tls::CertKey::new(
                    chain,
                    id.key.secret_der().to_vec(),
                ))
            }),
            settings,
        })
    }

    /// The name the engine's certificate is checked against (and sent as
    /// SNI when it is not an address): `sni`, else the peer's host.
    pub fn server_name<'a>(&'a self, host: &'a str) -> &'a str {
        self.settings.sni.as_deref().unwrap_or(host)
    }

    /// The TLS handshake of a probe or a scrape, on a connection to the
    /// peer whose host is `host`. The error is [`describe`]'s.
    pub async fn connect(
        &self,
        host: &str,
        tcp: tokio::net::TcpStream,
    ) -> Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>, String> {
        let name = ServerName::try_from(self.server_name(host).to_string())
            .map_err(|e| format!("TLS: server name {:?}: {e}", self.server_name(host)))?;
        self.connector
            .connect(name, tcp)
            .await
            .map_err(|e| tls_io_error(&e).unwrap_or_else(|| format!("TLS: {e}")))
    }

    /// The Pingora peer of a proxied request to `addr`, whose host (in the
    /// route file, or its address) is `host`: TLS with this peer's name,
    /// roots, client certificate and verification.
    #[cfg(feature = "tls")]
    pub fn http_peer(&self, addr: std::net::SocketAddr, host: &str) -> pingora::prelude::HttpPeer {
        let mut peer = pingora::prelude::HttpPeer::new(addr, true, self.server_name(host).into());
        // Pingora checks the chain and the name apart; `verify` is both.
        peer.options.verify_cert = self.settings.verify;
        peer.options.verify_hostname = self.settings.verify;
        peer.options.ca = self.ca.clone();
        peer.client_cert_key = self.client.clone();
        peer.group_key = self.fingerprint;
        peer
    }
}

/// Whether `name` can be a TLS server name (a DNS name or an address).
pub fn check_name(name: &str) -> Result<(), String> {
    match ServerName::try_from(name) {
        Ok(_) if !name.is_empty() => Ok(()),
        _ => Err(format!("sni {name:?} is not a host name or an IP address")),
    }
}

/// The CA certificates of `path`, each checked to be one a root store
/// takes and that parses whole (Pingora parses them again per connection,
/// and panics on one it cannot read).
fn read_ca(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = read_chain(path, "ca_file")?;
    let mut roots = RootCertStore::empty();
    for cert in &certs {
        roots
            .add(cert.clone())
            .map_err(|e| format!("ca_file {}: a certificate there: {e}", path.display()))?;
    }
    Ok(certs)
}

fn read_chain(path: &Path, what: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("{what} {}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "{what} {}: no PEM certificate in it",
            path.display()
        ));
    }
    for cert in &certs {
        rustls::server::ParsedCertificate::try_from(cert)
            .map_err(|e| format!("{what} {}: a certificate there: {e}", path.display()))?;
    }
    Ok(certs)
}

/// The client chain and key, checked as the main listener's pair is
/// (`tls.rs`), and the key in a form Pingora reads back without failing.
fn read_identity(cert: &Path, key_path: &Path) -> Result<ClientIdentity, String> {
    let chain = read_chain(cert, "client_cert")?;
    let key = PrivateKeyDer::from_pem_file(key_path)
        .map_err(|e| format!("client_key {}: {e}", key_path.display()))?;
    let signing = rustls::crypto::ring::sign::any_supported_type(&key)
        .map_err(|e| format!("client_key {}: {e}", key_path.display()))?;
    rustls::sign::CertifiedKey::new(chain.clone(), signing)
        .keys_match()
        .map_err(|e| {
            format!(
                "client_key {} does not belong to the certificate in {}: {e}",
                key_path.display(),
                cert.display()
            )
        })?;
    // Pingora's connector turns the key's bytes back into a key by their
    // DER form and panics if it cannot.
    PrivateKeyDer::try_from(key.secret_der().to_vec())
        .map_err(|e| format!("client_key {}: {e}", key_path.display()))?;
    Ok(ClientIdentity { chain, key })
}

/// The system's roots (with `SSL_CERT_FILE` / `SSL_CERT_DIR`), as
/// Pingora's connector loads them for a peer without a CA of its own.
#[cfg(feature = "tls")]
fn system_roots() -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    pingora::tls::load_platform_certs_incl_env_into_store(&mut roots)
        .map_err(|e| format!("the system's CA certificates: {e}"))?;
    if roots.is_empty() {
        return Err(
            "no ca_file, and the system has no CA certificates (SSL_CERT_FILE, SSL_CERT_DIR or the \
             platform's store): set ca_file"
                .into(),
        );
    }
    Ok(roots)
}

#[cfg(not(feature = "tls"))]
fn system_roots() -> Result<RootCertStore, String> {
    Err(NO_TLS.to_string())
}

/// The probes' client, set up as Pingora's connector is for the same
/// peer: TLS 1.2 and 1.3, ALPN `http/1.1`, the same roots and client
/// certificate, and with `verify: false` no check of the certificate but
/// of the handshake's signatures (Pingora's `SkipAll`).
fn connector(
    settings: &TlsSettings,
    ca: Option<&[CertificateDer<'static>]>,
    system: Option<RootCertStore>,
    client: Option<&ClientIdentity>,
) -> Result<tokio_rustls::TlsConnector, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let algorithms = provider.signature_verification_algorithms;
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS12, &rustls::version::TLS13])
        .map_err(|e| format!("TLS: {e}"))?;
    let builder = if settings.verify {
        let roots = match (ca, system) {
            (Some(certs), _) => {
                let mut roots = RootCertStore::empty();
                let (_, ignored) = roots.add_parsable_certificates(certs.iter().cloned());
                debug_assert_eq!(ignored, 0, "read_ca checked each");
                roots
            }
            (None, Some(system)) => system,
            (None, None) => system_roots()?,
        };
        builder.with_root_certificates(roots)
    } else {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyCertificate(algorithms)))
    };
    let mut config = match client {
        Some(id) => builder
            .with_client_auth_cert(id.chain.clone(), id.key.clone_key())
            .map_err(|e| format!("client_cert: {e}"))?,
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

/// Pingora's CA list: each certificate parsed once here (`read_ca` has
/// checked that each parses).
#[cfg(feature = "tls")]
fn pingora_ca(certs: &[CertificateDer<'static>]) -> Arc<pingora::protocols::tls::CaType> {
    use pingora::utils::tls::{parse_x509, WrappedX509};
    let wrapped: Vec<WrappedX509> = certs
        .iter()
        .map(|c| WrappedX509::new(c.as_ref().to_vec(), parse_x509))
        .collect();
    Arc::from(wrapped.into_boxed_slice())
}

/// `verify: false`: whatever certificate the engine presents, as Pingora's
/// `SkipAll` verifier (private to its connector) takes it; the handshake's
/// signatures are still checked against it.
#[derive(Debug)]
struct AnyCertificate(WebPkiSupportedAlgorithms);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_schemes()
    }
}

/// A TLS failure as `/_health_status` and the log tell it, from rustls'
/// own words: "TLS: certificate verify failed: UnknownIssuer", "TLS:
/// received fatal alert: CertificateRequired".
pub fn describe(rustls_text: &str) -> String {
    match rustls_text.strip_prefix("invalid peer certificate: ") {
        Some(why) => format!("TLS: certificate verify failed: {why}"),
        None => format!("TLS: {rustls_text}"),
    }
}

/// [`describe`] of an I/O error that is TLS's (a handshake, or an alert
/// read after it: an engine that wanted a client certificate says so only
/// once TLS 1.3's handshake is over); None for any other.
pub fn tls_io_error(e: &std::io::Error) -> Option<String> {
    e.get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        .map(|tls| describe(&tls.to_string()))
}

/// [`describe`] of a Pingora TLS connect failure. Pingora keeps rustls'
/// error only as text, in its context: "TLS connect() failed: <its
/// error, ending `cause: <rustls' words>`>, SNI: <name>".
pub fn describe_pingora(context: &str) -> String {
    let detail = context
        .find(" cause: ")
        .map_or(context, |at| &context[at + " cause: ".len()..]);
    let detail = detail.rfind(", SNI: ").map_or(detail, |at| &detail[..at]);
    describe(detail.trim())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_reads_the_same_from_rustls_and_from_pingoras_text() {
        let rustls_error =
            rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, rustls_error.clone());
        let said = tls_io_error(&io).expect("a TLS error");
        assert_eq!(said, "TLS: certificate verify failed: UnknownIssuer");
        // What Pingora 0.9.1's rustls client puts in its error's context.
        let context = format!(
            "TLS connect() failed:  TLSHandshakeFailure context: tls connect error cause: {rustls_error}, SNI: engine.test"
        );
        assert_eq!(describe_pingora(&context), said);
        let alert = rustls::Error::AlertReceived(rustls::AlertDescription::CertificateRequired);
        assert_eq!(
            describe(&alert.to_string()),
            "TLS: received fatal alert: CertificateRequired"
        );
        // Control: an I/O error that is not TLS's is none of this.
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        assert_eq!(tls_io_error(&reset), None);
    }

    #[test]
    fn a_server_name_must_be_a_name_or_an_address() {
        assert!(check_name("engine.internal").is_ok());
        assert!(check_name("10.0.0.7").is_ok());
        assert!(check_name("").is_err());
        assert!(check_name("not a name").is_err());
    }
}
