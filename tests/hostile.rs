//! Hostile input. Each finding of the probe is a test
//! that failed before its fix, next to a control that the same request
//! done right still succeeds.

mod common;

use common::canned::{canned_route, Canned};
use common::http::{self, Conn};
use common::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const CHAT: &str = "/chat/v1/chat/completions";

fn small_chat() -> Vec<u8> {
    serde_json::json!({"model": "sim-model", "messages": [{"role": "user", "content": "hi"}]})
        .to_string()
        .into_bytes()
}

/// A body over Pingora's 64 KiB retry buffer, so it goes through the
/// replay (which re-serialises the head).
fn replayed_chat() -> Vec<u8> {
    serde_json::json!({"model": "sim-model", "messages": [{"role": "user", "content": "x ".repeat(40_000)}]})
        .to_string()
        .into_bytes()
}

/// A gateway on `engines(1)` with `extra` in gateway.yaml and `env`.
fn gateway(extra: &str, env: &[(&str, &str)]) -> (SimCluster, Gateway) {
    let cluster = engines(1);
    let gw = Gateway::start_with(
        &[("chat", route_yaml(&ports(&cluster), ""))],
        GatewayOptions {
            extra_config: extra.to_string(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        },
    );
    (cluster, gw)
}

fn error_lines(log: &str) -> Vec<String> {
    log.lines()
        .filter(|l| l.contains(" ERROR "))
        .map(str::to_string)
        .collect()
}

fn raw(gw: &Gateway) -> TcpStream {
    let s = TcpStream::connect(gw.addr).expect("connect");
    s.set_nodelay(true).ok();
    s
}

// ------------------------------------------------- header-read deadline

/// Sends `head` one byte every `every` until the gateway closes the
/// connection; returns how long that took, or None if it was still open
/// after `give_up` (or answered, which a head never finished must not be).
fn dribble(mut s: TcpStream, head: &[u8], every: Duration, give_up: Duration) -> Option<Duration> {
    let start = Instant::now();
    s.set_read_timeout(Some(every)).ok();
    let mut buf = [0u8; 256];
    for byte in head.iter().cycle() {
        if start.elapsed() > give_up {
            return None;
        }
        if s.write_all(&[*byte]).is_err() {
            return Some(start.elapsed());
        }
        match s.read(&mut buf) {
            Ok(0) => return Some(start.elapsed()),
            Ok(_) => return None,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                return Some(start.elapsed())
            }
            Err(_) => {}
        }
    }
    None
}

#[test]
fn slowloris_heads_are_closed_at_the_header_deadline_and_logged_at_debug() {
    let (_cluster, gw) = gateway(
        "client_header_timeout: 2s\n",
        &[("RUST_LOG", "info,llm_gateway::proxy::conn=debug")],
    );
    let errors_before = error_lines(&gw.log()).len();
    let head = b"POST /chat/v1/chat/completions HTTP/1.1\r\nHost: gateway.test\r\nX-Pad: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    let closed = Arc::new(Mutex::new(Vec::new()));
    let threads: Vec<_> = (0..5)
        .map(|_| {
            let s = raw(&gw);
            let closed = Arc::clone(&closed);
            std::thread::spawn(move || {
                let took = dribble(s, head, Duration::from_millis(500), Duration::from_secs(15));
                closed.lock().unwrap().push(took);
            })
        })
        .collect();
    // Control, while they dribble: a request done right is served at once.
    std::thread::sleep(Duration::from_millis(700));
    let r = http::request(gw.addr, "POST", CHAT, &[], &small_chat());
    assert_eq!(r.status(), 200, "{}", r.text());
    for t in threads {
        t.join().expect("dribbler");
    }
    let closed = closed.lock().unwrap().clone();
    for took in &closed {
        let took = took.expect("a dribbled head was still open after 15 s");
        assert!(
            took >= Duration::from_millis(1500) && took < Duration::from_secs(6),
            "closed after {took:?}, want about 2 s"
        );
    }
    // Each close is one debug line, and no ERROR.
    let log = wait_for("the closes at debug", DEADLINE, || {
        let log = gw.log();
        (log.matches("client_header_timeout").count() >= 5).then_some(log)
    });
    assert!(log.contains("DEBUG"), "{log}");
    assert_eq!(error_lines(&log).len(), errors_before, "{log}");
    gw.wait_idle();
}

#[test]
fn heads_cut_short_by_the_client_log_no_error() {
    let (_cluster, gw) = gateway("", &[("RUST_LOG", "info,llm_gateway::proxy::conn=debug")]);
    let errors_before = error_lines(&gw.log()).len();
    for _ in 0..5 {
        let mut s = raw(&gw);
        s.write_all(b"POST /chat/v1/chat/completions HTTP/1.1\r\nHost: g")
            .expect("half a head");
        drop(s);
    }
    let log = wait_for("the cut heads at debug", DEADLINE, || {
        let log = gw.log();
        (log.matches("ended inside a request head: closed by the client")
            .count()
            >= 5)
            .then_some(log)
    });
    assert_eq!(error_lines(&log).len(), errors_before, "{log}");
    // Control: the gateway serves on.
    let r = http::request(gw.addr, "POST", CHAT, &[], &small_chat());
    assert_eq!(r.status(), 200);
}

