//! The engine proper: connection handling, routing, scheduling and the
//! token loop.

use std::fmt::Write as _;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ahash::AHashMap;
use bytes::BytesMut;
use parking_lot::Mutex;
use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify, Semaphore, SemaphorePermit};
use tokio::time::{sleep, sleep_until, Instant};

use super::http::{self, ReadError, Request, StreamFraming};
use super::kv::{self, Kind, KvPool, SeqKv};
use super::{EngineConfig, EngineStats, Faults, Profile, RecordedRequest, RECORDED_LIMIT};

mod apis;
mod batch;
pub(crate) mod llamacpp;
mod metrics;
pub(crate) mod scheduler;
use apis::{Refusal, ResponseStore};

/// The text of every generated token.
const TOKEN: &str = "tok ";
/// A bound on completion length so that a typo cannot make the engine
/// build a gigabyte response.
const MAX_COMPLETION_TOKENS: u64 = 1_000_000;
/// `Faults::stall` is a plain atomic that tests flip, so stalled requests
/// poll it; this is how long a cleared stall can go unnoticed.
const STALL_POLL: Duration = Duration::from_millis(5);
/// After an accept error such as EMFILE, retrying at once would spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);
/// How long a closing connection waits for the client to close its side.
const LINGER: Duration = Duration::from_secs(2);
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

pub(crate) async fn accept_loop(shared: Arc<Shared>) {
    if shared.batch.is_some() {
        tokio::spawn(batch::drive(shared.clone()));
    }
    let mut stop = shared.stop.subscribe();
    loop {
        let accepted = tokio::select! {
            r = std::future::poll_fn(|cx| match shared.listener.lock().as_ref() {
                Some(l) => l.poll_accept(cx),
                None => std::task::Poll::Ready(Err(io::ErrorKind::NotConnected.into())),
            }) => r,
            () = stopped(&mut stop) => return,
        };
        match accepted {
            Ok((stream, _)) => {
                // SSE frames are small writes that must not wait for Nagle.
                let _ = stream.set_nodelay(true);
                tokio::spawn(serve_conn(shared.clone(), stream));
            }
            Err(_) if shared.listener.lock().is_none() => return,
            Err(e) => {
                log::warn!("sim engine {}: accept failed: {e}", shared.addr);
                sleep(ACCEPT_BACKOFF).await;
            }
        }
    }
}

async fn serve_conn(shared: Arc<Shared>, mut stream: TcpStream) {
    let mut stop = shared.stop.subscribe();
    tokio::select! {
        () = conn_loop(&shared, &mut stream) => {}
        // Dropping the stream here is what cuts off in-progress responses.
        () = stopped(&mut stop) => {}
    }
}

async fn conn_loop(shared: &Shared, stream: &mut TcpStream) {
    let (mut rd, mut wr) = stream.split();
    let mut buf = BytesMut::new();
    loop {
        let req = match http::read_request(&mut rd, &mut wr, &mut buf).await {
            Ok(req) => req,
            Err(ReadError::Bad(status, message)) => {
                let body = error_body("invalid_request", &message);
                if http::write_response(&mut wr, status, JSON, &body, false)
                    .await
                    .is_ok()
                {
                    lingering_close(&mut rd, &mut wr).await;
                }
                return;
            }
            Err(ReadError::Closed | ReadError::Io) => return,
        };
        // A client that goes away is noticed while its request is queued,
        // prefilling or stalled, not only on the next write; dropping the
        // response future then frees its running slot and KV, as vLLM
        // aborts a request whose client disconnected.
        let reusable = tokio::select! {
            r = shared.respond(&req, &mut wr) => r,
            () = until_client_gone(&mut rd, &mut buf) => return,
        };
        match reusable {
            Ok(true) if req.keep_alive => {}
            Ok(true) => {
                lingering_close(&mut rd, &mut wr).await;
                return;
            }
            // Failed, or cut off on purpose (die_after_frames): close at once.
            _ => return,
        }
    }
}

/// Closing a socket that still has unread input makes the kernel send a
/// reset, which can destroy a response the client has not read yet. So send
/// FIN first and discard input until the client closes too, for a bounded time.
async fn lingering_close<R, W>(rd: &mut R, wr: &mut W)
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let _ = wr.shutdown().await;
    let drain = async {
        let mut sink = [0u8; 4096];
        while let Ok(1..) = rd.read(&mut sink).await {}
    };
    let _ = tokio::time::timeout(LINGER, drain).await;
}

