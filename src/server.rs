//! Assembles the Pingora server: the proxy service on `listen`, the admin
//! service on `admin_listen`, the controller (signals, reloads, per-route
//! background tasks), the dashboard's sampler, with a body-log listener
//! the body-log sender, with an access log its SIGHUP listener
//! (`accesslog/`), with `tracing:` the span exporter (`otlp/`), and with a
//! Redis session store the cluster sync
//! (`balance/sync.rs`), then runs it until shutdown. The admin listener,
//! the dashboard's sampler and the cluster sync run until the process
//! exits ([`UntilExit`]), through the drain.

use crate::accesslog::AccessLog;
use crate::admin::dashboard::{Dashboard, Sampler};
use crate::admin::AdminApp;
use crate::bodylog::{sender::SenderService, Bodylog};
use crate::config::{self, GatewayConfig, Overrides};
use crate::controller::{log_reload, Controller, Trigger};
use crate::proxy::Gateway;
use crate::registry::Registry;
use async_trait::async_trait;
use pingora::apps::http_app::HttpServer;
use pingora::server::configuration::ServerConf;
use pingora::server::{ListenFds, RuntimeOpts, Server, ShutdownWatch};
use pingora::services::background::background_service;
use pingora::services::listening::Service;
use pingora::services::{ServiceReadyNotifier, ServiceWithDependents};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

/// Where gateway.yaml is read from when `--config` is not given.
pub const DEFAULT_CONFIG: &str = "conf/gateway.yaml";

/// gateway.yaml from `path`, else `conf/gateway.yaml` when it exists, else
/// the built-in defaults; `overrides` (command-line flags) win over the file.
pub fn load_gateway(
    path: Option<&Path>,
    overrides: &Overrides,
) -> Result<GatewayConfig, config::ConfigError> {
    let default = PathBuf::from(DEFAULT_CONFIG);
    match path {
        Some(path) => GatewayConfig::load(path, overrides),
        None if default.exists() => GatewayConfig::load(&default, overrides),
        None => GatewayConfig::parse(Path::new("<defaults>"), "", overrides),
    }
}

