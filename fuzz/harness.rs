//! Fuzz harnesses: one function per `cargo fuzz` target. Each
//! `fuzz/fuzz_targets/<name>.rs` calls the function of its name, and
//! `tests/fuzz_corpus.rs` includes this same file to run every committed
//! corpus input and crash reproducer through it under plain `cargo test`,
//! so what the fuzzer once found stays found.
//!
//! A harness takes the fuzzer's raw bytes, drives the library's real entry
//! points (nothing here reimplements what it tests, except the small
//! reference models named as such), and panics — a finding — when a
//! property the code documents does not hold. Inputs that carry more than
//! one thing (rules and a body, settings and a stream) are cut at the first
//! NUL byte or by a short binary prefix, so seeds stay readable.

// Each fuzz target uses one function of this file.
#![allow(dead_code)]

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue};
use llm_gateway::api::Api;
use llm_gateway::bodylog::frame::{self, Frame, HeadTail};
use llm_gateway::bodylog::{record, redact};
use llm_gateway::config::{catalog, GatewayConfig, Overrides, RouteConfig};
use llm_gateway::protect::prio::{self, Turn};
use llm_gateway::reject::{rejection_body, RequestFacts, RuleSet};
use llm_gateway::request_view::{as_str, member, RequestView};
use llm_gateway::rewrite;
use llm_gateway::rewrite::include_usage::inject_include_usage;
use llm_gateway::session::extract::{extract_session, SessionId};
use llm_gateway::store::binding::StoredBinding;
use llm_gateway::stream::pipeline::{BodyKind, ResponsePipeline};
use llm_gateway::stream::postprocess::{rewrite_json, rewrite_sse_event, Handler};
use llm_gateway::stream::sse::event_data;
use llm_gateway::stream::usage::{frame_without_usage, is_usage_only_event};
use serde_json::Value;
use std::path::Path;
use std::sync::OnceLock;

/// One target's harness: panics on a finding.
pub type Harness = fn(&[u8]);

/// Every target, by name (the directory names under `fuzz/corpus/` and
/// `fuzz/regressions/`).
pub const TARGETS: &[(&str, Harness)] = &[
    ("config_route", config_route),
    ("config_gateway", config_gateway),
    ("request_body", request_body),
    ("reject_rules", reject_rules),
    ("sse_pipeline", sse_pipeline),
    ("prio_header", prio_header),
    ("bodylog_frame", bodylog_frame),
    ("store_binding", store_binding),
];

/// The bytes before the first NUL and those after it (all of `data` and
/// nothing when there is none).
fn split_nul(data: &[u8]) -> (&[u8], &[u8]) {
    match data.iter().position(|&b| b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[]),
    }
}

/// The gateway every route is parsed under: an empty `gateway.yaml`.
fn gateway() -> &'static GatewayConfig {
    static GATEWAY: OnceLock<GatewayConfig> = OnceLock::new();
    GATEWAY.get_or_init(|| {
        GatewayConfig::parse(Path::new("gateway.yaml"), "", &Overrides::default())
            .expect("an empty gateway.yaml is valid")
    })
}

const MINIMAL_ROUTE: &str = "peers:\n  - {name: a, host: 127.0.0.1, port: 8001}\n";

// ---------------------------------------------------------------- config

