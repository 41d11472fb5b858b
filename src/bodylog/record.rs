//! A frame → one JSONL record (pure): the gateway's meta, the bodies as
//! text, and `resp_meta` with the engine's own `usage` / `actual_usage`
//! (read from the raw response, so post-processing that stripped them from
//! the client's copy does not strip them here).

use super::frame::FrameRef;
use base64::Engine as _;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use std::time::SystemTime;

/// What the exporter counts for one record.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    pub route: String,
    pub model: String,
    pub owner: String,
    pub status: String,
    pub rt: Option<f64>,
    pub first_chunk_t: Option<f64>,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    pub completion_tokens: u64,
}

#[derive(Debug)]
pub struct Record {
    /// The JSON object, without the newline.
    pub line: Vec<u8>,
    pub summary: Summary,
}

/// Builds the record; a meta that is not a JSON object is a bad frame.
pub fn build(frame: &FrameRef<'_>, received: SystemTime) -> Result<Record, String> {
    let mut obj: Map<String, Value> = serde_json::from_slice(frame.meta)
        .map_err(|e| format!("meta is not a JSON object: {e}"))?;
    let sse = obj
        .get("resp_content_type")
        .and_then(Value::as_str)
        .is_some_and(|ct| ct.to_ascii_lowercase().starts_with("text/event-stream"));
    let resp_meta = response_meta(frame.resp, sse);
    let summary = summarize(&obj, &resp_meta);
    obj.insert(
        "received_at".into(),
        humantime::format_rfc3339_millis(received)
            .to_string()
            .into(),
    );
    obj.insert("req".into(), text(frame.req));
    obj.insert("resp".into(), text(frame.resp));
    obj.insert("resp_meta".into(), resp_meta);
    let line = serde_json::to_vec(&obj).map_err(|e| e.to_string())?;
    Ok(Record { line, summary })
}

/// Bytes as a JSON string: the text when it is UTF-8, else `base64:…`.
pub fn text(bytes: &[u8]) -> Value {
    match std::str::from_utf8(bytes) {
        Ok(s) => Value::String(s.to_string()),
        Err(_) => Value::String(format!(
            "base64:{}",
            base64::engine::general_purpose::STANDARD.encode(bytes)
        )),
    }
}

#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(borrow)]
    usage: Option<&'a RawValue>,
    #[serde(borrow)]
    actual_usage: Option<&'a RawValue>,
}

/// The last `usage` and `actual_usage` the engine sent (null when none): of
/// an SSE stream's `data:` frames, or of a JSON body.
pub fn response_meta(resp: &[u8], sse: bool) -> Value {
    let mut usage: Option<Value> = None;
    let mut actual: Option<Value> = None;
    let mut take = |json: &[u8]| {
        let Ok(env) = serde_json::from_slice::<Envelope>(json) else {
            return;
        };
        let parse = |raw: Option<&RawValue>| {
            raw.and_then(|r| serde_json::from_str::<Value>(r.get()).ok())
                .filter(|v| !v.is_null())
        };
        if let Some(u) = parse(env.usage) {
            usage = Some(u);
        }
        if let Some(a) = parse(env.actual_usage) {
            actual = Some(a);
        }
    };
    if sse {
        for line in resp.split(|&b| b == b'\n') {
            let Some(data) = line.strip_prefix(b"data:") else {
                continue;
            };
            // Only frames that can carry usage are parsed.
            if memchr::memmem::find(data, b"usage").is_some() {
                take(data.trim_ascii());
            }
        }
    } else {
        take(resp);
    }
    serde_json::json!({"usage": usage, "actual_usage": actual})
}

