//! Process-wide lifecycle state: whether the gateway is draining, and how
//! many requests are alive. Written only by the controller (draining) and by
//! each request's context (its own count); read by `/healthz` and by the
//! drain watcher.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

static DRAINING: AtomicBool = AtomicBool::new(false);
static ACTIVE_REQUESTS: AtomicUsize = AtomicUsize::new(0);

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
