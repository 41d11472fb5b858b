//! A real `redis-server` for the scale-out tests: its own ephemeral port
//! and temp dir, no persistence, stopped (SIGKILL) when dropped. The
//! Debian package provides the binary (`.ci/run` installs it).

use super::process::Proc;
use std::process::{Command, Stdio};
use std::time::Duration;

pub struct Redis {
    pub port: u16,
    child: Proc,
    _dir: tempfile::TempDir,
}

impl Redis {
    pub fn start() -> Redis {
        Self::start_on(super::free_port())
    }

    /// On a given port: a restart keeps the address the gateways know.
    pub fn start_on(port: u16) -> Redis {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut cmd = Command::new("redis-server");
        cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let redis = Redis {
            port,
            child: Proc::spawn(&mut cmd, "redis-server (apt install redis-server)"),
            _dir: dir,
        };
        super::wait_for("redis-server to answer PING", super::DEADLINE, || {
            redis.ping().then_some(())
        });
        redis
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    pub fn kill(&mut self) {
        self.child.kill()
    }

    fn conn(&self) -> ::redis::RedisResult<::redis::Connection> {
        let client = ::redis::Client::open(self.url())?;
        client.get_connection_with_timeout(Duration::from_secs(2))
    }

    /// Whether it answers PING.
    pub fn ping(&self) -> bool {
        self.conn()
            .and_then(|mut c| ::redis::cmd("PING").query::<String>(&mut c))
            .is_ok_and(|p| p == "PONG")
    }

    /// Every key.
    pub fn keys(&self) -> Vec<String> {
        self.conn()
            .and_then(|mut c| ::redis::cmd("KEYS").arg("*").query(&mut c))
            .unwrap_or_default()
    }

    pub fn get(&self, key: &str) -> Option<String> {
        self.conn()
            .and_then(|mut c| ::redis::cmd("GET").arg(key).query(&mut c))
            .ok()
            .flatten()
    }

    /// Every key with its value: a string's, a hash's fields and values, a
    /// sorted set's members.
    pub fn dump(&self) -> String {
        let Ok(mut c) = self.conn() else {
            return String::new();
        };
        let mut out = String::new();
        for key in self.keys() {
            let kind: String = ::redis::cmd("TYPE")
                .arg(&key)
                .query(&mut c)
                .unwrap_or_default();
            let value: Vec<String> = match kind.as_str() {
                "string" => ::redis::cmd("GET")
                    .arg(&key)
                    .query::<String>(&mut c)
                    .map(|v| vec![v]),
                "hash" => ::redis::cmd("HGETALL").arg(&key).query(&mut c),
                "zset" => ::redis::cmd("ZRANGE")
                    .arg(&key)
                    .arg(0)
                    .arg(-1)
                    .query(&mut c),
                _ => Ok(Vec::new()),
            }
            .unwrap_or_default();
            out.push_str(&format!("{key} = {}\n", value.join(" ")));
        }
        out
    }
}
