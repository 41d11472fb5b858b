//! The live dashboard on the admin listener, rendered in a
//! real headless browser (Debian's `chromium`) against the gateway on
//! simulated engines, and its JSON read directly.
//!
//! Without `chromium` the browser test is skipped with a loud message, but
//! only outside CI: with `CI` set (as `.ci/run` runs, after `./dev test`
//! installed it) a missing browser is a failure, never a silent pass.

mod common;

use common::http;
use common::*;
use serde_json::{json, Value};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const CHAT: &str = "/chat/v1/chat/completions";
const WIDTH: u32 = 1400;
const HEIGHT: u32 = 1000;

/// The `chromium` on PATH, or None (then: skip outside CI, fail in CI).
fn chromium() -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join("chromium"))
            .find(|p| p.is_file())
    });
    if found.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI is set but `chromium` is not on PATH: `./dev test` installs it (apt-get install chromium)"
        );
        eprintln!(
            "\n!!!!! SKIPPED: the dashboard browser test needs Debian's `chromium` \
             (apt-get install chromium, or run ./dev test). It FAILS under CI. !!!!!\n"
        );
    }
    found
}

/// One headless run against `url` with `mode` (`--dump-dom` or
/// `--screenshot=…`), its own profile directory, killed after a deadline.
fn run_chromium(bin: &Path, mode: &str, url: &str) -> Vec<u8> {
    let profile = tempfile::tempdir().expect("profile dir");
    let mut child = Command::new(bin)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--no-first-run",
            "--hide-scrollbars",
            &format!("--window-size={WIDTH},{HEIGHT}"),
            // Virtual time runs the page's fetch and its first re-polls
            // before the DOM is dumped or the picture taken.
            "--virtual-time-budget=4000",
            &format!("--user-data-dir={}", profile.path().display()),
            mode,
            url,
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start chromium");
    let mut stdout = child.stdout.take().expect("stdout");
    let reader = std::thread::spawn(move || {
        let mut out = Vec::new();
        let _ = stdout.read_to_end(&mut out);
        out
    });
    let start = Instant::now();
    let status = loop {
        if let Ok(Some(status)) = child.try_wait() {
            break status;
        }
        if start.elapsed() > Duration::from_secs(90) {
            let _ = child.kill();
            panic!("chromium {mode} did not finish in 90 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let out = reader.join().expect("stdout reader");
    assert!(status.success(), "chromium {mode} failed: {status}");
    out
}

fn dump_dom(bin: &Path, url: &str) -> String {
    String::from_utf8_lossy(&run_chromium(bin, "--dump-dom", url)).into_owned()
}

fn screenshot(bin: &Path, url: &str, file: &Path) -> Png {
    let _ = std::fs::remove_file(file);
    run_chromium(bin, &format!("--screenshot={}", file.display()), url);
    let bytes = std::fs::read(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    Png::decode(&bytes)
}

/// An 8-bit RGB(A), non-interlaced PNG as chromium writes it, decoded to
/// pixels (so two pictures are compared by what they show, not by bytes).
struct Png {
    width: u32,
    height: u32,
    channels: usize,
    pixels: Vec<u8>,
    file_len: usize,
}

impl Png {
    fn decode(bytes: &[u8]) -> Png {
        assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
        let (mut pos, mut idat) = (8, Vec::new());
        let (mut width, mut height, mut channels) = (0, 0, 0);
        while pos + 8 <= bytes.len() {
            let len = u32::from_be_bytes(bytes[pos..pos + 4].try_into().expect("len")) as usize;
            let kind = &bytes[pos + 4..pos + 8];
            let data = &bytes[pos + 8..pos + 8 + len];
            match kind {
                b"IHDR" => {
                    width = u32::from_be_bytes(data[0..4].try_into().expect("w"));
                    height = u32::from_be_bytes(data[4..8].try_into().expect("h"));
                    assert_eq!(data[8], 8, "8-bit samples");
                    assert_eq!(data[12], 0, "not interlaced");
                    channels = match data[9] {
                        2 => 3,
                        6 => 4,
                        other => panic!("colour type {other}"),
                    };
                }
                b"IDAT" => idat.extend_from_slice(data),
                _ => {}
            }
            pos += 12 + len;
        }
        let mut raw = Vec::new();
        flate2::read::ZlibDecoder::new(&idat[..])
            .read_to_end(&mut raw)
            .expect("inflate");
        let stride = width as usize * channels;
        assert_eq!(raw.len(), (stride + 1) * height as usize, "scanlines");
        let mut pixels = vec![0u8; stride * height as usize];
        for row in 0..height as usize {
            let filter = raw[row * (stride + 1)];
            let line = &raw[row * (stride + 1) + 1..(row + 1) * (stride + 1)];
            for i in 0..stride {
                let a = if i >= channels {
                    pixels[row * stride + i - channels]
                } else {
                    0
                };
                let b = if row > 0 {
                    pixels[(row - 1) * stride + i]
                } else {
                    0
                };
                let c = if row > 0 && i >= channels {
                    pixels[(row - 1) * stride + i - channels]
                } else {
                    0
                };
                let predicted = match filter {
                    0 => 0,
                    1 => a,
                    2 => b,
                    3 => ((u16::from(a) + u16::from(b)) / 2) as u8,
                    4 => paeth(a, b, c),
                    other => panic!("filter {other}"),
                };
                pixels[row * stride + i] = line[i].wrapping_add(predicted);
            }
        }
        Png {
            width,
            height,
            channels,
            pixels,
            file_len: bytes.len(),
        }
    }

    fn pixel(&self, i: usize) -> &[u8] {
        &self.pixels[i * self.channels..i * self.channels + 3]
    }

    fn colours(&self) -> usize {
        let n = (self.width * self.height) as usize;
        let mut seen: std::collections::HashSet<&[u8]> = Default::default();
        (0..n).step_by(7).for_each(|i| {
            seen.insert(self.pixel(i));
        });
        seen.len()
    }

    /// The share of pixels whose colour differs between two pictures.
    fn differs_from(&self, other: &Png) -> f64 {
        assert_eq!((self.width, self.height), (other.width, other.height));
        let n = (self.width * self.height) as usize;
        let changed = (0..n).filter(|&i| self.pixel(i) != other.pixel(i)).count();
        changed as f64 / n as f64
    }
}

fn paeth(a: u8, b: u8, c: u8) -> u8 {
    let p = i16::from(a) + i16::from(b) - i16::from(c);
    let (pa, pb, pc) = (
        (p - i16::from(a)).abs(),
        (p - i16::from(b)).abs(),
        (p - i16::from(c)).abs(),
    );
    if pa <= pb && pa <= pc {
        a
    } else if pb <= pc {
        b
    } else {
        c
    }
}

fn dashboard(gw: &Gateway) -> Value {
    let r = http::get(gw.admin, "/dashboard.json");
    assert_eq!(r.status(), 200, "{}", r.text());
    r.json()
}

fn route<'a>(d: &'a Value, name: &str) -> &'a Value {
    d["routes"]
        .as_array()
        .and_then(|rs| rs.iter().find(|r| r["name"] == name))
        .unwrap_or_else(|| panic!("route {name} not in the dashboard: {d}"))
}

/// 50 peers on ports nothing listens on: they show as not ready.
fn fleet_route() -> String {
    // Held together while chosen, so no two peers share a port (a
    // duplicate address would reject the whole route).
    let held: Vec<std::net::TcpListener> = (0..50)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("a port"))
        .collect();
    let mut s = String::from("peers:\n");
    for (i, l) in held.iter().enumerate() {
        let port = l.local_addr().expect("port").port();
        s.push_str(&format!(
            "  - {{name: f{i:02}, host: 127.0.0.1, port: {port}}}\n"
        ));
    }
    s.push_str("health: {interval: 200ms, ban_ttl: 60s}\n");
    s
}

/// Streams over `sessions` sessions of two turns each (new, then sticky),
/// in parallel, each long enough for a TTFT and a decode-rate sample.
fn traffic(gw: &Gateway, sessions: usize) {
    std::thread::scope(|s| {
        for n in 0..sessions {
            s.spawn(move || {
                for turn in 0..2 {
                    let body = json!({"model": "sim-model", "stream": true,
                        "messages": [{"role": "user", "content": format!("session {n} turn {turn} {}", "words ".repeat(40))}],
                        "metadata": {"session_id": format!("dash-{n}")}});
                    let r = http::post_json(
                        gw.addr,
                        CHAT,
                        &[("x-sim-max-tokens", "20"), ("x-sim-frame-delay-ms", "30")],
                        &body,
                    );
                    assert_eq!(r.status(), 200, "{}", r.text());
                }
            });
        }
    });
}

fn count(dom: &str, needle: &str) -> usize {
    dom.matches(needle).count()
}

#[test]
fn the_dashboard_renders_peers_and_charts_in_a_browser_and_follows_traffic() {
    let Some(bin) = chromium() else {
        return;
    };
    let cluster = engines(3);
    let chat = route_yaml(&ports(&cluster), "include_usage: true\n");
    let gw = Gateway::start(&[("chat", chat), ("fleet", fleet_route())]);
    let url = format!("http://{}/dashboard", gw.admin);
    // The fleet's peers are probed down, and both routes have a first point.
    wait_for("the fleet banned and a first sample", DEADLINE, || {
        let d = dashboard(&gw);
        if d["routes"].as_array().map(Vec::len) != Some(2) {
            panic!("{}", gw.log());
        }
        let fleet = route(&d, "fleet");
        (fleet["peers_ready"] == 0
            && fleet["peers_total"] == 50
            && !route(&d, "chat")["history"]["t_ms"].as_array()?.is_empty())
        .then_some(())
    });

    let shots = tempfile::tempdir().expect("shots dir");
    let before_dom = dump_dom(&bin, &url);
    let before = screenshot(&bin, &url, &shots.path().join("before.png"));

    // Rendered by the page's script, not the served HTML: the peer rows,
    // 50 of them not ready, and seven charts per route.
    for peer in ["e0", "e1", "e2", "f00", "f25", "f49"] {
        assert!(
            before_dom.contains(&format!("data-peer=\"{peer}\"")),
            "peer {peer} rendered"
        );
    }
    assert_eq!(
        count(&before_dom, "class=\"peer down\""),
        50,
        "the fleet is down"
    );
    // Each chart once per route, as drawn (the script names them only as
    // `chart("id", …)`, never as the attribute).
    for id in [
        "in_flight",
        "requests",
        "placements",
        "refusals",
        "ttft",
        "tps",
        "hit_rate",
    ] {
        let drawn = count(
            &before_dom,
            &format!("<figure data-chart=\"{id}\"><figcaption>"),
        );
        assert_eq!(drawn, 2, "chart {id} for both routes");
    }
    assert_eq!(
        count(&before_dom, "<svg class=\"chart\" viewBox=\"0 0 200 84\""),
        14
    );
    assert!(
        before_dom.contains("data-series=\"in flight\""),
        "a drawn series"
    );
    assert!(
        !HTML_SOURCE_MARKERS.iter().any(|m| before_dom.contains(m)),
        "the DOM is the page's output, not its still-waiting shell"
    );
    // Control for what traffic will change: nothing placed, nothing in flight.
    assert!(!before_dom.contains("data-placement=\"new/none\""));
    assert!(before_dom.contains("in flight <b>0/192</b>"), "idle chat");

    traffic(&gw, 6);
    let held: Vec<_> = (0..2)
        .map(|_| hold_stream(&gw, CHAT, "dash", &[]))
        .collect();
    wait_for("a sample with the traffic in it", DEADLINE, || {
        let d = dashboard(&gw);
        let chat = route(&d, "chat");
        let placed: u64 = chat["placements_window"]
            .as_array()?
            .iter()
            .filter_map(|p| p["count"].as_u64())
            .sum();
        let in_flight = chat["history"]["in_flight"].as_array()?.last()?.as_f64()?;
        (placed >= 14 && in_flight == 2.0).then_some(())
    });
    let after_dom = dump_dom(&bin, &url);
    let after = screenshot(&bin, &url, &shots.path().join("after.png"));
    cluster.engines.iter().for_each(|e| e.open_gate("dash"));
    drop(held);

    assert!(
        after_dom.contains("data-placement=\"new/none\""),
        "new sessions placed"
    );
    assert!(
        after_dom.contains("data-placement=\"sticky/none\""),
        "second turns stuck"
    );
    assert!(
        after_dom.contains("in flight <b>2/192</b>"),
        "the held streams"
    );
    assert!(
        after_dom.contains("data-series=\"new\""),
        "a placements series drawn"
    );

    for shot in [&before, &after] {
        assert_eq!((shot.width, shot.height), (WIDTH, HEIGHT));
        assert!(
            shot.file_len > 20_000,
            "a real picture: {} bytes",
            shot.file_len
        );
        assert!(
            shot.colours() > 50,
            "not a blank page: {} colours",
            shot.colours()
        );
    }
    // More than a clock's worth of pixels changed: bars, rows and charts.
    let changed = after.differs_from(&before);
    eprintln!(
        "{:.2}% of the picture changed with traffic",
        changed * 100.0
    );
    // DASHBOARD_SHOTS=dir keeps both pictures, to look at them.
    if let Some(dir) = std::env::var_os("DASHBOARD_SHOTS") {
        for name in ["before.png", "after.png"] {
            let _ = std::fs::copy(shots.path().join(name), Path::new(&dir).join(name));
        }
    }
    assert!(
        changed > 0.01,
        "only {:.3}% of the picture changed",
        changed * 100.0
    );
    assert_eq!(
        before.differs_from(&before),
        0.0,
        "control: a picture equals itself"
    );
}

/// Text only the served shell has before its script has run.
const HTML_SOURCE_MARKERS: &[&str] = &["waiting for /dashboard.json"];

#[test]
fn the_dashboard_json_has_every_peer_gate_and_series_but_no_session_id() {
    let cluster = engines(1);
    let one_slot = format!(
        "peers:\n  - {{name: solo, host: 127.0.0.1, port: {}, max_concurrency: 1}}\ninclude_usage: true\n\
         balancing:\n  session_affinity: {{content: off}}\n",
        cluster.engines[0].port()
    );
    let gw = Gateway::start(&[("chat", one_slot)]);
    // Traffic after the first point, so the next one has all its deltas.
    wait_for("a first sample", DEADLINE, || {
        (!route(&dashboard(&gw), "chat")["history"]["t_ms"]
            .as_array()?
            .is_empty())
        .then_some(())
    });
    let secret = "raw-session-id-never-shown";
    let body = json!({"model": "sim-model", "stream": true,
        "messages": [{"role": "user", "content": "hello there"}],
        "metadata": {"session_id": secret}});
    for _ in 0..2 {
        let r = http::post_json(gw.addr, CHAT, &[], &body);
        assert_eq!(r.status(), 200);
        // The only slot goes back in `logging`, just after the client has
        // its answer: wait for it, or the next request can find it taken.
        gw.wait_idle();
    }
    // The only slot held: the next request is a concurrency 429.
    let held = hold_stream(&gw, CHAT, "json", &[]);
    // Content recognition is off on this route, so this one has no session.
    let no_session = json!({"model": "sim-model", "messages": [{"role": "user", "content": "hi"}]});
    let refused = http::post_json(gw.addr, CHAT, &[], &no_session);
    assert_eq!(refused.status(), 429);

    let d = wait_for("the refusal and the tokens in a sample", DEADLINE, || {
        let d = dashboard(&gw);
        let h = &route(&d, "chat")["history"];
        let refused = h["refusals_per_s"]["concurrency"].as_array()?;
        let hit = h["hit_rate"].as_array()?;
        (refused.iter().any(|v| v.as_f64() > Some(0.0)) && hit.iter().any(|v| v.is_number()))
            .then_some(d)
    });
    let chat = route(&d, "chat");
    assert_eq!(chat["refusals"]["by_gate"]["concurrency"], 1, "{chat}");
    assert_eq!(chat["sessions"], 1, "the session was seen");
    let peer = &chat["peers"][0];
    assert_eq!(peer["name"], "solo");
    assert_eq!(peer["ready"], true);
    assert_eq!(peer["in_flight"], 1, "{peer}");
    assert_eq!(peer["max_concurrency"], 1);
    assert_eq!(peer["sessions"], 1);
    assert!(
        peer["engine"]["kv_usage"].is_number(),
        "engine scraped: {peer}"
    );
    assert!(peer["engine"]["age_ms"].is_u64(), "with its age: {peer}");
    let pool = &chat["pools"][0];
    assert_eq!(pool["limit"], 1.0, "{pool}");
    assert_eq!(pool["ttft"]["limit_ms"], 30000.0, "{pool}");
    assert!(chat["cache_hit_rate"].is_number(), "{chat}");
    // The same 429 in the metric the Grafana panel reads.
    assert_eq!(
        gw.metric(
            "llm_gateway_load_rejections_total",
            &["route=\"chat\"", "gate=\"concurrency\""]
        ),
        1.0
    );
    let text = d.to_string();
    assert!(!text.contains(secret), "no raw session id: {text}");
    // Control: the id is in what the client sent, so the search could find it.
    assert!(body.to_string().contains(secret));
    cluster.engines[0].open_gate("json");
    drop(held);
}

#[test]
fn the_page_is_served_self_contained_with_a_policy_that_allows_nothing_else() {
    let cluster = engines(1);
    let gw = Gateway::start(&[("chat", route_yaml(&ports(&cluster), ""))]);
    let page = http::get(gw.admin, "/dashboard");
    assert_eq!(page.status(), 200);
    assert_eq!(
        page.header("content-type"),
        Some("text/html; charset=utf-8")
    );
    let csp = page.header("content-security-policy").unwrap_or("");
    assert!(
        csp.contains("default-src 'none'") && csp.contains("connect-src 'self'"),
        "{csp}"
    );
    assert!(page.text().contains("fetch(\"dashboard.json\""));
    // Control: the JSON it polls is there, and unknown paths still 404.
    assert_eq!(http::get(gw.admin, "/dashboard.json").status(), 200);
    assert_eq!(http::get(gw.admin, "/dashboard.js").status(), 404);
}
