//! Gateway replicas that agree on every session through a real
//! Redis (started per test on an ephemeral port). Two gateway processes
//! serve the same route file in front of the same simulated engines.

mod common;

use common::http;
use common::redis::Redis;
use common::*;
use std::collections::HashMap;
use std::sync::atomic::Ordering;

fn store(redis: &Redis) -> String {
    format!(
        "session_store:\n  kind: redis\n  url: {}\n  timeout: 200ms\n",
        redis.url()
    )
}

fn replicas(cluster: &SimCluster, extra: &str) -> (Gateway, Gateway) {
    let route = route_yaml(&ports(cluster), "");
    let start = || {
        Gateway::start_with(
            &[("chat", route.clone())],
            GatewayOptions {
                extra_config: extra.to_string(),
                ..Default::default()
            },
        )
    };
    (start(), start())
}

#[test]
fn with_redis_two_replicas_send_every_turn_of_a_session_to_one_engine() {
    let cluster = engines(4);
    let redis = Redis::start();
    let (a, b) = replicas(&cluster, &store(&redis));
    assert_eq!(split_sessions(&a, &b, 20, 4), 0);
    // Every binding is under its hash: no raw session id anywhere in Redis.
    let dump = redis.dump();
    assert!(dump.contains("llmgw:s:chat:"), "{dump}");
    assert!(
        !dump.contains("agent-session"),
        "a raw id reached Redis:\n{dump}"
    );
    assert!(!a.log().contains("agent-session") && !b.log().contains("agent-session"));
    assert_eq!(a.metric("llm_gateway_session_store_up", &[]), 1.0);

    // Control: with local tables the same traffic splits some sessions.
    let (la, lb) = replicas(&cluster, "");
    assert!(
        split_sessions(&la, &lb, 20, 4) > 0,
        "local tables agreed on every session: the test could not fail"
    );
}

#[test]
fn a_race_of_first_turns_binds_each_session_once() {
    let cluster = engines(4);
    let redis = Redis::start();
    let (a, b) = replicas(&cluster, &store(&redis));
    let first: Vec<(String, String)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..50)
            .flat_map(|i| {
                let id = format!("race-{i}");
                let (a, b) = (&a, &b);
                let (id_a, id_b) = (id.clone(), id);
                [
                    s.spawn(move || served_by(a, &id_a, 0)),
                    s.spawn(move || served_by(b, &id_b, 0)),
                ]
            })
            .collect();
        let peers: Vec<String> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        peers
            .chunks(2)
            .map(|p| (p[0].clone(), p[1].clone()))
            .collect()
    });
    let split = first.iter().filter(|(x, y)| x != y).count();
    let errors = (
        a.metric("llm_gateway_session_store_errors_total", &[]),
        b.metric("llm_gateway_session_store_errors_total", &[]),
    );
    assert_eq!(
        split, 0,
        "first turns placed two ways (store errors {errors:?}): {first:?}"
    );
    let bindings = redis
        .keys()
        .into_iter()
        .filter(|k| k.starts_with("llmgw:s:chat:"))
        .count();
    assert_eq!(bindings, 50);
}

#[test]
fn a_migration_decided_on_one_replica_is_followed_by_the_other() {
    let cluster = engines(3);
    let redis = Redis::start();
    let route = route_yaml(
        &ports(&cluster),
        "health: {interval: 100ms, ban_ttl: 60s}\n",
    );
    let start = || {
        Gateway::start_with(
            &[("chat", route.clone())],
            GatewayOptions {
                extra_config: store(&redis),
                ..Default::default()
            },
        )
    };
    let (a, b) = (start(), start());
    // Sessions bound on A; each one's engine noted.
    let homes: HashMap<String, String> = (0..12)
        .map(|i| {
            let id = format!("mig-{i}");
            let home = served_by(&a, &id, 0);
            (id, home)
        })
        .collect();
    let victim = homes.values().next().cloned().expect("a home");
    let index: usize = victim.trim_start_matches('e').parse().expect("eN");
    cluster.engines[index]
        .faults
        .health_down
        .store(true, Ordering::Relaxed);
    let label = format!("peer=\"{victim}\"");
    for gw in [&a, &b] {
        wait_for("both replicas to ban the engine", DEADLINE, || {
            (gw.metric("llm_gateway_peer_ready", &[&label]) == 0.0).then_some(())
        });
    }
    let moved: Vec<&String> = homes
        .iter()
        .filter(|(_, home)| **home == victim)
        .map(|(id, _)| id)
        .collect();
    assert!(!moved.is_empty());
    for id in moved {
        // A migrates it; B, asked next, goes where A moved it.
        let on_a = served_by(&a, id, 1);
        assert_ne!(on_a, victim);
        let on_b = served_by(&b, id, 2);
        assert_eq!(on_b, on_a, "{id}: B chose its own migration target");
    }
}

