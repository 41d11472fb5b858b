//! A simulated OpenAI-compatible inference engine.
//!
//! It stands in for vLLM wherever the gateway needs a real upstream: the demo,
//! `llm-gateway sim`, the integration tests and the replay benchmark. It
//! reproduces what a gateway can observe from vLLM: continuous batching with a
//! FIFO waiting queue, block-granular prefix caching with LRU eviction (visible
//! as `usage.prompt_tokens_details.cached_tokens` and in time-to-first-token),
//! SSE streaming with one frame per token, vLLM's Prometheus gauge names, and
//! failure modes that tests can switch on at any time through [`Faults`].
//!
//! Engine profiles ([`Profile`], `EngineConfig::profile`) choose which engine
//! it imitates; every profile serves the same APIs, ids, usage and test
//! controls:
//! - `slots` (the default): `max_running` sequences at once, each on its own
//!   clock (prefill, then a token per `decode_ms_per_token`), with the KV pool
//!   of `kv.rs`; `/metrics` under vLLM's names.
//! - `vllm`: vLLM V1's scheduler (`engine/scheduler.rs`, pure, stepped in
//!   virtual time by its tests and in real time by `engine/batch.rs`): up to
//!   `max_num_seqs` sequences limited by KV blocks, chunked prefill sharing
//!   each step's `max_num_batched_tokens` with decodes, preemption by
//!   recompute, block prefix caching with LRU eviction, and a step time from
//!   the tokens, sequences and context in the step, calibrated against a
//!   published vLLM run (`CALIBRATION.md`). vLLM's metric names.
//! - `sglang`: the same scheduler under SGLang's metric names, with its
//!   `/get_server_info`, `/server_info` and `/get_model_info`.
//! - `llamacpp`: llama-server with `--parallel max_running`, each slot with
//!   its own cache of its last conversation and its own context, and behind
//!   them the host-memory prompt cache (`--cache-ram`, `host_cache_tokens`)
//!   that keeps the prompts slots give up and restores them
//!   (`engine/llamacpp.rs`); llama.cpp's metric names (no KV figures), its
//!   `/props` and `/health`, its 400 for a request over a slot's context.
//!
//! It serves `POST /v1/chat/completions` and `/v1/completions`, and, with the
//! same engine model, Anthropic Messages (`POST /v1/messages`) and OpenAI
//! Responses (`POST /v1/responses`, stateful through `previous_response_id`)
//! in their own shapes (`engine/apis.rs`). One conversation is one prompt on
//! every API, so a turn that extends an earlier one hits its prefix cache
//! whichever API either came by.
//!
//! The HTTP/1.1 server is hand-written on plain tokio (see `http.rs`) so that
//! framing is under the tests' control: each SSE frame leaves as its own chunk
//! the moment it is produced, and a stream can be cut without its terminator.
//!
//! Per-request test controls (request headers):
//! - `x-sim-max-tokens: N`     completion length, overriding the body
//! - `x-sim-frame-delay-ms: N` time between tokens, overriding the config (in
//!   the batch profiles: the least time between this request's frames)
//! - `x-sim-ttft-ms: N`        N ms more before the first token (after prefill)
//! - `x-sim-decoy-usage: N`    a usage frame claiming N completion tokens right
//!   after the first content frame (the real one still comes last)
//! - `x-sim-gate: NAME`        after the first content frame, wait for
//!   [`EngineHandle::open_gate`]`(NAME)`; gates stay open once opened
//! - `x-sim-echo: 1`           answer 200 with the request body bytes verbatim

mod cli;
pub mod client;
pub(crate) mod engine;
mod http;
mod kv;
#[cfg(test)]
mod tests;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU16, AtomicU32, AtomicU64};
use std::sync::Arc;
use std::time::Duration;

pub use cli::{run, SimArgs};
pub use engine::scheduler::{StepCost, L4_QWEN_0_5B_OVERHEAD_US};

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
        }
    }
}

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

/// A running engine. Cloning gives another handle to the same engine;
/// dropping handles does not stop it (see [`EngineHandle::shutdown`]).
#[derive(Clone)]
pub struct EngineHandle {
    pub addr: SocketAddr,
    pub faults: Arc<Faults>,
    pub stats: Arc<EngineStats>,
    shared: Arc<engine::Shared>,
}

impl std::fmt::Debug for EngineHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineHandle")
            .field("addr", &self.addr)
            .field("model", &self.shared.cfg.name)
            .finish_non_exhaustive()
    }
}

impl EngineHandle {
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// `http://ip:port`, without a trailing slash.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Releases every request waiting on `x-sim-gate: name` and lets later
    /// requests with that gate pass without waiting.
    pub fn open_gate(&self, name: &str) {
        self.shared.open_gate(name);
    }

    /// Closes the listening socket before returning, so new connections are
    /// refused from then on, and drops every open connection (in-progress
    /// responses are cut off). Idempotent; the engine cannot be restarted,
    /// start a new one on the same port instead.
    pub fn shutdown(&self) {
        self.shared.shutdown();
    }
}