/// A route file: `RouteConfig::parse`, then everything `/_route_opts`
/// derives from the parsed route (the catalog indexes peers by the model
/// pools' indices, so a bad index would panic there).
pub fn config_route(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let path = Path::new("routes/fuzz.yaml");
    let parsed = RouteConfig::parse("fuzz", path, text, gateway());
    // Parsing is a function of the text alone: a reload compares the new
    // config with the old one to tell a changed route from an unchanged one.
    assert_eq!(
        parsed,
        RouteConfig::parse("fuzz", path, text, gateway()),
        "parse is deterministic"
    );
    let route = match parsed {
        Ok(route) => route,
        Err(e) => {
            let _ = e.to_string();
            return;
        }
    };
    for (model, pool) in &route.peers_by_model {
        for &i in pool {
            assert!(i < route.peers.len(), "pool {model:?} names peer {i}");
        }
    }
    assert_eq!(
        route.reject_rules.len() + route.reject_rule_errors.len(),
        route.reject_rules.configured(),
        "every configured rule is compiled or reported"
    );
    let values = catalog::values(&route);
    for option in catalog::ROUTE_OPTIONS {
        let _ = catalog::option_json(option, &values, &route.keys_set);
    }
    let prio = &route.protection.session_prio;
    if prio.enabled {
        assert!(prio::validate_table(&prio.table).is_ok(), "table validated");
    }
}

/// `gateway.yaml`: `GatewayConfig::parse`; any gateway it accepts must
/// serve a minimal route file.
pub fn config_gateway(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let path = Path::new("gateway.yaml");
    let parsed = GatewayConfig::parse(path, text, &Overrides::default());
    let again = GatewayConfig::parse(path, text, &Overrides::default());
    assert_eq!(format!("{parsed:?}"), format!("{again:?}"), "deterministic");
    let gateway = match parsed {
        Ok(gateway) => gateway,
        Err(e) => {
            let _ = e.to_string();
            return;
        }
    };
    assert!((1..=1024).contains(&gateway.threads));
    assert!(gateway.client_idle_timeout.as_secs() >= 1);
    if let Err(e) = RouteConfig::parse(
        "chat",
        Path::new("routes/chat.yaml"),
        MINIMAL_ROUTE,
        &gateway,
    ) {
        panic!("a valid gateway refuses the minimal route: {e}");
    }
}

// ---------------------------------------------------------------- request

/// Request headers from the part before the NUL: one per line,
/// `name: value`; a line `+name` makes `name` a configured session header.
fn headers_of(text: &[u8]) -> (HeaderMap, Vec<HeaderName>) {
    let mut headers = HeaderMap::new();
    let mut configured = Vec::new();
    for line in text.split(|&b| b == b'\n') {
        if let Some(name) = line.strip_prefix(b"+") {
            if let Ok(name) = HeaderName::from_bytes(name) {
                configured.push(name);
            }
            continue;
        }
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            continue;
        };
        let value = &line[colon + 1..];
        let value = value.strip_prefix(b" ").unwrap_or(value);
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(&line[..colon]),
            HeaderValue::from_bytes(value),
        ) {
            headers.append(name, value);
        }
    }
    (headers, configured)
}

/// A request body (after optional headers and a NUL): the view, session
/// extraction, the include_usage rewrite, the prefix transforms and the
/// body log's redaction, each against what it promises.
pub fn request_body(data: &[u8]) {
    let (head, body) = match data.iter().position(|&b| b == 0) {
        Some(_) => split_nul(data),
        None => (&[][..], data),
    };
    let (headers, configured) = headers_of(head);
    let full: Option<Value> = serde_json::from_slice(body).ok();
    let view = RequestView::parse(body);
    // request_view.rs: skipping still checks the body is valid JSON, nested
    // no deeper than a full parse allows. The reject rules' full parse
    // must accept every body the view accepted, or rules are skipped.
    assert_eq!(
        view.is_ok(),
        full.as_ref().is_some_and(Value::is_object),
        "the view accepts exactly the JSON objects a full parse accepts: {view:?}"
    );

    check_pieces(data, body, view.as_ref().ok());

    let session = extract_session(&headers, &configured, view.as_ref().ok());
    if let Some(id) = &session {
        if let Some(name) = id.source.header_name() {
            assert!(headers.contains_key(name), "{name} was sent");
        }
    }
    if let (Ok(view), Some(full)) = (&view, &full) {
        check_body_session(view, full);
        check_include_usage(body, view, full);
    }
    for opts in [
        rewrite::Options {
            cch_strip: true,
            kimi_normalize: false,
        },
        rewrite::Options {
            cch_strip: false,
            kimi_normalize: true,
        },
        rewrite::Options {
            cch_strip: true,
            kimi_normalize: true,
        },
    ] {
        check_rewrite(body, opts, full.is_some(), view.as_ref().ok());
    }
    check_redaction(body, view.as_ref().ok());
}

