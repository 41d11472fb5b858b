//! The Kubernetes EndpointSlice watcher (`discovery::kubernetes::watch`)
//! against a stub API server on 127.0.0.1: the stub answers each request, in
//! the order they come, with the next reply of its script (the recorded list
//! and watch events of `tests/golden/kubernetes/`, see its README), and hands
//! the test every request's target, so a test sees both what the watcher
//! reported and what it asked.

use llm_gateway::discovery::kubernetes::{watch, Endpoint, Found, KubernetesSource, PortRef};
use std::collections::VecDeque;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

const LIST: &str = include_str!("golden/kubernetes/list.json");
const LIST_AFTER_GONE: &str = include_str!("golden/kubernetes/list-after-gone.json");
const WATCH: &str = include_str!("golden/kubernetes/watch.ndjson");
const GONE: &str = include_str!("golden/kubernetes/watch-gone.ndjson");

/// Long enough for a backoff of 1 s on a loaded machine; a test waits this
/// only when the watcher fails to do what it should.
const WITHIN: Duration = Duration::from_secs(15);

/// The `i`th event of `watch.ndjson` (0: 1001 MODIFIED vllm-1 ready,
/// 1: 1002 BOOKMARK, 2: 1003 no-op MODIFIED, 3: 1004 MODIFIED vllm-0 gone,
/// 4: 1005 DELETED the slice of vllm-2).
fn event(i: usize) -> String {
    WATCH.lines().nth(i).expect("a fixture line").to_string()
}

enum Reply {
    Json(u16, String),
    Stream(Vec<String>, End),
}

enum End {
    /// The last chunk: the server ended the watch (its timeout).
    Clean,
    /// The connection closed in the middle of a chunk holding this line.
    Break(String),
    /// Open and silent until the test ends.
    Hold,
}

