//! The API key file in force (shared or per route), as last read. Re-read
//! on every reload; a request sees one version from start to end.

use crate::auth::{KeyFileStatus, KeySet};
use std::path::{Path, PathBuf};

/// An API key file as last read.
#[derive(Debug)]
pub struct KeyState {
    pub path: PathBuf,
    pub status: KeyFileStatus,
    pub keys: Option<KeySet>,
    /// "shared" (gateway.yaml / env) or "route" (the route's api_keys_file).
    pub scope: &'static str,
}

impl KeyState {
    pub(super) fn load(path: &Path, scope: &'static str) -> Self {
        let (status, keys) = KeySet::load(path);
        KeyState {
            path: path.to_path_buf(),
            status,
            keys,
            scope,
        }
    }

    /// Keys are enforced only when a readable file holds at least one key;
    /// otherwise requests pass (deliberate fail-open, logged loudly).
    pub fn enforced(&self) -> Option<&KeySet> {
        self.keys.as_ref().filter(|k| !k.is_empty())
    }
}
