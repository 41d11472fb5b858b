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

/// A llama.cpp peer whose route sets no `max_concurrency` takes the
/// engine's slots (`/props` `total_slots`) as its limit: llama-server
/// defers what its slots cannot take, and a lower limit in front of it
/// only adds a queue. A limit the route sets stays, and an engine without
/// slots keeps the default; `/_route_state` says which.
#[test]
fn a_llama_cpp_peer_without_a_limit_takes_the_engines_slots() {
    let cluster = spawn_engines_with(
        vec![
            engine(Profile::Llamacpp, true),
            engine(Profile::Vllm, true),
            engine(Profile::Llamacpp, true),
        ],
        0,
    )
    .expect("engines");
    let port = |i: usize| cluster.engines[i].addr.port();
    let route = format!(
        "peers:\n  - {{name: llama, host: 127.0.0.1, port: {}}}\n  - {{name: vllm, host: 127.0.0.1, port: {}}}\n  \
         - {{name: set, host: 127.0.0.1, port: {}, max_concurrency: 9}}\nengine_metrics:\n  interval: 100ms\n",
        port(0),
        port(1),
        port(2)
    );
    let gw = common::Gateway::start(&[("chat", route)]);
    let limits = |state: &serde_json::Value| -> Vec<(u64, String)> {
        state["peers"]
            .as_array()
            .expect("peers")
            .iter()
            .map(|p| {
                let source = p["max_concurrency_source"]
                    .as_str()
                    .unwrap_or("")
                    .to_string();
                (p["max_concurrency"].as_u64().unwrap_or(0), source)
            })
            .collect()
    };
    let state = common::wait_for("the llama.cpp peer's slots", common::DEADLINE, || {
        let s = http::get(gw.addr, "/chat/_route_state").json();
        (s["peers"][0]["max_concurrency_source"] == "engine_slots").then_some(s)
    });
    assert_eq!(
        limits(&state),
        vec![
            (4, "engine_slots".to_string()),
            (64, "default".to_string()),
            (9, "route".to_string()),
        ]
    );
    assert_eq!(state["peers"][0]["engine_slots"], 4);
    // The route set its own: the engine's slots are known, not used.
    common::wait_for("the set peer's slots read too", common::DEADLINE, || {
        let s = http::get(gw.addr, "/chat/_route_state").json();
        (s["peers"][2]["engine_slots"] == 4).then_some(())
    });
    let s = http::get(gw.addr, "/chat/_route_state").json();
    assert_eq!(s["peers"][2]["max_concurrency"], 9);
    assert!(
        s["peers"][1]["engine_slots"].is_null(),
        "vLLM has no /props"
    );
}
