//! Shared integration-test harness: the real `llm-gateway` binary on
//! 127.0.0.1 ephemeral ports, simulated engines in-process, and deadline
//! polling instead of sleeps.

#![allow(dead_code)]

pub mod bodylog;
pub mod canned;
pub mod certs;
pub mod dns;
pub mod http;
pub mod kube;
pub mod process;
pub mod redis;
pub mod simproc;
pub mod traced;
pub mod volume;

use process::Proc;
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

pub use llm_gateway_sim::{spawn_engines, EngineConfig, SimCluster};

pub const DEADLINE: Duration = Duration::from_secs(20);

/// The gateway binary under test: cargo's, unless `LLM_GATEWAY_BIN` names
/// another. Worktrees sharing one `CARGO_TARGET_DIR` overwrite each other's
/// `debug/llm-gateway`; a run can pin its own build (the `deps/` file it
/// was linked as) this way.
pub fn gateway_bin() -> PathBuf {
    std::env::var_os("LLM_GATEWAY_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_llm-gateway")))
}

/// Polls `f` until it returns Some, or panics with `what` after `timeout`.
pub fn wait_for<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        if start.elapsed() > timeout {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Ports handed out by `free_port` and `free_wildcard_port` in this test
/// process. The kernel may give a port it just took back to the very next
/// `bind(0)`, so two tests running in parallel could be handed the same one
/// and start two gateways on it (CI saw a test's requests answered 404 by
/// another test's gateway); a port handed out once is never handed out again.
static HANDED_OUT: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());

fn hand_out(port: u16) -> bool {
    HANDED_OUT
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(port)
}

/// A port that was free a moment ago and that no other test of this
/// process was given. The gateway binds it right after; should a listener
/// that bound port 0 have taken it meanwhile, [`Gateway::start_with`]
/// starts the gateway again on fresh ports.
pub fn free_port() -> u16 {
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("free port");
        if hand_out(port) {
            return port;
        }
    }
}

/// A free port for a listener on every address (`[::]`): picked below
/// Linux's ephemeral range (32768 and up), where `free_port` and every
/// outgoing connection take theirs. A wildcard bind conflicts with a
/// socket on that port on any address, so a port from the ephemeral range
/// could be held by another test's engine connection by the time the
/// gateway binds it (seen: "[::]:35529 is in use" for 20 s).
pub fn free_wildcard_port() -> u16 {
    let seed = std::process::id() as u64
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
    (0..1000u64)
        .map(|i| 20000 + ((seed.wrapping_mul(2654435761).wrapping_add(i * 7919)) % 12000) as u16)
        .find(|&port| std::net::TcpListener::bind(("::", port)).is_ok() && hand_out(port))
        .expect("a free port below the ephemeral range")
}

/// How many times a gateway is started on fresh ports when another
/// listener took one of them first (see [`Gateway::start_with`]).
const PORT_ATTEMPTS: usize = 3;

#[derive(Debug, PartialEq, Eq)]
enum Startup {
    Healthy,
    PortTaken,
}

/// Polls until the gateway's admin answers `/healthz` with 200 and its
/// listener accepts; panics with its log if it exits or never gets there.
fn wait_healthy(child: &mut Proc, admin: SocketAddr, addr: SocketAddr, log: &Path) -> Startup {
    let log = || std::fs::read_to_string(log).unwrap_or_default();
    let start = Instant::now();
    loop {
        if let Some(status) = child.exited() {
            panic!("gateway exited at startup ({status}):\n{}", log());
        }
        // Pingora's warning on its first failed bind; it retries the same
        // address, so the probes below would reach whoever holds it.
        if log().contains(" is in use, will try again") {
            return Startup::PortTaken;
        }
        // A probe that fails (refused, reset, no answer) means "not yet".
        let probe = http::try_get_within(admin, "/healthz", Duration::from_millis(500));
        let admin_ok = probe.is_some_and(|r| r.status() == 200);
        if admin_ok && std::net::TcpStream::connect(addr).is_ok() {
            return Startup::Healthy;
        }
        if start.elapsed() > DEADLINE {
            panic!("gateway not healthy after {DEADLINE:?}:\n{}", log());
        }
        std::thread::sleep(Duration::from_millis(25));
    }
}

