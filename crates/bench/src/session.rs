//! The session slots: each replays its sessions turn by turn over one
//! keep-alive connection, to the gateway or (reference cell) to the engine
//! the client placed the session on. In `forks`, a parent's task runs its
//! sub-agents as tasks of their own (each its own connection) and waits for
//! them; they stop with it.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::task::JoinSet;
use tokio::time::{sleep, sleep_until, timeout_at, Instant};

use crate::analysis;
use crate::client::{post_stream, Conn, Exchange};
use crate::conversation::Conversation;
use crate::ids::{IdVia, SessionIds, SESSION_HEADER};
use crate::record::Record;
use crate::reference::Placer;
use crate::router::engine_of_response_id;
use crate::workload::Workload;

const MODEL: &str = "sim-model";
/// Where the reference cell sends requests: the engines' own API (and a
/// router cell: a router serves the same path).
const DIRECT_PATH: &str = "/v1/chat/completions";
/// A request taking longer than this is an error, whatever the mode.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

/// Where a cell's requests go.
pub(crate) enum Target {
    /// One gateway, or replicas each request picks one of at random.
    Gateway {
        addrs: Vec<SocketAddr>,
        host: String,
        path: String,
        next: AtomicU64,
    },
    /// An external router (`--router-cmd`); `engines` to tell which one
    /// served a request from its response id.
    Router {
        addr: SocketAddr,
        engines: Vec<SocketAddr>,
    },
    /// The reference cell: straight to the engines, placed by the client.
    Direct {
        engines: Vec<SocketAddr>,
        placer: Placer,
    },
}

/// What the session tasks share.
pub(crate) struct Ctx {
    pub(crate) workload: Arc<Workload>,
    pub(crate) target: Target,
    /// How gateway requests name their session (`--session-id`).
    pub(crate) ids: SessionIds,
    pub(crate) start: Instant,
    pub(crate) end: Instant,
    pub(crate) hard_end: Instant,
    pub(crate) records: Mutex<Vec<Record>>,
    pub(crate) in_flight: AtomicU64,
}

/// A replica for the next request: uniform and independent of the session
/// (splitmix64 over a shared counter), as a front without affinity spreads.
fn pick(addrs: &[SocketAddr], next: &AtomicU64) -> SocketAddr {
    let mut z = next.fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    addrs[(z % addrs.len().max(1) as u64) as usize]
}

/// A session slot's way to the engines: its keep-alive connection (to the
/// gateway, or to the engine its session is bound to) and, in the reference
/// cell, that binding.
#[derive(Default)]
struct Route {
    conn: Option<(SocketAddr, Conn)>,
    engine: Option<usize>,
}

impl Route {
    /// The open connection to `addr`, or a new one.
    async fn connection(&mut self, addr: SocketAddr) -> std::io::Result<&mut Conn> {
        let conn = match self.conn.take() {
            Some((a, c)) if a == addr && !c.is_closed() => c,
            _ => Conn::connect(addr).await?,
        };
        Ok(&mut self.conn.insert((addr, conn)).1)
    }
}

impl Ctx {
    /// The slot's session ended (or the slot stopped): unbind it.
    fn end_session(&self, route: &mut Route) {
        if let (Target::Direct { placer, .. }, Some(e)) = (&self.target, route.engine.take()) {
            placer.unbind(e);
        }
    }

    /// Reference cell: a sub-agent starts bound to its parent's engine.
    fn inherit_engine(&self, route: &mut Route, engine: Option<usize>) {
        if let (Target::Direct { placer, .. }, Some(e)) = (&self.target, engine) {
            placer.bind(e);
            route.engine = Some(e);
        }
    }

    /// How a request of `session` names it: as `--session-id` says through
    /// the gateway or a router, not at all to the engines.
    fn id_via(&self, session: &str) -> IdVia {
        match self.target {
            Target::Gateway { .. } | Target::Router { .. } => self.ids.via(session),
            Target::Direct { .. } => IdVia::Nothing,
        }
    }

