//! The `llamacpp` profile: llama-server with `--parallel N`. Each slot has
//! its own KV of `kv_capacity_tokens / N` tokens (`n_ctx_slot`) and keeps
//! the last conversation it served; a request reuses the common prefix of
//! the slot it lands on. There is no shared pool and no capacity to report:
//! a gateway only sees which slot it hit by the cached tokens.
//!
//! Slot choice, as llama-server's `get_available_slot`: the idle slot whose
//! cache shares the longest common prefix with the prompt, if that prefix is
//! more than `SLOT_PROMPT_SIMILARITY` of the prompt; else the idle slot used
//! least recently. With every slot busy the request is deferred, FIFO.
//! Timing is the `slots` profile's: prefill of the uncached tail, then one
//! token per `decode_ms_per_token`.

use std::io;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use serde_json::{json, Value};
use tokio::io::AsyncWrite;
use tokio::sync::{Semaphore, SemaphorePermit};
use tokio::time::{sleep, sleep_until, Instant};

use super::{conversation, kv, Gauge, Generated, Plan, Shared};
use crate::http::StreamFraming;
use crate::EngineConfig;

/// llama-server's `--slot-prompt-similarity` default.
pub(crate) const SLOT_PROMPT_SIMILARITY: f64 = 0.5;

/// llama-server's answer to a prompt longer than its slot's context.
pub(crate) const EXCEEDS_CONTEXT: &str = r#"{"error":{"code":400,"message":"the request exceeds the available context size, try increasing it","type":"exceed_context_size_error"}}"#;

#[derive(Debug, Default, Clone)]
pub(crate) struct Slot {
    busy: bool,
    /// The bytes of the last conversation this slot computed.
    cache: Vec<u8>,
    last_used: u64,
}

/// The slot a prompt goes to and the tokens it reuses there; None if every
/// slot is busy.
pub(crate) fn choose(slots: &[Slot], prompt: &[u8]) -> Option<(usize, usize)> {
    let prompt_tokens = kv::token_count(prompt);
    let lcp_tokens = |s: &Slot| common_prefix(&s.cache, prompt) / kv::BYTES_PER_TOKEN;
    let idle = || slots.iter().enumerate().filter(|(_, s)| !s.busy);
    let similar = idle()
        .map(|(i, s)| (i, lcp_tokens(s)))
        .filter(|&(_, lcp)| lcp as f64 / prompt_tokens as f64 > SLOT_PROMPT_SIMILARITY)
        .max_by_key(|&(i, lcp)| (lcp, std::cmp::Reverse(i)));
    let (slot, lcp) = similar.or_else(|| {
        idle()
            .min_by_key(|(_, s)| s.last_used)
            .map(|(i, s)| (i, lcp_tokens(s)))
    })?;
    // The last prompt token is always computed: its logits give the first
    // output token.
    Some((slot, lcp.min(prompt_tokens - 1)))
}

fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

pub(crate) struct Slots {
    /// One permit per slot; tokio's semaphore is FIFO, which is the
    /// deferred queue.
    permits: Semaphore,
    slots: Mutex<(Vec<Slot>, u64)>,
    n_ctx_slot: usize,
    processing: AtomicUsize,
    deferred: AtomicUsize,
    /// Prompt tokens computed (the uncached ones) and the time they took.
    prompt_tokens: AtomicU64,
    prompt_us: AtomicU64,
    predicted_tokens: AtomicU64,
    predicted_us: AtomicU64,
    /// Prompt tokens asked for and those a slot's cache had (for the
    /// simulator's own counters; llama-server publishes no hit count).
    queried_tokens: AtomicU64,
    cached_tokens: AtomicU64,
    /// Calls to `llama_decode`: one per prefill and one per token here.
    n_decode: AtomicU64,
}

impl Slots {
    pub fn new(cfg: &EngineConfig) -> Self {
        let n = cfg.max_running.max(1);
        Slots {
            permits: Semaphore::new(n),
            slots: Mutex::new((vec![Slot::default(); n], 0)),
            n_ctx_slot: cfg.kv_capacity_tokens / n,
            processing: AtomicUsize::new(0),
            deferred: AtomicUsize::new(0),
            prompt_tokens: AtomicU64::new(0),
            prompt_us: AtomicU64::new(0),
            predicted_tokens: AtomicU64::new(0),
            predicted_us: AtomicU64::new(0),
            queried_tokens: AtomicU64::new(0),
            cached_tokens: AtomicU64::new(0),
            n_decode: AtomicU64::new(0),
        }
    }