/// A route file body for peers on the given engine ports.
pub fn route_yaml(ports: &[u16], extra: &str) -> String {
    let mut s = String::from("peers:\n");
    for (i, port) in ports.iter().enumerate() {
        s.push_str(&format!(
            "  - {{name: e{i}, host: 127.0.0.1, port: {port}, max_concurrency: 64}}\n"
        ));
    }
    s.push_str(extra);
    s
}

pub struct Gateway {
    child: Proc,
    pub addr: SocketAddr,
    pub admin: SocketAddr,
    pub dir: tempfile::TempDir,
    pub routes_dir: PathBuf,
    log_path: PathBuf,
    /// Processes started before one came up healthy (1 unless a port was taken).
    pub starts: usize,
}

pub struct GatewayOptions {
    pub grace_period: &'static str,
    pub threads: usize,
    pub extra_config: String,
    pub env: Vec<(String, String)>,
    /// `watch:` in gateway.yaml; None leaves it out (the default, on).
    pub watch: Option<bool>,
    /// A routes directory the test laid out itself (e.g. as a Kubernetes
    /// volume) instead of a fresh one holding `routes`.
    pub routes_dir: Option<PathBuf>,
    /// The listener's host: 127.0.0.1 unless a test needs another (`[::]`
    /// for a dual-stack one, where IPv4 callers are `::ffff:a.b.c.d`).
    pub listen_host: &'static str,
    /// The admin port of the first start, for the test of what happens when
    /// it is taken; later starts (and every start without it) pick free ones.
    pub first_admin_port: Option<u16>,
}

impl Default for GatewayOptions {
    fn default() -> Self {
        GatewayOptions {
            grace_period: "10s",
            threads: 2,
            extra_config: String::new(),
            env: Vec::new(),
            // Off unless a test asks: the SIGHUP tests count reloads
            // exactly, and a watch would add its own for their writes.
            watch: Some(false),
            routes_dir: None,
            listen_host: "127.0.0.1",
            first_admin_port: None,
        }
    }
}

impl Gateway {
    pub fn start(routes: &[(&str, String)]) -> Gateway {
        Self::start_with(routes, GatewayOptions::default())
    }

    pub fn start_with(routes: &[(&str, String)], opts: GatewayOptions) -> Gateway {
        let dir = tempfile::tempdir().expect("tempdir");
        let routes_dir = opts
            .routes_dir
            .clone()
            .unwrap_or_else(|| dir.path().join("routes"));
        std::fs::create_dir_all(&routes_dir).expect("routes dir");
        for (name, body) in routes {
            std::fs::write(routes_dir.join(format!("{name}.yaml")), body).expect("route file");
        }
        let log_path = dir.path().join("gateway.log");
        // `free_port` lets go of the port before the gateway binds it, so
        // another test's listener may take it first; Pingora then logs that
        // the address is in use and keeps trying it for seconds, while this
        // test's probes reach the other listener. Fresh ports mend that.
        let mut first_admin_port = opts.first_admin_port;
        for starts in 1..=PORT_ATTEMPTS {
            let port = if opts.listen_host.starts_with('[') || opts.listen_host == "0.0.0.0" {
                free_wildcard_port()
            } else {
                free_port()
            };
            let admin_port = first_admin_port.take().unwrap_or_else(free_port);
            let config = dir.path().join("gateway.yaml");
            std::fs::write(
                &config,
                format!(
                    "listen: \"{}:{port}\"\nadmin_listen: 127.0.0.1:{admin_port}\nroutes_dir: {}\nthreads: {}\ngrace_period: {}\napi_keys_file: {}\n{}{}",
                    opts.listen_host,
                    routes_dir.display(),
                    opts.threads,
                    opts.grace_period,
                    dir.path().join("no-api-keys").display(),
                    opts.watch.map(|w| format!("watch: {w}\n")).unwrap_or_default(),
                    opts.extra_config
                ),
            )
            .expect("gateway.yaml");
            let mut cmd = Command::new(gateway_bin());
            cmd.arg("--config")
                .arg(&config)
                .env("RUST_LOG", "info")
                .env_remove("LLM_GATEWAY_API_KEYS_FILE")
                .env_remove("BODYLOG_LISTENER_HOST");
            for (k, v) in &opts.env {
                cmd.env(k, v);
            }
            let mut child = Proc::spawn_logged(&mut cmd, &log_path, "llm-gateway");
            let addr = SocketAddr::from(([127, 0, 0, 1], port));
            let admin = SocketAddr::from(([127, 0, 0, 1], admin_port));
            if wait_healthy(&mut child, admin, addr, &log_path) == Startup::PortTaken {
                child.kill();
                continue;
            }
            return Gateway {
                child,
                addr,
                admin,
                dir,
                routes_dir,
                log_path,
                starts,
            };
        }
        panic!("gateway ports taken by other listeners {PORT_ATTEMPTS} times in a row");
    }

