//! Generating a request's tokens in each profile: `slots` here, the batch
//! profiles through their scheduler's driver (`batch.rs`), `llamacpp`
//! through its slots (`llamacpp.rs`); the context each profile refuses, and
//! each token written with the test controls that hang on it.

use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::io::AsyncWrite;
use tokio::sync::SemaphorePermit;
use tokio::time::{sleep, sleep_until, Instant};

use super::apis::Refusal;
use super::batch::{self, Batch};
use super::llamacpp::{restore_time, Assigned, Slots};
use super::plan::{conversation, Generated, Plan};
use super::scheduler::{NewRequest, ReqId};
use super::{llamacpp, stopped, Gauge, Seq, Shared};
use crate::config::Profile;
use crate::http::{self, StreamFraming};
use crate::kv::{self};

impl Shared {
    /// Queues, prefills and decodes one sequence; with `framing`, each token
    /// is written to `wr` as its own chunk as soon as it exists.
    pub(super) async fn generate<W: AsyncWrite + Unpin>(
        &self,
        plan: &Plan,
        wr: &mut W,
        framing: Option<StreamFraming>,
    ) -> io::Result<Generated> {
        match self.cfg.profile {
            Profile::Slots => {}
            Profile::Vllm | Profile::Sglang => {
                return self.generate_batched(plan, wr, framing).await
            }
            Profile::Llamacpp => return self.generate_llama(plan, wr, framing).await,
        }
        let slot = {
            let _waiting = Gauge::enter(&self.waiting);
            self.slots
                .acquire()
                .await
                .map_err(|_| io::Error::other("scheduler closed"))?
        };
        let mut seq = Seq {
            shared: self,
            kv: None,
            _running: Gauge::enter(&self.running),
            _slot: slot,
        };

        let hashes = kv::block_hashes(&plan.prompt, self.cfg.block_tokens);
        let cached_tokens = {
            let (seq_kv, cached) = self.kv.lock().admit(&hashes, plan.prompt_tokens);
            seq.kv = Some(seq_kv);
            cached
        };
        self.prompt_tokens_total
            .fetch_add(plan.prompt_tokens as u64, Ordering::Relaxed);
        self.prefix_cache_queries_total
            .fetch_add(plan.prompt_tokens as u64, Ordering::Relaxed);
        self.prefix_cache_hits_total
            .fetch_add(cached_tokens as u64, Ordering::Relaxed);
        let uncached = (plan.prompt_tokens - cached_tokens) as u64;
        let prefill = Duration::from_micros(uncached.saturating_mul(self.cfg.prefill_us_per_token))
            + plan.extra_ttft;
        if !prefill.is_zero() || plan.prefill_gate.is_some() {
            let _prefilling = Gauge::enter(&self.prefilling);
            sleep(prefill).await;
            if let Some(gate) = &plan.prefill_gate {
                self.wait_gate(gate).await;
            }
        }
        seq.with_kv(|kv, s| kv.publish_prompt(s, &hashes));

        let die_after = match framing {
            Some(_) => self.faults.die_after_frames.load(Ordering::SeqCst) as usize,
            None => 0,
        };
        // Deadlines rather than fixed sleeps, so per-token overhead does not
        // stretch long streams. The first token comes out of prefill.
        let mut next = Instant::now();
        for index in 0..plan.max_tokens {
            if index > 0 && !plan.frame_delay.is_zero() {
                let prefilling = self.prefilling.load(Ordering::Relaxed) as f64;
                let stretch = 1.0 + self.cfg.prefill_decode_interference.max(0.0) * prefilling;
                next += plan.frame_delay.mul_f64(stretch);
                sleep_until(next).await;
            }
            seq.with_kv(|kv, s| kv.grow(s, 1));
            self.generation_tokens_total.fetch_add(1, Ordering::Relaxed);
            if let Some(framing) = framing {
                let frame = plan.token_frame(index, cached_tokens);
                http::write_stream_chunk(wr, framing, &frame).await?;
                if index + 1 == die_after {
                    return Ok(Generated::Died);
                }
                if let (0, Some(tokens)) = (index, plan.decoy_usage) {
                    http::write_stream_chunk(wr, framing, &plan.decoy_usage_frame(tokens)).await?;
                }
            }
            if index == 0 {
                if let Some(gate) = &plan.gate {
                    self.wait_gate(gate).await;
                    next = Instant::now();
                }
            }
        }
        // Freed before the client sees the end of the response, so its next
        // request finds the slot, KV and cache in their final state.
        drop(seq);
        Ok(Generated::Done { cached_tokens })
    }
}

impl Shared {
    /// Refuses a request longer than the profile's context, in the words of
    /// the engine it imitates: vLLM's `max_model_len` error (the whole KV is
    /// the longest a request may be), llama.cpp's per-slot context. The
    /// `slots` profile refuses nothing.
    pub(super) fn fits(&self, plan: Plan) -> Result<Plan, Refusal> {
        let total = plan.prompt_tokens + plan.max_tokens;
        match self.cfg.profile {
            Profile::Slots => Ok(plan),
            Profile::Vllm | Profile::Sglang => {
                let limit = self
                    .batch
                    .as_ref()
                    .map_or(usize::MAX, batch::Batch::max_model_len);
                if total <= limit {
                    return Ok(plan);
                }
                let message = format!(
                    "This model's maximum context length is {limit} tokens. However, you \
                     requested {total} tokens ({} in the messages, {} in the completion). \
                     Please reduce the length of the messages or completion.",
                    plan.prompt_tokens, plan.max_tokens
                );
                let body = json!({
                    "object": "error",
                    "message": message,
                    "type": "BadRequestError",
                    "param": null,
                    "code": 400,
                });
                Err(Refusal {
                    status: 400,
                    body: body.to_string().into_bytes(),
                })
            }
            Profile::Llamacpp => {
                let n_ctx = self.llama.as_ref().map_or(usize::MAX, |l| l.n_ctx_slot());
                if total <= n_ctx {
                    return Ok(plan);
                }
                Err(Refusal {
                    status: 400,
                    body: llamacpp::EXCEEDS_CONTEXT.as_bytes().to_vec(),
                })
            }
        }
    }

