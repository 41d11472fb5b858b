//! Body-log test ends: a frame sink that stands in for the listener and
//! parses the wire format itself (so the gateway's encoder is checked
//! against an independent reading of the spec), and the real
//! `llm-gateway bodylog-listen` as a child process.

#![allow(dead_code)]

use super::process::Proc;
use super::{free_port, http, wait_for, DEADLINE};
use parking_lot::Mutex;
use serde_json::Value;
use std::io::Read;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One frame as it arrived.
#[derive(Debug, Clone)]
pub struct Captured {
    /// The whole frame, length prefix included.
    pub wire: Vec<u8>,
    pub meta: Value,
    pub req: Vec<u8>,
    pub resp: Vec<u8>,
}

/// Accepts connections and parses frames:
/// `[u32 len][u16 meta_len][meta][u32 req_len][req][u32 resp_len][resp]`,
/// big-endian, `len` excluding itself. A frame whose sections do not add up
/// to `len` panics the reader thread, and `frames` then reports it.
/// A port bound but not listening: connecting to it is refused, as to a
/// listener that is not up yet, and no other test can take it meanwhile
/// (a port that was merely free a moment ago sometimes was, under the whole
/// suite, and the "absent" listener then answered).
pub struct ReservedPort(socket2::Socket);

impl ReservedPort {
    pub fn new() -> ReservedPort {
        let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
            .expect("socket");
        let any: SocketAddr = ([127, 0, 0, 1], 0).into();
        socket.bind(&any.into()).expect("bind a reserved port");
        ReservedPort(socket)
    }

    pub fn port(&self) -> u16 {
        self.0
            .local_addr()
            .ok()
            .and_then(|a| a.as_socket())
            .map(|a| a.port())
            .expect("a bound port")
    }
}

pub struct FrameSink {
    pub addr: SocketAddr,
    frames: Arc<Mutex<Vec<Captured>>>,
    errors: Arc<Mutex<Vec<String>>>,
}

impl FrameSink {
    pub fn start() -> FrameSink {
        Self::on(TcpListener::bind("127.0.0.1:0").expect("bind frame sink"))
    }

    /// On a port reserved earlier (one the gateway was already told about).
    pub fn on_reserved(port: ReservedPort) -> FrameSink {
        port.0.listen(16).expect("listen on the reserved port");
        Self::on(port.0.into())
    }

    fn on(listener: TcpListener) -> FrameSink {
        let addr = listener.local_addr().expect("addr");
        let frames = Arc::new(Mutex::new(Vec::new()));
        let errors = Arc::new(Mutex::new(Vec::new()));
        let (f, e) = (Arc::clone(&frames), Arc::clone(&errors));
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (f, e) = (Arc::clone(&f), Arc::clone(&e));
                std::thread::spawn(move || {
                    if let Err(why) = read_frames(stream, &f) {
                        e.lock().push(why);
                    }
                });
            }
        });
        FrameSink {
            addr,
            frames,
            errors,
        }
    }

    pub fn frames(&self) -> Vec<Captured> {
        let errors = self.errors.lock();
        assert!(errors.is_empty(), "bad frames: {errors:?}");
        self.frames.lock().clone()
    }

    /// Waits until at least `n` frames arrived; returns all of them.
    pub fn wait_frames(&self, n: usize) -> Vec<Captured> {
        wait_for(&format!("{n} body-log frame(s)"), DEADLINE, || {
            let frames = self.frames();
            (frames.len() >= n).then_some(frames)
        })
    }

    /// gateway.yaml lines that point the gateway here.
    pub fn config(&self, extra: &str) -> String {
        format!("bodylog:\n  listener: {}\n{extra}", self.addr)
    }
}

fn be(bytes: &[u8]) -> usize {
    bytes.iter().fold(0usize, |n, &b| (n << 8) | b as usize)
}

