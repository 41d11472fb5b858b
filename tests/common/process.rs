//! A child process a test owns: killed and reaped when dropped, so a
//! failing test leaves nothing running. The one copy of signal, wait for
//! exit and kill that the gateway, the body-log listener, Redis and the sim
//! processes share.

#![allow(dead_code)]

use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

pub struct Proc {
    child: Option<Child>,
}

impl Proc {
    /// Spawns `cmd` with stdin and stdout closed and stderr into `log`.
    pub fn spawn_logged(cmd: &mut Command, log: &Path, what: &str) -> Proc {
        let file = std::fs::File::create(log).expect("log file");
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(file));
        Proc::spawn(cmd, what)
    }

    /// Spawns `cmd` as configured.
    pub fn spawn(cmd: &mut Command, what: &str) -> Proc {
        let child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {what}: {e}"));
        Proc::from(child)
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(Child::id).expect("running")
    }

    /// How it ended, once it has (reaping it).
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// Still running (not exited, not a zombie waiting to be reaped).
    pub fn is_alive(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Sends `sig` (a name such as `HUP` or `TERM`) with kill(1).
    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([format!("-{sig}"), self.pid().to_string()])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill -{sig} failed");
    }

    /// Its exit code once it exits within `timeout`; `None` if it did not
    /// (or was killed by a signal).
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<i32> {
        let child = self.child.as_mut()?;
        let start = Instant::now();
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                self.child = None;
                return status.code();
            }
            if start.elapsed() > timeout {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL, then reaps it: every socket it held is gone on return.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl From<Child> for Proc {
    fn from(child: Child) -> Proc {
        Proc { child: Some(child) }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}
