use super::*;

const BT: usize = 16;

fn cfg(num_blocks: usize) -> SchedulerConfig {
    SchedulerConfig {
        max_num_seqs: 256,
        max_num_batched_tokens: 8192,
        block_tokens: BT,
        num_blocks,
        cost: StepCost {
            base_us: 1000.0,
            per_token_us: 10.0,
            per_seq_us: 100.0,
            per_context_token_us: 1.0,
        },
    }
}

/// Chain-like hashes: requests with the same `tag` share every block, and
/// `shared` lets the first blocks of two tags coincide.
fn hashes(tag: u64, blocks: usize, shared: usize) -> Vec<u64> {
    (0..blocks as u64)
        .map(|k| {
            if (k as usize) < shared {
                k
            } else {
                tag << 32 | k
            }
        })
        .collect()
}

fn req(tag: u64, prompt: usize, max_tokens: usize) -> NewRequest {
    NewRequest {
        prompt_tokens: prompt,
        max_tokens,
        hashes: hashes(tag, (prompt + max_tokens) / BT, 0),
    }
}

/// Steps until `id` has emitted its last token; returns its tokens.
fn run_to_end(s: &mut Scheduler, id: ReqId) -> Vec<Token> {
    let mut out = Vec::new();
    for _ in 0..10_000 {
        let step = s.step();
        out.extend(step.emitted.iter().filter(|t| t.id == id).copied());
        if out.last().is_some_and(|t| t.last) {
            return out;
        }
    }
    panic!("request {id} did not finish");
}

#[test]
fn admission_is_limited_by_free_blocks() {
    // Two 100-token prompts need 7 blocks each: 10 blocks hold one.
    let mut s = Scheduler::new(cfg(10));
    s.add(req(1, 100, 4)).expect("fits");
    s.add(req(2, 100, 4)).expect("fits");
    s.step();
    assert_eq!((s.running(), s.waiting()), (1, 1));
    // Control: with 20 blocks both are admitted in the same step.
    let mut s = Scheduler::new(cfg(20));
    s.add(req(1, 100, 4)).expect("fits");
    s.add(req(2, 100, 4)).expect("fits");
    s.step();
    assert_eq!((s.running(), s.waiting()), (2, 0));
}

#[test]
fn max_num_seqs_bounds_the_batch() {
    let mut s = Scheduler::new(SchedulerConfig {
        max_num_seqs: 2,
        ..cfg(100)
    });
    for t in 0..3 {
        s.add(req(t, 20, 4)).expect("fits");
    }
    s.step();
    assert_eq!((s.running(), s.waiting()), (2, 1));
}

#[test]
fn a_request_longer_than_the_kv_is_refused() {
    let mut s = Scheduler::new(cfg(10));
    assert_eq!(s.add(req(1, 150, 11)), Err(161));
    assert!(s.add(req(1, 150, 10)).is_ok());
}

#[test]
fn a_finished_prompt_is_hit_by_the_next_turn() {
    let mut s = Scheduler::new(cfg(100));
    let a = s.add(req(1, 64, 4)).expect("fits");
    let first = run_to_end(&mut s, a);
    assert_eq!(first.len(), 4);
    assert_eq!(first[0].cached_tokens, 0);
    // Same 64 prompt tokens: all but the last block (its last token is
    // computed again).
    let b = s.add(req(1, 64, 4)).expect("fits");
    assert_eq!(run_to_end(&mut s, b)[0].cached_tokens, 48);
    // The next turn extends it: every block of the earlier prompt hits.
    let c = s.add(req(1, 100, 4)).expect("fits");
    assert_eq!(run_to_end(&mut s, c)[0].cached_tokens, 64);
    let n = s.counters();
    assert_eq!((n.prefix_queries, n.prefix_hits), (64 + 64 + 100, 48 + 64));
    // Control: another conversation hits nothing.
    let d = s.add(req(2, 100, 4)).expect("fits");
    assert_eq!(run_to_end(&mut s, d)[0].cached_tokens, 0);
}

#[test]
fn eviction_takes_the_least_recently_freed_blocks_tail_first() {
    // 12 blocks. A (3 full blocks) finishes, then B: the free queue holds
    // the 6 never-used blocks, A's tail..head, then B's tail..head.
    let mut s = Scheduler::new(cfg(12));
    for tag in [1, 2] {
        let id = s.add(req(tag, 48, 1)).expect("fits");
        run_to_end(&mut s, id);
    }
    let cached = |s: &Scheduler, tag: u64| -> Vec<bool> {
        hashes(tag, 3, 0)
            .iter()
            .map(|h| s.pool.cached.contains_key(h))
            .collect()
    };
    assert_eq!(cached(&s, 1), [true; 3]);
    assert_eq!(cached(&s, 2), [true; 3]);
    // C takes 8 blocks: the 6 never-cached ones, then A's tail and the
    // block before it. A's head and all of B stay cached.
    let c = s.add(req(3, 120, 1)).expect("fits");
    s.step();
    assert_eq!(cached(&s, 1), [true, false, false]);
    assert_eq!(cached(&s, 2), [true; 3]);
    s.abort(c);
    // What is left of A is still a prefix a new request hits.
    let a = s.add(req(1, 49, 1)).expect("fits");
    assert_eq!(run_to_end(&mut s, a)[0].cached_tokens, 16);
}

