use super::client::tls_connector;
use super::slices::{slice_endpoints, Slice};
use super::*;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::net::TcpStream;

const LIST: &str = include_str!("../../../tests/golden/kubernetes/list.json");
const WATCH: &str = include_str!("../../../tests/golden/kubernetes/watch.ndjson");
const GONE: &str = include_str!("../../../tests/golden/kubernetes/watch-gone.ndjson");

fn http() -> PortRef {
    PortRef::Name("http".to_string())
}

fn ep(name: &str, addr: &str) -> Endpoint {
    Endpoint {
        name: name.to_string(),
        addr: addr.parse().expect("a socket address"),
    }
}

fn slice(json: &str) -> Slice {
    serde_json::from_str(json).expect("a slice")
}

fn listed() -> Vec<Slice> {
    let list: SliceList = serde_json::from_str(LIST).expect("the list fixture");
    list.items.expect("items")
}

#[test]
fn a_slice_gives_its_ready_endpoints_on_the_named_port() {
    let items = listed();
    assert_eq!(
        slice_endpoints(&items[0], &http()),
        vec![ep("vllm-0", "10.244.1.5:8000")],
        "vllm-1 is not ready"
    );
    assert_eq!(
        slice_endpoints(&items[1], &http()),
        vec![ep("vllm-2", "10.244.3.9:8000")],
        "vllm-3 is terminating"
    );
    let metrics = PortRef::Name("metrics".to_string());
    assert_eq!(
        slice_endpoints(&items[0], &metrics),
        vec![ep("vllm-0", "10.244.1.5:9000")]
    );
}

#[test]
fn conditions_follow_the_api_docs() {
    let s = slice(
        r#"{"metadata":{"name":"s"},"addressType":"IPv4","ports":[{"name":"http","port":8000}],
        "endpoints":[
          {"addresses":["10.0.0.1"],"targetRef":{"kind":"Pod","name":"unset"}},
          {"addresses":["10.0.0.2"],"conditions":{},"targetRef":{"kind":"Pod","name":"empty"}},
          {"addresses":["10.0.0.3"],"conditions":{"ready":false},"targetRef":{"kind":"Pod","name":"not-ready"}},
          {"addresses":["10.0.0.4"],"conditions":{"ready":true,"serving":true,"terminating":true},"targetRef":{"kind":"Pod","name":"published-terminating"}},
          {"addresses":["10.0.0.5"],"conditions":{"ready":true,"terminating":false},"targetRef":{"kind":"Pod","name":"ready"}},
          {"addresses":["10.0.0.6"],"conditions":{"ready":null,"terminating":null},"targetRef":{"kind":"Pod","name":"nulls"}}
        ]}"#,
    );
    assert_eq!(
        slice_endpoints(&s, &http()),
        vec![
            ep("unset", "10.0.0.1:8000"),
            ep("empty", "10.0.0.2:8000"),
            ep("ready", "10.0.0.5:8000"),
            ep("nulls", "10.0.0.6:8000"),
        ]
    );
}

#[test]
fn ports_by_name_or_number() {
    let s = slice(
        r#"{"metadata":{"name":"s"},"addressType":"IPv4",
        "ports":[{"port":7000},{"name":"http","port":8000},{"name":"bad","port":70000}],
        "endpoints":[{"addresses":["10.0.0.1"],"conditions":{"ready":true}}]}"#,
    );
    let at = |port: PortRef| {
        slice_endpoints(&s, &port)
            .into_iter()
            .map(|e| e.addr.port())
            .collect::<Vec<_>>()
    };
    assert_eq!(at(http()), vec![8000]);
    assert_eq!(
        at(PortRef::Name(String::new())),
        vec![7000],
        "an unnamed port's name is \"\""
    );
    assert_eq!(at(PortRef::Name("grpc".to_string())), Vec::<u16>::new());
    assert_eq!(
        at(PortRef::Name("bad".to_string())),
        Vec::<u16>::new(),
        "not a port"
    );
    assert_eq!(
        at(PortRef::Number(1234)),
        vec![1234],
        "a number is used as is"
    );
    let no_ports = slice(
        r#"{"metadata":{"name":"s"},"addressType":"IPv4","ports":null,
        "endpoints":[{"addresses":["10.0.0.1"]}]}"#,
    );
    assert!(slice_endpoints(&no_ports, &http()).is_empty());
    assert_eq!(slice_endpoints(&no_ports, &PortRef::Number(80)).len(), 1);
}

