//! The batch profiles' scheduler (`vllm`, `sglang`): vLLM V1's rules as a
//! pure state machine, with no clock and no tokio, so tests step it in
//! virtual time and `batch.rs` steps it in real time.
//!
//! The rules, as in vLLM V1's `Scheduler.schedule` (FCFS policy):
//! - KV is `num_blocks` blocks of `block_tokens` tokens. A request holds the
//!   blocks its computed tokens fill; it needs a new one when its next token
//!   starts one. Up to `max_num_seqs` requests run; the rest wait in FIFO order.
//! - Each step computes at most `max_num_batched_tokens` tokens: first the
//!   running requests in order (one token for a decode, a chunk of what is
//!   left for a prefill), then waiting requests are admitted, each with a
//!   prefill chunk from what budget remains, while blocks allow.
//! - A running request that cannot get a block preempts the newest running
//!   request (the last admitted) until it can, or until it is itself the
//!   one preempted. A preempted request loses all its blocks and its
//!   computed tokens and goes back to the front of the waiting queue; it is
//!   recomputed (its prompt and what it had generated) when admitted again.
//!   No new request is admitted in a step that preempted.
//! - Prefix cache: a block, once full, is cached under its chain hash
//!   (`kv::block_hashes`). Freed blocks (a finished, aborted or preempted
//!   request's, tail first) go to the end of the free queue with their hash,
//!   so they can still be hit; a block taken from the head of the queue
//!   loses its cached hash (eviction in LRU order). An admitted request
//!   takes the longest run of cached blocks at the head of its tokens, at
//!   most all but its last token (whose logits give the next token).
//! - A token is sampled at the end of the step that computes a request's
//!   last token: the first one when its prefill completes, then one per
//!   decode step.
//!
//! Left out: vLLM's watermark of free blocks kept back at admission,
//! priorities, speculative decoding, and the `max_model_len` check done by
//! the caller instead (`Scheduler::add` refuses what could never fit).

use std::collections::{BTreeMap, VecDeque};

use ahash::AHashMap;

/// What one step costs:
/// `base_us + per_token_us x tokens computed + per_seq_us x requests in the
/// step + per_context_token_us x context attended`, where the context is,
/// summed over the requests in the step, the tokens each one's attention
/// reads (its computed tokens after the step).
/// - `base_us`: the step's fixed cost, mostly reading the weights once; a
///   decode step of one short sequence costs about that.
/// - `per_token_us`: the compute of each token, prefill and decode alike; it
///   is what makes a long prefill chunk expensive.
/// - `per_seq_us`: each request's own work per step (sampling, output
///   processing, streaming); it is what makes a big decode batch slower.
/// - `per_context_token_us`: reading one token's K and V.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepCost {
    pub base_us: f64,
    pub per_token_us: f64,
    pub per_seq_us: f64,
    pub per_context_token_us: f64,
}

impl StepCost {
    /// Fitted to the published vLLM V1 run in `CALIBRATION.md`
    /// (Qwen2.5-0.5B-Instruct on one NVIDIA L4, 256 tokens in, 128 out,
    /// closed loop). The context cost is not fitted (the run's contexts are
    /// all 256-384 tokens, too alike to tell it from the rest) but derived:
    /// the model's 12 KiB of K and V per token read at the L4's 300 GB/s.
    pub const L4_QWEN_0_5B: StepCost = StepCost {
        base_us: 5_000.0,
        per_token_us: 13.0,
        per_seq_us: 45.0,
        per_context_token_us: 0.041,
    };

    /// The step cost of an engine whose single-sequence decode takes
    /// `decode_ms` per token and whose prefill costs `prefill_us` per token,
    /// derived from [`StepCost::L4_QWEN_0_5B`]: the fixed cost is the decode
    /// time, the per-token cost the prefill time, and the per-sequence and
    /// context costs the preset's in proportion to its fixed cost. (The
    /// fixed cost is reading the weights, the context cost reading the KV;
    /// K and V per token over the weights' size is about alike across dense
    /// models, 1.2e-5 for this one, 0.8e-5 for Llama-3-8B.)
    pub fn scaled_to(decode_ms: u64, prefill_us: u64) -> StepCost {
        let base_us = decode_ms as f64 * 1_000.0;
        let p = StepCost::L4_QWEN_0_5B;
        let ratio = base_us / p.base_us;
        StepCost {
            base_us,
            per_token_us: prefill_us as f64,
            per_seq_us: p.per_seq_us * ratio,
            per_context_token_us: p.per_context_token_us * ratio,
        }
    }