    /// [`Gateway::start_with`] the defaults but for lines added to
    /// gateway.yaml and the environment.
    pub fn start_configured(
        routes: &[(&str, String)],
        extra_config: String,
        env: Vec<(String, String)>,
    ) -> Gateway {
        Self::start_with(
            routes,
            GatewayOptions {
                extra_config,
                env,
                ..Default::default()
            },
        )
    }

    pub fn pid(&self) -> u32 {
        self.child.pid()
    }

    /// The process's resident memory in KiB (VmRSS).
    pub fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()))
            .expect("gateway /proc status");
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .expect("VmRSS")
    }

    /// File descriptors the process holds now.
    pub fn open_fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid()))
            .expect("gateway /proc fd")
            .count()
    }

    /// Still running (not exited, not a zombie waiting to be reaped).
    pub fn is_alive(&mut self) -> bool {
        self.child.is_alive()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    pub fn signal(&self, sig: &str) {
        self.child.signal(sig)
    }

    pub fn write_route(&self, name: &str, body: &str) {
        std::fs::write(self.routes_dir.join(format!("{name}.yaml")), body).expect("write route");
    }

    pub fn remove_route(&self, name: &str) {
        std::fs::remove_file(self.routes_dir.join(format!("{name}.yaml"))).expect("remove route");
    }

    /// Sum of `name{...}` samples whose labels match every `filters` entry (`k="v"`).
    pub fn metric(&self, name: &str, filters: &[&str]) -> f64 {
        let text = http::get(self.admin, "/metrics").text();
        metric_sum(&text, name, filters)
    }

    /// Reloads counted so far whose labels contain every `filters` entry
    /// (e.g. `trigger="watch"`, `result="error"`).
    pub fn reloads(&self, filters: &[&str]) -> f64 {
        self.metric("llm_gateway_reloads_total", filters)
    }

    /// Sends SIGHUP and waits until the reload counter moved.
    pub fn reload(&self) {
        let before = self.metric("llm_gateway_reloads_total", &[]);
        self.signal("HUP");
        wait_for("reload to complete", DEADLINE, || {
            (self.metric("llm_gateway_reloads_total", &[]) > before).then_some(())
        });
    }

    /// Waits for the process to exit and returns its exit code.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<i32> {
        self.child.wait_exit(timeout)
    }

    pub fn in_flight_total(&self) -> f64 {
        self.metric("llm_gateway_in_flight", &[])
    }

    /// Waits until no request is in flight through the gateway.
    pub fn wait_idle(&self) {
        wait_for("in-flight to return to 0", DEADLINE, || {
            (self.in_flight_total() == 0.0).then_some(())
        });
    }
}

