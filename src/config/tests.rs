use super::*;
use std::path::{Path, PathBuf};
use std::time::Duration;

fn gw() -> GatewayConfig {
    GatewayConfig::parse(Path::new("gateway.yaml"), "", &Overrides::default()).unwrap()
}

fn route(text: &str) -> Result<RouteConfig, ConfigError> {
    RouteConfig::parse("chat", Path::new("routes/chat.yaml"), text, &gw())
}

const MINIMAL: &str = "\
peers:
  - {name: a, host: 127.0.0.1, port: 8001}
  - {name: b, host: 127.0.0.1, port: 8002, priority: 1, max_concurrency: 8}
";

#[test]
fn minimal_route_gets_defaults() {
    let r = route(MINIMAL).unwrap();
    assert_eq!(r.name, "chat");
    assert_eq!(r.peers.len(), 2);
    assert_eq!(r.peers[0].max_concurrency, 64);
    assert_eq!(r.peers[1].priority, 1);
    assert_eq!(r.max_body_size, DEFAULT_MAX_BODY_SIZE);
    assert_eq!(r.balancing.mode, Mode::LoadAware);
    assert_eq!(r.balancing.idle_timeout, Duration::from_secs(1800));
    assert!(r.engine_metrics.is_some());
    assert!(r.routed_headers);
    assert!(!r.cch_strip && !r.kimi_normalize, "transforms are opt-in");
}

#[test]
fn prefix_transform_options_are_flags() {
    let r = route(&format!("{MINIMAL}cch_strip: true\nkimi_normalize: on\n")).unwrap();
    assert!(r.cch_strip && r.kimi_normalize);
    let r = route(&format!("{MINIMAL}cch_strip: false\n")).unwrap();
    assert!(!r.cch_strip);
    let e = route(&format!("{MINIMAL}cch_strip: sometimes\n")).unwrap_err();
    assert!(e.to_string().contains("chat.yaml:4: cch_strip"), "{e}");
}

#[test]
fn gateway_defaults_and_overrides() {
    let g = gw();
    assert_eq!(g.listen.to_string(), "0.0.0.0:8080");
    assert_eq!(g.admin_listen.to_string(), "0.0.0.0:8090");
    assert_eq!(g.grace_period, DEFAULT_GRACE_PERIOD);
    let o = Overrides {
        listen: Some("127.0.0.1:9999".into()),
        admin_listen: None,
        routes_dir: Some("/tmp/r".into()),
    };
    let g = GatewayConfig::parse(
        Path::new("g.yaml"),
        "listen: 127.0.0.1:1\ngrace_period: 5s\nmax_body_size: 20m\n",
        &o,
    )
    .unwrap();
    assert_eq!(g.listen.to_string(), "127.0.0.1:9999");
    assert_eq!(g.routes_dir, PathBuf::from("/tmp/r"));
    assert_eq!(g.grace_period, Duration::from_secs(5));
    assert_eq!(g.max_body_size, 20 << 20);
}

#[test]
fn gateway_unknown_key_has_line() {
    let e = GatewayConfig::parse(
        Path::new("g.yaml"),
        "listen: 0.0.0.0:1\nlisten_port: 3\n",
        &Overrides::default(),
    )
    .unwrap_err();
    assert_eq!(e.line, Some(2), "{e}");
    assert!(e.message.contains("listen_port"), "{e}");
}

#[test]
fn unknown_key_reports_file_and_line() {
    let e =
        route("peers:\n  - {name: a, host: h, port: 1}\nbalancing:\n  mode: hash\n  modee: x\n")
            .unwrap_err();
    assert_eq!(e.line, Some(5), "{e}");
    assert!(e.message.contains("modee"), "{e}");
    assert!(e.to_string().starts_with("routes/chat.yaml:5:"), "{e}");
}

#[test]
fn wrong_type_reports_line() {
    let e = route("peers:\n  - {name: a, host: h, port: 1}\nmax_body_size: [1]\n").unwrap_err();
    assert_eq!(e.line, Some(3), "{e}");
}

#[test]
fn port_out_of_range_points_at_the_peer() {
    let e = route(
        "peers:\n  - {name: a, host: h, port: 1}\n  - name: b\n    host: h\n    port: 70000\n",
    )
    .unwrap_err();
    assert_eq!(e.line, Some(3), "{e}");
    assert!(e.message.contains("70000"), "{e}");
    assert!(route("peers:\n  - {name: a, host: h, port: 0}\n").is_err());
}

#[test]
fn duplicate_peers_rejected() {
    let e = route("peers:\n  - {name: a, host: h, port: 1}\n  - {name: a, host: h, port: 2}\n")
        .unwrap_err();
    assert_eq!(e.line, Some(3), "{e}");
    assert!(e.message.contains("duplicate peer name"), "{e}");
    let e = route("peers:\n  - {name: a, host: h, port: 1}\n  - {name: b, host: h, port: 1}\n")
        .unwrap_err();
    assert!(e.message.contains("duplicate peer address"), "{e}");
}

#[test]
fn session_affinity_needs_a_session_mode() {
    let e = route("peers:\n  - {name: a, host: h, port: 1}\nbalancing:\n  mode: least_conn\n  session_affinity:\n    headers: [x-a]\n").unwrap_err();
    assert!(e.message.contains("requires mode"), "{e}");
    assert_eq!(e.line, Some(5));
    // control: the same block under hash is fine
    route("peers:\n  - {name: a, host: h, port: 1}\nbalancing:\n  mode: hash\n  session_affinity:\n    headers: [x-a]\n").unwrap();
}

#[test]
fn deprecated_max_load_percent_warns_but_loads() {
    let r = route("peers:\n  - {name: a, host: h, port: 1}\nbalancing:\n  max_load_percent: 125\n")
        .unwrap();
    assert_eq!(r.warnings.len(), 1);
    assert!(route(MINIMAL).unwrap().warnings.is_empty());
}

