//! The engine proper: the state its connections share ([`Shared`]: the
//! running slots, the KV, the profile's scheduler, the counters) and the
//! guards that count a sequence in it. `conn.rs` accepts connections and
//! reads their requests, `respond.rs` answers each, `plan.rs` is a
//! completion request as the token loop sees it, and `generate.rs` makes
//! its tokens in each profile (`batch.rs` and `scheduler.rs` the batch
//! profiles', `llamacpp.rs` the llama-server slots).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use ahash::AHashMap;
use parking_lot::Mutex;
use tokio::net::TcpListener;
use tokio::sync::{watch, Notify, Semaphore, SemaphorePermit};

use super::kv::{KvPool, SeqKv};
use crate::config::{EngineConfig, Profile};
use crate::stats::{EngineStats, Faults};

mod apis;
mod batch;
pub(crate) mod conn;
mod generate;
pub(crate) mod llamacpp;
mod metrics;
mod plan;
mod respond;
pub(crate) mod scheduler;
use apis::ResponseStore;

const JSON: &str = "application/json";

pub(crate) struct Shared {
    pub cfg: EngineConfig,
    addr: SocketAddr,
    faults: Arc<Faults>,
    stats: Arc<EngineStats>,
    /// Taken out and dropped by `shutdown`, which closes the port before
    /// `shutdown` returns instead of whenever the accept task next runs.
    listener: Mutex<Option<TcpListener>>,
    stop: watch::Sender<bool>,
    /// Running slots; tokio's semaphore is FIFO, which is the waiting queue.
    slots: Semaphore,
    kv: Mutex<KvPool>,
    running: AtomicUsize,
    waiting: AtomicUsize,
    /// Sequences in their prefill phase (they slow everyone's decode).
    prefilling: AtomicUsize,
    gates: Mutex<AHashMap<String, Arc<Gate>>>,
    /// The Responses API's stored turns, for `previous_response_id`.
    responses: Mutex<ResponseStore>,
    next_id: AtomicU64,
    prompt_tokens_total: AtomicU64,
    generation_tokens_total: AtomicU64,
    prefix_cache_queries_total: AtomicU64,
    prefix_cache_hits_total: AtomicU64,
    /// The batch profiles' scheduler and its driver's state.
    batch: Option<batch::Batch>,
    /// The `llamacpp` profile's slots.
    llama: Option<llamacpp::Slots>,
}

#[derive(Default)]
struct Gate {
    open: AtomicBool,
    notify: Notify,
}

impl Shared {
    pub fn new(
        mut cfg: EngineConfig,
        addr: SocketAddr,
        listener: TcpListener,
        faults: Arc<Faults>,
        stats: Arc<EngineStats>,
    ) -> Self {
        // Zeros here would deadlock the queue or divide by zero; a zero-length
        // default completion would have no frame to carry finish_reason.
        cfg.max_running = cfg.max_running.max(1);
        cfg.block_tokens = cfg.block_tokens.max(1);
        cfg.default_max_tokens = cfg.default_max_tokens.max(1);
        let batch = cfg.profile.batched().then(|| batch::Batch::new(&cfg));
        let llama = (cfg.profile == Profile::Llamacpp).then(|| llamacpp::Slots::new(&cfg));
        Shared {
            batch,
            llama,
            addr,
            faults,
            stats,
            listener: Mutex::new(Some(listener)),
            stop: watch::Sender::new(false),
            slots: Semaphore::new(cfg.max_running),
            kv: Mutex::new(KvPool::new(cfg.kv_capacity_tokens, cfg.block_tokens)),
            running: AtomicUsize::new(0),
            waiting: AtomicUsize::new(0),
            prefilling: AtomicUsize::new(0),
            gates: Mutex::new(AHashMap::new()),
            responses: Mutex::new(ResponseStore::default()),
            next_id: AtomicU64::new(1),
            prompt_tokens_total: AtomicU64::new(0),
            generation_tokens_total: AtomicU64::new(0),
            prefix_cache_queries_total: AtomicU64::new(0),
            prefix_cache_hits_total: AtomicU64::new(0),
            cfg,
        }
    }

    pub fn shutdown(&self) {
        drop(self.listener.lock().take());
        self.stop.send_replace(true);
    }

    fn gate(&self, name: &str) -> Arc<Gate> {
        self.gates
            .lock()
            .entry(name.to_string())
            .or_default()
            .clone()
    }

    pub fn open_gate(&self, name: &str) {
        let gate = self.gate(name);
        gate.open.store(true, Ordering::SeqCst);
        gate.notify.notify_waiters();
    }

    async fn wait_gate(&self, name: &str) {
        let gate = self.gate(name);
        loop {
            // Registered before the check, so an open_gate in between still wakes us.
            let notified = gate.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if gate.open.load(Ordering::SeqCst) {
                return;
            }
            notified.await;
        }
    }
}

/// Resolves once `shutdown` has been called.
async fn stopped(rx: &mut watch::Receiver<bool>) {
    loop {
        if *rx.borrow_and_update() {
            return;
        }
        if rx.changed().await.is_err() {
            // The sender lives in `Shared`, which outlives this task.
            std::future::pending::<()>().await;
        }
    }
}

/// Increments a gauge for as long as it lives.
struct Gauge<'a>(&'a AtomicUsize);

impl<'a> Gauge<'a> {
    fn enter(g: &'a AtomicUsize) -> Self {
        g.fetch_add(1, Ordering::SeqCst);
        Gauge(g)
    }
}

impl Drop for Gauge<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

struct InFlight<'a>(&'a AtomicI64);

impl<'a> InFlight<'a> {
    fn enter(g: &'a AtomicI64) -> Self {
        g.fetch_add(1, Ordering::SeqCst);
        InFlight(g)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A sequence holding a running slot and KV. However it ends (finished,
/// client gone, connection dropped by shutdown) dropping it returns both.
struct Seq<'a> {
    shared: &'a Shared,
    kv: Option<SeqKv>,
    // Field order is drop order: the gauge goes down before the slot is
    // handed to the next waiter, so `running` never reads above max_running.
    _running: Gauge<'a>,
    _slot: SemaphorePermit<'a>,
}

impl Drop for Seq<'_> {
    fn drop(&mut self) {
        if let Some(kv) = self.kv.take() {
            self.shared.kv.lock().release(kv);
        }
    }
}

impl Seq<'_> {
    fn with_kv(&mut self, f: impl FnOnce(&mut KvPool, &mut SeqKv)) {
        if let Some(seq) = self.kv.as_mut() {
            f(&mut self.shared.kv.lock(), seq);
        }
    }
}