/// Labels and values for the exporter. Token counts are the gateway's
/// (`prompt_tokens` … in the meta), else the engine's usage in the body.
fn summarize(meta: &Map<String, Value>, resp_meta: &Value) -> Summary {
    let label = |key: &str| match meta.get(key) {
        Some(Value::String(s)) if !s.is_empty() => s.clone(),
        Some(Value::Number(n)) => n.to_string(),
        _ => "-".to_string(),
    };
    let usage = &resp_meta["usage"];
    let tokens = |key: &str, from_usage: &Value| {
        meta.get(key)
            .and_then(Value::as_u64)
            .or_else(|| from_usage.as_u64())
            .unwrap_or(0)
    };
    Summary {
        route: label("route"),
        model: label("model"),
        owner: label("owner"),
        status: label("status"),
        rt: meta.get("rt").and_then(Value::as_f64),
        first_chunk_t: meta.get("first_chunk_t").and_then(Value::as_f64),
        prompt_tokens: tokens("prompt_tokens", &usage["prompt_tokens"]),
        cached_tokens: tokens(
            "cached_tokens",
            &usage["prompt_tokens_details"]["cached_tokens"],
        ),
        completion_tokens: tokens("completion_tokens", &usage["completion_tokens"]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SSE: &str = "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n\
        data: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":2,\"prompt_tokens_details\":{\"cached_tokens\":4}},\"actual_usage\":{\"prompt_tokens\":8}}\n\n\
        data: [DONE]\n\n";

    fn frame<'a>(meta: &'a [u8], req: &'a [u8], resp: &'a [u8]) -> FrameRef<'a> {
        FrameRef { meta, req, resp }
    }

    #[test]
    fn record_keeps_meta_bodies_and_the_engines_usage() {
        let meta = br#"{"route":"r","model":"m","owner":"alice","status":200,"rt":0.5,"resp_content_type":"text/event-stream","prompt_tokens":null}"#;
        let rec = build(
            &frame(meta, b"{\"q\":1}", SSE.as_bytes()),
            SystemTime::UNIX_EPOCH,
        )
        .unwrap();
        let v: Value = serde_json::from_slice(&rec.line).unwrap();
        assert_eq!(v["route"], "r");
        assert_eq!(v["req"], "{\"q\":1}");
        assert_eq!(v["resp"], SSE);
        assert_eq!(v["received_at"], "1970-01-01T00:00:00.000Z");
        assert_eq!(v["resp_meta"]["usage"]["prompt_tokens"], 7);
        assert_eq!(v["resp_meta"]["actual_usage"]["prompt_tokens"], 8);
        // No token counts in the meta: the body's usage counts.
        assert_eq!(
            rec.summary,
            Summary {
                route: "r".into(),
                model: "m".into(),
                owner: "alice".into(),
                status: "200".into(),
                rt: Some(0.5),
                first_chunk_t: None,
                prompt_tokens: 7,
                cached_tokens: 4,
                completion_tokens: 2,
            }
        );
    }

    #[test]
    fn the_gateways_counts_win_and_missing_labels_are_dashes() {
        let meta = br#"{"status":502,"prompt_tokens":3,"cached_tokens":1,"completion_tokens":9}"#;
        let rec = build(&frame(meta, b"", SSE.as_bytes()), SystemTime::UNIX_EPOCH).unwrap();
        assert_eq!(rec.summary.route, "-");
        assert_eq!(rec.summary.owner, "-");
        assert_eq!(rec.summary.status, "502");
        assert_eq!(
            (
                rec.summary.prompt_tokens,
                rec.summary.cached_tokens,
                rec.summary.completion_tokens
            ),
            (3, 1, 9)
        );
    }

    #[test]
    fn json_usage_and_binary_bodies() {
        let resp = br#"{"usage":{"prompt_tokens":5,"completion_tokens":1},"actual_usage":null}"#;
        let meta = response_meta(resp, false);
        assert_eq!(meta["usage"]["prompt_tokens"], 5);
        assert!(meta["actual_usage"].is_null());
        assert!(response_meta(b"not json", false)["usage"].is_null());
        assert_eq!(text(b"\xff\xfe"), Value::String("base64://4=".into()));
        assert!(build(&frame(b"[1]", b"", b""), SystemTime::UNIX_EPOCH).is_err());
    }
}