#[test]
fn idle_timeout_bounds() {
    let base = "peers:\n  - {name: a, host: h, port: 1}\nbalancing:\n  session_affinity:\n    idle_timeout: ";
    assert!(route(&format!("{base}30s\n")).is_err());
    assert!(route(&format!("{base}25h\n")).is_err());
    assert_eq!(
        route(&format!("{base}2h\n"))
            .unwrap()
            .balancing
            .idle_timeout,
        Duration::from_secs(7200)
    );
}

#[test]
fn peers_by_model_resolves_names() {
    let r = route(&format!(
        "{MINIMAL}peers_by_model:\n  llama: [b]\n  qwen: [a, b]\n"
    ))
    .unwrap();
    assert_eq!(
        r.peers_by_model,
        vec![
            ("llama".to_string(), vec![1]),
            ("qwen".to_string(), vec![0, 1])
        ]
    );
    let e = route(&format!("{MINIMAL}peers_by_model:\n  llama: [zz]\n")).unwrap_err();
    assert!(e.message.contains("unknown peer"), "{e}");
}

#[test]
fn engine_metrics_switch_and_settings() {
    assert!(route(&format!("{MINIMAL}engine_metrics: false\n"))
        .unwrap()
        .engine_metrics
        .is_none());
    let r = route(&format!(
        "{MINIMAL}engine_metrics: {{interval: 2s, kv_full_threshold: 0.9}}\n"
    ))
    .unwrap();
    let m = r.engine_metrics.unwrap();
    assert_eq!(m.interval, Duration::from_secs(2));
    assert_eq!(m.kv_full_threshold, 0.9);
    assert!(route(&format!(
        "{MINIMAL}engine_metrics: {{kv_full_threshold: 2}}\n"
    ))
    .is_err());
}

#[test]
fn route_names() {
    assert!(valid_route_name("qwen3-27b.v2"));
    assert!(!valid_route_name("_status"));
    assert!(!valid_route_name("a/b"));
    assert!(!valid_route_name(""));
    assert_eq!(
        route_name_of(Path::new("routes/chat.yaml")).as_deref(),
        Some("chat")
    );
    assert_eq!(route_name_of(Path::new("routes/chat.yaml.bak")), None);
}

#[test]
fn peer_metrics_grace_defaults_to_5m_and_is_at_most_a_day() {
    assert_eq!(gw().peer_metrics_grace, Duration::from_secs(300));
    let parse = |text: &str| GatewayConfig::parse(Path::new("g.yaml"), text, &Overrides::default());
    assert_eq!(
        parse("peer_metrics_grace: 0s\n")
            .unwrap()
            .peer_metrics_grace,
        Duration::ZERO
    );
    let e = parse("watch: false\npeer_metrics_grace: 25h\n").unwrap_err();
    assert!(e.to_string().contains("peer_metrics_grace"), "{e}");
}

#[test]
fn client_header_timeout_defaults_to_10s_within_bounds() {
    assert_eq!(gw().client_header_timeout, DEFAULT_CLIENT_HEADER_TIMEOUT);
    let parse = |text: &str| GatewayConfig::parse(Path::new("g.yaml"), text, &Overrides::default());
    assert_eq!(
        parse("client_header_timeout: 2s\n")
            .unwrap()
            .client_header_timeout,
        Duration::from_secs(2)
    );
    for bad in ["50ms", "0s", "11m"] {
        let e = parse(&format!("watch: false\nclient_header_timeout: {bad}\n")).unwrap_err();
        assert_eq!(e.line, Some(2), "{bad}: {e}");
    }
}

#[test]
fn max_header_size_defaults_to_64k_within_bounds() {
    assert_eq!(gw().max_header_size, DEFAULT_MAX_HEADER_SIZE);
    assert_eq!(DEFAULT_MAX_HEADER_SIZE, 65_536);
    let parse = |text: &str| GatewayConfig::parse(Path::new("g.yaml"), text, &Overrides::default());
    for (given, bytes) in [
        ("1k", 1024),
        ("16k", 16 << 10),
        ("1m", 1 << 20),
        ("2048", 2048),
    ] {
        let g = parse(&format!("max_header_size: {given}\n")).unwrap();
        assert_eq!(g.max_header_size, bytes, "{given}");
    }
    for bad in ["1023", "0", "2m", "1g"] {
        let e = parse(&format!("watch: false\nmax_header_size: {bad}\n")).unwrap_err();
        assert_eq!(e.line, Some(2), "{bad}: {e}");
        assert!(e.to_string().contains("between 1k and 1m"), "{bad}: {e}");
    }
}

#[test]
fn status_endpoints_default_to_open_and_take_three_modes() {
    assert_eq!(gw().status_endpoints, StatusAccess::Open);
    let parse = |text: &str| GatewayConfig::parse(Path::new("g.yaml"), text, &Overrides::default());
    for mode in ["open", "key", "loopback"] {
        let g = parse(&format!("status_endpoints: {mode}\n")).unwrap();
        assert_eq!(g.status_endpoints.as_str(), mode);
    }
    let e = parse("watch: false\nstatus_endpoints: secret\n").unwrap_err();
    assert_eq!(e.line, Some(2), "{e}");
}

#[test]
fn client_idle_timeout_defaults_to_60s_and_needs_whole_seconds() {
    assert_eq!(gw().client_idle_timeout, DEFAULT_CLIENT_IDLE_TIMEOUT);
    let parse = |text: &str| GatewayConfig::parse(Path::new("g.yaml"), text, &Overrides::default());
    assert_eq!(
        parse("client_idle_timeout: 5s\n")
            .unwrap()
            .client_idle_timeout,
        Duration::from_secs(5)
    );
    for bad in ["500ms", "1500ms", "0s"] {
        let e = parse(&format!("client_idle_timeout: {bad}\n")).unwrap_err();
        assert_eq!(e.line, Some(1), "{bad}: {e}");
    }
}