/// What the session of a body with no headers must be, from the fully
/// parsed tree: a reference model of the order in `session/extract.rs`.
/// `None` when the model cannot tell (an embedded `user_id` that only a
/// lenient parse reads).
fn model_session(body: &Value) -> Option<Option<(u64, &'static str)>> {
    fn usable(value: &Value) -> Option<u64> {
        let text = match value {
            Value::String(s) => s.trim().to_string(),
            Value::Number(n) => n.to_string(),
            _ => return None,
        };
        let ok = !text.is_empty() && text.len() <= 1024;
        ok.then(|| llm_gateway::hash::stable_hash64(text.as_bytes()))
    }
    let metadata = body.get("metadata").filter(|m| m.is_object());
    let field = |v: Option<&Value>, name: &str| v.and_then(|v| v.get(name)).cloned();
    if let Some(h) = field(metadata, "session_id").as_ref().and_then(usable) {
        return Some(Some((h, "body:metadata.session_id")));
    }
    let litellm = body.get("litellm_metadata").filter(|m| m.is_object());
    if let Some(h) = field(litellm, "session_id").as_ref().and_then(usable) {
        return Some(Some((h, "body:litellm_metadata.session_id")));
    }
    let user_id = field(metadata, "user_id");
    let embedded = match &user_id {
        Some(Value::Object(o)) => o.get("session_id").cloned(),
        Some(Value::String(s)) if s.trim().starts_with('{') && s.trim().len() <= 16 * 1024 => {
            match serde_json::from_str::<Value>(s.trim()) {
                Ok(Value::Object(o)) => o.get("session_id").cloned(),
                Ok(_) => None,
                Err(_) => return None,
            }
        }
        _ => None,
    };
    if let Some(h) = embedded.as_ref().and_then(usable) {
        return Some(Some((h, "body:metadata.user_id.session_id")));
    }
    if let Some(h) = user_id.as_ref().and_then(usable) {
        return Some(Some((h, "body:metadata.user_id")));
    }
    if let Some(h) = body.get("user").and_then(usable) {
        return Some(Some((h, "body:user")));
    }
    Some(None)
}

fn body_session(view: &RequestView) -> Option<SessionId> {
    extract_session(&HeaderMap::new(), &[], Some(view))
}

/// The body cut in three where the input says (as Pingora's reads cut a
/// long one): the skim over the pieces answers only for a body the whole
/// reading accepts, with the same members (`proxy/request/pieces.rs`).
fn check_pieces(data: &[u8], body: &[u8], whole: Option<&RequestView>) {
    let seed = data
        .iter()
        .fold(0usize, |h, &b| h.wrapping_mul(31) ^ b as usize);
    let mut cuts = [seed % (body.len() + 1), (seed >> 16) % (body.len() + 1)];
    cuts.sort_unstable();
    let pieces = [
        Bytes::copy_from_slice(&body[..cuts[0]]),
        Bytes::copy_from_slice(&body[cuts[0]..cuts[1]]),
        Bytes::copy_from_slice(&body[cuts[1]..]),
    ];
    let Some(in_pieces) = RequestView::parse_pieces(&pieces) else {
        return;
    };
    let whole = whole.expect("the pieces were read as a body the whole reading refuses");
    let members = |v: &RequestView| {
        [
            v.model,
            v.stream,
            v.stream_options,
            v.metadata,
            v.litellm_metadata,
            v.user,
        ]
        .map(|m| m.map(|m| m.get().to_string()))
    };
    assert_eq!(members(&in_pieces), members(whole), "cut at {cuts:?}");
}

