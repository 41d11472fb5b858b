//! `--peers`: the real peer routers, each a router cell on the scenario's
//! engines and workload after the gateway and reference cells. Which ones
//! exist, where their binaries are, and the command line (and for nginx the
//! configuration) of each cell.
//!
//! A peer whose binary is not found is skipped with a line on stderr and
//! listed in the report, never silently: a comparison that quietly lost a
//! peer would read as one that had none to beat.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use crate::router::Fill;

/// Where `benches/peers.sh` installs the peers when
/// `LLM_GATEWAY_PEERS_DIR` is not set (relative to the working directory,
/// so a run from the checkout finds them).
pub const DEFAULT_DIR: &str = "target/peers";
pub const DIR_ENV: &str = "LLM_GATEWAY_PEERS_DIR";

/// A peer router's program.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Program {
    VllmRouter,
    Smg,
    Nginx,
}

impl Program {
    /// Its name on PATH.
    pub fn name(self) -> &'static str {
        match self {
            Program::VllmRouter => "vllm-router",
            Program::Smg => "smg",
            Program::Nginx => "nginx",
        }
    }

    /// Where `benches/peers.sh` puts it under the peers directory (nginx
    /// comes from the system's packages).
    fn in_dir(self) -> Option<&'static str> {
        match self {
            Program::VllmRouter => Some("vllm/bin/vllm-router"),
            Program::Smg => Some("sglang/bin/smg"),
            Program::Nginx => None,
        }
    }

    /// Known places outside PATH: Debian's nginx is in /usr/sbin, which a
    /// non-root user's PATH often lacks.
    fn fallback(self) -> Option<&'static str> {
        match self {
            Program::Nginx => Some("/usr/sbin/nginx"),
            _ => None,
        }
    }
}

/// One peer cell: a program with one policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer {
    /// The cell's name.
    pub name: &'static str,
    pub program: Program,
    /// The router's `--policy` (nginx: none, its hash is in the config).
    pub policy: &'static str,
}

/// Every peer, in the order they run.
pub const PEERS: [Peer; 5] = [
    Peer {
        name: "vllm-sticky",
        program: Program::VllmRouter,
        policy: "sticky_least_loaded",
    },
    Peer {
        name: "vllm-cache",
        program: Program::VllmRouter,
        policy: "cache_aware",
    },
    Peer {
        name: "vllm-hash",
        program: Program::VllmRouter,
        policy: "consistent_hash",
    },
    Peer {
        name: "sglang-cache",
        program: Program::Smg,
        policy: "cache_aware",
    },
    Peer {
        name: "nginx-hash",
        program: Program::Nginx,
        policy: "",
    },
];

/// `--peers` values: a peer's name, or `all` (what bare `--peers` means).
pub const CHOICES: [&str; 6] = [
    "all",
    PEERS[0].name,
    PEERS[1].name,
    PEERS[2].name,
    PEERS[3].name,
    PEERS[4].name,
];

pub fn by_name(name: &str) -> Option<Peer> {
    PEERS.iter().copied().find(|p| p.name == name)
}

/// A peer whose program was found: the cell the bench runs.
#[derive(Debug, Clone, PartialEq)]
pub struct Found {
    pub peer: Peer,
    pub exe: PathBuf,
}

/// A peer that was not found, and why (the stderr line's tail).
#[derive(Debug, Clone, PartialEq)]
pub struct Skipped {
    pub name: String,
    pub reason: String,
}

impl Skipped {
    /// What stderr says.
    pub fn line(&self) -> String {
        format!(
            "llm-gateway bench: peer {} skipped: {}",
            self.name, self.reason
        )
    }
}

fn executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Where `program` is: under `dir`, else on `path` (a PATH value), else a
/// known place; or why not.
pub fn locate(program: Program, dir: &Path, path: Option<&OsStr>) -> Result<PathBuf, String> {
    let own = program.in_dir().map(|rel| dir.join(rel));
    let on_path = path
        .into_iter()
        .flat_map(std::env::split_paths)
        .filter(|d| !d.as_os_str().is_empty())
        .map(|d| d.join(program.name()));
    let fallback = program.fallback().map(PathBuf::from);
    if let Some(exe) = own
        .clone()
        .into_iter()
        .chain(on_path)
        .chain(fallback)
        .find(|p| executable(p))
    {
        // Absolute, so the report names it wherever it is read and the
        // command does not depend on the shell's directory.
        return Ok(std::path::absolute(&exe).unwrap_or(exe));
    }
    Err(match own {
        Some(own) => format!(
            "{} not found in {} nor on PATH; run benches/peers.sh",
            program.name(),
            own.parent().unwrap_or(dir).display()
        ),
        None => format!("{} not found on PATH; run benches/peers.sh", program.name()),
    })
}

