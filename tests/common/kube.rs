//! A stub Kubernetes API server on 127.0.0.1 for the gateway's
//! EndpointSlice discovery: it answers a LIST with the list the test set,
//! keeps each WATCH open (chunked, as the API server streams watch events)
//! and writes to it the events the test sends, one JSON object per line;
//! the test can break every open watch, and sees every request's target.
//! Threads and blocking sockets: the gateway under test is another process.

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::{Arc, Mutex, PoisonError};

#[derive(Default)]
struct State {
    list: String,
    watches: Vec<TcpStream>,
    targets: Vec<String>,
}

pub struct KubeApi {
    pub url: String,
    state: Arc<Mutex<State>>,
}

impl KubeApi {
    pub fn start(list: &Value) -> KubeApi {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let state = Arc::new(Mutex::new(State {
            list: list.to_string(),
            ..Default::default()
        }));
        let shared = Arc::clone(&state);
        std::thread::spawn(move || {
            for socket in listener.incoming().flatten() {
                let state = Arc::clone(&shared);
                std::thread::spawn(move || serve(socket, &state));
            }
        });
        KubeApi { url, state }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Writes one watch event (`{"type": …, "object": …}`) to every open watch.
    pub fn send(&self, kind: &str, object: &Value) {
        let line = format!("{}\n", json!({"type": kind, "object": object}));
        let chunk = format!("{:x}\r\n{line}\r\n", line.len());
        let mut state = self.state();
        state.watches.retain_mut(|w| {
            w.write_all(chunk.as_bytes())
                .and_then(|_| w.flush())
                .is_ok()
        });
    }

    /// Closes every open watch in the middle of a chunk, as a broken
    /// connection would.
    pub fn break_watches(&self) {
        for mut w in self.state().watches.drain(..) {
            let _ = w.write_all(b"40\r\n{\"type\":\"MODI");
            let _ = w.shutdown(Shutdown::Both);
        }
    }

    pub fn open_watches(&self) -> usize {
        self.state().watches.len()
    }

    /// Every request's target (path and query), in arrival order.
    pub fn targets(&self) -> Vec<String> {
        self.state().targets.clone()
    }
}

fn serve(socket: TcpStream, state: &Mutex<State>) {
    let Ok(read) = socket.try_clone() else { return };
    let mut reader = BufReader::new(read);
    let mut request_line = String::new();
    if reader.read_line(&mut request_line).is_err() {
        return;
    }
    loop {
        let mut header = String::new();
        match reader.read_line(&mut header) {
            Ok(0) | Err(_) => return,
            Ok(_) if header == "\r\n" => break,
            Ok(_) => {}
        }
    }
    let target = request_line
        .split(' ')
        .nth(1)
        .unwrap_or_default()
        .to_string();
    let mut state = state.lock().unwrap_or_else(PoisonError::into_inner);
    state.targets.push(target.clone());
    let mut socket = socket;
    if target.contains("watch=1") {
        let head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";
        if socket.write_all(head.as_bytes()).is_ok() {
            state.watches.push(socket);
        }
    } else {
        let body = state.list.clone();
        drop(state);
        let _ = write!(
            socket,
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
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