#[test]
fn running_out_of_blocks_preempts_the_newest_which_is_recomputed() {
    // 8 blocks = 128 tokens; A and B (60-token prompts, 4 blocks each)
    // fill them; A's 5th block, at its 5th token, does not exist.
    let mut s = Scheduler::new(cfg(8));
    let a = s.add(req(1, 60, 20)).expect("fits");
    let b = s.add(req(2, 60, 20)).expect("fits");
    let mut preempted = Vec::new();
    let mut tokens: AHashMap<ReqId, Vec<usize>> = AHashMap::new();
    while !s.is_idle() {
        let step = s.step();
        preempted.extend(step.preempted.iter().copied());
        for t in &step.emitted {
            tokens.entry(t.id).or_default().push(t.index);
        }
    }
    assert_eq!(preempted.first(), Some(&b), "the newest goes first");
    assert!(!preempted.contains(&a));
    assert_eq!(s.counters().preemptions, preempted.len() as u64);
    // Both finished with every token, once each, in order.
    for id in [a, b] {
        assert_eq!(tokens[&id], (0..20).collect::<Vec<_>>(), "request {id}");
    }
    // The recompute counted B's prompt in the cache queries again.
    assert!(s.counters().prefix_queries > 120);
    // Control: with room for both, nothing is preempted.
    let mut s = Scheduler::new(cfg(16));
    s.add(req(1, 60, 20)).expect("fits");
    s.add(req(2, 60, 20)).expect("fits");
    while !s.is_idle() {
        assert!(s.step().preempted.is_empty());
    }
    assert_eq!(s.counters().preemptions, 0);
}

#[test]
fn a_preempted_request_goes_back_to_the_front_of_the_queue() {
    let mut s = Scheduler::new(cfg(8));
    let _a = s.add(req(1, 60, 20)).expect("fits");
    let b = s.add(req(2, 60, 20)).expect("fits");
    let mut step = s.step();
    while step.preempted.is_empty() {
        step = s.step();
    }
    let c = s.add(req(3, 10, 1)).expect("fits");
    assert_eq!(s.waiting.iter().copied().collect::<Vec<_>>(), vec![b, c]);
}

#[test]
fn prefill_chunks_share_the_budget_left_by_decodes() {
    let mut s = Scheduler::new(SchedulerConfig {
        max_num_batched_tokens: 64,
        ..cfg(100)
    });
    let a = s.add(req(1, 30, 10)).expect("fits");
    assert_eq!(s.step().scheduled, vec![(a, 30)]);
    let b = s.add(req(2, 200, 4)).expect("fits");
    // A decodes one token, B's prefill takes the other 63.
    let step = s.step();
    assert_eq!(step.scheduled, vec![(a, 1), (b, 63)]);
    assert_eq!(step.tokens, 64);
    // B is running now: its next chunk comes after A's decode again, and
    // its first token only with the step that completes its prompt.
    assert_eq!(s.step().scheduled, vec![(a, 1), (b, 63)]);
    assert_eq!(s.step().scheduled, vec![(a, 1), (b, 63)]);
    let step = s.step();
    assert_eq!(step.scheduled, vec![(a, 1), (b, 11)]);
    assert!(step.emitted.iter().any(|t| t.id == b && t.index == 0));
}

#[test]
fn step_time_grows_with_the_batch_and_the_context() {
    let one = |prompt: usize, n: u64| {
        let mut s = Scheduler::new(cfg(1000));
        for t in 0..n {
            s.add(req(t, prompt, 10)).expect("fits");
        }
        s.step();
        // A decode step of every request.
        s.step().duration_us
    };
    let base = one(32, 1);
    assert!(one(32, 4) > base, "more sequences");
    assert!(one(320, 1) > base, "longer context");
    // base 1000 + 10 per token + 100 per sequence + 1 per context token:
    // 1 x (32 + 1) context.
    assert_eq!(base, 1000.0 + 10.0 + 100.0 + 33.0);
    // An idle step is empty and free.
    let mut s = Scheduler::new(cfg(10));
    assert_eq!(s.step(), Step::default());
}