#[test]
fn address_types_and_names() {
    let fqdn = slice(
        r#"{"metadata":{"name":"s"},"addressType":"FQDN","ports":[{"name":"http","port":8000}],
        "endpoints":[{"addresses":["engine.example.com"]}]}"#,
    );
    assert!(slice_endpoints(&fqdn, &http()).is_empty());
    let v6 = slice(
        r#"{"metadata":{"name":"s"},"addressType":"IPv6","ports":[{"name":"http","port":8000}],
        "endpoints":[
          {"addresses":["fd00::5","fd00::6"],"targetRef":{"kind":"Pod","name":"two-addresses"}},
          {"addresses":["fd00::7"],"targetRef":{"kind":"Node","name":"a-node"}},
          {"addresses":["not-an-ip"]}
        ]}"#,
    );
    assert_eq!(
        slice_endpoints(&v6, &http()),
        vec![
            ep("two-addresses", "[fd00::5]:8000"),
            ep("two-addresses", "[fd00::6]:8000"),
            ep("[fd00::7]:8000", "[fd00::7]:8000"),
        ]
    );
    let empty = slice(r#"{"metadata":{"name":"s"},"addressType":"IPv4","endpoints":null}"#);
    assert!(slice_endpoints(&empty, &PortRef::Number(80)).is_empty());
}

#[test]
fn the_ready_set_is_the_union_sorted_one_per_address() {
    let a = slice(
        r#"{"metadata":{"name":"a"},"addressType":"IPv4","endpoints":[
          {"addresses":["10.0.0.9"],"targetRef":{"kind":"Pod","name":"zed"}},
          {"addresses":["10.0.0.2"],"targetRef":{"kind":"Pod","name":"moved"}}]}"#,
    );
    let b = slice(
        r#"{"metadata":{"name":"b"},"addressType":"IPv4","endpoints":[
          {"addresses":["10.0.0.2"],"targetRef":{"kind":"Pod","name":"moved"}},
          {"addresses":["10.0.0.1"],"targetRef":{"kind":"Pod","name":"alpha"}}]}"#,
    );
    let slices = Slices::from_list(&[a, b], &PortRef::Number(80));
    assert_eq!(
        slices.ready_set(),
        vec![
            ep("alpha", "10.0.0.1:80"),
            ep("moved", "10.0.0.2:80"),
            ep("zed", "10.0.0.9:80"),
        ]
    );
    // One address under two names (a pod replaced by one at the same IP,
    // seen in two slices): one endpoint, the same one whatever the order.
    let x = slice(
        r#"{"metadata":{"name":"x"},"addressType":"IPv4","endpoints":[{"addresses":["10.0.0.3"],"targetRef":{"kind":"Pod","name":"new"}}]}"#,
    );
    let y = slice(
        r#"{"metadata":{"name":"y"},"addressType":"IPv4","endpoints":[{"addresses":["10.0.0.3"],"targetRef":{"kind":"Pod","name":"old"}}]}"#,
    );
    // Each map hashes with its own keys, so the slices come in either order
    // across these rounds.
    let both = [x, y];
    for _ in 0..32 {
        let set = Slices::from_list(&both, &PortRef::Number(80)).ready_set();
        assert_eq!(set, vec![ep("new", "10.0.0.3:80")]);
    }
}