/// Reads until EOF or error. Bytes of a pipelined next request are kept in
/// `buf`; past a bound it stops reading and lets TCP push back.
async fn until_client_gone<R: AsyncRead + Unpin>(rd: &mut R, buf: &mut BytesMut) {
    loop {
        if buf.len() >= http::MAX_HEAD_BYTES + http::MAX_BODY_BYTES {
            std::future::pending::<()>().await;
        }
        buf.reserve(8 * 1024);
        match rd.read_buf(buf).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}

fn error_body(kind: &str, message: &str) -> Vec<u8> {
    json!({"error": {"type": kind, "message": message}})
        .to_string()
        .into_bytes()
}

fn sse_frame(v: &Value) -> Vec<u8> {
    format!("data: {v}\n\n").into_bytes()
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Decrements `fail_next` if positive; true if this request must fail.
fn take_one(counter: &AtomicU32) -> bool {
    counter
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
}

fn escape_label(v: &str) -> String {
    v.replace('\\', r"\\")
        .replace('"', "\\\"")
        .replace('\n', r"\n")
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

/// Everything about a completion request the token loop needs.
struct Plan {
    kind: Kind,
    id: String,
    created: u64,
    model: String,
    prompt: Vec<u8>,
    prompt_tokens: usize,
    max_tokens: usize,
    finish_reason: &'static str,
    stream: bool,
    include_usage: bool,
    frame_delay: Duration,
    /// `frame_delay` came from the request (`x-sim-frame-delay-ms`): the
    /// batch profiles, whose token times the steps decide, then space this
    /// request's frames at least that far apart.
    paced: bool,
    /// Added to the prefill, so a test sets a stream's TTFT directly.
    extra_ttft: Duration,
    /// A usage frame with this `completion_tokens` right after the first
    /// content frame: the decoy a meter must not take for the final count.
    decoy_usage: Option<u64>,
    gate: Option<String>,
    /// Responses: the turn this one continues (`previous_response_id`).
    previous_response_id: Option<String>,
    /// Responses: keep this turn for a later `previous_response_id`.
    store: bool,
}

impl Plan {
    fn object(&self) -> &'static str {
        match self.kind {
            Kind::Chat => "chat.completion",
            Kind::Text => "text_completion",
            Kind::Messages => "message",
            Kind::Responses => "response",
        }
    }

    fn chunk_object(&self) -> &'static str {
        match self.kind {
            Kind::Chat => "chat.completion.chunk",
            Kind::Text | Kind::Messages | Kind::Responses => self.object(),
        }
    }

    /// What the stream sends for token `index`: an OpenAI chunk, or the
    /// typed APIs' delta event (after their opening events, for the first).
    fn token_frame(&self, index: usize, cached: usize) -> Vec<u8> {
        match self.kind {
            Kind::Chat | Kind::Text => self.content_frame(index),
            Kind::Messages => self.messages_token(index, cached),
            Kind::Responses => self.responses_token(index),
        }
    }

    /// The whole generated text.
    fn text(&self) -> String {
        TOKEN.repeat(self.max_tokens)
    }

    fn usage(&self, cached: usize) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.max_tokens,
            "total_tokens": self.prompt_tokens + self.max_tokens,
            "prompt_tokens_details": {"cached_tokens": cached},
        })
    }

    fn decoy_usage_frame(&self, completion_tokens: u64) -> Vec<u8> {
        sse_frame(&json!({
            "id": self.id,
            "object": self.chunk_object(),
            "created": self.created,
            "model": self.model,
            "choices": [],
            "usage": {"prompt_tokens": self.prompt_tokens, "completion_tokens": completion_tokens},
        }))
    }

    fn content_frame(&self, index: usize) -> Vec<u8> {
        let finish = if index + 1 == self.max_tokens {
            Value::from(self.finish_reason)
        } else {
            Value::Null
        };
        let choice = match self.kind {
            Kind::Chat => {
                let delta = if index == 0 {
                    json!({"role": "assistant", "content": TOKEN})
                } else {
                    json!({"content": TOKEN})
                };
                json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish})
            }
            Kind::Text | Kind::Messages | Kind::Responses => {
                json!({"index": 0, "text": TOKEN, "logprobs": null, "finish_reason": finish})
            }
        };
        sse_frame(&json!({
            "id": self.id,
            "object": self.chunk_object(),
            "created": self.created,
            "model": self.model,
            "choices": [choice],
        }))
    }
}

