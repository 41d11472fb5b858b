//! API keys: the key file, and matching the key a request presents.
//!
//! # Key file format
//!
//! `key1:owner1,key2:owner2`, or one entry per line, or both mixed. Blank
//! lines and lines whose first non-blank character is `#` are ignored (a `#`
//! later in a line is ordinary text). Whitespace around each entry, key and
//! owner is trimmed, and a UTF-8 byte-order mark at the start is skipped.
//! Empty entries (`a:x,,b:y`, a trailing comma) are skipped silently.
//!
//! Choices, each of which produces a warning when it applies:
//! - The key is everything before the **first** `:`, the owner everything
//!   after it, so owners may contain `:` (`svc:team:prod`) and keys may not.
//!   Generated API keys are token-shaped and never contain `:`, while owner
//!   labels like `team:service` are common.
//! - An entry without `:` is accepted as a key owned by `"unknown"`. The
//!   usual way to get this wrong is a file holding just the key; dropping it
//!   would leave zero keys, which fails open, so accepting it is the safer
//!   reading. An empty owner (`key:`) is also recorded as `"unknown"`.
//! - A key must be printable ASCII without whitespace (what a client can put
//!   in a header verbatim). Anything else — usually keys separated by spaces
//!   instead of commas — is dropped.
//! - A key listed twice keeps its first owner.
//!
//! Warnings name the line, the entry and (when known) the owner, never key
//! text, so they can go straight to the log.
//!
//! # Fail-open
//!
//! With no usable key file requests are let through (see the README's
//! "Authentication"): a broken secret that 401s the whole gateway is worse
//! than a short window without authentication. A file that parses to zero
//! keys is treated the same way — [`KeySet::is_empty`] means "not
//! configured" — and reported as status `ok` with 0 keys plus a logged
//! warning, so `api_keys_configured: false` is the signal to alert on.
//!
//! # Matching
//!
//! Keys are held only as SHA-256 digests. [`KeySet::check`] hashes the
//! presented key and compares it with every stored digest in constant time,
//! without stopping at a match, so response timing reveals neither how much of
//! a key was right, nor the stored keys' lengths, nor which entry matched.

use std::collections::HashMap;
use std::fmt;
use std::io::ErrorKind;
use std::path::Path;

use subtle::{Choice, ConditionallySelectable, ConstantTimeEq};

/// Owner recorded for an entry that names none.
pub const UNKNOWN_OWNER: &str = "unknown";

/// Outcome of reading the key file, as `/_health_status` reports it.
///
/// `Missing` and `Unreadable` both fail open but mean opposite things:
/// missing is presumably deliberate, unreadable is a broken mount or wrong
/// permissions that an operator has to fix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyFileStatus {
    Ok,
    Missing,
    Unreadable,
}

impl KeyFileStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            KeyFileStatus::Ok => "ok",
            KeyFileStatus::Missing => "missing",
            KeyFileStatus::Unreadable => "unreadable",
        }
    }
}

/// Compared (`PartialEq`) only to tell whether a re-read file changed,
/// never against a presented key (that is [`KeySet::check`]).
#[derive(Clone, PartialEq, Eq)]
struct KeyEntry {
    digest: [u8; 32],
    /// Shared, so a request's tenant (its key's owner) is a reference
    /// count, not a copy (`check`).
    owner: std::sync::Arc<str>,
    /// The documented placeholder ([`PLACEHOLDER_KEY`]): kept, so that a
    /// file holding only it still enforces keys (every request refused)
    /// instead of reading as "no keys" and turning authentication off, but
    /// never matched.
    placeholder: bool,
}

/// The key the example Secret and the docs ship (`deploy/k8s/base/secret-api-keys.yaml`).
/// Applied unchanged it must not open the gateway to anyone who read the
/// docs: it never matches, and a file of placeholders refuses every request
/// and says so.
pub const PLACEHOLDER_KEY: &str = "sk-replace-me";

/// The accepted API keys and their owners.
///
/// `Debug` shows the key count and owners only; key material is never held
/// in clear, so it cannot leak through logs or panics either.
#[derive(Default, Clone, PartialEq, Eq)]
pub struct KeySet {
    entries: Vec<KeyEntry>,
}

impl fmt::Debug for KeySet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let owners: Vec<&str> = self.entries.iter().map(|e| &*e.owner).collect();
        f.debug_struct("KeySet")
            .field("keys", &self.entries.len())
            .field("owners", &owners)
            .finish()
    }
}