/// The peers directory of this run: `$LLM_GATEWAY_PEERS_DIR` or
/// `target/peers`.
pub fn dir() -> PathBuf {
    std::env::var_os(DIR_ENV)
        .filter(|d| !d.is_empty())
        .map_or_else(|| PathBuf::from(DEFAULT_DIR), PathBuf::from)
}

/// The chosen peers split into found and skipped, each skipped one with
/// its line on stderr.
pub fn find(chosen: &[Peer], dir: &Path, path: Option<&OsStr>) -> (Vec<Found>, Vec<Skipped>) {
    let mut found = Vec::new();
    let mut skipped = Vec::new();
    for &peer in chosen {
        match locate(peer.program, dir, path) {
            Ok(exe) => found.push(Found { peer, exe }),
            Err(reason) => {
                let s = Skipped {
                    name: peer.name.to_string(),
                    reason,
                };
                eprintln!("{}", s.line());
                skipped.push(s);
            }
        }
    }
    (found, skipped)
}

impl Found {
    /// The router's argv in one cell; `prefix` is the cell's own directory
    /// (nginx's prefix, where its configuration goes).
    pub fn argv(&self, fill: &Fill, prefix: &Path) -> Vec<String> {
        let exe = self.exe.display().to_string();
        let urls = fill.engines.iter().map(|a| format!("http://{a}"));
        let port = fill.port.to_string();
        let metrics = fill.metrics_port.to_string();
        let policy = self.peer.policy.to_string();
        let common = |head: Vec<String>| -> Vec<String> {
            head.into_iter()
                .chain([
                    "--host".into(),
                    "127.0.0.1".into(),
                    "--port".into(),
                    port.clone(),
                ])
                .chain(std::iter::once("--worker-urls".to_string()))
                .chain(urls.clone())
                .chain([
                    "--policy".into(),
                    policy.clone(),
                    "--prometheus-host".into(),
                    "127.0.0.1".into(),
                    // Every instance its own: sglang-router's default port
                    // is shared and a second instance panics on it.
                    "--prometheus-port".into(),
                    metrics.clone(),
                ])
                .collect()
        };
        match self.peer.program {
            Program::VllmRouter => common(vec![exe]),
            Program::Smg => common(vec![exe, "launch".into()]),
            Program::Nginx => vec![
                exe,
                "-p".into(),
                prefix.display().to_string(),
                "-c".into(),
                prefix.join("nginx.conf").display().to_string(),
                // Before the config is read nginx opens its compiled-in
                // log, which a user other than root may not write.
                "-e".into(),
                "stderr".into(),
                "-g".into(),
                "daemon off;".into(),
            ],
        }
    }

    /// The command line the cell runs (`sh -c`), writing what it needs
    /// first (nginx: its configuration, under `prefix`).
    pub fn prepare(&self, fill: &Fill, prefix: &Path) -> Result<String, String> {
        if self.peer.program == Program::Nginx {
            std::fs::create_dir_all(prefix)
                .map_err(|e| format!("cannot create {}: {e}", prefix.display()))?;
            let conf = prefix.join("nginx.conf");
            std::fs::write(&conf, nginx_conf(fill, prefix))
                .map_err(|e| format!("cannot write {}: {e}", conf.display()))?;
        }
        Ok(self
            .argv(fill, prefix)
            .iter()
            .map(|a| shell_quote(a))
            .collect::<Vec<_>>()
            .join(" "))
    }

    /// How the report names the command: the argv with placeholders.
    pub fn describe(&self) -> String {
        match self.peer.program {
            Program::Nginx => format!(
                "{} -p <cell dir> -c <cell dir>/nginx.conf -g 'daemon off;' (upstream hash \
                 $http_x_session_id consistent, keep-alive to the engines, no buffering)",
                self.exe.display()
            ),
            Program::VllmRouter | Program::Smg => format!(
                "{}{} --host 127.0.0.1 --port {{port}} --worker-urls {{engines}} --policy {} \
                 --prometheus-host 127.0.0.1 --prometheus-port {{metrics_port}}",
                self.exe.display(),
                if self.peer.program == Program::Smg {
                    " launch"
                } else {
                    ""
                },
                self.peer.policy
            ),
        }
    }
}

/// `'a'`, the single quotes of `a` escaped, for `sh -c`.
fn shell_quote(a: &str) -> String {
    format!("'{}'", a.replace('\'', r"'\''"))
}

