//! A process a cell starts (a gateway replica, a peer router): its output
//! in a log file, waited for until it is ready, its log's tail for the
//! errors. How each is stopped is its owner's (a gateway by its pid, a
//! router's whole process group).

use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use tokio::time::{sleep, Instant};

/// Lines of the log an error quotes.
const TAIL_LINES: usize = 20;

pub struct Launched {
    child: Option<Child>,
    pub pid: u32,
    pub log: PathBuf,
}

/// Why [`Launched::wait_ready`] gave up.
pub enum NotReady {
    Exited(ExitStatus),
    TimedOut,
}

impl Launched {
    /// Spawns `command` with stdin closed and stdout and stderr in `log`.
    pub fn spawn(command: &mut Command, log: PathBuf) -> Result<Launched, String> {
        let io = |e: std::io::Error| format!("creating the log {}: {e}", log.display());
        let out = std::fs::File::create(&log).map_err(io)?;
        let err = out.try_clone().map_err(io)?;
        let child = command
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("cannot start {:?}: {e}", command.get_program()))?;
        Ok(Launched {
            pid: child.id(),
            child: Some(child),
            log,
        })
    }

    /// Polls `ready` every `every` until it says yes, the process exits,
    /// or `timeout` passes.
    pub async fn wait_ready<F, Fut>(
        &mut self,
        timeout: Duration,
        every: Duration,
        mut ready: F,
    ) -> Result<(), NotReady>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                return Err(NotReady::Exited(status));
            }
            if ready().await {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(NotReady::TimedOut);
            }
            sleep(every).await;
        }
    }

    /// Whether the process still runs.
    pub fn alive(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// The child, for its owner to stop and reap (once: `None` after).
    pub fn take(&mut self) -> Option<Child> {
        self.child.take()
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn log_tail(&self) -> String {
        let text = self.log_text();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(TAIL_LINES)..].join("\n")
    }
}
