//! `llm-gateway sim` as a child process, for faults an in-process engine
//! cannot stage: a SIGKILL takes the process and every socket it holds at
//! once, with no code of the engine's running on the way out.

#![allow(dead_code)]

use super::process::Proc;
use std::io::{BufRead, BufReader};
use std::process::{ChildStdout, Command, Stdio};

pub struct SimProc {
    child: Proc,
    pub port: u16,
    /// Kept open: the engine's stdout is a pipe it may still write to.
    _stdout: BufReader<ChildStdout>,
}

impl SimProc {
    /// One engine on a free port, decoding up to `max_running` sequences at once.
    pub fn start(max_running: u16) -> SimProc {
        let mut child = Command::new(env!("CARGO_BIN_EXE_llm-gateway"))
            .args(["sim", "--engines", "1", "--port", "0", "--max-running"])
            .arg(max_running.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn llm-gateway sim");
        let mut stdout = BufReader::new(child.stdout.take().expect("sim stdout"));
        // "sim engine 0: http://127.0.0.1:PORT model=… max_running=…", printed
        // once the port is bound.
        let mut line = String::new();
        stdout.read_line(&mut line).expect("sim banner");
        let port = line
            .split("http://")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|addr| addr.rsplit(':').next())
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no port in the sim's banner {line:?}"));
        SimProc {
            child: Proc::from(child),
            port,
            _stdout: stdout,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.pid()
    }

    /// SIGKILL, then reaps the process: its sockets are gone when this returns.
    pub fn kill(&mut self) {
        self.child.kill()
    }
}