/// What reading a key file found, and what an operator should be told
/// about it (never key text). Nothing is logged here: the registry logs a
/// file's state when it changes (`registry/keys.rs`), not at every read.
#[derive(Debug, Clone)]
pub struct KeyFileRead {
    pub status: KeyFileStatus,
    /// `Some` (possibly empty) exactly when `status` is `Ok`.
    pub keys: Option<KeySet>,
    /// Why an unreadable file could not be read.
    pub problem: Option<String>,
    /// One per entry dropped or reinterpreted.
    pub warnings: Vec<String>,
}

impl KeySet {
    /// Reads and parses the key file.
    ///
    /// Only "no such file" is `Missing`. Everything else that stops the read
    /// is `Unreadable`: permissions, a directory, a path through a regular
    /// file, content that is not UTF-8, and a dangling symlink — Kubernetes
    /// secret mounts are symlinks, and one pointing nowhere is a broken
    /// mount, not an absent file. (Mode 000 only reads as `Unreadable` when
    /// not running as root.)
    pub fn read(path: &Path) -> KeyFileRead {
        let refused = |status, problem: Option<String>| KeyFileRead {
            status,
            keys: None,
            problem,
            warnings: Vec::new(),
        };
        let bytes = match std::fs::read(path) {
            Ok(bytes) => bytes,
            Err(error) if error.kind() == ErrorKind::NotFound && !is_dangling_symlink(path) => {
                return refused(KeyFileStatus::Missing, None);
            }
            Err(error) => return refused(KeyFileStatus::Unreadable, Some(error.to_string())),
        };
        let Ok(text) = String::from_utf8(bytes) else {
            return refused(KeyFileStatus::Unreadable, Some("not valid UTF-8".into()));
        };
        let (set, warnings) = KeySet::parse(&text);
        KeyFileRead {
            status: KeyFileStatus::Ok,
            keys: Some(set),
            problem: None,
            warnings,
        }
    }

    /// [`KeySet::read`]'s status and keys: `Ok` always comes with
    /// `Some(set)`, possibly empty; the other statuses come with `None`.
    pub fn load(path: &Path) -> (KeyFileStatus, Option<KeySet>) {
        let read = Self::read(path);
        (read.status, read.keys)
    }

    /// Parses key file text (format in the module docs). Returns the keys
    /// that were usable and one warning per entry that was dropped or
    /// reinterpreted; warnings never contain key text.
    pub fn parse(text: &str) -> (KeySet, Vec<String>) {
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        let mut built = Builder::default();
        for (line_index, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            for (entry_index, entry) in line.split(',').enumerate() {
                let entry = entry.trim();
                if entry.is_empty() {
                    continue;
                }
                let location = format!("line {}, entry {}", line_index + 1, entry_index + 1);
                let (key, owner) = match entry.split_once(':') {
                    Some((key, owner)) => (key.trim(), Some(owner.trim())),
                    None => {
                        built.warnings.push(format!(
                            "{location}: no ':' separator; accepted as a key with owner \"{UNKNOWN_OWNER}\""
                        ));
                        (entry, None)
                    }
                };
                built.add(location, key, owner);
            }
        }
        (built.set, built.warnings)
    }

    /// The keys of an inline `{key: owner}` table (the OpenResty gateway's
    /// per-route `api_keys`), each entry checked as a file's is; warnings
    /// name an entry by its place and owner, never its key.
    pub fn from_table<'a>(
        table: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> (KeySet, Vec<String>) {
        let mut built = Builder::default();
        for (index, (key, owner)) in table.into_iter().enumerate() {
            built.add(
                format!("entry {}", index + 1),
                key.trim(),
                Some(owner.trim()),
            );
        }
        (built.set, built.warnings)
    }

    /// The keys that can match (the placeholder is not one).
    pub fn len(&self) -> usize {
        self.entries.iter().filter(|e| !e.placeholder).count()
    }

    /// Keys are configured, but the only ones are the documented
    /// placeholder: every request is refused.
    pub fn only_placeholders(&self) -> bool {
        !self.entries.is_empty() && self.entries.iter().all(|e| e.placeholder)
    }