fn check_tokens(n: u64) -> Result<(), String> {
    if (1..=MAX_COMPLETION_TOKENS).contains(&n) {
        Ok(())
    } else {
        Err(format!(
            "max_tokens must be between 1 and {MAX_COMPLETION_TOKENS}"
        ))
    }
}

/// A Responses body without its `instructions`, for the input that
/// continues an earlier turn.
fn without_instructions(body: &Value) -> Value {
    let mut body = body.clone();
    if let Some(b) = body.as_object_mut() {
        b.remove("instructions");
    }
    body
}

fn header_number(req: &Request, name: &str) -> Result<Option<u64>, String> {
    req.header(name)
        .map(|v| {
            v.parse::<u64>()
                .map_err(|_| format!("{name} must be a non-negative integer"))
        })
        .transpose()
}

enum Generated {
    Done {
        cached_tokens: usize,
    },
    /// `die_after_frames` cut the stream; the connection must be dropped.
    Died,
}

impl Shared {
    /// Answers one request. `Ok(true)` if the connection can carry another.
    pub(crate) async fn respond<W: AsyncWrite + Unpin>(
        &self,
        req: &Request,
        wr: &mut W,
    ) -> io::Result<bool> {
        let probe = req.method == "GET" && matches!(req.path.as_str(), "/health" | "/metrics");
        if !probe {
            self.record(req);
        }
        let keep_alive = req.keep_alive;
        match (req.method.as_str(), req.path.as_str()) {
            ("POST", "/v1/chat/completions") => self.completion(req, Kind::Chat, wr).await,
            ("POST", "/v1/completions") => self.completion(req, Kind::Text, wr).await,
            ("POST", "/v1/messages") => self.completion(req, Kind::Messages, wr).await,
            ("POST", "/v1/responses") => self.completion(req, Kind::Responses, wr).await,
            ("GET", "/v1/models") => {
                let body = json!({
                    "object": "list",
                    "data": [{
                        "id": self.cfg.name,
                        "object": "model",
                        "created": unix_now(),
                        "owned_by": "sim",
                    }],
                });
                http::write_response(wr, 200, JSON, body.to_string().as_bytes(), keep_alive)
                    .await?;
                Ok(true)
            }
            ("GET", "/health") if self.cfg.profile == Profile::Llamacpp => {
                let (status, body) = self.llama_health();
                http::write_response(wr, status, JSON, body.as_bytes(), keep_alive).await?;
                Ok(true)
            }
            ("GET", "/health") => {
                http::write_response(wr, self.health_status(), "", b"", keep_alive).await?;
                Ok(true)
            }
            ("GET", path) if self.profile_endpoint(path).is_some() => {
                let body = self.profile_endpoint(path).unwrap_or_default();
                http::write_response(wr, 200, JSON, body.to_string().as_bytes(), keep_alive)
                    .await?;
                Ok(true)
            }
            ("GET", "/metrics") => {
                let mut text = match self.cfg.profile {
                    Profile::Slots => self.metrics_text(),
                    Profile::Vllm => self.vllm_metrics(),
                    Profile::Sglang => self.sglang_metrics(),
                    Profile::Llamacpp => self.llamacpp_metrics(),
                };
                text.push_str(&self.sim_counters());
                http::write_response(
                    wr,
                    200,
                    "text/plain; version=0.0.4; charset=utf-8",
                    text.as_bytes(),
                    keep_alive,
                )
                .await?;
                Ok(true)
            }
            _ => {
                let message = format!("no route for {} {}", req.method, req.path);
                http::write_response(
                    wr,
                    404,
                    JSON,
                    &error_body("not_found", &message),
                    keep_alive,
                )
                .await?;
                Ok(true)
            }
        }
    }

    fn record(&self, req: &Request) {
        let entry = RecordedRequest {
            method: req.method.clone(),
            path: req.target.clone(),
            headers: req.headers.clone(),
            body: req.body.clone(),
        };
        let mut recorded = self.stats.recorded.lock();
        if recorded.len() >= RECORDED_LIMIT {
            let excess = recorded.len() + 1 - RECORDED_LIMIT;
            recorded.drain(..excess);
        }
        recorded.push(entry);
    }