    /// One attempt at a turn: the exchange, whether its connection can be
    /// reused, and the engine that served it.
    async fn send(
        &self,
        route: &mut Route,
        session: &str,
        via: IdVia,
        body: &[u8],
        started: Instant,
        tenancy: Tenancy<'_>,
    ) -> Result<(Exchange, bool, Option<usize>), String> {
        let Tenancy {
            affinity,
            fairness_id,
        } = tenancy;
        // The id goes in a header only with `--session-id header` (the
        // body carries `prompt_cache_key` itself).
        let mut named = Vec::with_capacity(2);
        if via == IdVia::Header {
            named.push((SESSION_HEADER, session));
        }
        if let Some(tenant) = fairness_id {
            named.push((crate::scenario::FAIRNESS_HEADER, tenant));
        }
        let headers: &[(&str, &str)] = &named;
        match &self.target {
            Target::Gateway {
                addrs,
                host,
                path,
                next,
            } => {
                let addr = pick(addrs, next);
                let c = route
                    .connection(addr)
                    .await
                    .map_err(|e| format!("connect: {e}"))?;
                let (ex, reusable) = post_stream(c, host, path, headers, body, started).await;
                let engine = ex
                    .head
                    .as_ref()
                    .and_then(|h| h.header("x-routed-peer"))
                    .and_then(analysis::engine_index);
                Ok((ex, reusable, engine))
            }
            Target::Router { addr, engines } => {
                let c = route
                    .connection(*addr)
                    .await
                    .map_err(|e| format!("connect: {e}"))?;
                let host = addr.to_string();
                let (ex, reusable) =
                    post_stream(c, &host, DIRECT_PATH, headers, body, started).await;
                let engine = ex
                    .timer
                    .id
                    .as_deref()
                    .and_then(|id| engine_of_response_id(id, engines));
                Ok((ex, reusable, engine))
            }
            Target::Direct { engines, placer } => {
                // A refused connection re-places the session; each attempt
                // marks an engine down, so this tries every engine at most
                // about once.
                for _ in 0..engines.len() {
                    let e = match route.engine {
                        Some(e) => e,
                        None => {
                            let e = placer.place(Instant::now(), affinity).ok_or("no engines")?;
                            route.engine = Some(e);
                            e
                        }
                    };
                    let addr = *engines.get(e).ok_or("bound to an unknown engine")?;
                    let _in_flight = placer.start(e);
                    match route.connection(addr).await {
                        Ok(c) => {
                            let host = addr.to_string();
                            let (ex, reusable) =
                                post_stream(c, &host, DIRECT_PATH, &[], body, started).await;
                            return Ok((ex, reusable, Some(e)));
                        }
                        Err(err) if err.kind() == std::io::ErrorKind::ConnectionRefused => {
                            placer.refused(e, Instant::now());
                            self.end_session(route);
                        }
                        Err(err) => return Err(format!("connect e{e}: {err}")),
                    }
                }
                Err("connect: every engine refused the connection".into())
            }
        }
    }
}

/// One session as its task drives it: its way to the engines and what its
/// records need.
struct Driver {
    route: Route,
    /// The record's slot: the parent's slot, or a sub-agent's own.
    slot: u32,
    parent: Option<(u32, u32)>,
    inherited_tokens: Option<u64>,
    /// No turn of the session has succeeded yet.
    first: bool,
    last_peer: Option<String>,
    /// Prompt + completion of the last successful turn.
    last_tokens: Option<u64>,
}

impl Driver {
    fn new(slot: u32) -> Driver {
        Driver {
            route: Route::default(),
            slot,
            parent: None,
            inherited_tokens: None,
            first: true,
            last_peer: None,
            last_tokens: None,
        }
    }

    /// The slot's next session starts.
    fn next_session(&mut self) {
        self.first = true;
        self.last_peer = None;
        self.last_tokens = None;
    }
}

/// How an attempt at a turn went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sent {
    Ok,
    /// Recorded as an error; the input was taken back off the history.
    Failed,
    /// Still running at the hard end: the task stops.
    Cut,
}

/// Whose a request is: the engine the reference cell keeps its tenant on
/// (`shared-prefix`), and the tenant the gateway is told (`noisy-neighbor`).
#[derive(Debug, Clone, Copy)]
struct Tenancy<'a> {
    affinity: Option<usize>,
    fairness_id: Option<&'a str>,
}