#[test]
fn a_slow_head_within_the_deadline_and_a_long_idle_keepalive_are_served() {
    let (_cluster, gw) = gateway("client_header_timeout: 2s\n", &[]);
    let body = small_chat();
    let head = format!(
        "POST {CHAT} HTTP/1.1\r\nHost: gateway.test\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    let mut conn = Conn::open(gw.addr);
    // Three pieces over ~1 s: slow, but inside 2 s.
    let (a, rest) = head.as_bytes().split_at(20);
    let (b, c) = rest.split_at(20);
    for part in [a, b] {
        conn.send_raw(part);
        std::thread::sleep(Duration::from_millis(500));
    }
    conn.send_raw(c);
    conn.send_raw(&body);
    assert_eq!(conn.read_response().status(), 200);
    // Idle for longer than the header deadline: the next head's deadline
    // starts at its first byte, so the keep-alive connection still works.
    std::thread::sleep(Duration::from_millis(3000));
    conn.set_read_timeout(Duration::from_millis(200));
    assert!(
        !conn.is_closed(),
        "idle keep-alive closed by the header deadline"
    );
    conn.set_read_timeout(http::IO_TIMEOUT);
    let r = conn.request("POST", CHAT, &[("Content-Type", "application/json")], &body);
    assert_eq!(r.status(), 200);
}

/// With `h2c` on, the gateway reads a connection's first 24 bytes to tell
/// the h2 preface from an HTTP/1.1 head, before the head deadline's
/// wrapper: that read is bounded by `client_header_timeout` too.
#[test]
fn with_h2c_on_a_client_stalled_before_24_bytes_is_closed_by_the_head_deadline() {
    let (_cluster, gw) = gateway("client_header_timeout: 1s\nh2c: true\n", &[]);
    let mut conn = Conn::open(gw.addr);
    conn.send_raw(b"POST ");
    conn.set_read_timeout(Duration::from_millis(200));
    wait_for("the stalled connection closed", DEADLINE, || {
        conn.is_closed().then_some(())
    });
    // Control: on the same listener a whole request is served.
    let r = http::request(gw.addr, "POST", CHAT, &[], &small_chat());
    assert_eq!(r.status(), 200);
}

// ------------------------------------------------------------- Upgrade

/// An engine that answers every connection's first request with `101
/// Switching Protocols` and then echoes every byte back (a tunnel), and
/// records everything it received.
fn switching_engine() -> (u16, Arc<Mutex<Vec<u8>>>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = Arc::clone(&seen);
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            let record = Arc::clone(&record);
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                let mut head = Vec::new();
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                record.lock().unwrap().extend_from_slice(&head);
                let _ = stream.write_all(
                    b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
                );
                loop {
                    match stream.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => {
                            record.lock().unwrap().extend_from_slice(&buf[..n]);
                            if stream.write_all(&buf[..n]).is_err() {
                                return;
                            }
                        }
                    }
                }
            });
        }
    });
    (port, seen)
}

fn upgrade_request(path: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: gateway.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
}

#[test]
fn upgrade_is_refused_unless_the_route_allows_it() {
    let (port, seen) = switching_engine();
    let route = |extra: &str| {
        format!("peers:\n  - {{name: ws, host: 127.0.0.1, port: {port}}}\nhealth: {{enabled: false}}\nengine_metrics: false\n{extra}")
    };
    let gw = Gateway::start(&[("chat", route("")), ("ws", route("allow_upgrade: true\n"))]);
    // Refused: no tunnel, and the engine never heard of it.
    let mut conn = Conn::open(gw.addr);
    conn.send_raw(upgrade_request("/chat/v1/realtime").as_bytes());
    let r = conn.read_response();
    assert_eq!(r.status(), 400, "{}", r.text());
    assert_eq!(r.json()["error"]["type"], "upgrade_not_allowed");
    assert!(
        seen.lock().unwrap().is_empty(),
        "the engine saw the upgrade"
    );

    // An engine switching protocols unasked is a 502, not a tunnel.
    let r = http::request(gw.addr, "POST", CHAT, &[], &small_chat());
    assert_eq!(r.status(), 502, "{}", r.text());
    assert!(r.text().contains("101"), "{}", r.text());
    seen.lock().unwrap().clear();

    // Control: a route that opts in gets its tunnel, and bytes through it.
    let mut conn = Conn::open(gw.addr);
    conn.send_raw(upgrade_request("/ws/v1/realtime").as_bytes());
    assert_eq!(conn.read_head_raw_status(), 101);
    conn.send_raw(b"ping through the tunnel");
    wait_for("the tunnel's echo", DEADLINE, || {
        let seen = seen.lock().unwrap();
        String::from_utf8_lossy(&seen)
            .contains("ping through the tunnel")
            .then_some(())
    });
    drop(conn);
    gw.wait_idle();
}

// ------------------------------------------------ heads near Pingora's cap

/// Pingora's request-head cap (pingora-core `MAX_HEADER_SIZE`).
const PINGORA_HEAD_CAP: usize = 1_048_575;

/// A POST head of exactly `total` bytes with `body`, padded by 200
/// `X-Pad-NNN:value` headers written without the optional space (the
/// gateway's re-serialisation adds one to each).
fn padded_head(total: usize, body: &[u8]) -> Vec<u8> {
    let start = format!(
        "POST {CHAT} HTTP/1.1\r\nHost: gateway.test\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
        body.len()
    );
    let pads = 200;
    let fixed = start.len() + 2 + pads * "X-Pad-000:\r\n".len();
    let room = total - fixed;
    let mut head = start;
    for i in 0..pads {
        let len = room / pads + usize::from(i < room % pads);
        head.push_str(&format!("X-Pad-{i:03}:{}\r\n", "v".repeat(len)));
    }
    head.push_str("\r\n");
    assert_eq!(head.len(), total);
    let mut out = head.into_bytes();
    out.extend_from_slice(body);
    out
}

#[test]
fn a_head_that_outgrows_pingoras_cap_when_replayed_is_a_431() {
    let engine = Canned::start("application/json", vec![b"{}".to_vec()], false);
    // max_header_size at its top (1 MiB): Pingora's cap is the limit.
    let gw = Gateway::start_with(
        &[("chat", canned_route(engine.port(), ""))],
        GatewayOptions {
            extra_config: "max_header_size: 1m\n".into(),
            ..Default::default()
        },
    );
    // A small body goes from Pingora's retry buffer, head untouched: the
    // same near-cap head is served.
    let small = small_chat();
    let mut conn = Conn::open(gw.addr);
    conn.send_raw(&padded_head(PINGORA_HEAD_CAP - 100, &small));
    assert_eq!(conn.read_response().status(), 200);
    let body = replayed_chat();
    // 100 bytes under the cap: Pingora reads it, its replay would not.
    let mut conn = Conn::open(gw.addr);
    conn.send_raw(&padded_head(PINGORA_HEAD_CAP - 100, &body));
    let r = conn.read_response();
    assert_eq!(r.status(), 431, "{}", r.text());
    assert_eq!(r.json()["error"]["type"], "request_header_fields_too_large");
    assert_eq!(
        engine.heads.lock().len(),
        1,
        "the engine got the replayed request"
    );
    wait_for("the 431 in the log", DEADLINE, || {
        gw.log().contains("answered 431").then_some(())
    });
    // The connection goes on: the next request on it is served.
    let r = conn.request("POST", CHAT, &[("Content-Type", "application/json")], &body);
    assert_eq!(r.status(), 200);
    // Control: 2 KiB under the cap goes through, every header with it.
    let mut conn = Conn::open(gw.addr);
    conn.send_raw(&padded_head(PINGORA_HEAD_CAP - 2048, &body));
    let r = conn.read_response();
    assert_eq!(r.status(), 200, "{}", r.text());
    let heads = engine.heads.lock();
    let last = heads.last().expect("the engine got the control");
    // Header names reach the engine in canonical (lower) case: the
    // gateway edits the engine's head without Pingora's spelling map.
    assert!(
        last.to_ascii_lowercase().contains("x-pad-199: v"),
        "padding forwarded"
    );
    assert_eq!(
        engine.received.lock().last().map(Vec::as_slice),
        Some(&body[..])
    );
    drop(heads);
    gw.wait_idle();
}