fn check_body_session(view: &RequestView, full: &Value) {
    let got = body_session(view);
    if let Some(want) = model_session(full) {
        let got = got.as_ref().map(|s| (s.hash, s.source.as_str()));
        assert_eq!(got, want, "the borrowed view and the parsed tree agree");
    }
}

/// include_usage: the output is the input with exactly
/// `stream_options.include_usage: true` set, and a second pass is a no-op.
fn check_include_usage(body: &[u8], view: &RequestView, full: &Value) {
    let Some(out) = inject_include_usage(body, view) else {
        return;
    };
    assert!(view.is_stream(), "only streaming requests are rewritten");
    let after: Value = serde_json::from_slice(&out).expect("include_usage output is JSON");
    let mut want = full.clone();
    want["stream_options"]["include_usage"] = Value::Bool(true);
    assert_eq!(after, want, "only stream_options.include_usage changes");
    let view2 = RequestView::parse(&out).expect("the rewritten body has a view");
    assert!(
        inject_include_usage(&out, &view2).is_none(),
        "include_usage is idempotent"
    );
    assert_eq!(body_session(view), body_session(&view2), "same session");
    assert_eq!(view.model(), view2.model(), "same model");
}

/// The raw text of the members the gateway routes and guards by.
fn routed_members(view: &RequestView) -> [Option<String>; 6] {
    let text = |v: Option<&serde_json::value::RawValue>| v.map(|v| v.get().to_string());
    [
        text(view.model),
        text(view.stream),
        text(view.stream_options),
        text(view.metadata),
        text(view.litellm_metadata),
        text(view.user),
    ]
}

/// cch_strip / kimi_normalize: JSON in gives JSON out, a second pass
/// changes nothing, only `system` / `messages` bytes move, and the preview
/// tells the same story as the rewrite.
fn check_rewrite(body: &[u8], opts: rewrite::Options, json_in: bool, view: Option<&RequestView>) {
    let applied = rewrite::apply(body, opts);
    let preview = rewrite::preview(body, opts);
    assert_eq!(
        preview["changed"],
        Value::Bool(applied.is_some()),
        "preview and apply agree ({opts:?})"
    );
    let Some(out) = applied else {
        return;
    };
    assert_eq!(preview["bytes_after"], out.body.len());
    assert_ne!(out.body, body, "a rewrite changes something");
    assert_eq!(
        serde_json::from_slice::<Value>(&out.body).is_ok(),
        json_in,
        "valid JSON in, valid JSON out ({opts:?})"
    );
    assert!(
        rewrite::apply(&out.body, opts).is_none(),
        "{opts:?} is idempotent: {}",
        String::from_utf8_lossy(&out.body)
    );
    if let Some(view) = view {
        let view2 = RequestView::parse(&out.body).expect("still one JSON object");
        assert_eq!(
            routed_members(view),
            routed_members(&view2),
            "only system and messages change"
        );
    }
}

/// The body log's redaction keeps a JSON object a JSON object and leaves
/// only `sid:` strings where the session ids were.
fn check_redaction(body: &[u8], view: Option<&RequestView>) {
    let redacted = redact::redact_session_ids(body);
    let Some(view) = view else {
        assert_eq!(&*redacted, body, "what is not an object is kept as is");
        return;
    };
    let view2 = RequestView::parse(&redacted).expect("a redacted body still parses");
    let sid = |v: Option<&serde_json::value::RawValue>| {
        if let Some(v) = v {
            assert!(
                as_str(v).is_some_and(|s| s.starts_with("sid:")),
                "left unredacted: {}",
                v.get()
            );
        }
    };
    sid(view2.metadata.and_then(|m| member(m, "session_id")));
    sid(view2.metadata.and_then(|m| member(m, "user_id")));
    sid(view2.litellm_metadata.and_then(|m| member(m, "session_id")));
    sid(view2.user);
    // The hash a redacted member carries is the one the session got, so a
    // record still correlates with its X-Routed-Session.
    if let Some(session) = body_session(view) {
        let at = match session.source.as_str() {
            "body:metadata.session_id" => view2.metadata.and_then(|m| member(m, "session_id")),
            "body:litellm_metadata.session_id" => {
                view2.litellm_metadata.and_then(|m| member(m, "session_id"))
            }
            "body:metadata.user_id.session_id" | "body:metadata.user_id" => {
                view2.metadata.and_then(|m| member(m, "user_id"))
            }
            "body:user" => view2.user,
            other => panic!("a body session from {other}"),
        };
        let want = format!("\"sid:{:016x}\"", session.hash);
        assert_eq!(
            at.map(|v| v.get()),
            Some(want.as_str()),
            "the redacted {} carries the session's hash",
            session.source
        );
    }
}

