//! Reloads under load. Clients stream through the gateway without
//! pause while the route file is rewritten and reloaded over and over, by
//! SIGHUP and by the file watch in turn, with a broken file now and then.
//! Every stream must end with `data: [DONE]`, no request may fail, the PID
//! stays the same and nothing is left in flight.
//!
//! The default test runs 30 s; the full run (2 minutes, at least 100
//! reloads) is `--ignored`: `bash benches/reload_under_load.sh`.

mod common;

use common::http::{Conn, Upload};
use common::*;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const CLIENTS: usize = 8;

#[derive(Default)]
struct Tally {
    completed: AtomicU64,
    failed: AtomicU64,
    truncated: AtomicU64,
    /// The first few failures, for the assertion message.
    notes: Mutex<Vec<String>>,
}

impl Tally {
    fn note(&self, what: String) {
        let mut notes = self.notes.lock();
        if notes.len() < 5 {
            notes.push(what);
        }
    }
}

/// One streamed request, read to its end.
fn stream_once(gw_addr: std::net::SocketAddr, client: usize, tally: &Tally) {
    let mut conn = Conn::open(gw_addr);
    let body = serde_json::json!({
        "model": "sim-model", "stream": true, "max_tokens": 24,
        "messages": [{"role": "user", "content": format!("client {client} keeps talking")}],
    });
    let session = format!("load-{client}");
    conn.send(
        "POST",
        "/chat/v1/chat/completions",
        &[
            ("content-type", "application/json"),
            ("x-session-id", &session),
        ],
        body.to_string().as_bytes(),
        Upload::Length,
    );
    let head = match conn.try_read_head() {
        Ok(h) => h,
        Err(e) => {
            tally.failed.fetch_add(1, Ordering::Relaxed);
            tally.note(format!("client {client}: no response head: {e}"));
            return;
        }
    };
    if head.status != 200 {
        tally.failed.fetch_add(1, Ordering::Relaxed);
        tally.note(format!("client {client}: status {}", head.status));
        return;
    }
    let mut text = Vec::new();
    loop {
        match conn.read_chunk() {
            Ok(Some(chunk)) => text.extend_from_slice(&chunk),
            Ok(None) => break,
            Err(e) => {
                tally.truncated.fetch_add(1, Ordering::Relaxed);
                tally.note(format!("client {client}: stream cut: {e}"));
                return;
            }
        }
    }
    if String::from_utf8_lossy(&text).contains("data: [DONE]") {
        tally.completed.fetch_add(1, Ordering::Relaxed);
    } else {
        tally.truncated.fetch_add(1, Ordering::Relaxed);
        tally.note(format!("client {client}: ended without [DONE]"));
    }
}

/// The route versions the reloader cycles through: both engines, one of
/// them only (streams on the other finish where they started), both again
/// with other limits.
fn version(i: usize, ports: &[u16]) -> String {
    let (e0, e1) = (ports[0], ports[1]);
    match i % 3 {
        0 => format!(
            "peers:\n  - {{name: e0, host: 127.0.0.1, port: {e0}, max_concurrency: 64}}\n  - {{name: e1, host: 127.0.0.1, port: {e1}, max_concurrency: 64}}\n"
        ),
        1 => format!("peers:\n  - {{name: e1, host: 127.0.0.1, port: {e1}, max_concurrency: 64}}\n"),
        _ => format!(
            "peers:\n  - {{name: e0, host: 127.0.0.1, port: {e0}, max_concurrency: 100}}\n  - {{name: e1, host: 127.0.0.1, port: {e1}, max_concurrency: 90}}\nhealth:\n  interval: 3s\n"
        ),
    }
}

/// Truncated mid-item: what a reader sees of a file caught half written.
const BROKEN: &str = "peers:\n  - {name: e0, host: 127.0.0.1, po";

struct Figures {
    secs: f64,
    by_signal: f64,
    by_watch: f64,
    errors: f64,
    broken_written: u64,
    completed: u64,
    failed: u64,
    truncated: u64,
}