    /// Multiplies every part, as a slower GPU would.
    pub fn times(self, factor: f64) -> StepCost {
        StepCost {
            base_us: self.base_us * factor,
            per_token_us: self.per_token_us * factor,
            per_seq_us: self.per_seq_us * factor,
            per_context_token_us: self.per_context_token_us * factor,
        }
    }

    pub fn step_us(&self, tokens: usize, seqs: usize, context: usize) -> f64 {
        (self.base_us
            + self.per_token_us * tokens as f64
            + self.per_seq_us * seqs as f64
            + self.per_context_token_us * context as f64)
            .max(0.0)
    }
}

/// The front-end time of the calibrated run (HTTP, tokenizing), in
/// microseconds: what a request waits before the scheduler sees it.
pub const L4_QWEN_0_5B_OVERHEAD_US: u64 = 21_000;

pub type ReqId = u64;

#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    pub max_num_seqs: usize,
    pub max_num_batched_tokens: usize,
    pub block_tokens: usize,
    pub num_blocks: usize,
    pub cost: StepCost,
}

/// A request as the scheduler sees it.
#[derive(Debug, Clone)]
pub struct NewRequest {
    pub prompt_tokens: usize,
    pub max_tokens: usize,
    /// Chain hashes of the request's full blocks, prompt and then the
    /// completion it will generate (`kv::block_hashes` of both).
    pub hashes: Vec<u64>,
}

/// One sampled token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Token {
    pub id: ReqId,
    /// 0 for the first token.
    pub index: usize,
    /// Prompt tokens served from the cache when the request was first
    /// admitted (vLLM reports that admission's, not a recompute's).
    pub cached_tokens: usize,
    /// The request's last token: it has finished and holds no blocks.
    pub last: bool,
}

/// What one step did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Step {
    pub duration_us: f64,
    /// Tokens computed (prefill chunks and decodes).
    pub tokens: usize,
    /// Context attended, as in [`StepCost`].
    pub context: usize,
    /// Requests in the step, and how many tokens each computed.
    pub scheduled: Vec<(ReqId, usize)>,
    pub emitted: Vec<Token>,
    pub preempted: Vec<ReqId>,
}

/// Counters with vLLM's meanings.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Prompt tokens of requests that produced their first token.
    pub prompt_tokens: u64,
    pub generation_tokens: u64,
    /// Tokens looked up in the prefix cache at admissions, and found.
    pub prefix_queries: u64,
    pub prefix_hits: u64,
    pub preemptions: u64,
}

#[derive(Debug)]
struct Request {
    prompt_tokens: usize,
    max_tokens: usize,
    hashes: Vec<u64>,
    /// Tokens sampled so far.
    output: usize,
    /// Tokens whose KV is computed (0 again after a preemption).
    computed: usize,
    blocks: Vec<usize>,
    cached_tokens: Option<usize>,
}

impl Request {
    fn tokens(&self) -> usize {
        self.prompt_tokens + self.output
    }
}

#[derive(Debug, Default)]
struct Block {
    refs: u32,
    hash: Option<u64>,
    /// Its key in the free queue while `refs == 0`.
    free_at: Option<u64>,
}

/// vLLM's block pool: blocks by id, the free queue (LRU order: freed last,
/// evicted last) and the cached blocks by hash.
#[derive(Debug)]
struct BlockPool {
    blocks: Vec<Block>,
    free: BTreeMap<u64, usize>,
    tick: u64,
    cached: AHashMap<u64, usize>,
}

impl BlockPool {
    fn new(n: usize) -> Self {
        let mut pool = BlockPool {
            blocks: (0..n).map(|_| Block::default()).collect(),
            free: BTreeMap::new(),
            tick: 0,
            cached: AHashMap::new(),
        };
        for id in 0..n {
            pool.push_free(id);
        }
        pool
    }

    fn push_free(&mut self, id: usize) {
        self.tick += 1;
        self.free.insert(self.tick, id);
        self.blocks[id].free_at = Some(self.tick);
    }

    /// The free queue's head, its cached hash (if any) evicted.
    fn take(&mut self) -> Option<usize> {
        let (_, id) = self.free.pop_first()?;
        let b = &mut self.blocks[id];
        b.free_at = None;
        b.refs = 1;
        if let Some(h) = b.hash.take() {
            if self.cached.get(&h) == Some(&id) {
                self.cached.remove(&h);
            }
        }
        Some(id)
    }

    /// A cached block taken into use (out of the free queue if it was there).
    fn touch(&mut self, id: usize) {
        if let Some(at) = self.blocks[id].free_at.take() {
            self.free.remove(&at);
        }
        self.blocks[id].refs += 1;
    }

