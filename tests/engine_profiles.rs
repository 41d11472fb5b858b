//! Each simulated engine profile's `/metrics` (and llama.cpp's `/props`)
//! read by the gateway's own scraper, as it reads the real engine it
//! imitates: what placement learns of load and KV capacity from each.

mod common;

use common::http;
use llm_gateway::health::prom::{parse_engine_load, parse_kv_capacity, parse_props_capacity};
use llm_gateway_sim::{spawn_engines_with, EngineConfig, Profile};

fn engine(profile: Profile, publish_kv_capacity: bool) -> EngineConfig {
    EngineConfig {
        profile,
        max_running: 4,
        kv_capacity_tokens: 64_000,
        publish_kv_capacity,
        ..EngineConfig::default()
    }
}

#[test]
fn every_profile_reads_as_the_engine_it_imitates() {
    let cluster = spawn_engines_with(
        vec![
            engine(Profile::Vllm, true),
            engine(Profile::Sglang, true),
            engine(Profile::Llamacpp, true),
            engine(Profile::Slots, true),
            engine(Profile::Vllm, false),
            engine(Profile::Sglang, false),
        ],
        0,
    )
    .expect("engines");
    let get = |i: usize, path: &str| http::get(cluster.engines[i].addr, path);
    let metrics = |i: usize| get(i, "/metrics").text();
    for (i, name) in ["vllm", "sglang", "llamacpp", "slots"].iter().enumerate() {
        let load = parse_engine_load(&metrics(i));
        assert_eq!(
            load.map(|l| (l.running, l.waiting)),
            Some((0, 0)),
            "{name}: an idle engine's load is read"
        );
    }
    // vLLM and SGLang publish their KV capacity (vLLM in whole blocks),
    // the slot-limited engine too, under vLLM's names.
    assert_eq!(parse_kv_capacity(&metrics(0)), Some(64_000));
    assert_eq!(parse_kv_capacity(&metrics(1)), Some(64_000));
    assert_eq!(parse_kv_capacity(&metrics(3)), Some(64_000));
    // llama.cpp publishes none in its metrics, only its context in /props:
    // 4 slots of 16000.
    assert_eq!(parse_kv_capacity(&metrics(2)), None);
    let props = get(2, "/props");
    assert_eq!(props.status(), 200);
    assert_eq!(parse_props_capacity(&props.body), Some(64_000));
    // The control for /props: the other engines have none.
    assert_eq!(get(0, "/props").status(), 404);
    // Engines that keep their capacity to themselves still report load.
    for i in [4, 5] {
        let text = metrics(i);
        assert_eq!(parse_kv_capacity(&text), None, "{text}");
        assert!(parse_engine_load(&text).is_some());
    }
}
