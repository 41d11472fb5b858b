//! Engines found by name while the gateway runs (issue 33): a real DNS
//! server on loopback (dnsmasq, `common::dns`) that the test rewrites, the
//! gateway pointed at it through `resolver:` in gateway.yaml, and simulated
//! engines on several loopback addresses (127.0.0.2, .3, …) behind one
//! port, as the pods of a headless Service. No reload is ever sent: every
//! change is the DNS server's. The EndpointSlice tests put a stub API
//! server where the DNS server was: `common::kube` over plain HTTP, and one
//! below over TLS, with a CA made per test and a service account directory.

mod common;

use common::certs::{leaf, new_ca, TestCa};
use common::dns::Dnsmasq;
use common::http;
use common::kube::{slice, slice_list, KubeApi};
use common::*;
use llm_gateway_sim::spawn_engines_on;
use serde_json::Value;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

fn ip(last: u8) -> IpAddr {
    IpAddr::from([127, 0, 0, last])
}

/// One engine per loopback address, all on one free port.
fn engines_at(lasts: &[u8]) -> (SimCluster, u16) {
    let port = free_port();
    let addrs = lasts
        .iter()
        .map(|&l| SocketAddr::new(ip(l), port))
        .collect();
    let cluster = spawn_engines_on(addrs, vec![EngineConfig::default(); lasts.len()])
        .expect("simulated engines on loopback addresses");
    (cluster, port)
}

fn gateway(dns: &Dnsmasq, route: String) -> Gateway {
    gateway_resolving(route, dns.gateway_config())
}

/// The gateway serving `route` as `chat`, with gateway.yaml's `resolver`.
fn gateway_resolving(route: String, resolver: String) -> Gateway {
    Gateway::start_with(
        &[("chat", route)],
        GatewayOptions {
            extra_config: resolver,
            ..Default::default()
        },
    )
}

/// A `resolver:` asking only `server`, and again only every minute: longer
/// than a test waits, so what makes the gateway look sooner is not the TTL.
fn asking_every_minute(server: SocketAddr) -> String {
    format!("resolver:\n  nameservers: [\"{server}\"]\n  min_ttl: 60s\n  max_ttl: 60s\n")
}

fn health(gw: &Gateway) -> Value {
    let r = http::get(gw.addr, "/chat/_health_status");
    assert_eq!(r.status(), 200, "{}", r.text());
    r.json()
}

/// Each peer's name and address (null until resolved), per `/_health_status`.
fn peers(gw: &Gateway) -> Vec<(String, Option<String>)> {
    health(gw)["peers"]
        .as_array()
        .expect("peers")
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap_or_default().to_string(),
                p["address"].as_str().map(str::to_string),
            )
        })
        .collect()
}

/// A turn of `session`; the peer that served it, how it was placed, and
/// the prompt tokens the engine had cached.
fn turn(gw: &Gateway, session: &str, n: usize) -> (String, String, u64) {
    // A long shared start, so a turn finds the previous one's prefix
    // cached on the engine that served it.
    let body = chat_body(
        session,
        &format!("{session}: {} turn {n}", "x".repeat(4000)),
        false,
    );
    let r = http::post_json(gw.addr, "/chat/v1/chat/completions", &[], &body);
    assert_eq!(r.status(), 200, "{}", r.text());
    let cached = r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or(0);
    (
        r.header("x-routed-peer").unwrap_or_default().to_string(),
        r.header("x-routed-mode").unwrap_or_default().to_string(),
        cached,
    )
}

fn served(cluster: &SimCluster, i: usize) -> u64 {
    cluster.engines[i]
        .stats
        .requests
        .load(std::sync::atomic::Ordering::Relaxed)
}

