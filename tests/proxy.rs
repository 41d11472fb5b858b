//! Forwarding through the real binary — bodies of any size arrive
//! byte-identical, streams pass frame by frame, failures answer JSON and
//! leave no in-flight count behind.

mod common;

use common::http::{self, Conn, Upload};
use common::*;
use serde_json::json;
use std::sync::atomic::Ordering;

const CHAT: &str = "/chat/v1/chat/completions";

/// A chat request body of exactly `size` bytes, distinct per `tag`.
fn body_of_size(size: usize, tag: &str) -> Vec<u8> {
    let head =
        format!("{{\"model\":\"sim-model\",\"messages\":[{{\"role\":\"user\",\"content\":\"{tag}:");
    let tail = "\"}]}";
    let pad = size.saturating_sub(head.len() + tail.len());
    let filler: String = (0..pad).map(|i| (b'a' + (i % 26) as u8) as char).collect();
    let body = format!("{head}{filler}{tail}").into_bytes();
    assert_eq!(body.len(), size);
    body
}

/// A route whose first peer refuses connections; its ban is short so that
/// it keeps being tried (ties between idle peers are broken at random).
/// Each request, one body sent again and again, must be free to land on
/// the dead peer to be retried: content recognition, which would keep the
/// body's "conversation" on the live peer once it had been there, is off.
fn dead_then_live(dead: u16, live: u16) -> String {
    format!(
        "peers:\n  - {{name: dead, host: 127.0.0.1, port: {dead}}}\n  - {{name: live, host: 127.0.0.1, port: {live}}}\nhealth:\n  enabled: false\n  ban_ttl: 50ms\nbalancing:\n  session_affinity: {{content: off}}\n"
    )
}

const SIZES: [usize; 4] = [1_000, 70_000, 300_000, 2_000_000];

fn last_recorded(cluster: &SimCluster, engine: usize) -> Vec<u8> {
    cluster.engines[engine]
        .stats
        .recorded
        .lock()
        .last()
        .map(|r| r.body.clone())
        .expect("engine recorded a request")
}

/// Sends `body` as an echo request (the sim answers with the body it got)
/// on `conn` and reads the answer.
fn echo(conn: &mut Conn, body: &[u8], mode: Upload) -> http::Response {
    conn.send(
        "POST",
        CHAT,
        &[("Content-Type", "application/json"), ("x-sim-echo", "1")],
        body,
        mode,
    );
    conn.read_response()
}

/// `length` → a Content-Length upload; anything else chunked in `chunk` bytes.
fn upload(kind: &str, chunk: usize) -> Upload {
    if kind == "length" {
        Upload::Length
    } else {
        Upload::Chunked(chunk)
    }
}

#[test]
fn bodies_arrive_byte_identical_over_one_keepalive_connection() {
    let cluster = engines(1);
    let gw = Gateway::start(&[("chat", route_yaml(&ports(&cluster), ""))]);
    for kind in ["length", "chunked"] {
        // big → small → big on one connection: the 2nd and 3rd requests ride
        // the same client connection as the first.
        let mut conn = Conn::open(gw.addr);
        for size in SIZES {
            for (round, s) in [size, 1_000, size].into_iter().enumerate() {
                let body = body_of_size(s, &format!("{kind}-{size}-{round}"));
                let resp = echo(&mut conn, &body, upload(kind, 16 * 1024));
                assert_eq!(resp.status(), 200, "{kind} {s}: {}", resp.text());
                // A response begun before Pingora finished the request body
                // says close, and the next request meets a reset.
                assert_eq!(
                    resp.header("connection"),
                    Some("keep-alive"),
                    "{kind} {s} round {round}"
                );
                assert!(
                    resp.body == body,
                    "{kind} {s} round {round}: echoed body differs"
                );
                assert!(
                    last_recorded(&cluster, 0) == body,
                    "{kind} {s} round {round}: engine saw a different body"
                );
            }
        }
    }
    gw.wait_idle();
}