    /// (tokens generated, prompt tokens asked for, prompt tokens cached).
    pub fn cache_counters(&self) -> (u64, u64, u64) {
        let n = |a: &AtomicU64| a.load(Ordering::SeqCst);
        (
            n(&self.predicted_tokens),
            n(&self.queried_tokens),
            n(&self.cached_tokens),
        )
    }

    pub fn n_ctx_slot(&self) -> usize {
        self.n_ctx_slot
    }

    pub fn total_slots(&self) -> usize {
        self.slots.lock().0.len()
    }

    /// `/metrics`: (name, type, help, value), llama-server's names.
    pub fn series(&self) -> Vec<(&'static str, &'static str, &'static str, f64)> {
        let n = |a: &AtomicU64| a.load(Ordering::SeqCst) as f64;
        let rate = |tokens: &AtomicU64, us: &AtomicU64| {
            let us = n(us);
            if us > 0.0 {
                n(tokens) / us * 1e6
            } else {
                0.0
            }
        };
        vec![
            (
                "llamacpp:prompt_tokens_total",
                "counter",
                "Number of prompt tokens processed.",
                n(&self.prompt_tokens),
            ),
            (
                "llamacpp:prompt_seconds_total",
                "counter",
                "Prompt process time",
                n(&self.prompt_us) / 1e6,
            ),
            (
                "llamacpp:tokens_predicted_total",
                "counter",
                "Number of generation tokens processed.",
                n(&self.predicted_tokens),
            ),
            (
                "llamacpp:tokens_predicted_seconds_total",
                "counter",
                "Predict process time",
                n(&self.predicted_us) / 1e6,
            ),
            (
                "llamacpp:n_decode_total",
                "counter",
                "Total number of llama_decode() calls",
                n(&self.n_decode),
            ),
            (
                "llamacpp:prompt_tokens_seconds",
                "gauge",
                "Average prompt throughput in tokens/s.",
                rate(&self.prompt_tokens, &self.prompt_us),
            ),
            (
                "llamacpp:predicted_tokens_seconds",
                "gauge",
                "Average generation throughput in tokens/s.",
                rate(&self.predicted_tokens, &self.predicted_us),
            ),
            (
                "llamacpp:requests_processing",
                "gauge",
                "Number of requests processing.",
                self.processing.load(Ordering::SeqCst) as f64,
            ),
            (
                "llamacpp:requests_deferred",
                "gauge",
                "Number of requests deferred.",
                self.deferred.load(Ordering::SeqCst) as f64,
            ),
        ]
    }
}

/// A slot in use; dropping it (finished, client gone, shutdown) makes it
/// idle and hands its permit to the first deferred request.
struct Taken<'a> {
    slots: &'a Slots,
    index: usize,
    // Field order is drop order: the gauge goes down before the permit is
    // handed on, so `requests_processing` never reads above the slot count.
    _processing: Gauge<'a>,
    _permit: SemaphorePermit<'a>,
}

impl Taken<'_> {
    fn keep(&self, cache: Vec<u8>) {
        if let Some(s) = self.slots.slots.lock().0.get_mut(self.index) {
            s.cache = cache;
        }
    }
}

impl Drop for Taken<'_> {
    fn drop(&mut self) {
        let mut guard = self.slots.slots.lock();
        let (slots, tick) = &mut *guard;
        *tick += 1;
        if let Some(s) = slots.get_mut(self.index) {
            s.busy = false;
            s.last_used = *tick;
        }
    }
}