/// Starts an engine on `listener`, serving on the current tokio runtime.
pub async fn start_engine(
    listener: tokio::net::TcpListener,
    cfg: EngineConfig,
) -> std::io::Result<EngineHandle> {
    let addr = listener.local_addr()?;
    let faults = Arc::new(Faults::default());
    let stats = Arc::new(EngineStats::default());
    let shared = Arc::new(engine::Shared::new(
        cfg,
        addr,
        listener,
        faults.clone(),
        stats.clone(),
    ));
    tokio::spawn(engine::accept_loop(shared.clone()));
    Ok(EngineHandle {
        addr,
        faults,
        stats,
        shared,
    })
}

/// Engines on their own runtime thread; dropping the cluster shuts them down
/// and stops the runtime.
pub struct SimCluster {
    pub engines: Vec<EngineHandle>,
    /// The engines' runtime, for engines started later ([`SimCluster::restart`]).
    runtime: tokio::runtime::Handle,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for SimCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimCluster")
            .field("engines", &self.engines)
            .finish_non_exhaustive()
    }
}

impl SimCluster {
    pub fn addrs(&self) -> Vec<SocketAddr> {
        self.engines.iter().map(|e| e.addr).collect()
    }

    /// Replaces engine `i` with a new one on the same address and with the
    /// same config, but nothing else: an empty cache, zeroed counters and
    /// fault switches, as after a process restart. Shuts the old engine down
    /// first if it still runs. Returns the new engine's handle, which is
    /// also `self.engines[i]` from then on. Callable from any runtime.
    pub async fn restart(&mut self, i: usize) -> std::io::Result<EngineHandle> {
        let old = self.engines.get(i).cloned().ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("no engine {i} in a cluster of {}", self.engines.len()),
            )
        })?;
        old.shutdown();
        let cfg = old.shared.cfg.clone();
        // tokio binds with SO_REUSEADDR, so the old engine's connections in
        // TIME_WAIT do not hold the port.
        let started = self
            .runtime
            .spawn(async move {
                let listener = tokio::net::TcpListener::bind(old.addr).await?;
                start_engine(listener, cfg).await
            })
            .await
            .map_err(|e| std::io::Error::other(format!("engine start-up failed: {e}")))??;
        self.engines[i] = started.clone();
        Ok(started)
    }
}

impl Drop for SimCluster {
    fn drop(&mut self) {
        for e in &self.engines {
            e.shutdown();
        }
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Starts `n` engines on 127.0.0.1 (ephemeral ports when `base_port` is 0,
/// else `base_port`, `base_port + 1`, …) on a dedicated multi-thread tokio
/// runtime in its own OS thread, so that synchronous code and other runtimes
/// (Pingora's) can use them. Returns once all of them are listening.
pub fn spawn_engines(n: usize, base_port: u16, cfg: EngineConfig) -> std::io::Result<SimCluster> {
    spawn_engines_with(vec![cfg; n], base_port)
}

/// [`spawn_engines`] with one config per engine, in order: a fleet whose
/// engines differ (one slower than the rest, say).
pub fn spawn_engines_with(
    configs: Vec<EngineConfig>,
    base_port: u16,
) -> std::io::Result<SimCluster> {
    let n = configs.len();
    let ports = (0..n)
        .map(|i| {
            if base_port == 0 {
                return Ok(0);
            }
            u16::try_from(i)
                .ok()
                .and_then(|i| base_port.checked_add(i))
                .ok_or_else(|| {
                    std::io::Error::new(
                        std::io::ErrorKind::InvalidInput,
                        format!("{n} engines from port {base_port} run past port 65535"),
                    )
                })
        })
        .collect::<std::io::Result<Vec<u16>>>()?;
    let addrs = ports
        .into_iter()
        .map(|port| SocketAddr::from(([127, 0, 0, 1], port)))
        .collect();
    spawn_engines_on(addrs, configs)
}

/// Engines at the given addresses, one config each, in order: several
/// engines behind one port on different loopback addresses (127.0.0.2,
/// 127.0.0.3, …), as the pods behind a headless Service.
pub fn spawn_engines_on(
    addrs: Vec<SocketAddr>,
    configs: Vec<EngineConfig>,
) -> std::io::Result<SimCluster> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("sim-engine")
        .enable_all()
        .build()?;
    let runtime = rt.handle().clone();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let thread = std::thread::Builder::new()
        .name("sim-engines".to_string())
        .spawn(move || {
            rt.block_on(async move {
                let mut engines = Vec::with_capacity(addrs.len());
                for (addr, cfg) in addrs.into_iter().zip(configs) {
                    let started = match tokio::net::TcpListener::bind(addr).await {
                        Ok(listener) => start_engine(listener, cfg).await,
                        Err(e) => Err(e),
                    };
                    match started {
                        Ok(engine) => engines.push(engine),
                        Err(e) => {
                            engines.iter().for_each(EngineHandle::shutdown);
                            let _ = ready_tx.send(Err(e));
                            return;
                        }
                    }
                }
                if ready_tx.send(Ok(engines)).is_ok() {
                    // Err means the cluster was dropped without a stop signal; stop either way.
                    let _ = stop_rx.await;
                }
            });
            // Bounded: connection tasks are cancelled, nothing blocks on them.
            rt.shutdown_timeout(Duration::from_secs(1));
        })?;
    let engines = match ready_rx.recv() {
        Ok(result) => result?,
        Err(_) => {
            let _ = thread.join();
            return Err(std::io::Error::other("sim engine thread exited early"));
        }
    };
    Ok(SimCluster {
        engines,
        runtime,
        stop: Some(stop_tx),
        thread: Some(thread),
    })
}