#[test]
fn bodies_survive_a_retry_from_a_refused_peer() {
    let cluster = engines(1);
    let dead = free_port();
    // Ties between idle peers are broken at random and the refused peer's
    // ban is short, so within a few requests each size meets it first.
    let route = dead_then_live(dead, cluster.engines[0].port());
    let gw = Gateway::start(&[("chat", route)]);
    for size in SIZES {
        for kind in ["length", "chunked"] {
            let body = body_of_size(size, &format!("retry-{kind}-{size}"));
            let resp = wait_for("a request that was retried", DEADLINE, || {
                let mut conn = Conn::open(gw.addr);
                let resp = echo(&mut conn, &body, upload(kind, 64 * 1024));
                assert_eq!(resp.status(), 200, "{}", resp.text());
                assert!(resp.body == body, "{size} {kind}: body differs");
                (resp.header("x-routed-retries") == Some("1")).then_some(resp)
            });
            assert_eq!(resp.header("x-routed-peer"), Some("live"));
            assert!(last_recorded(&cluster, 0) == body);
        }
    }
    gw.wait_idle();
}

/// Which way a pre-read body went back to Pingora.
fn forwards(gw: &Gateway, via: &str) -> f64 {
    gw.metric(
        "llm_gateway_request_body_forwards_total",
        &[&format!("via=\"{via}\"")],
    )
}

/// Pingora's retry buffer holds 64 KiB (pingora-core 0.9.1 BODY_BUF_LIMIT).
const RETRY_BUFFER: usize = 64 * 1024;

/// A body that fits Pingora's retry buffer is sent from it, with
/// no replay: byte-identical, on one keep-alive connection, re-sent after a
/// refused peer, and with `Expect: 100-continue` answered once and never
/// passed to the engine.
#[test]
fn a_body_that_fits_the_retry_buffer_is_sent_from_it() {
    let cluster = engines(1);
    let dead = free_port();
    let gw = Gateway::start(&[("chat", dead_then_live(dead, cluster.engines[0].port()))]);
    let mut sent = 0.0;
    let mut conn = Conn::open(gw.addr);
    for size in [1_000, RETRY_BUFFER] {
        for kind in ["length", "chunked"] {
            let body = body_of_size(size, &format!("fits-{kind}-{size}"));
            let resp = wait_for("a request that was retried", DEADLINE, || {
                let resp = echo(&mut conn, &body, upload(kind, 4096));
                sent += 1.0;
                assert_eq!(resp.status(), 200, "{size} {kind}: {}", resp.text());
                assert!(resp.body == body, "{size} {kind}: echoed body differs");
                (resp.header("x-routed-retries") == Some("1")).then_some(resp)
            });
            assert_eq!(resp.header("x-routed-peer"), Some("live"));
            assert!(last_recorded(&cluster, 0) == body);
        }
    }
    let body = body_of_size(1_000, "expect");
    let head = format!(
        "POST {CHAT} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nx-sim-echo: 1\r\nContent-Length: {}\r\nExpect: 100-continue\r\n\r\n",
        body.len()
    );
    conn.send_raw(head.as_bytes());
    assert_eq!(conn.read_head_raw_status(), 100);
    conn.send_raw(&body);
    let resp = conn.read_response();
    sent += 1.0;
    assert_eq!(resp.status(), 200);
    assert!(resp.body == body);
    let recorded = cluster.engines[0].stats.recorded.lock().last().cloned();
    let recorded = recorded.expect("engine recorded a request");
    assert!(
        !recorded
            .headers
            .iter()
            .any(|(k, _)| k.eq_ignore_ascii_case("expect")),
        "{:?}",
        recorded.headers
    );
    assert_eq!(forwards(&gw, "retry_buffer"), sent);
    assert_eq!(forwards(&gw, "replay"), 0.0);
    gw.wait_idle();
}

/// One byte over the retry buffer goes through the replay, as
/// every larger body does (`bodies_arrive_byte_identical_...` and
/// `bodies_survive_a_retry_...` cover sizes up to 2 MB).
#[test]
fn a_body_over_the_retry_buffer_goes_through_the_replay() {
    let cluster = engines(1);
    let gw = Gateway::start(&[("chat", route_yaml(&ports(&cluster), ""))]);
    let mut conn = Conn::open(gw.addr);
    // Chunked: buffered until it overflowed; with a Content-Length over
    // the limit: never buffered.
    let rounds = [
        (RETRY_BUFFER + 1, Upload::Chunked(16 * 1024)),
        (1_000, Upload::Length),
        (RETRY_BUFFER + 1, Upload::Length),
    ];
    for (round, (size, mode)) in rounds.into_iter().enumerate() {
        let body = body_of_size(size, &format!("over-{round}"));
        let resp = echo(&mut conn, &body, mode);
        assert_eq!(resp.status(), 200, "{size}: {}", resp.text());
        assert!(
            resp.body == body,
            "{size} round {round}: echoed body differs"
        );
        assert!(last_recorded(&cluster, 0) == body);
    }
    assert_eq!(forwards(&gw, "replay"), 2.0);
    assert_eq!(forwards(&gw, "retry_buffer"), 1.0);
    gw.wait_idle();
}

