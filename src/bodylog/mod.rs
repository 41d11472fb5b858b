//! Body logging: every proxied request's request and raw response body,
//! sent asynchronously as length-prefixed frames to a listener, and the
//! listener itself (`llm-gateway bodylog-listen`).
//!
//! - `frame`    the wire format and the size caps (pure)
//! - `capture`  one request's capture buffer and its frame (pure)
//! - `sender`   the background task that writes frames to the listener
//! - `listen`, `record`, `export`  the listener: frames → hourly JSONL
//!   files and Prometheus metrics
//!
//! The request path only ever calls [`Bodylog::sample`] and
//! [`Bodylog::enqueue`]: neither waits, and a full queue drops the frame
//! (counted). With no listener configured there is no `Bodylog` at all.

pub mod capture;
pub mod export;
pub mod frame;
pub mod listen;
pub mod record;
pub mod redact;
pub mod sender;

use crate::config::BodylogConfig;
use crate::registry::Toggle;
use frame::Frame;
use parking_lot::Mutex;
use prometheus::IntCounter;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use tokio::sync::mpsc;

/// The sender's connection, as `/_bodylog_status` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum LinkState {
    Connecting = 0,
    Connected = 1,
    /// The last connect or write failed; waiting before the next attempt.
    Backoff = 2,
}

impl LinkState {
    pub fn as_str(self) -> &'static str {
        match self {
            LinkState::Connecting => "connecting",
            LinkState::Connected => "connected",
            LinkState::Backoff => "backoff",
        }
    }

    fn from_u8(v: u8) -> Self {
        match v {
            1 => LinkState::Connected,
            2 => LinkState::Backoff,
            _ => LinkState::Connecting,
        }
    }
}

/// How frames ended: written to the listener, dropped before (queue full),
/// or lost to a failed write.
pub struct FrameCounters {
    pub sent: IntCounter,
    pub dropped: IntCounter,
    pub error: IntCounter,
}

/// The gateway's body-log state: configuration, runtime toggles, queue and
/// counters. One per process, created by `server::run` when a listener is
/// configured; the proxy holds it (endpoints, capture) and the sender
/// service drains its queue. Not part of the route registry: a reload
/// leaves it, and its toggles, as they are.
pub struct Bodylog {
    pub config: BodylogConfig,
    on: Toggle,
    /// Runtime override of the sampling percentage; `PCT_UNSET` = config.
    pct: AtomicU8,
    tick: AtomicU64,
    tx: mpsc::Sender<Queued>,
    rx: Mutex<Option<mpsc::Receiver<Queued>>>,
    queued_frames: AtomicUsize,
    queued_bytes: AtomicU64,
    state: AtomicU8,
    last_error: Mutex<Option<String>>,
    pub counters: FrameCounters,
    next_id: AtomicU64,
    id_seed: u64,
}

const PCT_UNSET: u8 = u8::MAX;

/// A frame in the queue. Holding it keeps the process from exiting before
/// it was written (for a bounded time, see `lifecycle::wait_for_output`).
pub struct Queued {
    pub frame: Frame,
    _pending: crate::lifecycle::PendingOutput,
}

impl Bodylog {
    /// Counting into `llm_gateway_bodylog_frames_total`.
    pub fn new(config: BodylogConfig) -> Self {
        let frames = &crate::metrics::metrics().bodylog_frames;
        let counters = FrameCounters {
            sent: frames.with_label_values(&["sent"]),
            dropped: frames.with_label_values(&["dropped"]),
            error: frames.with_label_values(&["error"]),
        };
        Self::with_counters(config, counters)
    }

    pub fn with_counters(config: BodylogConfig, counters: FrameCounters) -> Self {
        let (tx, rx) = mpsc::channel(config.queue_frames);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        Bodylog {
            config,
            on: Toggle::default(),
            pct: AtomicU8::new(PCT_UNSET),
            tick: AtomicU64::new(0),
            tx,
            rx: Mutex::new(Some(rx)),
            queued_frames: AtomicUsize::new(0),
            queued_bytes: AtomicU64::new(0),
            state: AtomicU8::new(LinkState::Connecting as u8),
            last_error: Mutex::new(None),
            counters,
            next_id: AtomicU64::new(0),
            // Request ids from different processes should not collide.
            id_seed: crate::hash::mix64(nanos, std::process::id() as u64),
        }
    }