/// Turn `n` of each session, whose earlier turns went to `home`: the ones
/// at `gone` move elsewhere (not sticky), every other stays where it was.
fn only_the_gones_sessions_move(
    gw: &Gateway,
    sessions: &[String],
    home: &[String],
    gone: &str,
    n: usize,
) {
    for (s, h) in sessions.iter().zip(home) {
        let (peer, mode, _) = turn(gw, s, n);
        if h == gone {
            assert_ne!(peer, gone, "{s} left the engine that went");
            assert_ne!(mode, "sticky", "{s} lost its engine");
        } else {
            assert_eq!(
                (&peer, mode.as_str()),
                (h, "sticky"),
                "{s} keeps its engine"
            );
        }
    }
}

#[test]
fn a_name_that_resolves_late_joins_and_one_that_never_does_blocks_nothing() {
    let (cluster, port) = engines_at(&[1, 2]);
    let dns = Dnsmasq::start(&[]);
    let route = format!(
        "peers:\n  - {{name: fixed, host: 127.0.0.1, port: {port}}}\n  - {{name: late, host: late.test, port: {port}}}\n  - {{name: never, host: never.test, port: {port}}}\n"
    );
    let gw = gateway(&dns, route);
    let reloads = gw.reloads(&[]);

    // Neither name resolves: both are reported, and the fixed peer serves.
    let h = health(&gw);
    let hosts = h["discovery"]["hosts"].as_array().expect("hosts").clone();
    assert_eq!(hosts.len(), 2, "{h}");
    for host in &hosts {
        assert_eq!(host["resolved"], false, "{h}");
        assert!(host["last_error"].is_string(), "{h}");
    }
    for n in 0..6 {
        let (peer, _, _) = turn(&gw, &format!("s{n}"), 0);
        assert_eq!(peer, "fixed");
    }
    assert_eq!(served(&cluster, 1), 0);

    // late.test appears in the DNS: its peer gets an address and, as the
    // less loaded engine, new sessions; never.test is still reported and
    // still blocks nothing.
    dns.set(&[("late.test", ip(2))]);
    wait_for("late.test to resolve", DEADLINE, || {
        peers(&gw)
            .iter()
            .any(|(name, addr)| name == "late" && addr.is_some())
            .then_some(())
    });
    let late: Vec<String> = (0..8).map(|n| turn(&gw, &format!("n{n}"), 0).0).collect();
    assert!(late.iter().any(|p| p == "late"), "{late:?}");
    assert!(served(&cluster, 1) > 0);
    let h = health(&gw);
    let never = h["discovery"]["hosts"]
        .as_array()
        .and_then(|hs| hs.iter().find(|x| x["host"] == "never.test").cloned())
        .expect("never.test reported");
    assert_eq!(never["resolved"], false, "{h}");
    assert!(never["last_error"].is_string(), "{h}");
    let never_peer = &h["peers"].as_array().expect("peers")[2];
    assert_eq!(never_peer["name"], "never");
    assert!(never_peer["address"].is_null(), "{h}");
    assert_eq!(
        never_peer["ready"], false,
        "a peer without an address is not ready: {h}"
    );
    assert_eq!(h["peers"][1]["ready"], true, "{h}");
    let metrics = http::get(gw.admin, "/metrics").text();
    assert!(
        metrics.contains("llm_gateway_peer_ready{peer=\"never\""),
        "{metrics}"
    );
    assert_eq!(
        metric_sum(&metrics, "llm_gateway_peer_ready", &["peer=never"]),
        0.0,
        "{metrics}"
    );
    assert_eq!(
        metric_sum(&metrics, "llm_gateway_peer_ready", &["peer=late"]),
        1.0
    );
    assert_eq!(gw.reloads(&[]), reloads, "no reload was needed");
}

