//! Keeping each route's engines' addresses current while the gateway runs.
//!
//! A route's peers are the ones its file lists (a host name is looked up
//! again whenever its answer's TTL runs out, within `resolver.min_ttl` ..
//! `max_ttl`, and at once when `RouteRuntime::rediscover` is notified: an
//! engine refused a connection, a probe could not connect, a reload
//! changed the route) and, with `peers_from`, one per address of a DNS
//! name or per ready endpoint of the EndpointSlices a selector matches
//! (`kubernetes.rs`). One task per route runtime (`spawn`, started by
//! `health::Tasks`) does the looking; what it finds goes into
//! `RouteRuntime::found`, and when an address changes it has the registry
//! build a new version of the route on the same config
//! (`Registry::rediscovered`), whose probes and scrapes `Tasks::sync`
//! restarts: a peer at a new address is a new peer (its state keyed by
//! that address), and the sessions of the one it replaces go
//! (`SessionTable::forget_peer`), as a removed peer's do, since the engine
//! behind the new address holds none of their cache.
//!
//! Before the listeners open, [`first_pass`] looks every route's names up
//! once.

pub mod found;
pub mod kubernetes;
pub mod resolver;

use crate::config::{PeerSource, RouteConfig};
use crate::registry::{Registry, Route, RouteRuntime};
use found::{Found, HostAnswer};
use kubernetes::Endpoint;
use resolver::Resolver;
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

/// The least time between two lookups a refused connection asks for.
const FORCED_GAP: Duration = Duration::from_millis(250);

/// The listed peers' host names that need a lookup.
fn names(config: &RouteConfig) -> Vec<String> {
    let mut names: Vec<String> = config
        .peers
        .iter()
        .filter(|p| p.host.parse::<IpAddr>().is_err())
        .map(|p| p.host.clone())
        .collect();
    names.sort();
    names.dedup();
    names
}

/// One pass over the listed names and a `peers_from.dns` name; returns
/// what it found and when to look again.
async fn look_up(resolver: &Resolver, config: &RouteConfig, found: &Found) -> (Found, Duration) {
    let mut next = resolver.config.max_ttl;
    let mut out = Found {
        hosts: BTreeMap::new(),
        ..found.clone()
    };
    for host in names(config) {
        let before = found.hosts.get(&host).cloned().unwrap_or_default();
        let answer = match resolver.lookup(&host).await {
            Ok((addrs, again)) => {
                next = next.min(again);
                HostAnswer {
                    addr: addrs.first().copied(),
                    error: None,
                }
            }
            Err(e) => {
                next = resolver.config.min_ttl;
                if before.error.as_ref() != Some(&e.message) {
                    match before.addr {
                        Some(addr) => log::warn!("peer host {host}: cannot resolve ({}); still using {addr}", e.message),
                        None => log::error!("peer host {host}: cannot resolve ({}); its peer gets no traffic until it does, retried every {:?}", e.message, resolver.config.min_ttl),
                    }
                }
                HostAnswer {
                    addr: before.addr,
                    error: Some(e.message),
                }
            }
        };
        if answer.addr != before.addr {
            if let (Some(old), Some(new)) = (before.addr, answer.addr) {
                log::info!("peer host {host}: now {new} (was {old}); its sessions move");
            } else if let Some(new) = answer.addr {
                log::info!("peer host {host}: resolved to {new}");
            }
        }
        out.hosts.insert(host, answer);
    }
    match &config.peers_from {
        Some(from) => match &from.source {
            PeerSource::Dns { name, port } => match resolver.lookup(name).await {
                Ok((addrs, again)) => {
                    next = next.min(again);
                    let set = addrs
                        .into_iter()
                        .map(|ip| {
                            let addr = std::net::SocketAddr::new(ip, *port);
                            Endpoint {
                                name: addr.to_string(),
                                addr,
                            }
                        })
                        .collect();
                    out.set = Some(set);
                    out.set_error = None;
                }
                Err(e) => {
                    next = resolver.config.min_ttl;
                    if e.no_address {
                        // A headless Service with no ready pod: no engine.
                        out.set = Some(Vec::new());
                    }
                    if found.set_error.as_ref() != Some(&e.message) {
                        log::warn!("peers_from dns {name}: {}", e.message);
                    }
                    out.set_error = Some(e.message);
                }
            },
            PeerSource::Kubernetes(_) => {}
        },
        None => {
            out.set = None;
            out.set_error = None;
        }
    }
    (out, next)
}

/// What a discovery task calls after its route was rebuilt with other
/// addresses: the route's background tasks follow (`health::Tasks::sync`).
pub type Rebuilt = Box<dyn Fn(&Arc<Registry>) + Send + Sync>;

/// Stores what was found; when an address changed, the route is rebuilt
/// and its background tasks follow.
fn publish(
    registry: &Arc<Registry>,
    rebuilt: &Rebuilt,
    name: &str,
    runtime: &RouteRuntime,
    found: Found,
) {
    if store(runtime, found) && registry.rediscovered(name) {
        rebuilt(registry);
    }
}

