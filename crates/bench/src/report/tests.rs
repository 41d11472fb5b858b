use std::time::Duration;

use super::json::{cell_json, parameters_json};
use super::markdown::{prefill, scenario_markdown, spread, tokens};
use super::{json, markdown, progress_line};
use crate::analysis::{PrefillBound, Spread};
use crate::cell_spec::{CellKind, CellSpec};
use crate::options::REFERENCE;
use crate::peers::Skipped;
use crate::plan::Plan;
use crate::record::Record;
use crate::result::{error_kind, summarize, ModeResult, ScenarioResult};
use crate::versus::{best_peer, vs_best, VsBest};
use crate::window::Window;

#[test]
fn error_kinds_group_what_the_client_saw() {
    assert_eq!(error_kind("status 429: {\"error\":1}"), "status 429");
    assert_eq!(error_kind("status 502: bad gateway"), "status 502");
    assert_eq!(error_kind("connect: Connection refused"), "connect");
    assert_eq!(error_kind("connect e0: reset"), "connect");
    assert_eq!(error_kind("no complete response in 120s"), "timeout");
    assert_eq!(error_kind("stream cut: connection closed mid-body"), "cut");
    assert_eq!(
        error_kind("connection closed before the response head"),
        "cut"
    );
    assert_eq!(error_kind("stream had no usage frame"), "other");
}

#[test]
fn a_router_cell_claims_no_recognition_and_no_moves() {
    use crate::router::RouterSpec;
    use crate::window::{Lag, LoadSamples, Snapshot};
    let opts = crate::options::Options {
        duration: Duration::from_secs(10),
        warmup: Some(Duration::from_secs(1)),
        modes: vec!["vllm".into()],
        router: Some(RouterSpec {
            command: "vllm-router --port {port}".into(),
            label: "vllm".into(),
        }),
        ..Default::default()
    };
    let plan = Plan::new(opts);
    let snap = || Snapshot {
        at: tokio::time::Instant::now(),
        placements: Vec::new(),
        engines: Vec::new(),
        gateway_cpu: None,
        bench_cpu: None,
    };
    let window = Window {
        before: snap(),
        after: snap(),
        retired: Vec::new(),
        load: LoadSamples::default(),
        kv_committed: Vec::new(),
        lag: Lag::default(),
    };
    // Two turns of one session on e1, as a router cell records them:
    // the engine from the response id, no X-Routed-* header.
    let turn = |turn: u32, start: u64| Record {
        turn,
        session: "s0".into(),
        start: Duration::from_secs(start),
        end: Duration::from_secs(start + 1),
        ok: true,
        ttft: Some(Duration::from_millis(100)),
        usage: Some(crate::client::Usage {
            prompt_tokens: 1000,
            completion_tokens: 10,
            cached_tokens: 500,
        }),
        engine: Some(1),
        peer: Some("e1".into()),
        first_of_session: turn == 0,
        switched_peer: (turn > 0).then_some(false),
        ..Record::default()
    };
    let spec = plan.opts.router.clone().unwrap();
    let cell = CellSpec {
        name: "vllm",
        kind: CellKind::Router(&spec),
    };
    let r = summarize(&cell, &plan, &[turn(0, 2), turn(1, 4)], 0, &window);
    assert!(r.router && r.recognition.is_none());
    assert_eq!(r.new_sessions_per_peer.get("e1"), Some(&1));
    assert_eq!(r.switch_rate, Some(0.0));
    assert_eq!(r.cache_hit, Some(0.5));
    assert!(progress_line("uniform", &r).contains("moves -, no routed session"));
    let md = scenario_markdown(&plan, std::slice::from_ref(&r));
    assert!(md.contains("no routed session in vllm"), "{md}");
    assert!(
        md.contains("router cell vllm: `vllm-router --port {port}`"),
        "{md}"
    );
    assert!(!md.contains("| recognised |"), "{md}");
    let v = cell_json(&r, None);
    assert_eq!(v["router"], true);
    assert!(v["moves"].is_null() && v["session_recognition"].is_null());
    assert_eq!(parameters_json(&plan)["router"]["label"], "vllm");
    // A gateway cell is as before.
    let mut g = r.clone();
    g.router = false;
    assert!(progress_line("uniform", &g).contains("moves 0"));
}

