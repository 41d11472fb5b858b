//! A real DNS server for the discovery tests: Debian's dnsmasq on its own
//! ephemeral port on 127.0.0.1, answering only from a hosts file the test
//! rewrites (`set`), with a 1 s TTL; a name it does not hold under `.test`
//! is NXDOMAIN. `.ci/run` installs it (`./dev deps`: dnsmasq-base).

use super::process::Proc;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::{Command, Stdio};

pub struct Dnsmasq {
    pub addr: SocketAddr,
    hosts: PathBuf,
    /// Every name set so far, to check each is served as the last `set` says.
    names: std::sync::Mutex<std::collections::BTreeSet<String>>,
    child: Proc,
    _dir: tempfile::TempDir,
}

impl Dnsmasq {
    /// Serving `records` (name, address); names end in `.test`.
    pub fn start(records: &[(&str, IpAddr)]) -> Dnsmasq {
        let dir = tempfile::tempdir().expect("tempdir");
        let hosts = dir.path().join("hosts");
        std::fs::write(&hosts, hosts_text(records)).expect("hosts file");
        let port = super::free_port();
        let bin = ["/usr/sbin/dnsmasq", "dnsmasq"]
            .into_iter()
            .find(|b| !b.starts_with('/') || std::path::Path::new(b).exists())
            .unwrap_or("dnsmasq");
        let mut cmd = Command::new(bin);
        cmd.arg("--keep-in-foreground")
            .arg("--conf-file=/dev/null")
            .arg(format!("--port={port}"))
            .args(["--listen-address=127.0.0.1", "--bind-interfaces"])
            .args(["--no-resolv", "--no-hosts", "--no-negcache"])
            .arg(format!("--addn-hosts={}", hosts.display()))
            .args(["--local=/test/", "--local-ttl=1", "--pid-file="])
            // It drops privileges by default; the hosts file is in a temp
            // directory only its owner may read after a SIGHUP.
            .arg(format!("--user={}", whoami()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = Proc::spawn(&mut cmd, "dnsmasq (apt install dnsmasq-base)");
        let dns = Dnsmasq {
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            hosts,
            names: Default::default(),
            child,
            _dir: dir,
        };
        dns.names
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(records.iter().map(|(n, _)| n.to_string()));
        super::wait_for("dnsmasq to listen", super::DEADLINE, || {
            std::net::TcpStream::connect(dns.addr).ok().map(|_| ())
        });
        dns
    }

    /// Replaces what it serves (it re-reads the file on SIGHUP), and
    /// returns once it answers with it: each name set before and not now
    /// has no address, each name now has exactly its addresses.
    pub fn set(&self, records: &[(&str, IpAddr)]) {
        let mut names = self.names.lock().unwrap_or_else(|e| e.into_inner());
        names.extend(records.iter().map(|(n, _)| n.to_string()));
        std::fs::write(&self.hosts, hosts_text(records)).expect("hosts file");
        self.child.signal("HUP");
        let want = |name: &str| {
            let mut ips: Vec<IpAddr> = records
                .iter()
                .filter(|(n, _)| *n == name)
                .map(|(_, ip)| *ip)
                .collect();
            ips.sort();
            ips
        };
        super::wait_for("dnsmasq to serve the new records", super::DEADLINE, || {
            names
                .iter()
                .all(|name| self.lookup(name) == want(name))
                .then_some(())
        });
    }

    /// The addresses it gives `name`, sorted (empty: none, or no answer).
    pub fn lookup(&self, name: &str) -> Vec<IpAddr> {
        use hickory_resolver::config::{ConnectionConfig, NameServerConfig, ResolverConfig};
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            let mut udp = ConnectionConfig::udp();
            udp.port = self.addr.port();
            let server = NameServerConfig::new(self.addr.ip(), true, vec![udp]);
            let mut builder = hickory_resolver::Resolver::builder_with_config(
                ResolverConfig::from_name_servers(vec![server]),
                hickory_resolver::net::runtime::TokioRuntimeProvider::default(),
            );
            builder.options_mut().cache_size = 0;
            let Ok(resolver) = builder.build() else {
                return Vec::new();
            };
            let mut ips: Vec<IpAddr> = match resolver.lookup_ip(format!("{name}.")).await {
                Ok(found) => found.iter().collect(),
                Err(_) => Vec::new(),
            };
            ips.sort();
            ips
        })
    }

    /// The `resolver:` section of a gateway.yaml that asks only this server,
    /// and asks again within a second.
    pub fn gateway_config(&self) -> String {
        format!(
            "resolver:\n  nameservers: [\"{}\"]\n  min_ttl: 200ms\n  max_ttl: 1s\n",
            self.addr
        )
    }
}

fn hosts_text(records: &[(&str, IpAddr)]) -> String {
    records
        .iter()
        .map(|(name, ip)| format!("{ip} {name}\n"))
        .collect()
}

fn whoami() -> String {
    Command::new("id")
        .arg("-un")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "root".into())
}