/// A long streaming prompt is forwarded in the pieces it was
/// read in, with include_usage spliced between them: the engine gets the
/// client's bytes plus exactly the inserted member, whether the body came
/// with a Content-Length, in tiny chunks (copied together into pieces) or
/// in large ones, through the replay and through the retry buffer.
#[test]
fn a_long_streaming_prompt_gets_include_usage_spliced_between_its_pieces() {
    let cluster = engines(1);
    let gw = Gateway::start(&[(
        "chat",
        route_yaml(&ports(&cluster), "include_usage: true\n"),
    )]);
    let mut conn = Conn::open(gw.addr);
    let inserted = br#""stream_options":{"include_usage":true},"#;
    let rounds = [
        (300_000, Upload::Length),
        (300_000, Upload::Chunked(100)),
        (300_000, Upload::Chunked(40_000)),
        (2_000, Upload::Chunked(100)),
    ];
    for (round, (size, mode)) in rounds.into_iter().enumerate() {
        // Multi-byte text throughout, so piece boundaries fall inside
        // characters too.
        let filler = "é中😀 \\\"x\\n".repeat(size / 16);
        let raw = format!(
            r#"{{"model":"sim-model","stream":true,"max_tokens":2,"messages":[{{"role":"user","content":"{round}{filler}"}}]}}"#
        );
        conn.send(
            "POST",
            CHAT,
            &[("Content-Type", "application/json")],
            raw.as_bytes(),
            mode,
        );
        let resp = conn.read_response();
        assert_eq!(resp.status(), 200, "round {round}: {}", resp.text());
        assert!(resp.text().contains("[DONE]"));
        let mut expected = b"{".to_vec();
        expected.extend_from_slice(inserted);
        expected.extend_from_slice(&raw.as_bytes()[1..]);
        assert!(
            last_recorded(&cluster, 0) == expected,
            "round {round}: the engine saw a different body"
        );
        // The replay's chunked placeholder never reaches the engine: one
        // Content-Length, the real one, and no Transfer-Encoding.
        let recorded = cluster.engines[0].stats.recorded.lock().last().cloned();
        let headers = recorded.expect("engine recorded a request").headers;
        let named = |name: &str| -> Vec<&str> {
            headers
                .iter()
                .filter(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.as_str())
                .collect()
        };
        assert_eq!(named("content-length"), [expected.len().to_string()]);
        assert!(named("transfer-encoding").is_empty(), "{headers:?}");
    }
    assert_eq!(forwards(&gw, "replay"), 3.0);
    assert_eq!(forwards(&gw, "retry_buffer"), 1.0);
    gw.wait_idle();
}

#[test]
fn stream_reaches_the_client_frame_by_frame() {
    let cluster = engines(1);
    let gw = Gateway::start(&[("chat", route_yaml(&ports(&cluster), ""))]);
    let mut conn = Conn::open(gw.addr);
    let body = json!({"model": "sim-model", "stream": true, "max_tokens": 5,
                      "messages": [{"role": "user", "content": "stream please"}]});
    conn.send(
        "POST",
        CHAT,
        &[("Content-Type", "application/json"), ("x-sim-gate", "g1")],
        body.to_string().as_bytes(),
        Upload::Length,
    );
    let head = conn.read_head();
    assert_eq!(head.status, 200);
    assert!(head
        .header("content-type")
        .unwrap_or("")
        .starts_with("text/event-stream"));
    // The engine holds everything after its first content frame until the
    // gate opens: receiving a frame now proves nothing waited for the rest.
    let first = conn.read_chunk().expect("first frame").expect("data");
    assert!(String::from_utf8_lossy(&first).contains("chat.completion.chunk"));
    assert_eq!(gw.in_flight_total(), 1.0, "the stream is in flight");
    cluster.engines[0].open_gate("g1");
    let mut rest = Vec::new();
    while let Some(chunk) = conn.read_chunk().expect("stream continues") {
        rest.extend_from_slice(&chunk);
    }
    let rest = String::from_utf8_lossy(&rest);
    assert!(rest.contains("data: [DONE]"), "{rest}");
    gw.wait_idle();
    // Keep-alive after a stream: the same connection serves another request.
    let again = conn.request("GET", "/chat/v1/models", &[], b"");
    assert_eq!(again.status(), 200);
}

