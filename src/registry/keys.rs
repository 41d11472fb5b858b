//! The API key file in force (shared or per route), as last read. Re-read
//! on every reload; a request sees one version from start to end.
//!
//! A file's state is logged when it changes, not at every read: a reload
//! re-reads every key file, and the same "authentication is OFF" line on
//! each of a hundred reloads buried the one that said something new.

use crate::auth::{KeyFileStatus, KeySet};
use log::Level;
use std::path::{Path, PathBuf};

/// An API key file as last read.
#[derive(Debug)]
pub struct KeyState {
    pub path: PathBuf,
    pub status: KeyFileStatus,
    pub keys: Option<KeySet>,
    /// "shared" (gateway.yaml / env) or "route" (the route's api_keys_file,
    /// or its inline api_keys).
    pub scope: &'static str,
    /// Why an unreadable file could not be read.
    pub problem: Option<String>,
    /// One per entry dropped or reinterpreted (never key text).
    pub warnings: Vec<String>,
}

impl KeyState {
    pub(super) fn load(path: &Path, scope: &'static str) -> Self {
        let read = KeySet::read(path);
        KeyState {
            path: path.to_path_buf(),
            status: read.status,
            keys: read.keys,
            scope,
            problem: read.problem,
            warnings: read.warnings,
        }
    }

    /// The keys a route file holds inline (the OpenResty gateway's
    /// `api_keys` table), as a key file of the route's that read `keys`;
    /// what was wrong with its entries went out with the route's warnings.
    pub(super) fn inline(route_file: &Path, keys: KeySet) -> Self {
        KeyState {
            path: route_file.to_path_buf(),
            status: KeyFileStatus::Ok,
            keys: Some(keys),
            scope: "route",
            problem: None,
            warnings: Vec::new(),
        }
    }

    /// Keys are enforced only when a readable file holds at least one key;
    /// otherwise requests pass (deliberate fail-open, logged loudly).
    pub fn enforced(&self) -> Option<&KeySet> {
        self.keys.as_ref().filter(|k| !k.is_empty())
    }

    /// Whether `other` read the same: same status, problem, warnings and
    /// keys. What decides whether a reload logs the file again (a rotation
    /// to as many keys is a change too).
    pub(super) fn same_as(&self, other: &KeyState) -> bool {
        self.status == other.status
            && self.problem == other.problem
            && self.warnings == other.warnings
            && self.keys == other.keys
    }

    /// What the log says about this file, never key text. A missing or
    /// unreadable file leaves authentication off: ERROR, except a missing
    /// one when no key file is `expected` (the demo), which is how it is
    /// meant to run (INFO). An empty file is a WARN, as are its dropped
    /// entries.
    pub(super) fn report(&self, expected: bool) -> Vec<(Level, String)> {
        let path = self.path.display();
        let mut lines: Vec<(Level, String)> = self
            .warnings
            .iter()
            .map(|w| (Level::Warn, format!("api key file {path}: {w}")))
            .collect();
        lines.push(match (self.status, &self.keys) {
            (KeyFileStatus::Missing, _) => (
                if expected { Level::Error } else { Level::Info },
                format!("api key file {path} does not exist: authentication is OFF (fail-open)"),
            ),
            (KeyFileStatus::Unreadable, _) => (
                Level::Error,
                format!(
                    "api key file {path} cannot be read ({}): authentication is OFF (fail-open)",
                    self.problem.as_deref().unwrap_or("unknown error")
                ),
            ),
            (KeyFileStatus::Ok, Some(keys)) if keys.only_placeholders() => (
                Level::Error,
                format!(
                    "api key file {path} holds only the documented placeholder key: every request is refused (401) until real keys are in it"
                ),
            ),
            (KeyFileStatus::Ok, Some(keys)) if !keys.is_empty() => (
                Level::Info,
                format!("api key file {path}: {} keys loaded", keys.len()),
            ),
            (KeyFileStatus::Ok, _) => (
                Level::Warn,
                format!(
                    "api key file {path} holds no valid keys: authentication is OFF (fail-open)"
                ),
            ),
        });
        lines
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(dir: &Path, text: Option<&str>) -> KeyState {
        let path = dir.join("keys");
        if let Some(text) = text {
            std::fs::write(&path, text).expect("write");
        }
        KeyState::load(&path, "shared")
    }

    fn levels(lines: &[(Level, String)]) -> Vec<Level> {
        lines.iter().map(|(l, _)| *l).collect()
    }

    #[test]
    fn a_missing_file_is_an_error_unless_none_is_expected() {
        let dir = tempfile::tempdir().expect("tempdir");
        let missing = state(dir.path(), None);
        let lines = missing.report(true);
        assert_eq!(levels(&lines), [Level::Error]);
        assert!(lines[0].1.contains("authentication is OFF"), "{lines:?}");
        // The demo: the same state, said at INFO.
        assert_eq!(levels(&missing.report(false)), [Level::Info]);
    }

    #[test]
    fn an_unreadable_file_is_an_error_even_when_none_is_expected() {
        let dir = tempfile::tempdir().expect("tempdir");
        // A directory where the file should be.
        let unreadable = KeyState::load(dir.path(), "shared");
        for expected in [true, false] {
            let lines = unreadable.report(expected);
            assert_eq!(levels(&lines), [Level::Error], "{lines:?}");
            assert!(lines[0].1.contains("cannot be read ("), "{lines:?}");
        }
    }

    #[test]
    fn keys_loaded_are_info_and_an_empty_file_or_a_bad_entry_a_warning() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ok = state(dir.path(), Some("SECRETk1:alice\n"));
        assert_eq!(levels(&ok.report(true)), [Level::Info]);
        let empty = state(dir.path(), Some("# none yet\n"));
        assert_eq!(levels(&empty.report(true)), [Level::Warn]);
        let odd = state(dir.path(), Some("SECRETk1:alice,SECRET k2:bob\n"));
        let lines = odd.report(true);
        assert_eq!(levels(&lines), [Level::Warn, Level::Info]);
        assert!(
            lines.iter().all(|(_, l)| !l.contains("SECRET")),
            "{lines:?}"
        );
    }

    #[test]
    fn a_reread_is_the_same_until_the_file_changes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let first = state(dir.path(), Some("k1:alice\n"));
        assert!(first.same_as(&state(dir.path(), Some("k1:alice\n"))));
        // Control: a rotation to as many keys, an owner renamed, the file
        // gone: each is a change.
        assert!(!first.same_as(&state(dir.path(), Some("k2:alice\n"))));
        assert!(!first.same_as(&state(dir.path(), Some("k1:bob\n"))));
        std::fs::remove_file(dir.path().join("keys")).expect("remove");
        assert!(!first.same_as(&state(dir.path(), None)));
    }
}