    fn health_status(&self) -> u16 {
        match self.faults.health_status.load(Ordering::SeqCst) {
            0 if self.faults.health_down.load(Ordering::SeqCst) => 503,
            0 => 200,
            s if (200..=599).contains(&s) => s,
            // Not a status a client could take as a final response.
            _ => 500,
        }
    }

    fn metrics_text(&self) -> String {
        let model = escape_label(&self.cfg.name);
        let (usage, cached_blocks) = {
            let kv = self.kv.lock();
            (kv.usage(), kv.cached_blocks())
        };
        let load = |a: &AtomicUsize| a.load(Ordering::SeqCst) as f64;
        let count = |a: &AtomicU64| a.load(Ordering::SeqCst) as f64;
        let series: [(&str, &str, &str, f64); 9] = [
            (
                "vllm:num_requests_running",
                "gauge",
                "Number of requests in model execution batches.",
                load(&self.running),
            ),
            (
                "vllm:num_requests_waiting",
                "gauge",
                "Number of requests waiting to be processed.",
                load(&self.waiting),
            ),
            (
                "vllm:kv_cache_usage_perc",
                "gauge",
                "KV-cache usage. 1 means 100 percent usage.",
                usage,
            ),
            (
                "vllm:prompt_tokens_total",
                "counter",
                "Number of prefill tokens processed.",
                count(&self.prompt_tokens_total),
            ),
            (
                "vllm:generation_tokens_total",
                "counter",
                "Number of generation tokens processed.",
                count(&self.generation_tokens_total),
            ),
            (
                "vllm:prefix_cache_queries_total",
                "counter",
                "Prefix cache queries, in terms of number of queried tokens.",
                count(&self.prefix_cache_queries_total),
            ),
            (
                "vllm:prefix_cache_hits_total",
                "counter",
                "Prefix cache hits, in terms of number of cached tokens.",
                count(&self.prefix_cache_hits_total),
            ),
            (
                "sim:prefix_cache_blocks",
                "gauge",
                "Blocks in the simulated prefix cache, idle or in use.",
                cached_blocks as f64,
            ),
            (
                "sim:requests_total",
                "counter",
                "Completion requests received.",
                self.stats.requests.load(Ordering::SeqCst) as f64,
            ),
        ];
        let mut out = String::with_capacity(2048);
        for (name, kind, help, value) in series {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name}{{model_name=\"{model}\"}} {value}");
        }
        // vLLM's info gauge for its cache config: the value is always 1 and
        // the numbers are labels, from which a gateway derives KV capacity in
        // tokens (block_size x num_gpu_blocks). Like vLLM's it has no
        // model_name label. vLLM allocates whole blocks, so a capacity that
        // is not a multiple of the block size is reported rounded down.
        let block = self.cfg.block_tokens;
        let _ = writeln!(
            out,
            "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n\
             # TYPE vllm:cache_config_info gauge\n\
             vllm:cache_config_info{{block_size=\"{block}\",num_gpu_blocks=\"{}\"}} 1",
            self.cfg.kv_capacity_tokens / block
        );
        out
    }