#[test]
fn with_redis_gone_requests_are_placed_locally_and_bindings_converge_when_it_returns() {
    let cluster = engines(4);
    let mut redis = Redis::start();
    let port = redis.port;
    let (a, b) = replicas(&cluster, &store(&redis));
    assert_eq!(served_by(&a, "before", 0), served_by(&b, "before", 1));
    redis.kill();
    // Every request still succeeds, from the local table.
    let during: Vec<(String, String)> = (0..8)
        .map(|i| {
            let id = format!("offline-{i}");
            (id.clone(), served_by(&a, &id, 0))
        })
        .collect();
    wait_for("the store to be reported down", DEADLINE, || {
        (a.metric("llm_gateway_session_store_up", &[]) == 0.0).then_some(())
    });
    assert!(a.metric("llm_gateway_session_store_errors_total", &[]) > 0.0);
    // Redis back on the same port: A writes back what it placed meanwhile,
    // and B then follows A for those sessions.
    let redis = Redis::start_on(port);
    wait_for("the written-back bindings", DEADLINE, || {
        let keys = redis.keys();
        (keys
            .iter()
            .filter(|k| k.starts_with("llmgw:s:chat:"))
            .count()
            >= 8)
            .then_some(())
    });
    assert_eq!(a.metric("llm_gateway_session_store_up", &[]), 1.0);
    for (id, home) in &during {
        assert_eq!(&served_by(&b, id, 1), home, "{id} converged on A's engine");
    }
}

/// The live sessions `gw` counts on its peers (placement's view).
fn live_sessions(gw: &Gateway) -> u64 {
    peers_sum(gw, "live_sessions") as u64
}

/// `field` of `/_route_state`, summed over the route's peers.
fn peers_sum(gw: &Gateway, field: &str) -> f64 {
    let state = http::get(gw.addr, "/chat/_route_state").json();
    state["peers"]
        .as_array()
        .expect("peers")
        .iter()
        .filter_map(|p| p[field].as_f64())
        .sum()
}

#[test]
fn a_replica_counts_the_sessions_another_replica_holds_on_each_engine() {
    let cluster = engines(3);
    let redis = Redis::start();
    let (a, b) = replicas(&cluster, &store(&redis));
    for i in 0..6 {
        served_by(&a, &format!("held-by-a-{i}"), 0);
    }
    // B never saw these sessions, yet places new ones knowing they are there.
    wait_for("B to see A's six live sessions", DEADLINE, || {
        (live_sessions(&b) == 6).then_some(())
    });
    assert_eq!(live_sessions(&a), 6, "counted once, not once per replica");
    // B cannot know when A's sessions last answered: they weigh whole.
    assert_eq!(peers_sum(&b, "returning_sessions"), 6.0);
    // Control: with local tables B sees none of them.
    let (la, lb) = replicas(&cluster, "");
    for i in 0..6 {
        served_by(&la, &format!("local-{i}"), 0);
    }
    assert_eq!(live_sessions(&la), 6);
    assert_eq!(live_sessions(&lb), 0);
}

