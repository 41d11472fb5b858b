//! An external router in place of the gateway (`--router-cmd`): the
//! command line from its template, the process (a group of its own, so
//! whatever it starts goes with it), readiness, teardown, and which engine
//! answered a request it forwarded.
//!
//! A router sets none of the gateway's `X-Routed-*` headers, so the engine
//! that served a request is read from the answer itself: the simulated
//! engine's response ids carry its port (`chatcmpl-sim<port>-<n>`).

use std::net::{SocketAddr, TcpListener};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::process::{Launched, NotReady};
use crate::stats;

/// The router cell's name when `--router-label` is not given.
pub const DEFAULT_LABEL: &str = "router";
/// How long the router may take to accept connections on its port
/// (vllm-router binds only once every engine's `/health` answers).
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the router's processes get to be gone after SIGKILL.
const STOP_TIMEOUT: Duration = Duration::from_secs(2);
/// The placeholders a template may use.
const PLACEHOLDERS: [&str; 4] = ["port", "engines", "engine_ports", "metrics_port"];

/// `--router-cmd` and `--router-label`.
#[derive(Debug, Clone, PartialEq)]
pub struct RouterSpec {
    /// The template, as given.
    pub command: String,
    pub label: String,
}

/// What a template's placeholders stand for in one cell.
pub struct Fill<'a> {
    /// Where the router listens (`{port}`).
    pub port: u16,
    /// Its Prometheus listener (`{metrics_port}`).
    pub metrics_port: u16,
    /// `{engines}` (URLs, space-separated) and `{engine_ports}` (ports,
    /// comma-separated).
    pub engines: &'a [SocketAddr],
}

/// The `{name}` placeholders of `template` (a name of lowercase letters and
/// `_`, so a shell's `${HOME}` is one, `{ a }` or `{A}` not): each with its
/// byte range.
fn placeholders(template: &str) -> Vec<(std::ops::Range<usize>, &str)> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(open) = template[from..].find('{').map(|i| from + i) {
        let Some(close) = template[open + 1..].find('}').map(|i| open + 1 + i) else {
            break;
        };
        let name = &template[open + 1..close];
        if !name.is_empty() && name.bytes().all(|b| b.is_ascii_lowercase() || b == b'_') {
            out.push((open..close + 1, name));
            from = close + 1;
        } else {
            from = open + 1;
        }
    }
    out
}

/// Checks a `--router-cmd` template: it names the port to listen on, and no
/// placeholder the bench does not fill (a typo would reach the router).
pub fn check_template(template: &str) -> Result<(), String> {
    if template.trim().is_empty() {
        return Err("--router-cmd: empty command".into());
    }
    let found = placeholders(template);
    if let Some((_, unknown)) = found.iter().find(|(_, n)| !PLACEHOLDERS.contains(n)) {
        return Err(format!(
            "--router-cmd: unknown placeholder {{{unknown}}} (known: {})",
            PLACEHOLDERS.map(|p| format!("{{{p}}}")).join(" ")
        ));
    }
    if !found.iter().any(|(_, n)| *n == "port") {
        return Err("--router-cmd: the command must listen on {port}".into());
    }
    Ok(())
}

/// The command line of one cell: `template` with its placeholders filled.
pub fn expand(template: &str, fill: &Fill) -> String {
    let value = |name: &str| -> Option<String> {
        Some(match name {
            "port" => fill.port.to_string(),
            "metrics_port" => fill.metrics_port.to_string(),
            "engines" => fill
                .engines
                .iter()
                .map(|a| format!("http://{a}"))
                .collect::<Vec<_>>()
                .join(" "),
            "engine_ports" => fill
                .engines
                .iter()
                .map(|a| a.port().to_string())
                .collect::<Vec<_>>()
                .join(","),
            _ => return None,
        })
    };
    let mut out = String::with_capacity(template.len() + 64);
    let mut at = 0;
    for (range, name) in placeholders(template) {
        if let Some(v) = value(name) {
            out.push_str(&template[at..range.start]);
            out.push_str(&v);
            at = range.end;
        }
    }
    out.push_str(&template[at..]);
    out
}

/// The engine that produced a response, from its id: the simulated engine
/// names it `<prefix>sim<port>-<n>` (`chatcmpl-sim40123-7`); the index of
/// the engine listening on that port, if any.
pub fn engine_of_response_id(id: &str, engines: &[SocketAddr]) -> Option<usize> {
    id.match_indices("sim").find_map(|(i, _)| {
        let rest = &id[i + 3..];
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 || rest.as_bytes().get(digits) != Some(&b'-') {
            return None;
        }
        let port: u16 = rest[..digits].parse().ok()?;
        engines.iter().position(|a| a.port() == port)
    })
}