#[test]
fn abort_frees_blocks_and_keeps_the_full_ones_cached() {
    let mut s = Scheduler::new(cfg(10));
    let a = s.add(req(1, 64, 10)).expect("fits");
    s.step();
    assert!(s.kv_usage() > 0.0);
    s.abort(a);
    assert!(s.is_idle());
    assert_eq!(s.kv_usage(), 0.0);
    assert_eq!(s.cached_blocks(), 4);
}

/// One client of a closed loop: sends its next request when the last one
/// ends.
#[derive(Debug, Default, Clone, Copy)]
struct Sent {
    at_us: f64,
    first_us: Option<f64>,
}

/// A closed loop of `concurrency` clients, `rounds` requests each, of
/// `input` prompt tokens (no shared prefix) and `output` tokens; the mean
/// TTFT and TPOT in ms, as `vllm bench serve` computes them.
fn closed_loop(
    cost: StepCost,
    overhead_us: f64,
    concurrency: usize,
    input: usize,
    output: usize,
    rounds: usize,
) -> (f64, f64) {
    let mut s = Scheduler::new(SchedulerConfig {
        max_num_seqs: 256,
        max_num_batched_tokens: 8192,
        block_tokens: BT,
        num_blocks: 200_000 / BT,
        cost,
    });
    let mut tag = 0u64;
    let mut new_request = |s: &mut Scheduler| {
        tag += 1;
        s.add(req(tag, input, output)).expect("fits")
    };
    let mut now = 0.0f64;
    // (arrival at the scheduler, client)
    let mut arrivals: Vec<(f64, usize)> = (0..concurrency).map(|c| (overhead_us, c)).collect();
    let mut clients = vec![Sent::default(); concurrency];
    let mut left = vec![rounds; concurrency];
    let mut owner: AHashMap<ReqId, usize> = AHashMap::new();
    let (mut ttft, mut tpot) = (Vec::new(), Vec::new());
    loop {
        arrivals.sort_by(|a, b| a.0.total_cmp(&b.0));
        let due = arrivals.iter().take_while(|a| a.0 <= now).count();
        for (_, c) in arrivals.drain(..due) {
            let id = new_request(&mut s);
            owner.insert(id, c);
        }
        if s.is_idle() {
            match arrivals.first() {
                Some(&(at, _)) => {
                    now = at;
                    continue;
                }
                None => break,
            }
        }
        let step = s.step();
        now += step.duration_us;
        for t in &step.emitted {
            let c = owner[&t.id];
            let sent = &mut clients[c];
            if t.index == 0 {
                sent.first_us = Some(now);
                ttft.push((now - sent.at_us) / 1e3);
            }
            if t.last {
                let first = sent.first_us.unwrap_or(now);
                tpot.push((now - first) / 1e3 / (output - 1) as f64);
                left[c] -= 1;
                if left[c] > 0 {
                    clients[c] = Sent {
                        at_us: now,
                        first_us: None,
                    };
                    arrivals.push((now + overhead_us, c));
                }
            }
        }
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    (mean(&ttft), mean(&tpot))
}

/// `CALIBRATION.md`: vLLM v0.23.0 (V1 engine), Qwen2.5-0.5B-Instruct on one
/// NVIDIA L4, 256 tokens in and 128 out with `--ignore-eos`, closed loop at
/// a fixed `--max-concurrency`; the published medians of TTFT and ITL.
#[test]
fn calibration_matches_the_published_run_within_20_percent() {
    let published = [(1, 27.0, 5.1), (8, 60.9, 5.5), (32, 135.3, 7.1)];
    for (concurrency, ttft_ms, itl_ms) in published {
        let (ttft, tpot) = closed_loop(
            StepCost::L4_QWEN_0_5B,
            L4_QWEN_0_5B_OVERHEAD_US as f64,
            concurrency,
            256,
            128,
            4,
        );
        let off = |sim: f64, real: f64| (sim - real).abs() / real;
        assert!(
            off(ttft, ttft_ms) <= 0.2,
            "concurrency {concurrency}: TTFT {ttft:.1} ms against {ttft_ms}"
        );
        assert!(
            off(tpot, itl_ms) <= 0.2,
            "concurrency {concurrency}: TPOT {tpot:.2} ms against {itl_ms}"
        );
    }
}

/// Prints the simulated column of `CALIBRATION.md`'s table
/// (`cargo test -p llm-gateway-sim calibration_table -- --ignored --nocapture`).
#[test]
#[ignore]
fn calibration_table() {
    for c in [1, 2, 4, 8, 16, 32] {
        let (ttft, tpot) = closed_loop(
            StepCost::L4_QWEN_0_5B,
            L4_QWEN_0_5B_OVERHEAD_US as f64,
            c,
            256,
            128,
            4,
        );
        println!("| {c} | {ttft:.1} | {tpot:.2} |");
    }
}
