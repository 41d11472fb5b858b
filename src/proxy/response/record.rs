//! What a finished request leaves behind. Runs in `logging`, which Pingora
//! calls on every path (local answer, connect failure, upstream death,
//! client gone):
//!
//! - the metrics (requests, duration, tokens, TTFT);
//! - in the session table, the turn's end and, from the usage, the context
//!   the session now holds on its engine (`SessionTable::turn_ended`);
//! - a Responses answer's id, mapped to its session in the content index
//!   (and, when the route shares sessions, in Redis: [`share_response`]);
//! - from a 2xx stream's timing: the route's TTFT and decode-rate samples
//!   (`RouteProtection::count_stream`), the cost of a cold prompt
//!   (`RouteRuntime::cold_cost`), and the engine's own speeds
//!   (`PeerState::learn_first_token`, `learn_decode`), which placement's
//!   model reads.

use crate::clock::now_ms;
use crate::metrics::metrics;
use crate::protect::meter::StreamTiming;
use crate::proxy::ctx::RequestCtx;
use crate::registry::Route;
use crate::stream::ResponsePipeline;
use pingora::proxy::Session;

/// The status the client got: the written head's, or the local answer's
/// (0 when nothing was answered).
pub fn status_code(session: &Session, ctx: &RequestCtx) -> u16 {
    session
        .response_written()
        .map(|r| r.status.as_u16())
        .or(ctx.response.local_status)
        .unwrap_or(0)
}

/// What [`record`] measured of a finished request, handed on to the
/// access log so that both say the same.
#[derive(Debug, Clone, Copy)]
pub struct Ended {
    /// The status the client got (0: none).
    pub code: u16,
    /// From the request's arrival to now.
    pub elapsed: std::time::Duration,
    /// The response's usage, when the engine reported it.
    pub usage: Option<crate::stream::Usage>,
    /// From the request's arrival to its first content frame, as the
    /// `ttft` histogram observes it.
    pub ttft: Option<std::time::Duration>,
}

pub fn record(session: &Session, ctx: &RequestCtx) -> Ended {
    let pipeline = ctx.response.pipeline.as_ref();
    let ended = Ended {
        code: status_code(session, ctx),
        elapsed: ctx.started.elapsed(),
        usage: pipeline.and_then(|p| p.usage()),
        ttft: pipeline
            .and_then(|p| p.first_content_at())
            .map(|first| first.saturating_duration_since(ctx.started)),
    };
    count(ctx, &ended);
    ended
}

/// The metrics, the session's turn and what the stream taught.
fn count(ctx: &RequestCtx, ended: &Ended) {
    let Ended {
        code, usage, ttft, ..
    } = *ended;
    let route = ctx.route_name();
    let peer = ctx.peer_name();
    let elapsed = ended.elapsed.as_secs_f64();
    // The route's cached handles; a request no route took (404) has none.
    let Some(r) = &ctx.route else {
        let m = metrics();
        m.requests
            .with_label_values(&[route, peer, status_label(code)])
            .inc();
        m.request_duration
            .with_label_values(&[route])
            .observe(elapsed);
        return;
    };
    let handles = ctx.peer().map_or(&r.metrics.unplaced, |(_, p)| &p.metrics);
    handles
        .requests(route, peer, code, status_label(code))
        .inc();
    r.metrics.request_duration(route).observe(elapsed);
    if let (Some(sid), Some(_)) = (&ctx.request.session, ctx.request.placement) {
        // The turn is over, answered or not; with usage, what the session
        // now holds on its engine until its next turn.
        let context = usage.map(|u| u.prompt_tokens.saturating_add(u.completion_tokens));
        r.runtime.sessions.turn_ended(sid.hash, context, now_ms());
    }
    let Some(pipeline) = &ctx.response.pipeline else {
        return;
    };
    remember_response(r, ctx, pipeline, code);
    if let Some(u) = usage {
        if ctx.request.session.is_some() {
            use std::sync::atomic::Ordering::Relaxed;
            r.runtime.prompt_tokens.fetch_add(u.prompt_tokens, Relaxed);
            r.runtime.cached_tokens.fetch_add(u.cached_tokens, Relaxed);
        }
        handles.prompt_tokens(route, peer).inc_by(u.prompt_tokens);
        handles
            .cached_prompt_tokens(route, peer)
            .inc_by(u.cached_tokens);
        handles
            .completion_tokens(route, peer)
            .inc_by(u.completion_tokens);
    }
    if let Some(ttft) = ttft {
        r.metrics.ttft(route).observe(ttft.as_secs_f64());
    }
    measure_stream(ctx, pipeline, code);
}

