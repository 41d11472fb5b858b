//! Body-log frames from the real gateway to a frame
//! sink that parses the wire format itself, the queue when the listener is
//! away, sampling toggles, and the `bodylog-listen` subcommand (hourly JSONL,
//! SIGTERM, exporter metrics).

mod common;

use common::bodylog::{encode_frame, FrameSink, Listener, ReservedPort};
use common::canned::{canned_route, Canned};
use common::http::{self, Conn};
use common::*;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::process::Command;
use std::time::Duration;

const CHAT: &str = "/chat/v1/chat/completions";

fn gateway(routes: &[(&str, String)], extra_config: String, env: Vec<(String, String)>) -> Gateway {
    Gateway::start_configured(routes, extra_config, env)
}

fn keys_env(dir: &tempfile::TempDir, text: &str) -> Vec<(String, String)> {
    let path = dir.path().join("api-keys");
    std::fs::write(&path, text).unwrap();
    vec![(
        "LLM_GATEWAY_API_KEYS_FILE".into(),
        path.display().to_string(),
    )]
}

fn frames_metric(gw: &Gateway, result: &str) -> f64 {
    gw.metric(
        "llm_gateway_bodylog_frames_total",
        &[&format!("result=\"{result}\"")],
    )
}

fn toggle(gw: &Gateway, from: Ipv4Addr, query: &str) -> http::Response {
    Conn::open_from(IpAddr::V4(from), gw.addr).request(
        "POST",
        &format!("/_bodylog_toggle?{query}"),
        &[],
        b"",
    )
}

fn chat(gw: &Gateway, content: &str) -> http::Response {
    let r = http::post_json(gw.addr, CHAT, &[], &chat_body("", content, false));
    assert_eq!(r.status(), 200, "{}", r.text());
    r
}

const SSE_CONTENT: &str = "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"system_fingerprint\":null,\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"},\"finish_reason\":null}]}\n\n";
const SSE_USAGE: &str = "data: {\"id\":\"c1\",\"choices\":[],\"usage\":{\"prompt_tokens\":11,\"completion_tokens\":1,\"prompt_tokens_details\":{\"cached_tokens\":3}},\"actual_usage\":{\"prompt_tokens\":12}}\n\n";
const SSE_DONE: &str = "data: [DONE]\n\n";