    fn plan(&self, req: &Request, kind: Kind) -> Result<Plan, Refusal> {
        let invalid = |message: String| Refusal::invalid(kind, &message);
        let body: Value = serde_json::from_slice(&req.body)
            .map_err(|e| invalid(format!("request body is not valid JSON: {e}")))?;
        if !body.is_object() {
            return Err(invalid("request body must be a JSON object".into()));
        }
        let mut prompt = kv::prompt_bytes(kind, &body).map_err(invalid)?;
        let previous_response_id = match body.get("previous_response_id") {
            _ if kind != Kind::Responses => None,
            None | Some(Value::Null) => None,
            Some(Value::String(id)) => Some(id.clone()),
            Some(_) => return Err(invalid("`previous_response_id` must be a string".into())),
        };
        if let Some(id) = &previous_response_id {
            // As OpenAI's stateful API (and vLLM's): the earlier turn's
            // conversation, then this request's input; its `instructions`
            // are not carried over, and this request's stand only when it
            // starts a conversation.
            let earlier = self
                .responses
                .lock()
                .get(id)
                .ok_or_else(|| Refusal::unknown_response(id))?;
            let input = kv::prompt_bytes(kind, &without_instructions(&body)).map_err(invalid)?;
            prompt = [&earlier[..], &input[..]].concat();
        }
        let requested = self.requested_tokens(req, kind, &body).map_err(invalid)?;
        let gate = req
            .header("x-sim-gate")
            .map(str::to_string)
            .filter(|g| !g.is_empty());
        let number = |name| header_number(req, name).map_err(invalid);
        let paced = number("x-sim-frame-delay-ms")?;
        let frame_delay = paced.unwrap_or(self.cfg.decode_ms_per_token);
        let extra_ttft = number("x-sim-ttft-ms")?.unwrap_or(0);
        let decoy_usage = match kind {
            Kind::Chat | Kind::Text => number("x-sim-decoy-usage")?,
            Kind::Messages | Kind::Responses => None,
        };
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let prefix = match kind {
            Kind::Chat => "chatcmpl-",
            Kind::Text => "cmpl-",
            Kind::Messages => "msg_",
            Kind::Responses => "resp_",
        };
        let (max_tokens, cut) = requested.unwrap_or((self.cfg.default_max_tokens, false));
        Ok(Plan {
            kind,
            id: format!("{prefix}sim{}-{id}", self.addr.port()),
            created: unix_now(),
            // vLLM answers with the name it was asked for (it rejects others);
            // echoing it lets tests see what the gateway sent upstream.
            model: body
                .get("model")
                .and_then(Value::as_str)
                .unwrap_or(&self.cfg.name)
                .to_string(),
            prompt_tokens: kv::token_count(&prompt),
            prompt,
            max_tokens,
            // The default length stands for the model ending on its own; a
            // limit is what cut it short.
            finish_reason: if cut { "length" } else { "stop" },
            stream: body.get("stream").and_then(Value::as_bool).unwrap_or(false),
            include_usage: body
                .pointer("/stream_options/include_usage")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            frame_delay: Duration::from_millis(frame_delay),
            paced: paced.is_some(),
            extra_ttft: Duration::from_millis(extra_ttft),
            decoy_usage,
            gate,
            previous_response_id,
            store: kind == Kind::Responses
                && body.get("store").and_then(Value::as_bool).unwrap_or(true),
        })
    }

    /// The completion's length and whether a limit cut it: `x-sim-max-tokens`
    /// exactly; chat and completions the body's limit exactly (vLLM's
    /// precedence: the newer name wins); Messages (`max_tokens`, which
    /// every Anthropic request sets) and Responses (`max_output_tokens`) a
    /// limit on the default length, which cuts it only when it is shorter.
    fn requested_tokens(
        &self,
        req: &Request,
        kind: Kind,
        body: &Value,
    ) -> Result<Option<(usize, bool)>, String> {
        if let Some(n) = header_number(req, "x-sim-max-tokens")? {
            check_tokens(n)?;
            return Ok(Some((n as usize, true)));
        }
        let names: &[&str] = match kind {
            Kind::Chat | Kind::Text => &["max_completion_tokens", "max_tokens"],
            Kind::Messages => &["max_tokens"],
            Kind::Responses => &["max_output_tokens"],
        };
        let Some(v) = names
            .iter()
            .find_map(|k| body.get(*k).filter(|v| !v.is_null()))
        else {
            return Ok(None);
        };
        let n = v.as_u64().ok_or("max_tokens must be a positive integer")?;
        check_tokens(n)?;
        let n = n as usize;
        Ok(Some(match kind {
            Kind::Chat | Kind::Text => (n, true),
            Kind::Messages | Kind::Responses => {
                let natural = self.cfg.default_max_tokens;
                (n.min(natural), n <= natural)
            }
        }))
    }