    fn release(&mut self, id: usize) {
        let b = &mut self.blocks[id];
        b.refs = b.refs.saturating_sub(1);
        if b.refs == 0 {
            self.push_free(id);
        }
    }

    /// A block that has become full is cached under its hash, unless
    /// another block already is (two requests computed the same block at
    /// once: the first one stays the cached copy).
    fn register(&mut self, id: usize, hash: u64) {
        if self.blocks[id].hash.is_none() && !self.cached.contains_key(&hash) {
            self.cached.insert(hash, id);
            self.blocks[id].hash = Some(hash);
        }
    }

    fn is_free(&self, id: usize) -> bool {
        self.blocks[id].free_at.is_some()
    }
}

#[derive(Debug)]
pub struct Scheduler {
    cfg: SchedulerConfig,
    pool: BlockPool,
    requests: AHashMap<ReqId, Request>,
    /// In admission order: the last is the newest, the first preempted.
    running: Vec<ReqId>,
    waiting: VecDeque<ReqId>,
    next_id: ReqId,
    counters: Counters,
}

impl Scheduler {
    pub fn new(mut cfg: SchedulerConfig) -> Self {
        cfg.max_num_seqs = cfg.max_num_seqs.max(1);
        cfg.max_num_batched_tokens = cfg.max_num_batched_tokens.max(1);
        cfg.block_tokens = cfg.block_tokens.max(1);
        Scheduler {
            pool: BlockPool::new(cfg.num_blocks),
            cfg,
            requests: AHashMap::new(),
            running: Vec::new(),
            waiting: VecDeque::new(),
            next_id: 1,
            counters: Counters::default(),
        }
    }

    pub fn config(&self) -> &SchedulerConfig {
        &self.cfg
    }

    /// The longest request (prompt and completion) the KV could ever hold.
    pub fn max_model_len(&self) -> usize {
        self.cfg.num_blocks * self.cfg.block_tokens
    }

    /// Queues a request, or refuses one longer than the whole KV (it could
    /// never run; vLLM refuses it as over `max_model_len`).
    pub fn add(&mut self, req: NewRequest) -> Result<ReqId, usize> {
        let total = req.prompt_tokens + req.max_tokens;
        if req.max_tokens == 0 || total > self.max_model_len() {
            return Err(total);
        }
        let id = self.next_id;
        self.next_id += 1;
        self.requests.insert(
            id,
            Request {
                prompt_tokens: req.prompt_tokens.max(1),
                max_tokens: req.max_tokens,
                hashes: req.hashes,
                output: 0,
                computed: 0,
                blocks: Vec::new(),
                cached_tokens: None,
            },
        );
        self.waiting.push_back(id);
        Ok(id)
    }

    /// Drops a request wherever it is (its client went away); its full
    /// blocks stay cached.
    pub fn abort(&mut self, id: ReqId) {
        self.running.retain(|r| *r != id);
        self.waiting.retain(|r| *r != id);
        if let Some(mut req) = self.requests.remove(&id) {
            self.free_blocks(&mut req);
        }
    }

    pub fn is_idle(&self) -> bool {
        self.running.is_empty() && self.waiting.is_empty()
    }

    pub fn running(&self) -> usize {
        self.running.len()
    }

    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    pub fn counters(&self) -> Counters {
        self.counters
    }

    /// Blocks held by requests over all blocks; cached blocks on the free
    /// queue are not in use (vLLM's `kv_cache_usage_perc`).
    pub fn kv_usage(&self) -> f64 {
        let n = self.cfg.num_blocks;
        if n == 0 {
            return 0.0;
        }
        (n - self.pool.free.len()) as f64 / n as f64
    }

    /// Blocks whose hash is cached (in use or free).
    #[cfg(test)]
    pub fn cached_blocks(&self) -> usize {
        self.pool.cached.len()
    }

    fn free_blocks(&mut self, req: &mut Request) {
        // Tail first, so the tail is evicted first and what stays cached is
        // still a prefix.
        for &b in req.blocks.iter().rev() {
            self.pool.release(b);
        }
        req.blocks.clear();
    }

    /// Blocks for `req`'s next `num_new` tokens, or false if the free
    /// queue has too few.
    fn grow(&mut self, id: ReqId, num_new: usize) -> bool {
        let bt = self.cfg.block_tokens;
        let Some(req) = self.requests.get_mut(&id) else {
            return false;
        };
        let need = (req.computed + num_new).div_ceil(bt);
        let extra = need.saturating_sub(req.blocks.len());
        if extra > self.pool.free.len() {
            return false;
        }
        for _ in 0..extra {
            if let Some(b) = self.pool.take() {
                req.blocks.push(b);
            }
        }
        true
    }