    /// Writes token `index` as its frame (when streaming) with the test
    /// controls that hang on it: the cut of `die_after_frames` (false: the
    /// stream must end here), the decoy usage frame, the gate.
    pub(super) async fn emit<W: AsyncWrite + Unpin>(
        &self,
        plan: &Plan,
        wr: &mut W,
        framing: Option<StreamFraming>,
        index: usize,
        cached_tokens: usize,
    ) -> io::Result<bool> {
        if let Some(framing) = framing {
            let frame = plan.token_frame(index, cached_tokens);
            http::write_stream_chunk(wr, framing, &frame).await?;
            let die_after = self.faults.die_after_frames.load(Ordering::SeqCst) as usize;
            if index + 1 == die_after {
                return Ok(false);
            }
            if let (0, Some(tokens)) = (index, plan.decoy_usage) {
                http::write_stream_chunk(wr, framing, &plan.decoy_usage_frame(tokens)).await?;
            }
        }
        if index == 0 {
            if let Some(gate) = &plan.gate {
                self.wait_gate(gate).await;
            }
        }
        Ok(true)
    }
}

/// The driver task of `shared`'s batch, until the engine shuts down.
pub(crate) async fn drive(shared: Arc<Shared>) {
    let Some(batch) = shared.batch.as_ref() else {
        return;
    };
    let mut stop = shared.stop.subscribe();
    tokio::select! {
        () = batch.run() => {}
        () = stopped(&mut stop) => {}
    }
}

/// Aborts the request in the scheduler however its connection task ends;
/// a finished request is no longer there and this does nothing.
struct Abort<'a> {
    batch: &'a Batch,
    id: ReqId,
}

impl Drop for Abort<'_> {
    fn drop(&mut self) {
        self.batch.abort(self.id);
    }
}

impl Shared {
    /// Queues one request in the batch and writes its tokens as the driver
    /// hands them over.
    pub(super) async fn generate_batched<W: AsyncWrite + Unpin>(
        &self,
        plan: &Plan,
        wr: &mut W,
        framing: Option<StreamFraming>,
    ) -> io::Result<Generated> {
        let batch = self
            .batch
            .as_ref()
            .ok_or_else(|| io::Error::other("no batch scheduler"))?;
        if self.cfg.request_overhead_us > 0 {
            sleep(Duration::from_micros(self.cfg.request_overhead_us)).await;
        }
        // The completion's blocks too: the next turn's prompt repeats it,
        // and vLLM caches every full block, generated or not.
        let hashes = kv::block_hashes(&conversation(plan), self.cfg.block_tokens.max(1));
        let (id, mut tokens) = batch
            .submit(NewRequest {
                prompt_tokens: plan.prompt_tokens,
                max_tokens: plan.max_tokens,
                hashes,
            })
            .map_err(|total| io::Error::other(format!("{total} tokens do not fit the KV")))?;
        let _abort = Abort { batch, id };
        let mut paced = Instant::now();
        while let Some(t) = tokens.recv().await {
            if t.index == 0 && !plan.extra_ttft.is_zero() {
                sleep(plan.extra_ttft).await;
            }
            if plan.paced {
                // Tokens the scheduler made faster wait in the channel.
                if t.index > 0 {
                    paced += plan.frame_delay;
                    sleep_until(paced).await;
                } else {
                    paced = Instant::now();
                }
            }
            if !self
                .emit(plan, wr, framing, t.index, t.cached_tokens)
                .await?
            {
                return Ok(Generated::Died);
            }
            if t.index == 0 && plan.gate.is_some() {
                paced = Instant::now();
            }
            if t.last {
                return Ok(Generated::Done {
                    cached_tokens: t.cached_tokens,
                });
            }
        }
        Err(io::Error::other("the scheduler stopped"))
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
    pub(super) fn keep(&self, cache: Vec<u8>) {
        if let Some(s) = self.slots.pool.lock().slots.get_mut(self.index) {
            s.cache = cache;
        }
    }
}

impl Drop for Taken<'_> {
    fn drop(&mut self) {
        self.slots.pool.lock().release(self.index);
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
        let Assigned {
            slot,
            cached_tokens,
            restored_tokens,
        } = llama
            .pool
            .lock()
            .assign(&plan.prompt)
            .ok_or_else(|| io::Error::other("a permit without an idle slot"))?;
        let taken = Taken {
            slots: llama,
            index: slot,
            _processing: Gauge::enter(&llama.processing),
            _permit: permit,
        };
        let uncached = (plan.prompt_tokens - cached_tokens) as u64;
        let prefill = Duration::from_micros(uncached.saturating_mul(self.cfg.prefill_us_per_token));
        // The restore happens before the prompt is processed; llama-server
        // does not count it as prompt time.
        let restore = restore_time(&self.cfg, restored_tokens);
        sleep(restore + prefill + plan.extra_ttft).await;
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
}
