//! Host names to addresses, with how long the answer holds: hickory's
//! resolver, on the system's configuration (`/etc/resolv.conf`, its search
//! domains and `ndots`) or on the name servers gateway.yaml names
//! (`resolver.nameservers`), and the hosts file before either
//! (`resolver.hosts_file`, `/etc/hosts` by default).
//!
//! Hickory reads the hosts file once, when the resolver is built, so a name
//! listed there (Docker's `extra_hosts`, a bare-metal host file) would keep
//! its first address for the life of the process. The file is followed here
//! instead, the way glibc does it: before each lookup its identity (inode,
//! size, modification and change times) is compared with the version read,
//! and a changed file is read again, so an edit is seen at the next lookup
//! pass. A name the file lists is answered from it alone, as glibc's
//! `hosts: files dns` does (hickory would also ask the name servers for the
//! other address family); hickory gets the same entries
//! (`Resolver::set_hosts`) for the names it builds from search domains.

use crate::config::resolver::ResolverConfig;
use hickory_resolver::config::{ConnectionConfig, NameServerConfig, ResolveHosts, ResolverOpts};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::proto::op::Query;
use hickory_resolver::proto::rr::{Name, RecordType};
use hickory_resolver::Hosts;
use parking_lot::{Mutex, RwLock};
use std::net::IpAddr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

pub struct Resolver {
    /// Replaced by a copy with the new hosts when the file changes; a
    /// lookup runs on a clone (the clones share hickory's answer cache).
    inner: RwLock<hickory_resolver::TokioResolver>,
    hosts: Mutex<HostsFile>,
    pub config: ResolverConfig,
}

/// The hosts file, and which version of it hickory holds.
struct HostsFile {
    path: PathBuf,
    /// The file when last read; None before the first read.
    seen: Option<Seen>,
    /// Its entries as last read.
    entries: Arc<Hosts>,
}

/// A read of the hosts file.
struct Seen {
    /// None: absent or unreadable.
    version: Option<Version>,
    text: Option<Vec<u8>>,
    at: SystemTime,
}

/// What tells two versions of a file apart without reading it: a rename
/// over it is another inode, an edit in place moves its times (ctime too,
/// which a writer cannot set back) or its size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Version {
    dev: u64,
    inode: u64,
    len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
    modified: Option<SystemTime>,
}

/// How long after a file's modification time a write may still leave the
/// same times and size (a filesystem's timestamp granularity: a clock
/// tick, and whole seconds on some): a version this recent when it was read
/// is read again at the next lookup, as git treats a racily clean file.
const RACY: Duration = Duration::from_secs(2);

