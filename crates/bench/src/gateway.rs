//! The gateway under test, as a child process of the bench: its config files
//! in a private temp directory, start-up, readiness and teardown.
//!
//! [`GatewayProcess`] kills and reaps its child when dropped, so every way
//! out of a mode (success, error, panic, Ctrl-C cancelling the run) stops it.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use crate::process::{Launched, NotReady};
use std::time::Duration;

use tokio::time::Instant;

use super::client;

/// The one route each cell's gateway serves, whose counters the bench reads.
pub(crate) const ROUTE: &str = "bench";

/// How long the gateway may take to answer `/healthz`.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// A directory removed (best effort) when dropped.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> std::io::Result<TempDir> {
        let path =
            std::env::temp_dir().join(format!("llm-gateway-bench-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(path.join("routes"))?;
        Ok(TempDir(path))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// What the route file needs.
pub struct RouteSpec<'a> {
    pub mode: &'a str,
    pub engines: &'a [SocketAddr],
    pub max_concurrency: u32,
}

pub fn route_yaml(spec: &RouteSpec) -> String {
    let mut out = String::from("peers:\n");
    for (i, addr) in spec.engines.iter().enumerate() {
        out.push_str(&format!(
            "  - {{name: e{i}, host: {}, port: {}, max_concurrency: {}}}\n",
            addr.ip(),
            addr.port(),
            spec.max_concurrency
        ));
    }
    out.push_str(&format!(
        "balancing:\n  mode: {}\nhealth: {{interval: 1s}}\nengine_metrics: {{interval: 200ms}}\n",
        spec.mode
    ));
    out
}

/// Whether the admin `/_routes` answer lists `route`: a route file the
/// gateway rejects (a typo in `--route-extra`, an option an older build
/// does not know) leaves the gateway up and every request a 404.
pub fn routes_list(body: &[u8], route: &str) -> bool {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) else {
        return false;
    };
    v.get("routes")
        .and_then(serde_json::Value::as_array)
        .is_some_and(|routes| {
            routes
                .iter()
                .any(|r| r.get("name").and_then(serde_json::Value::as_str) == Some(route))
        })
}

/// The route file with `extra` (`--route-extra`, YAML) merged in: a
/// mapping merges into the bench's own mapping of that name (so
/// `balancing: {session_affinity: {live_window: 3s}}` keeps the cell's
/// mode), anything else replaces what the bench wrote.
pub fn merge_extra(route: &str, extra: &str) -> Result<String, String> {
    let parse = |text: &str, what: &str| {
        serde_yaml::from_str::<serde_yaml::Value>(text).map_err(|e| format!("{what}: {e}"))
    };
    let mut base = parse(route, "the bench's route file")?;
    let extra = parse(extra, "--route-extra")?;
    if !extra.is_mapping() {
        return Err(
            "--route-extra: expected YAML mapping lines such as `queue_timeout: 30s`".into(),
        );
    }
    merge_into(&mut base, extra);
    serde_yaml::to_string(&base).map_err(|e| format!("writing the route file: {e}"))
}

fn merge_into(base: &mut serde_yaml::Value, extra: serde_yaml::Value) {
    match (base, extra) {
        (serde_yaml::Value::Mapping(base), serde_yaml::Value::Mapping(extra)) => {
            for (key, value) in extra {
                match base.get_mut(&key) {
                    Some(slot) => merge_into(slot, value),
                    None => {
                        base.insert(key, value);
                    }
                }
            }
        }
        (slot, value) => *slot = value,
    }
}

pub fn gateway_yaml(
    listen: SocketAddr,
    admin: SocketAddr,
    routes: &Path,
    threads: usize,
) -> String {
    format!(
        "listen: {listen}\nadmin_listen: {admin}\nroutes_dir: {}\nthreads: {threads}\n\
         grace_period: 1s\napi_keys_file: /nonexistent\n",
        routes.display()
    )
}

