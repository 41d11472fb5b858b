//! Faults: what a client sees when an engine is killed, stalls or
//! answers something that is not HTTP, when a client stops reading, and when
//! the gateway runs out of file descriptors. Each test checks that every
//! in-flight counter returns to 0, and has a control showing the same path
//! working when nothing is wrong.

mod common;

use common::canned::{self, Canned};
use common::http::{self, Conn, Head, Upload};
use common::simproc::SimProc;
use common::*;
use serde_json::json;
use std::io::Write;
use std::net::TcpStream;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const CHAT: &str = "/chat/v1/chat/completions";

/// How a stream ended for its client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// The terminating chunk, after `data: [DONE]`.
    Done,
    /// The terminating chunk without `[DONE]`: a fake clean end.
    Terminated,
    /// The connection ended (or broke) without the terminating chunk.
    Cut,
}

/// Opens a streaming chat completion and reads its head.
fn open_stream(
    addr: std::net::SocketAddr,
    path: &str,
    session: &str,
    headers: &[(&str, &str)],
) -> (Conn, Head) {
    let mut conn = Conn::open(addr);
    let body = json!({"model": "sim-model", "stream": true,
                      "messages": [{"role": "user", "content": "go"}],
                      "metadata": {"session_id": session}});
    let mut all = vec![("content-type", "application/json")];
    all.extend_from_slice(headers);
    conn.send(
        "POST",
        path,
        &all,
        body.to_string().as_bytes(),
        Upload::Length,
    );
    let head = conn.read_head();
    (conn, head)
}

/// Reads the rest of a chunked stream: body bytes received and how it ended.
fn finish(conn: &mut Conn) -> (usize, End) {
    let mut bytes = 0;
    let mut tail: Vec<u8> = Vec::new();
    loop {
        match conn.read_chunk() {
            Ok(Some(chunk)) => {
                bytes += chunk.len();
                tail.extend_from_slice(&chunk);
                let excess = tail.len().saturating_sub(64);
                tail.drain(..excess);
            }
            Ok(None) if String::from_utf8_lossy(&tail).contains("data: [DONE]") => {
                return (bytes, End::Done)
            }
            Ok(None) => return (bytes, End::Terminated),
            Err(_) => return (bytes, End::Cut),
        }
    }
}

/// Whether `peer` of `route` is ready, per `/<route>/_health_status`.
fn ready(gw: &Gateway, route: &str, peer: &str) -> bool {
    let st = http::get(gw.addr, &format!("/{route}/_health_status")).json();
    st["peers"]
        .as_array()
        .and_then(|peers| peers.iter().find(|p| p["name"] == peer))
        .unwrap_or_else(|| panic!("no peer {peer} in {st}"))["ready"]
        == true
}