#[test]
fn watch_events_apply_in_order() {
    let mut slices = Slices::from_list(&listed(), &http());
    let at = |v: &str| Applied::At(Some(v.to_string()));
    assert_eq!(
        slices.ready_set(),
        vec![
            ep("vllm-0", "10.244.1.5:8000"),
            ep("vllm-2", "10.244.3.9:8000")
        ]
    );
    let steps: Vec<(Applied, Vec<Endpoint>)> = vec![
        (
            at("1001"),
            vec![
                ep("vllm-0", "10.244.1.5:8000"),
                ep("vllm-1", "10.244.2.7:8000"),
                ep("vllm-2", "10.244.3.9:8000"),
            ],
        ),
        (
            at("1002"),
            vec![
                ep("vllm-0", "10.244.1.5:8000"),
                ep("vllm-1", "10.244.2.7:8000"),
                ep("vllm-2", "10.244.3.9:8000"),
            ],
        ),
        (
            at("1003"),
            vec![
                ep("vllm-0", "10.244.1.5:8000"),
                ep("vllm-1", "10.244.2.7:8000"),
                ep("vllm-2", "10.244.3.9:8000"),
            ],
        ),
        (
            at("1004"),
            vec![
                ep("vllm-1", "10.244.2.7:8000"),
                ep("vllm-2", "10.244.3.9:8000"),
            ],
        ),
        (at("1005"), vec![ep("vllm-1", "10.244.2.7:8000")]),
    ];
    let lines: Vec<&str> = WATCH.lines().collect();
    assert_eq!(lines.len(), steps.len());
    for (line, (applied, set)) in lines.iter().zip(steps) {
        assert_eq!(slices.apply(line.as_bytes(), &http()), applied, "{line}");
        assert_eq!(slices.ready_set(), set, "after {line}");
    }
    // A slice added, then deleted by name whatever its content says.
    let added = r#"{"type":"ADDED","object":{"metadata":{"name":"new","resourceVersion":"1006"},"addressType":"IPv4","ports":[{"name":"http","port":8000}],"endpoints":[{"addresses":["10.244.9.9"]}]}}"#;
    assert_eq!(slices.apply(added.as_bytes(), &http()), at("1006"));
    assert!(slices
        .ready_set()
        .contains(&ep("10.244.9.9:8000", "10.244.9.9:8000")));
    let deleted = r#"{"type":"DELETED","object":{"metadata":{"name":"new","resourceVersion":"1007"},"addressType":"IPv4"}}"#;
    assert_eq!(slices.apply(deleted.as_bytes(), &http()), at("1007"));
    assert_eq!(slices.ready_set(), vec![ep("vllm-1", "10.244.2.7:8000")]);
}