    async fn completion<W: AsyncWrite + Unpin>(
        &self,
        req: &Request,
        kind: Kind,
        wr: &mut W,
    ) -> io::Result<bool> {
        self.stats.requests.fetch_add(1, Ordering::SeqCst);
        let _in_flight = InFlight::enter(&self.stats.in_flight);
        let keep_alive = req.keep_alive;
        while self.faults.stall.load(Ordering::SeqCst) {
            sleep(STALL_POLL).await;
        }
        if take_one(&self.faults.fail_next) {
            let body = error_body("internal_error", "simulated engine failure");
            http::write_response(wr, 500, JSON, &body, keep_alive).await?;
            return Ok(true);
        }
        if req.header("x-sim-echo") == Some("1") {
            http::write_response(wr, 200, "application/octet-stream", &req.body, keep_alive)
                .await?;
            return Ok(true);
        }
        let plan = match self.plan(req, kind).and_then(|plan| self.fits(plan)) {
            Ok(plan) => plan,
            Err(refusal) => {
                http::write_response(wr, refusal.status, JSON, &refusal.body, keep_alive).await?;
                return Ok(true);
            }
        };
        if !plan.stream {
            let Generated::Done { cached_tokens } = self.generate(&plan, wr, None).await? else {
                return Ok(false);
            };
            self.keep_response(&plan);
            let text = plan.text();
            let body = match kind {
                Kind::Chat | Kind::Text => {
                    let choice = if kind == Kind::Chat {
                        json!({
                            "index": 0,
                            "message": {"role": "assistant", "content": text},
                            "logprobs": null,
                            "finish_reason": plan.finish_reason,
                        })
                    } else {
                        json!({"index": 0, "text": text, "logprobs": null, "finish_reason": plan.finish_reason})
                    };
                    json!({
                        "id": plan.id,
                        "object": plan.object(),
                        "created": plan.created,
                        "model": plan.model,
                        "choices": [choice],
                        "usage": plan.usage(cached_tokens),
                    })
                }
                Kind::Messages => plan.messages_answer(cached_tokens),
                Kind::Responses => plan.responses_answer(cached_tokens),
            };
            http::write_response(wr, 200, JSON, body.to_string().as_bytes(), keep_alive).await?;
            return Ok(true);
        }

        let framing = if req.http10 {
            StreamFraming::UntilClose
        } else {
            StreamFraming::Chunked
        };
        // Headers go out before queueing and prefill, as vLLM's streaming
        // response does: time to first byte is not time to first token.
        http::write_stream_head(wr, "text/event-stream", framing, keep_alive).await?;
        let Generated::Done { cached_tokens } = self.generate(&plan, wr, Some(framing)).await?
        else {
            return Ok(false);
        };
        self.keep_response(&plan);
        let end = match kind {
            Kind::Chat | Kind::Text => None,
            Kind::Messages => Some(plan.messages_end()),
            Kind::Responses => Some(plan.responses_end(cached_tokens)),
        };
        if let Some(end) = end {
            // The typed APIs end with their closing events, no `[DONE]`.
            http::write_stream_chunk(wr, framing, &end).await?;
            http::write_stream_end(wr, framing).await?;
            return Ok(true);
        }
        if plan.include_usage {
            let frame = sse_frame(&json!({
                "id": plan.id,
                "object": plan.chunk_object(),
                "created": plan.created,
                "model": plan.model,
                "choices": [],
                "usage": plan.usage(cached_tokens),
            }));
            http::write_stream_chunk(wr, framing, &frame).await?;
        }
        http::write_stream_chunk(wr, framing, b"data: [DONE]\n\n").await?;
        http::write_stream_end(wr, framing).await?;
        // An HTTP/1.0 stream ends with the close, which the caller does
        // because such requests are never keep-alive.
        Ok(true)
    }

    /// A Responses turn, kept (unless the request said `store: false`) for
    /// a later `previous_response_id`: its conversation and its reply.
    fn keep_response(&self, plan: &Plan) {
        if plan.store {
            self.responses
                .lock()
                .put(plan.id.clone(), conversation(plan));
        }
    }

    /// Queues, prefills and decodes one sequence; with `framing`, each token
    /// is written to `wr` as its own chunk as soon as it exists.
    async fn generate<W: AsyncWrite + Unpin>(
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
        if !prefill.is_zero() {
            let _prefilling = Gauge::enter(&self.prefilling);
            sleep(prefill).await;
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
    fn fits(&self, plan: Plan) -> Result<Plan, Refusal> {
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
    async fn emit<W: AsyncWrite + Unpin>(
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

/// The conversation a request leaves behind: its prompt and its reply, as
/// the next turn's prompt starts (`kv::prompt_bytes`).
fn conversation(plan: &Plan) -> Vec<u8> {
    let mut bytes = plan.prompt.clone();
    kv::turn_text(&mut bytes, "assistant", &plan.text());
    bytes
}
