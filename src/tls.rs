//! TLS on the main listener (`tls:` in gateway.yaml): the certificate every
//! new handshake gets, and its reload.
//!
//! Pingora's rustls listener asks a [`ResolvesServerCert`] for the
//! certificate on each handshake; [`CertStore`] answers with the one loaded
//! last. A reload builds the new certificate apart and swaps it in whole:
//! connections already up keep their session (TLS does not consult the
//! certificate after the handshake), new handshakes get the new one. A
//! chain or key that does not load, or a key that does not match its
//! certificate, leaves the previous certificate in force and is logged with
//! the file and the reason, as a broken route file is.
//!
//! Reloads come from SIGHUP and, with `watch: true`, from the files
//! changing. The files are polled (their size, modification time and inode,
//! symlinks followed) rather than watched with inotify: cert-manager and
//! kubelet replace a Secret's files by renaming a fresh `..data` symlink,
//! which a stat of the path sees without the directory bookkeeping
//! `watch.rs` needs for the route files, and two stats a second cost
//! nothing.

use crate::config::TlsConfig;
use arc_swap::ArcSwap;
use async_trait::async_trait;
use parking_lot::Mutex;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// How often the files are looked at for a change (`watch: true`).
pub const POLL: Duration = Duration::from_secs(1);

/// The certificate new handshakes get, and where it came from.
pub struct CertStore {
    current: ArcSwap<CertifiedKey>,
    cert_file: PathBuf,
    key_file: PathBuf,
    /// The files as they were when last read (loaded or not), so that a
    /// poll reads them again only after a change, and a broken file is
    /// reported once rather than every poll.
    seen: Mutex<Option<[Stamp; 2]>>,
}

impl std::fmt::Debug for CertStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertStore")
            .field("cert_file", &self.cert_file)
            .field("key_file", &self.key_file)
            .finish_non_exhaustive()
    }
}

/// What tells a file changed: its size, modification time and inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    len: u64,
    modified: Option<SystemTime>,
    inode: u64,
}

fn stamp(path: &Path) -> Option<Stamp> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).ok()?;
    Some(Stamp {
        len: meta.len(),
        modified: meta.modified().ok(),
        inode: meta.ino(),
    })
}

impl CertStore {
    /// Reads the chain and key of `config`; an error names the file and
    /// the reason, and stops the start.
    pub fn load(config: &TlsConfig) -> Result<Arc<CertStore>, String> {
        let seen = [stamp(&config.cert), stamp(&config.key)];
        let key = load_certified_key(&config.cert, &config.key)?;
        Ok(Arc::new(CertStore {
            current: ArcSwap::from_pointee(key),
            cert_file: config.cert.clone(),
            key_file: config.key.clone(),
            seen: Mutex::new(seen[0].zip(seen[1]).map(|(c, k)| [c, k])),
        }))
    }

    /// Reads the files again: the new certificate for the handshakes to
    /// come, or, when they do not load, the previous one kept and the
    /// reason logged. `true` when the new one is in force.
    pub fn reload(&self) -> bool {
        let seen = stamp(&self.cert_file).zip(stamp(&self.key_file));
        *self.seen.lock() = seen.map(|(c, k)| [c, k]);
        match load_certified_key(&self.cert_file, &self.key_file) {
            Ok(key) => {
                self.current.store(Arc::new(key));
                log::info!(
                    "tls: certificate reloaded from {} and {}",
                    self.cert_file.display(),
                    self.key_file.display()
                );
                true
            }
            Err(why) => {
                log::warn!("tls: {why}; the previous certificate stays in force");
                false
            }
        }
    }

    /// [`Self::reload`] if either file changed since it was last read.
    pub fn reload_if_changed(&self) -> Option<bool> {
        let now = stamp(&self.cert_file).zip(stamp(&self.key_file));
        let now = now.map(|(c, k)| [c, k]);
        if now == *self.seen.lock() {
            return None;
        }
        Some(self.reload())
    }

    /// The certificate chain in force (the leaf first), as DER: what the
    /// reload tests compare.
    #[cfg(test)]
    pub fn chain(&self) -> Vec<CertificateDer<'static>> {
        self.current.load().cert.clone()
    }
}

impl ResolvesServerCert for CertStore {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load_full())
    }
}

