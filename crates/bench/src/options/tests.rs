use super::*;
use crate::plan::Plan;
use clap::Parser;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: BenchArgs,
}

/// The options as `llm-gateway bench` takes them: resolved, and fit
/// for every scenario's plan.
pub(crate) fn parse(s: &str) -> Result<Options, String> {
    let argv = std::iter::once("bench").chain(s.split_whitespace());
    let opts = Cli::try_parse_from(argv)
        .map_err(|e| e.to_string())?
        .args
        .resolve()?;
    crate::plan::plans(&opts)?;
    Ok(opts)
}

#[test]
fn flags_in_both_forms_and_presets() {
    let o = parse(
        "--engines=2 --sessions 4 --duration 30s --seed 9 --modes hash,least_conn \
         --user-tokens 100-200 --think-ms=10-20 --json",
    )
    .unwrap();
    assert_eq!((o.engines, o.sessions_per_engine, o.seed), (2, 4, 9));
    assert_eq!(o.duration, Duration::from_secs(30));
    assert_eq!(o.modes, vec!["hash", "least_conn"]);
    assert_eq!(o.user_tokens, (100, 200));
    assert_eq!(o.think_ms, (10, 20));
    assert!(o.json);
    let q = parse("--quick").unwrap();
    assert_eq!(q.duration, Duration::from_secs(10));
    assert_eq!(q.warmup, Some(Duration::from_secs(2)));
    let r = parse("--realistic-scale").unwrap();
    assert_eq!(r.duration, Duration::from_secs(120));
    let p = Plan::new(r);
    assert_eq!(p.engine.decode_ms_per_token, 20);
    assert_eq!(p.engine.prefill_us_per_token, 100);
    assert_eq!(p.workload.think_ms, (1_000, 6_000));
}

#[test]
fn scenarios_and_modes_default_and_parse() {
    let d = parse("").unwrap();
    assert_eq!(d.scenarios, vec![Scenario::Uniform]);
    assert_eq!(
        d.modes,
        vec![
            "load_aware",
            "hash",
            "least_conn",
            "round_robin",
            "reference"
        ]
    );
    let o = parse(
        "--scenario uniform,failover --scenario skewed --scenario=failover \
         --scenario slow-engine,overload --route-extra queue_timeout:30s --plot /tmp/x.svg",
    )
    .unwrap();
    use Scenario::*;
    assert_eq!(
        o.scenarios,
        vec![Uniform, Failover, Skewed, SlowEngine, Overload]
    );
    assert_eq!(o.route_extra.as_deref(), Some("queue_timeout:30s"));
    assert_eq!(o.plot, Some(PathBuf::from("/tmp/x.svg")));
    assert_eq!(o.max_concurrency, None);
    assert_eq!(
        parse("--max-concurrency 64").unwrap().max_concurrency,
        Some(64)
    );
    assert!(parse("--max-concurrency 0").is_err());
    assert!(
        parse("--scenario noisy-neighbor --quiet-alone")
            .unwrap()
            .quiet_alone
    );
    assert!(parse("--scenario uniform --quiet-alone").is_err());
    // The reference cell needs no gateway binary.
    assert!(parse("--gateway /nonexistent/gw --modes reference").is_ok());
    assert!(parse("--scenario forks").unwrap().scenarios == vec![Forks]);
}

#[test]
fn session_ids_default_to_the_header() {
    use crate::ids::SessionIdMode::*;
    let d = parse("").unwrap();
    assert_eq!((d.session_id, d.id_share), (Header, 0.5));
    for (arg, mode) in [
        ("header", Header),
        ("none", None),
        ("prompt-cache-key", PromptCacheKey),
        ("mixed", Mixed),
    ] {
        assert_eq!(
            parse(&format!("--session-id {arg}")).unwrap().session_id,
            mode
        );
    }
    let m = parse("--session-id=mixed --id-share 0.25").unwrap();
    assert_eq!((m.session_id, m.id_share), (Mixed, 0.25));
    assert_eq!(
        parse("--session-id mixed --id-share 1").unwrap().id_share,
        1.0
    );
}

/// `parse` splits on whitespace; a router command has spaces.
fn parse_with_router(args: &str, command: &str) -> Result<Options, String> {
    let argv = std::iter::once("bench")
        .chain(args.split_whitespace())
        .chain(["--router-cmd", command]);
    Cli::try_parse_from(argv)
        .map_err(|e| e.to_string())?
        .args
        .resolve()
}