/// Sum of the samples `name` whose labels match every `filters` entry, each
/// written as in the text: `route="chat"`.
pub fn metric_sum(text: &str, name: &str, filters: &[&str]) -> f64 {
    let pairs: Vec<(&str, &str)> = filters
        .iter()
        .map(|f| {
            let (k, v) = f.split_once('=').expect("a filter is label=\"value\"");
            (k, v.trim_matches('"'))
        })
        .collect();
    llm_gateway_prom::sum(&llm_gateway_prom::parse(text), name, &pairs)
}

pub fn engines(n: usize) -> SimCluster {
    spawn_engines(n, 0, EngineConfig::default()).expect("simulated engines")
}

pub fn ports(cluster: &SimCluster) -> Vec<u16> {
    cluster.engines.iter().map(|e| e.port()).collect()
}

pub fn chat_body(session: &str, content: &str, stream: bool) -> serde_json::Value {
    serde_json::json!({
        "model": "sim-model",
        "stream": stream,
        "messages": [{"role": "user", "content": content}],
        "metadata": {"session_id": session},
    })
}

/// Opens a stream on `path` that the simulated engine holds after its first
/// frame until `gate` opens (`EngineHandle::open_gate`): a request that keeps
/// its slot for as long as a test needs. Extra headers are sent as given.
pub fn hold_stream(gw: &Gateway, path: &str, gate: &str, headers: &[(&str, &str)]) -> http::Conn {
    hold_stream_with_head(gw, path, gate, headers).0
}

/// Sends the stream [`hold_stream`] sends without waiting for its answer
/// (a request that may wait in the gateway's queue).
pub fn send_gated(gw: &Gateway, path: &str, gate: &str, headers: &[(&str, &str)]) -> http::Conn {
    let mut conn = http::Conn::open(gw.addr);
    let body = serde_json::json!({"model": "sim-model", "stream": true, "max_tokens": 4,
                                  "messages": [{"role": "user", "content": "hold"}]});
    let mut all = vec![("content-type", "application/json"), ("x-sim-gate", gate)];
    all.extend_from_slice(headers);
    conn.send(
        "POST",
        path,
        &all,
        body.to_string().as_bytes(),
        http::Upload::Length,
    );
    conn
}

/// [`hold_stream`], and the head the gateway answered it with (which
/// engine it went to, how it was placed).
pub fn hold_stream_with_head(
    gw: &Gateway,
    path: &str,
    gate: &str,
    headers: &[(&str, &str)],
) -> (http::Conn, http::Head) {
    let mut conn = send_gated(gw, path, gate, headers);
    let head = conn.read_head();
    assert_eq!(head.status, 200, "the held stream starts");
    conn.read_chunk().expect("first frame").expect("data");
    (conn, head)
}

/// One turn of `session` through `gw` on route `chat`; the engine that
/// served it (`X-Routed-Peer`).
pub fn served_by(gw: &Gateway, session: &str, n: usize) -> String {
    let body = chat_body(session, &format!("turn {n} of {session}"), false);
    let r = http::post_json(gw.addr, "/chat/v1/chat/completions", &[], &body);
    assert_eq!(r.status(), 200, "{}", r.text());
    r.header("x-routed-peer")
        .expect("x-routed-peer")
        .to_string()
}

/// Sessions whose turns, alternating between two replicas `a` and `b`,
/// did not all land on one engine. A few sessions only `a` has seen come
/// first, so the replicas' own tables differ, as they do in any cluster
/// that has been up a while.
pub fn split_sessions(a: &Gateway, b: &Gateway, sessions: usize, turns: usize) -> usize {
    for i in 0..5 {
        served_by(a, &format!("warm-{i}"), 0);
    }
    (0..sessions)
        .filter(|s| {
            let id = format!("agent-session-{s}");
            let peers: Vec<String> = (0..turns)
                .map(|t| served_by(if (s + t) % 2 == 0 { a } else { b }, &id, t))
                .collect();
            peers.iter().any(|p| *p != peers[0])
        })
        .count()
}