fn run(span: Duration) -> Figures {
    let cluster = spawn_engines(
        2,
        0,
        EngineConfig {
            decode_ms_per_token: 10,
            max_running: 16,
            ..EngineConfig::default()
        },
    )
    .expect("simulated engines");
    let ports = ports(&cluster);
    let gw = Gateway::start_with(
        &[("chat", version(0, &ports))],
        GatewayOptions {
            watch: Some(true),
            ..Default::default()
        },
    );
    let pid = gw.pid();
    let tally = Arc::new(Tally::default());
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|client| {
            let (tally, stop, addr) = (Arc::clone(&tally), Arc::clone(&stop), gw.addr);
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    stream_once(addr, client, &tally);
                }
            })
        })
        .collect();

    let started = Instant::now();
    let (signal0, watch0) = (
        gw.reloads(&["trigger=\"signal\""]),
        gw.reloads(&["trigger=\"watch\""]),
    );
    let mut broken_written = 0;
    let mut i = 0;
    while started.elapsed() < span {
        i += 1;
        if i % 10 == 5 {
            // Control in the middle: a broken file is reported and the
            // previous version keeps serving.
            let errors = gw.reloads(&["result=\"error\""]);
            gw.write_route("chat", BROKEN);
            broken_written += 1;
            wait_for("the broken file to be reported", DEADLINE, || {
                (gw.reloads(&["result=\"error\""]) > errors).then_some(())
            });
            let r = http::post_json(
                gw.addr,
                "/chat/v1/chat/completions",
                &[],
                &chat_body("probe", "still there?", false),
            );
            assert_eq!(r.status(), 200, "the previous version serves");
            continue;
        }
        let body = version(i, &ports);
        if i % 2 == 0 {
            // In place, then SIGHUP at once (the watch will echo it later).
            let before = gw.reloads(&["trigger=\"signal\""]);
            gw.write_route("chat", &body);
            gw.signal("HUP");
            wait_for("the SIGHUP reload", DEADLINE, || {
                (gw.reloads(&["trigger=\"signal\""]) > before).then_some(())
            });
        } else {
            // Replaced by rename, and left to the watch.
            let before = gw.reloads(&["trigger=\"watch\""]);
            let tmp = gw.routes_dir.join(".chat.yaml.new");
            std::fs::write(&tmp, &body).expect("write");
            std::fs::rename(&tmp, gw.routes_dir.join("chat.yaml")).expect("rename");
            wait_for("the watch reload", DEADLINE, || {
                (gw.reloads(&["trigger=\"watch\""]) > before).then_some(())
            });
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // The file ends valid, so the last word is a good version.
    gw.write_route("chat", &version(0, &ports));
    gw.reload();
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.join().expect("client thread");
    }
    gw.wait_idle();
    assert_eq!(gw.pid(), pid, "same process throughout");
    assert!(
        gw.log()
            .contains("route file rejected, previous version kept"),
        "broken files reported"
    );
    let figures = Figures {
        secs: started.elapsed().as_secs_f64(),
        by_signal: gw.reloads(&["trigger=\"signal\""]) - signal0,
        by_watch: gw.reloads(&["trigger=\"watch\""]) - watch0,
        errors: gw.reloads(&["result=\"error\""]),
        broken_written,
        completed: tally.completed.load(Ordering::Relaxed),
        failed: tally.failed.load(Ordering::Relaxed),
        truncated: tally.truncated.load(Ordering::Relaxed),
    };
    eprintln!(
        "reload under load: {:.1} s, reloads by SIGHUP {}, by watch {}, with an error {} ({} broken writes); streams completed {}, failed {}, truncated {}; pid {pid} unchanged; in flight at the end {}",
        figures.secs,
        figures.by_signal,
        figures.by_watch,
        figures.errors,
        figures.broken_written,
        figures.completed,
        figures.failed,
        figures.truncated,
        gw.in_flight_total()
    );
    let notes = tally.notes.lock().join("\n");
    assert_eq!(figures.failed, 0, "failed requests:\n{notes}");
    assert_eq!(figures.truncated, 0, "truncated streams:\n{notes}");
    assert!(figures.errors >= figures.broken_written as f64);
    figures
}

#[test]
fn streams_survive_reloads_by_signal_and_watch() {
    let f = run(Duration::from_secs(30));
    assert!(
        f.by_signal >= 10.0 && f.by_watch >= 10.0,
        "reloads of both kinds"
    );
    assert!(f.completed >= 100, "streams kept flowing: {}", f.completed);
}

#[test]
#[ignore = "two minutes; run by benches/reload_under_load.sh"]
fn streams_survive_reloads_full_two_minutes() {
    let f = run(Duration::from_secs(120));
    assert!(f.by_signal + f.by_watch >= 100.0, "at least 100 reloads");
    assert!(f.by_signal >= 30.0 && f.by_watch >= 30.0);
}