    /// No keys means authentication is not configured: callers let requests
    /// through rather than 401 everything (see the module docs).
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The owner of `presented` if it is one of the keys, else `None` (always
    /// `None` for an empty set — the caller decides about fail-open).
    ///
    /// Comparison is over SHA-256 digests with `subtle`, visiting every entry
    /// whatever matches, so the time taken depends only on the number of keys
    /// and the length of the presented key, which the client already knows.
    ///
    /// The owner as the set holds it, shared: the request's tenant is a
    /// reference count, not a copy.
    pub fn check(&self, presented: &[u8]) -> Option<&std::sync::Arc<str>> {
        let presented_digest = sha256::digest(presented);
        let mut matched = Choice::from(0);
        let mut matched_index = 0u64;
        for (index, entry) in self.entries.iter().enumerate() {
            let is_this_key = entry.digest[..].ct_eq(&presented_digest[..])
                & Choice::from(u8::from(!entry.placeholder));
            matched_index =
                u64::conditional_select(&matched_index, &(index as u64), is_this_key & !matched);
            matched |= is_this_key;
        }
        if !bool::from(matched) {
            return None;
        }
        usize::try_from(matched_index)
            .ok()
            .and_then(|index| self.entries.get(index))
            .map(|entry| &entry.owner)
    }
}

/// A key set as its entries are added, with what was said about them.
#[derive(Default)]
struct Builder {
    set: KeySet,
    warnings: Vec<String>,
    /// Where each key was first seen and at which index, so a duplicate's
    /// warning can point at the original without quoting the key.
    first_seen: HashMap<[u8; 32], (String, usize)>,
}

impl Builder {
    /// One entry at `location`; `owner` is `None` when the entry named none.
    fn add(&mut self, location: String, key: &str, owner: Option<&str>) {
        if key.is_empty() {
            self.warnings
                .push(format!("{location}: empty key; entry ignored"));
            return;
        }
        let owner_text = owner.unwrap_or("");
        if !key.bytes().all(|byte| byte.is_ascii_graphic()) {
            self.warnings.push(format!(
                "{location} (owner \"{owner_text}\"): key contains whitespace or characters other than printable ASCII; entry ignored"
            ));
            return;
        }
        let owner = match owner {
            Some("") => {
                self.warnings.push(format!(
                    "{location}: empty owner; recorded as \"{UNKNOWN_OWNER}\""
                ));
                UNKNOWN_OWNER
            }
            Some(owner) => owner,
            None => UNKNOWN_OWNER,
        };
        let digest = sha256::digest(key.as_bytes());
        let entries = &mut self.set.entries;
        if let Some((original, kept_index)) = self.first_seen.get(&digest) {
            let kept_owner = entries
                .get(*kept_index)
                .map_or(UNKNOWN_OWNER, |e| &*e.owner);
            self.warnings.push(format!(
                "{location}: same key as {original}; the first owner (\"{kept_owner}\") is kept"
            ));
            return;
        }
        let placeholder = key == PLACEHOLDER_KEY;
        if placeholder {
            self.warnings.push(format!(
                "{location} (owner \"{owner}\"): the documented placeholder key is never accepted; put real keys in this file"
            ));
        }
        self.first_seen.insert(digest, (location, entries.len()));
        entries.push(KeyEntry {
            digest,
            owner: std::sync::Arc::from(owner),
            placeholder,
        });
    }
}

fn is_dangling_symlink(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|meta| meta.file_type().is_symlink())
}

/// The key a request presents: `Authorization: Bearer <key>` (scheme in any
/// case, surrounding whitespace ignored), else `x-api-key`. OpenAI clients
/// send the former, Anthropic-style clients the latter. An `Authorization`
/// header with another scheme, or `Bearer` with nothing after it, does not
/// hide a usable `x-api-key`.
pub fn presented_key(headers: &http::HeaderMap) -> Option<&[u8]> {
    headers
        .get_all(http::header::AUTHORIZATION)
        .iter()
        .find_map(|value| bearer_token(value.as_bytes()))
        .or_else(|| {
            headers
                .get_all("x-api-key")
                .iter()
                .map(|value| value.as_bytes().trim_ascii())
                .find(|key| !key.is_empty())
        })
}

/// The token of the request's `Authorization: Bearer <token>`, the
/// only way the admin listener takes its token (not `x-api-key`).
pub fn bearer(headers: &http::HeaderMap) -> Option<&[u8]> {
    headers
        .get_all(http::header::AUTHORIZATION)
        .iter()
        .find_map(|value| bearer_token(value.as_bytes()))
}