#[test]
fn frames_arrive_byte_exact_without_credentials_or_the_raw_session_id() {
    let stream = format!("{SSE_CONTENT}{SSE_USAGE}{SSE_DONE}").into_bytes();
    // Frames split mid-event, as an engine's TCP reads may.
    let parts = vec![
        stream[..40].to_vec(),
        stream[40..200].to_vec(),
        stream[200..].to_vec(),
    ];
    let engine = Canned::start("text/event-stream", parts, true);
    let sink = FrameSink::start();
    let dir = tempfile::tempdir().unwrap();
    let route = canned_route(
        engine.port(),
        "postprocess: vllm_format\nforward_client_key: true\n",
    );
    let gw = gateway(
        &[("chat", route)],
        sink.config(""),
        keys_env(&dir, "sk-test-1:alice\n"),
    );
    let body = br#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    let headers = [
        ("Content-Type", "application/json"),
        ("Authorization", "Bearer sk-test-1"),
        ("X-Api-Key", "sk-test-1"),
        ("Cookie", "sid=cookie-secret-42"),
        ("X-Session-Id", "raw-session-77"),
        ("X-Tag", "keep-me"),
    ];
    let resp = Conn::open(gw.addr).request("POST", CHAT, &headers, body);
    assert_eq!(resp.status(), 200, "{}", resp.text());

    let frames = sink.wait_frames(1);
    assert_eq!(frames.len(), 1);
    let f = &frames[0];
    assert_eq!(
        u32::from_be_bytes(f.wire[..4].try_into().unwrap()) as usize,
        f.wire.len() - 4
    );
    assert_eq!(f.req, body, "the request body, byte for byte");
    assert_eq!(f.resp, stream, "the engine's raw bytes, byte for byte");
    // The client got the post-processed copy; the log the raw one.
    assert!(!resp.text().contains("actual_usage"), "{}", resp.text());
    assert!(String::from_utf8_lossy(&f.resp).contains("actual_usage"));
    let wire = String::from_utf8_lossy(&f.wire);
    for secret in ["sk-test-1", "cookie-secret-42", "raw-session-77"] {
        assert!(!wire.contains(secret), "{secret} reached the frame");
    }
    let m = &f.meta;
    let sent_headers = m["req_headers"].as_object().unwrap();
    for gone in ["authorization", "x-api-key", "cookie", "x-session-id"] {
        assert!(!sent_headers.contains_key(gone), "{gone}: {sent_headers:?}");
    }
    assert_eq!(m["req_headers"]["x-tag"], "keep-me");
    assert_eq!(
        m["session_hash"].as_str(),
        resp.header("x-routed-session"),
        "the hash, as X-Routed-Session shows it"
    );
    assert_eq!(m["session_src"], "header:x-session-id");
    assert_eq!(m["owner"], "alice");
    assert_eq!(m["method"], "POST");
    assert_eq!(m["uri"], CHAT);
    assert_eq!(m["client_ip"], "127.0.0.1");
    assert_eq!(m["route"], "chat");
    assert_eq!(m["peer"], "canned");
    assert_eq!(m["mode"], "new");
    assert_eq!(m["status"], 200);
    assert_eq!(m["resp_bytes"], stream.len());
    assert_eq!(m["req_bytes"], body.len());
    assert_eq!(m["resp_truncated"], false);
    assert_eq!(m["req_truncated"], false);
    assert_eq!(
        (
            &m["prompt_tokens"],
            &m["cached_tokens"],
            &m["completion_tokens"]
        ),
        (&json!(11), &json!(3), &json!(1))
    );
    let chunks = m["chunk_count"].as_u64().unwrap();
    assert!((1..=3).contains(&chunks), "{chunks}");
    let (first, last, rt) = (
        m["first_chunk_t"].as_f64().unwrap(),
        m["last_chunk_t"].as_f64().unwrap(),
        m["rt"].as_f64().unwrap(),
    );
    assert!(first <= last && last <= rt, "{first} {last} {rt}");
    assert!(m["ts"].as_str().unwrap().ends_with('Z'), "{}", m["ts"]);
    assert_eq!(m["request_id"].as_str().unwrap().len(), 16);

    // Control: the engine did receive every one of them.
    let head = engine.heads.lock()[0].clone();
    for secret in ["sk-test-1", "cookie-secret-42", "raw-session-77"] {
        assert!(head.contains(secret), "engine head lacks {secret}: {head}");
    }
}

#[test]
fn a_3_mb_response_keeps_its_head_a_marker_and_its_tail() {
    let total = 3_000_000usize;
    let body: Vec<u8> = (0..total).map(|i| (i % 251) as u8).collect();
    let parts: Vec<Vec<u8>> = body.chunks(64 << 10).map(<[u8]>::to_vec).collect();
    let engine = Canned::start("application/octet-stream", parts, true);
    let sink = FrameSink::start();
    let gw = gateway(
        &[("chat", canned_route(engine.port(), ""))],
        sink.config(""),
        vec![],
    );
    let content = "x".repeat(2_500_000);
    let request = serde_json::to_vec(
        &json!({"model": "m", "messages": [{"role": "user", "content": content}]}),
    )
    .unwrap();
    let resp = Conn::open(gw.addr).request(
        "POST",
        CHAT,
        &[("Content-Type", "application/json")],
        &request,
    );
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.body, body, "the client got every byte");

    let f = &sink.wait_frames(1)[0];
    let (head, tail) = (1_572_864usize, 524_288usize);
    let marker = format!(
        "[BODYLOG_TRUNCATED {} BYTES MISSING IN MIDDLE]",
        total - head - tail
    );
    assert_eq!(f.resp.len(), head + marker.len() + tail);
    assert_eq!(&f.resp[..head], &body[..head]);
    assert_eq!(&f.resp[head..head + marker.len()], marker.as_bytes());
    assert_eq!(&f.resp[head + marker.len()..], &body[total - tail..]);
    assert_eq!(f.meta["resp_bytes"], total);
    assert_eq!(f.meta["resp_truncated"], true);
    // The request keeps its first 2 MiB.
    assert_eq!(f.req.len(), 2 << 20);
    assert_eq!(f.req, &request[..2 << 20]);
    assert_eq!(f.meta["req_bytes"], request.len());
    assert_eq!(f.meta["req_truncated"], true);
}