/// Keeps `found` as the route's findings; whether it gives other addresses.
fn store(runtime: &RouteRuntime, found: Found) -> bool {
    let mut current = runtime.found.lock();
    let changed = !current.same_addresses(&found);
    *current = found;
    changed
}

/// Route `name`'s live version, while `runtime` is still its runtime.
fn live(registry: &Registry, name: &str, runtime: &Arc<RouteRuntime>) -> Option<Arc<Route>> {
    registry
        .route(name)
        .filter(|route| Arc::ptr_eq(&route.runtime, runtime))
}

/// Starts route `name`'s discovery task; it ends when the route does.
pub fn spawn(
    registry: Arc<Registry>,
    resolver: Arc<Resolver>,
    name: String,
    runtime: Arc<RouteRuntime>,
    rebuilt: Rebuilt,
) {
    tokio::spawn(async move {
        // The EndpointSlice watch of the source in force, restarted when a
        // reload changes it.
        let mut watch: Option<(
            kubernetes::KubernetesSource,
            tokio::sync::mpsc::Receiver<kubernetes::Found>,
        )> = None;
        let mut last_forced = None::<tokio::time::Instant>;
        // When the names are next looked up; a watch event between two
        // passes is applied on its own, without a lookup.
        let mut due = tokio::time::Instant::now();
        while let Some(route) = live(&registry, &name, &runtime) {
            let config = &route.config;
            let source = match config.peers_from.as_ref().map(|f| &f.source) {
                Some(PeerSource::Kubernetes(k)) => Some(k.clone()),
                _ => None,
            };
            if watch.as_ref().map(|(s, _)| s) != source.as_ref() {
                watch = source.map(|source| {
                    let (tx, rx) = tokio::sync::mpsc::channel(16);
                    tokio::spawn(kubernetes::watch(source.clone(), tx));
                    (source, rx)
                });
            }
            if tokio::time::Instant::now() >= due {
                let before = runtime.found.lock().clone();
                let (found, next) = look_up(&resolver, config, &before).await;
                publish(&registry, &rebuilt, &name, &runtime, found);
                due = tokio::time::Instant::now() + next;
            }
            // Not held while waiting: a version a rebuild replaced goes at once.
            drop(route);
            let from_watch = async {
                match watch.as_mut() {
                    Some((_, rx)) => rx.recv().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = tokio::time::sleep_until(due) => {}
                _ = runtime.rediscover.notified() => {
                    // After a refused connection: ask the name servers, not
                    // the cache. Pokes that come while a pass runs fold into
                    // one, and a storm of refusals asks at most every
                    // `FORCED_GAP`; none is lost.
                    if let Some(last) = last_forced {
                        tokio::time::sleep_until(last + FORCED_GAP).await;
                    }
                    resolver.forget();
                    last_forced = Some(tokio::time::Instant::now());
                    due = tokio::time::Instant::now();
                }
                event = from_watch => match event {
                    Some(event) => {
                        let mut found = runtime.found.lock().clone();
                        match event {
                            kubernetes::Found::Endpoints(set) => {
                                found.set = Some(set);
                                found.set_error = None;
                            }
                            kubernetes::Found::Error(e) => found.set_error = Some(e),
                        }
                        publish(&registry, &rebuilt, &name, &runtime, found);
                    }
                    // The watcher ended (it never does by itself): start
                    // it again on the next pass.
                    None => watch = None,
                },
            }
        }
    });
}

/// Before the gateway serves: every route's names looked up once, so a
/// request in the first milliseconds finds its engines' addresses (the
/// EndpointSlice watch is left to the route's task).
pub fn first_pass(registry: &Arc<Registry>) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            log::error!(
                "discovery: cannot start the first lookups ({e}); the route tasks will do them"
            );
            return;
        }
    };
    let all = async {
        let resolver = match Resolver::new(&registry.gateway().resolver) {
            Ok(r) => r,
            Err(e) => {
                log::error!("discovery: {e}");
                return;
            }
        };
        for (name, route) in registry.snapshot().iter() {
            let before = route.runtime.found.lock().clone();
            let (found, _) = look_up(&resolver, &route.config, &before).await;
            if store(&route.runtime, found) {
                registry.rediscovered(name);
            }
        }
    };
    // The timer is made inside the runtime it needs.
    if runtime
        .block_on(async { tokio::time::timeout(FIRST_PASS_BOUND, all).await })
        .is_err()
    {
        log::warn!("discovery: the first lookups took over {FIRST_PASS_BOUND:?}; serving now, the route tasks finish them");
    }
}

/// The longest the start waits for the first lookups: a name server that
/// does not answer must not keep the gateway from serving the peers it
/// can reach.
const FIRST_PASS_BOUND: Duration = Duration::from_secs(5);
