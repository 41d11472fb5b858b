//! The access log: one JSON line per finished request (`line.rs`), written
//! to a file or standard output off the request path.
//!
//! The request path only calls [`AccessLog::enqueue`], which never waits:
//! lines go through a bounded channel to a writer thread of their own (a
//! plain thread, as the writes are blocking file I/O), and a full channel
//! drops the line, counted in `llm_gateway_access_log_lines_total
//! {result="dropped"}`. The writer flushes whenever the channel is empty,
//! so a line is on disk within moments of its request's end; each queued
//! line holds a `lifecycle::PendingOutput`, so the drain waits for the last
//! ones (bounded) before the process exits.
//!
//! Log rotation: SIGHUP ([`ReopenOnHangup`]) makes the writer open the
//! file again by its name before its next write (or within half a second
//! when idle), so logrotate can rename the file and signal, without
//! `copytruncate`. Standard output is never reopened.

pub mod line;

use crate::config::{AccessLogConfig, AccessLogTarget};
use crate::lifecycle::PendingOutput;
use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use prometheus::IntCounter;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::Duration;

/// How lines ended.
pub struct LineCounters {
    pub written: IntCounter,
    pub dropped: IntCounter,
    pub error: IntCounter,
}

impl LineCounters {
    fn new() -> Self {
        let lines = &crate::metrics::metrics().access_log_lines;
        LineCounters {
            written: lines.with_label_values(&["written"]),
            dropped: lines.with_label_values(&["dropped"]),
            error: lines.with_label_values(&["error"]),
        }
    }
}

/// A line in the channel, keeping the process from exiting before it is
/// written (`lifecycle::wait_for_output`).
struct Queued {
    line: Vec<u8>,
    _pending: PendingOutput,
}

/// The access log of the process: one, made by `server::run` when
/// gateway.yaml has `access_log:`.
pub struct AccessLog {
    tx: SyncSender<Queued>,
    reopen: Arc<AtomicBool>,
    counters: Arc<LineCounters>,
}

impl AccessLog {
    /// Opens the target (so that a path that cannot be written stops the
    /// start, with the reason) and starts the writer thread.
    pub fn start(config: &AccessLogConfig) -> std::io::Result<Arc<AccessLog>> {
        let mut sink = Sink::open(&config.target)?;
        let (tx, rx) = sync_channel(config.queue_lines);
        let reopen = Arc::new(AtomicBool::new(false));
        let counters = Arc::new(LineCounters::new());
        let (flag, counts) = (Arc::clone(&reopen), Arc::clone(&counters));
        std::thread::Builder::new()
            .name("access-log".into())
            .spawn(move || sink.run(&rx, &flag, &counts))?;
        Ok(Arc::new(AccessLog {
            tx,
            reopen,
            counters,
        }))
    }

    /// Queues `line` for the writer without waiting; a full queue drops it.
    pub fn enqueue(&self, line: Vec<u8>) {
        let queued = Queued {
            line,
            _pending: PendingOutput::new(),
        };
        match self.tx.try_send(queued) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => self.counters.dropped.inc(),
            Err(TrySendError::Disconnected(_)) => self.counters.error.inc(),
        }
    }

    /// The file is opened again by its name before the next write.
    pub fn reopen(&self) {
        self.reopen.store(true, Ordering::Release);
    }
}

/// Where the writer writes.
struct Sink {
    target: AccessLogTarget,
    out: Box<dyn Write + Send>,
    /// The last write failed (logged once until a write succeeds again).
    failing: bool,
}

/// How long an idle writer waits before it looks at the reopen flag again.
const IDLE_CHECK: Duration = Duration::from_millis(500);

impl Sink {
    fn open(target: &AccessLogTarget) -> std::io::Result<Sink> {
        let out: Box<dyn Write + Send> = match target {
            AccessLogTarget::Stdout => Box::new(std::io::stdout()),
            AccessLogTarget::File(path) => Box::new(open_append(path)?),
        };
        Ok(Sink {
            target: target.clone(),
            out: Box::new(std::io::BufWriter::with_capacity(64 << 10, out)),
            failing: false,
        })
    }

