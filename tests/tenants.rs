//! Tenants through the binary: who the tenant is (the key's owner, else
//! the fairness header, else `default`), its budgets refused with 429 and
//! OpenAI's rate-limit headers, its cap on requests in flight (and no
//! place leaked when a client leaves), and the tenants file reloaded like
//! the routes: a broken one keeps the version in force.

mod common;

use common::http;
use common::*;
use serde_json::{json, Value};
use std::path::PathBuf;

const FAIRNESS_ID: &str = "x-gateway-inference-fairness-id";
const CHAT: &str = "/chat/v1/chat/completions";

struct Setup {
    gw: Gateway,
    cluster: SimCluster,
    tenants_file: PathBuf,
    _dir: tempfile::TempDir,
}

fn start(tenants: &str, opts: GatewayOptions) -> Setup {
    let cluster = engines(1);
    let dir = tempfile::tempdir().expect("tempdir");
    let tenants_file = dir.path().join("tenants.yaml");
    std::fs::write(&tenants_file, tenants).expect("tenants file");
    let opts = GatewayOptions {
        extra_config: format!(
            "tenants_file: {}\n{}",
            tenants_file.display(),
            opts.extra_config
        ),
        ..opts
    };
    // `tight` (one slot) gives a load 429 to tell the budgets' refusals from.
    let tight = format!(
        "peers:\n  - {{name: e0, host: 127.0.0.1, port: {}, max_concurrency: 1}}\n",
        cluster.engines[0].port()
    );
    let gw = Gateway::start_with(
        &[("chat", route_yaml(&ports(&cluster), "")), ("tight", tight)],
        opts,
    );
    Setup {
        gw,
        cluster,
        tenants_file,
        _dir: dir,
    }
}

fn send(gw: &Gateway, tenant: &str, content: &str) -> http::Response {
    let body = json!({"model": "sim-model", "messages": [{"role": "user", "content": content}]});
    http::post_json(gw.addr, CHAT, &[(FAIRNESS_ID, tenant)], &body)
}

/// `/_tenants`' row for `name`, if it has one.
fn row(gw: &Gateway, name: &str) -> Option<Value> {
    let status = http::get(gw.addr, "/_tenants").json();
    status["tenants"]
        .as_array()
        .expect("tenants")
        .iter()
        .find(|t| t["name"] == name)
        .cloned()
}

fn in_flight(gw: &Gateway, name: &str) -> u64 {
    row(gw, name).map_or(0, |r| r["in_flight"].as_u64().expect("in_flight"))
}