#[test]
fn an_address_that_changes_moves_its_sessions_and_starts_them_cold() {
    let (cluster, port) = engines_at(&[2, 3]);
    let dns = Dnsmasq::start(&[("engine.test", ip(2))]);
    let gw = gateway(
        &dns,
        format!("peers:\n  - {{name: engine, host: engine.test, port: {port}}}\n"),
    );
    let at = |want: &str| {
        wait_for(&format!("engine.test at {want}"), DEADLINE, || {
            peers(&gw)
                .iter()
                .any(|(_, addr)| addr.as_deref() == Some(want))
                .then_some(())
        })
    };
    at(&format!("127.0.0.2:{port}"));

    // Two turns on 127.0.0.2: the second one warm.
    let (_, mode, _) = turn(&gw, "s", 1);
    assert_eq!(mode, "new");
    let (_, mode, cached) = turn(&gw, "s", 2);
    assert_eq!(mode, "sticky");
    assert!(
        cached > 0,
        "the second turn is warm on the engine that served the first"
    );
    assert_eq!((served(&cluster, 0), served(&cluster, 1)), (2, 0));

    // The pod restarts elsewhere: same name, new address, empty cache.
    dns.set(&[("engine.test", ip(3))]);
    at(&format!("127.0.0.3:{port}"));
    let (peer, mode, cached) = turn(&gw, "s", 3);
    assert_eq!(peer, "engine");
    assert_eq!(
        (served(&cluster, 0), served(&cluster, 1)),
        (2, 1),
        "the turn went to the new address"
    );
    assert_ne!(mode, "sticky", "its binding went with the old address");
    assert_eq!(cached, 0, "and the engine there had none of its cache");
    // From there it is sticky again.
    let (_, mode, cached) = turn(&gw, "s", 4);
    assert_eq!(mode, "sticky");
    assert!(cached > 0);
}

#[test]
fn a_headless_name_gives_a_peer_per_address_and_one_removed_moves_only_its_sessions() {
    let (cluster, port) = engines_at(&[2, 3, 4]);
    let pods = [
        ("pool.test", ip(2)),
        ("pool.test", ip(3)),
        ("pool.test", ip(4)),
    ];
    let dns = Dnsmasq::start(&pods);
    let gw = gateway(
        &dns,
        format!("peers_from: {{dns: pool.test, port: {port}, max_concurrency: 8}}\n"),
    );
    let want: Vec<String> = [2, 3, 4]
        .iter()
        .map(|l| format!("127.0.0.{l}:{port}"))
        .collect();
    wait_for("three peers", DEADLINE, || {
        let names: Vec<String> = peers(&gw).into_iter().map(|(n, _)| n).collect();
        (names == want).then_some(())
    });
    let h = health(&gw);
    assert_eq!(h["discovery"]["peers_from"]["endpoints"], 3, "{h}");

    // Sessions spread over the three by load; each stays put.
    let sessions: Vec<String> = (0..9).map(|n| format!("s{n}")).collect();
    let home: Vec<String> = sessions.iter().map(|s| turn(&gw, s, 1).0).collect();
    for w in &want {
        assert!(home.contains(w), "every engine gets sessions: {home:?}");
    }
    for (s, h) in sessions.iter().zip(&home) {
        assert_eq!(&turn(&gw, s, 2).0, h);
    }

    // One pod goes: two peers, its sessions move, the others stay.
    let gone = &want[1];
    dns.set(&[pods[0], pods[2]]);
    let removed_at = std::time::Instant::now();
    wait_for("two peers", DEADLINE, || {
        (peers(&gw).len() == 2).then_some(())
    });
    eprintln!(
        "figure: address gone from the DNS -> peer gone in {} ms (max_ttl 1s)",
        removed_at.elapsed().as_millis()
    );
    let before_gone = served(&cluster, 1);
    only_the_gones_sessions_move(&gw, &sessions, &home, gone, 3);
    assert_eq!(
        served(&cluster, 1),
        before_gone,
        "nothing more reached the removed pod"
    );

    // It comes back: a peer again, with none of the moved sessions.
    dns.set(&pods);
    wait_for("three peers again", DEADLINE, || {
        (peers(&gw).len() == 3).then_some(())
    });
    for (s, h) in sessions.iter().zip(&home) {
        if h == gone {
            assert_ne!(&turn(&gw, s, 4).0, gone, "{s} stays where it moved");
        }
    }
}