#[test]
fn an_absent_listener_drops_and_counts_then_a_late_one_gets_the_queue() {
    let cluster = engines(1);
    let reserved = ReservedPort::new();
    let port = reserved.port();
    let gw = gateway(
        &[("chat", route_yaml(&ports(&cluster), ""))],
        format!("bodylog:\n  listener: 127.0.0.1:{port}\n  queue_frames: 2\n"),
        vec![],
    );
    for i in 0..8 {
        chat(&gw, &format!("no listener {i}"));
    }
    // Two frames wait in the queue, the other six were dropped.
    wait_for("6 dropped frames", DEADLINE, || {
        (frames_metric(&gw, "dropped") == 6.0).then_some(())
    });
    assert_eq!(frames_metric(&gw, "sent"), 0.0);
    let status = http::get(gw.addr, "/_bodylog_status").json();
    assert_eq!(status["target"], format!("127.0.0.1:{port}"));
    assert_ne!(status["state"], "connected", "{status}");
    assert_eq!(status["queue"]["frames"], 2, "{status}");
    assert_eq!(status["frames"]["dropped"], 6);

    // Control: once the listener is there the queue goes out, and so does
    // every later frame.
    let sink = FrameSink::on_reserved(reserved);
    sink.wait_frames(2);
    for i in 0..3 {
        chat(&gw, &format!("listener up {i}"));
    }
    let frames = sink.wait_frames(5);
    assert_eq!(frames.len(), 5);
    let content = |f: &common::bodylog::Captured| {
        let req: Value = serde_json::from_slice(&f.req).unwrap();
        req["messages"][0]["content"].as_str().unwrap().to_string()
    };
    assert_eq!(
        content(&frames[0]),
        "no listener 0",
        "the queue kept the first"
    );
    wait_for("5 sent frames", DEADLINE, || {
        (frames_metric(&gw, "sent") == 5.0).then_some(())
    });
    assert_eq!(frames_metric(&gw, "dropped"), 6.0);
    let status = http::get(gw.addr, "/_bodylog_status").json();
    assert_eq!(status["state"], "connected", "{status}");
}

#[test]
fn sampling_follows_the_toggle_which_answers_only_loopback() {
    let cluster = engines(1);
    let sink = FrameSink::start();
    let gw = gateway(
        &[("chat", route_yaml(&ports(&cluster), ""))],
        sink.config(""),
        vec![],
    );
    let contents = |frames: &[common::bodylog::Captured]| -> Vec<String> {
        frames
            .iter()
            .map(|f| {
                let req: Value = serde_json::from_slice(&f.req).unwrap();
                req["messages"][0]["content"].as_str().unwrap().to_string()
            })
            .collect()
    };
    // Another source address is refused, whatever the headers claim.
    let refused = Conn::open_from(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2)), gw.addr).request(
        "POST",
        "/_bodylog_toggle?pct=0",
        &[("X-Forwarded-For", "127.0.0.1")],
        b"",
    );
    assert_eq!(refused.status(), 403);
    assert_eq!(refused.json()["error"]["type"], "forbidden");
    chat(&gw, "after refused toggle");
    assert_eq!(contents(&sink.wait_frames(1)), ["after refused toggle"]);

    // Control: from 127.0.0.1 it applies. pct=0 captures nothing: the
    // frame of the request after pct=100 is the next one to arrive.
    let r = toggle(&gw, Ipv4Addr::LOCALHOST, "pct=0");
    assert_eq!(r.status(), 200, "{}", r.text());
    assert_eq!(r.json()["sample_pct"]["value"], 0);
    for i in 0..5 {
        chat(&gw, &format!("unsampled {i}"));
    }
    assert_eq!(toggle(&gw, Ipv4Addr::LOCALHOST, "pct=100").status(), 200);
    chat(&gw, "marker 1");
    let frames = sink.wait_frames(2);
    assert_eq!(contents(&frames), ["after refused toggle", "marker 1"]);

    // pct=100 captures all; pct=50 exactly half of ten.
    for i in 0..5 {
        chat(&gw, &format!("sampled {i}"));
    }
    assert_eq!(toggle(&gw, Ipv4Addr::LOCALHOST, "pct=50").status(), 200);
    for i in 0..10 {
        chat(&gw, &format!("half {i}"));
    }
    assert_eq!(toggle(&gw, Ipv4Addr::LOCALHOST, "reset=1").status(), 200);
    chat(&gw, "marker 2");
    let frames = sink.wait_frames(13);
    let got = contents(&frames);
    assert_eq!(got.last().map(String::as_str), Some("marker 2"));
    assert_eq!(got.iter().filter(|c| c.starts_with("sampled")).count(), 5);
    assert_eq!(got.iter().filter(|c| c.starts_with("half")).count(), 5);
    assert_eq!(got.len(), 13, "{got:?}");

    // on=0 stops capturing like pct=0, and outlives a reload; status
    // reports every count.
    assert_eq!(toggle(&gw, Ipv4Addr::LOCALHOST, "on=0").status(), 200);
    gw.reload();
    let status = http::get(gw.addr, "/_bodylog_status").json();
    assert_eq!(status["enabled"]["on"], false);
    assert_eq!(status["enabled"]["source"], "runtime");
    assert_eq!(status["frames"]["sent"], 13, "{status}");
    assert_eq!(
        http::get(gw.addr, "/_bodylog_toggle?pct=1").status(),
        405,
        "GET is not a toggle"
    );
    assert_eq!(toggle(&gw, Ipv4Addr::LOCALHOST, "pct=101").status(), 400);
}