#[test]
fn an_engine_killed_mid_stream_cuts_only_its_streams_and_is_banned_at_once() {
    // Two real engine processes: SIGKILL takes one with every socket it has.
    let mut a = SimProc::start(64);
    let b = SimProc::start(64);
    // A probe interval far beyond the test: a ban seen here comes from the
    // live failure, not from a probe.
    let route = format!(
        "peers:\n  - {{name: a, host: 127.0.0.1, port: {}, max_concurrency: 100}}\n  - {{name: b, host: 127.0.0.1, port: {}, max_concurrency: 100}}\nhealth:\n  interval: 1h\n  ban_ttl: 1h\n",
        a.port, b.port
    );
    let gw = Gateway::start(&[("chat", route)]);
    assert!(
        ready(&gw, "chat", "a"),
        "control: a is ready before the kill"
    );
    assert!(ready(&gw, "chat", "b"));

    const STREAMS: usize = 50;
    let started = Arc::new(AtomicUsize::new(0));
    let clients: Vec<_> = (0..STREAMS)
        .map(|i| {
            let started = Arc::clone(&started);
            let addr = gw.addr;
            std::thread::spawn(move || {
                // 100 frames 40 ms apart: about 4 s, well past the kill.
                let (mut conn, head) = open_stream(
                    addr,
                    CHAT,
                    &format!("killed-{i}"),
                    &[("x-sim-max-tokens", "100"), ("x-sim-frame-delay-ms", "40")],
                );
                assert_eq!(head.status, 200);
                let peer = head.header("x-routed-peer").expect("peer").to_string();
                conn.read_chunk().expect("first frame").expect("data");
                started.fetch_add(1, Ordering::SeqCst);
                (peer, finish(&mut conn).1)
            })
        })
        .collect();
    wait_for("every stream to start", DEADLINE, || {
        (started.load(Ordering::SeqCst) == STREAMS).then_some(())
    });
    let on = |peer: &str| gw.metric("llm_gateway_in_flight", &[&format!("peer=\"{peer}\"")]);
    let (on_a, on_b) = (on("a"), on("b"));
    assert!(
        on_a >= 1.0 && on_b >= 1.0,
        "streams on both: a {on_a}, b {on_b}"
    );
    assert_eq!(on_a + on_b, STREAMS as f64);

    a.kill();
    // At once: well inside the (1 h) probe interval, and before any new
    // request could have found the port closed.
    wait_for(
        "a to be banned by its cut streams",
        Duration::from_secs(2),
        || (!ready(&gw, "chat", "a")).then_some(()),
    );
    assert!(ready(&gw, "chat", "b"), "the survivor stays ready");

    let ends: Vec<(String, End)> = clients.into_iter().map(|t| t.join().unwrap()).collect();
    let cut = ends.iter().filter(|(p, _)| p == "a").count();
    assert_eq!(cut as f64, on_a);
    for (peer, end) in &ends {
        match peer.as_str() {
            "a" => assert_eq!(
                *end,
                End::Cut,
                "a killed engine's stream is cut, never ended"
            ),
            _ => assert_eq!(*end, End::Done, "the other engine's streams finish intact"),
        }
    }
    // New sessions go to the survivor, without a failed attempt first.
    for i in 0..10 {
        let r = http::post_json(
            gw.addr,
            CHAT,
            &[],
            &chat_body(&format!("new-{i}"), "x", false),
        );
        assert_eq!(r.status(), 200, "{}", r.text());
        assert_eq!(r.header("x-routed-peer"), Some("b"));
    }
    gw.wait_idle();
    assert_eq!(gw.metric("llm_gateway_peer_ready", &["peer=\"a\""]), 0.0);
    assert!(
        gw.log().contains("peer a"),
        "the ban is logged:\n{}",
        gw.log()
    );
}

/// One engine behind a route whose read timeout is 1 s; no probes, so a
/// stalled engine is judged by the exchange alone.
fn one_engine_read_timeout_1s() -> (SimCluster, Gateway) {
    let cluster = engines(1);
    let extra = "timeouts:\n  read: 1s\nhealth:\n  interval: 1h\n";
    let gw = Gateway::start(&[("chat", route_yaml(&ports(&cluster), extra))]);
    (cluster, gw)
}

#[test]
fn an_engine_that_accepts_and_stalls_gets_a_read_timeout_then_a_json_error() {
    let (cluster, gw) = one_engine_read_timeout_1s();
    let engine = &cluster.engines[0];
    // Control: the same request answers while the engine does.
    let ok = http::post_json(gw.addr, CHAT, &[], &chat_body("s", "x", false));
    assert_eq!(ok.status(), 200);

    engine.faults.stall.store(true, Ordering::SeqCst);
    for stream in [false, true] {
        let t = Instant::now();
        let r = http::post_json(gw.addr, CHAT, &[], &chat_body("s", "x", stream));
        let took = t.elapsed();
        assert_eq!(r.status(), 502, "stream {stream}: {}", r.text());
        let error = &r.json()["error"];
        assert_eq!(error["type"], "upstream_error", "{error}");
        assert!(
            error["message"]
                .as_str()
                .unwrap_or("")
                .contains("ReadTimedout"),
            "says it timed out: {error}"
        );
        assert!(
            took >= Duration::from_millis(900) && took < Duration::from_secs(10),
            "answered at the read timeout, not before or long after: {took:?}"
        );
    }
    gw.wait_idle();
    wait_for(
        "the engine to drop the abandoned requests",
        DEADLINE,
        || (engine.stats.in_flight.load(Ordering::SeqCst) == 0).then_some(()),
    );
    // Slow is not dead (the probe's rule too): the peer stays ready, and
    // answers again once it does.
    assert!(ready(&gw, "chat", "e0"));
    engine.faults.stall.store(false, Ordering::SeqCst);
    let again = http::post_json(gw.addr, CHAT, &[], &chat_body("s", "x", false));
    assert_eq!(again.status(), 200);
}