#[test]
fn a_refused_connection_looks_the_name_up_again_at_once() {
    let (cluster, port) = engines_at(&[2, 3]);
    let dns = Dnsmasq::start(&[("engine.test", ip(2))]);
    // Looked up again only every minute, longer than any wait below: what
    // makes the gateway look sooner is the refused connection.
    let gw = gateway_resolving(
        format!("peers:\n  - {{name: engine, host: engine.test, port: {port}}}\n"),
        asking_every_minute(dns.addr),
    );
    let address = |gw: &Gateway| peers(gw)[0].1.clone();
    assert_eq!(address(&gw), Some(format!("127.0.0.2:{port}")));
    turn(&gw, "s", 1);

    // The engine moves in the DNS. Control: while the old address still
    // answers, the gateway keeps using it (its next look is a minute away).
    dns.set(&[("engine.test", ip(3))]);
    turn(&gw, "s", 2);
    assert_eq!((served(&cluster, 0), served(&cluster, 1)), (2, 0));
    assert_eq!(address(&gw), Some(format!("127.0.0.2:{port}")));

    // The old engine goes away: the first refused connection has the name
    // looked up again, and the next turn reaches the new address.
    cluster.engines[0].shutdown();
    let body = chat_body("s", "after the move", false);
    let refused = http::post_json(gw.addr, "/chat/v1/chat/completions", &[], &body);
    assert_ne!(refused.status(), 200, "{}", refused.text());
    let refused_at = std::time::Instant::now();
    wait_for("the new address", DEADLINE, || {
        (address(&gw) == Some(format!("127.0.0.3:{port}"))).then_some(())
    });
    // A figure for BENCHMARKS.md (`--nocapture`), not a bound: polled every 20 ms.
    eprintln!(
        "figure: refused connection -> new address in {} ms",
        refused_at.elapsed().as_millis()
    );
    let (peer, _, cached) = turn(&gw, "s", 3);
    assert_eq!(peer, "engine");
    assert_eq!(served(&cluster, 1), 1);
    assert_eq!(cached, 0);
}