/// The turns of one conversation that names no session, alternating
/// between the replicas: (the sessions they were given, the engines).
fn anonymous_conversation(a: &Gateway, b: &Gateway, turns: usize) -> (Vec<String>, Vec<String>) {
    let mut messages = vec![
        serde_json::json!({"role": "system", "content": "You are a careful coding agent."}),
        serde_json::json!({"role": "user", "content": "rename the module"}),
    ];
    let (mut sessions, mut peers) = (Vec::new(), Vec::new());
    for t in 0..turns {
        let gw = if t % 2 == 0 { a } else { b };
        let body = serde_json::json!({"model": "sim-model", "max_tokens": 4, "messages": messages});
        let r = http::post_json(gw.addr, "/chat/v1/chat/completions", &[], &body);
        assert_eq!(r.status(), 200, "{}", r.text());
        assert_eq!(
            r.header("x-routed-source"),
            Some("content"),
            "turn {t}: {:?} {}",
            r.head,
            gw.log()
        );
        sessions.push(r.header("x-routed-session").unwrap_or("?").to_string());
        peers.push(r.header("x-routed-peer").unwrap_or("?").to_string());
        messages
            .push(serde_json::json!({"role": "assistant", "content": format!("step {t} done")}));
        messages
            .push(serde_json::json!({"role": "user", "content": format!("now step {}", t + 1)}));
    }
    (sessions, peers)
}

#[test]
fn with_redis_two_replicas_agree_on_a_conversation_recognised_by_content() {
    let cluster = engines(4);
    let redis = Redis::start();
    let (a, b) = replicas(&cluster, &store(&redis));
    let (sessions, peers) = anonymous_conversation(&a, &b, 6);
    assert!(sessions.iter().all(|s| *s == sessions[0]), "{sessions:?}");
    assert!(peers.iter().all(|p| *p == peers[0]), "{peers:?}");
}

/// Control: without a shared store each replica knows only its own half
/// of the conversation, and gives it a session of its own.
#[test]
fn without_redis_replicas_do_not_share_content_recognition() {
    let cluster = engines(4);
    let (a, b) = replicas(&cluster, "");
    let (sessions, _) = anonymous_conversation(&a, &b, 4);
    assert_ne!(sessions[0], sessions[1], "{sessions:?}");
    // Each replica still follows its own half.
    assert_eq!(sessions[0], sessions[2]);
}

/// A Responses API chain alternating between the replicas: each turn
/// names the one before by `previous_response_id`, which the replica that
/// answered it wrote to Redis, so the other replica keeps the chain on
/// its session and engine.
#[test]
fn with_redis_a_previous_response_id_answered_by_the_other_replica_keeps_its_session() {
    let cluster = engines(4);
    let redis = Redis::start();
    let (a, b) = replicas(&cluster, &store(&redis));
    let mut previous: Option<String> = None;
    let mut seen = Vec::new();
    for t in 0..4 {
        let gw = if t % 2 == 0 { &a } else { &b };
        let mut body = serde_json::json!({"model": "sim-model", "max_output_tokens": 4,
            "input": [{"type": "message", "role": "user", "content": format!("step {t} of the plan")}]});
        if let Some(id) = &previous {
            body["previous_response_id"] = serde_json::json!(id);
        }
        let r = http::post_json(gw.addr, "/chat/v1/responses", &[], &body);
        assert_eq!(r.status(), 200, "{}", r.text());
        seen.push((
            r.header("x-routed-session").unwrap_or("?").to_string(),
            r.header("x-routed-peer").unwrap_or("?").to_string(),
        ));
        let id = r.json()["id"].as_str().expect("a response id").to_string();
        // The answering replica writes the id once the answer is out;
        // the next turn goes to the other replica only once it is there.
        let written = || {
            redis
                .keys()
                .iter()
                .filter(|k| k.contains(":r:chat:"))
                .count()
        };
        wait_for(
            "the response id in Redis",
            std::time::Duration::from_secs(10),
            || (written() > t).then_some(()),
        );
        assert_eq!(written(), t + 1, "one key per answered response");
        previous = Some(id);
    }
    assert!(seen.iter().all(|s| *s == seen[0]), "{seen:?}");
}