#[test]
fn error_and_unknown_events() {
    let mut slices = Slices::default();
    assert_eq!(slices.apply(GONE.trim().as_bytes(), &http()), Applied::Gone);
    let internal = r#"{"type":"ERROR","object":{"kind":"Status","status":"Failure","message":"etcdserver: request timed out","reason":"InternalError","code":500}}"#;
    match slices.apply(internal.as_bytes(), &http()) {
        Applied::Failed(m) => assert!(m.contains("500") && m.contains("etcdserver"), "{m}"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        slices.apply(b"{\"type\":\"MODIFIED\",\"obj", &http()),
        Applied::Failed(_)
    ));
    assert!(matches!(
        slices.apply(
            br#"{"type":"MODIFIED","object":{"metadata":{"name":7}}}"#,
            &http()
        ),
        Applied::Failed(_)
    ));
    assert_eq!(
        slices.apply(br#"{"type":"SOMETHING","object":{}}"#, &http()),
        Applied::At(None)
    );
    assert!(slices.ready_set().is_empty());
}

fn source(selector: &str) -> KubernetesSource {
    KubernetesSource {
        namespace: "inference".to_string(),
        selector: selector.to_string(),
        port: http(),
        api: None,
        service_account_dir: None,
    }
}

#[test]
fn list_and_watch_paths() {
    let access = Access::from_url("http://127.0.0.1:8001/", Path::new("/sa")).expect("an http URL");
    let s = source("app=vllm,tier in (a,b)");
    assert_eq!(
        slices_path(&access, &s, None),
        "/apis/discovery.k8s.io/v1/namespaces/inference/endpointslices?labelSelector=app%3Dvllm%2Ctier+in+%28a%2Cb%29"
    );
    assert_eq!(
        slices_path(&access, &s, Some("1234")),
        "/apis/discovery.k8s.io/v1/namespaces/inference/endpointslices?labelSelector=app%3Dvllm%2Ctier+in+%28a%2Cb%29&watch=1&resourceVersion=1234&allowWatchBookmarks=true&timeoutSeconds=240"
    );
    let proxied = Access::from_url("http://localhost:8001/k8s/", Path::new("/sa")).expect("URL");
    assert!(slices_path(&proxied, &s, None).starts_with("/k8s/apis/"));
}

#[test]
fn where_the_api_server_is() {
    let sa = Path::new("/sa");
    let v6 = Access::in_cluster(Some("fd00::1".into()), Some("6443".into()), sa).expect("v6");
    assert_eq!(v6.host, "fd00::1");
    assert_eq!(v6.authority, "[fd00::1]:6443");
    assert_eq!(v6.port, 6443);
    assert_eq!(v6.token_file.as_deref(), Some(Path::new("/sa/token")));
    assert_eq!(v6.ca_file.as_deref(), Some(Path::new("/sa/ca.crt")));
    let v4 = Access::in_cluster(Some("10.96.0.1".into()), None, sa).expect("v4");
    assert_eq!((v4.authority.as_str(), v4.port), ("10.96.0.1:443", 443));
    assert!(Access::in_cluster(None, Some("443".into()), sa).is_err());
    assert!(Access::in_cluster(Some("10.96.0.1".into()), Some("https".into()), sa).is_err());

    let plain = Access::from_url("http://127.0.0.1:8001", sa).expect("http");
    assert_eq!((plain.host.as_str(), plain.port), ("127.0.0.1", 8001));
    assert_eq!((plain.token_file, plain.ca_file), (None, None));
    let tls = Access::from_url("https://[fd00::2]/", sa).expect("https");
    assert_eq!((tls.host.as_str(), tls.port), ("fd00::2", 443));
    assert_eq!(tls.authority, "[fd00::2]");
    assert!(tls.token_file.is_some() && tls.ca_file.is_some());
    assert!(Access::from_url("ftp://x", sa).is_err());
    assert!(Access::from_url("http://user:pw@x", sa).is_err());

    // `service_account_dir` moves both files, for either kind of https access.
    let copied = Path::new("/etc/llm-gateway/kube");
    let outside = Access::for_api(Some("https://10.0.0.9:6443"), copied).expect("https");
    assert_eq!(
        outside.token_file.as_deref(),
        Some(copied.join("token").as_path())
    );
    assert_eq!(
        outside.ca_file.as_deref(),
        Some(copied.join("ca.crt").as_path())
    );
}

#[test]
fn a_ca_file_without_a_certificate_is_an_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("ca.crt");
    std::fs::write(&path, "not a PEM\n").expect("write");
    let e = tls_connector(&path).err().expect("refused");
    assert!(e.contains("no certificate"), "{e}");
    let missing = tls_connector(&dir.path().join("absent"))
        .err()
        .expect("refused");
    assert!(missing.contains("absent"), "{missing}");
}