impl Shared {
    pub(super) async fn generate_llama<W: AsyncWrite + Unpin>(
        &self,
        plan: &Plan,
        wr: &mut W,
        framing: Option<StreamFraming>,
    ) -> io::Result<Generated> {
        let llama = self
            .llama
            .as_ref()
            .ok_or_else(|| io::Error::other("no slots"))?;
        let permit = {
            let _deferred = Gauge::enter(&llama.deferred);
            llama
                .permits
                .acquire()
                .await
                .map_err(|_| io::Error::other("slots closed"))?
        };
        let (index, cached_tokens) = {
            let mut guard = llama.slots.lock();
            let (slots, tick) = &mut *guard;
            let (index, cached) = choose(slots, &plan.prompt)
                .ok_or_else(|| io::Error::other("a permit without an idle slot"))?;
            *tick += 1;
            slots[index].busy = true;
            slots[index].last_used = *tick;
            (index, cached)
        };
        let taken = Taken {
            slots: llama,
            index,
            _processing: Gauge::enter(&llama.processing),
            _permit: permit,
        };
        let uncached = (plan.prompt_tokens - cached_tokens) as u64;
        let prefill = Duration::from_micros(uncached.saturating_mul(self.cfg.prefill_us_per_token));
        sleep(prefill + plan.extra_ttft).await;
        llama.prompt_tokens.fetch_add(uncached, Ordering::Relaxed);
        llama
            .queried_tokens
            .fetch_add(plan.prompt_tokens as u64, Ordering::Relaxed);
        llama
            .cached_tokens
            .fetch_add(cached_tokens as u64, Ordering::Relaxed);
        llama
            .prompt_us
            .fetch_add(prefill.as_micros() as u64, Ordering::Relaxed);
        llama.n_decode.fetch_add(1, Ordering::Relaxed);
        taken.keep(plan.prompt.clone());

        let mut next = Instant::now();
        for index in 0..plan.max_tokens {
            if index > 0 && !plan.frame_delay.is_zero() {
                next += plan.frame_delay;
                sleep_until(next).await;
                llama
                    .predicted_us
                    .fetch_add(plan.frame_delay.as_micros() as u64, Ordering::Relaxed);
                llama.n_decode.fetch_add(1, Ordering::Relaxed);
            }
            llama.predicted_tokens.fetch_add(1, Ordering::Relaxed);
            if !self.emit(plan, wr, framing, index, cached_tokens).await? {
                return Ok(Generated::Died);
            }
            if index == 0 && plan.gate.is_some() {
                next = Instant::now();
            }
        }
        taken.keep(conversation(plan));
        // Freed before the client sees the end, as the other profiles do.
        drop(taken);
        Ok(Generated::Done { cached_tokens })
    }

    /// llama-server's `/health`: `{"status":"ok"}`, or its 503 while
    /// (here: as if) loading the model.
    pub(super) fn llama_health(&self) -> (u16, String) {
        match self.health_status() {
            200 => (200, json!({"status": "ok"}).to_string()),
            status => (
                status,
                json!({"error": {"code": status, "message": "Loading model", "type": "unavailable_error"}})
                    .to_string(),
            ),
        }
    }

    /// llama-server's `/props`, the parts a router reads.
    pub(super) fn llama_props(&self) -> Option<Value> {
        let llama = self.llama.as_ref()?;
        Some(json!({
            "default_generation_settings": {
                "id": 0,
                "id_task": -1,
                "n_ctx": llama.n_ctx_slot(),
                "speculative": false,
                "is_processing": false,
                "params": {
                    "n_predict": -1,
                    "temperature": 0.8,
                    "top_k": 40,
                    "top_p": 0.95,
                    "min_p": 0.05,
                    "stream": true,
                    "cache_prompt": true,
                },
            },
            "total_slots": llama.total_slots(),
            "model_path": self.cfg.name,
            "chat_template": "",
            "build_info": "llm-gateway-sim",
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(cache: &str, last_used: u64, busy: bool) -> Slot {
        Slot {
            busy,
            cache: cache.as_bytes().to_vec(),
            last_used,
        }
    }

    /// 4-byte tokens: "aaaa" is one token.
    const CONV: &str = "aaaabbbbccccdddd";

    #[test]
    fn the_slot_with_the_longest_common_prefix_wins() {
        let slots = [
            slot("aaaabbbbxxxx", 1, false),
            slot(CONV, 2, false),
            slot("", 0, false),
        ];
        let prompt = format!("{CONV}eeee");
        assert_eq!(choose(&slots, prompt.as_bytes()), Some((1, 4)));
        // A fully cached prompt still computes its last token.
        assert_eq!(choose(&slots, CONV.as_bytes()), Some((1, 3)));
    }

    #[test]
    fn a_short_common_prefix_falls_back_to_the_least_recently_used() {
        // 1 token of 5 in common with slot 0: not similar enough; slot 2 is
        // the oldest idle one (slot 1 is older but busy).
        let slots = [
            slot("aaaaxxxx", 5, false),
            slot("", 1, true),
            slot("zzzz", 2, false),
        ];
        assert_eq!(choose(&slots, b"aaaabbbbccccddddeeee"), Some((2, 0)));
        // Control: 3 tokens of 5 in common is similar enough.
        let slots = [slot("aaaabbbbcccc", 5, false), slot("zzzz", 2, false)];
        assert_eq!(choose(&slots, b"aaaabbbbccccddddeeee"), Some((0, 3)));
    }

    #[test]
    fn no_idle_slot_defers() {
        let slots = [slot(CONV, 1, true), slot("", 0, true)];
        assert_eq!(choose(&slots, CONV.as_bytes()), None);
        // Control: one idle slot takes it.
        let slots = [slot(CONV, 1, true), slot("", 0, false)];
        assert_eq!(choose(&slots, CONV.as_bytes()), Some((1, 0)));
    }
}