#[test]
fn endpoint_slices_give_a_peer_per_ready_pod_and_a_broken_watch_resumes() {
    let (cluster, port) = engines_at(&[2, 3, 4]);
    let a = |v, ready1| {
        slice(
            "vllm-a",
            v,
            &[
                ("vllm-0", "127.0.0.2", true),
                ("vllm-1", "127.0.0.3", ready1),
            ],
            port,
        )
    };
    let b = slice("vllm-b", 98, &[("vllm-2", "127.0.0.4", true)], port);
    let api = KubeApi::start(&slice_list(100, &[a(99, false), b]));
    let gw = Gateway::start(&[(
        "chat",
        format!(
            "peers_from:\n  kubernetes: {{namespace: llm, selector: \"app=vllm\", port: http, api: \"{}\"}}\n  max_concurrency: 8\n",
            api.url
        ),
    )]);
    let names = |gw: &Gateway| -> Vec<String> { peers(gw).into_iter().map(|(n, _)| n).collect() };
    let expect = |gw: &Gateway, want: &[&str]| {
        wait_for(&format!("peers {want:?}"), DEADLINE, || {
            (names(gw) == want).then_some(())
        })
    };
    // The list: the two ready pods, named after themselves.
    expect(&gw, &["vllm-0", "vllm-2"]);
    wait_for("the watch", DEADLINE, || {
        (api.open_watches() == 1).then_some(())
    });
    let sessions: Vec<String> = (0..6).map(|n| format!("s{n}")).collect();
    let home: Vec<String> = sessions.iter().map(|s| turn(&gw, s, 1).0).collect();
    assert!(
        home.contains(&"vllm-0".to_string()) && home.contains(&"vllm-2".to_string()),
        "{home:?}"
    );
    assert_eq!(served(&cluster, 1), 0, "a pod not ready gets nothing");

    // vllm-1 becomes ready: it joins, and new sessions reach it.
    api.send("MODIFIED", &a(101, true));
    let sent_at = std::time::Instant::now();
    expect(&gw, &["vllm-0", "vllm-1", "vllm-2"]);
    eprintln!(
        "figure: EndpointSlice event -> peer joined in {} ms",
        sent_at.elapsed().as_millis()
    );
    let newcomers: Vec<String> = (0..6).map(|n| turn(&gw, &format!("n{n}"), 1).0).collect();
    assert!(newcomers.iter().any(|p| p == "vllm-1"), "{newcomers:?}");

    // vllm-2's slice is deleted: it leaves, its sessions move, the others stay.
    api.send(
        "DELETED",
        &slice("vllm-b", 102, &[("vllm-2", "127.0.0.4", true)], port),
    );
    expect(&gw, &["vllm-0", "vllm-1"]);
    let before = served(&cluster, 2);
    only_the_gones_sessions_move(&gw, &sessions, &home, "vllm-2", 2);
    assert_eq!(served(&cluster, 2), before);

    // The watch breaks: the gateway watches again from the last version it
    // saw (the deletion's, 102), without listing again, and what comes
    // then still applies.
    let lists = |api: &KubeApi| {
        api.targets()
            .iter()
            .filter(|t| !t.contains("watch=1"))
            .count()
    };
    assert_eq!(lists(&api), 1);
    api.break_watches();
    wait_for("the watch to resume", DEADLINE, || {
        (api.open_watches() == 1).then_some(())
    });
    let resumed = api.targets().last().cloned().unwrap_or_default();
    assert!(resumed.contains("watch=1"), "{resumed}");
    assert!(resumed.contains("resourceVersion=102&"), "{resumed}");
    assert_eq!(
        lists(&api),
        1,
        "resumed, not listed again: {:?}",
        api.targets()
    );
    api.send(
        "MODIFIED",
        &slice(
            "vllm-a",
            103,
            &[
                ("vllm-0", "127.0.0.2", false),
                ("vllm-1", "127.0.0.3", true),
            ],
            port,
        ),
    );
    expect(&gw, &["vllm-1"]);
    let h = health(&gw);
    assert_eq!(h["discovery"]["peers_from"]["endpoints"], 1, "{h}");
}

#[test]
fn a_name_server_that_never_answers_delays_the_start_by_its_bound_and_blocks_no_listed_peer() {
    let (cluster, port) = engines_at(&[1]);
    // A UDP socket that reads nothing and answers nothing: each lookup
    // waits out the resolver's timeouts.
    let silent = std::net::UdpSocket::bind("127.0.0.1:0").expect("udp");
    let gw = gateway_resolving(
        format!("peers:\n  - {{name: fixed, host: 127.0.0.1, port: {port}}}\n  - {{name: named, host: engine.test, port: {port}}}\n"),
        format!("resolver:\n  nameservers: [\"{}\"]\n", silent.local_addr().expect("addr")),
    );
    for n in 0..4 {
        assert_eq!(turn(&gw, &format!("s{n}"), 0).0, "fixed");
    }
    assert_eq!(served(&cluster, 0), 4);
    wait_for("the lookup's failure reported", DEADLINE, || {
        let h = health(&gw);
        let host = h["discovery"]["hosts"][0].clone();
        (host["resolved"] == false && host["last_error"].is_string()).then_some(())
    });
    assert!(gw.log().contains("first lookups took over"), "{}", gw.log());
}

// ---- the API server over TLS, with the account's token and CA ----

/// What an API server on 127.0.0.1 serves: a certificate for that address
/// (the name the gateway checks is the api URL's host), signed by `ca`.
fn server_config(ca: &TestCa) -> Arc<rustls::ServerConfig> {
    let (cert, key) = leaf(ca, "127.0.0.1", rcgen::ExtendedKeyUsagePurpose::ServerAuth);
    let key = rustls_pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into());
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_no_client_auth()
        .with_single_cert(vec![cert.der().clone()], key)
        .expect("the server's certificate and key");
    Arc::new(config)
}

