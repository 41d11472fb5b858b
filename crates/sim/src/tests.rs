//! Engine tests over real 127.0.0.1 sockets with a deliberately dumb raw
//! client, so that framing is checked byte for byte rather than through an
//! HTTP library that would hide it.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{timeout, Instant};

use super::*;

/// Upper bound for anything the tests wait on; generous for a loaded CI box.
const DEADLINE: Duration = Duration::from_secs(10);

async fn engine(cfg: EngineConfig) -> EngineHandle {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    start_engine(listener, cfg).await.expect("start engine")
}

/// Polls `check` until it returns true or the deadline passes.
async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + DEADLINE;
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[derive(Debug, PartialEq)]
enum Chunk {
    Data(Vec<u8>),
    /// The terminating zero-size chunk and its empty trailer section.
    End,
    /// The connection closed first.
    Eof,
}

#[derive(Debug)]
struct Resp {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Resp {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "body is not JSON ({e}): {:?}",
                String::from_utf8_lossy(&self.body)
            )
        })
    }
}

struct Client {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl Client {
    async fn connect(h: &EngineHandle) -> Client {
        let stream = TcpStream::connect(h.addr).await.expect("connect");
        Client {
            stream,
            buf: Vec::new(),
        }
    }

    async fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).await.expect("send");
    }

    /// Reads more bytes; false on EOF or reset.
    async fn fill(&mut self) -> bool {
        let mut tmp = [0u8; 8192];
        match timeout(DEADLINE, self.stream.read(&mut tmp)).await {
            Ok(Ok(0)) | Ok(Err(_)) => false,
            Ok(Ok(n)) => {
                self.buf.extend_from_slice(&tmp[..n]);
                true
            }
            Err(_) => panic!(
                "no data within {DEADLINE:?}; have {:?}",
                String::from_utf8_lossy(&self.buf)
            ),
        }
    }

    fn take_until(&mut self, delim: &[u8]) -> Option<Vec<u8>> {
        let at = self.buf.windows(delim.len()).position(|w| w == delim)?;
        let out = self.buf[..at].to_vec();
        self.buf.drain(..at + delim.len());
        Some(out)
    }

    async fn head(&mut self) -> (u16, Vec<(String, String)>) {
        let head = loop {
            if let Some(head) = self.take_until(b"\r\n\r\n") {
                break String::from_utf8(head).expect("UTF-8 head");
            }
            assert!(self.fill().await, "EOF before response head");
        };
        let mut lines = head.split("\r\n");
        let status_line = lines.next().unwrap_or_default();
        assert!(
            status_line.starts_with("HTTP/1.1 "),
            "status line {status_line:?}"
        );
        let status = status_line[9..12].parse().expect("status code");
        let headers = lines
            .map(|l| {
                let (n, v) = l.split_once(':').expect("header colon");
                (n.to_string(), v.trim().to_string())
            })
            .collect();
        (status, headers)
    }

    async fn chunk(&mut self) -> Chunk {
        let size_line = loop {
            if let Some(line) = self.take_until(b"\r\n") {
                break String::from_utf8(line).expect("UTF-8 chunk size");
            }
            if !self.fill().await {
                return Chunk::Eof;
            }
        };
        let size = usize::from_str_radix(&size_line, 16).expect("hex chunk size");
        while self.buf.len() < size + 2 {
            if !self.fill().await {
                return Chunk::Eof;
            }
        }
        assert_eq!(
            &self.buf[size..size + 2],
            b"\r\n",
            "chunk data longer than its size"
        );
        let data = self.buf[..size].to_vec();
        self.buf.drain(..size + 2);
        if size == 0 {
            assert!(data.is_empty());
            return Chunk::End;
        }
        Chunk::Data(data)
    }

    /// A whole response; chunked bodies are de-chunked.
    async fn response(&mut self) -> Resp {
        let (status, headers) = self.head().await;
        let mut resp = Resp {
            status,
            headers,
            body: Vec::new(),
        };
        if resp
            .header("transfer-encoding")
            .is_some_and(|te| te.eq_ignore_ascii_case("chunked"))
        {
            loop {
                match self.chunk().await {
                    Chunk::Data(d) => resp.body.extend_from_slice(&d),
                    Chunk::End => break,
                    Chunk::Eof => panic!("EOF inside a chunked body"),
                }
            }
        } else {
            let len: usize = resp
                .header("content-length")
                .expect("content-length")
                .parse()
                .expect("numeric content-length");
            while self.buf.len() < len {
                assert!(self.fill().await, "EOF inside the body");
            }
            resp.body = self.buf.drain(..len).collect();
        }
        resp
    }

    async fn request(&mut self, raw: &[u8]) -> Resp {
        self.send(raw).await;
        self.response().await
    }

    /// True once the server has closed the connection (EOF or reset), with
    /// no further response bytes before it.
    async fn closed(&mut self) -> bool {
        let before = self.buf.len();
        let open = self.fill().await;
        !open && self.buf.len() == before
    }
}

fn post(path: &str, body: &str, headers: &[(&str, &str)]) -> Vec<u8> {
    let mut out =
        format!("POST {path} HTTP/1.1\r\nhost: sim\r\ncontent-type: application/json\r\n");
    for (n, v) in headers {
        out.push_str(&format!("{n}: {v}\r\n"));
    }
    out.push_str(&format!("content-length: {}\r\n\r\n{body}", body.len()));
    out.into_bytes()
}

fn get(path: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nhost: sim\r\n\r\n").into_bytes()
}

fn chat(messages: Value, extra: Value) -> String {
    let mut body = json!({"model": "sim-model", "messages": messages});
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
    body.to_string()
}

fn user(text: &str) -> Value {
    json!([{"role": "user", "content": text}])
}

/// The JSON payload of one SSE frame, which must be exactly one `data:` line.
fn frame_json(chunk: &[u8]) -> Value {
    let text = std::str::from_utf8(chunk).expect("UTF-8 frame");
    let payload = text
        .strip_prefix("data: ")
        .and_then(|t| t.strip_suffix("\n\n"))
        .unwrap_or_else(|| panic!("not a single SSE frame: {text:?}"));
    assert!(!payload.contains('\n'), "frame spans lines: {text:?}");
    serde_json::from_str(payload).expect("frame JSON")
}

async fn metric(h: &EngineHandle, name: &str) -> f64 {
    let resp = Client::connect(h).await.request(&get("/metrics")).await;
    assert_eq!(resp.status, 200);
    let text = String::from_utf8(resp.body).expect("UTF-8 metrics");
    let prefix = format!("{name}{{model_name=\"sim-model\"}} ");
    let line = text
        .lines()
        .find(|l| l.starts_with(&prefix))
        .unwrap_or_else(|| panic!("no {name} in {text}"));
    assert!(
        text.contains(&format!("# TYPE {name} ")),
        "no TYPE line for {name}"
    );
    line[prefix.len()..].parse().expect("numeric sample")
}

/// Sends a streaming request and collects frames until `[DONE]`, checking
/// that every chunk is exactly one frame and the body is terminated.
async fn stream_frames(c: &mut Client, body: &str, headers: &[(&str, &str)]) -> Vec<Value> {
    let (status, resp_headers) = {
        c.send(&post("/v1/chat/completions", body, headers)).await;
        c.head().await
    };
    assert_eq!(status, 200);
    let resp = Resp {
        status,
        headers: resp_headers,
        body: Vec::new(),
    };
    assert_eq!(resp.header("content-type"), Some("text/event-stream"));
    assert_eq!(resp.header("transfer-encoding"), Some("chunked"));
    assert!(resp.header("content-length").is_none());
    let mut frames = Vec::new();
    loop {
        match c.chunk().await {
            Chunk::Data(d) if d == b"data: [DONE]\n\n" => break,
            Chunk::Data(d) => frames.push(frame_json(&d)),
            other => panic!("stream ended without [DONE]: {other:?}"),
        }
    }
    assert_eq!(c.chunk().await, Chunk::End);
    frames
}