fn bearer_token(header_value: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = header_value
        .trim_ascii()
        .split_at_checked(b"bearer".len())?;
    let separated = rest
        .first()
        .is_some_and(|byte| *byte == b' ' || *byte == b'\t');
    if !scheme.eq_ignore_ascii_case(b"bearer") || !separated {
        return None;
    }
    let token = rest.trim_ascii();
    (!token.is_empty()).then_some(token)
}

/// Keys become fixed-size digests so that comparing them leaks neither
/// their content nor their length.
mod sha256 {
    use sha2::{Digest, Sha256};

    pub(super) fn digest(message: &[u8]) -> [u8; 32] {
        Sha256::digest(message).into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderMap, HeaderValue};

    fn parse_ok(text: &str) -> KeySet {
        let (set, warnings) = KeySet::parse(text);
        assert!(warnings.is_empty(), "unexpected warnings: {warnings:?}");
        set
    }

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    // ---- sha256 -------------------------------------------------------

    #[test]
    fn sha256_matches_reference_vectors() {
        let long_vector = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
        let cases: [(&[u8], &str); 3] = [
            (
                b"",
                "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
            ),
            (
                b"abc",
                "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
            ),
            (
                long_vector.as_bytes(),
                "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1",
            ),
        ];
        for (message, expected) in cases {
            assert_eq!(hex(&sha256::digest(message)), expected);
        }
    }

    #[test]
    fn parse_comma_separated() {
        let set = parse_ok("k1:alice,k2:bob");
        assert_eq!(set.len(), 2);
        assert_eq!(set.check(b"k1").map(|o| &**o), Some("alice"));
        assert_eq!(set.check(b"k2").map(|o| &**o), Some("bob"));
    }

    #[test]
    fn parse_one_per_line() {
        let set = parse_ok("k1:alice\nk2:bob\n");
        assert_eq!(set.len(), 2);
        assert_eq!(set.check(b"k2").map(|o| &**o), Some("bob"));
    }

    #[test]
    fn parse_mixed_commas_and_lines_with_crlf() {
        let set = parse_ok("k1:alice,k2:bob\r\nk3:carol\r\n  k4 : dave ,  k5:erin  \n");
        assert_eq!(set.len(), 5);
        assert_eq!(set.check(b"k4").map(|o| &**o), Some("dave"));
        assert_eq!(set.check(b"k5").map(|o| &**o), Some("erin"));
    }

    #[test]
    fn parse_skips_comments_blanks_and_empty_entries() {
        let text = "# rotation 2024-06\n\n   \n  # indented comment\nk1:alice,,k2:bob,\n,\n";
        let set = parse_ok(text);
        assert_eq!(set.len(), 2);
        assert_eq!(set.check(b"# rotation 2024-06").map(|o| &**o), None);
    }

    #[test]
    fn parse_skips_leading_byte_order_mark() {
        let set = parse_ok("\u{feff}k1:alice");
        assert_eq!(set.check(b"k1").map(|o| &**o), Some("alice"));
    }

    #[test]
    fn parse_empty_text_is_zero_keys_without_warnings() {
        let set = parse_ok("");
        assert!(set.is_empty());
        assert!(parse_ok("# only comments\n\n").is_empty());
    }

    #[test]
    fn parse_splits_at_first_colon_so_owners_may_contain_colons() {
        let set = parse_ok("k1:team:svc:prod");
        assert_eq!(set.check(b"k1").map(|o| &**o), Some("team:svc:prod"));
        assert_eq!(set.check(b"k1:team").map(|o| &**o), None);
    }

    #[test]
    fn parse_entry_without_colon_is_a_key_owned_by_unknown() {
        let (set, warnings) = KeySet::parse("sk-bare-key");
        assert_eq!(set.check(b"sk-bare-key").map(|o| &**o), Some(UNKNOWN_OWNER));
        assert_eq!(warnings.len(), 1);
        assert!(warnings[0].contains("line 1, entry 1"), "{warnings:?}");
    }

    #[test]
    fn parse_empty_owner_is_unknown_with_warning() {
        let (set, warnings) = KeySet::parse("k1:  ");
        assert_eq!(set.check(b"k1").map(|o| &**o), Some(UNKNOWN_OWNER));
        assert_eq!(warnings.len(), 1);
    }

