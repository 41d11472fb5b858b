//! Host names to addresses, with how long the answer holds: hickory's
//! resolver, on the system's configuration (`/etc/resolv.conf`, its search
//! domains and `ndots`, `/etc/hosts`) or on the name servers gateway.yaml
//! names (`resolver.nameservers`).

use crate::config::resolver::ResolverConfig;
use hickory_resolver::config::{ConnectionConfig, NameServerConfig, ResolverOpts};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use std::net::IpAddr;
use std::time::{Duration, Instant};

pub struct Resolver {
    inner: hickory_resolver::TokioResolver,
    pub config: ResolverConfig,
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
        let inner = builder
            .build()
            .map_err(|e| format!("cannot build the resolver: {e}"))?;
        Ok(Resolver {
            inner,
            config: config.clone(),
        })
    }

    /// Every address of `name`, sorted (so that replicas asking the same
    /// server agree on the first), and how long to wait before asking again.
    pub async fn lookup(&self, name: &str) -> Result<(Vec<IpAddr>, Duration), LookupError> {
        match self.inner.lookup_ip(name).await {
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
        self.inner.clear_cache();
    }
}