// ------------------------------------------------ max_header_size

/// A POST head of exactly `total` bytes, one `X-Big` header making up the
/// size, announcing a `content_length` body that is not sent with it.
fn head_of(total: usize, content_length: usize) -> Vec<u8> {
    let start = format!(
        "POST {CHAT} HTTP/1.1\r\nHost: gateway.test\r\nContent-Type: application/json\r\nContent-Length: {content_length}\r\nX-Big: "
    );
    let pad = total - start.len() - "\r\n\r\n".len();
    format!("{start}{}\r\n\r\n", "b".repeat(pad)).into_bytes()
}

#[test]
fn a_head_over_max_header_size_gets_the_gateways_431_and_reaches_no_engine() {
    let engine = Canned::start("application/json", vec![b"{}".to_vec()], false);
    let gw = Gateway::start(&[("chat", canned_route(engine.port(), ""))]);
    let body = small_chat();

    // 100 KiB, one big header, a body announced and not sent: the answer
    // comes without waiting for the body.
    let mut conn = Conn::open(gw.addr);
    conn.send_raw(&head_of(100 << 10, 5_000_000));
    let r = conn.read_response();
    assert_eq!(r.status(), 431, "{}", r.text());
    let e = &r.json()["error"];
    assert_eq!(e["type"], "request_header_fields_too_large", "{e}");
    assert_eq!(e["limit"], 65_536, "{e}");
    // A body never read would be taken for a next request: closed.
    assert!(conn.is_closed(), "the connection closes after the 431");
    assert!(engine.heads.lock().is_empty(), "the engine saw nothing");

    // The whole head is counted (request line, headers, blank line):
    // exactly the limit is served, a byte more is not.
    let exchange_sized = |total: usize| {
        let mut conn = Conn::open(gw.addr);
        let mut bytes = head_of(total, body.len());
        bytes.extend_from_slice(&body);
        conn.send_raw(&bytes);
        conn.read_response().status()
    };
    assert_eq!(exchange_sized(65_537), 431);
    assert!(engine.heads.lock().is_empty(), "the engine saw nothing");
    assert_eq!(exchange_sized(65_536), 200);

    // Control: a 60 KiB head goes to the engine, its big header with it.
    assert_eq!(exchange_sized(60 << 10), 200);
    let heads = engine.heads.lock();
    assert_eq!(heads.len(), 2, "the two heads within the limit");
    assert!(
        heads[1].to_ascii_lowercase().contains("x-big: bbbb"),
        "the header forwarded"
    );
    drop(heads);
    gw.wait_idle();
}

#[test]
fn max_header_size_sets_where_heads_are_refused() {
    let engine = Canned::start("application/json", vec![b"{}".to_vec()], false);
    let gw = Gateway::start_with(
        &[("chat", canned_route(engine.port(), ""))],
        GatewayOptions {
            extra_config: "max_header_size: 8k\n".into(),
            ..Default::default()
        },
    );
    // A GET (no body) refused keeps its connection: the next request on it
    // is served.
    let big = "v".repeat(9 << 10);
    let mut conn = Conn::open(gw.addr);
    let r = conn.request("GET", "/chat/v1/models", &[("X-Big", &big)], b"");
    assert_eq!(r.status(), 431, "{}", r.text());
    assert_eq!(r.json()["error"]["limit"], 8192);
    assert!(engine.heads.lock().is_empty(), "the engine saw nothing");
    // Control: the same connection, a head within 8 KiB.
    let r = conn.request("GET", "/chat/v1/models", &[("X-Small", "v")], b"");
    assert_eq!(r.status(), 200, "{}", r.text());
    assert_eq!(engine.heads.lock().len(), 1);
    gw.wait_idle();
}

// ---------------------------------------------------------- pipelining