fn cell(mode: &str, peer: bool, p95: Option<f64>, hit: Option<f64>, tok_s: f64) -> ModeResult {
    ModeResult {
        mode: mode.into(),
        router: peer,
        peer,
        requests: 100,
        requests_total: 100,
        ttft_p95: p95,
        ttft_p99: p95.map(|p| p * 2.0),
        cache_hit: hit,
        output_tok_s: tok_s,
        ..ModeResult::default()
    }
}

fn scenario(cells: Vec<ModeResult>, peers: &[&str], skipped: &[&str]) -> ScenarioResult {
    let opts = crate::options::Options {
        duration: Duration::from_secs(10),
        warmup: Some(Duration::from_secs(1)),
        peers: crate::peers::PEERS.to_vec(),
        ..Default::default()
    };
    ScenarioResult {
        plan: Plan::new(opts),
        cells,
        peers: peers
            .iter()
            .map(|p| (p.to_string(), format!("{p} --port {{port}}")))
            .collect(),
        skipped_peers: skipped
            .iter()
            .map(|p| Skipped {
                name: p.to_string(),
                reason: "x not found on PATH; run benches/peers.sh".into(),
            })
            .collect(),
    }
}

#[test]
fn the_best_peer_is_the_fastest_p95_of_the_peers_and_the_reference() {
    let cells = vec![
        // The fastest cell of all is the gateway's: not a peer.
        cell("load_aware", false, Some(0.2), Some(0.9), 110.0),
        cell(REFERENCE, false, Some(0.8), Some(0.7), 100.0),
        cell("vllm-sticky", true, Some(0.4), Some(0.8), 100.0),
        // Faster still, but no p95 (nothing succeeded): no claim.
        cell("vllm-cache", true, None, None, 0.0),
        cell("nginx-hash", true, Some(0.4), Some(0.5), 50.0),
    ];
    // Ties go to the cell that ran first.
    assert_eq!(best_peer(&cells, false), Some(2));
    let v = vs_best(&cells[0], &cells[2]);
    assert_eq!(v.p95, Some(0.5));
    assert_eq!(v.p99, Some(0.5));
    assert!((v.hit_points.unwrap() - 10.0).abs() < 1e-9, "{v:?}");
    assert_eq!(v.tok_s, Some(1.1));
    // The best against itself: 1x, 0 points.
    assert_eq!(
        vs_best(&cells[2], &cells[2]),
        VsBest {
            p95: Some(1.0),
            p99: Some(1.0),
            hit_points: Some(0.0),
            tok_s: Some(1.0)
        }
    );
    // Nothing to compare: no ratio rather than a division by zero.
    let v = vs_best(&cells[3], &cells[2]);
    assert_eq!(
        (v.p95, v.p99, v.hit_points, v.tok_s),
        (None, None, None, Some(0.0))
    );
    let zero = cell("z", true, Some(0.0), None, 0.0);
    assert_eq!(vs_best(&cells[0], &zero).p95, None);
    assert_eq!(vs_best(&cells[0], &zero).tok_s, None);
    // A peer over the error limit cannot be best where errors are not
    // the point; where they are, it can.
    let mut erring = cells.clone();
    erring[2].errors_total = 10;
    assert_eq!(best_peer(&erring, false), Some(4));
    assert_eq!(best_peer(&erring, true), Some(2));

    let s = scenario(cells, &["vllm-sticky", "sglang-cache"], &["vllm-hash"]);
    let md = markdown(std::slice::from_ref(&s), Duration::from_secs(60));
    assert!(md.contains("Best peer: **vllm-sticky**"), "{md}");
    assert!(
        md.contains("| load_aware | 0.50x | 0.50x | +10.0 pts | 1.10x |"),
        "{md}"
    );
    assert!(md.contains("| vllm-cache | - | - | - | 0.00x |"), "{md}");
    assert!(md.contains("- peer vllm-hash SKIPPED: x not found"), "{md}");
    assert!(md.contains("peer cell vllm-sticky: `vllm-sticky --port {port}`"));
    assert!(md.contains("no TCP_NODELAY"), "{md}");
    assert!(md.contains("do not fail the run"), "{md}");
    let j = json(std::slice::from_ref(&s), Duration::from_secs(60));
    let sc = &j["scenarios"][0];
    assert_eq!(sc["best_peer"], "vllm-sticky");
    assert_eq!(sc["skipped_peers"][0]["name"], "vllm-hash");
    assert_eq!(sc["peers"][1]["name"], "sglang-cache");
    let la = &sc["modes"][0];
    assert_eq!(
        (la["mode"].as_str(), la["peer"].as_bool()),
        (Some("load_aware"), Some(false))
    );
    assert_eq!(la["vs_best_peer"]["p95"], 0.5);
    assert_eq!(la["vs_best_peer"]["tok_s"], 1.1);
    assert_eq!(sc["modes"][2]["peer"], true);
    assert!(sc["modes"][3]["vs_best_peer"]["p95"].is_null());
}

