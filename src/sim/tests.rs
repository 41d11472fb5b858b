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
            panic!("body is not JSON ({e}): {:?}", String::from_utf8_lossy(&self.body))
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
            Err(_) => panic!("no data within {DEADLINE:?}; have {:?}", String::from_utf8_lossy(&self.buf)),
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
        assert!(status_line.starts_with("HTTP/1.1 "), "status line {status_line:?}");
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
        assert_eq!(&self.buf[size..size + 2], b"\r\n", "chunk data longer than its size");
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
    let mut out = format!("POST {path} HTTP/1.1\r\nhost: sim\r\ncontent-type: application/json\r\n");
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
    assert!(text.contains(&format!("# TYPE {name} ")), "no TYPE line for {name}");
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
    let body = chat(user("hello there"), json!({"stream": true, "max_tokens": 3}));
    let frames = stream_frames(&mut c, &body, &[]).await;
    assert_eq!(frames.len(), 3);
    for (i, f) in frames.iter().enumerate() {
        assert_eq!(f["object"], "chat.completion.chunk");
        assert_eq!(f["model"], "sim-model");
        assert!(f["id"].as_str().is_some_and(|id| id.starts_with("chatcmpl-")));
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
        .request(&post("/v1/chat/completions", &chat(user("hey"), json!({"max_tokens": 4})), &[]))
        .await;
    assert_eq!(resp.status, 200);
    assert_eq!(resp.header("content-type"), Some("application/json"));
    let v = resp.json();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["content"], "tok tok tok tok ");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 4);
    assert_eq!(cached_tokens(&v["usage"]), 0);

    let body = json!({"model": "other", "prompt": "abcdefgh", "max_completion_tokens": 2}).to_string();
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
    let v = c.request(&post("/v1/chat/completions", &turn1, &[])).await.json();
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
        let v = c.request(&post("/v1/chat/completions", &body, &[])).await.json();
        cached_tokens(&v["usage"])
    }
    let mut c = Client::connect(&h).await;
    assert_eq!(send(&mut c, 'A').await, 0);
    assert_eq!(send(&mut c, 'B').await, 0);
    assert_eq!(send(&mut c, 'C').await, 0);
    assert_eq!(send(&mut c, 'A').await, 48, "A is cached and becomes most recent");
    // D needs room: B is the least recently used prefix.
    assert_eq!(send(&mut c, 'D').await, 0);
    assert_eq!(send(&mut c, 'A').await, 48, "recently used prefix survives");
    assert_eq!(send(&mut c, 'B').await, 0, "least recently used prefix was evicted");
    assert!(metric(&h, "sim:prefix_cache_blocks").await <= 10.0);
    assert_eq!(metric(&h, "vllm:kv_cache_usage_perc").await, 0.0);
}