#[test]
fn non_stream_passes_through_unchanged_with_routed_headers() {
    let cluster = engines(2);
    let gw = Gateway::start(&[("chat", route_yaml(&ports(&cluster), ""))]);
    let resp = http::post_json(gw.addr, CHAT, &[], &chat_body("s1", "hello", false));
    assert_eq!(resp.status(), 200);
    let v = resp.json();
    assert_eq!(v["object"], "chat.completion");
    assert!(v["usage"]["prompt_tokens"].as_u64().unwrap() > 0);
    assert!(resp.header("x-routed-peer").is_some());
    assert_eq!(resp.header("x-routed-retries"), Some("0"));
    // The engine received the path without the /chat prefix.
    let rec = cluster
        .engines
        .iter()
        .flat_map(|e| e.stats.recorded.lock().clone())
        .last()
        .expect("recorded");
    assert_eq!(rec.path, "/v1/chat/completions");
    let models = http::get(gw.addr, "/chat/v1/models");
    assert_eq!(models.status(), 200);
    assert_eq!(models.json()["data"][0]["id"], "sim-model");
}

#[test]
fn local_errors_are_json() {
    let cluster = engines(1);
    let gw = Gateway::start(&[("chat", route_yaml(&ports(&cluster), "max_body_size: 2k\n"))]);

    let r = http::get(gw.addr, "/nope/v1/models");
    assert_eq!(r.status(), 404);
    assert_eq!(r.json()["error"]["type"], "route_not_found");

    let r = http::request(
        gw.addr,
        "POST",
        CHAT,
        &[("Content-Type", "application/json")],
        b"{not json",
    );
    assert_eq!(r.status(), 400);
    assert_eq!(r.json()["error"]["type"], "invalid_request");

    // Over the route's 2 KiB limit, by Content-Length and by chunked length.
    let big = body_of_size(3_000, "big");
    let r = http::request(
        gw.addr,
        "POST",
        CHAT,
        &[("Content-Type", "application/json")],
        &big,
    );
    assert_eq!(r.status(), 413);
    assert_eq!(r.json()["error"]["type"], "request_too_large");
    let mut conn = Conn::open(gw.addr);
    conn.send(
        "POST",
        CHAT,
        &[("Content-Type", "application/json")],
        &big,
        Upload::Chunked(500),
    );
    assert_eq!(conn.read_response().status(), 413);
    // Control: just under the limit is forwarded.
    let ok = body_of_size(2_000, "ok");
    let r = http::request(
        gw.addr,
        "POST",
        CHAT,
        &[("Content-Type", "application/json")],
        &ok,
    );
    assert_eq!(r.status(), 200, "{}", r.text());
    assert_eq!(
        cluster.engines[0].stats.requests.load(Ordering::Relaxed),
        1,
        "only the control reached the engine"
    );
    gw.wait_idle();
}