    /// Writes what arrives, flushing whenever the channel is empty, until
    /// every sender is gone.
    fn run(&mut self, rx: &Receiver<Queued>, reopen: &AtomicBool, counters: &LineCounters) {
        let mut batch: Vec<Queued> = Vec::new();
        loop {
            match rx.recv_timeout(IDLE_CHECK) {
                Ok(first) => batch.push(first),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return,
            }
            if reopen.swap(false, Ordering::AcqRel) {
                self.reopen();
            }
            batch.extend(rx.try_iter());
            if batch.is_empty() {
                continue;
            }
            let mut ok = batch.iter().all(|q| self.out.write_all(&q.line).is_ok());
            ok &= self.out.flush().is_ok();
            let counter = if ok {
                &counters.written
            } else {
                &counters.error
            };
            counter.inc_by(batch.len() as u64);
            self.report(ok);
            // The lines' `PendingOutput`s go only now that they are out.
            batch.clear();
        }
    }

    fn reopen(&mut self) {
        let AccessLogTarget::File(path) = &self.target else {
            return;
        };
        let _ = self.out.flush();
        match open_append(path) {
            Ok(file) => {
                self.out = Box::new(std::io::BufWriter::with_capacity(64 << 10, file));
                log::info!("access log: {} opened again (SIGHUP)", path.display());
            }
            // The old file stays: its lines are not lost, only not where
            // the rotation expects them.
            Err(e) => log::error!(
                "access log: cannot open {} again ({e}); writing on to the file already open",
                path.display()
            ),
        }
    }

    fn report(&mut self, ok: bool) {
        if !ok && !self.failing {
            log::error!(
                "access log: writing failed; lines are counted as errors until a write succeeds"
            );
        }
        self.failing = !ok;
    }
}

fn open_append(path: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))
}

/// SIGHUP makes the access log open its file again. A service of its own,
/// next to the controller's reload on the same signal (tokio hands each
/// listener every signal).
pub struct ReopenOnHangup(pub Arc<AccessLog>);

#[async_trait]
impl BackgroundService for ReopenOnHangup {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        use tokio::signal::unix::{signal, SignalKind};
        let mut hup = match signal(SignalKind::hangup()) {
            Ok(hup) => hup,
            Err(e) => {
                log::error!(
                    "access log: cannot listen for SIGHUP ({e}); the file is never opened again"
                );
                return;
            }
        };
        loop {
            tokio::select! {
                _ = hup.recv() => self.0.reopen(),
                _ = shutdown.changed() => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wait(what: &str, mut f: impl FnMut() -> bool) {
        let start = std::time::Instant::now();
        while !f() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "timed out: {what}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn lines_are_written_and_the_file_is_opened_again_after_a_rename() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("access.log");
        let config = AccessLogConfig {
            target: AccessLogTarget::File(path.clone()),
            queue_lines: 16,
        };
        let log = AccessLog::start(&config).unwrap();
        log.enqueue(b"one\n".to_vec());
        wait("the first line", || {
            std::fs::read_to_string(&path).is_ok_and(|t| t == "one\n")
        });
        // logrotate's way: rename, then signal.
        let rotated = dir.path().join("access.log.1");
        std::fs::rename(&path, &rotated).unwrap();
        log.reopen();
        log.enqueue(b"two\n".to_vec());
        wait("the line after the rotation", || {
            std::fs::read_to_string(&path).is_ok_and(|t| t == "two\n")
        });
        assert_eq!(std::fs::read_to_string(&rotated).unwrap(), "one\n");
        // Control: without the signal a renamed file keeps being written.
        std::fs::rename(&path, &rotated).unwrap();
        log.enqueue(b"three\n".to_vec());
        wait("the line in the renamed file", || {
            std::fs::read_to_string(&rotated).is_ok_and(|t| t == "two\nthree\n")
        });
        assert!(!path.exists());
    }

    /// A writer that does not keep up: the request path never waits, the
    /// lines past the queue's bound are dropped and counted.
    #[test]
    fn a_full_queue_drops_and_counts_without_waiting() {
        let (tx, rx) = sync_channel(2);
        let log = AccessLog {
            tx,
            reopen: Arc::default(),
            counters: Arc::new(LineCounters::new()),
        };
        let dropped = log.counters.dropped.get();
        let started = std::time::Instant::now();
        for _ in 0..5 {
            log.enqueue(b"x\n".to_vec());
        }
        assert!(started.elapsed() < Duration::from_secs(1));
        assert_eq!(log.counters.dropped.get() - dropped, 3);
        // Control: the two that fitted are there for the writer.
        assert_eq!(rx.try_iter().count(), 2);
    }

    #[test]
    fn an_unwritable_path_fails_the_start() {
        let config = AccessLogConfig {
            target: AccessLogTarget::File("/nonexistent-dir/x/access.log".into()),
            queue_lines: 1,
        };
        let err = AccessLog::start(&config).err().expect("refused");
        assert!(
            err.to_string().contains("/nonexistent-dir/x/access.log"),
            "{err}"
        );
    }
}
