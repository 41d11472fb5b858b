//! The `sse_pipeline` harness (see `fuzz/harness.rs`): a response stream,
//! cut anywhere, through the response pipeline, against a reference SSE
//! splitter and model of its output.

use bytes::Bytes;
use http::{HeaderMap, HeaderValue};
use llm_gateway::api::Api;
use llm_gateway::stream::pipeline::{BodyKind, ResponsePipeline};
use llm_gateway::stream::postprocess::{rewrite_json, rewrite_sse_event, Handler};
use llm_gateway::stream::sse::event_data;
use llm_gateway::stream::usage::{frame_without_usage, is_usage_only_event};

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