#[test]
fn a_router_runs_one_cell_named_by_its_label() {
    let cmd = "vllm-router --port {port} --worker-urls {engines} --prometheus-port \
               {metrics_port}";
    let o = parse_with_router("--session-id none", cmd).unwrap();
    assert_eq!(o.modes, vec!["router"]);
    assert_eq!(
        o.router,
        Some(RouterSpec {
            command: cmd.into(),
            label: "router".into()
        })
    );
    assert!(!o.needs_gateway());
    let o = parse_with_router("--router-label vllm-ca --modes load_aware", cmd).unwrap();
    assert_eq!(o.modes, vec!["vllm-ca"]);
    assert_eq!(o.router.unwrap().label, "vllm-ca");
    // Without the flag nothing changes.
    let d = parse("").unwrap();
    assert_eq!(d.router, None);
    assert!(d.needs_gateway());
    assert!(!parse("--modes reference").unwrap().needs_gateway());
    for bad in [
        "--modes load_aware,hash",
        "--modes reference",
        "--router-label reference",
        "--router-label a|b",
        "--replicas 2",
        "--session-store redis",
        "--route-extra queue_timeout:30s",
        "--gateway /bin/sh",
    ] {
        assert!(parse_with_router(bad, cmd).is_err(), "{bad}");
    }
    assert!(parse_with_router("", "r --port {prot}").is_err());
    assert!(parse_with_router("", "r --worker-urls {engines}").is_err());
    assert!(parse("--router-label x").is_err());
}

#[test]
fn peers_bare_all_or_a_subset() {
    let names = |o: Options| o.peers.iter().map(|p| p.name).collect::<Vec<_>>();
    assert!(parse("").unwrap().peers.is_empty());
    let all: Vec<&str> = peers::PEERS.iter().map(|p| p.name).collect();
    assert_eq!(names(parse("--peers").unwrap()), all);
    // Bare, before another flag: that flag is not taken as its value.
    let o = parse("--peers --modes load_aware,reference").unwrap();
    assert_eq!((o.modes.len(), o.peers.len()), (2, 5));
    assert_eq!(names(parse("--peers all").unwrap()), all);
    assert_eq!(
        names(parse("--peers nginx-hash,vllm-sticky,nginx-hash").unwrap()),
        vec!["nginx-hash", "vllm-sticky"]
    );
    assert_eq!(
        names(parse("--peers=sglang-cache --modes reference").unwrap()),
        vec!["sglang-cache"]
    );
    // Peers need no gateway binary; the gateway modes still do.
    assert!(!parse("--peers --modes reference").unwrap().needs_gateway());
    assert!(parse("--peers").unwrap().needs_gateway());
    for bad in ["--peers vllm", "--peers nginx-hash,bogus", "--peers ,"] {
        assert!(parse(bad).is_err(), "{bad}");
    }
    let cmd = "r --port {port}";
    assert!(parse_with_router("--peers nginx-hash", cmd)
        .unwrap_err()
        .contains("--peers"));
    // The control: the same router command alone is fine.
    assert!(parse_with_router("", cmd).is_ok());
}

#[test]
fn bad_arguments_are_rejected() {
    for bad in [
        "--engines 0",
        "--engines x",
        "--duration 1s",
        "--duration 10s --warmup 10s",
        "--modes fastest",
        "--user-tokens 300-100",
        "--max-context 3000",
        "--bogus",
        "--seed",
        "--scenario nope",
        "--scenario",
        "--gateway /nonexistent/gw",
        "--session-id anonymous",
        "--id-share 0.5",
        "--session-id none --id-share 0.5",
        "--session-id mixed --id-share 1.5",
        "--session-id mixed --id-share -0.1",
    ] {
        assert!(parse(bad).is_err(), "{bad}");
    }
}

#[test]
fn redis_delay_and_stop_need_the_redis_store() {
    let o =
        parse("--replicas 2 --session-store redis --redis-delay 5 --redis-stop-at 2.5").unwrap();
    assert_eq!(o.redis_delay, Duration::from_millis(5));
    assert_eq!(o.redis_stop_at, Some(Duration::from_millis(2_500)));
    let d = parse("--session-store redis").unwrap();
    assert_eq!((d.redis_delay, d.redis_stop_at), (Duration::ZERO, None));
    // The same flags without the redis store, or with the local one, are
    // refused and say why.
    for flags in ["--redis-delay 5", "--redis-stop-at 5"] {
        for store in ["", "--session-store local", "--replicas 2"] {
            let e = parse(&format!("{flags} {store}")).unwrap_err();
            assert!(
                e.contains("--session-store redis only"),
                "{flags} {store}: {e}"
            );
        }
        assert!(
            parse(&format!("{flags} --session-store redis")).is_ok(),
            "{flags}"
        );
    }
    // The stop falls inside the measured window: 60s with 10s of warm-up
    // leaves 50s; --quick, 10s with 2s, leaves 8s.
    assert!(parse("--session-store redis --redis-stop-at 49.9").is_ok());
    let e = parse("--session-store redis --redis-stop-at 50").unwrap_err();
    assert!(e.contains("past the measured window"), "{e}");
    assert!(parse("--quick --session-store redis --redis-stop-at 7").is_ok());
    assert!(parse("--quick --session-store redis --redis-stop-at 8").is_err());
    for bad in [
        "--session-store redis --redis-delay -1",
        "--session-store redis --redis-delay 1.5",
        "--session-store redis --redis-stop-at -1",
        "--session-store redis --redis-stop-at x",
        "--session-store redis --redis-stop-at 1e300",
    ] {
        assert!(parse(bad).is_err(), "{bad}");
    }
}