#[test]
fn unset_captures_nothing_and_the_env_overrides_the_file() {
    let cluster = engines(1);
    let route = route_yaml(&ports(&cluster), "");
    let off = gateway(&[("chat", route.clone())], String::new(), vec![]);
    chat(&off, "not logged");
    let status = http::get(off.addr, "/_bodylog_status").json();
    assert_eq!(status["configured"], false);
    assert_eq!(status["state"], "off");
    let r = toggle(&off, Ipv4Addr::LOCALHOST, "on=1");
    assert_eq!(r.status(), 409, "{}", r.text());
    assert_eq!(off.metric("llm_gateway_bodylog_frames_total", &[]), 0.0);

    // Control: the env variable alone turns it on, over a file that names
    // a listener nobody runs.
    let sink = FrameSink::start();
    let dead = free_port();
    let on = gateway(
        &[("chat", route)],
        format!("bodylog:\n  listener: 127.0.0.1:{dead}\n"),
        vec![("BODYLOG_LISTENER_HOST".into(), sink.addr.to_string())],
    );
    chat(&on, "logged");
    assert_eq!(sink.wait_frames(1).len(), 1);
    let status = http::get(on.addr, "/_bodylog_status").json();
    assert_eq!(status["target"], sink.addr.to_string());
}

/// Hour of the system clock as `date` spells it, independent of the
/// gateway's own formatting.
fn utc_hour_file() -> String {
    let out = Command::new("date")
        .args(["-u", "+%Y%m%d-%H"])
        .output()
        .expect("date");
    format!("{}.jsonl", String::from_utf8_lossy(&out.stdout).trim())
}