    /// The sampling percentage in force and where it comes from.
    pub fn pct(&self) -> (u8, &'static str) {
        match self.pct.load(Ordering::Relaxed) {
            PCT_UNSET => (self.config.sample_pct, "config"),
            p => (p, "runtime"),
        }
    }

    /// Whether this request is captured. Spreads a percentage evenly over
    /// consecutive requests rather than by chance, so 10 % of 100 requests
    /// is 10 requests.
    pub fn sample(&self) -> bool {
        if !self.on.is_on(true) {
            return false;
        }
        let (pct, _) = self.pct();
        match pct {
            0 => false,
            100.. => true,
            _ => sampled(self.tick.fetch_add(1, Ordering::Relaxed), pct),
        }
    }

    /// A fresh request id (only logged requests need one).
    pub fn request_id(&self) -> u64 {
        crate::hash::mix64(self.id_seed, self.next_id.fetch_add(1, Ordering::Relaxed))
    }

    /// Hands a frame to the sender without waiting; a full queue (by frame
    /// count or bytes) drops it.
    pub fn enqueue(&self, frame: Frame) {
        let size = frame.wire_len() as u64;
        let before = self.queued_bytes.fetch_add(size, Ordering::AcqRel);
        if before + size > self.config.queue_bytes {
            self.queued_bytes.fetch_sub(size, Ordering::AcqRel);
            self.counters.dropped.inc();
            return;
        }
        self.queued_frames.fetch_add(1, Ordering::AcqRel);
        let queued = Queued {
            frame,
            _pending: crate::lifecycle::PendingOutput::new(),
        };
        if self.tx.try_send(queued).is_err() {
            self.dequeued(size);
            self.counters.dropped.inc();
        }
    }

    /// The sender took a frame of `size` bytes off the queue and is done with it.
    fn dequeued(&self, size: u64) {
        self.queued_bytes.fetch_sub(size, Ordering::AcqRel);
        self.queued_frames.fetch_sub(1, Ordering::AcqRel);
    }

    /// Frames queued or being written.
    pub fn pending(&self) -> usize {
        self.queued_frames.load(Ordering::Acquire)
    }

    pub fn state(&self) -> LinkState {
        LinkState::from_u8(self.state.load(Ordering::Relaxed))
    }

    fn set_state(&self, state: LinkState, error: Option<String>) {
        self.state.store(state as u8, Ordering::Relaxed);
        if let Some(e) = error {
            *self.last_error.lock() = Some(e);
        }
    }

    /// The receiving end of the queue, once (for the sender service).
    fn take_receiver(&self) -> Option<mpsc::Receiver<Queued>> {
        self.rx.lock().take()
    }

    /// `/_bodylog_status`.
    pub fn status_json(&self) -> Value {
        let (on, on_source) = self.on.effective(true);
        let (pct, pct_source) = self.pct();
        json!({
            "configured": true,
            "target": self.config.target.to_string(),
            "state": self.state().as_str(),
            "last_error": *self.last_error.lock(),
            "enabled": {"on": on, "source": on_source},
            "sample_pct": {"value": pct, "source": pct_source, "configured": self.config.sample_pct},
            "queue": {
                "frames": self.pending(),
                "bytes": self.queued_bytes.load(Ordering::Relaxed),
                "max_frames": self.config.queue_frames,
                "max_bytes": self.config.queue_bytes,
            },
            "frames": {
                "sent": self.counters.sent.get(),
                "dropped": self.counters.dropped.get(),
                "error": self.counters.error.get(),
            },
        })
    }

