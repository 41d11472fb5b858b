//! The admin listener behind a bearer token (issue 44, item 6), through
//! the real binary: `admin: {token_file, open_paths}` in gateway.yaml.

mod common;

use common::*;

const TOKEN: &str = "admin-t0ken-7c1e";

/// A gateway whose admin listener wants `TOKEN` but on `open`.
fn start(open: &str) -> (Gateway, SimCluster, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("dir");
    let token_file = dir.path().join("admin-token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).expect("token");
    let cluster = engines(1);
    let gw = Gateway::start_configured(
        &[("chat", route_yaml(&ports(&cluster), ""))],
        format!(
            "admin: {{token_file: {}, open_paths: [{open}]}}\n",
            token_file.display()
        ),
        Vec::new(),
    );
    (gw, cluster, dir)
}

fn admin_get(gw: &Gateway, path: &str, token: Option<&str>) -> http::Response {
    let auth = token.map(|t| format!("Bearer {t}"));
    let headers: Vec<(&str, &str)> = auth
        .as_deref()
        .map(|a| vec![("Authorization", a)])
        .unwrap_or_default();
    http::request(gw.admin, "GET", path, &headers, b"")
}

#[test]
fn a_token_guards_the_admin_listener_but_the_open_paths() {
    // The harness's own start waits on /healthz, so it is left open.
    let (gw, _cluster, _dir) = start("/healthz");
    for path in ["/metrics", "/_routes", "/dashboard.json", "/no-such-path"] {
        for token in [None, Some("wrong"), Some("admin-t0ken-7c1")] {
            let r = admin_get(&gw, path, token);
            assert_eq!(r.status(), 401, "{path} {token:?}: {}", r.text());
            assert_eq!(
                r.header("www-authenticate"),
                Some("Bearer realm=\"llm-gateway admin\"")
            );
            assert_eq!(r.json()["error"]["type"], "unauthorized");
        }
    }
    // Control: with the token, served.
    let r = admin_get(&gw, "/metrics", Some(TOKEN));
    assert_eq!(r.status(), 200, "{}", r.text());
    assert!(r.text().contains("llm_gateway_"), "{}", r.text());
    assert_eq!(admin_get(&gw, "/_routes", Some(TOKEN)).status(), 200);
    assert_eq!(admin_get(&gw, "/no-such-path", Some(TOKEN)).status(), 404);
    // An open path is served without it.
    let r = admin_get(&gw, "/healthz", None);
    assert_eq!(r.status(), 200, "{}", r.text());
    // The token reaches no log line; the log does say the admin listener
    // wants one, and from which file.
    let log = gw.log();
    assert!(
        log.contains("admin listener: a bearer token (from"),
        "{log}"
    );
    assert!(log.contains("admin-token"), "{log}");
    assert!(!log.contains(TOKEN), "{log}");
}

#[test]
fn metrics_left_open_is_scraped_without_the_token() {
    let (gw, _cluster, _dir) = start("/healthz, /metrics");
    assert_eq!(admin_get(&gw, "/metrics", None).status(), 200);
    // Control: what is not listed still wants it.
    assert_eq!(admin_get(&gw, "/_routes", None).status(), 401);
    assert_eq!(admin_get(&gw, "/_routes", Some(TOKEN)).status(), 200);
}

#[test]
fn without_a_token_configured_every_admin_path_is_served() {
    let cluster = engines(1);
    let gw = Gateway::start(&[("chat", route_yaml(&ports(&cluster), ""))]);
    for path in ["/healthz", "/metrics", "/_routes", "/dashboard.json"] {
        assert_eq!(admin_get(&gw, path, None).status(), 200, "{path}");
    }
}