fn cached_tokens(usage: &Value) -> u64 {
    usage["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .expect("cached_tokens")
}

#[tokio::test]
async fn stream_sends_one_frame_per_token_and_no_usage_unless_asked() {
    let h = engine(EngineConfig::default()).await;
    let mut c = Client::connect(&h).await;
    let body = chat(
        user("hello there"),
        json!({"stream": true, "max_tokens": 3}),
    );
    let frames = stream_frames(&mut c, &body, &[]).await;
    assert_eq!(frames.len(), 3);
    for (i, f) in frames.iter().enumerate() {
        assert_eq!(f["object"], "chat.completion.chunk");
        assert_eq!(f["model"], "sim-model");
        assert!(f["id"]
            .as_str()
            .is_some_and(|id| id.starts_with("chatcmpl-")));
        assert!(f["created"].is_u64());
        assert_eq!(f["choices"][0]["delta"]["content"], "tok ");
        let finish = &f["choices"][0]["finish_reason"];
        if i == 2 {
            assert_eq!(finish, "length");
        } else {
            assert!(finish.is_null());
        }
        assert!(f.get("usage").is_none());
    }
    assert_eq!(frames[0]["choices"][0]["delta"]["role"], "assistant");

    // Same connection: keep-alive; the default length ends with "stop".
    let frames = stream_frames(&mut c, &chat(user("hi"), json!({"stream": true})), &[]).await;
    assert_eq!(frames.len(), 16);
    assert_eq!(frames[15]["choices"][0]["finish_reason"], "stop");
}

#[tokio::test]
async fn stream_usage_frame_when_include_usage() {
    let h = engine(EngineConfig::default()).await;
    let mut c = Client::connect(&h).await;
    let body = chat(
        user("0123456789abcdef"),
        json!({"stream": true, "stream_options": {"include_usage": true}}),
    );
    let frames = stream_frames(&mut c, &body, &[("x-sim-max-tokens", "2")]).await;
    assert_eq!(frames.len(), 3);
    assert_eq!(frames[1]["choices"][0]["finish_reason"], "length");
    let last = &frames[2];
    assert_eq!(last["choices"], json!([]));
    // "user" + 16 bytes = 20 bytes = 5 tokens.
    assert_eq!(
        last["usage"],
        json!({"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7,
               "prompt_tokens_details": {"cached_tokens": 0}})
    );
}

#[tokio::test]
async fn non_stream_bodies_carry_usage() {
    let h = engine(EngineConfig::default()).await;
    let mut c = Client::connect(&h).await;
    let resp = c
        .request(&post(
            "/v1/chat/completions",
            &chat(user("hey"), json!({"max_tokens": 4})),
            &[],
        ))
        .await;
    assert_eq!(resp.status, 200);
    assert_eq!(resp.header("content-type"), Some("application/json"));
    let v = resp.json();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["content"], "tok tok tok tok ");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 4);
    assert_eq!(cached_tokens(&v["usage"]), 0);

    let body =
        json!({"model": "other", "prompt": "abcdefgh", "max_completion_tokens": 2}).to_string();
    let v = c.request(&post("/v1/completions", &body, &[])).await.json();
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["model"], "other");
    assert_eq!(v["choices"][0]["text"], "tok tok ");
    assert_eq!(v["usage"]["prompt_tokens"], 2);
    assert_eq!(v["usage"]["total_tokens"], 4);
    assert_eq!(h.stats.requests.load(Ordering::SeqCst), 2);
    assert_eq!(h.stats.in_flight.load(Ordering::SeqCst), 0);
}

/// A first user turn of 100 tokens (6 complete blocks) and the next turn,
/// which re-sends it with the reply and a new question (113 tokens).
fn conversation() -> (String, String) {
    // "user" + 396 bytes = 400 bytes = 100 tokens.
    let first = "a".repeat(396);
    let turn1 = chat(user(&first), json!({}));
    let turn2 = chat(
        json!([
            {"role": "user", "content": first},
            {"role": "assistant", "content": "tok tok tok "},
            {"role": "user", "content": [{"type": "text", "text": "and a follow-up question"}]},
        ]),
        json!({"stream": true, "stream_options": {"include_usage": true}}),
    );
    (turn1, turn2)
}

#[tokio::test]
async fn second_turn_hits_prefix_cache() {
    let h = engine(EngineConfig::default()).await;
    let (turn1, turn2) = conversation();
    let mut c = Client::connect(&h).await;
    let v = c
        .request(&post("/v1/chat/completions", &turn1, &[]))
        .await
        .json();
    assert_eq!(v["usage"]["prompt_tokens"], 100);
    assert_eq!(cached_tokens(&v["usage"]), 0);

    let frames = stream_frames(&mut c, &turn2, &[]).await;
    let usage = &frames.last().expect("usage frame")["usage"];
    assert_eq!(usage["prompt_tokens"], 113);
    // Every complete block of turn 1, and nothing of the new text.
    assert_eq!(cached_tokens(usage), 96);
    assert_eq!(metric(&h, "vllm:prefix_cache_hits_total").await, 96.0);
    assert_eq!(metric(&h, "vllm:prompt_tokens_total").await, 213.0);
}

#[tokio::test]
async fn cold_engine_reports_zero_cached_tokens_for_a_second_turn() {
    let h = engine(EngineConfig::default()).await;
    let (_, turn2) = conversation();
    let frames = stream_frames(&mut Client::connect(&h).await, &turn2, &[]).await;
    let usage = &frames.last().expect("usage frame")["usage"];
    assert_eq!(usage["prompt_tokens"], 113);
    assert_eq!(cached_tokens(usage), 0);
}

#[tokio::test]
async fn lru_evicts_least_recently_used_prefix() {
    // 160 tokens of KV. A running 50-token prompt plus its one generated
    // token pin 51, leaving 6 idle blocks (96 tokens) for other prefixes:
    // room for two 3-block prefixes next to the running one.
    let h = engine(EngineConfig {
        kv_capacity_tokens: 160,
        ..EngineConfig::default()
    })
    .await;
    async fn send(c: &mut Client, tag: char) -> u64 {
        // "user" + 196 bytes = 50 tokens: 3 complete blocks.
        let body = chat(user(&tag.to_string().repeat(196)), json!({"max_tokens": 1}));
        let v = c
            .request(&post("/v1/chat/completions", &body, &[]))
            .await
            .json();
        cached_tokens(&v["usage"])
    }
    let mut c = Client::connect(&h).await;
    assert_eq!(send(&mut c, 'A').await, 0);
    assert_eq!(send(&mut c, 'B').await, 0);
    assert_eq!(send(&mut c, 'C').await, 0);
    assert_eq!(
        send(&mut c, 'A').await,
        48,
        "A is cached and becomes most recent"
    );
    // D needs room: B is the least recently used prefix.
    assert_eq!(send(&mut c, 'D').await, 0);
    assert_eq!(send(&mut c, 'A').await, 48, "recently used prefix survives");
    assert_eq!(
        send(&mut c, 'B').await,
        0,
        "least recently used prefix was evicted"
    );
    assert!(metric(&h, "sim:prefix_cache_blocks").await <= 10.0);
    assert_eq!(metric(&h, "vllm:kv_cache_usage_perc").await, 0.0);
}

#[tokio::test]
async fn metrics_export_cache_config_info_like_vllm() {
    // 1000 tokens in 16-token blocks: 62 whole blocks, the rest unreported.
    let h = engine(EngineConfig {
        kv_capacity_tokens: 1_000,
        block_tokens: 16,
        ..EngineConfig::default()
    })
    .await;
    let resp = Client::connect(&h).await.request(&get("/metrics")).await;
    assert_eq!(resp.status, 200);
    let text = String::from_utf8(resp.body).expect("UTF-8 metrics");
    assert!(
        text.contains("# TYPE vllm:cache_config_info gauge\n"),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l == "vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"62\"} 1"),
        "{text}"
    );
    // The default config: 200k tokens, 16-token blocks.
    let d = engine(EngineConfig::default()).await;
    let text = Client::connect(&d)
        .await
        .request(&get("/metrics"))
        .await
        .body;
    assert!(String::from_utf8_lossy(&text)
        .contains("vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"12500\"} 1"));
}

fn stream_body(max_tokens: u64) -> String {
    chat(
        user("stream me"),
        json!({"stream": true, "max_tokens": max_tokens}),
    )
}

/// Sends a streaming request and reads its head and first content frame.
async fn start_stream(h: &EngineHandle, headers: &[(&str, &str)], max_tokens: u64) -> Client {
    let mut c = Client::connect(h).await;
    c.send(&post(
        "/v1/chat/completions",
        &stream_body(max_tokens),
        headers,
    ))
    .await;
    let (status, _) = c.head().await;
    assert_eq!(status, 200);
    match c.chunk().await {
        Chunk::Data(d) => assert_eq!(frame_json(&d)["choices"][0]["delta"]["content"], "tok "),
        other => panic!("expected a first frame, got {other:?}"),
    }
    c
}