// ---------------------------------------------------------------- reject

/// Reject rules (YAML or JSON, before the NUL) compiled as a route file's
/// are, evaluated against the body after it.
pub fn reject_rules(data: &[u8]) {
    let (rules, body) = split_nul(data);
    let Ok(text) = std::str::from_utf8(rules) else {
        return;
    };
    let Ok(yaml) = serde_yaml::from_str::<serde_yaml::Value>(text) else {
        return;
    };
    // As config/route/sections.rs turns the route file's `reject_rules` into JSON.
    let Ok(rules) = serde_json::to_value(yaml) else {
        return;
    };
    let (set, errors) = RuleSet::compile(&rules);
    match &rules {
        Value::Array(items) => assert_eq!(set.len() + errors.len(), items.len()),
        Value::Null => assert!(set.is_empty() && errors.is_empty()),
        _ => assert!(set.is_empty() && errors.len() == 1),
    }
    let parsed = serde_json::from_slice::<Value>(body).unwrap_or(Value::Null);
    let mut matched = 0u64;
    // The parsed body, then (as for a body that does not parse) null: the
    // computed fields still work on the latter.
    for value in [&parsed, &Value::Null] {
        let facts = RequestFacts {
            body: value,
            raw_len: body.len(),
        };
        let first = set.evaluate(&facts).map(|r| r.name.clone());
        let again = set.evaluate(&facts).map(|r| {
            assert!((400..=599).contains(&r.status));
            let _ = rejection_body(r, "fuzz");
            r.name.clone()
        });
        assert_eq!(first, again, "evaluation is deterministic");
        matched += 2 * u64::from(first.is_some());
    }
    let hits: u64 = set
        .status_json()
        .as_array()
        .expect("a list")
        .iter()
        .map(|r| r["hits"].as_u64().expect("a count"))
        .sum();
    assert_eq!(hits, matched, "each match is counted once");
}

// ---------------------------------------------------------------- stream

/// A reference SSE splitter, as the spec reads (events end at a blank line,
/// `\n` or `\r\n`), written plainly: the complete events and the rest.
fn model_events(stream: &[u8]) -> (Vec<&[u8]>, &[u8]) {
    let mut events = Vec::new();
    let mut start = 0;
    let mut at = 0;
    for line in stream.split_inclusive(|&b| b == b'\n') {
        at += line.len();
        if line == b"\n" || line == b"\r\n" {
            events.push(&stream[start..at]);
            start = at;
        }
    }
    (events, &stream[start..])
}