#[test]
fn live_window_defaults_to_ten_seconds_and_stays_within_the_idle_timeout() {
    let r = route(MINIMAL).unwrap();
    assert_eq!(r.balancing.live_window, Duration::from_secs(10));
    let with = |w: &str| {
        route(&format!(
            "{MINIMAL}balancing:\n  session_affinity:\n    idle_timeout: 10m\n    live_window: {w}\n"
        ))
    };
    assert_eq!(
        with("5m").unwrap().balancing.live_window,
        Duration::from_secs(300)
    );
    for bad in ["11m", "500ms"] {
        let e = with(bad).unwrap_err();
        assert!(e.message.contains("live_window"), "{bad}: {e}");
    }
}

#[test]
fn a_metric_table_replaces_the_default_fold_and_one_bad_entry_drops_it() {
    use crate::protect::window::Fold;
    let r = route(&format!(
        "{MINIMAL}ttft_metrics:\n  - {{metric: p95, threshold: 8000}}\n  - {{metric: avg, threshold: 3000}}\n"
    ))
    .unwrap();
    let table = r.protection.ttft_metrics.expect("the table");
    assert_eq!(table.len(), 2);
    assert_eq!(
        r.protection.meter.ttft_folds.as_slice(),
        &[Fold::Percentile(95.0), Fold::Avg]
    );
    assert!(r.warnings.is_empty());
    // TPS keeps its default while TTFT has a table.
    assert_eq!(
        r.protection.meter.tps_folds.as_slice(),
        &[Fold::Percentile(20.0)]
    );

    for bad in [
        "  - {metric: p95, threshold: 8000}\n  - {metric: p95}\n",
        "  - {metric: p95, threshold: 8000}\n  - {metric: median, threshold: 1}\n",
        "  - {metric: p95, threshold: 8000, extra: 1}\n",
        "  - 3\n",
    ] {
        let r = route(&format!("{MINIMAL}ttft_metrics:\n{bad}")).unwrap();
        assert!(r.protection.ttft_metrics.is_none(), "{bad}");
        assert_eq!(
            r.protection.meter.ttft_folds.as_slice(),
            &[Fold::Percentile(80.0)],
            "back to the static limit's P80: {bad}"
        );
        assert_eq!(r.warnings.len(), 1, "{bad}");
        assert!(
            r.warnings[0].contains("ttft_metrics dropped"),
            "{:?}",
            r.warnings
        );
    }
}

#[test]
fn adaptive_concurrency_is_on_only_when_enabled_whatever_the_floor() {
    for floor in [
        "tps_limit_tps: 20\n",
        "tps_metrics:\n  - {metric: p, q: 10, threshold: 20}\n",
    ] {
        let floor_only = route(&format!("{MINIMAL}{floor}")).unwrap();
        assert!(floor_only.protection.adaptive_on().is_none(), "{floor}");
        // Control: the same floor with the switch on.
        let enabled = route(&format!(
            "{MINIMAL}{floor}protection:\n  adaptive: {{enabled: true}}\n"
        ))
        .unwrap();
        assert!(enabled.protection.adaptive_on().is_some(), "{floor}");
    }
    assert!(route(MINIMAL).unwrap().protection.adaptive_on().is_none());
}

#[test]
fn protection_options_out_of_range_are_errors_with_their_line() {
    for (option, line) in [
        ("session_prio_release: 1.5", 4),
        ("session_prio_warn_frac: -0.1", 4),
        ("rt_limit_factor: 0", 4),
        ("session_prio_full_turn: 0", 4),
        ("session_prio_severe: 0.5", 4),
        ("session_prio_r_new: 0", 4),
        ("ttft_limit_ms: -1", 4),
        ("tps_limit_tps: 0", 4),
        ("adaptive_cc_min: 0", 4),
        ("adaptive_cc_inc: 1", 4),
        ("adaptive_cc_dec: 1", 4),
        ("adaptive_cc_dec: 0", 4),
        ("adaptive_cc_pressure_frac: 0", 4),
        ("adaptive_cc_pressure_frac: 1.1", 4),
        ("adaptive_cc_slack_frac: 0.9", 4),
        ("adaptive_cc_abs: -1", 4),
        ("adaptive_cc_min_frac: 1.5", 4),
        ("adaptive_cc_ttl: 0", 4),
        ("adaptive_cc_interval: 10ms", 4),
    ] {
        let e = route(&format!("{MINIMAL}{option}\n")).unwrap_err();
        assert_eq!(e.line, Some(line), "{option}: {e}");
        let key = option.split(':').next().unwrap();
        assert!(e.to_string().contains(key), "{option}: {e}");
    }
    // Control: the defaults written out load.
    let defaults = "session_prio_release: 0.9\nsession_prio_warn_frac: 0.2\nrt_limit_factor: 1\n\
                    session_prio_full_turn: 32\nsession_prio_severe: 1.5\nsession_prio_r_new: 0.85\n\
                    ttft_limit_ms: 30000\ntps_limit_tps: 10\nadaptive_cc_min: 1\n\
                    adaptive_cc_inc: 1.02\nadaptive_cc_dec: 0.97\nadaptive_cc_pressure_frac: 0.9\n\
                    adaptive_cc_slack_frac: 0.7\nadaptive_cc_abs: 5\nadaptive_cc_min_frac: 0.4\n\
                    adaptive_cc_ttl: 300s\nadaptive_cc_interval: 20s\n";
    route(&format!("{MINIMAL}{defaults}")).unwrap();
}

/// A gateway-wide switch that is on unless `key: false`; anything but a
/// boolean is refused with its line.
fn assert_switch_on_by_default(key: &str, get: fn(&GatewayConfig) -> bool) {
    assert!(get(&gw()), "{key}: default on");
    let parse = |text: &str| GatewayConfig::parse(Path::new("g.yaml"), text, &Overrides::default());
    assert!(!get(&parse(&format!("{key}: false\n")).unwrap()), "{key}");
    assert!(get(&parse(&format!("{key}: true\n")).unwrap()), "{key}");
    let e = parse(&format!("listen: 0.0.0.0:1\n{key}: sometimes\n")).unwrap_err();
    assert_eq!(e.line, Some(2), "{e}");
    assert!(e.message.contains("not a boolean"), "{e}");
}

#[test]
fn watch_is_on_by_default_and_can_be_turned_off() {
    assert_switch_on_by_default("watch", |g| g.watch);
}

