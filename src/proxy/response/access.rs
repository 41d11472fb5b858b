//! What a finished request was, built once in `logging` from the
//! request's context and what `record` measured (`Ended`): the access-log
//! line (`accesslog/`) and, for a request whose span is exported, its
//! OpenTelemetry span (`otlp/`), made from the same line. Both are queued
//! without waiting. With neither configured (or the request not sampled
//! and no access log) this is one branch.

use super::record::Ended;
use crate::accesslog::line::{millis, Line};
use crate::accesslog::AccessLog;
use crate::otlp::span::Timeline;
use crate::otlp::Exporter;
use crate::proxy::ctx::RequestCtx;
use crate::proxy::guards::auth;
use crate::registry::Registry;
use crate::trace_context::{TraceContext, TRACESTATE};
use pingora::proxy::Session;
use std::borrow::Cow;

pub fn emit(
    access_log: Option<&AccessLog>,
    exporter: Option<&Exporter>,
    registry: &Registry,
    session: &Session,
    ctx: &RequestCtx,
    ended: &Ended,
) {
    let traced = exporter
        .filter(|_| ctx.phases.on)
        .zip(ctx.ids.as_ref().and_then(|i| i.trace.as_ref()));
    if access_log.is_none() && traced.is_none() {
        return;
    }
    let line = summary(access_log.is_some(), registry, session, ctx, ended);
    if let Some((exporter, trace)) = traced {
        let span =
            crate::otlp::span::build(&line, trace, trace_state(session, trace), &timeline(ctx));
        exporter.enqueue(span);
    }
    if let Some(access_log) = access_log {
        access_log.enqueue(line.to_bytes());
    }
}

/// The request as both sinks see it; `timed`: with what only the access
/// log writes, the wall-clock time and the trace id as text (the span has
/// its own times, in nanoseconds, and the id as a number).
fn summary<'a>(
    timed: bool,
    registry: &Registry,
    session: &'a Session,
    ctx: &'a RequestCtx,
    ended: &Ended,
) -> Line<'a> {
    let req = session.req_header();
    let ids = ctx.ids.as_ref();
    let admitted = &ctx.request;
    let placement = admitted.placement.filter(|_| ctx.upstream.count > 0);
    let peer = ctx.peer();
    let path = match (&ctx.route, admitted.route_stripped) {
        (Some(route), true) => {
            let (name, rest) = (route.name(), req.uri.path());
            let mut whole = String::with_capacity(1 + name.len() + rest.len());
            whole.push('/');
            whole.push_str(name);
            whole.push_str(rest);
            Cow::Owned(clip(&whole, MAX_PATH_BYTES).to_string())
        }
        _ => Cow::Borrowed(clip(req.uri.path(), MAX_PATH_BYTES)),
    };
    Line {
        time: if timed {
            humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string()
        } else {
            String::new()
        },
        request_id: ids.map_or("-", |i| i.request_id_str()),
        // The span has the id as a number.
        trace_id: ids
            .and_then(|i| i.trace.as_ref())
            .filter(|_| timed)
            .map(|t| t.trace_id_hex()),
        method: req.method.as_str(),
        path,
        route: ctx.route.as_ref().map(|r| r.name()),
        status: ended.code,
        peer: peer.map(|(_, p)| p.config.name.as_str()),
        peer_addr: peer.and_then(|(_, p)| p.addr).map(addr_text),
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
    }
}

/// `host:port`, as `SocketAddr`'s `Display` writes it. An IPv4 address
/// (most engines) is written digit by digit: through the formatting
/// machinery it cost every logged or traced request 1.6 k instructions
/// (`benches/instructions.sh`, callgrind).
fn addr_text(addr: std::net::SocketAddr) -> String {
    let std::net::SocketAddr::V4(v4) = addr else {
        return addr.to_string();
    };
    let mut out = String::with_capacity(21);
    let mut digits = itoa::Buffer::new();
    for (i, octet) in v4.ip().octets().into_iter().enumerate() {
        if i > 0 {
            out.push('.');
        }
        out.push_str(digits.format(octet));
    }
    out.push(':');
    out.push_str(digits.format(v4.port()));
    out
}

/// The client's `tracestate`, which goes with the trace it continues; at
/// most 512 bytes, the most W3C asks a participant to pass on.
fn trace_state<'a>(session: &'a Session, trace: &TraceContext) -> &'a str {
    if !trace.continued() {
        return "";
    }
    let mut given = session.req_header().headers.get_all(TRACESTATE).iter();
    match (given.next(), given.next()) {
        (Some(value), None) => value.to_str().map_or("", |t| clip(t, 512)),
        _ => "",
    }
}

/// When the request's phases ended, for its span.
fn timeline(ctx: &RequestCtx) -> Timeline {
    let pipeline = ctx.response.pipeline.as_ref();
    let phases = &ctx.phases;
    Timeline {
        started: ctx.started,
        body_read: phases.body_read,
        gated: phases.gated,
        placed: phases.placed,
        connecting: phases.connecting,
        sent: ctx.upstream.sent_at,
        engine_head: phases.engine_head,
        first_token: pipeline.and_then(|p| p.first_content_at()),
        last_token: pipeline.and_then(|p| p.last_content_at()),
        ended: std::time::Instant::now(),
        ended_unix_nanos: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)),
    }
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
    use super::{addr_text, clip};

    #[test]
    fn an_address_is_written_as_its_display_writes_it() {
        for addr in [
            "10.0.0.1:8000",
            "255.255.255.255:65535",
            "0.0.0.0:0",
            "[::1]:8080",
        ] {
            let parsed: std::net::SocketAddr = addr.parse().unwrap();
            assert_eq!(addr_text(parsed), parsed.to_string());
            assert_eq!(addr_text(parsed), addr);
        }
    }

    #[test]
    fn long_text_is_cut_at_a_character_boundary_and_short_text_kept() {
        assert_eq!(clip("model-name", 256), "model-name");
        assert_eq!(clip(&"a".repeat(300), 256).len(), 256);
        // A two-byte character across the limit is left out whole.
        let s = format!("{}é", "a".repeat(255));
        assert_eq!(clip(&s, 256), "a".repeat(255));
    }
}