#[test]
fn over_its_budget_a_tenant_gets_429_with_the_rate_limit_headers() {
    let s = start(
        "tenants:\n  metered:\n    requests_per_minute: 2\n  wordy:\n    input_tokens_per_minute: 50\n",
        GatewayOptions::default(),
    );
    let gw = &s.gw;
    // Control: under budget, both pass.
    for i in 0..2 {
        let r = send(gw, "metered", &format!("turn {i}"));
        assert_eq!(r.status(), 200, "{}", r.text());
    }
    let r = send(gw, "metered", "one too many");
    assert_eq!(r.status(), 429, "{}", r.text());
    assert_eq!(r.header("x-ratelimit-limit-requests"), Some("2"));
    assert_eq!(r.header("x-ratelimit-remaining-requests"), Some("0"));
    let reset = r.header("x-ratelimit-reset-requests").expect("reset");
    assert!(reset.ends_with('s'), "{reset}");
    let retry: u64 = r
        .header("retry-after")
        .and_then(|v| v.parse().ok())
        .expect("Retry-After in seconds");
    assert!((1..=60).contains(&retry), "{retry}");
    assert_eq!(
        r.header("x-ratelimit-limit-tokens"),
        None,
        "no token limit, no token headers"
    );
    let e = &r.json()["error"];
    assert_eq!(e["type"], "tenant_rate_limit");
    assert_eq!(e["reason"], "requests");
    assert_eq!(e["tenant"], "metered");
    // Control: another tenant is not held back by metered's budget.
    assert_eq!(send(gw, "free", "hello").status(), 200);

    // Input tokens: a prompt larger than the limit passes into an empty
    // window, and the next is refused with the token headers.
    let long = "many words ".repeat(40);
    assert_eq!(send(gw, "wordy", &long).status(), 200);
    let r = send(gw, "wordy", &long);
    assert_eq!(r.status(), 429, "{}", r.text());
    assert_eq!(r.header("x-ratelimit-limit-tokens"), Some("50"));
    let remaining: u64 = r
        .header("x-ratelimit-remaining-tokens")
        .and_then(|v| v.parse().ok())
        .expect("remaining tokens");
    assert!(remaining < 50, "{remaining}");
    assert!(r.header("x-ratelimit-reset-tokens").is_some());
    assert_eq!(r.json()["error"]["reason"], "input_tokens");

    // Counted apart from the load gates' 429s, and shown per tenant.
    let refused = |tenant: &str, reason: &str| {
        gw.metric(
            "llm_gateway_tenant_refusals_total",
            &[
                &format!("tenant=\"{tenant}\""),
                &format!("reason=\"{reason}\""),
            ],
        )
    };
    assert_eq!(refused("metered", "requests"), 1.0);
    assert_eq!(refused("wordy", "input_tokens"), 1.0);
    assert_eq!(gw.metric("llm_gateway_load_rejections_total", &[]), 0.0);
    // Control: a load 429 (the one slot of `tight` taken) is counted there,
    // and not as a tenant's refusal.
    let held = hold_stream(gw, "/tight/v1/chat/completions", "tight-held", &[]);
    let body = json!({"model": "sim-model", "messages": [{"role": "user", "content": "x"}]});
    let r = http::post_json(gw.addr, "/tight/v1/chat/completions", &[], &body);
    assert_eq!(r.status(), 429, "{}", r.text());
    assert_eq!(r.json()["error"]["type"], "concurrency_limit");
    assert_eq!(gw.metric("llm_gateway_load_rejections_total", &[]), 1.0);
    assert_eq!(gw.metric("llm_gateway_tenant_refusals_total", &[]), 2.0);
    s.cluster.engines[0].open_gate("tight-held");
    drop(held);
    let metered = row(gw, "metered").expect("metered");
    assert_eq!(metered["refusals"]["requests"], 1);
    assert_eq!(metered["remaining"]["requests"], 0);
    assert_eq!(metered["limits"]["requests_per_minute"], 2);
}

#[test]
fn the_in_flight_cap_refuses_and_every_place_comes_back() {
    let s = start(
        "tenants:\n  capped:\n    max_in_flight: 1\n",
        GatewayOptions::default(),
    );
    let gw = &s.gw;
    let held = hold_stream(gw, CHAT, "cap", &[(FAIRNESS_ID, "capped")]);
    assert_eq!(in_flight(gw, "capped"), 1);
    let r = send(gw, "capped", "a second one");
    assert_eq!(r.status(), 429, "{}", r.text());
    assert_eq!(r.json()["error"]["type"], "tenant_in_flight_limit");
    assert_eq!(r.header("retry-after"), Some("1"));
    // Control: another tenant passes while capped is at its cap.
    assert_eq!(send(gw, "other-team", "hello").status(), 200);
    // The held stream ends: its place is free again.
    s.cluster.engines[0].open_gate("cap");
    drop(held);
    wait_for("capped's place back", DEADLINE, || {
        (in_flight(gw, "capped") == 0).then_some(())
    });
    assert_eq!(send(gw, "capped", "now it passes").status(), 200);

    // A client that leaves mid-stream gives its place back too, while the
    // engine still holds the stream (so the place is not given back by the
    // stream's end, as above).
    let gone = hold_stream(gw, CHAT, "gone", &[(FAIRNESS_ID, "capped")]);
    assert_eq!(in_flight(gw, "capped"), 1);
    drop(gone);
    wait_for("the departed client's place back", DEADLINE, || {
        (in_flight(gw, "capped") == 0).then_some(())
    });
    s.cluster.engines[0].open_gate("gone");
    let gauge = gw.metric("llm_gateway_tenant_in_flight", &["tenant=\"capped\""]);
    assert_eq!(gauge, 0.0);
    assert_eq!(send(gw, "capped", "and again").status(), 200);
}