/// A `redis-server` for `--session-store redis`: its own port and
/// directory, no persistence, killed when dropped.
pub struct RedisProcess {
    child: Option<Child>,
    pub addr: SocketAddr,
}

impl RedisProcess {
    pub async fn start(dir: &Path) -> Result<RedisProcess, String> {
        let addr = free_port().map_err(|e| format!("finding a port: {e}"))?;
        let child = Command::new("redis-server")
            .args(["--port", &addr.port().to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start redis-server (apt install redis-server): {e}"))?;
        let r = RedisProcess {
            child: Some(child),
            addr,
        };
        let deadline = Instant::now() + START_TIMEOUT;
        while tokio::net::TcpStream::connect(addr).await.is_err() {
            if Instant::now() >= deadline {
                return Err("redis-server did not listen in time".into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(r)
    }

    /// The gateway.yaml section that points a replica at it, or at the
    /// relay in front of it (`--redis-delay`).
    pub fn gateway_yaml(&self, relay: Option<SocketAddr>) -> String {
        format!(
            "session_store:\n  kind: redis\n  url: redis://{}/0\n",
            relay.unwrap_or(self.addr)
        )
    }

    /// Kills (SIGKILL) and reaps redis-server: `--redis-stop-at`, and every
    /// way out of the cell. Idempotent.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for RedisProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A port free a moment ago on 127.0.0.1. The gateway binds it shortly
/// after; a lost race shows up as a start-up failure, which is retried.
pub fn free_port() -> std::io::Result<SocketAddr> {
    TcpListener::bind("127.0.0.1:0")?.local_addr()
}

pub struct GatewayProcess {
    proc: Launched,
    pub listen: SocketAddr,
    pub admin: SocketAddr,
}

impl GatewayProcess {
    /// Starts `exe --config <dir>/gateway.yaml` with the route file written
    /// as `<dir>/routes/<route>.yaml`, and waits until `/healthz` answers 200.
    pub async fn start(
        exe: &Path,
        dir: &Path,
        route: &str,
        route_yaml: &str,
        threads: usize,
        gateway_extra: &str,
    ) -> Result<GatewayProcess, String> {
        let mut last_error = String::new();
        for attempt in 0..3 {
            match Self::start_once(exe, dir, route, route_yaml, threads, gateway_extra, attempt)
                .await
            {
                Ok(g) => return Ok(g),
                Err(e) => last_error = e,
            }
        }
        Err(last_error)
    }

    async fn start_once(
        exe: &Path,
        dir: &Path,
        route: &str,
        route_yaml: &str,
        threads: usize,
        gateway_extra: &str,
        attempt: u32,
    ) -> Result<GatewayProcess, String> {
        let io = |what: &str, e: std::io::Error| format!("{what}: {e}");
        let routes = dir.join("routes");
        std::fs::write(routes.join(format!("{route}.yaml")), route_yaml)
            .map_err(|e| io("writing the route file", e))?;
        let listen = free_port().map_err(|e| io("finding a port", e))?;
        let admin = free_port().map_err(|e| io("finding a port", e))?;
        let config = dir.join("gateway.yaml");
        let yaml = gateway_yaml(listen, admin, &routes, threads) + gateway_extra;
        std::fs::write(&config, yaml).map_err(|e| io("writing gateway.yaml", e))?;
        let log = dir.join(format!("gateway-{attempt}.log"));
        let mut command = Command::new(exe);
        command.arg("--config").arg(&config).env("RUST_LOG", "warn");
        let mut g = GatewayProcess {
            proc: Launched::spawn(&mut command, log)?,
            listen,
            admin,
        };
        let healthy = || async {
            matches!(
                client::get(admin, "/healthz", Duration::from_secs(1)).await,
                Ok((200, _))
            )
        };
        let waited = g
            .proc
            .wait_ready(START_TIMEOUT, Duration::from_millis(50), healthy)
            .await;
        match waited {
            Ok(()) => Ok(g),
            Err(NotReady::Exited(status)) => Err(format!(
                "the gateway exited during start-up ({status}); log:\n{}",
                g.log_tail()
            )),
            Err(NotReady::TimedOut) => Err(format!(
                "the gateway did not answer /healthz within {START_TIMEOUT:?}; log:\n{}",
                g.log_tail()
            )),
        }
    }

    pub fn pid(&self) -> u32 {
        self.proc.pid
    }

    /// Whether the child is still running.
    pub fn alive(&mut self) -> bool {
        self.proc.alive()
    }

    pub fn log_tail(&self) -> String {
        self.proc.log_tail()
    }

    /// Kills (SIGKILL, by pid) and reaps the child. Idempotent.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.proc.take() {
            if matches!(child.try_wait(), Ok(None)) {
                let _ = child.kill();
            }
            let _ = child.wait();
        }
    }
}

impl Drop for GatewayProcess {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn route_file_lists_every_engine() {
        let engines: Vec<SocketAddr> = vec![
            "127.0.0.1:4001".parse().unwrap(),
            "127.0.0.1:4002".parse().unwrap(),
        ];
        let y = route_yaml(&RouteSpec {
            mode: "load_aware",
            engines: &engines,
            max_concurrency: 256,
        });
        assert!(y.contains("{name: e1, host: 127.0.0.1, port: 4002, max_concurrency: 256}"));
        assert!(y.contains("mode: load_aware"));
        assert!(y.contains("engine_metrics: {interval: 200ms}"));
    }

    #[test]
    fn replicas_reach_redis_through_the_relay_when_there_is_one() {
        let redis = RedisProcess {
            child: None,
            addr: "127.0.0.1:6390".parse().expect("addr"),
        };
        let relay: SocketAddr = "127.0.0.1:7001".parse().expect("addr");
        let via_relay = redis.gateway_yaml(Some(relay));
        assert!(
            via_relay.contains("url: redis://127.0.0.1:7001/0"),
            "{via_relay}"
        );
        assert!(!via_relay.contains("6390"), "{via_relay}");
        // The control: no relay, Redis itself.
        let direct = redis.gateway_yaml(None);
        assert!(direct.contains("url: redis://127.0.0.1:6390/0"), "{direct}");
    }

    #[test]
    fn loaded_routes_are_read_from_the_admin_listing() {
        let body = br#"{"routes":[{"name":"other"},{"name":"bench","mode":"hash"}]}"#;
        assert!(routes_list(body, "bench"));
        assert!(!routes_list(br#"{"routes":[{"name":"other"}]}"#, "bench"));
        assert!(!routes_list(br#"{"routes":[]}"#, "bench"));
        assert!(!routes_list(b"not json", "bench"));
    }

    #[test]
    fn route_extra_merges_into_the_bench_route() {
        let base = route_yaml(&RouteSpec {
            mode: "load_aware",
            engines: &["127.0.0.1:4001".parse().expect("addr")],
            max_concurrency: 256,
        });
        let merged = merge_extra(
            &base,
            "queue_timeout: 30s\nbalancing:\n  session_affinity: {live_window: 3s}\n",
        )
        .expect("valid YAML");
        let v: serde_yaml::Value = serde_yaml::from_str(&merged).expect("YAML");
        assert_eq!(v["queue_timeout"].as_str(), Some("30s"));
        assert_eq!(
            v["balancing"]["mode"].as_str(),
            Some("load_aware"),
            "{merged}"
        );
        assert_eq!(
            v["balancing"]["session_affinity"]["live_window"].as_str(),
            Some("3s")
        );
        assert_eq!(v["peers"][0]["port"].as_u64(), Some(4001));
        // A scalar replaces the bench's own value.
        let v: serde_yaml::Value =
            serde_yaml::from_str(&merge_extra(&base, "balancing: {mode: hash}").expect("YAML"))
                .expect("YAML");
        assert_eq!(v["balancing"]["mode"].as_str(), Some("hash"));
        assert!(merge_extra(&base, "- a list").is_err());
        assert!(merge_extra(&base, "a: [").is_err());
    }
}
