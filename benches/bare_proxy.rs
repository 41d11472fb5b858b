//! The floor the gateway is measured against (issue 13): a Pingora proxy with
//! no hooks but `upstream_peer`, built from the same pingora version and
//! Cargo.lock as the gateway, so `benches/instructions.sh` measures
//! what Pingora itself costs instead of quoting it. A Cargo example, not part
//! of the library:
//!
//!   cargo build --release --example bare_proxy
//!   bare_proxy LISTEN UPSTREAM        # e.g. 127.0.0.1:8080 127.0.0.1:8000
//!
//! Runtime settings (issue 13, item 3) come from the environment so the same
//! binary can be measured with each: BARE_THREADS (1), BARE_WORK_STEALING
//! (1), BARE_POOL (upstream keep-alive pool size, Pingora's default 128).
//! BARE_TIMEOUTS=1 sets the timeouts the gateway sets by default (peer
//! connect 5 s, read 600 s, pooled idle 60 s; client keep-alive 60 s):
//! Pingora arms a timer for each read they bound, which a proxy without
//! them does not pay.

use async_trait::async_trait;
use pingora::prelude::*;
use pingora::server::configuration::ServerConf;
use std::time::Duration;

struct Bare {
    upstream: String,
    timeouts: bool,
}

#[async_trait]
impl ProxyHttp for Bare {
    type CTX = ();
    fn new_ctx(&self) {}
    async fn request_filter(&self, session: &mut Session, _: &mut ()) -> Result<bool> {
        if self.timeouts && session.get_keepalive().is_some() {
            session.set_keepalive(Some(60));
        }
        Ok(false)
    }
    async fn upstream_peer(&self, _: &mut Session, _: &mut ()) -> Result<Box<HttpPeer>> {
        let mut peer = HttpPeer::new(self.upstream.as_str(), false, String::new());
        if self.timeouts {
            peer.options.connection_timeout = Some(Duration::from_secs(5));
            peer.options.read_timeout = Some(Duration::from_secs(600));
            peer.options.idle_timeout = Some(Duration::from_secs(60));
        }
        Ok(Box::new(peer))
    }
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

pub fn main() {
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
    let bare = Bare {
        upstream: upstream.clone(),
        timeouts: env_or::<u8>("BARE_TIMEOUTS", 0) != 0,
    };
    let mut svc = http_proxy_service(&server.configuration, bare);
    svc.add_tcp(listen);
    server.add_service(svc);
    server.run_forever();
}