#[test]
fn the_listener_writes_hourly_jsonl_and_its_metrics_match_the_records() {
    let listener = Listener::start();
    let cluster = engines(1);
    let json_reply = br#"{"id":"x","choices":[{"message":{"content":"ok"}}],"usage":{"prompt_tokens":20,"completion_tokens":4,"prompt_tokens_details":{"cached_tokens":8}},"actual_usage":{"prompt_tokens":21}}"#;
    let engine = Canned::start("application/json", vec![json_reply.to_vec()], false);
    let dir = tempfile::tempdir().unwrap();
    let hour_before = utc_hour_file();
    let gw = gateway(
        &[
            (
                "chat",
                route_yaml(&ports(&cluster), "include_usage: true\n"),
            ),
            (
                "canned",
                canned_route(engine.port(), "postprocess: strip_actual_usage\n"),
            ),
        ],
        format!("bodylog:\n  listener: {}\n", listener.addr),
        keys_env(&dir, "sk-a:alice\nsk-b:bob\n"),
    );
    let send = |path: &str, key: &str, body: &Value| {
        let auth = format!("Bearer {key}");
        let r = http::post_json(gw.addr, path, &[("Authorization", &auth)], body);
        assert_eq!(r.status(), 200, "{}", r.text());
        r
    };
    for i in 0..3 {
        send(
            CHAT,
            "sk-a",
            &chat_body(&format!("s{i}"), "stream please", true),
        );
    }
    for i in 0..2 {
        send(
            CHAT,
            "sk-b",
            &chat_body(&format!("b{i}"), "json please", false),
        );
    }
    let stripped = send(
        "/canned/v1/chat/completions",
        "sk-a",
        &json!({"model": "m", "messages": []}),
    );
    assert!(!stripped.text().contains("actual_usage"));

    let records = listener.wait_records(6);
    assert_eq!(records.len(), 6);
    let hour_after = utc_hour_file();
    for name in listener.files() {
        assert!(
            name == hour_before || name == hour_after,
            "{name} is not this hour's file ({hour_before})"
        );
    }
    for r in &records {
        assert!(r["req"].is_string() && r["resp"].is_string(), "{r}");
        assert!(
            r["resp_meta"]["usage"]["prompt_tokens"].as_u64().is_some(),
            "{r}"
        );
        assert_eq!(r["status"], 200);
    }
    let canned = records.iter().find(|r| r["route"] == "canned").unwrap();
    assert_eq!(canned["resp"], String::from_utf8_lossy(json_reply).as_ref());
    assert_eq!(
        canned["resp_meta"]["actual_usage"]["prompt_tokens"], 21,
        "kept although the client's copy lost it"
    );
    let streamed = records
        .iter()
        .filter(|r| r["resp"].as_str().unwrap().starts_with("data:"))
        .count();
    assert_eq!(streamed, 3);

    // The exporter's numbers are the records' numbers.
    let mut groups: BTreeMap<[String; 4], [u64; 5]> = BTreeMap::new();
    for r in &records {
        let label = |k: &str| match &r[k] {
            Value::String(s) => s.clone(),
            v => v.to_string(),
        };
        let key = [
            label("route"),
            label("model"),
            label("owner"),
            label("status"),
        ];
        let g = groups.entry(key).or_default();
        g[0] += 1;
        g[1] += r["prompt_tokens"].as_u64().unwrap();
        g[2] += r["cached_tokens"].as_u64().unwrap();
        g[3] += r["completion_tokens"].as_u64().unwrap();
        g[4] += u64::from(r["first_chunk_t"].is_number());
    }
    assert_eq!(groups.len(), 3, "{groups:?}");
    let text = listener.metrics_text();
    for ([route, model, owner, status], [n, prompt, cached, completion, first]) in &groups {
        let filters = [
            format!("route=\"{route}\""),
            format!("model=\"{model}\""),
            format!("owner=\"{owner}\""),
            format!("status=\"{status}\""),
        ];
        let filters: Vec<&str> = filters.iter().map(String::as_str).collect();
        let value = |name: &str| metric_sum(&text, name, &filters);
        let at = format!("{route}/{model}/{owner}/{status}");
        assert_eq!(value("llm_bodylog_requests_total"), *n as f64, "{at}");
        assert_eq!(
            value("llm_bodylog_prompt_tokens_total"),
            *prompt as f64,
            "{at}"
        );
        assert_eq!(
            value("llm_bodylog_cached_tokens_total"),
            *cached as f64,
            "{at}"
        );
        assert_eq!(
            value("llm_bodylog_completion_tokens_total"),
            *completion as f64,
            "{at}"
        );
        assert_eq!(
            value("llm_bodylog_request_duration_seconds_count"),
            *n as f64,
            "{at}"
        );
        assert_eq!(
            value("llm_bodylog_first_chunk_seconds_count"),
            *first as f64,
            "{at}"
        );
        assert!(*prompt > 0, "{at}: the sim reports usage");
    }
    assert_eq!(
        metric_sum(&text, "llm_bodylog_records_total", &["result=\"written\""]),
        6.0
    );
}

#[test]
fn the_listener_loses_no_record_on_sigterm() {
    let mut listener = Listener::start();
    let mut conn = std::net::TcpStream::connect(listener.addr).unwrap();
    let n = 400;
    let req = vec![b'q'; 16 << 10];
    for i in 0..n {
        let frame = encode_frame(&json!({"route": "r", "n": i, "status": 200}), &req, b"{}");
        std::io::Write::write_all(&mut conn, &frame).unwrap();
    }
    // At once, with frames still in flight, and the connection left open
    // as a gateway leaves it.
    listener.signal("TERM");
    assert_eq!(
        listener.wait_exit(Duration::from_secs(15)),
        Some(0),
        "{}",
        listener.log()
    );
    let records = listener.records();
    let mut seen: Vec<u64> = records.iter().map(|r| r["n"].as_u64().unwrap()).collect();
    seen.sort_unstable();
    assert_eq!(seen, (0..n).collect::<Vec<u64>>(), "every frame, once");
    assert!(listener.log().contains("SIGTERM"), "{}", listener.log());
    drop(conn);
}