    #[test]
    fn parse_drops_empty_keys() {
        let (set, warnings) = KeySet::parse(":alice,k2:bob");
        assert_eq!(set.len(), 1);
        assert_eq!(warnings.len(), 1);
        assert!(warnings[0].contains("empty key"));
    }

    #[test]
    fn parse_drops_keys_with_whitespace_or_non_ascii() {
        let (set, warnings) = KeySet::parse("k1 k2:alice\nkëy:bob\nk3\u{7}:carol\nk4:dave");
        assert_eq!(set.len(), 1);
        assert_eq!(set.check(b"k4").map(|o| &**o), Some("dave"));
        assert_eq!(warnings.len(), 3);
        assert!(warnings[0].contains("alice"), "owner helps find the entry");
    }

    #[test]
    fn parse_duplicate_key_keeps_first_owner() {
        let (set, warnings) = KeySet::parse("k1:alice\nk2:bob,k1:mallory");
        assert_eq!(set.len(), 2);
        assert_eq!(set.check(b"k1").map(|o| &**o), Some("alice"));
        assert_eq!(warnings.len(), 1);
        assert!(warnings[0].contains("line 2, entry 2"));
        assert!(warnings[0].contains("line 1, entry 1"));
        assert!(warnings[0].contains("alice"));
    }

    #[test]
    fn warnings_never_contain_key_text() {
        let secret = "SECRETzq9";
        let text = format!(
            "{secret}\n{secret}A:\n{secret}B {secret}C:x\n{secret}D:o1,{secret}D:o2\n{secret}\u{e9}:o"
        );
        let (_, warnings) = KeySet::parse(&text);
        assert_eq!(warnings.len(), 5, "{warnings:?}");
        for warning in &warnings {
            assert!(!warning.contains("SECRET"), "key text leaked: {warning}");
        }
    }

    // ---- check ------------------------------------------------------------

    #[test]
    fn check_accepts_exact_keys_only() {
        let set = parse_ok("sk-alpha-123:alice,sk-beta-456:bob");
        assert_eq!(set.check(b"sk-alpha-123").map(|o| &**o), Some("alice"));
        assert_eq!(set.check(b"sk-beta-456").map(|o| &**o), Some("bob"));
        for wrong in [
            &b"sk-alpha-124"[..],
            b"sk-alpha-12",
            b"sk-alpha-1234",
            b"sk-alpha-123 ",
            b"SK-ALPHA-123",
            b"sk-alpha-123sk-beta-456",
            b"",
            b"alice",
        ] {
            assert_eq!(
                set.check(wrong),
                None,
                "{:?}",
                String::from_utf8_lossy(wrong)
            );
        }
    }

    #[test]
    fn check_finds_any_position_among_many_keys() {
        let text: Vec<String> = (0..50).map(|i| format!("key-{i}:owner-{i}")).collect();
        let set = parse_ok(&text.join(","));
        assert_eq!(set.len(), 50);
        assert_eq!(set.check(b"key-0").map(|o| &**o), Some("owner-0"));
        assert_eq!(set.check(b"key-27").map(|o| &**o), Some("owner-27"));
        assert_eq!(set.check(b"key-49").map(|o| &**o), Some("owner-49"));
        assert_eq!(set.check(b"key-50").map(|o| &**o), None);
    }

    #[test]
    fn check_on_empty_set_matches_nothing() {
        let set = KeySet::default();
        assert!(set.is_empty());
        assert_eq!(set.check(b"").map(|o| &**o), None);
        assert_eq!(set.check(b"anything").map(|o| &**o), None);
    }