fn post_bytes(path: &str, body: &[u8], extra: &str) -> Vec<u8> {
    let mut out = format!(
        "POST {path} HTTP/1.1\r\nHost: gateway.test\r\nContent-Type: application/json\r\n{extra}Content-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body);
    out
}

fn chat_of(session: &str, content: &str, stream: bool) -> Vec<u8> {
    chat_body(session, content, stream).to_string().into_bytes()
}

#[test]
fn requests_pipelined_in_one_segment_are_answered_in_order() {
    let (cluster, gw) = gateway("", &[]);
    // Three in one write: two with bodies (through the replay), one GET.
    let mut conn = Conn::open(gw.addr);
    let mut segment = post_bytes(CHAT, &chat_of("p1", "first", false), "");
    segment.extend(post_bytes(CHAT, &chat_of("p2", "second", false), ""));
    segment.extend_from_slice(b"GET /chat/_active_conns HTTP/1.1\r\nHost: gateway.test\r\n\r\n");
    conn.send_raw(&segment);
    for _ in 0..2 {
        let r = conn.read_response();
        assert_eq!(r.status(), 200, "{}", r.text());
        assert!(r.text().contains("choices"), "{}", r.text());
    }
    let r = conn.read_response();
    assert_eq!(r.status(), 200);
    assert_eq!(r.json()["route"], "chat");
    // In order, and each exactly once.
    let recorded = cluster.engines[0].stats.recorded.lock();
    let bodies: Vec<String> = recorded
        .iter()
        .map(|r| String::from_utf8_lossy(&r.body).into_owned())
        .collect();
    assert_eq!(bodies.len(), 2, "{bodies:?}");
    assert!(
        bodies[0].contains("first") && bodies[1].contains("second"),
        "{bodies:?}"
    );
    drop(recorded);
    // Control: the connection is still good for one more.
    let r = conn.request(
        "POST",
        CHAT,
        &[("Content-Type", "application/json")],
        &small_chat(),
    );
    assert_eq!(r.status(), 200);
    gw.wait_idle();
}

#[test]
fn a_request_pipelined_during_a_stream_waits_for_it() {
    let (cluster, gw) = gateway("", &[]);
    let mut conn = Conn::open(gw.addr);
    conn.send_raw(&post_bytes(
        CHAT,
        &chat_of("s1", "streamed", true),
        "x-sim-gate: g1\r\n",
    ));
    assert_eq!(conn.read_head().status, 200);
    conn.read_chunk().expect("first frame").expect("data");
    // The next request arrives while the stream is held open.
    conn.send_raw(&post_bytes(CHAT, &chat_of("s2", "after", false), ""));
    std::thread::sleep(Duration::from_millis(300));
    cluster.engines[0].open_gate("g1");
    let mut frames = String::new();
    while let Some(chunk) = conn.read_chunk().expect("the stream is not cut") {
        frames.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(
        frames.contains("[DONE]"),
        "the stream ends cleanly: {frames}"
    );
    let r = conn.read_response();
    assert_eq!(r.status(), 200, "{}", r.text());
    assert!(r.text().contains("choices"), "{}", r.text());
    gw.wait_idle();
}

// ------------------------------------- Pingora's parser-level refusals

/// Sends `bytes` on a fresh connection and reads everything until the
/// gateway closes it.
fn exchange(gw: &Gateway, bytes: &[u8]) -> String {
    let mut s = raw(gw);
    s.set_read_timeout(Some(http::IO_TIMEOUT)).ok();
    s.write_all(bytes).expect("send");
    let mut out = Vec::new();
    // Ends when the gateway closes (a read error counts: a reset after
    // the answer).
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// What Pingora 0.9.1 answers for a head its parser refuses, before any
/// hook of the gateway runs: a bare 400 (no JSON body is possible, see the
/// book's docs/src/security/hostile-input.md), and the connection closes.
fn assert_pingora_400(answer: &str, what: &str) {
    assert!(answer.starts_with("HTTP/1.1 400 "), "{what}: {answer:?}");
    let head = answer
        .split("\r\n\r\n")
        .next()
        .unwrap_or("")
        .to_ascii_lowercase();
    assert!(head.contains("content-length: 0"), "{what}: {answer:?}");
    assert!(head.contains("connection: close"), "{what}: {answer:?}");
    assert!(
        answer.ends_with("\r\n\r\n"),
        "{what}: nothing after the head: {answer:?}"
    );
}

fn head_with(lines: &str, body: &str) -> Vec<u8> {
    format!("POST /chat/v1/echo HTTP/1.1\r\nHost: gateway.test\r\n{lines}\r\n{body}").into_bytes()
}

#[test]
fn heads_pingoras_parser_refuses_get_its_bare_400_and_reach_no_engine() {
    let engine = Canned::start("application/json", vec![b"{}".to_vec()], false);
    let gw = Gateway::start(&[("chat", canned_route(engine.port(), ""))]);
    let many: String = (0..300).map(|i| format!("X-H{i}: v\r\n")).collect();
    let huge = format!("X-Big: {}\r\n", "a".repeat(1_100_000));
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "conflicting Content-Length",
            head_with("Content-Length: 5\r\nContent-Length: 6\r\n", "hello!"),
        ),
        (
            "obs-fold",
            head_with("X-A: a\r\n folded\r\nContent-Length: 2\r\n", "{}"),
        ),
        (
            "Transfer-Encoding not chunked",
            head_with("Transfer-Encoding: gzip\r\n", ""),
        ),
        (
            "chunked not last",
            head_with("Transfer-Encoding: chunked, gzip\r\n", ""),
        ),
        (
            "more than 256 headers",
            head_with(&format!("{many}Content-Length: 2\r\n"), "{}"),
        ),
        (
            "a head over 1 MiB",
            head_with(&format!("{huge}Content-Length: 2\r\n"), "{}"),
        ),
        (
            "a space in a header name",
            head_with("X A: b\r\nContent-Length: 2\r\n", "{}"),
        ),
    ];
    for (what, bytes) in &cases {
        assert_pingora_400(&exchange(&gw, bytes), what);
    }
    assert!(engine.heads.lock().is_empty(), "an engine got one of them");
    // Controls: the same requests done right are served.
    let many: String = (0..240).map(|i| format!("X-H{i}: v\r\n")).collect();
    let big = format!("X-Big: {}\r\n", "a".repeat(60_000));
    for (what, lines) in [
        ("one Content-Length", "Content-Length: 2\r\n".to_string()),
        (
            "a plain header",
            "X-A: a folded\r\nContent-Length: 2\r\n".to_string(),
        ),
        ("240 headers", format!("{many}Content-Length: 2\r\n")),
        ("a 60 KB header", format!("{big}Content-Length: 2\r\n")),
    ] {
        let mut conn = Conn::open(gw.addr);
        conn.send_raw(&head_with(&lines, "{}"));
        assert_eq!(conn.read_response().status(), 200, "{what}");
    }
    let mut conn = Conn::open(gw.addr);
    conn.send_raw(&head_with(
        "Transfer-Encoding: chunked\r\n",
        "2\r\n{}\r\n0\r\n\r\n",
    ));
    assert_eq!(conn.read_response().status(), 200, "chunked");
    assert_eq!(engine.heads.lock().len(), 5);
    gw.wait_idle();
}
// ---------------------------------------------------------- smuggling

#[test]
fn smuggling_attempts_reach_the_engine_as_exactly_one_request_with_the_clients_body() {
    let engine = Canned::start("application/json", vec![b"{}".to_vec()], false);
    let gw = Gateway::start(&[("chat", canned_route(engine.port(), ""))]);
    let smuggled = "GET /chat/v1/smuggled HTTP/1.1\r\nHost: gateway.test\r\n\r\n";

    // Content-Length and Transfer-Encoding: chunked framing wins (RFC 9112
    // §6.3), and the connection closes after the answer, so what the
    // Content-Length reading would call a second request is never one.
    let answer = exchange(
        &gw,
        &head_with(
            "Content-Length: 4\r\nTransfer-Encoding: chunked\r\n",
            &format!("2\r\n{{}}\r\n0\r\n\r\n{smuggled}"),
        ),
    );
    assert!(answer.starts_with("HTTP/1.1 200 "), "{answer:?}");
    assert!(
        answer.to_ascii_lowercase().contains("connection: close"),
        "{answer:?}"
    );
    assert_eq!(
        answer.matches("HTTP/1.1 ").count(),
        1,
        "one answer: {answer:?}"
    );

    // A body that holds a whole HTTP request is a body.
    let mut conn = Conn::open(gw.addr);
    let r = conn.request("POST", "/chat/v1/echo", &[], smuggled.as_bytes());
    assert_eq!(r.status(), 200);

    // The same Content-Length twice is one Content-Length.
    let mut conn = Conn::open(gw.addr);
    conn.send_raw(&head_with(
        "Content-Length: 2\r\nContent-Length: 2\r\n",
        "{}",
    ));
    assert_eq!(conn.read_response().status(), 200);

    let heads = engine.heads.lock().clone();
    let bodies = engine.received.lock().clone();
    assert_eq!(heads.len(), 3, "exactly one engine request each: {heads:?}");
    assert!(heads.iter().all(|h| !h.contains("smuggled")), "{heads:?}");
    assert_eq!(bodies[0], b"{}");
    assert_eq!(bodies[1], smuggled.as_bytes());
    assert_eq!(bodies[2], b"{}");
    for head in &heads {
        let lower = head.to_ascii_lowercase();
        assert_eq!(lower.matches("content-length:").count(), 1, "{head}");
        assert!(!lower.contains("transfer-encoding"), "{head}");
    }
    gw.wait_idle();
}

#[test]
fn a_client_that_asks_to_close_is_not_kept_alive() {
    let (_cluster, gw) = gateway("", &[]);
    let body = String::from_utf8(small_chat()).unwrap();
    for (what, version, header) in [
        ("Connection: close", "1.1", "Connection: close\r\n"),
        ("HTTP/1.0", "1.0", ""),
    ] {
        let answer = exchange(
            &gw,
            format!(
                "POST {CHAT} HTTP/{version}\r\nHost: gateway.test\r\n{header}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )
            .as_bytes(),
        );
        assert!(answer.starts_with("HTTP/1.1 200 "), "{what}: {answer:?}");
        assert!(
            !answer.to_ascii_lowercase().contains("keep-alive"),
            "{what}: {answer:?}"
        );
    }
    // Control: a plain HTTP/1.1 request is kept alive.
    let mut conn = Conn::open(gw.addr);
    let r = conn.request(
        "POST",
        CHAT,
        &[("Content-Type", "application/json")],
        body.as_bytes(),
    );
    assert_eq!(r.header("connection"), Some("keep-alive"));
    assert_eq!(
        conn.request("POST", CHAT, &[], body.as_bytes()).status(),
        200
    );
}

// ---------------------------------------------------------- path tricks

/// A gateway whose key file holds `sk-good`, on `engines(1)`, with `extra`
/// in gateway.yaml, plus a route file named like the gateway-wide endpoint
/// `/_bodylog_status`. The directory holds the key file.
fn keyed_gateway(extra: &str) -> (SimCluster, Gateway, tempfile::TempDir) {
    let cluster = engines(1);
    let keys = tempfile::tempdir().expect("key dir");
    let key_file = keys.path().join("api-keys");
    std::fs::write(&key_file, "sk-good:team\n").expect("write keys");
    let route = route_yaml(&ports(&cluster), "");
    let gw = Gateway::start_with(
        &[("chat", route.clone()), ("_bodylog_status", route)],
        GatewayOptions {
            env: vec![(
                "LLM_GATEWAY_API_KEYS_FILE".into(),
                key_file.display().to_string(),
            )],
            extra_config: extra.to_string(),
            ..Default::default()
        },
    );
    (cluster, gw, keys)
}

fn rules_on(gw: &Gateway) -> serde_json::Value {
    http::get(gw.addr, "/chat/_route_state").json()["toggles"]["reject_rules"]["on"].clone()
}

#[test]
fn path_tricks_reach_no_toggle_no_engine_path_and_skip_no_key() {
    let (cluster, gw, _keys) = keyed_gateway("");
    let key = ("Authorization", "Bearer sk-good");
    let post_from = |from: [u8; 4], target: &str, headers: &[(&str, &str)]| {
        let mut c = Conn::open_from(std::net::IpAddr::from(from), gw.addr);
        c.request("POST", target, headers, b"")
    };
    // Toggle paths in disguise, from loopback: none is the toggle.
    for (target, status) in [
        ("/chat/./_reject_rules_toggle?on=0", 400),
        ("/chat/v1/../_reject_rules_toggle?on=0", 400),
        ("/chat/%2e/_reject_rules_toggle?on=0", 400),
        ("/chat/x/%2E%2E/_reject_rules_toggle?on=0", 400),
        ("/chat/%5Freject_rules_toggle?on=0", 404),
        ("/chat/_Reject_Rules_Toggle?on=0", 404),
        ("/CHAT/_reject_rules_toggle?on=0", 404),
        ("//chat/_reject_rules_toggle?on=0", 404),
        ("/chat%2F_reject_rules_toggle?on=0", 404),
        ("/chat/_reject_rules_toggle/?on=0", 404),
    ] {
        let r = post_from([127, 0, 0, 1], target, &[]);
        assert_eq!(r.status(), status, "{target}: {}", r.text());
        assert!(
            r.json()["error"]["type"].is_string(),
            "{target}: JSON error"
        );
        assert_eq!(rules_on(&gw), true, "{target} flipped the toggle");
    }
    // Absolute-form is the same path: from elsewhere still refused, and
    // naming 127.0.0.1 in it changes nothing (Pingora refuses a target
    // whose authority disagrees with Host).
    let r = post_from(
        [127, 0, 0, 2],
        "http://gateway.test/chat/_reject_rules_toggle?on=0",
        &[],
    );
    assert_eq!(r.status(), 403, "{}", r.text());
    let r = post_from(
        [127, 0, 0, 2],
        "http://127.0.0.1/chat/_reject_rules_toggle?on=0",
        &[],
    );
    assert_eq!(r.status(), 400, "{}", r.text());
    assert_eq!(rules_on(&gw), true);

    // Dot-segments toward an engine path outside /v1/, with the key.
    for target in [
        "/chat/v1/../metrics",
        "/chat/v1/%2e%2e/metrics",
        "/chat/v1/..%2Fmetrics",
        "/chat/v1/.%2E/health",
    ] {
        let r = http::request(gw.addr, "GET", target, &[key], b"");
        assert_eq!(r.status(), 400, "{target}: {}", r.text());
        assert_eq!(r.json()["error"]["type"], "invalid_path");
    }
    assert!(
        cluster.engines[0].stats.recorded.lock().is_empty(),
        "an engine saw a dot-segment path"
    );

    // No key: no trick gets a request through.
    let body = small_chat();
    for target in [
        "/chat/_x/../v1/chat/completions",
        "http://gateway.test/chat/v1/chat/completions",
        "/chat/v1/chat/completions",
    ] {
        let r = http::request(gw.addr, "POST", target, &[], &body);
        assert!(matches!(r.status(), 400 | 401), "{target}: {}", r.status());
    }
    assert!(cluster.engines[0].stats.recorded.lock().is_empty());

    // A route file named like a gateway endpoint is not a route: the
    // endpoint is the gateway's.
    let status = http::get(gw.addr, "/_bodylog_status").json();
    assert_eq!(status["configured"], false, "{status}");

    // Controls: done right, each works.
    let r = http::request(
        gw.addr,
        "POST",
        "http://gateway.test/chat/v1/chat/completions",
        &[key],
        &body,
    );
    assert_eq!(r.status(), 200, "{}", r.text());
    let path = cluster.engines[0].stats.recorded.lock()[0].path.clone();
    assert_eq!(path, "/v1/chat/completions", "origin-form upstream");
    let r = post_from([127, 0, 0, 1], "/chat/_reject_rules_toggle?on=0", &[]);
    assert_eq!(r.status(), 200, "{}", r.text());
    assert_eq!(rules_on(&gw), false);
    gw.wait_idle();
}

// ------------------------------------------------ who counts as local

#[test]
fn toggles_refuse_every_other_address_and_every_forwarding_header() {
    let cluster = engines(1);
    let gw = Gateway::start_with(
        &[("chat", route_yaml(&ports(&cluster), ""))],
        GatewayOptions {
            listen_host: "[::]",
            ..Default::default()
        },
    );
    let off = "/chat/_reject_rules_toggle?on=0";
    let spoofs: [&[(&str, &str)]; 4] = [
        &[],
        &[("X-Forwarded-For", "127.0.0.1")],
        &[("Forwarded", "for=127.0.0.1")],
        &[("X-Real-IP", "127.0.0.1")],
    ];
    // On a dual-stack listener 127.0.0.2 arrives as ::ffff:127.0.0.2.
    for headers in spoofs {
        let mut c = Conn::open_from([127, 0, 0, 2].into(), gw.addr);
        let r = c.request("POST", off, headers, b"");
        assert_eq!(r.status(), 403, "{headers:?}: {}", r.text());
        assert_eq!(rules_on(&gw), true);
    }
    // Controls: 127.0.0.1 (as ::ffff:127.0.0.1) and ::1 are local.
    let mut c = Conn::open_from([127, 0, 0, 1].into(), gw.addr);
    assert_eq!(c.request("POST", off, &[], b"").status(), 200);
    assert_eq!(rules_on(&gw), false);
    let v6 = std::net::SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, gw.addr.port()));
    let r = Conn::open(v6).request("POST", "/chat/_reject_rules_toggle?on=1", &[], b"");
    assert_eq!(r.status(), 200, "{}", r.text());
    assert_eq!(rules_on(&gw), true);
}

