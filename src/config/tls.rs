//! `tls:` in gateway.yaml → the main listener's certificate chain and key
//! files (`tls.rs` loads and reloads them).

use super::file::TlsFile;
use super::spans::KeyLines;
use super::ConfigError;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsConfig {
    /// PEM: the server's certificate first, then its intermediates.
    pub cert: PathBuf,
    /// PEM: the certificate's private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

pub(super) fn resolve(
    path: &Path,
    text: &str,
    file: Option<&TlsFile>,
) -> Result<Option<TlsConfig>, ConfigError> {
    let Some(file) = file else {
        return Ok(None);
    };
    match (&file.cert, &file.key) {
        (Some(cert), Some(key)) => Ok(Some(TlsConfig {
            cert: cert.clone(),
            key: key.clone(),
        })),
        _ => Err(ConfigError::new(
            path,
            KeyLines::of(text).line("tls"),
            "tls needs both cert (the certificate chain file) and key (its private key file)",
        )),
    }
}