/// nginx's configuration for one cell: the consistent hash of the session
/// header over the engines, streaming as it comes (no buffering), HTTP/1.1
/// keep-alive to the engines, every path it writes under `prefix`.
pub fn nginx_conf(fill: &Fill, prefix: &Path) -> String {
    let servers: String = fill
        .engines
        .iter()
        .map(|a| format!("        server {a};\n"))
        .collect();
    let p = prefix.display();
    format!(
        "# Generated by llm-gateway bench for one cell.\n\
         worker_processes 1;\n\
         pid {p}/nginx.pid;\n\
         error_log stderr warn;\n\
         events {{\n    worker_connections 4096;\n}}\n\
         http {{\n\
         \x20   access_log off;\n\
         \x20   # Temp files under the prefix: the compiled-in ones are not ours to write.\n\
         \x20   client_body_temp_path {p}/client_body;\n\
         \x20   proxy_temp_path {p}/proxy;\n\
         \x20   fastcgi_temp_path {p}/fastcgi;\n\
         \x20   uwsgi_temp_path {p}/uwsgi;\n\
         \x20   scgi_temp_path {p}/scgi;\n\
         \x20   # Prompts of ~60k tokens stay in memory, not in temp files.\n\
         \x20   client_max_body_size 64m;\n\
         \x20   client_body_buffer_size 4m;\n\
         \x20   keepalive_requests 100000;\n\
         \x20   upstream engines {{\n\
         \x20       hash $http_x_session_id consistent;\n\
         {servers}\
         \x20       keepalive 256;\n\
         \x20   }}\n\
         \x20   server {{\n\
         \x20       listen 127.0.0.1:{port};\n\
         \x20       location / {{\n\
         \x20           proxy_pass http://engines;\n\
         \x20           proxy_http_version 1.1;\n\
         \x20           proxy_set_header Connection \"\";\n\
         \x20           proxy_buffering off;\n\
         \x20           proxy_request_buffering off;\n\
         \x20           proxy_read_timeout 300s;\n\
         \x20       }}\n\
         \x20   }}\n\
         }}\n",
        port = fill.port,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;

    fn engines() -> Vec<SocketAddr> {
        vec![
            "127.0.0.1:40001".parse().unwrap(),
            "127.0.0.1:40002".parse().unwrap(),
        ]
    }

    fn found(name: &str) -> Found {
        Found {
            peer: by_name(name).unwrap(),
            exe: PathBuf::from("/p/bin/x"),
        }
    }

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn each_peer_fills_to_its_argv() {
        let e = engines();
        let fill = Fill {
            port: 5000,
            metrics_port: 5001,
            engines: &e,
        };
        let prefix = Path::new("/tmp/cell");
        let vllm = |policy: &str| {
            s(&[
                "/p/bin/x",
                "--host",
                "127.0.0.1",
                "--port",
                "5000",
                "--worker-urls",
                "http://127.0.0.1:40001",
                "http://127.0.0.1:40002",
                "--policy",
                policy,
                "--prometheus-host",
                "127.0.0.1",
                "--prometheus-port",
                "5001",
            ])
        };
        assert_eq!(
            found("vllm-sticky").argv(&fill, prefix),
            vllm("sticky_least_loaded")
        );
        assert_eq!(found("vllm-cache").argv(&fill, prefix), vllm("cache_aware"));
        assert_eq!(
            found("vllm-hash").argv(&fill, prefix),
            vllm("consistent_hash")
        );
        let mut smg = vllm("cache_aware");
        smg.insert(1, "launch".into());
        assert_eq!(found("sglang-cache").argv(&fill, prefix), smg);
        assert_eq!(
            found("nginx-hash").argv(&fill, prefix),
            s(&[
                "/p/bin/x",
                "-p",
                "/tmp/cell",
                "-c",
                "/tmp/cell/nginx.conf",
                "-e",
                "stderr",
                "-g",
                "daemon off;"
            ])
        );
        // Every name is a choice, and the choices are the names and "all".
        assert_eq!(CHOICES.len(), PEERS.len() + 1);
        assert!(PEERS.iter().all(|p| CHOICES.contains(&p.name)));
        assert_eq!(by_name("vllm"), None);
    }

    #[test]
    fn the_command_line_quotes_for_the_shell() {
        let e = engines();
        let fill = Fill {
            port: 5000,
            metrics_port: 5001,
            engines: &e,
        };
        let f = Found {
            peer: by_name("vllm-hash").unwrap(),
            exe: PathBuf::from("/o'brien/vllm router"),
        };
        let cmd = f.prepare(&fill, Path::new("/tmp/unused")).unwrap();
        assert!(
            cmd.starts_with(r"'/o'\''brien/vllm router' '--host' '127.0.0.1' '--port' '5000'"),
            "{cmd}"
        );
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("printf '%s\\n' {}", &cmd))
            .output()
            .unwrap();
        let args: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(String::from)
            .collect();
        assert_eq!(args, f.argv(&fill, Path::new("/tmp/unused")));
    }

    #[test]
    fn nginx_config_hashes_the_session_over_every_engine() {
        let e = engines();
        let fill = Fill {
            port: 5000,
            metrics_port: 5001,
            engines: &e,
        };
        let dir = std::env::temp_dir().join(format!("bench-nginx-conf-{}", std::process::id()));
        let cmd = found("nginx-hash").prepare(&fill, &dir).unwrap();
        assert!(cmd.ends_with("'-g' 'daemon off;'"), "{cmd}");
        let conf = std::fs::read_to_string(dir.join("nginx.conf")).unwrap();
        assert_eq!(conf, nginx_conf(&fill, &dir));
        for line in [
            "hash $http_x_session_id consistent;",
            "server 127.0.0.1:40001;",
            "server 127.0.0.1:40002;",
            "keepalive 256;",
            "listen 127.0.0.1:5000;",
            "proxy_pass http://engines;",
            "proxy_http_version 1.1;",
            "proxy_set_header Connection \"\";",
            "proxy_buffering off;",
            "error_log stderr warn;",
        ] {
            assert!(conf.contains(line), "{line} missing:\n{conf}");
        }
        assert!(conf.contains(&format!("pid {}/nginx.pid;", dir.display())));
        // Braces balance (a format! slip would not).
        assert_eq!(conf.matches('{').count(), conf.matches('}').count());
        // nginx itself, when here, accepts it.
        if let Ok(nginx) = locate(Program::Nginx, &dir, std::env::var_os("PATH").as_deref()) {
            let argv = found("nginx-hash").argv(&fill, &dir);
            let out = std::process::Command::new(nginx)
                .args(&argv[1..argv.len() - 2])
                .arg("-t")
                .output()
                .unwrap();
            assert!(out.status.success(), "{out:?}\n{conf}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn fake_exe(path: &Path, mode: u32) {
        use std::os::unix::fs::PermissionsExt;
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn peers_are_found_in_the_dir_then_on_path_else_skipped() {
        let root = std::env::temp_dir().join(format!("bench-peers-find-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let dir = root.join("peers");
        let bin = root.join("bin");
        fake_exe(&dir.join("vllm/bin/vllm-router"), 0o755);
        fake_exe(&bin.join("vllm-router"), 0o755);
        fake_exe(&bin.join("smg"), 0o755);
        // Not executable: as good as absent.
        fake_exe(&dir.join("sglang/bin/smg"), 0o644);
        // A relative directory is made absolute.
        let cwd = std::env::current_dir().unwrap();
        let rel = Path::new("bench-peers-rel").join(std::process::id().to_string());
        fake_exe(&cwd.join(&rel).join("vllm/bin/vllm-router"), 0o755);
        let located = locate(Program::VllmRouter, &rel, None);
        // Gone before the assertion: a failure leaves nothing in the tree.
        let _ = std::fs::remove_dir_all(cwd.join("bench-peers-rel"));
        assert_eq!(located, Ok(cwd.join(&rel).join("vllm/bin/vllm-router")));
        let path = std::env::join_paths([root.join("nothing"), bin.clone()]).unwrap();
        let path = Some(path.as_os_str());
        assert_eq!(
            locate(Program::VllmRouter, &dir, path),
            Ok(dir.join("vllm/bin/vllm-router"))
        );
        assert_eq!(locate(Program::Smg, &dir, path), Ok(bin.join("smg")));
        let chosen = [
            by_name("vllm-cache").unwrap(),
            by_name("sglang-cache").unwrap(),
        ];
        let (found, skipped) = find(&chosen, &dir, path);
        assert_eq!(found.len(), 2);
        assert!(skipped.is_empty());
        // Without PATH, only what the directory holds.
        let (found, skipped) = find(&chosen, &dir, None);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].peer.name, "vllm-cache");
        assert_eq!(skipped.len(), 1);
        assert_eq!(skipped[0].name, "sglang-cache");
        assert_eq!(
            skipped[0].line(),
            format!(
                "llm-gateway bench: peer sglang-cache skipped: smg not found in {} nor on \
                 PATH; run benches/peers.sh",
                dir.join("sglang/bin").display()
            )
        );
        // An empty directory and an empty PATH: every peer but a system
        // nginx in /usr/sbin is skipped.
        let (found, skipped) = find(&PEERS, &root.join("none"), Some(OsStr::new("")));
        assert_eq!(found.len() + skipped.len(), PEERS.len());
        assert!(found.iter().all(|f| f.exe == Path::new("/usr/sbin/nginx")));
        assert!(skipped
            .iter()
            .all(|s| s.reason.contains("run benches/peers.sh")));
        let _ = std::fs::remove_dir_all(&root);
    }
}