fn check(yaml: &str) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("routes")).unwrap();
    let config = dir.path().join("gateway.yaml");
    std::fs::write(
        &config,
        format!(
            "routes_dir: {}\n{yaml}",
            dir.path().join("routes").display()
        ),
    )
    .unwrap();
    let out = Command::new(common::gateway_bin())
        .args(["check", "--config"])
        .arg(&config)
        .env_remove("BODYLOG_LISTENER_HOST")
        .output()
        .expect("run check");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn check_validates_the_bodylog_section_with_file_and_line() {
    let (ok, out) = check("bodylog:\n  listener: \"10.0.0.1:0\"\n");
    assert!(!ok, "{out}");
    assert!(out.contains("gateway.yaml:3: bodylog.listener"), "{out}");
    let (ok, out) = check("bodylog:\n  listener: bodylog\n  sample_pct: 150\n");
    assert!(
        !ok && out.contains("gateway.yaml:4: bodylog.sample_pct"),
        "{out}"
    );
    let (ok, out) = check("bodylog:\n  listner: bodylog\n");
    assert!(!ok && out.contains("gateway.yaml:3"), "{out}");
    // Control: a valid section passes.
    let (ok, out) =
        check("bodylog:\n  listener: bodylog:9999\n  sample_pct: 10\n  queue_bytes: 16m\n");
    assert!(ok, "{out}");
}

#[test]
fn a_session_id_in_the_body_is_logged_as_its_hash() {
    let stream = format!("{SSE_CONTENT}{SSE_USAGE}{SSE_DONE}").into_bytes();
    let engine = Canned::start("text/event-stream", vec![stream], true);
    let sink = FrameSink::start();
    let gw = gateway(
        &[("chat", canned_route(engine.port(), ""))],
        sink.config(""),
        Vec::new(),
    );
    let body = br#"{"model":"m","stream":true,"metadata":{"session_id":"raw-body-session-55"},"messages":[{"role":"user","content":"hi"}]}"#;
    let resp =
        Conn::open(gw.addr).request("POST", CHAT, &[("Content-Type", "application/json")], body);
    assert_eq!(resp.status(), 200, "{}", resp.text());
    let frames = sink.wait_frames(1);
    let f = &frames[0];
    let logged = String::from_utf8_lossy(&f.req).into_owned();
    assert!(!String::from_utf8_lossy(&f.wire).contains("raw-body-session-55"));
    let hash = resp
        .header("x-routed-session")
        .expect("a session")
        .to_string();
    assert_eq!(f.meta["session_hash"], hash.as_str());
    assert_eq!(
        logged,
        String::from_utf8_lossy(body).replace("raw-body-session-55", &format!("sid:{hash}")),
        "only the id's value changed"
    );
    // Control: the engine received the raw id.
    let received = engine.received.lock()[0].clone();
    assert!(String::from_utf8_lossy(&received).contains("raw-body-session-55"));
}

/// The body-log status and toggle answer under a route too, as the
/// OpenResty gateway serves them (a probe written for it looks there), with
/// the same process-wide state: a toggle under one path shows in the other.
/// The control: an unknown endpoint under the route is still a 404.
#[test]
fn the_bodylog_endpoints_answer_under_a_route_as_at_the_top() {
    let cluster = engines(1);
    let sink = FrameSink::start();
    let gw = gateway(
        &[("chat", route_yaml(&ports(&cluster), ""))],
        sink.config(""),
        vec![],
    );
    let top = http::get(gw.addr, "/_bodylog_status");
    let under = http::get(gw.addr, "/chat/_bodylog_status");
    assert_eq!(
        (top.status(), under.status()),
        (200, 200),
        "{}",
        under.text()
    );
    assert_eq!(top.json()["sample_pct"], under.json()["sample_pct"]);
    let r = Conn::open_from(IpAddr::V4(Ipv4Addr::LOCALHOST), gw.addr).request(
        "POST",
        "/chat/_bodylog_toggle?pct=7",
        &[],
        b"",
    );
    assert_eq!(r.status(), 200, "{}", r.text());
    let top = http::get(gw.addr, "/_bodylog_status").json();
    assert_eq!(top["sample_pct"]["value"], 7, "{top}");
    assert_eq!(http::get(gw.addr, "/chat/_bodylog_nothing").status(), 404);
}