/// A bounded check that nothing arrives while something is held back.
async fn assert_silent(c: &mut Client) {
    let waited = timeout(Duration::from_millis(150), c.chunk()).await;
    assert!(waited.is_err(), "expected silence, got {waited:?}");
}

#[tokio::test]
async fn waiting_queue_is_visible_in_metrics() {
    let h = engine(EngineConfig {
        max_running: 1,
        ..EngineConfig::default()
    })
    .await;
    let hr = &h;
    let mut first = start_stream(&h, &[("x-sim-gate", "hold")], 2).await;
    let mut queued = Vec::new();
    for _ in 0..2 {
        let mut c = Client::connect(&h).await;
        c.send(&post(
            "/v1/chat/completions",
            &chat(user("q"), json!({"max_tokens": 1})),
            &[],
        ))
        .await;
        queued.push(c);
    }
    eventually("two waiting requests", || async move {
        metric(hr, "vllm:num_requests_waiting").await == 2.0
    })
    .await;
    assert_eq!(metric(&h, "vllm:num_requests_running").await, 1.0);
    assert!(metric(&h, "vllm:kv_cache_usage_perc").await > 0.0);
    assert_eq!(h.stats.in_flight.load(Ordering::SeqCst), 3);

    h.open_gate("hold");
    assert!(matches!(first.chunk().await, Chunk::Data(_)));
    assert_eq!(
        first.chunk().await,
        Chunk::Data(b"data: [DONE]\n\n".to_vec())
    );
    assert_eq!(first.chunk().await, Chunk::End);
    for mut c in queued {
        assert_eq!(c.response().await.status, 200);
    }
    eventually("an idle engine", || async move {
        metric(hr, "vllm:num_requests_waiting").await == 0.0
            && metric(hr, "vllm:num_requests_running").await == 0.0
            && hr.stats.in_flight.load(Ordering::SeqCst) == 0
    })
    .await;
    assert_eq!(metric(&h, "vllm:kv_cache_usage_perc").await, 0.0);
}

#[tokio::test]
async fn gate_holds_after_first_frame_until_opened() {
    let h = engine(EngineConfig::default()).await;
    let other = engine(EngineConfig::default()).await;
    let mut c = start_stream(&h, &[("x-sim-gate", "g")], 3).await;
    assert_silent(&mut c).await;
    assert_eq!(h.stats.in_flight.load(Ordering::SeqCst), 1);

    h.open_gate("g");
    for _ in 0..2 {
        assert!(matches!(c.chunk().await, Chunk::Data(_)));
    }
    assert_eq!(c.chunk().await, Chunk::Data(b"data: [DONE]\n\n".to_vec()));
    assert_eq!(c.chunk().await, Chunk::End);

    // Already open: passes straight through.
    let frames = stream_frames(&mut c, &stream_body(3), &[("x-sim-gate", "g")]).await;
    assert_eq!(frames.len(), 3);

    // Gates are per engine: the same name is still closed elsewhere.
    let mut elsewhere = start_stream(&other, &[("x-sim-gate", "g")], 2).await;
    assert_silent(&mut elsewhere).await;
    other.open_gate("g");
    assert!(matches!(elsewhere.chunk().await, Chunk::Data(_)));
}

#[tokio::test]
async fn die_after_frames_closes_without_terminating_chunk() {
    let h = engine(EngineConfig::default()).await;
    h.faults.die_after_frames.store(2, Ordering::SeqCst);
    let mut c = start_stream(&h, &[], 5).await;
    assert!(matches!(c.chunk().await, Chunk::Data(_)));
    assert_eq!(c.chunk().await, Chunk::Eof);
    assert!(c.buf.is_empty(), "bytes after the last frame: {:?}", c.buf);
    let hr = &h;
    eventually("in_flight back to 0", || async move {
        hr.stats.in_flight.load(Ordering::SeqCst) == 0
    })
    .await;

    // Non-stream requests are unaffected; clearing the fault restores streams.
    let v = Client::connect(&h)
        .await
        .request(&post(
            "/v1/chat/completions",
            &chat(user("x"), json!({"max_tokens": 3})),
            &[],
        ))
        .await;
    assert_eq!(v.status, 200);
    h.faults.die_after_frames.store(0, Ordering::SeqCst);
    let frames = stream_frames(&mut Client::connect(&h).await, &stream_body(3), &[]).await;
    assert_eq!(frames.len(), 3);
}

#[tokio::test]
async fn client_disconnect_frees_running_and_waiting_sequences() {
    let h = engine(EngineConfig {
        max_running: 1,
        ..EngineConfig::default()
    })
    .await;
    let hr = &h;
    let running = start_stream(&h, &[("x-sim-gate", "never")], 4).await;
    let mut waiting = Client::connect(&h).await;
    waiting
        .send(&post("/v1/chat/completions", &stream_body(2), &[]))
        .await;
    eventually("a waiting request", || async move {
        metric(hr, "vllm:num_requests_waiting").await == 1.0
    })
    .await;
    drop(waiting);
    eventually("the waiting request gone", || async move {
        metric(hr, "vllm:num_requests_waiting").await == 0.0
            && hr.stats.in_flight.load(Ordering::SeqCst) == 1
    })
    .await;
    drop(running);
    eventually("the running request gone", || async move {
        hr.stats.in_flight.load(Ordering::SeqCst) == 0
            && metric(hr, "vllm:num_requests_running").await == 0.0
            && metric(hr, "vllm:kv_cache_usage_perc").await == 0.0
    })
    .await;
    // The slot really is free again.
    let frames = stream_frames(&mut Client::connect(&h).await, &stream_body(2), &[]).await;
    assert_eq!(frames.len(), 2);
}

