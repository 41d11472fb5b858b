use super::*;
use crate::options::tests::parse;

#[test]
fn defaults_and_derived_engine_settings() {
    let o = parse("").unwrap();
    assert_eq!(o, Options::default());
    let p = Plan::new(o);
    // vLLM by default: its batch of 256, bound by KV blocks.
    assert_eq!(p.engine.profile, Profile::Vllm);
    assert_eq!((p.engine.max_num_seqs, p.engine.max_running), (256, 256));
    assert_eq!(p.engine.max_num_batched_tokens, 8192);
    assert_eq!(p.engine.step_cost, StepCost::scaled_to(10, 50));
    // 1.75 x 8 sessions x 31k mean context, block-aligned.
    assert_eq!(p.engine.kv_capacity_tokens, 434_000);
    assert_eq!(p.warmup, Duration::from_secs(10));
    assert_eq!(p.slots(), 32);
    let d = p.describe();
    assert!(d.contains("max_num_seqs 256"), "{d}");
    assert!(
        d.contains("engine profile: vllm (vLLM V1's scheduler"),
        "{d}"
    );
    // The slot profiles: 3/4 of the sessions.
    for (args, profile) in [
        ("--engine-profile slots", Profile::Slots),
        ("--engine-profile=llamacpp", Profile::Llamacpp),
    ] {
        let p = Plan::new(parse(args).unwrap());
        assert_eq!((p.engine.profile, p.engine.max_running), (profile, 6));
        assert!(p.describe().contains("max_running 6"));
    }
    assert!(Plan::new(parse("--engine-profile slots").unwrap())
        .describe()
        .contains("engine profile: slots"));
    // --max-running is the batch profiles' max_num_seqs.
    let p = Plan::new(parse("--engine-profile sglang --max-running 32").unwrap());
    assert_eq!(
        (p.engine.profile, p.engine.max_num_seqs),
        (Profile::Sglang, 32)
    );
    assert!(parse("--engine-profile tgi").is_err());
}

fn plan(args: &str, scenario: Scenario) -> Plan {
    Plan::for_scenario(parse(args).unwrap(), scenario).unwrap()
}

#[test]
fn uniform_is_the_workload_the_bench_always_had() {
    let u = plan("", Scenario::Uniform);
    let old = Plan::new(parse("").unwrap());
    assert_eq!(u.workload, old.workload);
    assert_eq!(u.workload.long, None);
    assert_eq!(u.engines.len(), 4);
    assert!(u
        .engines
        .iter()
        .all(|e| e.decode_ms_per_token == 10 && e.kv_capacity_tokens == 434_000));
    assert_eq!((u.failover, u.overload), (None, None));
    assert!(u.describe().starts_with("scenario uniform: "));
}

#[test]
fn skewed_mixes_one_long_session_per_engine_into_short_chats() {
    let p = plan("", Scenario::Skewed);
    let w = &p.workload;
    assert_eq!((w.slots, w.long_slots()), (32, 4));
    assert_eq!(w.shape(0).user_tokens, (4_000, 12_000));
    assert_eq!(w.shape(3).max_context, 120_000);
    assert_eq!(w.shape(4).user_tokens, (100, 1_000));
    assert_eq!(w.shape(31).max_context, 8_000);
    // (4 x 61k + 28 x 5k) / 32 = 12k mean; KV 1.75 x 8 x 12k.
    assert_eq!(w.mean_context(), 12_000);
    assert_eq!(p.engine.kv_capacity_tokens, 168_000);
    let d = p.describe();
    assert!(d.contains("4 long agent sessions"), "{d}");
    assert!(d.contains("among 28 short chats"), "{d}");
    // The long sessions must fit a turn after the system prompt.
    let err = Plan::for_scenario(
        parse("--system-tokens 108000 --max-context 200000").unwrap(),
        Scenario::Skewed,
    );
    assert!(err.is_err());
    assert!(parse("--system-tokens 108000 --max-context 200000 --scenario skewed").is_err());
}

#[test]
fn slow_engine_slows_only_e0() {
    let p = plan("--time-scale 2", Scenario::SlowEngine);
    let speeds: Vec<(u64, u64)> = p
        .engines
        .iter()
        .map(|e| (e.decode_ms_per_token, e.prefill_us_per_token))
        .collect();
    assert_eq!(speeds, vec![(50, 250), (20, 100), (20, 100), (20, 100)]);
    assert!(p
        .describe()
        .contains("e0 runs at 0.4x speed: decode 50 ms/token"));
}