#[test]
fn an_engine_that_sends_200_then_stalls_is_cut_at_the_read_timeout() {
    let (cluster, gw) = one_engine_read_timeout_1s();
    // Control: frames 400 ms apart, 2 s in all, twice the read timeout,
    // finish: the timeout is between bytes, not for the whole response.
    let (mut conn, head) = open_stream(
        gw.addr,
        CHAT,
        "slow",
        &[("x-sim-max-tokens", "6"), ("x-sim-frame-delay-ms", "400")],
    );
    assert_eq!(head.status, 200);
    assert_eq!(finish(&mut conn).1, End::Done);

    // The first frame, then nothing (a gate that never opens).
    let (mut conn, head) = open_stream(gw.addr, CHAT, "stalled", &[("x-sim-gate", "never")]);
    assert_eq!(head.status, 200);
    conn.read_chunk().expect("first frame").expect("data");
    let t = Instant::now();
    let (_, end) = finish(&mut conn);
    assert_eq!(
        end,
        End::Cut,
        "a stalled stream is cut, never ended cleanly"
    );
    assert!(
        t.elapsed() >= Duration::from_millis(900),
        "{:?}",
        t.elapsed()
    );
    gw.wait_idle();
    wait_for("the engine to see the gateway hang up", DEADLINE, || {
        (cluster.engines[0].stats.in_flight.load(Ordering::SeqCst) == 0).then_some(())
    });
    assert!(ready(&gw, "chat", "e0"), "a slow engine is not banned");
}

/// An engine that takes the request head and then stops reading: a long
/// prompt's pieces fill the socket's buffers and the gateway's write
/// blocks. Each write is bounded by `timeouts.read`: a 502 naming the
/// write timeout, no hang. Control: the same 16 MiB prompt to an engine
/// that reads it is answered.
#[test]
fn an_engine_that_stops_reading_a_long_prompt_gets_a_write_timeout() {
    let deaf = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let deaf_port = deaf.local_addr().expect("addr").port();
    let held = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let keep = Arc::clone(&held);
    std::thread::spawn(move || {
        for s in deaf.incoming().flatten() {
            keep.lock().push(s);
        }
    });
    let reading = Canned::start("application/json", vec![b"{}".to_vec()], false);
    let extra = "timeouts:\n  read: 1s\nhealth:\n  interval: 1h\nmax_body_size: 32m\n";
    let gw = Gateway::start(&[
        ("deaf", route_yaml(&[deaf_port], extra)),
        ("reads", route_yaml(&[reading.port()], extra)),
    ]);
    let prompt = "x".repeat(16 << 20);
    let body = chat_body("long", &prompt, false);
    let ok = http::post_json(gw.addr, "/reads/v1/chat/completions", &[], &body);
    assert_eq!(ok.status(), 200, "{}", ok.text());
    let t = Instant::now();
    let r = http::post_json(gw.addr, "/deaf/v1/chat/completions", &[], &body);
    assert_eq!(r.status(), 502, "{}", r.text());
    assert!(r.text().contains("WriteTimedout"), "{}", r.text());
    assert!(t.elapsed() < Duration::from_secs(20), "{:?}", t.elapsed());
    assert!(!held.lock().is_empty(), "the engine took the connection");
    gw.wait_idle();
}

/// The read timeout holds with a next request pipelined behind the stalled
/// one: the gateway keeps the client's early bytes aside while the engine
/// works (Pingora, given them, would stop watching the connection). The
/// 502 comes at the timeout; the connection then closes, as after any
/// failed exchange, and the pipelined request is the client's to send
/// again. The pipelined request answered in order when the engine answers
/// is `hostile::a_request_pipelined_during_a_stream_waits_for_it`.
#[test]
fn a_stalled_engine_times_out_with_a_request_pipelined_behind_it() {
    let (cluster, gw) = one_engine_read_timeout_1s();
    let engine = &cluster.engines[0];
    engine.faults.stall.store(true, Ordering::SeqCst);
    let body = chat_body("p1", "stalled", false).to_string();
    let mut conn = Conn::open(gw.addr);
    conn.send(
        "POST",
        CHAT,
        &[("content-type", "application/json")],
        body.as_bytes(),
        Upload::Length,
    );
    wait_for("the engine to hold the request", DEADLINE, || {
        (engine.stats.in_flight.load(Ordering::SeqCst) == 1).then_some(())
    });
    let t = Instant::now();
    let next = chat_body("p2", "next", false).to_string();
    conn.send(
        "POST",
        CHAT,
        &[("content-type", "application/json")],
        next.as_bytes(),
        Upload::Length,
    );
    let r = conn.read_response();
    let took = t.elapsed();
    assert_eq!(r.status(), 502, "{}", r.text());
    assert!(r.text().contains("ReadTimedout"), "{}", r.text());
    assert!(
        took < Duration::from_secs(10),
        "cut at the timeout, not hung: {took:?}"
    );
    gw.wait_idle();
    wait_for("the engine to see the gateway hang up", DEADLINE, || {
        (engine.stats.in_flight.load(Ordering::SeqCst) == 0).then_some(())
    });
}

