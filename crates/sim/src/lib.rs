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
//! - `x-sim-prefill-gate: NAME` before the first token (after prefill),
//!   wait for [`EngineHandle::open_gate`]`(NAME)` (the `slots` profile)
//! - `x-sim-echo: 1`           answer 200 with the request body bytes verbatim

mod cli;
pub mod client;
mod config;
pub(crate) mod engine;
mod http;
mod kv;
mod stats;
#[cfg(test)]
mod tests;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

pub use cli::{run, SimArgs};
pub use config::{EngineConfig, Profile, DEFAULT_HOST_CACHE_TOKENS};
pub use engine::scheduler::{StepCost, L4_QWEN_0_5B_OVERHEAD_US};
pub use stats::{EngineStats, Faults, RecordedRequest, RECORDED_LIMIT};

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
    tokio::spawn(engine::conn::accept_loop(shared.clone()));
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