#[test]
fn a_broken_tenants_file_keeps_the_version_in_force() {
    let s = start(
        "tenants:\n  gamma:\n    requests_per_minute: 1\n",
        GatewayOptions::default(),
    );
    let gw = &s.gw;
    let limit = || row(gw, "gamma").expect("gamma")["limits"]["requests_per_minute"].clone();
    assert_eq!(limit(), 1);
    std::fs::write(
        &s.tenants_file,
        "tenants:\n  gamma:\n    requests_per_minute: lots\n",
    )
    .expect("write");
    gw.reload();
    let log = gw.log();
    assert!(
        log.contains("tenants file rejected, previous version kept")
            && log.contains("tenants.yaml:3"),
        "{log}"
    );
    assert_eq!(gw.reloads(&["result=\"error\""]), 1.0);
    assert_eq!(limit(), 1, "the previous version is in force");
    assert_eq!(send(gw, "gamma", "first").status(), 200);
    assert_eq!(send(gw, "gamma", "second").status(), 429);
    // Control: a valid edit is taken.
    std::fs::write(
        &s.tenants_file,
        "tenants:\n  gamma:\n    requests_per_minute: 5\n",
    )
    .expect("write");
    gw.reload();
    assert_eq!(limit(), 5);
    assert_eq!(send(gw, "gamma", "third").status(), 200);
}

#[test]
fn the_file_watch_follows_the_tenants_file() {
    let s = start(
        "tenants:\n  delta:\n    max_in_flight: 3\n",
        GatewayOptions {
            watch: Some(true),
            ..Default::default()
        },
    );
    let gw = &s.gw;
    std::fs::write(
        &s.tenants_file,
        "tenants:\n  delta:\n    max_in_flight: 7\n",
    )
    .expect("write");
    wait_for("the watch to reload the tenants file", DEADLINE, || {
        (row(gw, "delta").expect("delta")["limits"]["max_in_flight"] == 7).then_some(())
    });
    assert!(gw.reloads(&["trigger=\"watch\""]) >= 1.0);
}

#[test]
fn with_keys_off_the_tenant_is_the_header_else_default() {
    let s = start("", GatewayOptions::default());
    let gw = &s.gw;
    assert_eq!(send(gw, "team-h", "hi").status(), 200);
    let body = json!({"model": "sim-model", "messages": [{"role": "user", "content": "hi"}]});
    assert_eq!(http::post_json(gw.addr, CHAT, &[], &body).status(), 200);
    for name in ["team-h", "default"] {
        wait_for(&format!("{name} counted"), DEADLINE, || {
            row(gw, name)
                .filter(|r| r["last_minute"]["requests"] == 1)
                .map(drop)
        });
    }
    // Not named in the file: counted as `other` in /metrics.
    let other = gw.metric(
        "llm_gateway_tenant_tokens_total",
        &["tenant=\"other\"", "kind=\"output\""],
    );
    assert!(other > 0.0, "{other}");
    assert_eq!(
        gw.metric("llm_gateway_tenant_tokens_total", &["tenant=\"team-h\""]),
        0.0
    );
}

