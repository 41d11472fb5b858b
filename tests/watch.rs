//! Reload on change (`watch`, on by default). The watch follows
//! `routes_dir` and the API key files' directories and reloads exactly as
//! SIGHUP does; every "it reloaded" below is read from
//! `llm_gateway_reloads_total{trigger="watch"}` and the log as well as from
//! what is served.

mod common;

use common::volume::Volume;
use common::*;
use std::io::Write;
use std::process::Command;
use std::time::{Duration, Instant};

/// Six debounce periods: well past the point where a watch that was on
/// would have reloaded (the watch-on tests see it well within this).
const NOT_WITHIN: Duration = Duration::from_secs(3);

fn one_peer(name: &str, port: u16) -> String {
    format!("peers:\n  - {{name: {name}, host: 127.0.0.1, port: {port}, max_concurrency: 64}}\n")
}

fn chat(gw: &Gateway, route: &str, headers: &[(&str, &str)]) -> http::Response {
    http::post_json(
        gw.addr,
        &format!("/{route}/v1/chat/completions"),
        headers,
        &chat_body("s", "hi", false),
    )
}

/// The peer that served a request on `route`, or None when it was not a 200.
fn served_by(gw: &Gateway, route: &str) -> Option<String> {
    let r = chat(gw, route, &[]);
    (r.status() == 200)
        .then(|| r.header("x-routed-peer").map(str::to_string))
        .flatten()
}

fn wait_served_by(gw: &Gateway, route: &str, peer: &str) {
    wait_for(&format!("/{route} served by {peer}"), DEADLINE, || {
        (served_by(gw, route).as_deref() == Some(peer)).then_some(())
    });
}

