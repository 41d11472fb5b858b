//! The access-log line of a finished request, built in `logging` from the
//! request's context and what `record` measured (`Ended`), and queued
//! without waiting (`accesslog/`). With no access log configured this is
//! one branch.

use super::record::Ended;
use crate::accesslog::line::{millis, Line};
use crate::accesslog::AccessLog;
use crate::proxy::ctx::RequestCtx;
use crate::proxy::guards::auth;
use crate::registry::Registry;
use pingora::proxy::Session;

pub fn emit(
    access_log: Option<&AccessLog>,
    registry: &Registry,
    session: &Session,
    ctx: &RequestCtx,
    ended: &Ended,
) {
    let Some(access_log) = access_log else {
        return;
    };
    let req = session.req_header();
    let ids = ctx.ids.as_ref();
    let admitted = &ctx.request;
    let placement = admitted.placement.filter(|_| ctx.upstream.count > 0);
    let peer = ctx.peer();
    let path = match (&ctx.route, admitted.route_stripped) {
        (Some(route), true) => {
            std::borrow::Cow::Owned(format!("/{}{}", route.name(), req.uri.path()))
        }
        _ => std::borrow::Cow::Borrowed(req.uri.path()),
    };
    let line = Line {
        time: humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string(),
        request_id: ids.map_or("-", |i| i.request_id_str()),
        trace_id: ids.and_then(|i| i.trace.as_ref()).map(|t| t.trace_id_hex()),
        method: req.method.as_str(),
        path: clip(&path, MAX_PATH_BYTES),
        route: ctx.route.as_ref().map(|r| r.name()),
        status: ended.code,
        peer: peer.map(|(_, p)| p.config.name.as_str()),
        peer_addr: peer.and_then(|(_, p)| p.addr).map(|a| a.to_string()),
        // As `X-Routed-Mode` says it (`headers::insert_routed`).
        mode: placement.map_or("local", |p| p.kind.as_str()),
        reason: placement.and_then(|p| p.reason).map(|r| r.as_str()),
        session: admitted.session.as_ref().map(|s| s.hex()),
        session_source: admitted.session.as_ref().map(|s| s.source.as_str()),
        // Looked up again (the key check keeps no owner on the context, to
        // spare every request the copy), only when the log is on.
        owner: ctx
            .route
            .as_ref()
            .and_then(|r| auth::owner(r, registry, session)),
        model: admitted.model.as_deref().map(|m| clip(m, MAX_MODEL_BYTES)),
        prompt_tokens: ended.usage.map(|u| u.prompt_tokens),
        cached_tokens: ended.usage.map(|u| u.cached_tokens),
        completion_tokens: ended.usage.map(|u| u.completion_tokens),
        ttft_ms: ended.ttft.map(millis),
        duration_ms: millis(ended.elapsed),
        queue_ms: admitted.queued.map(millis),
        bytes_out: session.body_bytes_sent(),
        retries: ctx.upstream.count.saturating_sub(1),
        error: ctx.response.error,
    };
    access_log.enqueue(line.to_bytes());
}

/// What one line keeps of the client's path and model name: the queue is
/// bounded in lines, and a client's 64 KiB path or megabyte model name
/// made each of 8192 queued lines that large while the writer stalled
/// (the review of issue 44).
const MAX_PATH_BYTES: usize = 2048;
const MAX_MODEL_BYTES: usize = 256;

/// `text` cut to at most `max` bytes, at a character boundary.
fn clip(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod clip_tests {
    use super::clip;

    #[test]
    fn long_text_is_cut_at_a_character_boundary_and_short_text_kept() {
        assert_eq!(clip("model-name", 256), "model-name");
        assert_eq!(clip(&"a".repeat(300), 256).len(), 256);
        // A two-byte character across the limit is left out whole.
        let s = format!("{}é", "a".repeat(255));
        assert_eq!(clip(&s, 256), "a".repeat(255));
    }
}
