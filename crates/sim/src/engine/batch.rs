//! The batch profiles' driver: one task per engine steps the scheduler
//! (`scheduler.rs`) in real time, sleeping each step's duration and then
//! handing each request's new token to its connection task, which writes
//! the frames as every profile does.

use std::time::Duration;

use ahash::AHashMap;
use parking_lot::Mutex;
use tokio::sync::{mpsc, Notify};
use tokio::time::{sleep_until, Instant};

use super::scheduler::{Counters, NewRequest, ReqId, Scheduler, SchedulerConfig, Token};

use crate::config::EngineConfig;

pub(crate) struct Batch {
    state: Mutex<State>,
    /// Wakes the idle driver when a request arrives.
    wake: Notify,
}

struct State {
    sched: Scheduler,
    /// Where each request's tokens go; gone once its client is.
    senders: AHashMap<ReqId, mpsc::UnboundedSender<Token>>,
}

/// What `/metrics` reads, in one lock.
pub(crate) struct Snapshot {
    pub running: usize,
    pub waiting: usize,
    pub kv_usage: f64,
    pub counters: Counters,
    pub num_blocks: usize,
    pub block_tokens: usize,
}

impl Batch {
    pub fn new(cfg: &EngineConfig) -> Self {
        let block_tokens = cfg.block_tokens.max(1);
        let sched = Scheduler::new(SchedulerConfig {
            max_num_seqs: cfg.max_num_seqs,
            max_num_batched_tokens: cfg.max_num_batched_tokens,
            block_tokens,
            // vLLM allocates whole blocks: the remainder is not KV.
            num_blocks: cfg.kv_capacity_tokens / block_tokens,
            cost: cfg.step_cost,
        });
        Batch {
            state: Mutex::new(State {
                sched,
                senders: AHashMap::new(),
            }),
            wake: Notify::new(),
        }
    }

    pub fn max_model_len(&self) -> usize {
        self.state.lock().sched.max_model_len()
    }

    pub fn snapshot(&self) -> Snapshot {
        let st = self.state.lock();
        let cfg = st.sched.config();
        Snapshot {
            running: st.sched.running(),
            waiting: st.sched.waiting(),
            kv_usage: st.sched.kv_usage(),
            counters: st.sched.counters(),
            num_blocks: cfg.num_blocks,
            block_tokens: cfg.block_tokens,
        }
    }

    pub(super) fn submit(
        &self,
        req: NewRequest,
    ) -> Result<(ReqId, mpsc::UnboundedReceiver<Token>), usize> {
        let (tx, rx) = mpsc::unbounded_channel();
        let id = {
            let mut st = self.state.lock();
            let id = st.sched.add(req)?;
            st.senders.insert(id, tx);
            id
        };
        self.wake.notify_one();
        Ok((id, rx))
    }

    pub(super) fn abort(&self, id: ReqId) {
        let mut st = self.state.lock();
        st.sched.abort(id);
        st.senders.remove(&id);
    }

    /// Steps back to back while there is work, each ending at its deadline
    /// (so the time spent delivering does not stretch the next), and sleeps
    /// while there is none.
    pub(super) async fn run(&self) {
        let mut next = Instant::now();
        loop {
            let notified = self.wake.notified();
            tokio::pin!(notified);
            // Registered before the check, so a submit in between still wakes us.
            notified.as_mut().enable();
            let step = {
                let mut st = self.state.lock();
                (!st.sched.is_idle()).then(|| st.sched.step())
            };
            let Some(step) = step else {
                notified.await;
                next = Instant::now();
                continue;
            };
            if step.duration_us > 0.0 {
                next += Duration::from_secs_f64(step.duration_us / 1e6);
                sleep_until(next).await;
            } else {
                // A step that scheduled nothing (it only preempted): let the
                // connection tasks run before the next.
                tokio::task::yield_now().await;
                next = Instant::now();
            }
            let mut st = self.state.lock();
            for t in step.emitted {
                if let Some(tx) = st.senders.get(&t.id) {
                    // A receiver gone is a client gone; its abort follows.
                    let _ = tx.send(t);
                }
                if t.last {
                    st.senders.remove(&t.id);
                }
            }
        }
    }
}