/// The chain in `cert_file` and the key in `key_file`, checked to belong
/// together; the error says which file and why.
pub fn load_certified_key(cert_file: &Path, key_file: &Path) -> Result<CertifiedKey, String> {
    let chain = CertificateDer::pem_file_iter(cert_file)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("certificate chain {}: {e}", cert_file.display()))?;
    if chain.is_empty() {
        return Err(format!(
            "certificate chain {}: no PEM certificate in it",
            cert_file.display()
        ));
    }
    let key = PrivateKeyDer::from_pem_file(key_file)
        .map_err(|e| format!("private key {}: {e}", key_file.display()))?;
    let signing = rustls::crypto::ring::sign::any_supported_type(&key)
        .map_err(|e| format!("private key {}: {e}", key_file.display()))?;
    let certified = CertifiedKey::new(chain, signing);
    certified.keys_match().map_err(|e| {
        format!(
            "private key {} does not belong to the certificate in {}: {e}",
            key_file.display(),
            cert_file.display()
        )
    })?;
    Ok(certified)
}

/// Reloads the certificate on SIGHUP and, when `poll` is set, when its
/// files change.
pub struct CertReload {
    pub store: Arc<CertStore>,
    pub poll: Option<Duration>,
}

#[async_trait]
impl BackgroundService for CertReload {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        use tokio::signal::unix::{signal, SignalKind};
        let mut hup = match signal(SignalKind::hangup()) {
            Ok(hup) => Some(hup),
            Err(e) => {
                log::error!("tls: cannot listen for SIGHUP ({e}); the certificate is reloaded only when its files change (watch: true)");
                None
            }
        };
        let mut tick = self.poll.map(tokio::time::interval);
        loop {
            tokio::select! {
                Some(_) = async { match hup.as_mut() { Some(h) => h.recv().await, None => std::future::pending().await } } => {
                    self.store.reload();
                }
                _ = async { match tick.as_mut() { Some(t) => { t.tick().await; } None => std::future::pending::<()>().await } } => {
                    self.store.reload_if_changed();
                }
                _ = shutdown.changed() => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_pair(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
        let key = rcgen::KeyPair::generate().expect("key");
        let cert = rcgen::CertificateParams::new(vec![name.to_string()])
            .expect("params")
            .self_signed(&key)
            .expect("cert");
        let (c, k) = (
            dir.join(format!("{name}.crt")),
            dir.join(format!("{name}.key")),
        );
        std::fs::write(&c, cert.pem()).expect("cert file");
        std::fs::write(&k, key.serialize_pem()).expect("key file");
        (c, k)
    }

    #[test]
    fn a_matching_pair_loads_and_each_broken_file_says_which_and_why() {
        let dir = tempfile::tempdir().expect("dir");
        let (cert_a, key_a) = write_pair(dir.path(), "a.test");
        let (_, key_b) = write_pair(dir.path(), "b.test");
        assert!(load_certified_key(&cert_a, &key_a).is_ok());

        let mismatched = load_certified_key(&cert_a, &key_b).unwrap_err();
        assert!(
            mismatched.contains("does not belong") && mismatched.contains("b.test.key"),
            "{mismatched}"
        );
        let garbage = dir.path().join("garbage.crt");
        std::fs::write(&garbage, "not a certificate\n").expect("write");
        let err = load_certified_key(&garbage, &key_a).unwrap_err();
        assert!(
            err.contains("garbage.crt") && err.contains("no PEM certificate"),
            "{err}"
        );
        let missing = load_certified_key(&dir.path().join("none.crt"), &key_a).unwrap_err();
        assert!(missing.contains("none.crt"), "{missing}");
        let no_key = load_certified_key(&cert_a, &cert_a).unwrap_err();
        assert!(no_key.contains("private key"), "{no_key}");
    }

    #[test]
    fn a_failed_reload_keeps_the_previous_certificate() {
        let dir = tempfile::tempdir().expect("dir");
        let (cert_a, key_a) = write_pair(dir.path(), "a.test");
        let store = CertStore::load(&TlsConfig {
            cert: cert_a.clone(),
            key: key_a.clone(),
        })
        .expect("load");
        let first = store.chain();
        assert_eq!(store.reload_if_changed(), None, "nothing changed");

        std::fs::write(&cert_a, "broken\n").expect("break");
        assert_eq!(store.reload_if_changed(), Some(false));
        assert_eq!(store.chain(), first, "kept");
        assert_eq!(store.reload_if_changed(), None, "reported once");

        // Control: a good pair written over it is taken.
        let (cert_b, key_b) = write_pair(dir.path(), "b.test");
        std::fs::rename(&cert_b, &cert_a).expect("rename");
        std::fs::rename(&key_b, &key_a).expect("rename");
        assert_eq!(store.reload_if_changed(), Some(true));
        assert_ne!(store.chain(), first);
    }
}