/// A directory laid out as the service account's mount.
fn account(token: &str, ca_pem: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("token"), format!("{token}\n")).expect("token");
    std::fs::write(dir.path().join("ca.crt"), ca_pem).expect("ca.crt");
    dir
}

/// Replaces `name` in `dir` by rename, as the kubelet swaps a projected
/// volume's files: a reader sees the old file or the new one, never half.
fn replace(dir: &std::path::Path, name: &str, text: &str) {
    let next = dir.join(format!(".{name}.next"));
    std::fs::write(&next, text).expect("write");
    std::fs::rename(&next, dir.join(name)).expect("rename");
}

fn tls_route(api: &KubeApi, account: &std::path::Path) -> String {
    format!(
        "peers_from:\n  kubernetes: {{namespace: llm, selector: \"app=vllm\", port: http, api: \"{}\", service_account_dir: \"{}\"}}\n  max_concurrency: 8\n",
        api.url,
        account.display()
    )
}

fn two_pods(port: u16) -> Value {
    slice_list(
        100,
        &[slice(
            "vllm-a",
            99,
            &[("vllm-0", "127.0.0.2", true), ("vllm-1", "127.0.0.3", true)],
            port,
        )],
    )
}

#[test]
fn endpoint_slices_over_tls_use_the_accounts_ca_and_token_and_a_resumed_watch_the_rotated_token() {
    let (cluster, port) = engines_at(&[2, 3]);
    let ca = new_ca("test cluster CA");
    let api = KubeApi::start_tls(&two_pods(port), server_config(&ca));
    let account = account("token-one", &ca.pem);
    let gw = Gateway::start(&[("chat", tls_route(&api, account.path()))]);
    let want = vec![
        ("vllm-0".to_string(), Some(format!("127.0.0.2:{port}"))),
        ("vllm-1".to_string(), Some(format!("127.0.0.3:{port}"))),
    ];
    wait_for("the pods as peers", DEADLINE, || {
        (peers(&gw) == want).then_some(())
    });
    wait_for("the watch", DEADLINE, || {
        (api.open_watches() == 1).then_some(())
    });
    let served: Vec<String> = (0..6).map(|n| turn(&gw, &format!("s{n}"), 1).0).collect();
    assert!(
        served.iter().all(|p| p == "vllm-0" || p == "vllm-1"),
        "{served:?}"
    );
    assert_eq!(
        cluster_served(&cluster),
        6,
        "the engines behind the pods served the turns"
    );

    // The list, then the watch from its version, each with the token.
    let bearer = |t: &str| Some(format!("Bearer {t}"));
    let seen = api.seen();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert!(!seen[0].0.contains("watch=1"), "{seen:?}");
    assert!(
        seen[1].0.contains("watch=1&resourceVersion=100&"),
        "{seen:?}"
    );
    assert!(
        seen.iter().all(|(_, auth)| *auth == bearer("token-one")),
        "{seen:?}"
    );

    // The kubelet rotates the token; the watch breaks; the watch that
    // resumes it (from the same version, not a new list) carries the new one.
    replace(account.path(), "token", "token-two\n");
    api.break_watches();
    wait_for("the watch to resume", DEADLINE, || {
        (api.open_watches() == 1).then_some(())
    });
    let seen = api.seen();
    assert_eq!(seen.len(), 3, "one more request, a watch: {seen:?}");
    assert!(
        seen[2].0.contains("watch=1&resourceVersion=100&"),
        "{seen:?}"
    );
    assert_eq!(seen[2].1, bearer("token-two"), "{seen:?}");
    assert_eq!(api.refused(), 0);
    assert_eq!(peers(&gw), want, "the peers stayed through the break");
}

