//! An engine stand-in that answers every request with the same canned
//! response, written as HTTP chunks cut exactly where the test says (so an SSE
//! frame can straddle two chunks), and records the heads and bodies it
//! received. [`Canned::raw`] hands the connection to the test instead, for
//! answers no real engine would give (garbage, a reset mid-head, a stall).

#![allow(dead_code)]

use parking_lot::Mutex;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

pub struct Canned {
    pub addr: SocketAddr,
    pub received: Arc<Mutex<Vec<Vec<u8>>>>,
    /// Each request's head as received (request line and header lines).
    pub heads: Arc<Mutex<Vec<String>>>,
}

impl Canned {
    /// Serves `content_type` with `parts` as separate chunks (chunked
    /// encoding), or as one Content-Length body when `chunked` is false.
    pub fn start(content_type: &'static str, parts: Vec<Vec<u8>>, chunked: bool) -> Canned {
        let parts = Arc::new(parts);
        Canned::accepting(move |stream, rec| serve(stream, content_type, &parts, chunked, rec))
    }

    /// After reading each request, hands the connection to `reply`, which
    /// writes whatever bytes it likes (or none) and may keep, close or reset
    /// the connection; the connection is dropped when `reply` returns.
    pub fn raw(reply: impl Fn(&mut TcpStream) + Send + Sync + 'static) -> Canned {
        Canned::replying(reply, false)
    }

    /// Answers the first request of each connection with `reply`, keeps the
    /// connection, and closes it when the next request on it arrives,
    /// unanswered: an engine that announces keep-alive and still closes the
    /// connection after each response (llama-server does, ~2 ms after a
    /// stream), as the gateway meets it: a pooled connection that fails
    /// before any response byte. Both requests are recorded.
    pub fn one_answer_per_connection(
        reply: impl Fn(&mut TcpStream) + Send + Sync + 'static,
    ) -> Canned {
        Canned::replying(reply, true)
    }

    /// Reads a request, hands the connection to `reply`; with
    /// `then_read_next`, reads (and records) the next request on the
    /// connection before dropping it, unanswered.
    fn replying(
        reply: impl Fn(&mut TcpStream) + Send + Sync + 'static,
        then_read_next: bool,
    ) -> Canned {
        Canned::accepting(move |stream, rec| {
            stream.set_nodelay(true).ok();
            let Ok(mut writer) = stream.try_clone() else {
                return;
            };
            let mut reader = BufReader::new(stream);
            if read_request(&mut reader, rec) {
                reply(&mut writer);
                if then_read_next {
                    let _ = read_request(&mut reader, rec);
                }
            }
        })
    }

    /// Binds a port and runs `handle` on a thread per accepted connection.
    fn accepting(handle: impl Fn(TcpStream, &Recorder) + Send + Sync + 'static) -> Canned {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind canned engine");
        let addr = listener.local_addr().expect("addr");
        let received = Arc::new(Mutex::new(Vec::new()));
        let heads = Arc::new(Mutex::new(Vec::new()));
        let rec = Recorder {
            bodies: Arc::clone(&received),
            heads: Arc::clone(&heads),
        };
        let handle = Arc::new(handle);
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (rec, handle) = (rec.clone(), Arc::clone(&handle));
                std::thread::spawn(move || handle(stream, &rec));
            }
        });
        Canned {
            addr,
            received,
            heads,
        }
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }
}

/// Makes the connection end with a TCP reset instead of a FIN when it is
/// dropped (as [`Canned::raw`] does once its reply returns): what a crashed
/// process or a middlebox tearing the connection down looks like.
pub fn reset_on_close(stream: &TcpStream) {
    let _ = socket2::SockRef::from(stream).set_linger(Some(Duration::ZERO));
}

/// Reads one request (head and Content-Length body) and records it; false
/// when the connection ended first.
fn read_request(reader: &mut BufReader<TcpStream>, rec: &Recorder) -> bool {
    let mut len = 0usize;
    let mut line = String::new();
    if reader.read_line(&mut line).unwrap_or(0) == 0 {
        return false;
    }
    let mut head = line.clone();
    loop {
        line.clear();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return false;
        }
        head.push_str(&line);
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                len = v.trim().parse().unwrap_or(0);
            }
        }
    }
    let mut body = vec![0u8; len];
    if reader.read_exact(&mut body).is_err() {
        return false;
    }
    rec.heads.lock().push(head);
    rec.bodies.lock().push(body);
    true
}

#[derive(Clone)]
struct Recorder {
    bodies: Arc<Mutex<Vec<Vec<u8>>>>,
    heads: Arc<Mutex<Vec<String>>>,
}

fn serve(stream: TcpStream, content_type: &str, parts: &[Vec<u8>], chunked: bool, rec: &Recorder) {
    stream.set_nodelay(true).ok();
    let mut writer = match stream.try_clone() {
        Ok(w) => w,
        Err(_) => return,
    };
    let mut reader = BufReader::new(stream);
    loop {
        if !read_request(&mut reader, rec) {
            return;
        }
        let ok = if chunked {
            let mut ok = writer
                .write_all(format!("HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\nTransfer-Encoding: chunked\r\n\r\n").as_bytes())
                .is_ok();
            for part in parts {
                ok &= writer
                    .write_all(format!("{:x}\r\n", part.len()).as_bytes())
                    .is_ok();
                ok &= writer.write_all(part).is_ok();
                ok &= writer.write_all(b"\r\n").is_ok();
                let _ = writer.flush();
                // Separate writes so the gateway is likely to see separate
                // reads; correctness must not depend on it either way.
                std::thread::sleep(Duration::from_millis(5));
            }
            ok && writer.write_all(b"0\r\n\r\n").is_ok()
        } else {
            let total: usize = parts.iter().map(Vec::len).sum();
            let mut ok = writer
                .write_all(format!("HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\nContent-Length: {total}\r\n\r\n").as_bytes())
                .is_ok();
            for part in parts {
                ok &= writer.write_all(part).is_ok();
            }
            ok
        };
        if !ok {
            return;
        }
    }
}

/// A route on one canned engine, with probes and scraping off (the canned
/// engine answers every path with the same body).
pub fn canned_route(port: u16, extra: &str) -> String {
    format!("peers:\n  - {{name: canned, host: 127.0.0.1, port: {port}}}\nhealth:\n  enabled: false\nengine_metrics: false\n{extra}")
}