/// Asserts `ok` on every poll for the whole of `span`: the bounded form of
/// "it did not happen".
fn holds_for(what: &str, span: Duration, mut ok: impl FnMut() -> bool) {
    let start = Instant::now();
    while start.elapsed() < span {
        assert!(ok(), "{what} stopped holding after {:?}", start.elapsed());
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn watch_reloads(gw: &Gateway) -> f64 {
    gw.reloads(&["trigger=\"watch\""])
}

fn signal_reloads(gw: &Gateway) -> f64 {
    gw.reloads(&["trigger=\"signal\""])
}

/// A routes directory laid out as a ConfigMap volume holding chat.yaml on
/// engine A, and a gateway serving it.
fn configmap_gateway(a: u16, watch: Option<bool>) -> (tempfile::TempDir, Volume, Gateway) {
    let dir = tempfile::tempdir().unwrap();
    let mut volume = Volume::new(&dir.path().join("routes"));
    volume.publish(&[("chat.yaml", &one_peer("a0", a))]);
    let gw = Gateway::start_with(
        &[],
        GatewayOptions {
            watch,
            routes_dir: Some(volume.dir.clone()),
            ..Default::default()
        },
    );
    wait_served_by(&gw, "chat", "a0");
    (dir, volume, gw)
}

#[test]
fn a_configmap_data_swap_is_served_without_a_signal() {
    let a = engines(1);
    let b = engines(1);
    // `watch:` left out of gateway.yaml: on by default.
    let (_dir, mut volume, gw) = configmap_gateway(a.engines[0].port(), None);
    let pid = gw.pid();
    assert_eq!(gw.metric("llm_gateway_config_watch_active", &[]), 1.0);
    assert_eq!(watch_reloads(&gw), 0.0);

    // Only `..data` moves: chat.yaml's visible symlink stays as it was, so
    // nothing but the swap can tell the watch that chat changed.
    volume.publish(&[("chat.yaml", &one_peer("b0", b.engines[0].port()))]);
    wait_served_by(&gw, "chat", "b0");
    assert!(watch_reloads(&gw) >= 1.0, "counted as a watch reload");

    // A new key in the ConfigMap: a new visible symlink after the swap.
    volume.publish(&[
        ("chat.yaml", &one_peer("b0", b.engines[0].port())),
        ("foo.yaml", &one_peer("fa", a.engines[0].port())),
    ]);
    wait_served_by(&gw, "foo", "fa");
    // A key dropped from the ConfigMap: its route goes away.
    volume.publish(&[("foo.yaml", &one_peer("fa", a.engines[0].port()))]);
    wait_for("/chat to answer 404", DEADLINE, || {
        (chat(&gw, "chat", &[]).status() == 404).then_some(())
    });

    assert_eq!(signal_reloads(&gw), 0.0, "no signal was sent");
    assert_eq!(gw.pid(), pid, "same process");
    let log = gw.log();
    assert!(log.contains("watch: changed"), "{log}");
    assert!(log.contains("reload (watch)"), "{log}");
}

#[test]
fn with_watch_off_a_configmap_swap_waits_for_sighup() {
    let a = engines(1);
    let b = engines(1);
    let (_dir, mut volume, gw) = configmap_gateway(a.engines[0].port(), Some(false));
    assert_eq!(gw.metric("llm_gateway_config_watch_active", &[]), 0.0);
    assert!(gw.log().contains("watch: off"));
    let before = gw.reloads(&[]);

    volume.publish(&[("chat.yaml", &one_peer("b0", b.engines[0].port()))]);
    holds_for("the old version serving, no reload", NOT_WITHIN, || {
        served_by(&gw, "chat").as_deref() == Some("a0") && gw.reloads(&[]) == before
    });
    // Control: the swap itself was valid; SIGHUP loads it.
    gw.reload();
    wait_served_by(&gw, "chat", "b0");
    assert_eq!(watch_reloads(&gw), 0.0);
    assert_eq!(signal_reloads(&gw), 1.0);
}

fn watched_gateway(routes: &[(&str, String)]) -> Gateway {
    Gateway::start_with(
        routes,
        GatewayOptions {
            watch: Some(true),
            ..Default::default()
        },
    )
}

#[test]
fn a_file_replaced_by_rename_is_picked_up_and_a_removed_one_goes() {
    let a = engines(1);
    let b = engines(1);
    let gw = watched_gateway(&[("chat", one_peer("a0", a.engines[0].port()))]);
    wait_served_by(&gw, "chat", "a0");

    // Written beside it under a name that is not a route file, then renamed
    // over it (what editors and config tools do): a new inode.
    let tmp = gw.routes_dir.join(".chat.yaml.tmp");
    std::fs::write(&tmp, one_peer("b0", b.engines[0].port())).unwrap();
    std::fs::rename(&tmp, gw.routes_dir.join("chat.yaml")).unwrap();
    wait_served_by(&gw, "chat", "b0");
    assert!(watch_reloads(&gw) >= 1.0);

    gw.remove_route("chat");
    wait_for("/chat to answer 404", DEADLINE, || {
        (chat(&gw, "chat", &[]).status() == 404).then_some(())
    });
    assert_eq!(signal_reloads(&gw), 0.0);
}

#[test]
fn a_burst_of_writes_is_one_reload() {
    let a = engines(1);
    let b = engines(1);
    let gw = watched_gateway(&[("chat", one_peer("a0", a.engines[0].port()))]);
    wait_served_by(&gw, "chat", "a0");
    let before = watch_reloads(&gw);

    // Twenty rewrites back to back, well inside one debounce period; the
    // last one names b0.
    for i in 0..20 {
        let body = if i == 19 {
            one_peer("b0", b.engines[0].port())
        } else {
            one_peer(&format!("a{i}"), a.engines[0].port())
        };
        gw.write_route("chat", &body);
    }
    wait_served_by(&gw, "chat", "b0");
    assert_eq!(watch_reloads(&gw), before + 1.0, "one reload for the burst");
    // It stays one: the reload's own reads of the files trigger nothing.
    holds_for("a single reload", NOT_WITHIN, || {
        watch_reloads(&gw) == before + 1.0
    });

    // Control: a write after the burst is a reload of its own, so the
    // count above could have been more than one.
    gw.write_route("chat", &one_peer("a1", a.engines[0].port()));
    wait_served_by(&gw, "chat", "a1");
    assert_eq!(watch_reloads(&gw), before + 2.0);
}

#[test]
fn a_half_written_file_keeps_the_old_version_and_is_reported_until_finished() {
    let a = engines(1);
    let b = engines(1);
    let gw = watched_gateway(&[("chat", one_peer("a0", a.engines[0].port()))]);
    wait_served_by(&gw, "chat", "a0");
    let errors = gw.reloads(&["trigger=\"watch\"", "result=\"error\""]);

    // The writer stops half way, long enough for the debounce to fire.
    let full = one_peer("b0", b.engines[0].port());
    let (first, rest) = full.split_at(full.len() / 2);
    let mut file = std::fs::File::create(gw.routes_dir.join("chat.yaml")).unwrap();
    file.write_all(first.as_bytes()).unwrap();
    file.flush().unwrap();
    wait_for("the failed reload to be counted", DEADLINE, || {
        (gw.reloads(&["trigger=\"watch\"", "result=\"error\""]) > errors).then_some(())
    });
    assert_eq!(
        served_by(&gw, "chat").as_deref(),
        Some("a0"),
        "the previous version still serves"
    );
    let log = gw.log();
    assert!(
        log.contains("route file rejected, previous version kept") && log.contains("chat.yaml"),
        "reported with the file:\n{log}"
    );

    // Finishing the file loads it.
    file.write_all(rest.as_bytes()).unwrap();
    drop(file);
    wait_served_by(&gw, "chat", "b0");
    assert!(gw.reloads(&["trigger=\"watch\"", "result=\"ok\""]) >= 1.0);
}

#[test]
fn api_key_files_are_followed_shared_as_a_secret_volume_and_per_route_in_place() {
    let cluster = engines(1);
    let port = cluster.engines[0].port();
    let dir = tempfile::tempdir().unwrap();
    let mut secret = Volume::new(&dir.path().join("keys"));
    secret.publish(&[("api-keys", "old-key:alice\n")]);
    let own = dir.path().join("own-keys");
    std::fs::write(&own, "route-old:dave\n").unwrap();
    let gw = Gateway::start_with(
        &[
            ("chat", one_peer("e0", port)),
            (
                "own",
                format!("{}api_keys_file: {}\n", one_peer("e0", port), own.display()),
            ),
        ],
        GatewayOptions {
            watch: Some(true),
            env: vec![(
                "LLM_GATEWAY_API_KEYS_FILE".into(),
                secret.dir.join("api-keys").display().to_string(),
            )],
            ..Default::default()
        },
    );
    let status = |route: &str, key: &str| {
        chat(&gw, route, &[("Authorization", &format!("Bearer {key}"))]).status()
    };
    assert_eq!(status("chat", "old-key"), 200);
    assert_eq!(status("chat", "new-key"), 401);
    assert_eq!(status("own", "route-old"), 200);
    assert_eq!(status("own", "route-new"), 401);

    // The Secret rotates the way the kubelet rotates it.
    secret.publish(&[("api-keys", "new-key:bob\n")]);
    wait_for("the rotated shared key", DEADLINE, || {
        (status("chat", "new-key") == 200).then_some(())
    });
    assert_eq!(status("chat", "old-key"), 401, "the old key is gone");

    // The route's own key file, rewritten in place.
    std::fs::write(&own, "route-new:carol\n").unwrap();
    wait_for("the rotated route key", DEADLINE, || {
        (status("own", "route-new") == 200).then_some(())
    });
    assert_eq!(status("own", "route-old"), 401);
    assert_eq!(signal_reloads(&gw), 0.0, "no signal was sent");
    assert!(watch_reloads(&gw) >= 2.0);
}

#[test]
fn a_key_directory_that_appears_later_is_watched_once_it_exists() {
    let cluster = engines(1);
    let dir = tempfile::tempdir().unwrap();
    let keys_dir = dir.path().join("later");
    let keys = keys_dir.join("keys");
    let gw = watched_gateway(&[(
        "chat",
        format!(
            "{}api_keys_file: {}\n",
            one_peer("e0", cluster.engines[0].port()),
            keys.display()
        ),
    )]);
    // No key file yet: open (fail-open, logged once, as missing; the watch
    // that cannot follow its directory yet adds no line of its own).
    assert_eq!(chat(&gw, "chat", &[]).status(), 200);
    let log = gw.log();
    assert!(
        log.contains(&format!("{} does not exist", keys.display())),
        "{log}"
    );
    assert!(!log.contains("cannot watch"), "{log}");

    std::fs::create_dir_all(&keys_dir).unwrap();
    std::fs::write(&keys, "late-key:erin\n").unwrap();
    // Picked up by the retry (every 5 s) and the reload it triggers.
    wait_for("the late key file to be enforced", DEADLINE, || {
        (chat(&gw, "chat", &[]).status() == 401).then_some(())
    });
    assert_eq!(
        chat(&gw, "chat", &[("Authorization", "Bearer late-key")]).status(),
        200
    );
    assert_eq!(signal_reloads(&gw), 0.0);
    assert!(gw.log().contains("watching") && gw.log().contains("again"));
}

/// A plain start without keys, the key file's directory missing too (as
/// `/etc/llm-gateway/keys` on a host that never made one): one ERROR line
/// names it, the OpenResty gateway's one startup error, not a second one
/// from the watch that cannot follow that directory yet. The control: the
/// file made later is picked up (its keys enforced) without a signal, and
/// still no second line.
#[test]
fn a_missing_key_file_is_one_error_line_and_picked_up_once_made() {
    let cluster = engines(1);
    let dir = tempfile::tempdir().unwrap();
    let keys_dir = dir.path().join("keys");
    let keys = keys_dir.join("api-keys");
    let gw = Gateway::start_with(
        &[("chat", one_peer("e0", cluster.engines[0].port()))],
        GatewayOptions {
            watch: Some(true),
            env: vec![(
                "LLM_GATEWAY_API_KEYS_FILE".into(),
                keys.display().to_string(),
            )],
            ..Default::default()
        },
    );
    // The watch has started (and tried the directory) once it says so.
    wait_for("the watch to start", DEADLINE, || {
        gw.log()
            .contains("watch: reloading on changes")
            .then_some(())
    });
    let named = keys_dir.display().to_string();
    let errors = |gw: &Gateway| -> Vec<String> {
        gw.log()
            .lines()
            .filter(|l| l.contains(" ERROR ") && l.contains(&named))
            .map(str::to_string)
            .collect()
    };
    let lines = errors(&gw);
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert!(lines[0].contains("does not exist"), "{lines:#?}");
    assert_eq!(chat(&gw, "chat", &[]).status(), 200, "fail-open");

    std::fs::create_dir_all(&keys_dir).unwrap();
    std::fs::write(&keys, "made-later:frank\n").unwrap();
    // Picked up by the retry (every 5 s) and the reload it triggers.
    wait_for("the key file made later to be enforced", DEADLINE, || {
        (chat(&gw, "chat", &[]).status() == 401).then_some(())
    });
    assert_eq!(
        chat(&gw, "chat", &[("Authorization", "Bearer made-later")]).status(),
        200
    );
    assert_eq!(signal_reloads(&gw), 0.0);
    assert_eq!(errors(&gw).len(), 1, "{}", gw.log());
}

#[test]
fn check_reports_whether_the_watch_is_on() {
    let dir = tempfile::tempdir().unwrap();
    let routes = dir.path().join("routes");
    std::fs::create_dir_all(&routes).unwrap();
    let run = |extra: &str| {
        std::fs::write(
            dir.path().join("gateway.yaml"),
            format!("routes_dir: {}\n{extra}", routes.display()),
        )
        .unwrap();
        let out = Command::new(common::gateway_bin())
            .args(["check", "--config"])
            .arg(dir.path().join("gateway.yaml"))
            .output()
            .expect("run check");
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert!(run("").contains("watch: on"), "default on");
    assert!(run("watch: false\n").contains("watch: off"));
}

/// A deprecated key and a route warning are logged when their file loads
/// or changes, not again at each reload of the same file (SIGHUP, or the
/// watch reloading for a change elsewhere); `check` keeps saying them.
#[test]
fn route_notices_are_logged_when_their_file_changes_not_at_every_reload() {
    let cluster = engines(1);
    let p = ports(&cluster);
    let notice = "ttft_limit_ms (line";
    let flat = |limit: u32| format!("{}ttft_limit_ms: {limit}\n", one_peer("e0", p[0]));
    // Watch off: each reload below is the one SIGHUP asks for.
    let gw = Gateway::start_with(
        &[("flat", flat(9000))],
        GatewayOptions {
            watch: Some(false),
            ..Default::default()
        },
    );
    let count = |gw: &Gateway| gw.log().matches(notice).count();
    wait_for("the notice at start", DEADLINE, || {
        (count(&gw) == 1).then_some(())
    });
    gw.reload();
    gw.reload();
    assert_eq!(
        count(&gw),
        1,
        "repeated for an unchanged file:\n{}",
        gw.log()
    );
    // Control: the same reload of a changed file says it again.
    gw.write_route("flat", &flat(9500));
    gw.reload();
    assert_eq!(count(&gw), 2, "{}", gw.log());
    // And check, which loads nothing, still says it.
    let out = Command::new(gateway_bin())
        .args(["check", "--config"])
        .arg(gw.dir.path().join("gateway.yaml"))
        .output()
        .expect("check runs");
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(text.contains(notice), "{text}");
}