#[test]
fn without_a_tenants_file_no_tenant_is_tracked() {
    let cluster = engines(1);
    let gw = Gateway::start_with(
        &[("chat", route_yaml(&ports(&cluster), ""))],
        GatewayOptions::default(),
    );
    assert_eq!(send(&gw, "team-n", "hi").status(), 200);
    // Nothing to wait for: a tracked tenant's state is made at admission,
    // before the request goes on to its engine.
    let status = http::get(gw.addr, "/_tenants").json();
    assert_eq!(status["tenants"], json!([]), "{status}");
    assert_eq!(status["tenants_file"], Value::Null);
    let tokens = gw.metric("llm_gateway_tenant_tokens_total", &[]);
    assert_eq!(tokens, 0.0);
    // Control: the same request with a tenants file, even an empty one,
    // is counted.
    let s = start("", GatewayOptions::default());
    assert_eq!(send(&s.gw, "team-n", "hi").status(), 200);
    wait_for("team-n counted", DEADLINE, || {
        row(&s.gw, "team-n")
            .filter(|r| r["last_minute"]["requests"] == 1)
            .map(drop)
    });
    assert!(s.gw.metric("llm_gateway_tenant_tokens_total", &[]) > 0.0);
}

#[test]
fn with_keys_on_the_tenant_is_the_owner_and_the_header_is_not_read() {
    let keys = tempfile::tempdir().expect("keys");
    let key_file = keys.path().join("api-keys");
    std::fs::write(&key_file, "sk-tenant-secret:owner-a\n").expect("key file");
    let s = start(
        "tenants:\n  owner-a:\n    requests_per_minute: 100\n",
        GatewayOptions {
            env: vec![(
                "LLM_GATEWAY_API_KEYS_FILE".into(),
                key_file.display().to_string(),
            )],
            ..Default::default()
        },
    );
    let gw = &s.gw;
    let body = json!({"model": "sim-model", "messages": [{"role": "user", "content": "hi"}]});
    let headers = [
        ("authorization", "Bearer sk-tenant-secret"),
        (FAIRNESS_ID, "spoofed"),
    ];
    assert_eq!(
        http::post_json(gw.addr, CHAT, &headers, &body).status(),
        200
    );
    wait_for("owner-a counted", DEADLINE, || {
        row(gw, "owner-a")
            .filter(|r| r["last_minute"]["requests"] == 1)
            .map(drop)
    });
    let status = http::get(gw.addr, "/_tenants").text();
    assert!(!status.contains("spoofed"), "{status}");
    assert!(!status.contains("sk-tenant-secret"), "{status}");
    let metrics = http::get(gw.admin, "/metrics").text();
    assert!(!metrics.contains("sk-tenant-secret"));
    assert!(
        gw.metric("llm_gateway_tenant_tokens_total", &["tenant=\"owner-a\""]) > 0.0,
        "a named tenant has its own label"
    );
}

/// `/_tenants` from 127.0.0.2: not loopback for the gateway.
fn tenants_from_elsewhere(gw: &Gateway) -> http::Response {
    use std::net::{IpAddr, Ipv4Addr};
    http::Conn::open_from(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2)), gw.addr).request(
        "GET",
        "/_tenants",
        &[],
        b"",
    )
}

#[test]
fn the_tenants_endpoint_is_gated_like_the_other_status_endpoints() {
    let s = start(
        "tenants:\n  team:\n",
        GatewayOptions {
            extra_config: "status_endpoints: loopback\n".into(),
            ..Default::default()
        },
    );
    assert_eq!(tenants_from_elsewhere(&s.gw).status(), 403);
    // Control: from loopback it answers, the file's path shown.
    let local = http::get(s.gw.addr, "/_tenants");
    assert_eq!(local.status(), 200);
    let shown = local.json()["tenants_file"].clone();
    assert_eq!(shown, s.tenants_file.display().to_string());

    // Open: anyone reads it, but only loopback sees where the file lies.
    let open = start("tenants:\n  team:\n", GatewayOptions::default());
    let r = tenants_from_elsewhere(&open.gw);
    assert_eq!(r.status(), 200, "{}", r.text());
    assert_eq!(r.json()["tenants_file"], "[redacted]");
    assert_eq!(r.json()["tenants"][0]["name"], "team");
}

