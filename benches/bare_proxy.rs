//! The floor the gateway is measured against (issue 13): a Pingora proxy with
//! no hooks but `upstream_peer`, built from the same pingora version and
//! Cargo.lock as the gateway, so `benches/instructions_compare.sh` measures
//! what Pingora itself costs instead of quoting it. A Cargo example, not part
//! of the library:
//!
//!   cargo build --release --example bare_proxy
//!   bare_proxy LISTEN UPSTREAM        # e.g. 127.0.0.1:8080 127.0.0.1:8000
//!
//! Runtime settings (issue 13, item 3) come from the environment so the same
//! binary can be measured with each: BARE_THREADS (1), BARE_WORK_STEALING
//! (1), BARE_POOL (upstream keep-alive pool size, Pingora's default 128).

use async_trait::async_trait;
use pingora::prelude::*;
use pingora::server::configuration::ServerConf;

struct Bare(String);

#[async_trait]
impl ProxyHttp for Bare {
    type CTX = ();
    fn new_ctx(&self) {}
    async fn upstream_peer(&self, _: &mut Session, _: &mut ()) -> Result<Box<HttpPeer>> {
        Ok(Box::new(HttpPeer::new(
            self.0.as_str(),
            false,
            String::new(),
        )))
    }
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, listen, upstream] = args.as_slice() else {
        eprintln!("usage: bare_proxy LISTEN UPSTREAM");
        std::process::exit(2);
    };
    let defaults = ServerConf::default();
    let conf = ServerConf {
        threads: env_or("BARE_THREADS", 1),
        work_stealing: env_or::<u8>("BARE_WORK_STEALING", 1) != 0,
        upstream_keepalive_pool_size: env_or("BARE_POOL", defaults.upstream_keepalive_pool_size),
        // As the gateway: a SIGINT/SIGTERM ends the process within a second.
        graceful_shutdown_timeout_seconds: Some(1),
        grace_period_seconds: Some(0),
        ..defaults
    };
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();
    let mut svc = http_proxy_service(&server.configuration, Bare(upstream.clone()));
    svc.add_tcp(listen);
    server.add_service(svc);
    server.run_forever();
}