#[tokio::test]
async fn chunked_request_bodies_are_decoded() {
    let h = engine(EngineConfig::default()).await;
    let body = chat(user("sent in pieces"), json!({"max_tokens": 1}));
    let (a, b) = body.split_at(10);
    let head =
        "POST /v1/chat/completions?x=1 HTTP/1.1\r\nhost: sim\r\nTransfer-Encoding: chunked\r\n";
    let chunks = format!(
        "{:x};ext=1\r\n{a}\r\n{:X}\r\n{b}\r\n0\r\nx-trailer: t\r\n\r\n",
        a.len(),
        b.len()
    );

    let mut c = Client::connect(&h).await;
    // Split mid-chunk-size-line, so the parser has to wait for more.
    let echo = format!("{head}x-sim-echo: 1\r\n\r\n{chunks}");
    let (first, rest) = echo.split_at(echo.len() - 30);
    c.send(first.as_bytes()).await;
    c.send(rest.as_bytes()).await;
    let resp = c.response().await;
    assert_eq!(resp.status, 200);
    assert_eq!(
        resp.header("content-type"),
        Some("application/octet-stream")
    );
    assert_eq!(resp.body, body.as_bytes());

    let resp = c.request(format!("{head}\r\n{chunks}").as_bytes()).await;
    assert_eq!(resp.status, 200);
    assert_eq!(resp.json()["usage"]["completion_tokens"], 1);

    let recorded = h.stats.recorded.lock().clone();
    assert_eq!(recorded.len(), 2);
    assert_eq!(recorded[1].path, "/v1/chat/completions?x=1");
    assert_eq!(recorded[1].body, body.as_bytes());
    assert_eq!(recorded[1].header("transfer-encoding"), Some("chunked"));
    assert_eq!(h.stats.requests.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn expect_100_continue_is_answered_before_the_body() {
    let h = engine(EngineConfig::default()).await;
    let body = chat(user("after continue"), json!({"max_tokens": 2}));
    let mut c = Client::connect(&h).await;
    c.send(
        format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: sim\r\nexpect: 100-continue\r\ncontent-length: {}\r\n\r\n",
            body.len()
        )
        .as_bytes(),
    )
    .await;
    let (status, headers) = c.head().await;
    assert_eq!(status, 100);
    assert!(headers.is_empty());
    c.send(body.as_bytes()).await;
    let resp = c.response().await;
    assert_eq!(resp.status, 200);
    assert_eq!(resp.json()["usage"]["completion_tokens"], 2);

    // An expectation the server does not know.
    let resp = c
        .request(b"POST /v1/completions HTTP/1.1\r\nexpect: magic\r\ncontent-length: 2\r\n\r\n{}")
        .await;
    assert_eq!(resp.status, 417);
}

#[tokio::test]
async fn malformed_requests_get_400_json() {
    let h = engine(EngineConfig::default()).await;
    let framing_errors: [&[u8]; 9] = [
        b"GARBAGE\r\n\r\n",
        b"GET /health HTTP/1.1 extra\r\n\r\n",
        b"GET /health HTTX/1.1\r\n\r\n",
        b"GET /health HTTP/1.1\r\nno colon here\r\n\r\n",
        b"GET /health HTTP/1.1\r\nname : space before colon\r\n\r\n",
        b"GET /health HTTP/1.1\r\n folded: line\r\n\r\n",
        b"POST /v1/completions HTTP/1.1\r\ncontent-length: 1x\r\n\r\n",
        b"POST /v1/completions HTTP/1.1\r\ncontent-length: 3\r\ncontent-length: 4\r\n\r\n",
        b"POST /v1/completions HTTP/1.1\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n",
    ];
    let chunked_errors: [&[u8]; 2] = [
        b"POST /v1/completions HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
        b"POST /v1/completions HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n2\r\nabc\r\n0\r\n\r\n",
    ];
    for raw in framing_errors.iter().chain(chunked_errors.iter()) {
        let mut c = Client::connect(&h).await;
        let resp = c.request(raw).await;
        let shown = String::from_utf8_lossy(raw);
        assert_eq!(resp.status, 400, "for {shown:?}");
        assert_eq!(
            resp.json()["error"]["type"],
            "invalid_request",
            "for {shown:?}"
        );
        assert!(resp.json()["error"]["message"].is_string());
        assert_eq!(resp.header("connection"), Some("close"));
        assert!(c.closed().await, "connection left open after {shown:?}");
    }

    // Well-framed but invalid requests keep the connection usable.
    let mut c = Client::connect(&h).await;
    let invalid = [
        "not json at all".to_string(),
        "[1, 2]".to_string(),
        json!({"model": "m"}).to_string(),
        json!({"messages": "hi"}).to_string(),
        json!({"messages": [{"content": "no role"}]}).to_string(),
        json!({"messages": [{"role": "user", "content": 5}]}).to_string(),
        chat(user("x"), json!({"max_tokens": 0})),
        chat(user("x"), json!({"max_tokens": "many"})),
    ];
    for body in &invalid {
        let resp = c.request(&post("/v1/chat/completions", body, &[])).await;
        assert_eq!(resp.status, 400, "for {body}");
        assert_eq!(resp.json()["error"]["type"], "invalid_request");
    }
    let resp = c
        .request(&post(
            "/v1/chat/completions",
            &chat(user("x"), json!({})),
            &[("x-sim-max-tokens", "-1")],
        ))
        .await;
    assert_eq!(resp.status, 400);
    let resp = c.request(&post("/v1/completions", "{}", &[])).await;
    assert_eq!(resp.status, 400);
    let resp = c
        .request(&post(
            "/v1/chat/completions",
            &chat(user("ok"), json!({})),
            &[],
        ))
        .await;
    assert_eq!(resp.status, 200);
    assert_eq!(h.stats.in_flight.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn keep_alive_pipelining_connection_close_and_http10() {
    let h = engine(EngineConfig::default()).await;
    let mut c = Client::connect(&h).await;
    let mut pipelined = get("/health");
    pipelined.extend_from_slice(&get("/v1/models"));
    pipelined.extend_from_slice(&get("/nope"));
    c.send(&pipelined).await;
    let health = c.response().await;
    assert_eq!((health.status, health.body.len()), (200, 0));
    let models = c.response().await.json();
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["id"], "sim-model");
    assert_eq!(models["data"][0]["object"], "model");
    assert_eq!(models["data"][0]["owned_by"], "sim");
    let missing = c.response().await;
    assert_eq!(missing.status, 404);
    assert!(missing.json()["error"]["message"].is_string());

    let resp = c
        .request(b"GET /health HTTP/1.1\r\nhost: sim\r\nconnection: close\r\n\r\n")
        .await;
    assert_eq!(resp.status, 200);
    assert_eq!(resp.header("connection"), Some("close"));
    assert!(c.closed().await);

    let mut c = Client::connect(&h).await;
    assert_eq!(c.request(b"GET /health HTTP/1.0\r\n\r\n").await.status, 200);
    assert!(c.closed().await);

    // HTTP/1.0 cannot take chunks: the stream is delimited by the close.
    let mut c = Client::connect(&h).await;
    let body = stream_body(2);
    c.send(
        format!(
            "POST /v1/chat/completions HTTP/1.0\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    )
    .await;
    let (status, headers) = c.head().await;
    assert_eq!(status, 200);
    assert!(!headers
        .iter()
        .any(|(n, _)| n.eq_ignore_ascii_case("transfer-encoding")));
    while c.fill().await {}
    let text = String::from_utf8(c.buf.clone()).expect("UTF-8 stream");
    assert_eq!(text.matches("data: ").count(), 3);
    assert!(text.ends_with("data: [DONE]\n\n"));
}

/// The health check at another path, and one answered late: what the
/// gateway's probe tests need of an engine.
#[tokio::test]
async fn health_answers_at_its_own_path_and_late_when_delayed() {
    let h = engine(EngineConfig {
        health_path: "/ready".into(),
        ..EngineConfig::default()
    })
    .await;
    let mut c = Client::connect(&h).await;
    assert_eq!(c.request(&get("/ready")).await.status, 200);
    assert_eq!(c.request(&get("/health")).await.status, 404);
    assert_eq!(h.stats.health_checks.load(Ordering::SeqCst), 1);
    assert!(
        h.stats.recorded.lock().is_empty(),
        "probe traffic is not recorded"
    );

    h.faults.health_delay_ms.store(300, Ordering::SeqCst);
    let started = std::time::Instant::now();
    assert_eq!(c.request(&get("/ready")).await.status, 200);
    assert!(started.elapsed() >= Duration::from_millis(300));
    // Control: without the delay it answers at once.
    h.faults.health_delay_ms.store(0, Ordering::SeqCst);
    let started = std::time::Instant::now();
    assert_eq!(c.request(&get("/ready")).await.status, 200);
    assert!(started.elapsed() < Duration::from_millis(300));
    assert_eq!(h.stats.health_checks.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn faults_fail_stall_and_health() {
    let h = engine(EngineConfig::default()).await;
    let mut c = Client::connect(&h).await;
    let req = post(
        "/v1/chat/completions",
        &chat(user("x"), json!({"max_tokens": 1})),
        &[],
    );

    h.faults.fail_next.store(2, Ordering::SeqCst);
    for _ in 0..2 {
        let resp = c.request(&req).await;
        assert_eq!(resp.status, 500);
        assert!(resp.json()["error"]["message"].is_string());
    }
    assert_eq!(c.request(&req).await.status, 200);

    h.faults.health_down.store(true, Ordering::SeqCst);
    assert_eq!(c.request(&get("/health")).await.status, 503);
    assert_eq!(c.request(&get("/v1/models")).await.status, 200);
    h.faults.health_status.store(429, Ordering::SeqCst);
    assert_eq!(c.request(&get("/health")).await.status, 429);
    h.faults.health_status.store(0, Ordering::SeqCst);
    h.faults.health_down.store(false, Ordering::SeqCst);
    assert_eq!(c.request(&get("/health")).await.status, 200);

    h.faults.stall.store(true, Ordering::SeqCst);
    c.send(&req).await;
    let hr = &h;
    eventually("the stalled request to arrive", || async move {
        hr.stats.requests.load(Ordering::SeqCst) == 4
    })
    .await;
    assert_silent(&mut c).await;
    assert_eq!(h.stats.in_flight.load(Ordering::SeqCst), 1);
    h.faults.stall.store(false, Ordering::SeqCst);
    assert_eq!(c.response().await.status, 200);

    // Probes are not recorded; completions are, in order.
    let recorded = h.stats.recorded.lock().clone();
    let paths: Vec<&str> = recorded.iter().map(|r| r.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "/v1/chat/completions",
            "/v1/chat/completions",
            "/v1/chat/completions",
            "/v1/models",
            "/v1/chat/completions"
        ]
    );
}

#[tokio::test]
async fn recorded_requests_keep_the_last_256() {
    let h = engine(EngineConfig::default()).await;
    let mut c = Client::connect(&h).await;
    for i in 0..RECORDED_LIMIT + 4 {
        assert_eq!(c.request(&get(&format!("/r{i}"))).await.status, 404);
    }
    let recorded = h.stats.recorded.lock();
    assert_eq!(recorded.len(), RECORDED_LIMIT);
    assert_eq!(recorded[0].path, "/r4");
    assert_eq!(
        recorded[RECORDED_LIMIT - 1].path,
        format!("/r{}", RECORDED_LIMIT + 3)
    );
}

#[tokio::test]
async fn shutdown_refuses_new_connections_and_drops_open_ones() {
    let h = engine(EngineConfig::default()).await;
    let mut idle = Client::connect(&h).await;
    assert_eq!(idle.request(&get("/health")).await.status, 200);
    let mut streaming = start_stream(&h, &[("x-sim-gate", "never")], 3).await;

    h.shutdown();
    assert!(TcpStream::connect(h.addr).await.is_err(), "still accepting");
    assert!(idle.closed().await);
    assert_eq!(streaming.chunk().await, Chunk::Eof);
    h.shutdown();
}

#[test]
fn spawn_engines_serves_sync_callers_until_dropped() {
    use std::io::{Read, Write};

    let cluster = spawn_engines(2, 0, EngineConfig::default()).expect("spawn");
    assert_eq!(cluster.engines.len(), 2);
    let addrs = cluster.addrs();
    assert_ne!(addrs[0].port(), addrs[1].port());
    for addr in &addrs {
        let mut s = std::net::TcpStream::connect(addr).expect("connect");
        s.set_read_timeout(Some(DEADLINE)).expect("timeout");
        s.write_all(b"GET /health HTTP/1.1\r\nconnection: close\r\n\r\n")
            .expect("write");
        let mut out = String::new();
        s.read_to_string(&mut out).expect("read");
        assert!(out.starts_with("HTTP/1.1 200 OK\r\n"), "{out}");
    }
    drop(cluster);
    for addr in &addrs {
        assert!(
            std::net::TcpStream::connect(addr).is_err(),
            "{addr} still accepting"
        );
    }

    let err = spawn_engines(3, 65534, EngineConfig::default()).expect_err("port overflow");
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
}

#[tokio::test]
async fn cluster_engines_take_their_own_configs_and_restart_cold_on_the_same_port() {
    let slow = EngineConfig {
        kv_capacity_tokens: 3_200,
        ..EngineConfig::default()
    };
    let mut cluster = spawn_engines_with(vec![EngineConfig::default(), slow], 0).expect("spawn");
    let text = Client::connect(&cluster.engines[1])
        .await
        .request(&get("/metrics"))
        .await
        .body;
    // 3200 tokens in 16-token blocks.
    assert!(String::from_utf8_lossy(&text).contains("num_gpu_blocks=\"200\""));

    let (turn1, _) = conversation();
    let send = |h: EngineHandle, body: String| async move {
        let mut c = Client::connect(&h).await;
        let v = c
            .request(&post("/v1/chat/completions", &body, &[]))
            .await
            .json();
        cached_tokens(&v["usage"])
    };
    let old = cluster.engines[0].clone();
    assert_eq!(send(old.clone(), turn1.clone()).await, 0);
    assert_eq!(send(old.clone(), turn1.clone()).await, 96, "warm");
    old.shutdown();
    assert!(
        TcpStream::connect(old.addr).await.is_err(),
        "refused while down"
    );

    let new = cluster.restart(0).await.expect("restart");
    assert_eq!(new.addr, old.addr);
    assert_eq!(cluster.engines[0].addr, old.addr);
    assert_eq!(
        send(new.clone(), turn1.clone()).await,
        0,
        "the cache starts empty"
    );
    assert_eq!(new.stats.requests.load(Ordering::SeqCst), 1);
    assert!(cluster.restart(5).await.is_err());
    drop(cluster);
    assert!(
        TcpStream::connect(new.addr).await.is_err(),
        "the new engine stops too"
    );
}

#[tokio::test]
async fn timings_follow_config_and_headers() {
    // Only lower bounds: a loaded machine can make things slower, never faster.
    let h = engine(EngineConfig {
        prefill_us_per_token: 2_000,
        decode_ms_per_token: 0,
        ..EngineConfig::default()
    })
    .await;
    let (turn1, _) = conversation();
    let mut c = Client::connect(&h).await;
    let started = Instant::now();
    let v = c
        .request(&post("/v1/chat/completions", &turn1, &[]))
        .await
        .json();
    assert_eq!(v["usage"]["prompt_tokens"], 100);
    assert!(
        started.elapsed() >= Duration::from_millis(200),
        "cold prefill of 100 tokens"
    );

    let started = Instant::now();
    let frames = stream_frames(&mut c, &stream_body(3), &[("x-sim-frame-delay-ms", "60")]).await;
    assert_eq!(frames.len(), 3);
    assert!(
        started.elapsed() >= Duration::from_millis(120),
        "two gaps of 60 ms"
    );
}

#[tokio::test]
async fn a_prefill_in_progress_slows_other_sequences_decode() {
    // Lower bound only (a loaded machine is slower, never faster). Without
    // interference the stream below takes 4 gaps x 50 ms = 200 ms.
    let h = engine(EngineConfig {
        prefill_us_per_token: 6_000,
        decode_ms_per_token: 50,
        prefill_decode_interference: 1.0,
        ..EngineConfig::default()
    })
    .await;
    let (turn1, _) = conversation();
    let mut streaming = Client::connect(&h).await;
    let mut prefilling = Client::connect(&h).await;
    // A 100-token cold prefill (600 ms) starts first and overlaps the stream.
    let cold = tokio::spawn(async move {
        prefilling
            .request(&post(
                "/v1/chat/completions",
                &turn1,
                &[("x-sim-max-tokens", "1")],
            ))
            .await
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    while h.stats.in_flight.load(Ordering::SeqCst) < 1 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let started = Instant::now();
    let frames = stream_frames(&mut streaming, &stream_body(5), &[]).await;
    assert_eq!(frames.len(), 5);
    assert!(
        started.elapsed() >= Duration::from_millis(350),
        "every gap doubled while the other sequence prefilled: {:?}",
        started.elapsed()
    );
    cold.await.expect("cold request");
}

// ---- Anthropic Messages and OpenAI Responses

/// The events of a typed SSE body: each `event:` name with its data.
fn typed_events(body: &[u8]) -> Vec<(String, Value)> {
    let text = std::str::from_utf8(body).expect("UTF-8 stream");
    assert!(text.ends_with("\n\n"), "ends with a whole event: {text:?}");
    text.split_terminator("\n\n")
        .map(|event| {
            let (name, data) = event
                .strip_prefix("event: ")
                .and_then(|e| e.split_once("\ndata: "))
                .unwrap_or_else(|| panic!("not an event line and a data line: {event:?}"));
            let data: Value = serde_json::from_str(data).expect("event JSON");
            assert_eq!(data["type"], name, "the data names its event");
            (name.to_string(), data)
        })
        .collect()
}

/// Sends a streaming request and reads it chunk by chunk: the events of
/// each chunk, until the terminating chunk.
async fn typed_stream(
    c: &mut Client,
    path: &str,
    body: &Value,
    headers: &[(&str, &str)],
) -> Vec<Vec<(String, Value)>> {
    c.send(&post(path, &body.to_string(), headers)).await;
    let (status, resp_headers) = c.head().await;
    assert_eq!(status, 200);
    let ct = resp_headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case("content-type"))
        .map(|(_, v)| v.as_str());
    assert_eq!(ct, Some("text/event-stream"));
    let mut chunks = Vec::new();
    loop {
        match c.chunk().await {
            Chunk::Data(d) => chunks.push(typed_events(&d)),
            Chunk::End => return chunks,
            Chunk::Eof => panic!("stream cut"),
        }
    }
}

fn names(events: &[(String, Value)]) -> Vec<&str> {
    events.iter().map(|(n, _)| n.as_str()).collect()
}

/// A first turn of 105 tokens ("system" + 14 bytes, "user" + 396 bytes),
/// and its conversation after a reply of `reply` tokens and a follow-up
/// question, as chat messages.
fn long_first_turn() -> (&'static str, String) {
    ("You are terse.", "a".repeat(396))
}

fn chat_history(reply_tokens: usize) -> Value {
    let (system, first) = long_first_turn();
    json!([
        {"role": "system", "content": system},
        {"role": "user", "content": first},
        {"role": "assistant", "content": "tok ".repeat(reply_tokens)},
        {"role": "user", "content": "and a follow-up question"},
    ])
}

#[tokio::test]
async fn messages_answers_and_streams_in_anthropic_shapes() {
    let h = engine(EngineConfig::default()).await;
    let mut c = Client::connect(&h).await;
    let body = json!({"model": "claude-x", "max_tokens": 3, "metadata": {"user_id": "u"},
                      "messages": [{"role": "user", "content": "0123456789abcdef"}]});
    let resp = c
        .request(&post("/v1/messages", &body.to_string(), &[]))
        .await;
    assert_eq!(resp.status, 200);
    assert_eq!(resp.header("content-type"), Some("application/json"));
    let v = resp.json();
    assert!(v["id"].as_str().is_some_and(|id| id.starts_with("msg_")));
    assert_eq!(v["type"], "message");
    assert_eq!(v["role"], "assistant");
    assert_eq!(v["model"], "claude-x");
    assert_eq!(
        v["content"],
        json!([{"type": "text", "text": "tok tok tok "}])
    );
    // A max_tokens under the default length cuts the reply.
    assert_eq!(v["stop_reason"], "max_tokens");
    // "user" + 16 bytes = 5 tokens.
    assert_eq!(
        v["usage"],
        json!({"input_tokens": 5, "cache_creation_input_tokens": 0,
               "cache_read_input_tokens": 0, "output_tokens": 3})
    );
    // Every Anthropic request sets max_tokens: one over the default length
    // lets the model end on its own.
    let mut long = body.clone();
    long["max_tokens"] = json!(4096);
    let v = c
        .request(&post("/v1/messages", &long.to_string(), &[]))
        .await
        .json();
    assert_eq!(v["stop_reason"], "end_turn");
    assert_eq!(v["usage"]["output_tokens"], 16);
    // Five tokens fill no block: nothing of the prompt is cached.
    assert_eq!(v["usage"]["input_tokens"], 5);
    assert_eq!(v["usage"]["cache_read_input_tokens"], 0);

    let mut stream = body.clone();
    stream["stream"] = json!(true);
    stream["messages"][0]["content"] = json!("x".repeat(61));
    let chunks = typed_stream(&mut c, "/v1/messages", &stream, &[]).await;
    assert_eq!(chunks.len(), 4, "one chunk a token, then the closing one");
    assert_eq!(
        names(&chunks[0]),
        [
            "message_start",
            "content_block_start",
            "ping",
            "content_block_delta"
        ]
    );
    let start = &chunks[0][0].1["message"];
    assert!(start["id"]
        .as_str()
        .is_some_and(|id| id.starts_with("msg_")));
    assert_eq!(start["content"], json!([]));
    // "user" + 61 bytes = 17 tokens, nothing cached yet.
    assert_eq!(
        start["usage"],
        json!({"input_tokens": 17, "cache_creation_input_tokens": 0,
               "cache_read_input_tokens": 0, "output_tokens": 1})
    );
    for chunk in &chunks[..3] {
        let (name, delta) = chunk.last().unwrap();
        assert_eq!(name, "content_block_delta");
        assert_eq!(
            delta["delta"],
            json!({"type": "text_delta", "text": "tok "})
        );
    }
    assert_eq!(names(&chunks[1]), ["content_block_delta"]);
    assert_eq!(
        names(&chunks[3]),
        ["content_block_stop", "message_delta", "message_stop"]
    );
    let delta = &chunks[3][1].1;
    assert_eq!(delta["delta"]["stop_reason"], "max_tokens");
    assert_eq!(delta["usage"], json!({"output_tokens": 3}));

    // x-sim-* headers as for chat: a later first token, a set length.
    let started = Instant::now();
    let chunks = typed_stream(
        &mut c,
        "/v1/messages",
        &stream,
        &[("x-sim-ttft-ms", "150"), ("x-sim-max-tokens", "5")],
    )
    .await;
    assert!(started.elapsed() >= Duration::from_millis(150));
    assert_eq!(chunks.len(), 6);
    // Now its complete block is cached, and Anthropic's input_tokens
    // leaves it out.
    assert_eq!(
        chunks[0][0].1["message"]["usage"]["cache_read_input_tokens"],
        16
    );
    assert_eq!(chunks[0][0].1["message"]["usage"]["input_tokens"], 1);

    // Invalid requests: 400 in Anthropic's error shape.
    for bad in [
        json!({"max_tokens": 3}),
        json!({"messages": []}),
        json!({"system": 5, "messages": [{"role": "user", "content": "x"}]}),
        json!({"messages": [{"role": "user", "content": [5]}]}),
    ] {
        let resp = c
            .request(&post("/v1/messages", &bad.to_string(), &[]))
            .await;
        assert_eq!(resp.status, 400, "{bad}");
        let v = resp.json();
        assert_eq!(v["type"], "error");
        assert_eq!(v["error"]["type"], "invalid_request_error");
    }
    assert_eq!(h.stats.in_flight.load(Ordering::SeqCst), 0);
}

/// A later turn whose history extends an earlier one hits the prefix
/// cache on Messages as on chat; the system prompt (a string or text
/// blocks) and the content blocks are read as chat reads them, so the same
/// conversation is the same prompt on either API.
#[tokio::test]
async fn a_messages_second_turn_hits_the_prefix_cache_like_chat() {
    let h = engine(EngineConfig::default()).await;
    let mut c = Client::connect(&h).await;
    let (system, first) = long_first_turn();
    let turn1 = json!({"model": "m", "max_tokens": 3, "system": system,
                       "messages": [{"role": "user", "content": first}]});
    let v = c
        .request(&post("/v1/messages", &turn1.to_string(), &[]))
        .await
        .json();
    assert_eq!(v["usage"]["input_tokens"], 105);
    assert_eq!(v["usage"]["cache_read_input_tokens"], 0);
    let reply = v["content"].clone();
    let turn2 = json!({"model": "m", "max_tokens": 3, "stream": true,
                       "system": [{"type": "text", "text": system}],
                       "messages": [
                           {"role": "user", "content": [{"type": "text", "text": first}]},
                           {"role": "assistant", "content": reply},
                           {"role": "user", "content": "and a follow-up question"}]});
    let chunks = typed_stream(&mut c, "/v1/messages", &turn2, &[]).await;
    let usage = &chunks[0][0].1["message"]["usage"];
    // 469 bytes = 118 tokens; turn 1's six complete blocks were cached.
    assert_eq!(usage["cache_read_input_tokens"], 96);
    assert_eq!(usage["input_tokens"], 118 - 96);
    // The same conversation as chat messages: the same prompt, now cached
    // to its last complete block.
    let chat_turn = chat(chat_history(3), json!({"max_tokens": 1}));
    let v = c
        .request(&post("/v1/chat/completions", &chat_turn, &[]))
        .await
        .json();
    assert_eq!(v["usage"]["prompt_tokens"], 118);
    assert_eq!(cached_tokens(&v["usage"]), 112);
}

#[tokio::test]
async fn responses_answer_stream_and_continue_a_stored_turn() {
    let h = engine(EngineConfig::default()).await;
    let mut c = Client::connect(&h).await;
    let (system, first) = long_first_turn();
    let turn1 = json!({"model": "gpt-x", "instructions": system, "input": first,
                       "max_output_tokens": 100});
    let resp = c
        .request(&post("/v1/responses", &turn1.to_string(), &[]))
        .await;
    assert_eq!(resp.status, 200);
    let v = resp.json();
    let id1 = v["id"].as_str().expect("id").to_string();
    assert!(id1.starts_with("resp_"), "{id1}");
    assert_eq!(v["object"], "response");
    assert_eq!(v["status"], "completed");
    assert_eq!(v["model"], "gpt-x");
    assert!(v["previous_response_id"].is_null());
    let output = &v["output"][0];
    assert_eq!(output["type"], "message");
    assert_eq!(output["role"], "assistant");
    assert_eq!(output["content"][0]["type"], "output_text");
    assert_eq!(output["content"][0]["text"], "tok ".repeat(16));
    assert_eq!(
        v["usage"],
        json!({"input_tokens": 105, "input_tokens_details": {"cached_tokens": 0},
               "output_tokens": 16, "output_tokens_details": {"reasoning_tokens": 0},
               "total_tokens": 121})
    );

    // Turn 2 names turn 1: its conversation, then the new input. Its own
    // instructions are not part of it.
    let turn2 = json!({"model": "gpt-x", "stream": true, "previous_response_id": id1,
                       "instructions": "ignored when continuing",
                       "input": [{"type": "message", "role": "user",
                                  "content": [{"type": "input_text",
                                               "text": "and a follow-up question"}]}]});
    let chunks = typed_stream(&mut c, "/v1/responses", &turn2, &[]).await;
    assert_eq!(chunks.len(), 17, "one chunk a token, then the closing one");
    assert_eq!(
        names(&chunks[0]),
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta"
        ]
    );
    let created = &chunks[0][0].1["response"];
    let id2 = created["id"].as_str().expect("id").to_string();
    assert_eq!(created["previous_response_id"], id1.as_str());
    assert_eq!(created["status"], "in_progress");
    assert_eq!(names(&chunks[1]), ["response.output_text.delta"]);
    assert_eq!(chunks[1][0].1["delta"], "tok ");
    assert_eq!(
        names(&chunks[16]),
        [
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed"
        ]
    );
    let done = &chunks[16][3].1["response"];
    assert_eq!(done["id"], id2.as_str());
    assert_eq!(done["status"], "completed");
    // 420 + "assistant" and 16 tokens (73) + "user" and the question (28)
    // = 521 bytes = 131 tokens; turn 1's six complete blocks cached.
    assert_eq!(done["usage"]["input_tokens"], 131);
    assert_eq!(done["usage"]["input_tokens_details"]["cached_tokens"], 96);
    assert_eq!(done["usage"]["output_tokens"], 16);

    // The same conversation as chat messages is the same prompt, cached to
    // turn 2's last complete block.
    let v = c
        .request(&post(
            "/v1/chat/completions",
            &chat(chat_history(16), json!({"max_tokens": 1})),
            &[],
        ))
        .await
        .json();
    assert_eq!(v["usage"]["prompt_tokens"], 131);
    assert_eq!(cached_tokens(&v["usage"]), 128);

    // Turn 3 continues turn 2; a short limit leaves it incomplete.
    let turn3 = json!({"previous_response_id": id2, "input": "x", "max_output_tokens": 2});
    let v = c
        .request(&post("/v1/responses", &turn3.to_string(), &[]))
        .await
        .json();
    assert_eq!(v["status"], "incomplete");
    assert_eq!(v["incomplete_details"]["reason"], "max_output_tokens");
    assert_eq!(v["usage"]["output_tokens"], 2);
    assert!(v["usage"]["input_tokens"].as_u64().unwrap() > 131 + 16);
    assert_eq!(v["usage"]["input_tokens_details"]["cached_tokens"], 128);

    // An id the engine does not hold: 404 as OpenAI answers it.
    let unknown = json!({"previous_response_id": "resp_nope", "input": "x"});
    let resp = c
        .request(&post("/v1/responses", &unknown.to_string(), &[]))
        .await;
    assert_eq!(resp.status, 404);
    let v = resp.json();
    assert_eq!(v["error"]["code"], "previous_response_not_found");
    assert_eq!(v["error"]["param"], "previous_response_id");
    assert!(v["error"]["message"]
        .as_str()
        .is_some_and(|m| m.contains("resp_nope")));
    // A turn asked not to be stored cannot be continued.
    let unstored = json!({"input": "y", "store": false});
    let v = c
        .request(&post("/v1/responses", &unstored.to_string(), &[]))
        .await
        .json();
    let next = json!({"previous_response_id": v["id"], "input": "z"});
    let resp = c
        .request(&post("/v1/responses", &next.to_string(), &[]))
        .await;
    assert_eq!(resp.status, 404);
    // Invalid input: 400.
    for bad in [
        json!({"model": "m"}),
        json!({"input": []}),
        json!({"input": [5]}),
        json!({"input": "x", "previous_response_id": 5}),
    ] {
        let resp = c
            .request(&post("/v1/responses", &bad.to_string(), &[]))
            .await;
        assert_eq!(resp.status, 400, "{bad}");
    }
    assert_eq!(h.stats.in_flight.load(Ordering::SeqCst), 0);
}

// The engine profiles.

fn profile(p: Profile) -> EngineConfig {
    EngineConfig {
        profile: p,
        ..EngineConfig::default()
    }
}

async fn metrics_text(h: &EngineHandle) -> String {
    let resp = Client::connect(h).await.request(&get("/metrics")).await;
    assert_eq!(resp.status, 200);
    String::from_utf8(resp.body).expect("UTF-8 metrics")
}

#[tokio::test]
async fn every_profile_reports_the_second_turns_cached_tokens() {
    for p in Profile::ALL {
        let h = engine(profile(p)).await;
        let (turn1, turn2) = conversation();
        let mut c = Client::connect(&h).await;
        let v = c
            .request(&post("/v1/chat/completions", &turn1, &[]))
            .await
            .json();
        assert_eq!(cached_tokens(&v["usage"]), 0, "{p}");
        assert!(v["id"]
            .as_str()
            .is_some_and(|id| id.starts_with(&format!("chatcmpl-sim{}-", h.port()))));
        let frames = stream_frames(&mut c, &turn2, &[]).await;
        let usage = &frames.last().expect("usage frame")["usage"];
        assert_eq!(usage["prompt_tokens"], 113, "{p}");
        // Block-granular caches keep turn 1's 6 complete blocks; a
        // llama.cpp slot keeps every byte turn 2 repeats: turn 1's prompt,
        // the role and the 3 tokens of reply it quotes (421 bytes).
        let expected = if p == Profile::Llamacpp { 105 } else { 96 };
        assert_eq!(cached_tokens(usage), expected, "{p}");
        h.shutdown();
    }
}

#[tokio::test]
async fn each_profile_exports_its_engines_metric_names_and_no_others() {
    let vllm = [
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"12500\"}",
    ];
    let cases: [(Profile, Vec<&str>, &[&str]); 4] = [
        (Profile::Slots, vllm.to_vec(), &["sglang:", "llamacpp:"]),
        (
            Profile::Vllm,
            [&vllm[..], &["vllm:num_preemptions_total"]].concat(),
            &["sglang:", "llamacpp:"],
        ),
        (
            Profile::Sglang,
            vec![
                "sglang:num_running_reqs",
                "sglang:num_queue_reqs",
                "sglang:token_usage",
                "sglang:max_total_num_tokens{model_name=\"sim-model\"} 200000",
                "sglang:cache_hit_rate",
                "sglang:prompt_tokens_total",
                "sglang:generation_tokens_total",
            ],
            &["vllm:", "llamacpp:"],
        ),
        (
            Profile::Llamacpp,
            vec![
                "llamacpp:requests_processing",
                "llamacpp:requests_deferred",
                "llamacpp:prompt_tokens_total",
                "llamacpp:prompt_tokens_cached_total",
                "llamacpp:tokens_predicted_total",
                "llamacpp:prompt_tokens_seconds",
                "llamacpp:predicted_tokens_seconds",
                "llamacpp:n_decode_total",
            ],
            // No KV capacity or usage: a llama.cpp gateway has none to read.
            &["vllm:", "sglang:", "kv_cache", "usage"],
        ),
    ];
    for (p, present, absent) in cases {
        let h = engine(profile(p)).await;
        // A finished request, so counters have moved.
        let v = Client::connect(&h)
            .await
            .request(&post(
                "/v1/chat/completions",
                &chat(user("hi"), json!({})),
                &[],
            ))
            .await;
        assert_eq!(v.status, 200, "{p}");
        let text = metrics_text(&h).await;
        // Every profile also counts under the simulator's own names, which
        // the bench reads the same way from each.
        for name in ["sim:generation_tokens_total", "sim:prefix_cache_hits_total"] {
            assert!(text.contains(name), "{p}: no {name} in\n{text}");
        }
        for name in present {
            assert!(text.contains(name), "{p}: no {name} in\n{text}");
        }
        for name in absent {
            assert!(!text.contains(name), "{p}: {name} in\n{text}");
        }
        h.shutdown();
    }
}

#[tokio::test]
async fn batch_profiles_count_generation_and_prefix_queries() {
    let h = engine(profile(Profile::Vllm)).await;
    let (turn1, turn2) = conversation();
    let mut c = Client::connect(&h).await;
    c.request(&post("/v1/chat/completions", &turn1, &[])).await;
    stream_frames(&mut c, &turn2, &[]).await;
    assert_eq!(metric(&h, "vllm:prompt_tokens_total").await, 213.0);
    assert_eq!(metric(&h, "vllm:generation_tokens_total").await, 32.0);
    assert_eq!(metric(&h, "vllm:prefix_cache_queries_total").await, 213.0);
    assert_eq!(metric(&h, "vllm:prefix_cache_hits_total").await, 96.0);
    assert_eq!(metric(&h, "vllm:num_requests_running").await, 0.0);
    assert_eq!(metric(&h, "vllm:kv_cache_usage_perc").await, 0.0);
    let h = engine(profile(Profile::Sglang)).await;
    let mut c = Client::connect(&h).await;
    c.request(&post("/v1/chat/completions", &turn1, &[])).await;
    stream_frames(&mut c, &turn2, &[]).await;
    assert_eq!(metric(&h, "sglang:cache_hit_rate").await, 96.0 / 213.0);
}

#[tokio::test]
async fn a_vllm_client_that_leaves_frees_its_blocks() {
    let h = engine(EngineConfig {
        step_cost: StepCost {
            base_us: 2_000.0,
            per_token_us: 0.0,
            per_seq_us: 0.0,
            per_context_token_us: 0.0,
        },
        ..profile(Profile::Vllm)
    })
    .await;
    let hr = &h;
    let running = start_stream(&h, &[], 100_000).await;
    // Control: while it streams it holds a sequence and blocks.
    assert_eq!(metric(&h, "vllm:num_requests_running").await, 1.0);
    assert!(metric(&h, "vllm:kv_cache_usage_perc").await > 0.0);
    drop(running);
    eventually("the request aborted", || async move {
        hr.stats.in_flight.load(Ordering::SeqCst) == 0
            && metric(hr, "vllm:num_requests_running").await == 0.0
            && metric(hr, "vllm:kv_cache_usage_perc").await == 0.0
    })
    .await;
}

#[tokio::test]
async fn a_request_longer_than_the_kv_gets_vllms_400() {
    let h = engine(EngineConfig {
        kv_capacity_tokens: 1_000,
        ..profile(Profile::Vllm)
    })
    .await;
    let mut c = Client::connect(&h).await;
    let resp = c
        .request(&post(
            "/v1/chat/completions",
            &chat(user("hi"), json!({"max_tokens": 1_000})),
            &[],
        ))
        .await;
    assert_eq!(resp.status, 400);
    let v = resp.json();
    assert_eq!(v["code"], 400);
    assert!(v["message"]
        .as_str()
        .is_some_and(|m| m.contains("maximum context length is 992 tokens")));
    // Control: one that fits is served.
    let resp = c
        .request(&post(
            "/v1/chat/completions",
            &chat(user("hi"), json!({"max_tokens": 900})),
            &[],
        ))
        .await;
    assert_eq!(resp.status, 200);
}

#[tokio::test]
async fn llamacpp_refuses_over_its_slot_context_and_serves_props_and_health() {
    let h = engine(EngineConfig {
        max_running: 2,
        kv_capacity_tokens: 1_000,
        ..profile(Profile::Llamacpp)
    })
    .await;
    let mut c = Client::connect(&h).await;
    // "user" + "hi": 2 tokens, and 499 more: over the slot's 500.
    let resp = c
        .request(&post(
            "/v1/chat/completions",
            &chat(user("hi"), json!({"max_tokens": 499})),
            &[],
        ))
        .await;
    assert_eq!(resp.status, 400);
    assert_eq!(
        resp.json(),
        json!({"error": {"code": 400, "message": "the request exceeds the available context size, try increasing it", "type": "exceed_context_size_error"}})
    );
    // Control: 498 fits.
    let resp = c
        .request(&post(
            "/v1/chat/completions",
            &chat(user("hi"), json!({"max_tokens": 498})),
            &[("x-sim-frame-delay-ms", "0")],
        ))
        .await;
    assert_eq!(resp.status, 200);
    let props = c.request(&get("/props")).await.json();
    assert_eq!(props["default_generation_settings"]["n_ctx"], 500);
    assert_eq!(props["total_slots"], 2);
    assert_eq!(props["model_path"], "sim-model");
    let health = c.request(&get("/health")).await;
    assert_eq!(
        (health.status, health.json()),
        (200, json!({"status": "ok"}))
    );
    h.faults.health_down.store(true, Ordering::SeqCst);
    assert_eq!(c.request(&get("/health")).await.status, 503);
}

#[tokio::test]
async fn llamacpp_defers_when_every_slot_is_busy() {
    let h = engine(EngineConfig {
        max_running: 1,
        ..profile(Profile::Llamacpp)
    })
    .await;
    let hr = &h;
    let running = start_stream(&h, &[("x-sim-gate", "never")], 4).await;
    let mut deferred = Client::connect(&h).await;
    deferred
        .send(&post("/v1/chat/completions", &stream_body(2), &[]))
        .await;
    eventually("a deferred request", || async move {
        let text = metrics_text(hr).await;
        text.contains("llamacpp:requests_deferred 1\n")
            && text.contains("llamacpp:requests_processing 1\n")
    })
    .await;
    drop(running);
    let (status, _) = deferred.head().await;
    assert_eq!(status, 200);
    eventually("the deferred request served", || async move {
        metrics_text(hr)
            .await
            .contains("llamacpp:requests_deferred 0\n")
    })
    .await;
}

#[tokio::test]
async fn llamacpp_restores_a_conversation_whose_slot_was_taken_from_the_host_cache() {
    // One slot. A's first turn (250 tokens), then B's takes the slot, then
    // A's second turn (259 tokens), which repeats A's turn and its 4-token
    // reply ("user" + 996 bytes, "assistant" + 16 bytes: 1025 bytes, 256
    // whole tokens, 257 in A's slot) and asks for more.
    let first = "a".repeat(996);
    let a1 = chat(user(&first), json!({"max_tokens": 4}));
    let b1 = chat(user("b"), json!({"max_tokens": 4}));
    let a2 = chat(
        json!([
            {"role": "user", "content": first},
            {"role": "assistant", "content": "tok tok tok tok "},
            {"role": "user", "content": "more"},
        ]),
        json!({"max_tokens": 1}),
    );
    // Control first: without the host cache (`--cache-ram 0`) A comes back
    // cold but for "user", which B's turn in the slot shares.
    for (host, cached) in [(0, 1), (DEFAULT_HOST_CACHE_TOKENS, 256)] {
        let cfg = EngineConfig {
            max_running: 1,
            prefill_us_per_token: 4_000,
            host_cache_tokens: host,
            ..profile(Profile::Llamacpp)
        };
        let h = engine(cfg.clone()).await;
        let mut c = Client::connect(&h).await;
        // B shares one token with A: "user".
        for (body, cached) in [(&a1, 0), (&b1, 1)] {
            let v = c.request(&post("/v1/chat/completions", body, &[])).await;
            assert_eq!(cached_tokens(&v.json()["usage"]), cached);
        }
        let started = Instant::now();
        let v = c
            .request(&post("/v1/chat/completions", &a2, &[]))
            .await
            .json();
        let elapsed = started.elapsed();
        assert_eq!(v["usage"]["prompt_tokens"], 259);
        assert_eq!(cached_tokens(&v["usage"]), cached, "host cache {host}");
        let text = metrics_text(&h).await;
        // B's 1 and A's second turn's.
        let total = 1 + cached;
        assert!(
            text.contains(&format!("llamacpp:prompt_tokens_cached_total {total}\n")),
            "{text}"
        );
        // Lower bounds only (a loaded machine is slower, never faster): the
        // restore copies all 257 tokens of A's slot back, at a fiftieth of
        // their prefill (20.56 ms), then prefills the 3 new tokens (12 ms);
        // without it, all 258 uncached ones are prefilled.
        let least = if host > 0 {
            engine::llamacpp::restore_time(&cfg, 257) + Duration::from_millis(12)
        } else {
            Duration::from_millis(258 * 4)
        };
        assert!(elapsed >= least, "{elapsed:?} < {least:?}");
        h.shutdown();
    }
}

#[tokio::test]
async fn sglang_answers_its_info_endpoints() {
    let h = engine(profile(Profile::Sglang)).await;
    let mut c = Client::connect(&h).await;
    for path in ["/get_server_info", "/server_info"] {
        let resp = c.request(&get(path)).await;
        assert_eq!(resp.status, 200, "{path}");
        assert_eq!(resp.json()["max_total_num_tokens"], 200_000, "{path}");
    }
    let info = c.request(&get("/get_model_info")).await.json();
    assert_eq!(info["model_path"], "sim-model");
    // Control: the vLLM profile has no such endpoint.
    let v = engine(profile(Profile::Vllm)).await;
    let resp = Client::connect(&v)
        .await
        .request(&get("/get_server_info"))
        .await;
    assert_eq!(resp.status, 404);
}

#[test]
fn profiles_parse_and_print_their_names() {
    for p in Profile::ALL {
        assert_eq!(p.to_string().parse::<Profile>(), Ok(p));
    }
    assert_eq!("vllm".parse::<Profile>(), Ok(Profile::Vllm));
    assert!("VLLM".parse::<Profile>().is_err());
    assert_eq!(EngineConfig::default().profile, Profile::Slots);
}