fn cluster_served(cluster: &SimCluster) -> u64 {
    (0..cluster.engines.len()).map(|i| served(cluster, i)).sum()
}

#[test]
fn an_api_server_the_accounts_ca_did_not_sign_gets_no_request_and_its_pods_join_once_the_ca_is_right(
) {
    let (_cluster, port) = engines_at(&[2, 3]);
    let ca = new_ca("test cluster CA");
    let other = new_ca("another cluster's CA");
    let api = KubeApi::start_tls(&two_pods(port), server_config(&ca));
    let account = account("token-one", &other.pem);
    let gw = Gateway::start(&[("chat", tls_route(&api, account.path()))]);
    let error = wait_for("the failure reported", DEADLINE, || {
        health(&gw)["discovery"]["peers_from"]["last_error"]
            .as_str()
            .map(str::to_string)
    });
    assert!(
        error.contains("invalid peer certificate") && error.contains("UnknownIssuer"),
        "{error}"
    );
    let h = health(&gw);
    assert_eq!(
        h["discovery"]["peers_from"]["endpoints"],
        Value::Null,
        "{h}"
    );
    assert!(
        peers(&gw).iter().all(|(_, addr)| addr.is_none()),
        "{:?}",
        peers(&gw)
    );
    assert!(api.refused() >= 1, "the gateway did connect");
    assert_eq!(
        api.seen(),
        vec![],
        "no request, so no token, reached a server its CA does not vouch for"
    );

    // Control: the CA is read at each connect, so the right one copied in
    // lets the next attempt through, without a reload.
    replace(account.path(), "ca.crt", &ca.pem);
    wait_for("the pods as peers", DEADLINE, || {
        (peers(&gw).len() == 2 && peers(&gw).iter().all(|(_, a)| a.is_some())).then_some(())
    });
    let h = health(&gw);
    assert_eq!(
        h["discovery"]["peers_from"]["last_error"],
        Value::Null,
        "{h}"
    );
    assert!(api
        .seen()
        .iter()
        .all(|(_, auth)| auth.as_deref() == Some("Bearer token-one")));
}

#[test]
fn a_reload_that_adds_a_named_peer_has_it_looked_up_at_once() {
    let (_cluster, port) = engines_at(&[1, 2]);
    let dns = Dnsmasq::start(&[("engine.test", ip(2))]);
    let fixed = format!("peers:\n  - {{name: fixed, host: 127.0.0.1, port: {port}}}\n");
    // The route's next scheduled look is a minute away, longer than the
    // wait below: only the reload can have the new name looked up.
    let gw = gateway_resolving(fixed.clone(), asking_every_minute(dns.addr));
    assert_eq!(peers(&gw).len(), 1);
    gw.write_route(
        "chat",
        &format!("{fixed}  - {{name: named, host: engine.test, port: {port}}}\n"),
    );
    gw.reload();
    wait_for("the added name resolved", DEADLINE, || {
        (peers(&gw).get(1)?.1.as_deref() == Some(&format!("127.0.0.2:{port}"))).then_some(())
    });
}

/// A `peers_from` name with no address at start (a Service with no ready
/// pod yet): the route loads, answers 503, and serves once the name has an
/// address, with no reload. Control: a name that resolves at start serves
/// at once.
#[test]
fn a_peers_from_name_with_no_address_yet_answers_503_until_it_has_one() {
    let (_cluster, port) = engines_at(&[2]);
    let dns = Dnsmasq::start(&[("ready.test", ip(2))]);
    let route = |name: &str| format!("peers_from: {{dns: {name}, port: {port}}}\n");
    let gw = Gateway::start_with(
        &[
            ("chat", route("later.test")),
            ("ready", route("ready.test")),
        ],
        GatewayOptions {
            extra_config: dns.gateway_config(),
            ..Default::default()
        },
    );
    let ask = |route: &str| {
        http::post_json(
            gw.addr,
            &format!("/{route}/v1/chat/completions"),
            &[],
            &chat_body("s", "hi", false),
        )
    };
    let r = ask("chat");
    assert_eq!(r.status(), 503, "{}", r.text());
    let error = &r.json()["error"];
    assert_eq!(error["type"], "no_healthy_upstream", "{error}");
    assert!(
        error["message"]
            .as_str()
            .is_some_and(|m| m.contains("has no peers")),
        "{error}"
    );
    assert_eq!(
        ask("ready").status(),
        200,
        "control: a resolved name serves"
    );
    let reloads = gw.reloads(&[]);
    dns.set(&[("ready.test", ip(2)), ("later.test", ip(2))]);
    wait_for("the name's pod to serve", DEADLINE, || {
        (ask("chat").status() == 200).then_some(())
    });
    assert_eq!(gw.reloads(&[]), reloads, "no reload was needed");
}