#[test]
fn failover_is_scheduled_inside_the_window() {
    let p = plan("", Scenario::Failover);
    let f = p.failover.unwrap();
    assert_eq!((f.engine, f.at, f.back()), (0, secs(20), secs(40)));
    let q = plan("--quick", Scenario::Failover);
    assert_eq!(
        q.failover.map(|f| (f.at, f.back())),
        Some((secs(4), secs(8)))
    );
    assert!(p.describe().contains("e0 is shut down at 20s"));
}

#[test]
fn overload_doubles_sessions_on_the_same_kv_and_derives_think_times() {
    let p = plan("", Scenario::Overload);
    assert_eq!((p.sessions_per_engine, p.slots()), (16, 64));
    assert_eq!(p.workload.slots, 64);
    // KV of the engines sized for 8 sessions; with slots, 3/4 of 16 may run.
    assert_eq!(p.engine.kv_capacity_tokens, 434_000);
    let slots = plan("--engine-profile slots", Scenario::Overload);
    assert_eq!(slots.engine.max_running, 12);
    // A turn is busy (1750 + 200) x 50 us + 200 x 10 ms = 2.0975 s; 80%
    // of 434k over 16 x 31k is 70% in the engine: 0.899 s mean think.
    let t = p.overload.unwrap();
    assert_eq!(p.workload.think_ms, (449, 1348));
    assert_eq!(t.think_ms, p.workload.think_ms);
    assert!((t.in_engine - 0.7).abs() < 1e-6);
    let d = p.describe();
    assert!(d.contains("80% of KV committed"), "{d}");
    assert!(d.contains("sessions/engine 16 = 64 concurrent"), "{d}");
}

#[test]
fn forks_has_fewer_parents_on_the_engines_of_uniform() {
    let p = plan("", Scenario::Forks);
    let u = plan("", Scenario::Uniform);
    assert_eq!((p.sessions_per_engine, p.slots()), (6, 24));
    assert_eq!(p.workload.slots, 24);
    // The engines of uniform: max_running and KV for 8 sessions each.
    assert_eq!(p.engine.max_running, u.engine.max_running);
    assert_eq!(p.engine.kv_capacity_tokens, u.engine.kv_capacity_tokens);
    let f = p.workload.forks.unwrap();
    assert_eq!((f.one_in, f.agents, f.turns), (12, (2, 3), (2, 4)));
    // ~1.3 live sessions per parent: ~7.8 per engine, uniform's 8.
    assert!((f.mean_live() * 6.0 - 7.8).abs() < 1e-9);
    assert_eq!(u.workload.forks, None);
    let d = p.describe();
    assert!(d.contains("6 parent agents per engine (3/4 of 8)"), "{d}");
    assert!(d.contains("~7.8 per engine"), "{d}");
    // The engines' reasoning counts the live sessions, not the parents.
    assert!(d.contains("sessions/engine 6 = 24 concurrent"), "{d}");
    assert!(d.contains("so 8 sessions keep"), "{d}");
    assert!(d.contains("session ids: header"), "{d}");
    let m = plan("--session-id mixed --id-share 0.3", Scenario::Forks);
    assert!(m.describe().contains("session ids: mixed (30% of sessions"));
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

#[test]
fn noisy_neighbor_is_overload_split_between_two_tenants() {
    let p = plan("", Scenario::NoisyNeighbor);
    let o = plan("", Scenario::Overload);
    assert_eq!(p.slots(), o.slots());
    assert_eq!(p.workload.think_ms, o.workload.think_ms);
    assert!(p.workload.noisy_neighbor && !o.workload.noisy_neighbor);
    // One slot in 11 is quiet's: noisy has ten times its sessions.
    let quiet = (0..p.workload.slots)
        .filter(|s| scenario::noisy_tenant(*s).0 == 0)
        .count();
    assert_eq!(quiet, 6, "slots 0, 11, ..., 55 of 64");
    assert_eq!(scenario::noisy_tenant(11), (0, "quiet"));
    assert_eq!(scenario::noisy_tenant(12), (1, "noisy"));
    assert!(p.describe().contains("x-gateway-inference-fairness-id"));
}

#[test]
fn the_redis_delay_and_stop_are_in_the_header() {
    let p = Plan::new(
        parse("--replicas 2 --session-store redis --redis-delay 5 --redis-stop-at 3").unwrap(),
    );
    let d = p.describe();
    assert!(d.contains("2 gateway replica(s)"), "{d}");
    assert!(d.contains("relay adding 5 ms per round trip"), "{d}");
    assert!(
        d.contains("redis-server killed 3s into the measured window"),
        "{d}"
    );
    // The control: Redis without either flag is said without them.
    let plain = Plan::new(parse("--replicas 2 --session-store redis").unwrap());
    let d = plain.describe();
    assert!(d.contains("session store: redis"), "{d}");
    assert!(!d.contains("relay") && !d.contains("killed"), "{d}");
}