#[test]
fn refused_peer_is_retried_and_no_ready_peer_is_503() {
    let cluster = engines(1);
    let dead = free_port();
    let two = dead_then_live(dead, cluster.engines[0].port());
    let one = format!("peers:\n  - {{name: dead, host: 127.0.0.1, port: {dead}}}\nhealth:\n  enabled: false\n  ban_ttl: 1h\n");
    let gw = Gateway::start(&[("two", two), ("one", one)]);

    // Ties between idle peers are broken at random, and the refused peer's
    // ban is short: within a few requests one tries it first and retries.
    let r = wait_for(
        "a request that hit the refused peer first",
        DEADLINE,
        || {
            // No session id: a session would stick to the live peer after its first turn.
            let body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
            let r = http::post_json(gw.addr, "/two/v1/chat/completions", &[], &body);
            assert_eq!(r.status(), 200, "{}", r.text());
            (r.header("x-routed-retries") == Some("1")).then_some(r)
        },
    );
    assert_eq!(r.header("x-routed-peer"), Some("live"));

    // Only peer refuses: every attempt failed → 502; then it is banned → 503.
    let r = http::post_json(
        gw.addr,
        "/one/v1/chat/completions",
        &[],
        &chat_body("s", "hi", false),
    );
    assert_eq!(r.status(), 502, "{}", r.text());
    assert_eq!(r.json()["error"]["type"], "upstream_error");
    let r = http::post_json(
        gw.addr,
        "/one/v1/chat/completions",
        &[],
        &chat_body("s", "hi", false),
    );
    assert_eq!(r.status(), 503, "{}", r.text());
    assert_eq!(r.json()["error"]["type"], "no_healthy_upstream");
    assert_eq!(r.header("retry-after"), Some("5"));
    gw.wait_idle();
}

#[test]
fn engine_death_mid_stream_ends_the_client_stream_without_a_clean_end() {
    let cluster = engines(1);
    let gw = Gateway::start(&[("chat", route_yaml(&ports(&cluster), ""))]);
    let body = json!({"model": "sim-model", "stream": true, "max_tokens": 20,
                      "messages": [{"role": "user", "content": "die"}]});
    let read_stream = |conn: &mut Conn| -> (usize, bool) {
        conn.send(
            "POST",
            CHAT,
            &[("Content-Type", "application/json")],
            body.to_string().as_bytes(),
            Upload::Length,
        );
        assert_eq!(conn.read_head().status, 200);
        let mut frames = 0;
        loop {
            match conn.read_chunk() {
                Ok(Some(_)) => frames += 1,
                Ok(None) => return (frames, true),
                Err(_) => return (frames, false),
            }
        }
    };
    // Control: a healthy stream ends with the terminating chunk.
    assert!(
        read_stream(&mut Conn::open(gw.addr)).1,
        "healthy stream ends cleanly"
    );
    cluster.engines[0]
        .faults
        .die_after_frames
        .store(3, Ordering::Relaxed);
    let (frames, clean) = read_stream(&mut Conn::open(gw.addr));
    assert!(!clean, "a dead engine must not look like a finished stream");
    assert!(frames >= 1);
    gw.wait_idle();
}

#[test]
fn in_flight_returns_to_zero_on_every_failure_path() {
    let cluster = engines(1);
    let dead = free_port();
    let gw = Gateway::start(&[
        ("chat", route_yaml(&ports(&cluster), "max_body_size: 1k\n")),
        ("dead", format!("peers:\n  - {{name: d, host: 127.0.0.1, port: {dead}}}\nhealth:\n  enabled: false\n")),
    ]);
    // Local response (413).
    let r = http::request(
        gw.addr,
        "POST",
        CHAT,
        &[("Content-Type", "application/json")],
        &body_of_size(2_000, "x"),
    );
    assert_eq!(r.status(), 413);
    gw.wait_idle();
    // Connect failure (502).
    let r = http::post_json(
        gw.addr,
        "/dead/v1/chat/completions",
        &[],
        &chat_body("s", "x", false),
    );
    assert_eq!(r.status(), 502);
    gw.wait_idle();
    // Client disconnect mid-stream; the gauge shows 1 while it runs (control).
    {
        let mut conn = Conn::open(gw.addr);
        let body =
            json!({"model": "m", "stream": true, "messages": [{"role": "user", "content": "x"}]});
        conn.send(
            "POST",
            CHAT,
            &[
                ("Content-Type", "application/json"),
                ("x-sim-gate", "never"),
            ],
            body.to_string().as_bytes(),
            Upload::Length,
        );
        assert_eq!(conn.read_head().status, 200);
        conn.read_chunk().expect("first frame");
        assert_eq!(gw.in_flight_total(), 1.0);
    }
    gw.wait_idle();
    wait_for("engine to see the disconnect", DEADLINE, || {
        (cluster.engines[0].stats.in_flight.load(Ordering::Relaxed) == 0).then_some(())
    });
    // Engine death mid-stream.
    cluster.engines[0]
        .faults
        .die_after_frames
        .store(2, Ordering::Relaxed);
    let mut conn = Conn::open(gw.addr);
    let body = json!({"model": "m", "stream": true, "max_tokens": 10, "messages": [{"role": "user", "content": "x"}]});
    conn.send(
        "POST",
        CHAT,
        &[("Content-Type", "application/json")],
        body.to_string().as_bytes(),
        Upload::Length,
    );
    let head = conn.read_head();
    assert_eq!(head.status, 200);
    while let Ok(Some(_)) = conn.read_chunk() {}
    gw.wait_idle();
}