#[test]
fn no_peer_ran_no_best_peer_and_no_ratios() {
    // Every peer skipped, only gateway cells: no best, nothing divided.
    let s = scenario(
        vec![cell("load_aware", false, Some(0.2), Some(0.9), 110.0)],
        &[],
        &["vllm-sticky", "nginx-hash"],
    );
    assert_eq!(best_peer(&s.cells, false), None);
    let md = markdown(std::slice::from_ref(&s), Duration::from_secs(60));
    assert!(md.contains("No best peer"), "{md}");
    assert!(!md.contains("vs best peer"), "{md}");
    assert!(md.contains("- peer nginx-hash SKIPPED"), "{md}");
    let j = json(std::slice::from_ref(&s), Duration::from_secs(60));
    let sc = &j["scenarios"][0];
    assert!(sc["best_peer"].is_null());
    assert!(sc["modes"][0]["vs_best_peer"].is_null());
    assert_eq!(sc["skipped_peers"].as_array().map(Vec::len), Some(2));
    // A reference cell that completed nothing is no best peer either.
    let s = scenario(vec![cell(REFERENCE, false, None, None, 0.0)], &[], &[]);
    assert_eq!(best_peer(&s.cells, false), None);
    assert!(markdown(&[s], Duration::ZERO).contains("No best peer"));
    // Without --peers and without a reference cell: not a word of it.
    let mut s = scenario(vec![cell("hash", false, Some(0.3), None, 1.0)], &[], &[]);
    s.plan.opts.peers.clear();
    let md = markdown(&[s], Duration::ZERO);
    assert!(
        !md.contains("best peer") && !md.contains("Best peer"),
        "{md}"
    );
}

#[test]
fn token_counts_and_spreads_read_at_a_glance() {
    assert_eq!(tokens(950.0), "950");
    assert_eq!(tokens(45_678.0), "45.7k");
    assert_eq!(tokens(1_234_567.0), "1.23M");
    let s = Spread {
        min_mean: 6.04,
        max_mean: 9.96,
        min: 4.0,
        max: 12.0,
    };
    assert_eq!(
        spread(Some(s), |v| format!("{v:.1}")),
        "6.0-10.0 (4.0-12.0)"
    );
    assert_eq!(spread(None, tokens), "-");
    let p = PrefillBound {
        prefilled: 1_500_000,
        bound: 1_000_000,
    };
    assert_eq!(prefill(&p), "1.50M / 1.00M = 1.50x");
}

#[test]
fn the_json_parameters_name_the_redis_delay_and_stop() {
    let parse = crate::options::tests::parse;
    let p = Plan::new(
        parse("--replicas 2 --session-store redis --redis-delay 5 --redis-stop-at 3").unwrap(),
    );
    let j = parameters_json(&p);
    assert_eq!(
        (j["replicas"].as_u64(), j["session_store"].as_str()),
        (Some(2), Some("redis"))
    );
    assert_eq!(j["redis_delay_ms"], 5);
    assert_eq!(j["redis_stop_at_s"], 3.0);
    // The control: Redis without either flag.
    let j = parameters_json(&Plan::new(parse("--session-store redis").unwrap()));
    assert_eq!(j["redis_delay_ms"], 0);
    assert!(j["redis_stop_at_s"].is_null());
}