/// A name in the hosts file (`resolver.hosts_file`, `/etc/hosts` unless
/// set) follows the file as glibc does: an edit moves its peer and a name
/// added later joins, at the next lookup pass, with no reload. The DNS
/// server knows neither name, so only the file can have moved them. The
/// control: while the file stays as it is, its name keeps its address
/// through lookup passes (seen: a name the DNS server moves meanwhile).
#[test]
fn an_edited_hosts_file_is_seen_at_the_next_lookup() {
    let (cluster, port) = engines_at(&[2, 3, 4, 5]);
    let dns = Dnsmasq::start(&[("other.test", ip(4))]);
    let dir = tempfile::tempdir().expect("tempdir");
    let hosts = dir.path().join("hosts");
    std::fs::write(&hosts, "# written by the test\n127.0.0.2 engine.test\n").expect("hosts");
    let route = format!(
        "peers:\n  - {{name: engine, host: engine.test, port: {port}}}\n  - {{name: late, host: late.test, port: {port}}}\n  - {{name: other, host: other.test, port: {port}}}\n"
    );
    let gw = gateway_resolving(
        route,
        format!(
            "resolver:\n  nameservers: [\"{}\"]\n  min_ttl: 200ms\n  max_ttl: 500ms\n  hosts_file: {}\n",
            dns.addr,
            hosts.display()
        ),
    );
    let reloads = gw.reloads(&[]);
    let address = |peer: &str| {
        peers(&gw)
            .into_iter()
            .find(|(name, _)| name == peer)
            .and_then(|(_, addr)| addr)
    };
    let at = |ip: u8| Some(format!("127.0.0.{ip}:{port}"));
    assert_eq!(address("engine"), at(2), "from the hosts file at start");
    assert_eq!(address("late"), None, "in neither the file nor the DNS");

    // Control: lookup passes go on (the DNS moves other.test and the
    // gateway follows), and the unchanged file keeps engine.test where it
    // was.
    dns.set(&[("other.test", ip(5))]);
    wait_for("other.test's move in the DNS", DEADLINE, || {
        (address("other") == at(5)).then_some(())
    });
    assert_eq!(address("engine"), at(2));
    assert_eq!(address("late"), None);

    // The file edited in place: engine.test moves, late.test is added.
    std::fs::write(
        &hosts,
        "# written by the test\n127.0.0.3 engine.test\n127.0.0.4 late.test\n",
    )
    .expect("hosts");
    wait_for("the edited hosts file", DEADLINE, || {
        (address("engine") == at(3) && address("late") == at(4)).then_some(())
    });
    // Requests reach the engine at the new address, none the old one.
    let peers_served: Vec<String> = (0..12).map(|n| turn(&gw, &format!("h{n}"), 0).0).collect();
    assert!(
        peers_served.iter().any(|p| p == "engine"),
        "{peers_served:?}"
    );
    assert!(served(&cluster, 1) > 0, "the engine at 127.0.0.3 served");
    assert_eq!(served(&cluster, 0), 0, "nothing went to 127.0.0.2");
    assert_eq!(gw.reloads(&[]), reloads, "no reload was needed");
}