/// An SSE response head with chunked framing, as an engine starts a stream.
const STREAM_HEAD: &[u8] =
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n";

const SSE_FRAME: &[u8] =
    b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"tok \"}}]}\n\n";

/// One SSE frame as one HTTP chunk.
fn frame_chunk() -> Vec<u8> {
    let mut out = format!("{:x}\r\n", SSE_FRAME.len()).into_bytes();
    out.extend_from_slice(SSE_FRAME);
    out.extend_from_slice(b"\r\n");
    out
}

fn write_slowly(s: &mut TcpStream, parts: &[&[u8]]) {
    for part in parts {
        let _ = s.write_all(part);
        let _ = s.flush();
        // The gateway acts on what it has before the rest (or the end) comes.
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn an_engine_answering_garbage_or_resetting_gets_a_502_or_a_cut_stream() {
    enum Expect {
        /// Nothing usable arrived: the client gets the gateway's 502 JSON.
        Json502,
        /// A 200 head went out first: the client's stream is cut.
        CutStream,
        /// A Content-Length body that ends short.
        ShortBody,
    }
    let frame = frame_chunk();
    let frame: &'static [u8] = Box::leak(frame.into_boxed_slice());
    let cases: Vec<(&str, Canned, Expect)> = vec![
        (
            "garbage",
            Canned::raw(|s| {
                write_slowly(s, &[b"SSH-2.0-OpenSSH_9.2\r\nprotocol mismatch\r\n\r\n"])
            }),
            Expect::Json502,
        ),
        (
            "binary",
            Canned::raw(|s| write_slowly(s, &[&[0u8, 159, 146, 150, 255, 13, 10, 13, 10]])),
            Expect::Json502,
        ),
        (
            "reset-mid-head",
            Canned::raw(|s| {
                write_slowly(s, &[b"HTTP/1.1 200 OK\r\nContent-Type: text/ev"]);
                canned::reset_on_close(s);
            }),
            Expect::Json502,
        ),
        (
            "close-mid-head",
            Canned::raw(|s| write_slowly(s, &[b"HTTP/1.1 200 OK\r\nContent-Type: text/ev"])),
            Expect::Json502,
        ),
        ("close-before-head", Canned::raw(|_| {}), Expect::Json502),
        (
            "bad-chunk",
            Canned::raw(move |s| write_slowly(s, &[STREAM_HEAD, frame, b"zz\r\nnot a chunk\r\n"])),
            Expect::CutStream,
        ),
        (
            "reset-mid-body",
            Canned::raw(move |s| {
                write_slowly(s, &[STREAM_HEAD, frame]);
                canned::reset_on_close(s);
            }),
            Expect::CutStream,
        ),
        (
            "close-mid-body",
            Canned::raw(move |s| write_slowly(s, &[STREAM_HEAD, frame])),
            Expect::CutStream,
        ),
        (
            "short-body",
            Canned::raw(|s| {
                write_slowly(
                    s,
                    &[b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"id\":"],
                )
            }),
            Expect::ShortBody,
        ),
    ];
    // Control: a well-formed stream from the same kind of stand-in ends cleanly.
    let good = Canned::start(
        "text/event-stream",
        vec![SSE_FRAME.to_vec(), b"data: [DONE]\n\n".to_vec()],
        true,
    );
    let mut routes: Vec<(&str, String)> = cases
        .iter()
        .map(|(name, canned, _)| (*name, canned::canned_route(canned.port(), "")))
        .collect();
    routes.push(("good", canned::canned_route(good.port(), "")));
    let gw = Gateway::start(&routes);

    let (mut conn, head) = open_stream(gw.addr, "/good/v1/chat/completions", "g", &[]);
    assert_eq!(head.status, 200);
    assert_eq!(
        finish(&mut conn).1,
        End::Done,
        "control: a good stream ends"
    );

    for (name, _, expect) in &cases {
        let path = format!("/{name}/v1/chat/completions");
        let (mut conn, head) = open_stream(gw.addr, &path, name, &[]);
        match expect {
            Expect::Json502 => {
                let body = conn.read_body(&head).expect("the 502's body");
                let r = http::Response { head, body };
                assert_eq!(r.status(), 502, "{name}: {}", r.text());
                assert_eq!(r.json()["error"]["type"], "upstream_error", "{name}");
                assert_eq!(r.header("content-type"), Some("application/json"), "{name}");
            }
            Expect::CutStream => {
                assert_eq!(head.status, 200, "{name}");
                let (bytes, end) = finish(&mut conn);
                assert!(bytes > 0, "{name}: the frame before the fault arrives");
                assert_eq!(end, End::Cut, "{name}: cut, never a clean end");
            }
            Expect::ShortBody => {
                assert_eq!(head.status, 200, "{name}");
                assert!(
                    conn.read_body(&head).is_err(),
                    "{name}: a short body must not arrive as a complete one"
                );
            }
        }
        gw.wait_idle();
    }
}

/// Requests alive in the gateway, per `/healthz`: a request leaves the
/// count only once Pingora is done with it, its own log lines included
/// (the in-flight gauge falls earlier, when the slot goes back).
fn active(gw: &Gateway) -> u64 {
    let r = http::get(gw.admin, "/healthz");
    r.json()["in_flight"]
        .as_u64()
        .unwrap_or_else(|| panic!("{}", r.text()))
}

/// The log lines that name a request of `route` (the gateway's lines and
/// Pingora's, whose request summary names the route too).
fn lines_of(log: &str, route: &str) -> Vec<String> {
    let needle = format!("route {route} ");
    log.lines()
        .filter(|l| l.contains(&needle))
        .map(str::to_string)
        .collect()
}

/// A stream the engine cuts after its head (the connection closes after one
/// frame) is one line in the log, the gateway's: the peer, the status and
/// the body bytes the client got, and that the stream had no end; not
/// Pingora's `status: 502`, which no client received. Control: an engine
/// that closes before any byte still gets its 502, and Pingora's line for
/// it stays.
#[test]
fn a_stream_cut_after_its_head_is_one_gateway_line_not_a_502() {
    let frame = frame_chunk();
    let frame: &'static [u8] = Box::leak(frame.into_boxed_slice());
    let cuts = Canned::raw(move |s| write_slowly(s, &[STREAM_HEAD, frame]));
    let refuses = Canned::raw(|_| {});
    let gw = Gateway::start(&[
        ("midcut", canned::canned_route(cuts.port(), "")),
        ("refused", canned::canned_route(refuses.port(), "")),
    ]);

    let (mut conn, head) = open_stream(gw.addr, "/midcut/v1/chat/completions", "c", &[]);
    assert_eq!(head.status, 200);
    let (bytes, end) = finish(&mut conn);
    assert_eq!(end, End::Cut, "the client saw the stream cut");
    assert_eq!(bytes, SSE_FRAME.len(), "the frame before the cut arrived");

    let (mut conn, head) = open_stream(gw.addr, "/refused/v1/chat/completions", "r", &[]);
    let body = conn.read_body(&head).expect("the 502's body");
    let r = http::Response { head, body };
    assert_eq!(r.status(), 502, "{}", r.text());

    wait_for("both requests to be done with", DEADLINE, || {
        (active(&gw) == 0).then_some(())
    });
    let log = gw.log();
    let cut = lines_of(&log, "midcut");
    assert_eq!(cut.len(), 1, "one line for the cut stream:\n{log}");
    let line = &cut[0];
    assert!(
        line.contains(" WARN ")
            && line.contains("route midcut peer canned: stream cut after its head")
            && line.contains(&format!("got status 200 and {bytes} body byte(s)"))
            && line.contains("no end of the stream")
            && line.contains("(peer marked not ready)"),
        "the gateway's line says what happened: {line}"
    );
    assert!(!line.contains("status: 502"), "{line}");
    // Control: the suppression is the cut stream's only. The 502 a client
    // did receive keeps Pingora's line beside the gateway's.
    let refused = lines_of(&log, "refused");
    assert!(
        refused
            .iter()
            .any(|l| l.contains("Fail to proxy") && l.contains("status: 502")),
        "Pingora's line for a real 502:\n{log}"
    );
    assert!(
        refused.iter().any(|l| l.contains("proxying failed")),
        "the gateway's line for it:\n{log}"
    );
}

/// A stand-in engine that streams `frames` SSE frames of `frame_size` bytes
/// as fast as the gateway takes them, counting the bytes it got written.
fn firehose(frames: usize, frame_size: usize) -> (Canned, Arc<AtomicU64>) {
    let written = Arc::new(AtomicU64::new(0));
    let count = Arc::clone(&written);
    let canned = Canned::raw(move |s| {
        let mut frame = b"data: ".to_vec();
        frame.resize(frame_size - 2, b'x');
        frame.extend_from_slice(b"\n\n");
        let mut chunk = format!("{:x}\r\n", frame.len()).into_bytes();
        chunk.extend_from_slice(&frame);
        chunk.extend_from_slice(b"\r\n");
        if s.write_all(STREAM_HEAD).is_err() {
            return;
        }
        for _ in 0..frames {
            if s.write_all(&chunk).is_err() {
                return;
            }
            count.fetch_add(chunk.len() as u64, Ordering::SeqCst);
        }
        let done = b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n";
        let _ = s.write_all(done);
    });
    (canned, written)
}

#[test]
fn a_client_that_stops_reading_holds_the_engine_back_not_the_gateways_memory() {
    const FRAMES: usize = 4096;
    const FRAME: usize = 64 * 1024;
    const TOTAL: u64 = (FRAMES * FRAME) as u64; // 256 MiB
    let (engine, written) = firehose(FRAMES, FRAME);
    let gw = Gateway::start(&[("chat", canned::canned_route(engine.port(), ""))]);
    // Warm up the allocator and the upstream pool with a small request.
    let r = http::get(gw.addr, "/chat/_health_status");
    assert_eq!(r.status(), 200);
    let rss_before = gw.rss_kib();

    let (stuck, head) = open_stream(gw.addr, CHAT, "stuck", &[]);
    assert_eq!(head.status, 200);
    // Reads nothing more. The engine writes until every buffer on the way is
    // full, then stops: wait for its count to stand still.
    let mut last = (0, Instant::now());
    wait_for("the engine to be held back", DEADLINE, || {
        let now = written.load(Ordering::SeqCst);
        if now != last.0 {
            last = (now, Instant::now());
            return None;
        }
        (now > 0 && last.1.elapsed() > Duration::from_millis(500)).then_some(())
    });
    let held = written.load(Ordering::SeqCst);
    let grown_kib = gw.rss_kib().saturating_sub(rss_before);
    assert!(
        held < TOTAL / 4,
        "backpressure reached the engine: it wrote {held} of {TOTAL} bytes"
    );
    assert!(
        grown_kib < 32 * 1024,
        "the gateway buffers at most a few chunks, not the stream: RSS grew {grown_kib} KiB while the engine wrote {held} bytes"
    );
    assert_eq!(gw.in_flight_total(), 1.0);

    // Control: a client that reads gets all of it, through the same gateway.
    let (mut reader, head) = open_stream(gw.addr, CHAT, "reader", &[]);
    assert_eq!(head.status, 200);
    let (bytes, end) = finish(&mut reader);
    assert_eq!(end, End::Done);
    assert!(bytes as u64 > TOTAL, "received {bytes} of {TOTAL}");

    drop(stuck);
    gw.wait_idle();
}

#[test]
fn running_out_of_file_descriptors_is_logged_and_survived() {
    let cluster = engines(1);
    // Probes far apart and long bans: a ban seen here would stay, so the
    // gateway's own shortage must not be taken for the engine's failure.
    let extra = "health:\n  interval: 1h\n  ban_ttl: 1h\nengine_metrics: false\n";
    let mut gw = Gateway::start(&[("chat", route_yaml(&ports(&cluster), extra))]);
    let ask = |gw: &Gateway| http::post_json(gw.addr, CHAT, &[], &chat_body("s", "x", false));
    assert_eq!(ask(&gw).status(), 200, "control: served before the limit");

    // A limit a few descriptors above what the gateway holds now.
    let limit = gw.open_fds() + 8;
    let ok = std::process::Command::new("prlimit")
        .args([
            "--pid",
            &gw.pid().to_string(),
            &format!("--nofile={limit}:{limit}"),
        ])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(ok, "prlimit --pid failed");

    // Many clients at once, each with a request the gateway must proxy:
    // accepted connections and upstream sockets both need descriptors.
    let clients: Vec<Conn> = (0..40)
        .map(|i| {
            let mut c = Conn::open(gw.addr);
            let body = chat_body(&format!("fd-{i}"), "x", false).to_string();
            c.send(
                "POST",
                CHAT,
                &[
                    ("content-type", "application/json"),
                    ("x-sim-frame-delay-ms", "50"),
                ],
                body.as_bytes(),
                Upload::Length,
            );
            c
        })
        .collect();
    wait_for("the shortage in the log", DEADLINE, || {
        gw.log().contains("Too many open files").then_some(())
    });
    assert!(gw.is_alive(), "still running:\n{}", gw.log());
    // What the clients got meanwhile: a 200, or the gateway's 503 saying it
    // is short of descriptors; never a 502 blaming the engine. (A client
    // still waiting in the listen backlog gets nothing yet.)
    let answers: Vec<Option<(u16, String)>> = std::thread::scope(|s| {
        let readers: Vec<_> = clients
            .into_iter()
            .map(|mut c| {
                s.spawn(move || {
                    c.set_read_timeout(Duration::from_secs(3));
                    let head = c.try_read_head().ok()?;
                    let body = c.read_body(&head).unwrap_or_default();
                    Some((head.status, String::from_utf8_lossy(&body).into_owned()))
                })
            })
            .collect();
        readers.into_iter().map(|r| r.join().unwrap()).collect()
    });
    let mut short = 0;
    for (status, body) in answers.iter().flatten() {
        match status {
            200 => {}
            503 if body.contains("gateway_overloaded") && body.contains("file descriptors") => {
                short += 1
            }
            _ => panic!("{status} {body}"),
        }
    }
    assert!(
        short > 0,
        "the shortage reached the request path: {answers:?}"
    );

    // Serves again once the connections are gone.
    let start = Instant::now();
    let mut last = ask(&gw);
    while last.status() != 200 && start.elapsed() < DEADLINE {
        std::thread::sleep(Duration::from_millis(100));
        last = ask(&gw);
    }
    assert_eq!(
        last.status(),
        200,
        "serves again: {}\n{}",
        last.text(),
        gw.log()
    );
    assert!(
        ready(&gw, "chat", "e0"),
        "the engine was not banned for the gateway's shortage"
    );
    gw.wait_idle();
    let log = gw.log();
    assert!(!log.contains("panicked"), "{log}");
    assert!(gw.is_alive());
}

/// An engine that closes every connection after one response, though it
/// announced keep-alive, costs no request: the one sent on a pooled
/// connection the engine had closed, before any byte of an answer, goes
/// again on a fresh connection to the same engine, POSTs included.
#[test]
fn an_engine_closing_its_kept_alive_connections_loses_no_request() {
    let engine = Canned::one_answer_per_connection(|s| {
        let frames: [&[u8]; 2] = [
            br#"data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}"#,
            b"data: [DONE]",
        ];
        let mut out = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\
Transfer-Encoding: chunked\r\nKeep-Alive: timeout=5, max=100\r\n\r\n"
            .to_vec();
        for frame in frames {
            let data = [frame, b"\n\n"].concat();
            out.extend_from_slice(format!("{:x}\r\n", data.len()).as_bytes());
            out.extend_from_slice(&data);
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"0\r\n\r\n");
        let _ = s.write_all(&out);
    });
    let gw = Gateway::start(&[("chat", canned::canned_route(engine.port(), ""))]);
    let requests = 6;
    for i in 0..requests {
        let resp = http::post_json(
            gw.addr,
            CHAT,
            &[],
            &chat_body("s", &format!("turn {i}"), true),
        );
        assert_eq!(resp.status(), 200, "request {i}: {}", resp.text());
        assert!(
            resp.text().contains("[DONE]"),
            "request {i}: {}",
            resp.text()
        );
    }
    // The control: the engine did close pooled connections under the
    // gateway, so some requests reached it twice.
    let received = engine.received.lock().len();
    assert!(received > requests, "{received} requests received");
}