/// Pingora's default; `false` is measured in BENCHMARKS.md (proxy overhead).
#[test]
fn work_stealing_is_on_by_default_and_can_be_turned_off() {
    assert_switch_on_by_default("work_stealing", |g| g.work_stealing);
}

#[test]
fn session_store_is_local_by_default_and_redis_is_validated_with_its_line() {
    use crate::config::store::SessionStoreConfig;
    assert_eq!(gw().session_store, SessionStoreConfig::Local);
    let parse = |text: &str| GatewayConfig::parse(Path::new("g.yaml"), text, &Overrides::default());
    let redis = parse("session_store:\n  kind: redis\n  url: redis://127.0.0.1:6379/0\n").unwrap();
    match redis.session_store {
        SessionStoreConfig::Redis(r) => {
            assert_eq!(r.key_prefix, "llmgw:");
            assert_eq!(r.timeout, Duration::from_millis(20));
            assert_eq!(r.pool_size, 1);
            assert_eq!(r.sync_interval, Duration::from_millis(50));
            assert!(r.share_claims);
        }
        other => panic!("{other:?}"),
    }
    let tuned = parse("session_store:\n  kind: redis\n  url: redis://h\n  sync_interval: 200ms\n  share_claims: false\n").unwrap();
    match tuned.session_store {
        SessionStoreConfig::Redis(r) => {
            assert_eq!(r.sync_interval, Duration::from_millis(200));
            assert!(!r.share_claims);
        }
        other => panic!("{other:?}"),
    }
    for (text, line) in [
        ("session_store:\n  kind: redis\n", 1),
        ("session_store:\n  kind: memcached\n", 2),
        ("session_store:\n  kind: redis\n  url: http://x\n", 3),
        (
            "session_store:\n  kind: redis\n  url: redis://user:pw@h:6379\n",
            3,
        ),
        (
            "session_store:\n  kind: redis\n  url: redis://h\n  timeout: 0s\n",
            4,
        ),
        (
            "session_store:\n  kind: redis\n  url: redis://h\n  pool_size: 0\n",
            4,
        ),
        (
            "session_store:\n  kind: redis\n  url: redis://h\n  sync_interval: 5ms\n",
            4,
        ),
    ] {
        let e = parse(text).unwrap_err();
        assert_eq!(e.line, Some(line), "{text}: {e}");
        assert!(e.message.contains("session_store"), "{e}");
    }
}

/// Every protection option, flat as the first route format wrote it and
/// nested under `protection:`, each with a value other than its default.
const FLAT_PROTECTION: &str = "\
ttft_limit_ms: 12000
ttft_limit_by_model: {m: 9000}
ttft_window: 5s
tps_limit_tps: 4
tps_window: 7s
tps_min_tokens: 8
tps_min_decode_s: 0.25
ewma_alpha: 0.5
ewma_ttl: 30s
probes: 3
probe_window: 4s
load_rate_limit: false
adaptive_cc: true
adaptive_cc_min: 2
adaptive_cc_init: 3
adaptive_cc_init_frac: 0.5
adaptive_cc_hold_when_idle: false
adaptive_cc_use_ttft: false
adaptive_cc_inc: 1.5
adaptive_cc_dec: 0.5
adaptive_cc_pressure_frac: 0.8
adaptive_cc_slack_frac: 0.6
adaptive_cc_abs: 2
adaptive_cc_min_frac: 0.25
adaptive_cc_ttl: 60s
adaptive_cc_interval: 3s
session_prio: true
session_prio_r_new: 0.7
session_prio_full_turn: 16
session_prio_severe: 2
session_prio_release: 0.8
session_prio_t1_probes: 2
session_prio_warn_frac: 0.3
rt_limit_factor: 1.5
";

const NESTED_PROTECTION: &str = "\
protection:
  ttft: {limit_ms: 12000, limit_by_model: {m: 9000}, window: 5s}
  tps:
    limit_tps: 4
    window: 7s
    min_tokens: 8
    min_decode_s: 0.25
  ewma: {alpha: 0.5, ttl: 30s}
  probes: 3
  probe_window: 4s
  rate_limit: false
  adaptive:
    enabled: true
    min: 2
    init: 3
    init_frac: 0.5
    hold_when_idle: false
    use_ttft: false
    inc: 1.5
    dec: 0.5
    pressure_frac: 0.8
    slack_frac: 0.6
    abs: 2
    min_frac: 0.25
    ttl: 60s
    interval: 3s
  session_prio:
    enabled: true
    r_new: 0.7
    full_turn: 16
    severe: 2
    release: 0.8
    t1_probes: 2
    warn_frac: 0.3
    rt_limit_factor: 1.5
";

#[test]
fn flat_protection_keys_load_as_their_place_under_protection() {
    let flat = route(&format!("{MINIMAL}{FLAT_PROTECTION}")).unwrap();
    let nested = route(&format!("{MINIMAL}{NESTED_PROTECTION}")).unwrap();
    assert_eq!(flat.protection, nested.protection);
    assert_eq!(catalog::values(&flat), catalog::values(&nested));
    // Control: the values differ from the defaults, so the comparison
    // compares something.
    assert_ne!(route(MINIMAL).unwrap().protection, nested.protection);
    assert!(nested.deprecations.is_empty(), "{:?}", nested.deprecations);
    assert_eq!(
        flat.deprecations.len(),
        file::FORMER_KEYS
            .iter()
            .filter(|f| f.new.starts_with("protection."))
            .count()
            - 3,
        "one notice per flat key written (the file leaves out both metric tables and the bucket table)"
    );
    assert!(
        flat.deprecations.contains(
            &"ttft_limit_ms (line 4) is deprecated: write it as protection.ttft.limit_ms"
                .to_string()
        ),
        "{:?}",
        flat.deprecations
    );
}