fn read_frames(mut stream: TcpStream, out: &Mutex<Vec<Captured>>) -> Result<(), String> {
    loop {
        let mut len = [0u8; 4];
        match stream.read_exact(&mut len) {
            Ok(()) => {}
            // The gateway closing between frames is fine.
            Err(_) => return Ok(()),
        }
        let mut body = vec![0u8; be(&len)];
        stream
            .read_exact(&mut body)
            .map_err(|e| format!("frame cut short: {e}"))?;
        let mut at = 0usize;
        let mut section = |width: usize| -> Result<Vec<u8>, String> {
            let n = be(body
                .get(at..at + width)
                .ok_or("length field past the end")?);
            at += width;
            let bytes = body.get(at..at + n).ok_or("section past the end")?.to_vec();
            at += n;
            Ok(bytes)
        };
        let meta = section(2)?;
        let req = section(4)?;
        let resp = section(4)?;
        if at != body.len() {
            return Err(format!("{} bytes after the response", body.len() - at));
        }
        let meta: Value = serde_json::from_slice(&meta).map_err(|e| format!("meta: {e}"))?;
        let mut wire = len.to_vec();
        wire.extend_from_slice(&body);
        out.lock().push(Captured {
            wire,
            meta,
            req,
            resp,
        });
    }
}

/// A frame encoded by the test, for feeding the listener directly.
pub fn encode_frame(meta: &Value, req: &[u8], resp: &[u8]) -> Vec<u8> {
    let meta = serde_json::to_vec(meta).expect("meta");
    let len = 2 + meta.len() + 4 + req.len() + 4 + resp.len();
    let mut out = Vec::with_capacity(4 + len);
    out.extend_from_slice(&(len as u32).to_be_bytes());
    out.extend_from_slice(&(meta.len() as u16).to_be_bytes());
    out.extend_from_slice(&meta);
    out.extend_from_slice(&(req.len() as u32).to_be_bytes());
    out.extend_from_slice(req);
    out.extend_from_slice(&(resp.len() as u32).to_be_bytes());
    out.extend_from_slice(resp);
    out
}

/// `llm-gateway bodylog-listen` on ephemeral ports, writing into a temp dir.
pub struct Listener {
    child: Proc,
    pub addr: SocketAddr,
    pub metrics: SocketAddr,
    pub dir: tempfile::TempDir,
    log_path: PathBuf,
}

impl Listener {
    pub fn start() -> Listener {
        let dir = tempfile::tempdir().expect("tempdir");
        let (port, metrics_port) = (free_port(), free_port());
        let log_path = dir.path().join("listener.log");
        let mut cmd = Command::new(super::gateway_bin());
        cmd.arg("bodylog-listen")
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .arg("--dir")
            .arg(dir.path().join("records"))
            .args(["--metrics", &format!("127.0.0.1:{metrics_port}")])
            .env("RUST_LOG", "info");
        let mut l = Listener {
            child: Proc::spawn_logged(&mut cmd, &log_path, "bodylog-listen"),
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            metrics: SocketAddr::from(([127, 0, 0, 1], metrics_port)),
            dir,
            log_path,
        };
        l.wait_ready();
        l
    }

    fn wait_ready(&mut self) {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.exited() {
                panic!(
                    "bodylog-listen exited at startup ({status}):\n{}",
                    self.log()
                );
            }
            let up = http::try_get(self.metrics, "/healthz").is_some_and(|r| r.status() == 200);
            if up && TcpStream::connect(self.addr).is_ok() {
                return;
            }
            assert!(
                start.elapsed() < DEADLINE,
                "bodylog-listen not ready:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    pub fn records_dir(&self) -> PathBuf {
        self.dir.path().join("records")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    pub fn metrics_text(&self) -> String {
        http::get(self.metrics, "/metrics").text()
    }

    /// Names of the files in the records directory, sorted.
    pub fn files(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(self.records_dir())
            .map(|d| {
                d.flatten()
                    .filter_map(|e| e.file_name().into_string().ok())
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    }

    /// Every record of every file, in file then line order.
    pub fn records(&self) -> Vec<Value> {
        read_records(&self.records_dir(), &self.files())
    }

    pub fn wait_records(&self, n: usize) -> Vec<Value> {
        wait_for(&format!("{n} record(s) on disk"), DEADLINE, || {
            let records = self.records();
            (records.len() >= n).then_some(records)
        })
    }

    pub fn signal(&self, sig: &str) {
        self.child.signal(sig)
    }

    pub fn wait_exit(&mut self, timeout: Duration) -> Option<i32> {
        self.child.wait_exit(timeout)
    }
}

fn read_records(dir: &Path, files: &[String]) -> Vec<Value> {
    let mut out = Vec::new();
    for name in files {
        let text = std::fs::read_to_string(dir.join(name)).unwrap_or_default();
        // Only whole lines: the writer may be halfway through one.
        for line in text.split_inclusive('\n').filter(|l| l.ends_with('\n')) {
            out.push(serde_json::from_str(line).expect("a record is one JSON object"));
        }
    }
    out
}