    #[test]
    fn key_sets_can_be_shared_across_worker_threads() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<KeySet>();
    }

    // ---- Debug ------------------------------------------------------------

    #[test]
    fn debug_output_has_no_key_material() {
        let set = parse_ok("SECRETzq9:alice,OTHERxy7:bob");
        let debug = format!("{set:?} {set:#?}");
        assert!(
            !debug.contains("SECRET") && !debug.contains("OTHER"),
            "{debug}"
        );
        let digest_hex = hex(&sha256::digest(b"SECRETzq9"));
        assert!(!debug.contains(&digest_hex[..8]), "{debug}");
        assert!(debug.contains("alice") && debug.contains('2'), "{debug}");
    }

    // ---- load -------------------------------------------------------------

    #[test]
    fn load_reads_keys_from_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("keys");
        std::fs::write(&path, "k1:alice,k2:bob\n").expect("write");
        let (status, set) = KeySet::load(&path);
        assert_eq!(status, KeyFileStatus::Ok);
        assert_eq!(status.as_str(), "ok");
        let set = set.expect("Ok comes with a set");
        assert_eq!(set.check(b"k2").map(|o| &**o), Some("bob"));
    }

    #[test]
    fn load_empty_file_is_ok_with_zero_keys() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("keys");
        std::fs::write(&path, "# nothing yet\n").expect("write");
        let (status, set) = KeySet::load(&path);
        assert_eq!(status, KeyFileStatus::Ok);
        assert!(set.expect("Ok comes with a set").is_empty());
    }

    #[test]
    fn load_missing_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (status, set) = KeySet::load(&dir.path().join("no-such-file"));
        assert_eq!(status, KeyFileStatus::Missing);
        assert_eq!(status.as_str(), "missing");
        assert!(set.is_none());
    }

    #[test]
    fn load_directory_is_unreadable() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (status, set) = KeySet::load(dir.path());
        assert_eq!(status, KeyFileStatus::Unreadable);
        assert_eq!(status.as_str(), "unreadable");
        assert!(set.is_none());
    }

    #[test]
    fn load_invalid_utf8_is_unreadable() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("keys");
        std::fs::write(&path, b"k1:alice,\xff\xfe:bob").expect("write");
        assert_eq!(KeySet::load(&path).0, KeyFileStatus::Unreadable);
    }

    #[test]
    fn load_path_through_a_regular_file_is_unreadable() {
        // A secret mounted as a file where a directory was expected.
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("api-keys");
        std::fs::write(&file, "k1:alice").expect("write");
        assert_eq!(
            KeySet::load(&file.join("keys")).0,
            KeyFileStatus::Unreadable
        );
    }

    #[cfg(unix)]
    #[test]
    fn load_dangling_symlink_is_unreadable() {
        let dir = tempfile::tempdir().expect("tempdir");
        let link = dir.path().join("keys");
        std::os::unix::fs::symlink(dir.path().join("..data/keys"), &link).expect("symlink");
        assert_eq!(KeySet::load(&link).0, KeyFileStatus::Unreadable);
    }

    // ---- presented_key ----------------------------------------------------

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, HeaderValue::from_static(value));
        }
        map
    }

    #[test]
    fn presented_key_reads_bearer_in_any_case_and_trims() {
        for value in [
            "Bearer sk-1",
            "bearer sk-1",
            "BEARER sk-1",
            "  Bearer    sk-1  ",
            "Bearer\tsk-1",
        ] {
            let map = headers(&[("authorization", value)]);
            assert_eq!(presented_key(&map), Some(&b"sk-1"[..]), "{value:?}");
        }
    }

    #[test]
    fn presented_key_rejects_malformed_bearer() {
        for value in [
            "Bearer",
            "Bearer   ",
            "Bearersk-1",
            "Basic dXNlcjpwYXNz",
            "sk-1",
        ] {
            let map = headers(&[("authorization", value)]);
            assert_eq!(presented_key(&map), None, "{value:?}");
        }
    }

    #[test]
    fn presented_key_falls_back_to_x_api_key() {
        let map = headers(&[("x-api-key", " sk-2 ")]);
        assert_eq!(presented_key(&map), Some(&b"sk-2"[..]));
        let map = headers(&[("authorization", "Basic abc"), ("x-api-key", "sk-2")]);
        assert_eq!(presented_key(&map), Some(&b"sk-2"[..]));
        let map = headers(&[("authorization", "Bearer "), ("x-api-key", "sk-2")]);
        assert_eq!(presented_key(&map), Some(&b"sk-2"[..]));
        let map = headers(&[("x-api-key", "  ")]);
        assert_eq!(presented_key(&map), None);
    }

    #[test]
    fn presented_key_prefers_bearer_over_x_api_key() {
        let map = headers(&[("x-api-key", "sk-2"), ("authorization", "Bearer sk-1")]);
        assert_eq!(presented_key(&map), Some(&b"sk-1"[..]));
    }

    #[test]
    fn presented_key_absent() {
        assert_eq!(presented_key(&HeaderMap::new()), None);
    }
}