#[test]
fn the_openresty_names_load_at_their_place_here_with_a_notice_naming_it() {
    let old = route(&format!(
        "{MINIMAL}health_check_interval: 7\nhealth_ban_ttl: 90\nhealth_probe_path: /ready\n\
         cross_tier_fallback: true\n"
    ))
    .unwrap();
    let new = route(&format!(
        "{MINIMAL}health: {{interval: 7s, ban_ttl: 90s, probe_path: /ready}}\n\
         balancing: {{cross_tier_fallback: true}}\n"
    ))
    .unwrap();
    assert_eq!((&old.health, &old.balancing), (&new.health, &new.balancing));
    // Control: the values are not the defaults.
    let defaults = route(MINIMAL).unwrap();
    assert_ne!(defaults.health, new.health);
    assert_ne!(defaults.balancing, new.balancing);
    assert!(new.deprecations.is_empty(), "{:?}", new.deprecations);
    assert_eq!(
        old.deprecations[..3],
        [
            "health_check_interval (line 4) is deprecated: write it as health.interval",
            "health_ban_ttl (line 5) is deprecated: write it as health.ban_ttl",
            "health_probe_path (line 6) is deprecated: write it as health.probe_path",
        ]
    );
    assert!(
        old.deprecations[3].starts_with(
            "cross_tier_fallback (line 7) is deprecated: write it as balancing.cross_tier_fallback (no exact equivalent: "
        ),
        "{:?}",
        old.deprecations
    );
    // Errors name the key as written, at its line.
    let e = route(&format!("{MINIMAL}health_probe_path: ready\n")).unwrap_err();
    assert_eq!(e.line, Some(4), "{e}");
    assert!(
        e.message
            .starts_with("health_probe_path must start with '/'"),
        "{e}"
    );
    let e = route(&format!(
        "{MINIMAL}health: {{interval: 5s}}\nhealth_check_interval: 7\n"
    ))
    .unwrap_err();
    assert_eq!(e.line, Some(5), "{e}");
    assert!(
        e.message
            .contains("health_check_interval and health.interval are both set"),
        "{e}"
    );
    // Control: a name neither gateway knows is still refused at its line.
    let e = route(&format!("{MINIMAL}health_check_intervals: 7\n")).unwrap_err();
    assert_eq!(e.line, Some(4), "{e}");
    assert!(e.message.contains("health_check_intervals"), "{e}");
}

#[test]
fn an_inline_key_table_is_the_routes_keys_with_a_notice_pointing_at_api_keys_file() {
    let r = route(&format!(
        "{MINIMAL}api_keys: {{sk-one: alice, sk-two: bob, \"sk three\": carol}}\n"
    ))
    .unwrap();
    let keys = r.api_keys.as_ref().expect("inline keys");
    assert_eq!(keys.len(), 2);
    assert_eq!(keys.check(b"sk-two").map(|o| &**o), Some("bob"));
    assert!(r.has_own_keys());
    assert!(
        r.warnings.iter().any(|w| w.starts_with("api_keys: entry ")
            && w.contains("(owner \"carol\")")
            && !w.contains("sk three")),
        "a dropped entry named by its owner, never its key: {:?}",
        r.warnings
    );
    assert!(
        r.deprecations[0].starts_with(
            "api_keys (line 4) is deprecated: write it as api_keys_file (no exact equivalent: "
        ),
        "{:?}",
        r.deprecations
    );
    // Control: without the table the route has no keys of its own.
    assert!(!route(MINIMAL).unwrap().has_own_keys());
    let e = route(&format!(
        "{MINIMAL}api_keys_file: /etc/keys\napi_keys: {{sk-one: alice}}\n"
    ))
    .unwrap_err();
    assert_eq!(e.line, Some(5), "{e}");
    assert!(
        e.message
            .contains("api_keys and api_keys_file are both set"),
        "{e}"
    );
}

#[test]
fn a_protection_key_written_both_ways_is_refused_at_the_flat_one() {
    let e = route(&format!(
        "{MINIMAL}protection:\n  ttft: {{limit_ms: 100}}\nttft_limit_ms: 200\n"
    ))
    .unwrap_err();
    assert_eq!(e.line, Some(6), "{e}");
    assert!(
        e.message
            .contains("ttft_limit_ms and protection.ttft.limit_ms are both set"),
        "{e}"
    );
    // Control: either alone loads.
    route(&format!(
        "{MINIMAL}protection:\n  ttft: {{limit_ms: 100}}\n"
    ))
    .unwrap();
    route(&format!("{MINIMAL}ttft_limit_ms: 200\n")).unwrap();
}

#[test]
fn nested_protection_errors_name_the_nested_key_and_its_line() {
    for (text, key, line) in [
        (
            "protection:\n  ttft:\n    limit_ms: -1\n",
            "protection.ttft.limit_ms",
            6,
        ),
        (
            "protection:\n  session_prio: {release: 1.5}\n",
            "protection.session_prio.release",
            5,
        ),
        (
            "protection:\n  adaptive:\n    enabled: true\n    min: 0\n",
            "protection.adaptive.min",
            7,
        ),
        (
            "protection:\n  tps: {window: 5s, limit_tps: 0}\n",
            "protection.tps.limit_tps",
            5,
        ),
        (
            "protection:\n  adaptive:\n    pressure_frac: 0.5\n    slack_frac: 0.6\n",
            "protection.adaptive.slack_frac",
            7,
        ),
        (
            "protection:\n  adaptive:\n    interval: 1ms\n",
            "protection.adaptive.interval",
            6,
        ),
    ] {
        let e = route(&format!("{MINIMAL}{text}")).unwrap_err();
        assert_eq!(e.line, Some(line), "{text}: {e}");
        assert!(e.message.starts_with(key), "{text}: {e}");
    }
    // An unknown key inside a section is refused with its line, as at the top.
    let e = route(&format!("{MINIMAL}protection:\n  ttft:\n    limit: 5\n")).unwrap_err();
    assert_eq!(e.line, Some(6), "{e}");
    assert!(e.message.contains("limit"), "{e}");
}

#[test]
fn errors_after_parsing_find_their_key_by_its_section() {
    // `interval` is written twice; the engine scrape's is the bad one.
    let text = format!("{MINIMAL}health:\n  interval: 5s\nengine_metrics:\n  interval: 1ms\n");
    let e = route(&text).unwrap_err();
    assert_eq!(e.line, Some(7), "{e}");
    assert!(e.message.contains("engine_metrics.interval"), "{e}");
}