struct Stub {
    url: String,
    /// Each request's target (path and query), in order.
    targets: mpsc::UnboundedReceiver<String>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Stub {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn stub(script: Vec<Reply>) -> Stub {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let (tx, targets) = mpsc::unbounded_channel();
    let task = tokio::spawn(async move {
        let mut script: VecDeque<Reply> = script.into();
        let mut held = Vec::new();
        loop {
            let (socket, _) = listener.accept().await.expect("accept");
            let reply = script.pop_front();
            held.push(tokio::spawn(serve(socket, reply, tx.clone())));
        }
    });
    Stub { url, targets, task }
}

async fn serve(
    mut socket: TcpStream,
    reply: Option<Reply>,
    targets: mpsc::UnboundedSender<String>,
) {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match socket.read(&mut byte).await {
            Ok(1) => head.push(byte[0]),
            _ => return,
        }
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let target = head.split(' ').nth(1).expect("a request line").to_string();
    let _ = targets.send(target);
    match reply {
        // Past the script: a request nobody expected, answered by silence.
        None => std::future::pending::<()>().await,
        Some(Reply::Json(status, body)) => {
            let reason = if status == 200 { "OK" } else { "Refused" };
            let text = format!(
                "HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = socket.write_all(text.as_bytes()).await;
        }
        Some(Reply::Stream(lines, end)) => {
            let mut out = String::from(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n",
            );
            for line in lines {
                out.push_str(&format!("{:x}\r\n{line}\n\r\n", line.len() + 1));
            }
            match &end {
                End::Clean => out.push_str("0\r\n\r\n"),
                End::Break(line) => {
                    // The chunk announces the whole line; half of it comes.
                    out.push_str(&format!(
                        "{:x}\r\n{}",
                        line.len() + 1,
                        &line[..line.len() / 2]
                    ));
                }
                End::Hold => {}
            }
            let _ = socket.write_all(out.as_bytes()).await;
            if matches!(end, End::Hold) {
                std::future::pending::<()>().await;
            }
        }
    }
}

fn source(url: &str) -> KubernetesSource {
    KubernetesSource {
        namespace: "inference".to_string(),
        selector: "app=vllm".to_string(),
        port: PortRef::Name("http".to_string()),
        api: Some(url.to_string()),
        service_account_dir: None,
    }
}

fn start(stub: &Stub) -> mpsc::Receiver<Found> {
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(watch(source(&stub.url), tx));
    rx
}

async fn next(rx: &mut mpsc::Receiver<Found>) -> Found {
    tokio::time::timeout(WITHIN, rx.recv())
        .await
        .expect("the watcher reported in time")
        .expect("the watcher is running")
}

async fn next_target(stub: &mut Stub) -> String {
    tokio::time::timeout(WITHIN, stub.targets.recv())
        .await
        .expect("a request in time")
        .expect("the stub is running")
}

fn ep(name: &str, addr: &str) -> Endpoint {
    Endpoint {
        name: name.to_string(),
        addr: addr.parse().expect("a socket address"),
    }
}

fn endpoints(list: &[(&str, &str)]) -> Found {
    Found::Endpoints(list.iter().map(|(n, a)| ep(n, a)).collect())
}

const PATH: &str = "/apis/discovery.k8s.io/v1/namespaces/inference/endpointslices";

fn list_target() -> String {
    format!("{PATH}?labelSelector=app%3Dvllm")
}

fn watch_target(version: &str) -> String {
    format!(
        "{PATH}?labelSelector=app%3Dvllm&watch=1&resourceVersion={version}&allowWatchBookmarks=true&timeoutSeconds=240"
    )
}

fn listed() -> Found {
    endpoints(&[("vllm-0", "10.244.1.5:8000"), ("vllm-2", "10.244.3.9:8000")])
}

fn all_three() -> Found {
    endpoints(&[
        ("vllm-0", "10.244.1.5:8000"),
        ("vllm-1", "10.244.2.7:8000"),
        ("vllm-2", "10.244.3.9:8000"),
    ])
}

#[tokio::test]
async fn a_pod_that_becomes_ready_joins_the_set() {
    let mut stub = stub(vec![
        Reply::Json(200, LIST.to_string()),
        Reply::Stream(vec![event(0)], End::Hold),
    ])
    .await;
    let mut rx = start(&stub);
    assert_eq!(next(&mut rx).await, listed());
    assert_eq!(next(&mut rx).await, all_three());
    assert_eq!(next_target(&mut stub).await, list_target());
    assert_eq!(next_target(&mut stub).await, watch_target("1000"));
}

#[tokio::test]
async fn pods_that_go_leave_the_set_and_bookmarks_and_no_ops_send_nothing() {
    let mut stub = stub(vec![
        Reply::Json(200, LIST.to_string()),
        Reply::Stream((0..5).map(event).collect(), End::Hold),
    ])
    .await;
    let mut rx = start(&stub);
    assert_eq!(next(&mut rx).await, listed());
    assert_eq!(next(&mut rx).await, all_three());
    // Had the bookmark (1002) or the no-op change (1003) been sent, the
    // same three would come next.
    assert_eq!(
        next(&mut rx).await,
        endpoints(&[("vllm-1", "10.244.2.7:8000"), ("vllm-2", "10.244.3.9:8000")]),
        "vllm-0 left its slice (1004)"
    );
    assert_eq!(
        next(&mut rx).await,
        endpoints(&[("vllm-1", "10.244.2.7:8000")]),
        "the slice of vllm-2 was deleted (1005)"
    );
    assert_eq!(next_target(&mut stub).await, list_target());
    assert_eq!(next_target(&mut stub).await, watch_target("1000"));
}

#[tokio::test]
async fn a_broken_watch_resumes_from_the_last_version_seen_without_a_list() {
    let mut stub = stub(vec![
        Reply::Json(200, LIST.to_string()),
        // 1001, the bookmark 1002, then 1003 cut in half by the close.
        Reply::Stream(vec![event(0), event(1)], End::Break(event(2))),
        Reply::Stream(vec![event(3)], End::Hold),
    ])
    .await;
    let mut rx = start(&stub);
    assert_eq!(next(&mut rx).await, listed());
    assert_eq!(next(&mut rx).await, all_three());
    match next(&mut rx).await {
        Found::Error(message) => assert!(message.contains("watch"), "{message}"),
        other => panic!("expected the break reported, got {other:?}"),
    }
    // The resumed watch ends the error: the set again, unchanged.
    assert_eq!(next(&mut rx).await, all_three());
    assert_eq!(
        next(&mut rx).await,
        endpoints(&[("vllm-1", "10.244.2.7:8000"), ("vllm-2", "10.244.3.9:8000")])
    );
    assert_eq!(next_target(&mut stub).await, list_target());
    assert_eq!(next_target(&mut stub).await, watch_target("1000"));
    // The bookmark's version: not the list's, not the half line's.
    assert_eq!(next_target(&mut stub).await, watch_target("1002"));
    assert!(
        stub.targets.try_recv().is_err(),
        "no other request, and no new list"
    );
}

#[tokio::test]
async fn a_watch_the_server_ends_resumes_without_an_error() {
    let mut stub = stub(vec![
        Reply::Json(200, LIST.to_string()),
        Reply::Stream(vec![event(0)], End::Clean),
        Reply::Stream(vec![event(3)], End::Hold),
    ])
    .await;
    let mut rx = start(&stub);
    assert_eq!(next(&mut rx).await, listed());
    assert_eq!(next(&mut rx).await, all_three());
    assert_eq!(
        next(&mut rx).await,
        endpoints(&[("vllm-1", "10.244.2.7:8000"), ("vllm-2", "10.244.3.9:8000")])
    );
    assert_eq!(next_target(&mut stub).await, list_target());
    assert_eq!(next_target(&mut stub).await, watch_target("1000"));
    assert_eq!(next_target(&mut stub).await, watch_target("1001"));
}

#[tokio::test]
async fn a_410_error_event_lists_again() {
    let mut stub = stub(vec![
        Reply::Json(200, LIST.to_string()),
        Reply::Stream(vec![event(0), GONE.trim().to_string()], End::Hold),
        Reply::Json(200, LIST_AFTER_GONE.to_string()),
        Reply::Stream(Vec::new(), End::Hold),
    ])
    .await;
    let mut rx = start(&stub);
    assert_eq!(next(&mut rx).await, listed());
    assert_eq!(next(&mut rx).await, all_three());
    // No error between: an expired version is routine.
    assert_eq!(
        next(&mut rx).await,
        endpoints(&[("vllm-0", "10.244.1.5:8000"), ("vllm-1", "10.244.2.7:8000")])
    );
    assert_eq!(next_target(&mut stub).await, list_target());
    assert_eq!(next_target(&mut stub).await, watch_target("1000"));
    assert_eq!(next_target(&mut stub).await, list_target());
    assert_eq!(next_target(&mut stub).await, watch_target("2000"));
}

#[tokio::test]
async fn an_http_410_on_the_watch_lists_again() {
    let status = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"too old resource version: 1000 (1850)","reason":"Expired","code":410}"#;
    let mut stub = stub(vec![
        Reply::Json(200, LIST.to_string()),
        Reply::Json(410, status.to_string()),
        Reply::Json(200, LIST_AFTER_GONE.to_string()),
        Reply::Stream(Vec::new(), End::Hold),
    ])
    .await;
    let mut rx = start(&stub);
    assert_eq!(next(&mut rx).await, listed());
    assert_eq!(
        next(&mut rx).await,
        endpoints(&[("vllm-0", "10.244.1.5:8000"), ("vllm-1", "10.244.2.7:8000")])
    );
    assert_eq!(next_target(&mut stub).await, list_target());
    assert_eq!(next_target(&mut stub).await, watch_target("1000"));
    assert_eq!(next_target(&mut stub).await, list_target());
    assert_eq!(next_target(&mut stub).await, watch_target("2000"));
}

#[tokio::test]
async fn a_refused_list_is_reported_then_retried() {
    let forbidden = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"endpointslices.discovery.k8s.io is forbidden: User \"system:serviceaccount:inference:gateway\" cannot list resource \"endpointslices\"","reason":"Forbidden","code":403}"#;
    let mut stub = stub(vec![
        Reply::Json(403, forbidden.to_string()),
        Reply::Json(200, LIST.to_string()),
        Reply::Stream(Vec::new(), End::Hold),
    ])
    .await;
    let mut rx = start(&stub);
    match next(&mut rx).await {
        Found::Error(message) => {
            assert!(message.contains("403"), "{message}");
            assert!(message.contains("cannot list resource"), "{message}");
        }
        other => panic!("expected the refusal, got {other:?}"),
    }
    assert_eq!(next(&mut rx).await, listed());
    assert_eq!(next_target(&mut stub).await, list_target());
    assert_eq!(next_target(&mut stub).await, list_target());
    assert_eq!(next_target(&mut stub).await, watch_target("1000"));
}