/// The request's tenant pays what it used (`tenants::spent`: the usage,
/// else for a stream cut early its prompt and the frames it sent, else
/// nothing but the request) and gives back its place in flight. Called at
/// the stream's end and again in `logging` (for every other path); the
/// first call does it. On a route that releases its queue fairly, the
/// tenant's virtual counter there is charged what it was served, less
/// what the queue charged when it released it.
pub fn settle_tenant(ctx: &mut RequestCtx) {
    let admission = ctx.request.tenant_admission.take();
    let fair_charged = ctx.request.fair_charged.take();
    if admission.is_none() && fair_charged.is_none() {
        return;
    }
    let estimate = match &admission {
        Some(a) => a.estimate(),
        None => crate::proxy::request::body::estimated_tokens(&ctx.request.body),
    };
    let pipeline = ctx.response.pipeline.as_ref();
    // The engine computed the prompt if it began a 2xx answer, or took
    // the request and never answered (it may have died prefilling); an
    // error status it answered with says it did not.
    let engine_worked = ctx.upstream.sent_at.is_some() && !ctx.upstream.error_status;
    let spent = crate::tenants::spent(
        pipeline.and_then(ResponsePipeline::usage),
        engine_worked,
        estimate,
        pipeline.map_or(0, ResponsePipeline::content_events),
    );
    if let (Some(charged), Some(tag), Some(route)) = (fair_charged, &ctx.request.tenant, &ctx.route)
    {
        let served = crate::fair::Served {
            uncached_input: spent.input_tokens.saturating_sub(spent.cached_input_tokens),
            cached_input: spent.cached_input_tokens,
            output: spent.output_tokens,
        };
        let cost = served.cost(&crate::fair::TOKEN_WEIGHTS);
        route.runtime.queue.charge(tag, cost, charged);
    }
    if let Some(admission) = admission {
        admission.settle(spent, now_ms());
    }
}

/// What [`remember_response`] remembered, written for the other replicas
/// when the route shares its sessions (off the request path: the answer
/// is on its way to the client, and the next turn a think time away).
pub fn share_response(
    store: &std::sync::Arc<crate::store::SessionStore>,
    session: &Session,
    ctx: &RequestCtx,
) {
    let (Some(route), Some(sid), Some(pipeline)) =
        (&ctx.route, &ctx.request.session, &ctx.response.pipeline)
    else {
        return;
    };
    let Some(response) = pipeline.response_id_hash() else {
        return;
    };
    if store.redis().is_none() || !(200..300).contains(&status_code(session, ctx)) {
        return;
    }
    let (store, name, session_hash) = (
        std::sync::Arc::clone(store),
        route.name().to_string(),
        sid.hash,
    );
    let ttl = route.config.balancing.idle_timeout;
    tokio::spawn(async move {
        if let Some(redis) = store.redis() {
            redis.response_put(&name, response, session_hash, ttl).await;
        }
    });
}

/// A Responses API answer's id, mapped to the session of the turn it
/// answered: the next turn names it as `previous_response_id` and sends
/// only its new input, which no content match could place.
fn remember_response(route: &Route, ctx: &RequestCtx, pipeline: &ResponsePipeline, code: u16) {
    let (Some(sid), Some(response)) = (&ctx.request.session, pipeline.response_id_hash()) else {
        return;
    };
    if (200..300).contains(&code) {
        route
            .runtime
            .content
            .remember_response(response, sid.hash, now_ms());
    }
}