// ------------------------------------------ what the /_ endpoints show

fn state_from(gw: &Gateway, from: [u8; 4], headers: &[(&str, &str)]) -> http::Response {
    Conn::open_from(std::net::IpAddr::from(from), gw.addr).request(
        "GET",
        "/chat/_route_state",
        headers,
        b"",
    )
}

fn first_address(r: &http::Response) -> String {
    r.json()["peers"][0]["address"]
        .as_str()
        .unwrap_or("")
        .to_string()
}

#[test]
fn open_status_endpoints_hide_engine_addresses_from_other_hosts() {
    let (cluster, gw, _keys) = keyed_gateway("");
    let port = cluster.engines[0].port().to_string();
    let r = state_from(&gw, [127, 0, 0, 2], &[]);
    assert_eq!(r.status(), 200, "open: no key needed");
    assert_eq!(first_address(&r), "[redacted]");
    assert_eq!(r.json()["peers"][0]["name"], "e0", "peers by name");
    for path in [
        "/chat/_route_opts",
        "/chat/_route_state",
        "/_bodylog_status",
    ] {
        let r = Conn::open_from([127, 0, 0, 2].into(), gw.addr).request("GET", path, &[], b"");
        assert_eq!(r.status(), 200, "{path}");
        assert!(
            !r.text().contains(&format!(":{port}")),
            "{path}: {}",
            r.text()
        );
        assert!(
            !r.text().contains(&format!("\"port\":{port}")),
            "{path}: {}",
            r.text()
        );
    }
    // Control: the machine itself sees them.
    let r = state_from(&gw, [127, 0, 0, 1], &[]);
    assert_eq!(first_address(&r), format!("127.0.0.1:{port}"));
}