/// What the response pipeline must send for `stream`, from the per-event
/// public functions: the complete events only, or all of it at the end.
fn model_output(
    kind: BodyKind,
    handler: Option<Handler>,
    drop_usage: bool,
    stream: &[u8],
    end: bool,
) -> Vec<u8> {
    if kind == BodyKind::Json {
        return match (handler, end) {
            (Some(_), false) => Vec::new(),
            (Some(h), true) => rewrite_json(h, stream).unwrap_or_else(|| stream.to_vec()),
            (None, _) => stream.to_vec(),
        };
    }
    if handler.is_none() && !drop_usage {
        return stream.to_vec();
    }
    let (mut events, rest) = model_events(stream);
    if end && !rest.is_empty() {
        events.push(rest);
    }
    let mut out = Vec::new();
    for event in events {
        if drop_usage && event_data(event).is_some_and(|d| is_usage_only_event(&d)) {
            // What the engine put beside the usage (llama.cpp's timings) stays.
            if let Some(rest) = event_data(event).and_then(|d| frame_without_usage(&d)) {
                let rest = [&b"data: "[..], &rest, b"\n\n"].concat();
                match handler.and_then(|h| rewrite_sse_event(h, &rest)) {
                    Some(new) => out.extend_from_slice(&new),
                    None => out.extend_from_slice(&rest),
                }
            }
            continue;
        }
        match handler.and_then(|h| rewrite_sse_event(h, event)) {
            Some(new) => out.extend_from_slice(&new),
            None => out.extend_from_slice(event),
        }
    }
    out
}

/// One pipeline run: the bytes each call sent, and the pipeline after.
fn run_pipeline(
    kind: BodyKind,
    handler: Option<Handler>,
    drop_usage: bool,
    chunks: &[&[u8]],
    end_with_last: bool,
) -> (Vec<Bytes>, ResponsePipeline) {
    let mut pipeline = ResponsePipeline::new(kind, handler, drop_usage);
    let mut sent = Vec::with_capacity(chunks.len() + 1);
    for (i, chunk) in chunks.iter().enumerate() {
        let last = i + 1 == chunks.len();
        sent.push(pipeline.push(chunk, end_with_last && last));
    }
    if !end_with_last || chunks.is_empty() {
        sent.push(pipeline.push(&[], true));
    }
    (sent, pipeline)
}

