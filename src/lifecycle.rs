//! Process-wide lifecycle state: whether the gateway is draining, how many
//! requests are alive, and how much output (body-log frames) is still on
//! its way out. Written only by the controller (draining), by each
//! request's context (its own count) and by each queued frame; read by
//! `/healthz` and by the drain watcher.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

static DRAINING: AtomicBool = AtomicBool::new(false);
static ACTIVE_REQUESTS: AtomicUsize = AtomicUsize::new(0);
static PENDING_OUTPUT: AtomicUsize = AtomicUsize::new(0);

/// True after SIGTERM: /healthz turns 503 so load balancers stop sending.
pub fn is_draining() -> bool {
    DRAINING.load(Ordering::Relaxed)
}

/// Marks the process as draining; true only for the first caller.
pub fn start_draining() -> bool {
    !DRAINING.swap(true, Ordering::AcqRel)
}

/// Requests between `new_ctx` and the end of `logging` (or cancellation).
pub fn active_requests() -> usize {
    ACTIVE_REQUESTS.load(Ordering::Acquire)
}

/// Counts one request in [`active_requests`] for as long as it lives.
#[derive(Debug)]
pub struct ActiveRequest(());

impl ActiveRequest {
    pub fn new() -> Self {
        ACTIVE_REQUESTS.fetch_add(1, Ordering::AcqRel);
        ActiveRequest(())
    }
}

impl Default for ActiveRequest {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for ActiveRequest {
    fn drop(&mut self) {
        ACTIVE_REQUESTS.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Counts one piece of output (a queued body-log frame) that the process
/// should try to deliver before it exits, for as long as it lives.
#[derive(Debug)]
pub struct PendingOutput(());

impl PendingOutput {
    pub fn new() -> Self {
        PENDING_OUTPUT.fetch_add(1, Ordering::AcqRel);
        PendingOutput(())
    }
}

impl Default for PendingOutput {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for PendingOutput {
    fn drop(&mut self) {
        PENDING_OUTPUT.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Waits until no output is pending, for at most `limit`: the last
/// requests' frames go out before the process exits, and an unreachable
/// listener delays the exit by `limit` at most.
pub fn wait_for_output(limit: Duration) {
    let start = Instant::now();
    while PENDING_OUTPUT.load(Ordering::Acquire) > 0 && start.elapsed() < limit {
        std::thread::sleep(Duration::from_millis(10));
    }
}