#[test]
fn key_mode_status_endpoints_need_the_key_or_loopback() {
    let (_cluster, gw, _keys) = keyed_gateway("status_endpoints: key\n");
    let key = ("Authorization", "Bearer sk-good");
    for path in ["/chat/_route_state", "/chat/_sessions", "/_bodylog_status"] {
        let get = |from: [u8; 4], headers: &[(&str, &str)]| {
            Conn::open_from(std::net::IpAddr::from(from), gw.addr)
                .request("GET", path, headers, b"")
        };
        let r = get([127, 0, 0, 2], &[]);
        assert_eq!(r.status(), 401, "{path}: {}", r.text());
        assert_eq!(r.json()["error"]["type"], "unauthorized");
        assert_eq!(
            get([127, 0, 0, 2], &[("Authorization", "Bearer nope")]).status(),
            401
        );
        assert_eq!(
            get([127, 0, 0, 2], &[("X-Forwarded-For", "127.0.0.1")]).status(),
            401
        );
        // Controls: with the key, or from the machine itself.
        assert_eq!(get([127, 0, 0, 2], &[key]).status(), 200, "{path}");
        assert_eq!(get([127, 0, 0, 1], &[]).status(), 200, "{path}");
    }
    let r = Conn::open_from([127, 0, 0, 2].into(), gw.addr).request(
        "POST",
        "/chat/_route_inspect",
        &[],
        &small_chat(),
    );
    assert_eq!(r.status(), 401, "{}", r.text());
    // A key holder still sees no addresses; loopback does.
    assert_eq!(
        first_address(&state_from(&gw, [127, 0, 0, 2], &[key])),
        "[redacted]"
    );
    assert!(first_address(&state_from(&gw, [127, 0, 0, 1], &[])).starts_with("127.0.0.1:"));
}

#[test]
fn loopback_mode_status_endpoints_answer_only_this_machine() {
    let (_cluster, gw, _keys) = keyed_gateway("status_endpoints: loopback\n");
    let key = ("Authorization", "Bearer sk-good");
    for headers in [&[][..], &[key], &[("X-Forwarded-For", "127.0.0.1")]] {
        let r = state_from(&gw, [127, 0, 0, 2], headers);
        assert_eq!(r.status(), 403, "{headers:?}: {}", r.text());
        assert_eq!(r.json()["error"]["type"], "forbidden");
    }
    let r = Conn::open_from([127, 0, 0, 2].into(), gw.addr).request(
        "GET",
        "/_bodylog_status",
        &[],
        b"",
    );
    assert_eq!(r.status(), 403);
    // Control: from 127.0.0.1, everything.
    let r = state_from(&gw, [127, 0, 0, 1], &[]);
    assert_eq!(r.status(), 200);
    assert!(first_address(&r).starts_with("127.0.0.1:"));
    // The API itself is unaffected.
    let r = Conn::open_from([127, 0, 0, 2].into(), gw.addr).request(
        "POST",
        CHAT,
        &[key],
        &small_chat(),
    );
    assert_eq!(r.status(), 200, "{}", r.text());
}