/// The response pipeline over a stream cut at fuzzer-chosen points.
///
/// Input: a flags byte (bits 0-1 handler: 1 strip_actual_usage,
/// 2 vllm_format, else none; bit 2 drop the usage frame; bit 3 a JSON body
/// instead of SSE; bit 4 end of stream with the last chunk instead of an
/// empty call after it), a count n (mod 16), n chunk lengths, the body.
pub fn sse_pipeline(data: &[u8]) {
    let [flags, count, rest @ ..] = data else {
        return;
    };
    let n = usize::from(count % 16).min(rest.len());
    let (lengths, stream) = rest.split_at(n);
    let handler = match flags & 3 {
        1 => Some(Handler::StripActualUsage),
        2 => Some(Handler::VllmFormat),
        _ => None,
    };
    let drop_usage = flags & 4 != 0;
    let kind = if flags & 8 != 0 {
        BodyKind::Json
    } else {
        BodyKind::Sse
    };
    let end_with_last = flags & 16 != 0;
    let mut chunks = Vec::with_capacity(n + 1);
    let mut at = 0;
    for &len in lengths {
        let end = (at + usize::from(len)).min(stream.len());
        chunks.push(&stream[at..end]);
        at = end;
    }
    chunks.push(&stream[at..]);

    let (sent, pipeline) = run_pipeline(kind, handler, drop_usage, &chunks, end_with_last);
    let out: Vec<u8> = sent.concat();

    // Chunk boundaries are where the engine's writes landed; they must
    // not change what the client gets or what the gateway reads.
    let (whole, single) = run_pipeline(kind, handler, drop_usage, &[stream], false);
    assert_eq!(
        out,
        whole.concat(),
        "the output does not depend on chunking"
    );
    assert_eq!(
        pipeline.usage(),
        single.usage(),
        "usage regardless of chunking"
    );
    assert_eq!(pipeline.content_events(), single.content_events());

    // What the per-event functions say the output is.
    let want = model_output(kind, handler, drop_usage, stream, true);
    assert_eq!(out, want, "the pipeline sends what its steps say");

    // Nothing to change: every chunk goes out as it came (pass-through).
    if !pipeline.rewrites() {
        assert!(handler.is_none() && !(drop_usage && kind == BodyKind::Sse));
        for (i, chunk) in chunks.iter().enumerate() {
            assert_eq!(&sent[i][..], *chunk, "pass-through chunk {i}");
        }
        assert_eq!(out, stream, "pass-through");
    } else if kind == BodyKind::Sse {
        // A stream is never held: after each chunk, every event completed
        // so far has been sent.
        let mut fed = 0;
        let mut so_far = Vec::new();
        for (i, chunk) in chunks.iter().enumerate() {
            fed += chunk.len();
            so_far.extend_from_slice(&sent[i]);
            let end = end_with_last && i + 1 == chunks.len();
            let want = model_output(kind, handler, drop_usage, &stream[..fed], end);
            assert_eq!(so_far, want, "sent after chunk {i}");
        }
    }

    // Usage and first-token timing are read from the engine's bytes, before
    // any rewrite: the same whatever the route does to the response.
    let (_, plain) = run_pipeline(kind, None, false, &[stream], false);
    assert_eq!(
        pipeline.usage(),
        plain.usage(),
        "usage read before rewrites"
    );
    if kind == BodyKind::Sse {
        assert_eq!(pipeline.content_events(), plain.content_events());
    }

    // The rewrite is idempotent: its output passes a second time unchanged.
    let (again, _) = run_pipeline(kind, handler, drop_usage, &[&out], false);
    assert_eq!(
        again.concat(),
        out,
        "a second pass changes nothing: {}",
        String::from_utf8_lossy(&out)
    );

    // The proxy builds its pipeline from the response head.
    let mut head = HeaderMap::new();
    let ct = match kind {
        BodyKind::Sse => "text/event-stream",
        BodyKind::Json => "application/json",
    };
    head.insert(http::header::CONTENT_TYPE, HeaderValue::from_static(ct));
    let built =
        ResponsePipeline::for_response(http::StatusCode::OK, &head, None, handler, drop_usage)
            .expect("a 2xx SSE / JSON response gets a pipeline");
    assert_eq!(built.is_stream(), kind == BodyKind::Sse);

    // The typed APIs' answers (Anthropic Messages, OpenAI Responses) pass
    // untouched whatever the route's handler, and are read the same
    // however they are cut.
    for api in [Api::Messages, Api::Responses] {
        let typed = |chunks: &[&[u8]], end_with_last: bool| {
            let mut pipeline = ResponsePipeline::for_api(kind, Some(api), handler, drop_usage);
            let mut sent = Vec::new();
            for (i, chunk) in chunks.iter().enumerate() {
                let last = i + 1 == chunks.len();
                sent.extend_from_slice(&pipeline.push(chunk, end_with_last && last));
            }
            if !end_with_last || chunks.is_empty() {
                sent.extend_from_slice(&pipeline.push(&[], true));
            }
            (sent, pipeline)
        };
        let (sent, cut) = typed(&chunks, end_with_last);
        assert!(!cut.rewrites());
        assert_eq!(sent, stream, "a typed answer passes untouched");
        let (_, whole) = typed(&[stream], false);
        assert_eq!(
            cut.usage(),
            whole.usage(),
            "typed usage regardless of chunking"
        );
        assert_eq!(cut.content_events(), whole.content_events());
        assert_eq!(cut.response_id_hash(), whole.response_id_hash());
    }
}

// ---------------------------------------------------------------- headers

/// `x-phanrouter-session`: `parse_header`, checked against the parsed tree.
pub fn prio_header(data: &[u8]) {
    let turn = prio::parse_header(Some(data));
    if let Turn::Known(t) = turn {
        assert!((1..=prio::MAX_TURN).contains(&t));
        // Members it does not read are skipped unchecked (a number out of
        // f64 range there is fine), so only a header the tree parser also
        // takes can be compared with it.
        if let Ok(v) = serde_json::from_slice::<Value>(data) {
            assert!(v.is_object(), "the header is an object");
            assert_eq!(v["turn"].as_u64(), Some(t));
            let id = v["session_id"].as_str().expect("session_id is a string");
            assert!(!id.trim().is_empty());
            assert!(id.chars().count() <= prio::MAX_SESSION_ID_CHARS);
        }
    }
    let table = prio::default_table(0.3, 16, 2.0);
    assert!(prio::bucket_of(&table, turn) < table.len());
    assert_eq!(prio::parse_header(None), Turn::Unusable);
}