#[test]
fn peers_from_names_a_dns_name_or_endpoint_slices_with_the_peer_settings() {
    let r = route(
        "peers_from: {dns: vllm-headless.llm.svc, port: 8000, max_concurrency: 8, priority: 1}\n",
    )
    .unwrap();
    assert!(r.peers.is_empty());
    let from = r.peers_from.expect("peers_from");
    assert_eq!(
        from.source,
        PeerSource::Dns {
            name: "vllm-headless.llm.svc".into(),
            port: 8000
        }
    );
    let peer = from.peer("pod".into(), "10.0.0.5:8000".parse().unwrap());
    assert_eq!(
        (
            peer.host.as_str(),
            peer.port,
            peer.max_concurrency,
            peer.priority
        ),
        ("10.0.0.5", 8000, 8, 1)
    );
    let r = route(&format!(
        "{MINIMAL}peers_from:\n  kubernetes: {{namespace: llm, selector: \"app=vllm\", port: http}}\n"
    ))
    .unwrap();
    assert_eq!(
        r.peers.len(),
        2,
        "listed peers and discovered ones together"
    );
    match r.peers_from.map(|f| f.source) {
        Some(PeerSource::Kubernetes(k)) => {
            assert_eq!(
                (k.namespace.as_str(), k.selector.as_str()),
                ("llm", "app=vllm")
            );
            assert_eq!(
                k.port,
                crate::discovery::kubernetes::PortRef::Name("http".into())
            );
            assert_eq!(k.api, None);
            assert_eq!(k.service_account_dir, None);
        }
        other => panic!("{other:?}"),
    }
    let r = route(&format!(
        "{MINIMAL}peers_from:\n  kubernetes: {{namespace: llm, selector: a=b, port: 80, api: \"https://10.0.0.9:6443\", service_account_dir: /etc/kube}}\n"
    ))
    .unwrap();
    match r.peers_from.map(|f| f.source) {
        Some(PeerSource::Kubernetes(k)) => assert_eq!(
            k.service_account_dir.as_deref(),
            Some(Path::new("/etc/kube"))
        ),
        other => panic!("{other:?}"),
    }
}

#[test]
fn peers_from_errors_name_what_is_wrong() {
    for (text, says) in [
        ("peers_from: {dns: pool.test}\n", "needs port"),
        ("peers_from: {dns: 10.0.0.1, port: 80}\n", "a host name, not an address"),
        ("peers_from: {port: 80}\n", "exactly one of dns or kubernetes"),
        (
            "peers_from: {dns: a.test, port: 80, kubernetes: {namespace: n, selector: s, port: 1}}\n",
            "exactly one of dns or kubernetes",
        ),
        (
            "peers_from: {kubernetes: {namespace: n, selector: s, port: 1}, port: 80}\n",
            "under kubernetes.port",
        ),
        ("peers_from: {kubernetes: {namespace: n, selector: s, port: 0}}\n", "out of range"),
        ("peers_from: {kubernetes: {namespace: n, selector: s, port: [1]}}\n", "a port number or the name"),
        ("peers_from: {kubernetes: {namespace: '', selector: s, port: 1}}\n", "must not be empty"),
        (
            "peers_from: {kubernetes: {namespace: n, selector: s, port: 1, api: 'ftp://x'}}\n",
            "not an http:// or https:// URL",
        ),
        (
            "peers_from: {kubernetes: {namespace: n, selector: s, port: 1, service_account_dir: kube}}\n",
            "kube is not an absolute path",
        ),
        (
            "peers_from: {kubernetes: {namespace: n, selector: s, port: 1, service_account_dir: ''}}\n",
            "is not an absolute path",
        ),
        (
            "peers_from: {kubernetes: {namespace: n, selector: s, port: 1, api: 'http://127.0.0.1:8001', service_account_dir: /k}}\n",
            "an http:// api uses no token",
        ),
        ("peers_from: {dns: a.test, port: 80, max_concurrency: 0}\n", "max_concurrency 0 out of range"),
        ("peers_from: {dns: a.test, port: 80, probe_path: health}\n", "probe_path must start with '/'"),
        (
            "peers_from: {dns: a.test, port: 80}\npeers_by_model: {m: [a]}\n",
            "peers_by_model names peers",
        ),
        ("peers_from: {dns: a.test, port: 80, weight: 2}\n", "unknown field"),
    ] {
        let e = route(text).expect_err(text).to_string();
        assert!(e.contains(says), "{text}: {e}");
    }
}

#[test]
fn a_route_without_peers_loads_with_a_warning_that_it_has_none() {
    for text in ["balancing: {mode: hash}\n", "peers: []\n", "peers:\n"] {
        let r = route(text).unwrap_or_else(|e| panic!("{text}: {e}"));
        assert!(r.peers.is_empty(), "{text}");
        assert!(
            r.warnings
                .iter()
                .any(|w| w.starts_with("the route has no peers")),
            "{text}: {:?}",
            r.warnings
        );
    }
    // Control: peers listed, or peers_from to find them, warn of nothing.
    assert!(route(MINIMAL).unwrap().warnings.is_empty());
    let found = route("peers_from: {dns: pool.test, port: 80}\n").unwrap();
    assert!(found.warnings.is_empty(), "{:?}", found.warnings);
    // A pool still names peers that exist.
    let e = route("peers_by_model: {m: [a]}\n").unwrap_err();
    assert!(e.message.contains("unknown peer \"a\""), "{e}");
}

