//! What a running engine shares with its handle: the failure switches
//! tests set, and the counters and requests it records.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU16, AtomicU32, AtomicU64};

/// Failure switches, readable by the engine on every request and settable
/// from tests at any time.
#[derive(Debug, Default)]
pub struct Faults {
    /// The next N completion requests answer 500 with a JSON error body.
    pub fail_next: AtomicU32,
    /// Completion requests are read but not answered while this is set.
    pub stall: AtomicBool,
    /// `GET /health` answers 503 (`/v1/models` keeps working).
    pub health_down: AtomicBool,
    /// If non-zero, `GET /health` answers this status (takes precedence over `health_down`).
    pub health_status: AtomicU16,
    /// If non-zero, `GET /health` answers only after this many milliseconds:
    /// an engine too busy to answer its probe in time.
    pub health_delay_ms: AtomicU64,
    /// If non-zero, a stream sends this many content frames and then closes
    /// the connection without the terminating chunk or `[DONE]`.
    pub die_after_frames: AtomicU32,
}

/// How many requests [`EngineStats::recorded`] keeps.
pub const RECORDED_LIMIT: usize = 256;

#[derive(Debug, Default)]
pub struct EngineStats {
    /// Completion requests received, including failed, echoed and invalid ones.
    pub requests: AtomicU64,
    /// Completion requests currently being handled (queued, running or stalled).
    pub in_flight: AtomicI64,
    /// Requests in arrival order, the last [`RECORDED_LIMIT`] of them. The
    /// gateway's own probe traffic (`GET /health`, `GET /metrics`) is not
    /// recorded so that it cannot push the interesting requests out.
    pub recorded: parking_lot::Mutex<Vec<RecordedRequest>>,
    /// Health checks received at the engine's `health_path`, answered or
    /// not yet (a delayed one counts when it arrives).
    pub health_checks: AtomicU64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedRequest {
    pub method: String,
    /// The request target as received, query string included.
    pub path: String,
    /// Header names keep the case they were sent with.
    pub headers: Vec<(String, String)>,
    /// The body after removing any chunked transfer coding.
    pub body: Vec<u8>,
}

impl RecordedRequest {
    /// First value of a header, matched case-insensitively.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}