// ------------------------------------------------------ invalid UTF-8

#[test]
fn invalid_utf8_in_session_headers_bodies_and_paths_is_handled() {
    let cluster = engines(1);
    let gw = Gateway::start(&[
        ("chat", route_yaml(&ports(&cluster), "")),
        ("prio", route_yaml(&ports(&cluster), "session_prio: true\n")),
    ]);
    let body = small_chat();
    // Session headers that are not UTF-8 (obs-text bytes): the gateway
    // hashes the bytes and places the request (the simulated engine then
    // refuses a head that is not UTF-8 itself; that answer is its own).
    for (route, header) in [
        ("chat", &b"x-session-id"[..]),
        ("chat", b"x-claude-code-session-id"),
        ("prio", b"x-phanrouter-session"),
    ] {
        let mut sessions = Vec::new();
        for _ in 0..2 {
            let mut raw_req = format!("POST /{route}/v1/chat/completions HTTP/1.1\r\nHost: gateway.test\r\nContent-Type: application/json\r\nContent-Length: {}\r\n", body.len()).into_bytes();
            raw_req.extend_from_slice(header);
            raw_req.extend_from_slice(b": \xff\xfe-not-utf8 \xc3\x28\r\n\r\n");
            raw_req.extend_from_slice(&body);
            let mut conn = Conn::open(gw.addr);
            conn.send_raw(&raw_req);
            let r = conn.read_response();
            let what = format!(
                "{route} {}: {} {}",
                String::from_utf8_lossy(header),
                r.status(),
                r.text()
            );
            assert!(r.status() < 500, "{what}");
            assert_eq!(r.header("x-routed-peer"), Some("e0"), "placed: {what}");
            sessions.push(r.header("x-routed-session").map(str::to_string));
        }
        assert_eq!(sessions[0], sessions[1], "the same bytes, the same session");
        if route == "chat" {
            assert!(sessions[0].is_some(), "the bytes are a session id");
        }
    }
    // A chat body that is not UTF-8 is not JSON: a 400 in the contract.
    let bad_chat = b"{\"model\":\"sim-model\",\"messages\":[{\"role\":\"user\",\"content\":\"\xff\xfe\"}],\"metadata\":{\"session_id\":\"\xc3\x28\"}}";
    let r = http::request(
        gw.addr,
        "POST",
        CHAT,
        &[("Content-Type", "application/json")],
        bad_chat,
    );
    assert_eq!(r.status(), 400, "{}", r.text());
    assert_eq!(r.json()["error"]["type"], "invalid_request");
    // Any other /v1/ path forwards the bytes as they are.
    let raw_bytes = b"\xff\xfe\x00binary\xc3\x28";
    let r = http::request(gw.addr, "POST", "/chat/v1/audio/raw", &[], raw_bytes);
    let recorded = cluster.engines[0].stats.recorded.lock();
    let last = recorded.last().expect("forwarded");
    assert_eq!(last.body, raw_bytes, "status {}", r.status());
    drop(recorded);
    // A path with bytes that are not UTF-8.
    let answer = exchange(
        &gw,
        b"GET /chat/v1/\xff\xfe HTTP/1.1\r\nHost: gateway.test\r\n\r\n",
    );
    assert!(answer.starts_with("HTTP/1.1 "), "{answer:?}");
    let r = http::get(gw.addr, "/chat/_route_debug?sid=%ff%fe%c3%28");
    assert_eq!(r.status(), 200, "{}", r.text());
    // Control: the gateway serves on, and nothing is left in flight.
    let r = http::request(gw.addr, "POST", CHAT, &[("x-session-id", "plain")], &body);
    assert_eq!(r.status(), 200);
    assert!(r.header("x-routed-session").is_some());
    gw.wait_idle();
}

// ---------------------------------------------------- keys in the log

#[test]
fn an_api_key_in_a_query_string_reaches_no_log_line() {
    const SECRET: &str = "sk-query-secret-4242";
    let cluster = engines(1);
    let dead = free_port();
    let gw = Gateway::start_with(
        &[
            ("chat", route_yaml(&ports(&cluster), "")),
            (
                "dead",
                format!("peers:\n  - {{name: gone, host: 127.0.0.1, port: {dead}}}\nhealth: {{enabled: false}}\nengine_metrics: false\n"),
            ),
        ],
        GatewayOptions {
            env: vec![("RUST_LOG".into(), "debug".into())],
            // The near-cap head below is for the replay's 431, not the
            // gateway's own limit.
            extra_config: "max_header_size: 1m\n".into(),
            ..Default::default()
        },
    );
    let q = format!("?api_key={SECRET}&key={SECRET}&token={SECRET}");
    let body = small_chat();
    let json = [("Content-Type", "application/json")];
    // Served, refused by the gateway, failed upstream.
    for (path, status) in [
        (format!("{CHAT}{q}"), 200),
        (format!("/dead/v1/chat/completions{q}"), 502),
        (format!("/chat/v1/../x{q}"), 400),
        (format!("/nope/v1/x{q}"), 404),
    ] {
        let r = http::request(gw.addr, "POST", &path, &json, &body);
        assert_eq!(r.status(), status, "{path}");
    }
    // Refused by Pingora's parser, a head cut short, a head too large.
    let bad = format!(
        "POST {CHAT}{q} HTTP/1.1\r\nHost: g\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n"
    );
    assert!(exchange(&gw, bad.as_bytes()).starts_with("HTTP/1.1 400"));
    let mut s = raw(&gw);
    s.write_all(format!("POST {CHAT}{q} HTTP/1.1\r\nHost: g").as_bytes())
        .unwrap();
    drop(s);
    let mut big = padded_head(PINGORA_HEAD_CAP - 100, &replayed_chat());
    let line_end = big.iter().position(|&b| b == b' ').unwrap() + 1 + CHAT.len();
    big.splice(line_end..line_end, q.bytes());
    let mut conn = Conn::open(gw.addr);
    conn.send_raw(&big);
    assert_eq!(conn.read_response().status(), 431);
    // Control: each of them left its line, at debug or above.
    let log = wait_for("every line", DEADLINE, || {
        let log = gw.log();
        (log.contains("proxying failed")
            && log.contains("answered 431")
            && log.contains("ended inside a request head"))
        .then_some(log)
    });
    assert!(!log.contains(SECRET), "{log}");
    assert!(!log.contains("api_key="), "{log}");
    gw.wait_idle();
}

// ------------------------------------------------------ hostile h2 (h2c)