#[test]
fn resolver_defaults_bounds_and_nameservers() {
    let g = gw();
    assert_eq!(g.resolver, resolver::ResolverConfig::default());
    assert_eq!(
        (g.resolver.min_ttl, g.resolver.max_ttl),
        (Duration::from_secs(5), Duration::from_secs(60))
    );
    let parse = |text: &str| GatewayConfig::parse(Path::new("g.yaml"), text, &Overrides::default());
    let g = parse("resolver:\n  nameservers: [\"10.96.0.10\", \"127.0.0.1:5353\"]\n  min_ttl: 1s\n  max_ttl: 2s\n")
        .unwrap();
    assert_eq!(
        g.resolver.nameservers,
        vec![
            "10.96.0.10:53".parse().unwrap(),
            "127.0.0.1:5353".parse().unwrap()
        ]
    );
    assert_eq!(g.resolver.hosts_file, Path::new("/etc/hosts"));
    let other = parse("resolver: {hosts_file: /srv/hosts}\n").unwrap();
    assert_eq!(other.resolver.hosts_file, Path::new("/srv/hosts"));
    // A TTL is kept within the bounds.
    assert_eq!(
        g.resolver.next_lookup(Duration::ZERO),
        Duration::from_secs(1)
    );
    assert_eq!(
        g.resolver.next_lookup(Duration::from_secs(3600)),
        Duration::from_secs(2)
    );
    assert_eq!(
        g.resolver.next_lookup(Duration::from_millis(1500)),
        Duration::from_millis(1500)
    );
    for bad in [
        "resolver: {nameservers: [dns.local]}\n",
        "resolver: {min_ttl: 10ms}\n",
        "resolver: {min_ttl: 2m, max_ttl: 1m}\n",
        "resolver: {max_ttl: 2h}\n",
    ] {
        assert!(parse(bad).is_err(), "{bad}");
    }
}

#[test]
fn access_log_is_off_unless_set_and_trace_context_continues_by_default() {
    let g = gw();
    assert_eq!(g.access_log, None);
    assert_eq!(g.trace_context, TraceMode::Continue);
    let parse = |text: &str| GatewayConfig::parse(Path::new("g.yaml"), text, &Overrides::default());
    let file = parse("access_log: {path: /var/log/gw/access.log, queue_lines: 10}\n").unwrap();
    assert_eq!(
        file.access_log,
        Some(AccessLogConfig {
            target: AccessLogTarget::File(PathBuf::from("/var/log/gw/access.log")),
            queue_lines: 10
        })
    );
    let stdout = parse("access_log: {path: stdout}\n").unwrap();
    assert_eq!(
        stdout.access_log.map(|a| (a.target, a.queue_lines)),
        Some((AccessLogTarget::Stdout, DEFAULT_QUEUE_LINES))
    );
    assert_eq!(parse("access_log: {path: off}\n").unwrap().access_log, None);
    for (text, mode) in [
        ("trace_context: continue\n", TraceMode::Continue),
        ("trace_context: off\n", TraceMode::Off),
        ("trace_context: start\n", TraceMode::Start),
    ] {
        assert_eq!(parse(text).unwrap().trace_context, mode, "{text}");
    }
    for bad in [
        "access_log: {path: x, queue_lines: 0}\n",
        "access_log: {file: x}\n",
        "trace_context: sometimes\n",
    ] {
        let e = parse(bad).unwrap_err();
        assert!(e.line.is_some(), "{bad}: {e}");
    }
}

#[test]
fn tls_is_off_unless_set_and_needs_both_files() {
    assert_eq!(gw().tls, None);
    let parse = |text: &str| GatewayConfig::parse(Path::new("g.yaml"), text, &Overrides::default());
    let both = parse("tls: {cert: /etc/tls/tls.crt, key: /etc/tls/tls.key}\n").unwrap();
    assert_eq!(
        both.tls,
        Some(crate::config::TlsConfig {
            cert: PathBuf::from("/etc/tls/tls.crt"),
            key: PathBuf::from("/etc/tls/tls.key"),
        })
    );
    for bad in [
        "tls: {cert: /etc/tls/tls.crt}\n",
        "tls: {key: /etc/tls/tls.key}\n",
        "tls: {cert: a, key: b, ca: c}\n",
    ] {
        assert!(parse(bad).is_err(), "{bad}");
    }
}

/// A CA, and a client certificate and key it signed, written to `dir`.
#[cfg(feature = "tls")]
fn engine_tls_files(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca_key = rcgen::KeyPair::generate().expect("CA key");
    let ca_cert = ca.self_signed(&ca_key).expect("CA");
    let issuer = rcgen::Issuer::new(ca, ca_key);
    let key = rcgen::KeyPair::generate().expect("key");
    let cert = rcgen::CertificateParams::new(vec!["gateway.test".to_string()])
        .expect("params")
        .signed_by(&key, &issuer)
        .expect("client certificate");
    let files = (
        dir.join("ca.pem"),
        dir.join("client.pem"),
        dir.join("client.key"),
    );
    std::fs::write(&files.0, ca_cert.pem()).expect("ca");
    std::fs::write(&files.1, cert.pem()).expect("cert");
    std::fs::write(&files.2, key.serialize_pem()).expect("key");
    files
}