impl Ctx {
    /// Sends the conversation as it stands (its last message is the turn's
    /// new input) and records the request; on success the reply joins the
    /// history, on failure the input leaves it, to be sent again.
    async fn send_turn(
        &self,
        d: &mut Driver,
        conv: &mut Conversation,
        max_tokens: u32,
        ends_session: bool,
    ) -> Sent {
        let via = self.id_via(&conv.id);
        let key = (via == IdVia::PromptCacheKey).then_some(conv.id.as_str());
        let body = conv.body(MODEL, max_tokens, key);
        let tenant = self
            .workload
            .tenant_of(d.slot, conv.generation)
            .map(|(tenant, _)| tenant);
        // The reference cell keeps each tenant's conversations on one engine.
        let affinity = tenant.map(|t| t as usize);
        let noisy = self
            .workload
            .params
            .noisy_neighbor
            .then(|| crate::scenario::noisy_tenant(d.slot));
        let tenant = tenant.or(noisy.map(|(t, _)| t));
        let started = Instant::now();
        let mut record = Record {
            slot: d.slot,
            generation: conv.generation,
            turn: conv.next_turn,
            session: conv.id.clone(),
            parent: d.parent,
            inherited_tokens: d.inherited_tokens,
            tenant,
            ends_session,
            id_via: via,
            start: started - self.start,
            first_of_session: d.first,
            ..Record::default()
        };
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        let deadline = (started + REQUEST_TIMEOUT).min(self.hard_end);
        let outcome = timeout_at(
            deadline,
            self.send(
                &mut d.route,
                &conv.id,
                via,
                &body,
                started,
                Tenancy {
                    affinity,
                    fairness_id: noisy.map(|(_, name)| name),
                },
            ),
        )
        .await;
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
        record.end = started.elapsed() + record.start;
        match outcome {
            Err(_) if Instant::now() >= self.hard_end => {
                record.cut = true;
                self.records.lock().push(record);
                return Sent::Cut;
            }
            Err(_) => {
                d.route.conn = None;
                record.error = Some(format!("no complete response in {REQUEST_TIMEOUT:?}"));
            }
            Ok(Err(e)) => {
                d.route.conn = None;
                record.error = Some(e);
            }
            Ok(Ok((ex, reusable, engine))) => {
                if !reusable {
                    d.route.conn = None;
                }
                record.engine = engine;
                if let Some(head) = &ex.head {
                    let header = |name: &str| head.header(name).map(str::to_string);
                    record.peer = header("x-routed-peer");
                    record.routed_mode = header("x-routed-mode");
                    record.routed_session = header("x-routed-session");
                    record.routed_source = header("x-routed-source");
                    record.queued_ms = head
                        .header("x-routed-queued-ms")
                        .and_then(|v| v.trim().parse().ok());
                }
                if matches!(self.target, Target::Direct { .. } | Target::Router { .. }) {
                    record.peer = engine.map(|e| format!("e{e}"));
                }
                record.ttft = ex.timer.first_content;
                record.decode_tok_per_s = ex.timer.decode_tok_per_s();
                record.usage = ex.timer.usage;
                record.error = ex.error;
                record.ok = record.error.is_none();
                if record.ok {
                    conv.push("assistant", ex.timer.content);
                }
            }
        }
        let sent = if record.ok {
            if !d.first {
                record.switched_peer = Some(record.peer != d.last_peer);
            }
            d.last_peer = record.peer.clone();
            d.last_tokens = record.usage.map(|u| u.prompt_tokens + u.completion_tokens);
            conv.next_turn += 1;
            d.first = false;
            Sent::Ok
        } else {
            // The turn is retried after the pause, as an agent would.
            conv.pop();
            Sent::Failed
        };
        self.records.lock().push(record);
        sent
    }
}

/// The pause after an attempt: the turn's think time, at least 200 ms
/// before a retry.
fn pause_after(sent: Sent, think: Duration) -> Duration {
    match sent {
        Sent::Ok => think,
        _ => think.max(Duration::from_millis(200)),
    }
}

/// One session slot: sessions one after another, each turn after the
/// previous reply and a think pause, until the cell's end.
pub(crate) async fn slot_task(ctx: Arc<Ctx>, slot: u32) {
    let mut driver = Driver::new(slot);
    run_slot(&ctx, slot, &mut driver).await;
    ctx.end_session(&mut driver.route);
}