#[test]
fn check_reads_the_tenants_file_and_names_a_mistake_by_its_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let routes = dir.path().join("routes");
    std::fs::create_dir(&routes).expect("routes");
    let tenants_file = dir.path().join("tenants.yaml");
    let config = dir.path().join("gateway.yaml");
    std::fs::write(
        &config,
        format!("tenants_file: {}\n", tenants_file.display()),
    )
    .expect("gateway.yaml");
    let check = || {
        std::process::Command::new(gateway_bin())
            .args(["check", "--config"])
            .arg(&config)
            .arg("--routes")
            .arg(&routes)
            .env_remove("LLM_GATEWAY_API_KEYS_FILE")
            .output()
            .expect("run check")
    };
    std::fs::write(&tenants_file, "tenants:\n  a:\n    class: urgent\n").expect("write");
    let out = check();
    let said = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success(), "{said}");
    assert!(said.contains("tenants.yaml:3"), "{said}");
    // Control: the same file put right passes.
    std::fs::write(&tenants_file, "tenants:\n  a:\n    class: batch\n").expect("write");
    let out = check();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(said.contains("1 tenant(s) named"), "{said}");
}

/// Two replicas of one gateway on one engine, with `extra` in gateway.yaml
/// and the same tenants file.
fn two_replicas(tenants: &str, extra: &str) -> (Setup, Gateway) {
    let first = start(
        tenants,
        GatewayOptions {
            extra_config: extra.to_string(),
            ..Default::default()
        },
    );
    let route = route_yaml(&ports(&first.cluster), "");
    let second = Gateway::start_with(
        &[("chat", route)],
        GatewayOptions {
            extra_config: format!("tenants_file: {}\n{extra}", first.tenants_file.display()),
            ..Default::default()
        },
    );
    (first, second)
}

fn requests_seen(gw: &Gateway, name: &str) -> Value {
    row(gw, name).map_or(json!(0), |r| r["last_minute"]["requests"].clone())
}

#[test]
fn with_redis_two_replicas_hold_one_budget() {
    let redis = common::redis::Redis::start();
    let store = format!(
        "session_store:\n  kind: redis\n  url: {}\n  timeout: 200ms\n",
        redis.url()
    );
    let tenants = "tenants:\n  shared:\n    requests_per_minute: 4\n";
    let (a, b) = two_replicas(tenants, &store);
    for i in 0..2 {
        assert_eq!(send(&a.gw, "shared", &format!("a{i}")).status(), 200);
    }
    wait_for("b to see a's two requests", DEADLINE, || {
        (requests_seen(&b, "shared") == 2).then_some(())
    });
    for i in 0..2 {
        assert_eq!(send(&b, "shared", &format!("b{i}")).status(), 200);
    }
    let r = send(&b, "shared", "the fifth, on b");
    assert_eq!(r.status(), 429, "{}", r.text());
    assert_eq!(r.header("x-ratelimit-remaining-requests"), Some("0"));
    wait_for("a to see b's two requests", DEADLINE, || {
        (requests_seen(&a.gw, "shared") == 4).then_some(())
    });
    assert_eq!(send(&a.gw, "shared", "the fifth, on a").status(), 429);

    // Control: without the store each replica keeps its own window, and
    // the fifth request of the minute passes on the second replica.
    let (c, d) = two_replicas(tenants, "");
    for i in 0..2 {
        assert_eq!(send(&c.gw, "shared", &format!("c{i}")).status(), 200);
        assert_eq!(send(&d, "shared", &format!("d{i}")).status(), 200);
    }
    assert_eq!(send(&d, "shared", "the fifth, on d").status(), 200);
}