#[cfg(not(feature = "tls"))]
#[test]
fn without_the_tls_feature_a_peers_tls_is_refused_at_its_line() {
    let text =
        "peers:\n  - name: a\n    host: 127.0.0.1\n    port: 8001\n    tls: {sni: engine.test}\n";
    let e = route(text).unwrap_err().to_string();
    assert!(e.starts_with("routes/chat.yaml:5:"), "{e}");
    assert!(
        e.contains("this build has no TLS; build with --features tls"),
        "{e}"
    );
    let e = route("peers_from: {dns: pool.test, port: 80, tls: {}}\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("--features tls"), "{e}");
    // Control: the same peer without `tls:` loads.
    assert!(route("peers:\n  - {name: a, host: 127.0.0.1, port: 8001}\n").is_ok());
}

#[cfg(feature = "tls")]
#[test]
fn a_peers_tls_loads_its_files_and_each_broken_one_says_which_and_why() {
    let dir = tempfile::tempdir().expect("dir");
    let (ca, cert, key) = engine_tls_files(dir.path());
    let peer = |tls: &str| {
        format!("peers:\n  - name: a\n    host: 127.0.0.1\n    port: 8001\n    tls: {tls}\n")
    };
    let good = format!(
        "{{sni: engine.test, ca_file: {}, client_cert: {}, client_key: {}}}",
        ca.display(),
        cert.display(),
        key.display()
    );
    let r = route(&peer(&good)).expect("loads");
    let tls = r.peers[0].tls.as_ref().expect("tls");
    assert_eq!(tls.settings.sni.as_deref(), Some("engine.test"));
    assert!(tls.settings.verify);
    // Without sni, the host is the name checked; peers_from's DNS name is its peers'.
    let r = route(&peer("{}")).expect("system roots");
    assert_eq!(
        r.peers[0]
            .tls
            .as_ref()
            .expect("tls")
            .settings
            .sni
            .as_deref(),
        Some("127.0.0.1")
    );
    let r = route(&format!(
        "peers_from: {{dns: pool.test, port: 80, tls: {{ca_file: {}}}}}\n",
        ca.display()
    ))
    .expect("peers_from");
    let from = r.peers_from.expect("peers_from");
    let found = from.peer("p".into(), "10.0.0.9:80".parse().expect("addr"));
    assert_eq!(
        found.tls.expect("inherited").settings.sni.as_deref(),
        Some("pool.test")
    );

    let missing = dir.path().join("absent.pem");
    let garbage = dir.path().join("garbage.pem");
    std::fs::write(
        &garbage,
        "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n-----END CERTIFICATE-----\n",
    )
    .expect("garbage");
    let cases = [
        (format!("{{ca_file: {}}}", missing.display()), "ca_file"),
        (format!("{{ca_file: {}}}", garbage.display()), "garbage.pem"),
        (
            format!("{{client_cert: {}}}", cert.display()),
            "client_cert and client_key go together",
        ),
        (
            format!(
                "{{client_cert: {}, client_key: {}}}",
                ca.display(),
                key.display()
            ),
            "does not belong",
        ),
        (
            format!(
                "{{client_cert: {}, client_key: {}}}",
                cert.display(),
                cert.display()
            ),
            "client_key",
        ),
        ("{sni: 'not a name'}".to_string(), "not a host name"),
        ("{verify: maybe}".to_string(), "verify"),
        ("{ciphers: all}".to_string(), "unknown field"),
    ];
    for (tls, why) in cases {
        let e = route(&peer(&tls)).unwrap_err().to_string();
        assert!(e.starts_with("routes/chat.yaml:5:"), "{tls}: {e}");
        assert!(e.contains(why), "{tls}: {e}");
    }
    assert!(route(&peer(&format!("{{ca_file: {}}}", missing.display())))
        .unwrap_err()
        .to_string()
        .contains("absent.pem"));
}

#[test]
fn tracing_is_off_unless_set_and_starts_traces_when_on() {
    assert_eq!(gw().tracing, None);
    let parse = |text: &str| GatewayConfig::parse(Path::new("g.yaml"), text, &Overrides::default());
    let on = parse("tracing:\n  endpoint: http://collector:4318/v1/traces\n").unwrap();
    let t = on.tracing.expect("tracing on");
    assert_eq!(
        (
            t.endpoint.host.as_str(),
            t.endpoint.port,
            t.endpoint.path.as_str()
        ),
        ("collector", 4318, "/v1/traces")
    );
    assert_eq!(t.endpoint.to_string(), "http://collector:4318/v1/traces");
    assert_eq!(
        (
            t.sampling_ratio,
            t.queue_spans,
            t.batch_spans,
            t.service_name.as_str()
        ),
        (1.0, 2048, 512, "llm-gateway")
    );
    assert_eq!(
        on.trace_context,
        TraceMode::Start,
        "with an exporter a trace is started by default"
    );
    // OTLP/HTTP's port and path when the URL leaves them out.
    let bare = parse("tracing: {endpoint: \"http://[::1]\", sampling_ratio: 0.25}\n").unwrap();
    let t = bare.tracing.expect("on");
    assert_eq!(
        (
            t.endpoint.host.as_str(),
            t.endpoint.port,
            t.endpoint.path.as_str()
        ),
        ("::1", 4318, "/v1/traces")
    );
    assert_eq!(t.sampling_ratio, 0.25);
    // An explicit mode stays.
    let cont =
        parse("trace_context: continue\ntracing: {endpoint: http://c:1/v1/traces}\n").unwrap();
    assert_eq!(cont.trace_context, TraceMode::Continue);
}

#[test]
fn tracing_errors_name_their_key_and_line() {
    let parse = |text: &str| GatewayConfig::parse(Path::new("g.yaml"), text, &Overrides::default());
    for (bad, line, says) in [
        (
            "threads: 1\ntracing:\n  sampling_ratio: 0.5\n",
            2,
            "needs endpoint",
        ),
        (
            "tracing:\n  endpoint: https://collector:4318/v1/traces\n",
            2,
            "https is not supported",
        ),
        (
            "tracing:\n  endpoint: grpc://c:4317\n",
            2,
            "not an http:// URL",
        ),
        (
            "tracing:\n  endpoint: http://user:pw@c:4318/v1/traces\n",
            2,
            "credentials",
        ),
        (
            "tracing:\n  endpoint: http://c:4318/v1/traces\n  sampling_ratio: 1.5\n",
            3,
            "between 0.0 and 1.0",
        ),
        (
            "tracing:\n  endpoint: http://c:4318/v1/traces\n  queue_spans: 4\n  batch_spans: 5\n",
            4,
            "batch_spans",
        ),
        (
            "tracing:\n  endpoint: http://c:4318/v1/traces\n  timeout: 1ms\n",
            3,
            "tracing.timeout",
        ),
        (
            "trace_context: off\ntracing:\n  endpoint: http://c:4318/v1/traces\n",
            1,
            "trace_context: off",
        ),
        (
            "tracing:\n  endpoint: http://c:4318/v1/traces\n  sample: 1\n",
            3,
            "sample",
        ),
    ] {
        let e = parse(bad).unwrap_err();
        assert_eq!(e.line, Some(line), "{bad}: {e}");
        assert!(e.to_string().contains(says), "{bad}: {e}");
    }
}