/// Control: without a shared store the second replica does not know the
/// first one's response, and the chain gets a session of its own there.
#[test]
fn without_redis_a_previous_response_id_from_the_other_replica_is_unknown() {
    let cluster = engines(4);
    let (a, b) = replicas(&cluster, "");
    let first = serde_json::json!({"model": "sim-model", "max_output_tokens": 4,
        "input": [{"type": "message", "role": "user", "content": "step 0 of the plan"}]});
    let r = http::post_json(a.addr, "/chat/v1/responses", &[], &first);
    assert_eq!(r.status(), 200, "{}", r.text());
    let id = r.json()["id"].as_str().expect("a response id").to_string();
    let second = serde_json::json!({"model": "sim-model", "max_output_tokens": 4, "previous_response_id": id,
        "input": [{"type": "message", "role": "user", "content": "step 1"}]});
    let r2 = http::post_json(b.addr, "/chat/v1/responses", &[], &second);
    assert_eq!(
        r2.header("x-routed-source"),
        Some("body:previous_response_id")
    );
    assert_ne!(r2.header("x-routed-session"), r.header("x-routed-session"));
}

/// What `gw` sees the other replicas have in flight, over the route's peers.
fn remote_in_flight(gw: &Gateway) -> f64 {
    peers_sum(gw, "remote_in_flight")
}

