//! What a finished request leaves behind in the metrics. Runs in `logging`,
//! which Pingora calls on every path (local answer, connect failure, upstream
//! death, client gone).

use crate::clock::now_ms;
use crate::metrics::metrics;
use crate::proxy::ctx::RequestCtx;
use pingora::proxy::Session;

pub fn record(session: &Session, ctx: &RequestCtx) {
    let code = session
        .response_written()
        .map(|r| r.status.as_u16())
        .or(ctx.response.local_status)
        .unwrap_or(0);
    let m = metrics();
    let route = ctx.route_name();
    let peer = ctx.peer_name();
    m.requests
        .with_label_values(&[route, peer, status_label(code)])
        .inc();
    m.request_duration
        .with_label_values(&[route])
        .observe(ctx.started.elapsed().as_secs_f64());
    let Some(pipeline) = &ctx.response.pipeline else {
        return;
    };
    if let Some(u) = pipeline.usage() {
        if let (Some(sid), Some(route)) = (&ctx.request.session, &ctx.route) {
            // What the session now holds on its engine until its next turn.
            let context = u.prompt_tokens.saturating_add(u.completion_tokens);
            route
                .runtime
                .sessions
                .record_tokens(sid.hash, context, now_ms());
        }
        let labels = [route, peer];
        m.prompt_tokens
            .with_label_values(&labels)
            .inc_by(u.prompt_tokens);
        m.cached_prompt_tokens
            .with_label_values(&labels)
            .inc_by(u.cached_tokens);
        m.completion_tokens
            .with_label_values(&labels)
            .inc_by(u.completion_tokens);
    }
    if let Some(first) = pipeline.first_content_at() {
        m.ttft
            .with_label_values(&[route])
            .observe(first.saturating_duration_since(ctx.started).as_secs_f64());
    }
}

/// Status codes as label values without a per-request allocation.
fn status_label(code: u16) -> &'static str {
    static TEXT: std::sync::LazyLock<Vec<String>> =
        std::sync::LazyLock::new(|| (0u16..600).map(|c| c.to_string()).collect());
    TEXT.get(code as usize)
        .map(String::as_str)
        .unwrap_or("other")
}