#[test]
fn expect_100_continue_is_answered() {
    let cluster = engines(1);
    let gw = Gateway::start(&[("chat", route_yaml(&ports(&cluster), ""))]);
    let body = body_of_size(300_000, "expect");
    let mut conn = Conn::open(gw.addr);
    let head = format!(
        "POST {CHAT} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nx-sim-echo: 1\r\nContent-Length: {}\r\nExpect: 100-continue\r\n\r\n",
        body.len()
    );
    conn.send_raw(head.as_bytes());
    // The gateway must say 100 Continue before the client sends the body.
    let interim = conn.read_head_raw_status();
    assert_eq!(interim, 100);
    conn.send_raw(&body);
    let resp = conn.read_response();
    assert_eq!(resp.status(), 200);
    assert!(resp.body == body);
}

#[test]
fn admin_endpoints() {
    let cluster = engines(1);
    let gw = Gateway::start(&[("chat", route_yaml(&ports(&cluster), ""))]);
    assert_eq!(http::get(gw.admin, "/healthz").status(), 200);
    http::post_json(gw.addr, CHAT, &[], &chat_body("s", "hi", false));
    // Counted when the request is logged, just after the client has the response.
    wait_for("the request counter", DEADLINE, || {
        let text = http::get(gw.admin, "/metrics").text();
        let n = metric_sum(
            &text,
            "llm_gateway_requests_total",
            &["route=\"chat\"", "code=\"200\""],
        );
        (n == 1.0).then_some(())
    });
    let metrics = http::get(gw.admin, "/metrics").text();
    for name in [
        "llm_gateway_requests_total{",
        "llm_gateway_in_flight{",
        "llm_gateway_reloads_total{",
        "llm_gateway_request_duration_seconds_bucket{",
    ] {
        assert!(metrics.contains(name), "missing {name}");
    }
    let routes = http::get(gw.admin, "/_routes").json();
    assert_eq!(routes["routes"][0]["name"], "chat");
    assert_eq!(routes["routes"][0]["peers"][0]["name"], "e0");
    assert_eq!(http::get(gw.admin, "/nope").status(), 404);
}

/// A peer that answers every connection with `reply` and closes.
fn raw_peer(reply: &'static [u8]) -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut stream = stream;
            let _ = stream.set_read_timeout(Some(std::time::Duration::from_secs(2)));
            let mut buf = [0u8; 4096];
            let _ = std::io::Read::read(&mut stream, &mut buf);
            let _ = std::io::Write::write_all(&mut stream, reply);
        }
    });
    port
}

#[test]
fn a_502_names_the_peer_without_echoing_the_engines_bytes_or_address() {
    const GARBAGE: &[u8] = b"HTTP/1.1 2OO SECRET-ENGINE-BANNER internal=10.9.8.7\r\n\r\n";
    let port = raw_peer(GARBAGE);
    let route = format!(
        "peers:\n  - {{name: odd-engine, host: 127.0.0.1, port: {port}}}\nhealth: {{enabled: false}}\nengine_metrics: false\n"
    );
    let gw = Gateway::start(&[("chat", route)]);
    let r = http::post_json(gw.addr, CHAT, &[], &chat_body("s", "x", false));
    assert_eq!(r.status(), 502);
    let body = r.text();
    assert_eq!(r.json()["error"]["type"], "upstream_error", "{body}");
    assert!(body.contains("odd-engine"), "names the peer: {body}");
    assert!(!body.contains("SECRET-ENGINE-BANNER"), "{body}");
    assert!(!body.contains("10.9.8.7"), "{body}");
    assert!(
        !body.contains(&port.to_string()),
        "no internal address: {body}"
    );
    // Control: the operator still gets the detail, in the log.
    wait_for("the failure in the log", DEADLINE, || {
        gw.log().contains("odd-engine").then_some(())
    });
}

