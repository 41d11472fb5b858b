//! A stub Kubernetes API server on 127.0.0.1 for the gateway's
//! EndpointSlice discovery, plain or over TLS: it answers a LIST with the
//! list the test set, keeps each WATCH open (chunked, as the API server
//! streams watch events) and writes to it the events the test sends, one
//! JSON object per line; the test can break every open watch, and sees
//! every request's target and `Authorization` header. Threads and blocking
//! sockets (rustls's blocking stream for TLS): the gateway under test is
//! another process.

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::{Arc, Mutex, PoisonError};

/// An open watch: where its events go, and its socket, to break it.
struct Watch {
    out: Box<dyn Write + Send>,
    socket: TcpStream,
}

#[derive(Default)]
struct State {
    list: String,
    watches: Vec<Watch>,
    /// Each request's target and `Authorization` header, in arrival order.
    seen: Vec<(String, Option<String>)>,
    /// TLS connections whose handshake failed.
    refused: usize,
}

pub struct KubeApi {
    pub url: String,
    state: Arc<Mutex<State>>,
}

impl KubeApi {
    pub fn start(list: &Value) -> KubeApi {
        Self::serve_on(list, None)
    }

    /// Over TLS with `config` (its certificate must be for 127.0.0.1).
    pub fn start_tls(list: &Value, config: Arc<rustls::ServerConfig>) -> KubeApi {
        Self::serve_on(list, Some(config))
    }

    fn serve_on(list: &Value, tls: Option<Arc<rustls::ServerConfig>>) -> KubeApi {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let scheme = if tls.is_some() { "https" } else { "http" };
        let url = format!("{scheme}://{}", listener.local_addr().expect("addr"));
        let state = Arc::new(Mutex::new(State {
            list: list.to_string(),
            ..Default::default()
        }));
        let shared = Arc::clone(&state);
        std::thread::spawn(move || {
            for socket in listener.incoming().flatten() {
                let (state, tls) = (Arc::clone(&shared), tls.clone());
                std::thread::spawn(move || {
                    let Ok(handle) = socket.try_clone() else {
                        return;
                    };
                    match tls {
                        None => serve(socket, handle, &state),
                        Some(config) => match handshake(config, socket) {
                            Some(stream) => serve(stream, handle, &state),
                            None => lock(&state).refused += 1,
                        },
                    }
                });
            }
        });
        KubeApi { url, state }
    }

    /// Writes one watch event (`{"type": …, "object": …}`) to every open watch.
    pub fn send(&self, kind: &str, object: &Value) {
        let line = format!("{}\n", json!({"type": kind, "object": object}));
        let chunk = format!("{:x}\r\n{line}\r\n", line.len());
        lock(&self.state).watches.retain_mut(|w| {
            w.out
                .write_all(chunk.as_bytes())
                .and_then(|_| w.out.flush())
                .is_ok()
        });
    }

    /// Closes every open watch in the middle of a chunk, as a broken
    /// connection would.
    pub fn break_watches(&self) {
        for mut w in lock(&self.state).watches.drain(..) {
            let _ = w.out.write_all(b"40\r\n{\"type\":\"MODI");
            let _ = w.out.flush();
            let _ = w.socket.shutdown(Shutdown::Both);
        }
    }

    pub fn open_watches(&self) -> usize {
        lock(&self.state).watches.len()
    }

    /// Every request's target (path and query), in arrival order.
    pub fn targets(&self) -> Vec<String> {
        self.seen().into_iter().map(|(target, _)| target).collect()
    }

    /// Every request's target and `Authorization` header, in arrival order.
    pub fn seen(&self) -> Vec<(String, Option<String>)> {
        lock(&self.state).seen.clone()
    }

    /// TLS connections whose handshake failed.
    pub fn refused(&self) -> usize {
        lock(&self.state).refused
    }
}

fn lock(state: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The TLS handshake, to its end: None when it failed (an untrusted
/// certificate, say), before any request could be read.
fn handshake(
    config: Arc<rustls::ServerConfig>,
    mut socket: TcpStream,
) -> Option<rustls::StreamOwned<rustls::ServerConnection, TcpStream>> {
    let mut conn = rustls::ServerConnection::new(config).ok()?;
    while conn.is_handshaking() {
        conn.complete_io(&mut socket).ok()?;
    }
    Some(rustls::StreamOwned::new(conn, socket))
}

fn serve<S: Read + Write + Send + 'static>(stream: S, socket: TcpStream, state: &Mutex<State>) {
    let mut reader = BufReader::new(stream);
    let mut request_line = String::new();
    if reader.read_line(&mut request_line).is_err() {
        return;
    }
    let mut authorization = None;
    loop {
        let mut header = String::new();
        match reader.read_line(&mut header) {
            Ok(0) | Err(_) => return,
            Ok(_) if header == "\r\n" => break,
            Ok(_) => {}
        }
        if let Some((name, value)) = header.split_once(':') {
            if name.eq_ignore_ascii_case("authorization") {
                authorization = Some(value.trim().to_string());
            }
        }
    }
    // A GET has no body: nothing is left in the reader's buffer.
    let mut stream = reader.into_inner();
    let target = request_line
        .split(' ')
        .nth(1)
        .unwrap_or_default()
        .to_string();
    let mut state = lock(state);
    state.seen.push((target.clone(), authorization));
    if target.contains("watch=1") {
        let head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";
        if stream
            .write_all(head.as_bytes())
            .and_then(|_| stream.flush())
            .is_ok()
        {
            state.watches.push(Watch {
                out: Box::new(stream),
                socket,
            });
        }
    } else {
        let body = state.list.clone();
        drop(state);
        let _ = write!(
            stream,
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        let _ = stream.flush();
        let _ = socket.shutdown(Shutdown::Write);
    }
}

/// An EndpointSlice as the API serves it (the fields the watcher reads and
/// a few it does not): `endpoints` are (pod, address, ready).
pub fn slice(name: &str, version: u64, endpoints: &[(&str, &str, bool)], port: u16) -> Value {
    json!({
        "kind": "EndpointSlice",
        "apiVersion": "discovery.k8s.io/v1",
        "metadata": {
            "name": name,
            "namespace": "llm",
            "resourceVersion": version.to_string(),
            "labels": {"app": "vllm", "kubernetes.io/service-name": "vllm"},
        },
        "addressType": "IPv4",
        "endpoints": endpoints.iter().map(|(pod, ip, ready)| json!({
            "addresses": [ip],
            "conditions": {"ready": ready, "serving": ready, "terminating": false},
            "targetRef": {"kind": "Pod", "namespace": "llm", "name": pod},
        })).collect::<Vec<_>>(),
        "ports": [{"name": "http", "protocol": "TCP", "port": port}],
    })
}

pub fn slice_list(version: u64, items: &[Value]) -> Value {
    json!({
        "kind": "EndpointSliceList",
        "apiVersion": "discovery.k8s.io/v1",
        "metadata": {"resourceVersion": version.to_string()},
        "items": items,
    })
}
