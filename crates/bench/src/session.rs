//! The session slots: each replays its sessions turn by turn over one
//! keep-alive connection, to the gateway or (reference cell) to the engine
//! the client placed the session on.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::{sleep, sleep_until, timeout_at, Instant};

use crate::analysis;
use crate::client::{post_stream, Conn, Exchange};
use crate::record::Record;
use crate::reference::Placer;
use crate::workload::Workload;

const MODEL: &str = "sim-model";
/// Where the reference cell sends requests: the engines' own API.
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

    /// One attempt at a turn: the exchange, whether its connection can be
    /// reused, and the engine that served it.
    async fn send(
        &self,
        route: &mut Route,
        session: &str,
        body: &[u8],
        started: Instant,
    ) -> Result<(Exchange, bool, Option<usize>), String> {
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
                let (ex, reusable) =
                    post_stream(c, host, path, &[("x-session-id", session)], body, started).await;
                let engine = ex
                    .head
                    .as_ref()
                    .and_then(|h| h.header("x-routed-peer"))
                    .and_then(analysis::engine_index);
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
                            let e = placer.place(Instant::now()).ok_or("no engines")?;
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

/// One session slot: sessions one after another, each turn after the
/// previous reply and a think pause, until the cell's end.
pub(crate) async fn slot_task(ctx: Arc<Ctx>, slot: u32) {
    let mut route = Route::default();
    run_slot(&ctx, slot, &mut route).await;
    ctx.end_session(&mut route);
}

async fn run_slot(ctx: &Ctx, slot: u32, route: &mut Route) {
    let w = Arc::clone(&ctx.workload);
    sleep_until(ctx.start + w.start_offset(slot)).await;
    let mut conv = w.initial_conversation(slot);
    let mut last_peer: Option<String> = None;
    let mut first = true;
    loop {
        if Instant::now() >= ctx.end {
            return;
        }
        let plan = w.turn(slot, conv.generation, conv.next_turn);
        if !w.fits(slot, &conv, &plan) {
            ctx.end_session(route);
            conv = w.conversation(slot, conv.generation + 1);
            last_peer = None;
            first = true;
            continue;
        }
        conv.push("user", plan.user);
        let body = conv.body(MODEL, plan.max_tokens);
        let started = Instant::now();
        let mut record = Record {
            slot,
            generation: conv.generation,
            turn: conv.next_turn,
            start: started - ctx.start,
            first_of_session: first,
            ..Record::default()
        };
        ctx.in_flight.fetch_add(1, Ordering::Relaxed);
        let deadline = (started + REQUEST_TIMEOUT).min(ctx.hard_end);
        let outcome = timeout_at(deadline, ctx.send(route, &conv.id, &body, started)).await;
        ctx.in_flight.fetch_sub(1, Ordering::Relaxed);
        record.end = started.elapsed() + record.start;
        match outcome {
            Err(_) if Instant::now() >= ctx.hard_end => {
                record.cut = true;
                ctx.records.lock().push(record);
                return;
            }
            Err(_) => {
                route.conn = None;
                record.error = Some(format!("no complete response in {REQUEST_TIMEOUT:?}"));
            }
            Ok(Err(e)) => {
                route.conn = None;
                record.error = Some(e);
            }
            Ok(Ok((ex, reusable, engine))) => {
                if !reusable {
                    route.conn = None;
                }
                record.engine = engine;
                if let Some(head) = &ex.head {
                    record.peer = head.header("x-routed-peer").map(str::to_string);
                    record.routed_mode = head.header("x-routed-mode").map(str::to_string);
                    record.queued_ms = head
                        .header("x-routed-queued-ms")
                        .and_then(|v| v.trim().parse().ok());
                }
                if matches!(ctx.target, Target::Direct { .. }) {
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
        if record.ok {
            if !first {
                record.switched_peer = Some(record.peer != last_peer);
            }
            last_peer = record.peer.clone();
            conv.next_turn += 1;
            first = false;
        } else {
            // The turn is retried after the pause, as an agent would.
            conv.pop();
        }
        let failed = !record.ok;
        ctx.records.lock().push(record);
        let pause = if failed {
            plan.think.max(Duration::from_millis(200))
        } else {
            plan.think
        };
        if Instant::now() + pause >= ctx.end {
            return;
        }
        sleep(pause).await;
    }
}