/// Two distinct ports free a moment ago on 127.0.0.1 (both held while the
/// second is chosen).
fn two_free_ports() -> std::io::Result<(u16, u16)> {
    let a = TcpListener::bind("127.0.0.1:0")?;
    let b = TcpListener::bind("127.0.0.1:0")?;
    Ok((a.local_addr()?.port(), b.local_addr()?.port()))
}

/// SIGKILL to every process of group `pgid` (the shell's `kill`, which
/// takes a negative pid; the bench links no libc).
fn kill_group(pgid: u32) {
    let _ = Command::new("sh")
        .arg("-c")
        .arg(format!("kill -s KILL -- -{pgid} 2>/dev/null"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// A cell's command line from its ports and engines and a directory of its
/// own.
pub type CommandFor<'a> = dyn Fn(&Fill, &Path) -> Result<String, String> + 'a;

/// The router of one cell: `sh -c <command>` in a process group of its
/// own, its output in a log file. Dropping it kills the group.
pub struct RouterProcess {
    /// The shell, whose pid is the process group's.
    proc: Launched,
    /// Where it listens.
    pub addr: SocketAddr,
    /// The command line it was started with.
    pub command: String,
}

impl RouterProcess {
    /// Starts the router over `engines` and waits (at most
    /// `START_TIMEOUT`) until its port accepts connections. A router that
    /// exits first is an error with its log's tail; one whose port was
    /// taken in the meantime is started again on other ports.
    pub async fn start(
        template: &str,
        engines: &[SocketAddr],
        dir: &Path,
    ) -> Result<RouterProcess, String> {
        Self::start_with(&|fill, _| Ok(expand(template, fill)), engines, dir).await
    }

    /// [`start`](Self::start) with the command line from `command`, given
    /// the cell's ports and a directory of the attempt's own (where a
    /// router that needs files, nginx its configuration, writes them).
    pub async fn start_with(
        command: &CommandFor<'_>,
        engines: &[SocketAddr],
        dir: &Path,
    ) -> Result<RouterProcess, String> {
        let mut last_error = String::new();
        for attempt in 0..3 {
            match Self::start_once(command, engines, dir, attempt).await {
                Ok(r) => return Ok(r),
                Err((e, port_taken)) => {
                    last_error = e;
                    if !port_taken {
                        break;
                    }
                }
            }
        }
        Err(last_error)
    }

    /// An error says whether the log mentions a port in use.
    async fn start_once(
        command: &CommandFor<'_>,
        engines: &[SocketAddr],
        dir: &Path,
        attempt: u32,
    ) -> Result<RouterProcess, (String, bool)> {
        let (port, metrics_port) =
            two_free_ports().map_err(|e| (format!("finding a port: {e}"), false))?;
        let fill = Fill {
            port,
            metrics_port,
            engines,
        };
        let command =
            command(&fill, &dir.join(format!("router-{attempt}"))).map_err(|e| (e, false))?;
        let log = dir.join(format!("router-{attempt}.log"));
        let mut shell = Command::new("sh");
        shell.arg("-c").arg(&command).process_group(0);
        let proc = Launched::spawn(&mut shell, log).map_err(|e| (e, false))?;
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let mut r = RouterProcess {
            proc,
            addr,
            command,
        };
        eprintln!("   router: {}", r.command);
        let accepts = || async {
            let connect = tokio::net::TcpStream::connect(addr);
            matches!(
                tokio::time::timeout(Duration::from_secs(1), connect).await,
                Ok(Ok(_))
            )
        };
        let waited = r
            .proc
            .wait_ready(START_TIMEOUT, Duration::from_millis(100), accepts)
            .await;
        let why = match waited {
            Ok(()) => return Ok(r),
            Err(NotReady::Exited(status)) => format!(
                "the router exited during start-up ({status}): {}\nlog {}:\n{}",
                r.command,
                r.proc.log.display(),
                r.log_tail()
            ),
            Err(NotReady::TimedOut) => format!(
                "the router did not accept connections on {} within {START_TIMEOUT:?}: {}\n\
                 log:\n{}",
                r.addr,
                r.command,
                r.log_tail()
            ),
        };
        let taken = r.proc.log_text().contains("in use");
        r.stop();
        Err((why, taken))
    }

    /// The process group (the shell's pid).
    pub fn pgid(&self) -> u32 {
        self.proc.pid
    }

    /// Whether the process the bench started (the shell) still runs.
    pub fn alive(&mut self) -> bool {
        self.proc.alive()
    }

    pub fn log_tail(&self) -> String {
        self.proc.log_tail()
    }

    /// Kills the whole process group (SIGKILL), reaps the shell and waits
    /// until no process of the group is left; returns the pids still there
    /// after `STOP_TIMEOUT` (none, normally). Idempotent.
    pub fn stop(&mut self) -> Vec<u32> {
        let Some(mut child) = self.proc.take() else {
            return Vec::new();
        };
        let pgid = self.pgid();
        kill_group(pgid);
        let _ = child.wait();
        let deadline = std::time::Instant::now() + STOP_TIMEOUT;
        loop {
            let left: Vec<u32> = stats::group_members(pgid)
                .into_iter()
                .map(|(pid, _)| pid)
                .collect();
            if left.is_empty() || std::time::Instant::now() >= deadline {
                return left;
            }
            kill_group(pgid);
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for RouterProcess {
    fn drop(&mut self) {
        let left = self.stop();
        if !left.is_empty() {
            eprintln!(
                "llm-gateway bench: router processes {left:?} (group {}) outlived SIGKILL",
                self.pgid()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn engines() -> Vec<SocketAddr> {
        vec![
            "127.0.0.1:40001".parse().unwrap(),
            "127.0.0.1:40002".parse().unwrap(),
            "127.0.0.1:40013".parse().unwrap(),
        ]
    }

    #[test]
    fn templates_fill_every_placeholder() {
        let e = engines();
        let fill = Fill {
            port: 5000,
            metrics_port: 5001,
            engines: &e,
        };
        assert_eq!(
            expand(
                "vllm-router --port {port} --worker-urls {engines} \
                 --prometheus-port {metrics_port}",
                &fill
            ),
            "vllm-router --port 5000 --worker-urls http://127.0.0.1:40001 \
             http://127.0.0.1:40002 http://127.0.0.1:40013 --prometheus-port 5001"
        );
        assert_eq!(
            expand("r -p {port} -e {engine_ports} -p2 {port}", &fill),
            "r -p 5000 -e 40001,40002,40013 -p2 5000"
        );
        // What is not a placeholder stays as written.
        assert_eq!(
            expand("sh -c 'echo ${HOME} {A} { port } {' {port}}", &fill),
            "sh -c 'echo ${HOME} {A} { port } {' 5000}"
        );
    }

    #[test]
    fn templates_are_checked() {
        assert!(check_template("r --port {port} {engines} {engine_ports} {metrics_port}").is_ok());
        // A shell's ${VAR} is a placeholder name the bench does not know.
        assert!(check_template("r --port {port} --home ${home}").is_err());
        assert!(check_template("r --port ${PORT} {port}").is_ok());
        let e = check_template("r --port {prot}").unwrap_err();
        assert!(e.contains("{prot}"), "{e}");
        assert!(check_template("r --worker-urls {engines}")
            .unwrap_err()
            .contains("{port}"));
        assert!(check_template("  ").is_err());
    }

    #[test]
    fn response_ids_name_the_engine_by_its_port() {
        let e = engines();
        assert_eq!(engine_of_response_id("chatcmpl-sim40002-17", &e), Some(1));
        assert_eq!(engine_of_response_id("cmpl-sim40013-0", &e), Some(2));
        assert_eq!(engine_of_response_id("msg_sim40001-3", &e), Some(0));
        // A port no engine has, no port, or no id of the simulator.
        assert_eq!(engine_of_response_id("chatcmpl-sim40099-1", &e), None);
        assert_eq!(engine_of_response_id("chatcmpl-sim-1", &e), None);
        assert_eq!(engine_of_response_id("chatcmpl-sim40001", &e), None);
        assert_eq!(engine_of_response_id("chatcmpl-abc", &e), None);
        assert_eq!(engine_of_response_id("", &e), None);
        // A router's own prefix before the engine's id does not hide it.
        assert_eq!(
            engine_of_response_id("simple-chatcmpl-sim40013-5", &e),
            Some(2)
        );
    }

    #[tokio::test]
    async fn a_router_is_started_waited_for_and_stopped_with_its_children() {
        let python3 = Command::new("python3").arg("-V").output();
        if !python3.is_ok_and(|o| o.status.success()) {
            eprintln!("no python3 to play the router: skipped");
            return;
        }
        let dir = std::env::temp_dir().join(format!("bench-router-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // A "router" that starts a child of its own and listens on {port}.
        let python = "import socket,time; s=socket.socket(); \
                      s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); \
                      s.bind(('127.0.0.1', {port})); s.listen(); time.sleep(60)";
        let template = format!("sleep 60 & python3 -c \"{python}\"");
        let mut r = RouterProcess::start(&template, &engines(), &dir)
            .await
            .expect("starts");
        assert!(r.alive());
        let pgid = r.pgid();
        assert!(stats::group_members(pgid).len() >= 2);
        assert!(tokio::net::TcpStream::connect(r.addr).await.is_ok());
        assert_eq!(r.stop(), Vec::<u32>::new());
        assert!(stats::group_members(pgid).is_empty());
        assert!(!r.alive());
        // One that exits at once is an error naming it, with its log.
        let e = match RouterProcess::start("echo nope >&2; exit 3 # {port}", &engines(), &dir).await
        {
            Ok(_) => panic!("a router that exits cannot start"),
            Err(e) => e,
        };
        assert!(
            e.contains("exited during start-up") && e.contains("nope"),
            "{e}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