/// A replica told to stop (SIGTERM) drains its streams; the others go on
/// counting them on their engines until the last one ends, rather than
/// place onto an engine they think it has left.
#[test]
fn a_draining_replica_stays_counted_by_the_others_until_its_last_stream_ends() {
    let cluster = engines(1);
    let redis = Redis::start();
    let route = route_yaml(&ports(&cluster), "");
    let start = || {
        Gateway::start_with(
            &[("chat", route.clone())],
            GatewayOptions {
                extra_config: store(&redis),
                grace_period: "30s",
                ..Default::default()
            },
        )
    };
    let (mut a, b) = (start(), start());
    let mut stream = hold_stream(&a, "/chat/v1/chat/completions", "drain", &[]);
    wait_for("B to count A's stream", DEADLINE, || {
        (remote_in_flight(&b) == 1.0).then_some(())
    });
    a.signal("TERM");
    wait_for("A to drain", DEADLINE, || {
        let r = http::try_get(a.admin, "/healthz").expect("A's admin listener answers");
        (r.status() == 503).then_some(())
    });
    // Twice the published count's TTL: a replica that stopped publishing at
    // SIGTERM has gone from B's view by then.
    let until = std::time::Instant::now() + 2 * std::time::Duration::from_millis(1_500);
    while std::time::Instant::now() < until {
        assert_eq!(
            remote_in_flight(&b),
            1.0,
            "B lost A's stream while A streams it"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(a.is_alive(), "A still drains");
    // Control: the same view does fall, once A's stream ends and A exits.
    cluster.engines[0].open_gate("drain");
    while let Ok(Some(_)) = stream.read_chunk() {}
    assert_eq!(a.wait_exit(std::time::Duration::from_secs(10)), Some(0));
    wait_for("B to stop counting A's finished stream", DEADLINE, || {
        (remote_in_flight(&b) == 0.0).then_some(())
    });
}

/// Another replica's cold prompt on an engine is prefill ahead of a request
/// there wherever it is placed: each replica publishes its cold prompt
/// tokens per engine with its in-flight, and the others count them in
/// their placement's backlog (`remote_cold_prefill_tokens`).
#[test]
fn a_replica_counts_the_cold_prompts_another_replica_has_before_their_first_token() {
    let cluster = engines(1);
    let redis = Redis::start();
    let (a, b) = replicas(&cluster, &store(&redis));
    let peer = |gw: &Gateway| http::get(gw.addr, "/chat/_route_state").json()["peers"][0].clone();
    assert_eq!(peer(&b)["remote_cold_prefill_tokens"], serde_json::json!(0));
    // A new session's first turn through A, a minute from its first token.
    let mut slow = http::Conn::open(a.addr);
    let body = serde_json::json!({"model": "sim-model", "stream": true, "max_tokens": 2,
                      "messages": [{"role": "user", "content": "a long cold prompt ".repeat(200)}]});
    slow.send(
        "POST",
        "/chat/v1/chat/completions",
        &[
            ("content-type", "application/json"),
            ("x-sim-ttft-ms", "60000"),
            ("x-session-id", "cold-through-a"),
        ],
        body.to_string().as_bytes(),
        http::Upload::Length,
    );
    let cold = wait_for("A's cold prompt", DEADLINE, || {
        peer(&a)["cold_prefill_tokens"].as_u64().filter(|n| *n > 0)
    });
    wait_for("B to count A's cold prompt", DEADLINE, || {
        (peer(&b)["remote_cold_prefill_tokens"] == serde_json::json!(cold)).then_some(())
    });
    // B's own count stays its own: nothing went cold through B.
    assert_eq!(peer(&b)["cold_prefill_tokens"], serde_json::json!(0));
    // Control: the count follows A's, down to nothing once the client goes.
    drop(slow);
    wait_for("B to stop counting it", DEADLINE, || {
        (peer(&b)["remote_cold_prefill_tokens"] == serde_json::json!(0)).then_some(())
    });
}

/// Where first turns sent one after another over `gateways` (in turn) went:
/// how many per engine, most first. Each is a long cold prompt whose first
/// token is a minute away, so every one is still prefill ahead when the
/// next is placed.
fn first_turns_per_engine(cluster: &SimCluster, gateways: &[Gateway], sessions: usize) -> Vec<u64> {
    let received = || -> Vec<u64> {
        let requests = |e: &llm_gateway_sim::EngineHandle| e.stats.requests.load(Ordering::SeqCst);
        cluster.engines.iter().map(requests).collect()
    };
    let before = received();
    let mut held = Vec::new();
    for i in 0..sessions {
        let mut conn = http::Conn::open(gateways[i % gateways.len()].addr);
        let prompt = format!("session {i} starts with a long cold prompt. ").repeat(100);
        let body = chat_body(&format!("started-together-{i}"), &prompt, true);
        conn.send(
            "POST",
            "/chat/v1/chat/completions",
            &[
                ("content-type", "application/json"),
                ("x-sim-ttft-ms", "60000"),
            ],
            body.to_string().as_bytes(),
            http::Upload::Length,
        );
        held.push(conn);
        // Placed (and its claim written) before the next one starts.
        wait_for("the first turn to reach an engine", DEADLINE, || {
            let sent: u64 = received().iter().zip(&before).map(|(n, b)| n - b).sum();
            (sent == i as u64 + 1).then_some(())
        });
    }
    let mut counts: Vec<u64> = received().iter().zip(&before).map(|(n, b)| n - b).collect();
    counts.sort_unstable_by(|a, b| b.cmp(a));
    counts
}

/// Sessions that start at one moment on three replicas spread over the
/// engines as one gateway spreads them: a first placement reads back the
/// first turns the others claimed since their last sync, as prefill ahead
/// on those engines. The syncs are a minute apart here, so that nothing
/// else tells one replica what the others placed.
#[test]
fn first_turns_started_together_on_three_replicas_spread_as_on_one() {
    let spread = |replicas: usize, share_claims: bool| {
        let cluster = engines(4);
        let redis = Redis::start();
        let route = route_yaml(&ports(&cluster), "");
        let extra = format!(
            "{}  sync_interval: 60s\n  share_claims: {share_claims}\n",
            store(&redis)
        );
        let gateways: Vec<Gateway> = (0..replicas)
            .map(|_| {
                Gateway::start_with(
                    &[("chat", route.clone())],
                    GatewayOptions {
                        extra_config: extra.clone(),
                        ..Default::default()
                    },
                )
            })
            .collect();
        first_turns_per_engine(&cluster, &gateways, 8)
    };
    let one = spread(1, true);
    assert_eq!(one, vec![2, 2, 2, 2], "one gateway spreads them evenly");
    assert_eq!(spread(3, true), one, "three replicas spread them as one");
    // Control: without the claims read back, each replica puts its own
    // first turns where its own view is emptiest, and they collide.
    let private = spread(3, false);
    assert!(
        private[0] > 2,
        "replicas that share no claims spread as one: the test could not fail ({private:?})"
    );
}