    /// `/_bodylog_toggle?on=0|1&pct=N` (either or both) or `?reset=1`
    /// (back to gateway.yaml's values). The caller checked loopback.
    pub fn apply_toggle(&self, query: &str) -> Result<Value, String> {
        let param = |key: &str| crate::query::param(query, key);
        let on = match param("on").as_deref() {
            None => None,
            Some("1") => Some(true),
            Some("0") => Some(false),
            Some(v) => return Err(format!("on={v:?}: use on=0 or on=1")),
        };
        let pct = match param("pct").as_deref() {
            None => None,
            Some(v) => match v.parse::<u8>() {
                Ok(p) if p <= 100 => Some(p),
                _ => return Err(format!("pct={v:?}: use a whole percentage 0-100")),
            },
        };
        let reset = param("reset").as_deref() == Some("1");
        if on.is_none() && pct.is_none() && !reset {
            return Err("use ?on=0|1, ?pct=N (0-100), both, or ?reset=1".into());
        }
        if reset {
            self.on.reset();
            self.pct.store(PCT_UNSET, Ordering::Relaxed);
        }
        if let Some(on) = on {
            self.on.set(on);
        }
        if let Some(p) = pct {
            self.pct.store(p, Ordering::Relaxed);
        }
        Ok(self.status_json())
    }
}

/// `/_bodylog_status` when no listener is configured.
pub fn status_off() -> Value {
    json!({
        "configured": false,
        "target": null,
        "state": "off",
        "hint": format!("set bodylog.listener in gateway.yaml or {}", crate::config::BODYLOG_ENV),
    })
}

/// Whether the `n`-th request of a run is among the `pct` percent taken:
/// exactly `pct` of any 100 consecutive requests, spread out.
pub fn sampled(n: u64, pct: u8) -> bool {
    let pct = u64::from(pct.min(100));
    (n % 100 + 1) * pct / 100 != (n % 100) * pct / 100
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::config::BodylogTarget;
    use bytes::Bytes;

    /// Its own counters, so that tests running at once do not mix counts.
    pub(crate) fn bodylog_to(target: &str, queue_frames: usize, queue_bytes: u64) -> Bodylog {
        let counter = |n: &str| IntCounter::new(n, n).unwrap();
        let counters = FrameCounters {
            sent: counter("sent"),
            dropped: counter("dropped"),
            error: counter("error"),
        };
        let config = BodylogConfig {
            target: BodylogTarget::parse(target).unwrap(),
            queue_frames,
            queue_bytes,
            sample_pct: 100,
        };
        Bodylog::with_counters(config, counters)
    }

    fn bodylog(queue_frames: usize, queue_bytes: u64) -> Bodylog {
        bodylog_to("127.0.0.1:1", queue_frames, queue_bytes)
    }

    #[test]
    fn sampling_takes_exactly_pct_of_every_hundred_spread_out() {
        for pct in [0u8, 1, 10, 33, 50, 99, 100] {
            for start in [0u64, 7, 1000] {
                let taken = (start..start + 100).filter(|&n| sampled(n, pct)).count();
                assert_eq!(taken, pct as usize, "pct {pct} from {start}");
            }
        }
        // 50 % alternates rather than taking a block of 50.
        let first: Vec<bool> = (0..4).map(|n| sampled(n, 50)).collect();
        assert_eq!(first, [false, true, false, true]);
    }

    #[test]
    fn toggles_switch_sampling_and_reset_to_config() {
        let b = bodylog(4, 1 << 20);
        assert!(b.sample());
        b.apply_toggle("pct=0").unwrap();
        assert!(!(0..10).any(|_| b.sample()));
        assert_eq!(b.pct(), (0, "runtime"));
        b.apply_toggle("on=0&pct=100").unwrap();
        assert!(!b.sample(), "off wins over pct");
        b.apply_toggle("reset=1").unwrap();
        assert!(b.sample());
        assert_eq!(b.pct(), (100, "config"));
        for bad in ["", "pct=101", "pct=x", "on=2"] {
            assert!(b.apply_toggle(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_full_queue_drops_and_counts_without_waiting() {
        let frame = || Frame::new(b"{}".to_vec(), Bytes::new(), Bytes::from(vec![0u8; 1000]));
        let b = bodylog(2, 1 << 20);
        for _ in 0..5 {
            b.enqueue(frame());
        }
        assert_eq!(b.pending(), 2);
        assert_eq!(b.counters.dropped.get(), 3);
        // The byte budget drops too, with room left in frames.
        let small = bodylog(100, 1 << 20);
        let big = Frame::new(
            b"{}".to_vec(),
            Bytes::from(vec![0u8; 600 << 10]),
            Bytes::new(),
        );
        small.enqueue(big.clone());
        small.enqueue(big);
        assert_eq!(small.pending(), 1);
        assert_eq!(small.counters.dropped.get(), 1);
    }
}