impl Version {
    fn of(path: &Path) -> Option<Version> {
        let m = std::fs::metadata(path).ok()?;
        Some(Version {
            dev: m.dev(),
            inode: m.ino(),
            len: m.len(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
            modified: m.modified().ok(),
        })
    }

    /// Whether a read at `at` saw this version's last write for certain.
    fn settled_by(&self, at: SystemTime) -> bool {
        self.modified
            .and_then(|m| m.checked_add(RACY))
            .is_some_and(|m| m <= at)
    }
}

impl HostsFile {
    /// The file's entries if it changed since it was last read (or was never
    /// read), None when it did not. A file that cannot be read has none.
    // A stat per lookup pass, and a read of a file of a few lines when it
    // may have changed: too little to hand to a blocking thread.
    fn changed(&mut self) -> Option<Hosts> {
        let version = Version::of(&self.path);
        if let Some(seen) = &self.seen {
            let settled = version.is_none_or(|v| v.settled_by(seen.at));
            if seen.version == version && settled {
                return None;
            }
        }
        let at = SystemTime::now();
        let read = std::fs::read(&self.path);
        let previous = self.seen.take();
        let text = read.as_ref().ok().cloned();
        let same = previous.as_ref().is_some_and(|p| p.text == text);
        self.seen = Some(Seen { version, text, at });
        if same {
            return None;
        }
        let path = self.path.display();
        let mut hosts = Hosts::default();
        match read {
            Ok(bytes) => {
                if let Err(e) = hosts.read_hosts_conf(bytes.as_slice()) {
                    log::warn!("hosts file {path}: read only in part ({e})");
                }
                if previous.is_some() {
                    log::info!("hosts file {path}: changed, read again");
                }
            }
            // No hosts file is a normal setup (a minimal container); one
            // that goes away takes its names with it, as with glibc.
            Err(e) if previous.is_none() => log::debug!("hosts file {path}: {e}"),
            Err(e) => log::warn!("hosts file {path}: {e}; its names are looked up in the DNS"),
        }
        Some(hosts)
    }
}

/// Why a name has no address.
#[derive(Debug, Clone, PartialEq)]
pub struct LookupError {
    /// The name server said the name has no address (NXDOMAIN, or no A /
    /// AAAA record): for a headless Service, no engine is ready. Otherwise
    /// the question went unanswered (timeout, no server), which says nothing
    /// of the engines.
    pub no_address: bool,
    pub message: String,
}

impl Resolver {
    pub fn new(config: &ResolverConfig) -> Result<Self, String> {
        let mut builder = if config.nameservers.is_empty() {
            hickory_resolver::Resolver::builder_tokio()
                .map_err(|e| format!("cannot read the system's resolver configuration: {e}"))?
        } else {
            let servers = config
                .nameservers
                .iter()
                .map(|server| {
                    let mut udp = ConnectionConfig::udp();
                    udp.port = server.port();
                    let mut tcp = ConnectionConfig::tcp();
                    tcp.port = server.port();
                    NameServerConfig::new(server.ip(), true, vec![udp, tcp])
                })
                .collect();
            hickory_resolver::Resolver::builder_with_config(
                hickory_resolver::config::ResolverConfig::from_name_servers(servers),
                TokioRuntimeProvider::default(),
            )
        };
        let opts: &mut ResolverOpts = builder.options_mut();
        // A lookup is bounded (two tries of 2 s), and an answer is never
        // cached past the longest the gateway waits to ask again, nor a
        // refusal past the shortest: the cache must not hide a change the
        // schedule is there to see.
        opts.timeout = Duration::from_secs(2);
        opts.attempts = 2;
        opts.positive_max_ttl = Some(config.max_ttl);
        opts.negative_max_ttl = Some(config.min_ttl);
        // Read here, and again whenever it changes (`follow_hosts_file`).
        opts.use_hosts_file = ResolveHosts::Never;
        let inner = builder
            .build()
            .map_err(|e| format!("cannot build the resolver: {e}"))?;
        let resolver = Resolver {
            inner: RwLock::new(inner),
            hosts: Mutex::new(HostsFile {
                path: config.hosts_file.clone(),
                seen: None,
                entries: Arc::default(),
            }),
            config: config.clone(),
        };
        resolver.follow_hosts_file();
        Ok(resolver)
    }

    /// The hosts file's entries, read again (and handed to hickory) if the
    /// file changed since it was last read.
    fn follow_hosts_file(&self) -> Arc<Hosts> {
        // Held across the check and the swap: two lookups that see the same
        // change read the file once, and the older read cannot land last.
        let mut file = self.hosts.lock();
        if let Some(hosts) = file.changed() {
            file.entries = Arc::new(hosts);
            self.inner.write().set_hosts(Arc::clone(&file.entries));
        }
        Arc::clone(&file.entries)
    }

    /// Every address of `name`, sorted (so that replicas asking the same
    /// server agree on the first), and how long to wait before asking again.
    pub async fn lookup(&self, name: &str) -> Result<(Vec<IpAddr>, Duration), LookupError> {
        let listed = listed_addresses(&self.follow_hosts_file(), name);
        if !listed.is_empty() {
            return Ok((listed, self.config.max_ttl));
        }
        let resolver = self.inner.read().clone();
        match resolver.lookup_ip(name).await {
            Ok(found) => {
                let mut addrs: Vec<IpAddr> = found.iter().collect();
                addrs.sort();
                addrs.dedup();
                let ttl = found
                    .valid_until()
                    .saturating_duration_since(Instant::now());
                if addrs.is_empty() {
                    return Err(LookupError {
                        no_address: true,
                        message: "no address".into(),
                    });
                }
                Ok((addrs, self.config.next_lookup(ttl)))
            }
            Err(e) => Err(LookupError {
                no_address: e.is_no_records_found(),
                message: e.to_string(),
            }),
        }
    }