#[test]
fn upstream_failures_log_the_path_without_its_query() {
    let dead = free_port();
    let route = format!(
        "peers:\n  - {{name: gone, host: 127.0.0.1, port: {dead}}}\nhealth: {{enabled: false}}\nengine_metrics: false\n"
    );
    let gw = Gateway::start(&[("chat", route)]);
    let r = http::post_json(
        gw.addr,
        "/chat/v1/chat/completions?api_key=sk-leaky-secret",
        &[],
        &chat_body("s", "x", false),
    );
    assert_eq!(r.status(), 502);
    // Control: the failure itself is logged, with the path.
    let log = wait_for("the failure in the log", DEADLINE, || {
        let log = gw.log();
        log.contains("/v1/chat/completions").then_some(log)
    });
    assert!(!log.contains("sk-leaky-secret"), "{log}");
    // The test client's Host header.
    assert!(!log.contains("gateway.test"), "{log}");
}

/// `work_stealing: false` gives each proxy thread a runtime of its
/// own (Pingora's no-steal runtimes), background services included. The
/// gateway must still answer on every thread, reload and drain.
#[test]
fn without_work_stealing_the_gateway_serves_reloads_and_drains() {
    let cluster = engines(2);
    let opts = GatewayOptions {
        extra_config: "work_stealing: false\n".to_string(),
        ..GatewayOptions::default()
    };
    let mut gw = Gateway::start_with(&[("chat", route_yaml(&ports(&cluster), ""))], opts);
    // Pingora gives each new connection a thread at random: 16 connections
    // miss one of the two threads with a chance of 2^-15.
    for i in 0..16 {
        let stream = i % 2 == 0;
        let body = chat_body(&format!("s{i}"), "hello", stream);
        let resp = http::post_json(gw.addr, CHAT, &[], &body);
        assert_eq!(resp.status(), 200, "request {i}: {}", resp.text());
        if stream {
            assert!(resp.text().contains("data: [DONE]"), "{}", resp.text());
        } else {
            assert_eq!(resp.json()["object"], "chat.completion");
        }
    }
    gw.write_route("second", &route_yaml(&ports(&cluster), ""));
    gw.reload();
    let resp = http::post_json(
        gw.addr,
        "/second/v1/chat/completions",
        &[],
        &chat_body("t", "hi", false),
    );
    assert_eq!(resp.status(), 200, "{}", resp.text());
    gw.wait_idle();
    gw.signal("TERM");
    assert_eq!(
        gw.wait_exit(std::time::Duration::from_secs(10)),
        Some(0),
        "{}",
        gw.log()
    );
}

/// A client that sends its next request the moment it has the last byte of
/// the one before (on a new connection, as a pool of client threads does)
/// finds the engine's slot free: the gateway releases it before it writes
/// that byte, not once the request's logging runs. One slot, so any late
/// release is a `concurrency_limit` 429. The control: with the slot held by
/// a stream, the next request does get the 429.
#[test]
fn the_slot_is_free_when_the_client_has_the_last_byte() {
    let cluster = engines(1);
    let clients = 4;
    let route = format!(
        "peers:\n  - {{name: solo, host: 127.0.0.1, port: {}, max_concurrency: {clients}}}\n",
        cluster.engines[0].port()
    );
    let gw = Gateway::start(&[("chat", route)]);
    let mut body = chat_body("s", "x", true);
    body["max_tokens"] = json!(1);
    std::thread::scope(|scope| {
        for client in 0..clients {
            let (gw, body) = (&gw, &body);
            scope.spawn(move || {
                for i in 0..250 {
                    let resp = http::post_json(gw.addr, CHAT, &[], body);
                    assert_eq!(
                        resp.status(),
                        200,
                        "client {client} request {i}: {}",
                        resp.text()
                    );
                }
            });
        }
    });
    let held: Vec<_> = (0..clients)
        .map(|_| hold_stream(&gw, CHAT, "held", &[]))
        .collect();
    let resp = http::post_json(gw.addr, CHAT, &[], &body);
    assert_eq!(resp.status(), 429, "{}", resp.text());
    cluster.engines[0].open_gate("held");
    drop(held);
}