#[test]
fn backoff_doubles_to_thirty_seconds() {
    let (tx, _rx) = tokio::sync::mpsc::channel(1);
    let access = Access::from_url("http://127.0.0.1:1", Path::new("/sa")).expect("URL");
    let mut w = Watcher {
        source: source("app=vllm"),
        access,
        out: tx,
        slices: Slices::default(),
        version: None,
        sent: None,
        failing: false,
        gone_again: false,
        backoff: BACKOFF_FIRST,
    };
    let delays: Vec<u64> = (0..7).map(|_| w.next_backoff().as_secs()).collect();
    assert_eq!(delays, vec![1, 2, 4, 8, 16, 30, 30]);
}

/// Reads one request head; answers it with `reply` once `go` fires.
async fn answer_one(
    listener: &TcpListener,
    heads: &tokio::sync::mpsc::UnboundedSender<String>,
    go: tokio::sync::oneshot::Receiver<()>,
    reply: &str,
) -> TcpStream {
    let (mut socket, _) = listener.accept().await.expect("accept");
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        let n = socket.read(&mut byte).await.expect("read");
        assert_eq!(n, 1, "the client hung up mid-head");
        head.push(byte[0]);
    }
    heads
        .send(String::from_utf8_lossy(&head).into_owned())
        .expect("test alive");
    let _ = go.await;
    socket.write_all(reply.as_bytes()).await.expect("write");
    socket
}

fn authorization(head: &str) -> Option<String> {
    head.lines()
        .find_map(|l| l.strip_prefix("authorization: "))
        .map(str::to_string)
}

#[tokio::test]
async fn the_token_is_sent_and_read_again_at_each_connect() {
    let dir = tempfile::tempdir().expect("tempdir");
    let token = dir.path().join("token");
    std::fs::write(&token, "first-token\n").expect("write");
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let mut access = Access::from_url(&url, Path::new("/sa")).expect("URL");
    access.token_file = Some(token.clone());

    let (heads_tx, mut heads) = tokio::sync::mpsc::unbounded_channel();
    let (go_list, list_go) = tokio::sync::oneshot::channel();
    let (_go_watch, watch_go) = tokio::sync::oneshot::channel::<()>();
    let list = r#"{"kind":"EndpointSliceList","metadata":{"resourceVersion":"7"},"items":[]}"#;
    let list_reply = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{list}",
        list.len()
    );
    let stub = tokio::spawn(async move {
        let _list = answer_one(&listener, &heads_tx, list_go, &list_reply).await;
        let watch = answer_one(&listener, &heads_tx, watch_go, "").await;
        std::future::pending::<()>().await;
        drop(watch);
    });

    let (tx, mut rx) = tokio::sync::mpsc::channel(4);
    let watcher = tokio::spawn(watch_with(source("app=vllm"), access, tx));
    let within = Duration::from_secs(10);
    let first = tokio::time::timeout(within, heads.recv())
        .await
        .expect("the list in time")
        .expect("a head");
    assert!(first.starts_with("GET /apis/discovery.k8s.io/v1/namespaces/inference/endpointslices?labelSelector=app%3Dvllm HTTP/1.1\r\n"), "{first}");
    assert_eq!(authorization(&first).as_deref(), Some("Bearer first-token"));

    // Rotated, as the kubelet does, before the watch connects.
    std::fs::write(&token, "second-token").expect("write");
    go_list.send(()).expect("stub alive");
    let found = tokio::time::timeout(within, rx.recv())
        .await
        .expect("in time");
    assert_eq!(found, Some(Found::Endpoints(Vec::new())));
    let second = tokio::time::timeout(within, heads.recv())
        .await
        .expect("the watch in time")
        .expect("a head");
    assert!(second.contains("&watch=1&resourceVersion=7&"), "{second}");
    assert_eq!(
        authorization(&second).as_deref(),
        Some("Bearer second-token")
    );

    // Dropping the receiver ends the watcher, though its watch is silent.
    drop(rx);
    tokio::time::timeout(within, watcher)
        .await
        .expect("the watcher ends when its receiver is dropped")
        .expect("no panic");
    stub.abort();
}
