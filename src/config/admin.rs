//! `admin:` in gateway.yaml → who may read the admin listener. With
//! `token_file`, only a caller that sends the file's token as
//! `Authorization: Bearer <token>`, but on the `open_paths` the operator
//! leaves open (a kubelet's `/healthz`, Prometheus' `/metrics`). Without
//! it, everyone who reaches the listener: bind `admin_listen` to loopback
//! to keep it to this host.
//!
//! Only the token's SHA-256 is kept, compared in constant time; the token
//! itself is neither kept nor shown (`Debug` shows the file).

use super::file::AdminFile;
use super::spans::KeyLines;
use super::ConfigError;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use subtle::ConstantTimeEq;

/// The admin listener's endpoints: what `open_paths` may name.
pub const ADMIN_PATHS: [&str; 5] = [
    "/healthz",
    "/metrics",
    "/_routes",
    "/dashboard",
    "/dashboard.json",
];

/// Who may read the admin listener.
#[derive(Clone, Default)]
pub struct AdminAccess {
    token: Option<AdminToken>,
    /// Served without the token (empty without one: every path is open).
    pub open_paths: Vec<String>,
}

#[derive(Clone)]
struct AdminToken {
    file: PathBuf,
    digest: [u8; 32],
}

impl std::fmt::Debug for AdminAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminAccess")
            .field("token_file", &self.token_file())
            .field("open_paths", &self.open_paths)
            .finish()
    }
}

impl AdminAccess {
    /// The file the token was read from, when one is required.
    pub fn token_file(&self) -> Option<&Path> {
        self.token.as_ref().map(|t| t.file.as_path())
    }

    /// Whether a request for `path` that presented `bearer` (its
    /// `Authorization: Bearer` token, if any) is served. The comparison
    /// is of SHA-256 digests with `subtle`: its time does not depend on
    /// how much of the token a caller got right.
    pub fn admits(&self, path: &str, bearer: Option<&[u8]>) -> bool {
        let Some(token) = &self.token else {
            return true;
        };
        if self.open_paths.iter().any(|open| open == path) {
            return true;
        }
        bearer.is_some_and(|presented| {
            let digest: [u8; 32] = Sha256::digest(presented).into();
            bool::from(digest.ct_eq(&token.digest))
        })
    }
}

pub(super) fn resolve(
    path: &Path,
    text: &str,
    file: Option<&AdminFile>,
) -> Result<AdminAccess, ConfigError> {
    let Some(file) = file else {
        return Ok(AdminAccess::default());
    };
    let lines = KeyLines::of(text);
    let line = |key: &str| lines.line(key).or(lines.line("admin"));
    let open_paths = file.open_paths.clone().unwrap_or_default();
    if let Some(unknown) = open_paths
        .iter()
        .find(|p| !ADMIN_PATHS.contains(&p.as_str()))
    {
        return Err(ConfigError::new(
            path,
            line("admin.open_paths"),
            format!(
                "admin.open_paths: {unknown:?} is not an admin endpoint ({})",
                ADMIN_PATHS.join(", ")
            ),
        ));
    }
    let Some(token_file) = &file.token_file else {
        if open_paths.is_empty() {
            return Ok(AdminAccess::default());
        }
        return Err(ConfigError::new(
            path,
            line("admin.open_paths"),
            "admin.open_paths needs admin.token_file: without a token every path is open",
        ));
    };
    let contents = std::fs::read_to_string(token_file).map_err(|e| {
        ConfigError::new(
            path,
            line("admin.token_file"),
            format!("admin.token_file {}: {e}", token_file.display()),
        )
    })?;
    // The first line, as the engine key file's is read: a trailing newline
    // is not part of the token.
    let token = contents.lines().next().unwrap_or_default().trim();
    if token.is_empty() {
        return Err(ConfigError::new(
            path,
            line("admin.token_file"),
            format!(
                "admin.token_file {}: its first line holds no token",
                token_file.display()
            ),
        ));
    }
    Ok(AdminAccess {
        token: Some(AdminToken {
            file: token_file.clone(),
            digest: Sha256::digest(token.as_bytes()).into(),
        }),
        open_paths,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn access(dir: &Path, admin: &str) -> Result<AdminAccess, ConfigError> {
        let config = dir.join("gateway.yaml");
        let text = format!("admin: {admin}\n");
        let file: super::super::file::GatewayFile = serde_yaml::from_str(&text).expect("yaml");
        resolve(&config, &text, file.admin.as_ref())
    }

    #[test]
    fn the_token_opens_every_path_and_open_paths_need_none() {
        let dir = tempfile::tempdir().expect("dir");
        let token = dir.path().join("token");
        std::fs::write(&token, "s3cret-admin\n").expect("token");
        let a = access(
            dir.path(),
            &format!(
                "{{token_file: {}, open_paths: [/healthz]}}",
                token.display()
            ),
        )
        .expect("loads");
        assert!(a.admits("/metrics", Some(b"s3cret-admin")));
        assert!(!a.admits("/metrics", Some(b"s3cret-admiN")));
        assert!(!a.admits("/metrics", Some(b"s3cret-admin\n")));
        assert!(!a.admits("/metrics", None));
        assert!(a.admits("/healthz", None));
        assert!(!format!("{a:?}").contains("s3cret"), "{a:?}");
        // Control: no token configured, every path served.
        assert!(AdminAccess::default().admits("/metrics", None));
    }

    #[test]
    fn each_mistake_names_the_key_and_why() {
        let dir = tempfile::tempdir().expect("dir");
        let missing = dir.path().join("none");
        let err = access(
            dir.path(),
            &format!("{{token_file: {}}}", missing.display()),
        )
        .expect_err("missing file");
        assert!(err.to_string().contains("admin.token_file"), "{err}");
        assert!(err.to_string().contains("none"), "{err}");
        let empty = dir.path().join("empty");
        std::fs::write(&empty, "\n").expect("empty");
        let err = access(dir.path(), &format!("{{token_file: {}}}", empty.display()))
            .expect_err("empty file");
        assert!(err.to_string().contains("holds no token"), "{err}");
        let err = access(dir.path(), "{open_paths: [/healthz]}").expect_err("no token");
        assert!(err.to_string().contains("needs admin.token_file"), "{err}");
        let err = access(dir.path(), "{open_paths: [/secret]}").expect_err("unknown path");
        assert!(err.to_string().contains("not an admin endpoint"), "{err}");
        // Control: an empty section is the default.
        assert!(access(dir.path(), "{}")
            .expect("empty")
            .token_file()
            .is_none());
    }
}