const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// One raw h2 frame: the 9-byte header then `payload`. Written by hand
/// because the `h2` client cannot send floods of control frames.
fn h2_frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len()).expect("frame fits");
    let mut f = len.to_be_bytes()[1..].to_vec();
    f.extend([kind, flags]);
    f.extend((stream & 0x7fff_ffff).to_be_bytes());
    f.extend(payload);
    f
}

/// Floods one h2c connection with `frame` after the preface. Returns
/// whether the gateway closed it.
fn flood_h2c(gw: &Gateway, frame: &[u8], count: usize) -> bool {
    let burst: Vec<u8> = frame.repeat(256);
    h2c_session(gw, |s| {
        for _ in 0..count / 256 {
            if s.write_all(&burst).is_err() {
                break;
            }
        }
    })
}

/// One h2c connection: the preface and an empty SETTINGS, then what
/// `write` sends, reading (and discarding) whatever the gateway answers
/// meanwhile so it is never blocked on our receive window. Returns whether
/// the gateway closed it.
fn h2c_session(gw: &Gateway, write: impl FnOnce(&mut TcpStream)) -> bool {
    let mut s = raw(gw);
    s.set_write_timeout(Some(DEADLINE)).ok();
    s.set_read_timeout(Some(Duration::from_millis(200))).ok();
    let mut reader = s.try_clone().expect("clone");
    let drain = std::thread::spawn(move || {
        let deadline = Instant::now() + DEADLINE;
        let mut buf = [0u8; 16 * 1024];
        while Instant::now() < deadline {
            match reader.read(&mut buf) {
                Ok(0) => return true,
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
                Err(_) => return true,
            }
        }
        false
    });
    let mut batch = H2_PREFACE.to_vec();
    batch.extend(h2_frame(0x4, 0, 0, &[]));
    let _ = s.write_all(&batch);
    write(&mut s);
    // Not closing our side: the gateway's answer (close or not) decides.
    let _ = s.shutdown(std::net::Shutdown::Write);
    drain.join().expect("drain")
}

fn control_stream_served(gw: &Gateway) {
    let body = chat_body("h2-control", "still served?", true).to_string();
    let r = http::request(gw.addr, "POST", CHAT, &[], body.as_bytes());
    assert_eq!(r.status(), 200);
    assert!(r.text().contains("data: "), "no SSE frames: {}", r.text());
}

/// A flood of PING and of empty SETTINGS frames on one h2c connection:
/// the gateway answers or closes, and stays up for other clients.
#[test]
fn h2c_ping_and_settings_floods_leave_the_gateway_serving() {
    let (_cluster, mut gw) = gateway("h2c: true\n", &[]);
    let rss_before = gw.rss_kib();
    let ping = h2_frame(0x6, 0, 0, &[7; 8]);
    let settings = h2_frame(0x4, 0, 0, &[]);
    for (what, frame) in [("PING", ping), ("SETTINGS", settings)] {
        let started = Instant::now();
        let closed = flood_h2c(&gw, &frame, 100_000);
        eprintln!(
            "{what} flood: closed={closed} after {:?}",
            started.elapsed()
        );
        assert!(gw.is_alive(), "gateway died under the {what} flood");
        control_stream_served(&gw);
    }
    // 200k frames in: a per-frame allocation kept would show here.
    let grown = gw.rss_kib().saturating_sub(rss_before);
    assert!(grown < 64 * 1024, "RSS grew {grown} KiB under the floods");
}

/// One h2 POST head for `path`, as an HPACK block of static-table and
/// literal fields (no Huffman, nothing added to the dynamic table).
fn h2_post_head(path: &str) -> Vec<u8> {
    let literal = |name_index: u8, value: &str| {
        let len = u8::try_from(value.len()).expect("short value");
        assert!(len < 127, "one-byte length");
        let mut f = vec![name_index, len];
        f.extend(value.as_bytes());
        f
    };
    // :method POST (static 3), :scheme http (static 6), then :path (4)
    // and :authority (1) as literals without indexing.
    let mut block = vec![0x83, 0x86];
    block.extend(literal(0x04, path));
    block.extend(literal(0x01, "127.0.0.1"));
    block
}

/// Rapid reset (CVE-2023-44487): streams opened and reset at once, by the
/// thousand, on one h2c connection.
#[test]
fn h2c_rapid_reset_is_bounded_and_leaks_nothing() {
    let (cluster, mut gw) = gateway("h2c: true\n", &[]);
    const STREAMS: u32 = 2_000;
    let head = h2_post_head(CHAT);
    let cancel = 0x8u32.to_be_bytes();
    let mut attack = Vec::new();
    for i in 0..STREAMS {
        let id = 2 * i + 1;
        // HEADERS with END_HEADERS, no END_STREAM (a body would follow),
        // then RST_STREAM(CANCEL).
        attack.extend(h2_frame(0x1, 0x4, id, &head));
        attack.extend(h2_frame(0x3, 0, id, &cancel));
    }
    let started = Instant::now();
    let closed = h2c_session(&gw, |s| {
        let _ = s.write_all(&attack);
    });
    eprintln!("rapid reset: closed={closed} after {:?}", started.elapsed());
    assert!(gw.is_alive(), "gateway died under rapid reset");
    // Control: another client is served meanwhile.
    control_stream_served(&gw);
    // Every stream the gateway began for the attack has let its slot go.
    wait_for("no request left in flight", DEADLINE, || {
        let state = http::get(gw.addr, "/chat/_route_state").json();
        let in_flight: u64 = state["peers"]
            .as_array()
            .map(|ps| {
                ps.iter()
                    .map(|p| p["in_flight"].as_u64().unwrap_or(0))
                    .sum()
            })
            .unwrap_or(u64::MAX);
        (in_flight == 0).then_some(())
    });
    // None of the reset requests had a body to send: the engine saw only
    // the control's. And the same heads are requests it would have seen:
    // three framed alike, each with its body rather than a reset, reach it.
    let before = engine_requests(&cluster);
    h2c_session(&gw, |s| {
        for id in [1u32, 3, 5] {
            let body = chat_body(&format!("h2-raw-{id}"), "framed by hand", false).to_string();
            let _ = s.write_all(&h2_frame(0x1, 0x4, id, &head));
            let _ = s.write_all(&h2_frame(0x0, 0x1, id, body.as_bytes()));
        }
        // The connection stays open until they are there.
        wait_for("the three GETs at the engine", DEADLINE, || {
            (engine_requests(&cluster) >= before + 3).then_some(())
        });
    });
    assert!(
        before <= 1,
        "{before} requests reached the engines from {STREAMS} reset streams"
    );
}

fn engine_requests(cluster: &SimCluster) -> u64 {
    cluster
        .engines
        .iter()
        .map(|e| e.stats.requests.load(std::sync::atomic::Ordering::SeqCst))
        .sum()
}
