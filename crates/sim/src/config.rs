//! What an engine is configured with: its profile, its timing and its
//! capacity.

use std::time::Duration;

use crate::engine::scheduler::StepCost;

/// How a simulated engine behaves. Construct with struct-update syntax from
/// [`EngineConfig::default`] (fast, for tests) or [`EngineConfig::realistic`].
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Model name served; reported by `/v1/models` and the `model_name` metric label.
    pub name: String,
    /// Continuous batching: at most this many sequences decode at once, the
    /// rest wait in FIFO order. 0 is treated as 1.
    pub max_running: usize,
    /// KV capacity in tokens, shared by running sequences and idle cached prefixes.
    pub kv_capacity_tokens: usize,
    /// Prefill time per prompt token that is not served from the prefix cache.
    pub prefill_us_per_token: u64,
    /// Time between streamed tokens of one sequence.
    pub decode_ms_per_token: u64,
    /// Completion length when the request sets none.
    pub default_max_tokens: usize,
    /// Prefix cache granularity in tokens. 0 is treated as 1.
    pub block_tokens: usize,
    /// How much each sequence that is prefilling on the engine stretches the
    /// token interval of every sequence decoding there (0.5: one prefill in
    /// progress makes decoding 1.5x slower). Real engines interleave prefill
    /// chunks with decode steps on one GPU, so a cold prefill (a session that
    /// lost its cache) slows its neighbours down: that is where the slow 5%
    /// of decode speed comes from. 0 keeps decode speed fixed (tests).
    pub prefill_decode_interference: f64,
    /// Which engine this one imitates: its scheduler, its metric names and
    /// its extra endpoints. See [`Profile`].
    pub profile: Profile,
    /// `vllm`/`sglang`: sequences in one batch at most (vLLM's
    /// `--max-num-seqs`); the KV blocks are the limit that usually binds.
    /// 0 is treated as 1.
    pub max_num_seqs: usize,
    /// `vllm`/`sglang`: tokens one step may compute (vLLM's
    /// `--max-num-batched-tokens`), decodes first, prefill chunks in what is
    /// left. 0 is treated as 1.
    pub max_num_batched_tokens: usize,
    /// `vllm`/`sglang`: what one step costs, by the tokens it computes and the
    /// context they attend to (`engine/scheduler.rs` `StepCost`; calibration
    /// in `CALIBRATION.md`).
    pub step_cost: StepCost,
    /// `vllm`/`sglang`: time a request spends in the server before the
    /// scheduler sees it (HTTP, tokenizing), in microseconds. It is part of
    /// every measured time to first token.
    pub request_overhead_us: u64,
    /// Whether `/metrics` says how many KV tokens the engine holds
    /// (`vllm:cache_config_info`, `sglang:max_total_num_tokens`). Off, the
    /// engine is one a gateway must learn the capacity of: a vLLM behind
    /// another proxy, an SGLang build without the metric.
    pub publish_kv_capacity: bool,
    /// `llamacpp`: tokens llama-server's host-memory prompt cache holds
    /// (`--cache-ram`), where slots' prompts are saved before another
    /// conversation takes the slot and restored from when they come back
    /// (`engine/llamacpp.rs`). 0 turns it off (`--cache-ram 0`). Default
    /// [`DEFAULT_HOST_CACHE_TOKENS`].
    pub host_cache_tokens: usize,
    /// Where the engine answers its health check (`/health` by default): an
    /// engine behind its own router, or one whose readiness is elsewhere,
    /// answers another path, and `/health` is then a 404.
    pub health_path: String,
}

/// llama-server's default `--cache-ram` (8192 MiB) in tokens of a 7-8B-class
/// model: with grouped-query attention its KV is 128 KiB a token (Llama-3-8B:
/// 32 layers x K and V x 8 KV heads x 128 dims x 2 bytes of f16), and
/// 8 GiB / 128 KiB = 65536 tokens: some twenty conversations of 3k tokens.
pub const DEFAULT_HOST_CACHE_TOKENS: usize = 65_536;