// ---------------------------------------------------------------- bodylog

/// Body-log frames: `decode` of arbitrary bytes (what a listener reads),
/// the record built from a frame, and `HeadTail` over arbitrary chunks.
pub fn bodylog_frame(data: &[u8]) {
    // As the listener reads: the bytes after the length prefix.
    if let Ok(f) = frame::decode(data) {
        let wire = Frame::new(
            f.meta.to_vec(),
            Bytes::copy_from_slice(f.req),
            Bytes::copy_from_slice(f.resp),
        )
        .to_vec();
        assert_eq!(&wire[4..], data, "decode and encode round-trip");
        assert_eq!(wire[..4], (data.len() as u32).to_be_bytes());
        build_record(&f);
    }
    // As the gateway writes: meta, request and response cut at NULs.
    let (meta, rest) = split_nul(data);
    let (req, resp) = split_nul(rest);
    if meta.len() <= usize::from(u16::MAX) {
        let wire = Frame::new(
            meta.to_vec(),
            Bytes::copy_from_slice(req),
            Bytes::copy_from_slice(resp),
        )
        .to_vec();
        let f = frame::decode(&wire[4..]).expect("a frame decodes");
        assert_eq!((f.meta, f.req, f.resp), (meta, req, resp));
        build_record(&f);
    }
    head_tail(data);
}

fn build_record(f: &frame::FrameRef<'_>) {
    let Ok(rec) = record::build(f, std::time::SystemTime::UNIX_EPOCH) else {
        return;
    };
    let line: Value = serde_json::from_slice(&rec.line).expect("a record is JSON");
    for key in ["req", "resp", "resp_meta", "received_at"] {
        assert!(line.get(key).is_some(), "record has {key}");
    }
}

/// `HeadTail` with small caps (the first two bytes) over chunks of the
/// rest (1 to 17 bytes, stepping with the third byte): the first
/// `head` bytes, the marker with the exact count missing, the last `tail`.
fn head_tail(data: &[u8]) {
    let [h, t, step, body @ ..] = data else {
        return;
    };
    let (head, tail) = (usize::from(h % 64), usize::from(t % 64));
    let mut ht = HeadTail::new(head, tail);
    let mut rest = body;
    let mut k = usize::from(*step);
    while !rest.is_empty() {
        // Never 0: an empty push would not move on.
        let len = (1 + k % 17).min(rest.len());
        ht.push(&rest[..len]);
        rest = &rest[len..];
        k = k / 17 + usize::from(*step) + len;
    }
    assert_eq!(ht.total(), body.len() as u64);
    let (kept, cut) = ht.finish();
    if body.len() <= head + tail {
        assert_eq!((&kept[..], cut), (body, false));
    } else {
        let missing = body.len() - head - tail;
        let mut want = body[..head].to_vec();
        want.extend_from_slice(frame::truncation_marker(missing as u64).as_bytes());
        want.extend_from_slice(&body[body.len() - tail..]);
        assert_eq!((&kept[..], cut), (&want[..], true));
    }
}

// ---------------------------------------------------------------- store

/// A session binding's value as read back from Redis.
pub fn store_binding(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Some(binding) = StoredBinding::decode(text) else {
        return;
    };
    assert!(!binding.peer.is_empty() && !binding.peer.contains('|'));
    assert_eq!(
        StoredBinding::decode(&binding.encode()),
        Some(binding.clone()),
        "what decodes re-encodes to the same binding"
    );
    let _ = binding.moved_ago_ms(0);
    let _ = binding.moved_ago_ms(u64::MAX);
}