/// A 2xx stream's TTFT (request sent upstream → first content frame) and
/// decode rate feed the route's meter and the per-pool histograms. Errors
/// and non-stream answers are no samples: they say nothing about how fast
/// the engine starts and streams.
fn measure_stream(ctx: &RequestCtx, pipeline: &ResponsePipeline, code: u16) {
    let (Some(route), Some(sent)) = (&ctx.route, ctx.upstream.sent_at) else {
        return;
    };
    if !(200..300).contains(&code) || !pipeline.is_stream() {
        return;
    }
    let Some(first) = pipeline.first_content_at() else {
        return;
    };
    let timing = StreamTiming {
        ttft: Some(first.saturating_duration_since(sent)),
        decode: pipeline
            .last_content_at()
            .map(|last| last.saturating_duration_since(first)),
        completion_tokens: pipeline.usage().map(|u| u.completion_tokens),
        content_frames: pipeline.content_events(),
    };
    if let (Some(ttft), Some(new_tokens)) = (timing.ttft, uncached_prompt(ctx, pipeline)) {
        route.runtime.cold_cost.lock().observe(new_tokens, ttft);
        if let Some((_, p)) = ctx.peer().filter(|_| !ctx.upstream.speed_learned) {
            p.state
                .learn_first_token(new_tokens, ctx.upstream.backlog_ahead, ttft);
        }
    }
    if let (Some((_, p)), Some(decode)) = (ctx.peer(), timing.decode) {
        // The content frames when no usage came, as the decode-rate gate counts.
        let tokens = timing.completion_tokens.unwrap_or(timing.content_frames);
        p.state.learn_decode(tokens, decode);
    }
    let pool = pool_label(route, ctx.request.model.as_deref());
    let peer = ctx.peer_name();
    let cfg = &route.config.protection.meter;
    let tps = route
        .runtime
        .protection
        .count_stream(cfg, pool, peer, &timing, now_ms());
    let handles = ctx
        .peer()
        .map_or(&route.metrics.unplaced, |(_, p)| &p.metrics);
    if let Some(ttft) = timing.ttft {
        handles
            .ttft_by_pool(route.name(), pool, peer)
            .observe(ttft.as_secs_f64());
    }
    if let Some(tps) = tps {
        handles.decode_rate(route.name(), pool, peer).observe(tps);
    }
}

/// The part of the prompt the engine had to compute, where that is known,
/// in the unit placement weighs a waiting turn in: the body's size estimate
/// (`estimated_tokens`), so that a tokenizer denser or sparser than the
/// estimate cannot make waiting look cheaper or dearer than it is. Known
/// from the share the engine says it did not find cached, or as the whole
/// prompt of a turn placed where its conversation was not (an engine that
/// reports no cached tokens says nothing about a warm turn).
fn uncached_prompt(ctx: &RequestCtx, pipeline: &ResponsePipeline) -> Option<u64> {
    let estimated = crate::proxy::request::body::estimated_tokens(&ctx.request.body);
    if let Some(u) = pipeline.usage().filter(|u| u.cached_tokens > 0) {
        let new = u.prompt_tokens.saturating_sub(u.cached_tokens);
        let share = new as f64 / u.prompt_tokens.max(1) as f64;
        return Some((estimated as f64 * share) as u64);
    }
    ctx.request.placement?.kind.is_cold().then_some(estimated)
}

/// A cold prompt's first token teaches an engine not timed yet its
/// prefill speed at once, with the gateway's count of the prompt's tokens
/// not cached there; every other first token teaches it at the stream's
/// end, with the engine's own count. An engine's first answers finish
/// late, the slower the engine the later: a slow engine took 37 s to be
/// timed by its ends, and meanwhile was taken to be as fast as the others
/// and sent new sessions cold, seconds each (issue 42, shared-prefix f4).
pub fn learn_cold_start(ctx: &mut RequestCtx, cold_tokens: u64, first: std::time::Instant) {
    // A warm turn (most first tokens) leaves before the speed's lock.
    let Some(sent) = ctx.upstream.sent_at.filter(|_| cold_tokens > 0) else {
        return;
    };
    let Some((_, p)) = ctx
        .peer()
        .filter(|(_, p)| p.state.speed().prefill_us.is_none())
    else {
        return;
    };
    let ttft = first.saturating_duration_since(sent);
    p.state
        .learn_first_token(cold_tokens, ctx.upstream.backlog_ahead, ttft);
    ctx.upstream.speed_learned = true;
}

/// The model pool a request was placed in, `"_"` for a route without pools.
pub fn pool_label<'a>(route: &Route, model: Option<&'a str>) -> &'a str {
    if route.config.peers_by_model.is_empty() {
        return "_";
    }
    model.unwrap_or("_")
}

/// Status codes as label values without a per-request allocation.
fn status_label(code: u16) -> &'static str {
    static TEXT: std::sync::LazyLock<Vec<String>> =
        std::sync::LazyLock::new(|| (0u16..600).map(|c| c.to_string()).collect());
    TEXT.get(code as usize)
        .map(String::as_str)
        .unwrap_or("other")
}