/// The engines the simulator imitates. Each keeps the OpenAI-compatible API
/// (and the Anthropic and Responses shapes) and differs in scheduling, in
/// what its `/metrics` say and in its own endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Profile {
    /// The original model: `max_running` slots, each sequence on its own
    /// clock (prefill, then one token per `decode_ms_per_token`), one vLLM-named
    /// `/metrics`. The tests' default.
    #[default]
    Slots,
    /// vLLM V1's scheduler: a batch of up to `max_num_seqs` limited by KV
    /// blocks, chunked prefill sharing each step with decodes, preemption by
    /// recompute, step time from the batch (`engine/scheduler.rs`).
    Vllm,
    /// The same scheduler under SGLang's metric names and endpoints.
    Sglang,
    /// llama-server with `--parallel max_running`: each slot keeps its own
    /// cache of its last conversation; no shared KV pool; a host-memory
    /// prompt cache of `host_cache_tokens` behind the slots
    /// (`engine/llamacpp.rs`).
    Llamacpp,
}

impl Profile {
    pub const ALL: [Profile; 4] = [
        Profile::Slots,
        Profile::Vllm,
        Profile::Sglang,
        Profile::Llamacpp,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Profile::Slots => "slots",
            Profile::Vllm => "vllm",
            Profile::Sglang => "sglang",
            Profile::Llamacpp => "llamacpp",
        }
    }

    /// Whether requests go through the batch scheduler.
    pub fn batched(self) -> bool {
        matches!(self, Profile::Vllm | Profile::Sglang)
    }
}

impl std::fmt::Display for Profile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Profile {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Profile::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| {
                format!("unknown engine profile {s:?} (one of: slots, vllm, sglang, llamacpp)")
            })
    }
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            name: "sim-model".to_string(),
            max_running: 8,
            kv_capacity_tokens: 200_000,
            prefill_us_per_token: 2,
            decode_ms_per_token: 1,
            default_max_tokens: 16,
            block_tokens: 16,
            prefill_decode_interference: 0.0,
            profile: Profile::Slots,
            max_num_seqs: 256,
            max_num_batched_tokens: 8192,
            // Tiny, so that tests of the batch profiles run fast.
            step_cost: StepCost {
                base_us: 200.0,
                per_token_us: 1.0,
                per_seq_us: 0.0,
                per_context_token_us: 0.0,
            },
            request_overhead_us: 0,
            publish_kv_capacity: true,
            host_cache_tokens: DEFAULT_HOST_CACHE_TOKENS,
            health_path: "/health".to_string(),
        }
    }
}

impl EngineConfig {
    /// Time to first token of a request with `new_tokens` uncached prompt
    /// tokens on an idle engine: the least any placement can give it. The
    /// batched profiles compute it in chunks of `max_num_batched_tokens`,
    /// one step each (the context each chunk attends to left out, so this
    /// stays a lower bound); the others prefill it in one go.
    pub fn idle_ttft(&self, new_tokens: u64) -> Duration {
        let us = if self.profile.batched() {
            let budget = self.max_num_batched_tokens.max(1) as u64;
            let steps = new_tokens.max(1).div_ceil(budget);
            let c = self.step_cost;
            steps as f64 * (c.base_us + c.per_seq_us)
                + new_tokens as f64 * c.per_token_us
                + self.request_overhead_us as f64
        } else {
            (new_tokens * self.prefill_us_per_token) as f64
        };
        Duration::from_micros(us.max(0.0) as u64)
    }

    /// Timings in the range of a mid-size model on one GPU, for the demo and
    /// benchmarks where time-to-first-token and cache hits should be visible.
    pub fn realistic() -> Self {
        EngineConfig {
            name: "sim-model".to_string(),
            max_running: 16,
            kv_capacity_tokens: 400_000,
            prefill_us_per_token: 20,
            decode_ms_per_token: 15,
            default_max_tokens: 64,
            block_tokens: 16,
            prefill_decode_interference: 0.5,
            profile: Profile::Slots,
            max_num_seqs: 256,
            max_num_batched_tokens: 8192,
            step_cost: StepCost::scaled_to(15, 20),
            request_overhead_us: 0,
            publish_kv_capacity: true,
            host_cache_tokens: DEFAULT_HOST_CACHE_TOKENS,
            health_path: "/health".to_string(),
        }
    }
}