async fn run_slot(ctx: &Arc<Ctx>, slot: u32, d: &mut Driver) {
    let w = Arc::clone(&ctx.workload);
    if w.params.quiet_alone && crate::scenario::noisy_tenant(slot).0 != 0 {
        return;
    }
    sleep_until(ctx.start + w.start_offset(slot)).await;
    let mut conv = w.initial_conversation(slot);
    // After a fork: the sub-agents' results, the next message.
    let mut results: Option<String> = None;
    // Forks so far in this slot, over its sessions.
    let mut spawns = 0u32;
    loop {
        if Instant::now() >= ctx.end {
            return;
        }
        let plan = w.turn(slot, conv.generation, conv.next_turn);
        let (role, input) = match &results {
            Some(r) => ("tool", r.clone()),
            None => ("user", plan.user),
        };
        let call = format!("call_fork{}", spawns.saturating_sub(1));
        if conv.next_turn > 0 && (w.finished(slot, &conv) || !w.room_for(slot, &conv, role, &input))
        {
            ctx.end_session(&mut d.route);
            conv = w.conversation(slot, conv.generation + 1);
            d.next_session();
            results = None;
            continue;
        }
        match role {
            // The sub-agents' results answer the reply's call.
            "tool" => conv.push_result(call, input),
            _ => conv.push(role, input),
        }
        let sent = ctx.send_turn(d, &mut conv, plan.max_tokens, false).await;
        if sent == Sent::Cut {
            return;
        }
        let pause = pause_after(sent, plan.think);
        if Instant::now() + pause >= ctx.end {
            return;
        }
        sleep(pause).await;
        if sent == Sent::Ok {
            results = None;
            if let Some(turns) = w.fork_after(slot, conv.generation, conv.next_turn - 1) {
                // The reply spawned the sub-agents: a tool call, as an agent
                // framework's task tool is one.
                conv.mark_call(format!("call_fork{spawns}"));
                results = Some(run_fork(ctx, slot, spawns, &conv, d, &turns).await);
                spawns += 1;
            }
        }
    }
}

/// A fork: the sub-agents of the parent in `slot`, each from the parent's
/// history as it stands, run at once; the parent waits for all of them and
/// gets their results back as its next message.
async fn run_fork(
    ctx: &Arc<Ctx>,
    slot: u32,
    spawn: u32,
    parent: &Conversation,
    d: &Driver,
    turns: &[u32],
) -> String {
    let w = &ctx.workload;
    let mut results: Vec<(String, Option<String>)> = Vec::with_capacity(turns.len());
    // Dropped with the parent's task, which stops its sub-agents with it.
    let mut agents = JoinSet::new();
    for (j, &n) in (0u32..).zip(turns) {
        let conv = w.subagent(parent, slot, spawn, j);
        results.push((conv.id.clone(), None));
        let mut sub = Driver::new(w.subagent_slot(slot, j));
        sub.parent = Some((slot, parent.generation));
        sub.inherited_tokens = d.last_tokens;
        let ctx = Arc::clone(ctx);
        let engine = d.route.engine;
        agents.spawn(async move {
            ctx.inherit_engine(&mut sub.route, engine);
            let reply = run_subagent(&ctx, &mut sub, conv, (slot, spawn, j), n).await;
            ctx.end_session(&mut sub.route);
            (j, reply)
        });
    }
    while let Some(done) = agents.join_next().await {
        if let Ok((j, reply)) = done {
            results[j as usize].1 = reply;
        }
    }
    w.fork_results(&results)
}

/// A sub-agent's turns (at most `turns`, fewer if its context fills or the
/// cell ends), each after the previous reply and a think pause; returns its
/// last reply.
/// `(parent_slot, spawn, agent)` name it as `Workload::subagent` does.
async fn run_subagent(
    ctx: &Ctx,
    d: &mut Driver,
    mut conv: Conversation,
    (parent_slot, spawn, agent): (u32, u32, u32),
    turns: u32,
) -> Option<String> {
    let w = &ctx.workload;
    let max_context = w.params.shape(parent_slot).max_context;
    let mut last = None;
    while conv.next_turn < turns && Instant::now() < ctx.end {
        let t = conv.next_turn;
        let plan = w.subagent_turn(parent_slot, spawn, agent, t);
        if !w.room_for(parent_slot, &conv, "user", &plan.user) {
            break;
        }
        conv.push("user", plan.user);
        let ends = t + 1 == turns || {
            let next = w.subagent_turn(parent_slot, spawn, agent, t + 1);
            conv.tokens_after_reply(plan.max_tokens as usize, "user", &next.user) > max_context
        };
        let sent = ctx.send_turn(d, &mut conv, plan.max_tokens, ends).await;
        match sent {
            Sent::Cut => break,
            Sent::Ok => {
                last = conv.last_content().map(str::to_string);
                if ends {
                    break;
                }
            }
            Sent::Failed => {}
        }
        let pause = pause_after(sent, plan.think);
        if Instant::now() + pause >= ctx.end {
            break;
        }
        sleep(pause).await;
    }
    last
}