/// `llm-gateway check`: validates gateway.yaml, every route file (reject
/// rules included) and the tenants file exactly as a load would; the first
/// error wins.
pub fn check(path: Option<&Path>, overrides: &Overrides) -> ExitCode {
    let gateway = match load_gateway(path, overrides) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let routes = match config::load_routes_dir(&gateway.routes_dir, &gateway) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    for (name, result) in &routes {
        match result {
            Ok(route) if !route.reject_rule_errors.is_empty() => {
                // A load would drop these rules and serve without them;
                // check exists to say so before that happens.
                for e in &route.reject_rule_errors {
                    eprintln!("error: {}: {e}", route.file.display());
                }
                return ExitCode::FAILURE;
            }
            Ok(route) => {
                for w in route.notices() {
                    eprintln!("warning: {}: {w}", route.file.display());
                }
                let found = match route.peers_from.as_ref().map(|f| &f.source) {
                    None => String::new(),
                    Some(crate::config::PeerSource::Dns { name, port }) => {
                        format!(", and one per address of {name} at port {port}")
                    }
                    Some(crate::config::PeerSource::Kubernetes(k)) => format!(
                        ", and one per ready endpoint of the EndpointSlices {:?} in namespace {}",
                        k.selector, k.namespace
                    ),
                };
                println!(
                    "ok: route {name} ({} peers listed{found})",
                    route.peers.len()
                );
            }
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    if let Some(file) = &gateway.tenants_file {
        match config::tenants::TenantsConfig::load(file) {
            Ok(tenants) => println!(
                "ok: tenants file {} ({} tenant(s) named)",
                file.display(),
                tenants.tenants.len()
            ),
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    println!(
        "config ok: {} route(s) in {}",
        routes.len(),
        gateway.routes_dir.display()
    );
    if gateway.watch {
        println!(
            "watch: on (a change in {} or in a key file's directory reloads, as SIGHUP does)",
            gateway.routes_dir.display()
        );
    } else {
        println!("watch: off (reload with SIGHUP)");
    }
    let r = &gateway.resolver;
    match r.nameservers.as_slice() {
        [] => println!(
            "resolver: the system's; names looked up again every {:?}..{:?}",
            r.min_ttl, r.max_ttl
        ),
        servers => println!(
            "resolver: {servers:?}; names looked up again every {:?}..{:?}",
            r.min_ttl, r.max_ttl
        ),
    }
    match &gateway.session_store {
        crate::config::store::SessionStoreConfig::Local => println!("session store: local"),
        crate::config::store::SessionStoreConfig::Redis(r) => println!(
            "session store: redis at {} (key prefix {:?}, timeout {:?})",
            r.url, r.key_prefix, r.timeout
        ),
    }
    if let Some(t) = &gateway.tracing {
        println!(
            "tracing: spans to {} (sampling ratio {}, trace_context {:?})",
            t.endpoint, t.sampling_ratio, gateway.trace_context
        );
    }
    ExitCode::SUCCESS
}

/// Builds the Pingora server and runs it until shutdown.
pub fn run(gateway: GatewayConfig) -> ExitCode {
    let registry = Arc::new(Registry::new(gateway.clone()));
    let store = match crate::store::SessionStore::new(&gateway.session_store) {
        Ok(store) => Arc::new(store),
        Err(e) => {
            eprintln!("llm-gateway: {e}");
            return ExitCode::from(2);
        }
    };
    registry.set_store(Arc::clone(&store));
    log_reload(&registry.reload(), Trigger::Start);
    crate::discovery::first_pass(&registry);

    let conf = ServerConf {
        threads: gateway.threads,
        work_stealing: gateway.work_stealing,
        // The drain watcher (controller.rs) ends the process at
        // `grace_period`, logging what it cuts; Pingora's timer, a second
        // later, only covers a watcher that could not start.
        grace_period_seconds: Some(gateway.grace_period.as_secs_f64().ceil() as u64 + 1),
        graceful_shutdown_timeout_seconds: Some(1),
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();

    let bodylog = gateway.bodylog.clone().map(|c| Arc::new(Bodylog::new(c)));
    let access_log = match gateway.access_log.as_ref().map(AccessLog::start) {
        None => None,
        Some(Ok(log)) => Some(log),
        Some(Err(e)) => {
            eprintln!("llm-gateway: access_log: {e}");
            return ExitCode::from(2);
        }
    };
    let exporter = gateway.tracing.clone().map(crate::otlp::Exporter::new);
    // Pingora's proxy behind `Front`, which bounds how long a request head
    // may take (`proxy/conn/`); Pingora's HTTP loop is otherwise its own.
    let mut http = pingora::proxy::http_proxy(
        &server.configuration,
        Gateway::new(
            Arc::clone(&registry),
            bodylog.clone(),
            access_log.clone(),
            exporter.clone(),
        ),
    );
    // Pingora reads the h2c preface itself; over TLS it follows ALPN.
    let mut options = pingora::apps::HttpServerOptions::default();
    options.h2c = gateway.h2c;
    // An h2 connection is not under the HTTP/1 wrapper's idle limit: the
    // h2 codec's own, at the same length.
    options.h2_idle_timeout = Some(gateway.client_idle_timeout);
    http.server_options = Some(options);
    let front = crate::proxy::front::Front::new(
        http,
        gateway.client_header_timeout,
        gateway.h2c && gateway.tls.is_none(),
    );
    let mut proxy = Service::new("llm-gateway".to_string(), front);
    let cert_reload = match &gateway.tls {
        None => {
            proxy.add_tcp(&gateway.listen.to_string());
            None
        }
        Some(tls) => match tls_listener(&mut proxy, &gateway, tls) {
            Ok(store) => Some(crate::tls::CertReload {
                store,
                poll: gateway.watch.then_some(crate::tls::POLL),
            }),
            Err(e) => {
                eprintln!("llm-gateway: tls: {e}");
                return ExitCode::from(2);
            }
        },
    };

    let dashboard = Arc::new(Dashboard::default());
    let mut admin = Service::new(
        "admin".to_string(),
        HttpServer::new_app(AdminApp::new(Arc::clone(&registry), Arc::clone(&dashboard))),
    );
    admin.threads = Some(1);
    admin.add_tcp(&gateway.admin_listen.to_string());

    let controller = background_service(
        "controller",
        Controller::new(Arc::clone(&registry), gateway.grace_period),
    );

    log::info!(
        "llm-gateway listening on {}{} (admin {}), routes from {}",
        gateway.listen,
        if gateway.tls.is_some() { " (TLS)" } else { "" },
        gateway.admin_listen,
        gateway.routes_dir.display()
    );
    if let Some(file) = gateway.admin.token_file() {
        log::info!(
            "admin listener: a bearer token (from {}) is required, but on {}",
            file.display(),
            match gateway.admin.open_paths.as_slice() {
                [] => "no path".to_string(),
                open => open.join(", "),
            }
        );
    }
    server.add_service(proxy);
    server.add_service(UntilExit::new(admin));
    server.add_service(controller);
    server.add_service(UntilExit::new(background_service(
        "dashboard",
        Sampler::new(dashboard, Arc::clone(&registry)),
    )));
    if let Some(cert_reload) = cert_reload {
        server.add_service(background_service("tls-reload", cert_reload));
    }
    if let Some(access_log) = access_log {
        server.add_service(background_service(
            "access-log",
            crate::accesslog::ReopenOnHangup(access_log),
        ));
    }
    if let Some(bodylog) = bodylog {
        server.add_service(background_service("bodylog", SenderService::new(bodylog)));
    }
    if let Some(exporter) = exporter {
        // Through the drain, as the body-log sender: the spans of the last
        // requests still go out (`otlp/`).
        server.add_service(background_service(
            "otlp-export",
            crate::otlp::ExportService(exporter),
        ));
    }
    if store.redis().is_some() {
        log::info!("session store: redis (bindings shared with every replica)");
        // Through the drain: the other replicas keep seeing what this one
        // still has in flight on each engine until its last stream ends.
        server.add_service(UntilExit::new(background_service(
            "session-store",
            crate::balance::sync::StoreService {
                store,
                registry: Arc::clone(&registry),
            },
        )));
    }
    server.run_forever()
}

/// A Pingora service that keeps running through the drain. Pingora has one
/// shutdown watch for every service and fires it at SIGTERM, and a
/// listening service closes its listener as soon as it fires: the admin
/// listener would be gone within milliseconds of SIGTERM, probes would meet
/// a refused connection rather than `/healthz`'s 503, and `/metrics` could
/// not be scraped while the streams the drain waits for run. Handed a watch
/// of its own that never fires, the service runs until the drain watcher
/// (`controller.rs`) ends the process; should that watcher not run,
/// Pingora's own grace timer ends it with the rest (it shuts every
/// service's runtime down, whatever the service's watch says).
pub struct UntilExit<S> {
    inner: S,
    /// Held so that the watch stays open: with its sender dropped, the
    /// watch reads as closed, which a listener takes as a shutdown.
    _never: tokio::sync::watch::Sender<bool>,
    shutdown: ShutdownWatch,
}

impl<S> UntilExit<S> {
    pub fn new(inner: S) -> Self {
        let (never, shutdown) = tokio::sync::watch::channel(false);
        UntilExit {
            inner,
            _never: never,
            shutdown,
        }
    }
}

#[async_trait]
impl<S: ServiceWithDependents> ServiceWithDependents for UntilExit<S> {
    async fn start_service(
        &mut self,
        fds: Option<ListenFds>,
        _pingoras: ShutdownWatch,
        listeners_per_fd: usize,
        ready: ServiceReadyNotifier,
    ) {
        let shutdown = self.shutdown.clone();
        self.inner
            .start_service(fds, shutdown, listeners_per_fd, ready)
            .await
    }

    fn name(&self) -> &str {
        self.inner.name()
    }

    fn threads(&self) -> Option<usize> {
        self.inner.threads()
    }

    fn runtime_opts_override(&self, global: &RuntimeOpts) -> Option<RuntimeOpts> {
        self.inner.runtime_opts_override(global)
    }

    fn on_startup_delay(&self, time_waited: Duration) {
        self.inner.on_startup_delay(time_waited)
    }

    /// Forwarded: Pingora closes the inherited listening sockets that no
    /// service claims, and keeps them all when one service says nothing.
    fn listen_addresses(&self) -> Option<Vec<String>> {
        self.inner.listen_addresses()
    }
}

/// The main listener over TLS: Pingora's rustls acceptor, TLS 1.2 and 1.3,
/// asking `CertStore` for the certificate at every handshake so that a
/// reload reaches new connections without a restart.
#[cfg(feature = "tls")]
fn tls_listener(
    proxy: &mut Service<crate::proxy::front::Front>,
    gateway: &GatewayConfig,
    tls: &crate::config::TlsConfig,
) -> Result<Arc<crate::tls::CertStore>, String> {
    use pingora::listeners::tls::TlsSettings;
    let store = crate::tls::CertStore::load(tls)?;
    // The paths only name the files: with a resolver set, Pingora reads
    // neither (the store has).
    let mut settings =
        TlsSettings::intermediate(&tls.cert.to_string_lossy(), &tls.key.to_string_lossy())
            .map_err(|e| e.to_string())?;
    settings.set_cert_resolver(Arc::clone(&store) as _);
    // h2 first, as clients and load balancers prefer it; HTTP/1.1 for the
    // rest.
    settings.set_alpn(pingora::protocols::ALPN::H2H1);
    proxy.add_tls_with_settings(&gateway.listen.to_string(), None, settings);
    Ok(store)
}

/// Without the `tls` feature the listener cannot speak TLS: `tls:` stops
/// the start, saying how to build one that can.
#[cfg(not(feature = "tls"))]
fn tls_listener(
    _proxy: &mut Service<crate::proxy::front::Front>,
    _gateway: &GatewayConfig,
    tls: &crate::config::TlsConfig,
) -> Result<Arc<crate::tls::CertStore>, String> {
    Err(format!(
        "this build has no TLS (cargo build --features tls); tls: names {} and {}",
        tls.cert.display(),
        tls.key.display()
    ))
}