    fn preempt(&mut self, id: ReqId) {
        if let Some(mut req) = self.requests.remove(&id) {
            self.free_blocks(&mut req);
            req.computed = 0;
            self.requests.insert(id, req);
        }
        self.waiting.push_front(id);
        self.counters.preemptions += 1;
    }

    /// Admits the waiting queue's head with its cached prefix and a first
    /// chunk of at most `budget` tokens; None if its blocks do not fit.
    fn admit(&mut self, id: ReqId, budget: usize) -> Option<usize> {
        let bt = self.cfg.block_tokens;
        let req = self.requests.get(&id)?;
        let tokens = req.tokens();
        let max_hits = (tokens - 1) / bt;
        let hits: Vec<usize> = req
            .hashes
            .iter()
            .take(max_hits)
            .map_while(|h| self.pool.cached.get(h).copied())
            .collect();
        let hit_tokens = hits.len() * bt;
        let num_new = (tokens - hit_tokens).min(budget);
        let need = (hit_tokens + num_new).div_ceil(bt) - hits.len();
        let hits_free = hits.iter().filter(|&&b| self.pool.is_free(b)).count();
        if need > self.pool.free.len() - hits_free {
            return None;
        }
        for &b in &hits {
            self.pool.touch(b);
        }
        let mut blocks = hits;
        for _ in 0..need {
            blocks.extend(self.pool.take());
        }
        let req = self.requests.get_mut(&id)?;
        req.blocks = blocks;
        req.computed = hit_tokens;
        req.cached_tokens.get_or_insert(hit_tokens);
        self.counters.prefix_queries += tokens as u64;
        self.counters.prefix_hits += hit_tokens as u64;
        Some(num_new)
    }

    /// Schedules one step, applies it, and says what it did and how long it
    /// took. An idle scheduler's step is empty and takes no time.
    pub fn step(&mut self) -> Step {
        let mut budget = self.cfg.max_num_batched_tokens;
        let mut step = Step::default();
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let id = self.running[i];
            let Some(req) = self.requests.get(&id) else {
                self.running.remove(i);
                continue;
            };
            let num_new = (req.tokens() - req.computed).min(budget);
            let mut fits = false;
            while !fits {
                if self.grow(id, num_new) {
                    fits = true;
                    continue;
                }
                let Some(victim) = self.running.pop() else {
                    break;
                };
                self.preempt(victim);
                step.preempted.push(victim);
                if victim == id {
                    break;
                }
            }
            if !fits {
                break;
            }
            step.scheduled.push((id, num_new));
            budget -= num_new;
            i += 1;
        }
        if step.preempted.is_empty() {
            while budget > 0 && self.running.len() < self.cfg.max_num_seqs {
                let Some(&id) = self.waiting.front() else {
                    break;
                };
                let Some(num_new) = self.admit(id, budget) else {
                    break;
                };
                self.waiting.pop_front();
                self.running.push(id);
                step.scheduled.push((id, num_new));
                budget -= num_new;
            }
        }
        self.apply(&mut step);
        step
    }

    fn apply(&mut self, step: &mut Step) {
        let bt = self.cfg.block_tokens;
        for &(id, num_new) in &step.scheduled {
            let Some(req) = self.requests.get_mut(&id) else {
                continue;
            };
            let before = req.computed;
            req.computed += num_new;
            step.tokens += num_new;
            step.context += req.computed;
            for k in before / bt..req.computed / bt {
                if let (Some(&h), Some(&b)) = (req.hashes.get(k), req.blocks.get(k)) {
                    self.pool.register(b, h);
                }
            }
            if req.computed < req.tokens() {
                continue;
            }
            if req.output == 0 {
                self.counters.prompt_tokens += req.prompt_tokens as u64;
            }
            req.output += 1;
            self.counters.generation_tokens += 1;
            let last = req.output >= req.max_tokens;
            step.emitted.push(Token {
                id,
                index: req.output - 1,
                cached_tokens: req.cached_tokens.unwrap_or(0),
                last,
            });
            if last {
                self.running.retain(|r| *r != id);
                if let Some(mut req) = self.requests.remove(&id) {
                    self.free_blocks(&mut req);
                }
            }
        }
        step.duration_us = if step.scheduled.is_empty() {
            0.0
        } else {
            self.cfg
                .cost
                .step_us(step.tokens, step.scheduled.len(), step.context)
        };
    }
}

#[cfg(test)]
mod tests;