    /// Forgets cached answers: after an engine refused a connection, its
    /// name is asked again, not answered from the cache.
    pub fn forget(&self) {
        self.inner.read().clear_cache();
    }
}

/// The addresses `hosts` lists for `name` exactly, sorted.
fn listed_addresses(hosts: &Hosts, name: &str) -> Vec<IpAddr> {
    let Ok(name) = Name::from_ascii(name.to_ascii_lowercase()) else {
        return Vec::new();
    };
    let mut addrs: Vec<IpAddr> = [RecordType::A, RecordType::AAAA]
        .into_iter()
        .filter_map(|kind| hosts.lookup_static_host(&Query::query(name.clone(), kind)))
        .flat_map(|found| {
            found
                .answers()
                .iter()
                .filter_map(|r| r.data.ip_addr())
                .collect::<Vec<_>>()
        })
        .collect();
    addrs.sort();
    addrs.dedup();
    addrs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolver_on(hosts: &Path) -> Resolver {
        let config = ResolverConfig {
            // A name the hosts file holds never reaches a name server.
            nameservers: vec!["127.0.0.1:9".parse().unwrap()],
            hosts_file: hosts.to_path_buf(),
            ..ResolverConfig::default()
        };
        Resolver::new(&config).unwrap()
    }

    fn first(resolver: &Resolver, name: &str) -> Option<IpAddr> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime
            .block_on(resolver.lookup(name))
            .ok()
            .and_then(|(addrs, _)| addrs.first().copied())
    }

    #[test]
    fn the_hosts_file_is_read_again_when_it_changes_and_only_then() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hosts");
        std::fs::write(&path, "127.0.0.2 engine.test\n").unwrap();
        let mut file = HostsFile {
            path: path.clone(),
            seen: None,
            entries: Arc::default(),
        };
        assert!(file.changed().is_some(), "read the first time");
        assert!(file.changed().is_none(), "not again while unchanged");
        // Same size, written within the same clock tick as likely as not:
        // another version all the same.
        std::fs::write(&path, "127.0.0.3 engine.test\n").unwrap();
        assert!(file.changed().is_some());
        assert!(file.changed().is_none());
        // Replaced by rename, then gone: both are changes.
        let next = dir.path().join("hosts.new");
        std::fs::write(&next, "127.0.0.4 engine.test\n").unwrap();
        std::fs::rename(&next, &path).unwrap();
        assert!(file.changed().is_some());
        std::fs::remove_file(&path).unwrap();
        assert!(file.changed().is_some());
        assert!(file.changed().is_none(), "still gone: nothing new");
        // A version read long after its last write is not read again.
        std::fs::write(&path, "127.0.0.5 engine.test\n").unwrap();
        assert!(file.changed().is_some());
        let seen = file.seen.as_mut().unwrap();
        seen.at += RACY;
        assert!(Version::of(&path).unwrap().settled_by(seen.at));
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, "127.0.0.5 engine.test\n").unwrap();
        assert!(file.changed().is_none(), "rewritten with the same text");
    }

    #[test]
    fn a_lookup_answers_from_the_hosts_file_as_it_is_now() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hosts");
        std::fs::write(&path, "127.0.0.2 engine.test\n").unwrap();
        let resolver = resolver_on(&path);
        let ip = |last: u8| Some(IpAddr::from([127, 0, 0, last]));
        assert_eq!(first(&resolver, "engine.test"), ip(2));
        std::fs::write(&path, "127.0.0.3 engine.test\n127.0.0.4 late.test\n").unwrap();
        assert_eq!(first(&resolver, "engine.test"), ip(3));
        assert_eq!(first(&resolver, "late.test"), ip(4));
    }
}
