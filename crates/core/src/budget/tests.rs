use super::*;

/// One replica: nothing elsewhere.
const HERE: Elsewhere = [0; 4];

fn limits(input: Option<u64>, output: Option<u64>, requests: Option<u64>) -> Limits {
    Limits {
        input_tokens: input,
        output_tokens: output,
        cached_input_tokens: None,
        requests,
    }
}

fn usage(prompt: u64, completion: u64, cached: u64) -> Option<Reported> {
    Some(Reported {
        prompt_tokens: prompt,
        completion_tokens: completion,
        cached_tokens: cached,
    })
}

#[test]
fn under_the_input_limit_passes_and_over_it_is_refused_with_the_wait() {
    let l = limits(Some(1000), None, None);
    let mut b = Budget::default();
    // Control: under budget, admitted and charged its estimate.
    let first = b.admit(&l, 600, 1_000, &HERE).expect("600 of 1000");
    assert_eq!(first.input_tokens, 600);
    // 600 + 500 > 1000: refused, 400 left, until second 1 slides out.
    let refused = b.admit(&l, 500, 10_000, &HERE).expect_err("over");
    assert_eq!(refused.dimension, Dimension::InputTokens);
    assert_eq!(refused.limit, 1000);
    assert_eq!(refused.remaining, 400);
    assert_eq!(refused.reset_ms, 51_000);
    // Once it has, the same request passes.
    assert!(b.admit(&l, 500, 61_000, &HERE).is_ok());
}

#[test]
fn a_prompt_larger_than_the_limit_passes_only_into_an_empty_window() {
    let l = limits(Some(100), None, None);
    let mut b = Budget::default();
    assert!(
        b.admit(&l, 5_000, 0, &HERE).is_ok(),
        "an empty window admits it"
    );
    let again = b
        .admit(&l, 5_000, 1_000, &HERE)
        .expect_err("the window holds 5000");
    assert_eq!(again.remaining, 0);
    assert_eq!(again.reset_ms, 59_000, "until the window is empty");
}

#[test]
fn the_request_limit_counts_requests() {
    let l = limits(None, None, Some(2));
    let mut b = Budget::default();
    assert!(b.admit(&l, 10, 0, &HERE).is_ok());
    assert!(b.admit(&l, 10, 100, &HERE).is_ok());
    let third = b.admit(&l, 10, 200, &HERE).expect_err("two a minute");
    assert_eq!(third.dimension, Dimension::Requests);
    assert_eq!((third.limit, third.remaining), (2, 0));
    assert_eq!(third.reset_ms, 59_800);
    // Control: another minute, another two.
    assert!(b.admit(&l, 10, 60_000, &HERE).is_ok());
}

#[test]
fn output_is_known_at_the_end_and_refuses_once_spent() {
    let l = limits(None, Some(100), None);
    let mut b = Budget::default();
    let c = b.admit(&l, 10, 0, &HERE).expect("nothing spent yet");
    // Control: still under after a small answer.
    b.settle(&c, spent(usage(10, 40, 0), true, 10, 0), 2_000);
    let c = b.admit(&l, 10, 3_000, &HERE).expect("40 of 100");
    b.settle(&c, spent(usage(10, 70, 0), true, 10, 0), 4_000);
    let r = b.admit(&l, 10, 5_000, &HERE).expect_err("110 of 100");
    assert_eq!(r.dimension, Dimension::OutputTokens);
    assert_eq!(r.remaining, 0);
    // The 40 charged at 0 s leave at 60 s: 70 < 100 then.
    assert_eq!(r.reset_ms, 55_000);
}

#[test]
fn reconciliation_replaces_the_estimate_with_the_usage() {
    let l = limits(Some(10_000), None, None);
    let mut b = Budget::default();
    let c = b.admit(&l, 1_000, 0, &HERE).expect("admitted");
    b.settle(&c, spent(usage(700, 50, 300), true, 1_000, 0), 5_000);
    let [input, output, cached, requests] = b.standing(&l, 5_000, &HERE);
    assert_eq!(input.used, 700, "the engine's count, not the estimate");
    assert_eq!(input.remaining, Some(9_300));
    assert_eq!(output.used, 50);
    assert_eq!(cached.used, 300);
    assert_eq!(requests.used, 1);
}

#[test]
fn a_stream_cut_early_pays_what_it_used() {
    let l = limits(Some(10_000), Some(10_000), None);
    let mut cut = Budget::default();
    let c = cut.admit(&l, 800, 0, &HERE).expect("admitted");
    // No usage frame: the prompt the engine computed and the 12 frames sent.
    cut.settle(&c, spent(None, true, c.estimate, 12), 3_000);
    let [input, output, ..] = cut.standing(&l, 3_000, &HERE);
    assert_eq!((input.used, output.used), (800, 12));
    // Control: the same request answered whole pays its usage.
    let mut whole = Budget::default();
    let c = whole.admit(&l, 800, 0, &HERE).expect("admitted");
    whole.settle(&c, spent(usage(820, 200, 0), true, 800, 200), 3_000);
    let [input, output, ..] = whole.standing(&l, 3_000, &HERE);
    assert_eq!((input.used, output.used), (820, 200));
}

#[test]
fn a_request_that_never_reached_an_engine_pays_only_the_request() {
    let l = limits(Some(10_000), None, Some(100));
    let mut b = Budget::default();
    let c = b.admit(&l, 800, 0, &HERE).expect("admitted");
    b.settle(&c, spent(None, false, c.estimate, 0), 100);
    let [input, _, _, requests] = b.standing(&l, 100, &HERE);
    assert_eq!(input.used, 0, "the estimate is given back");
    assert_eq!(requests.used, 1);
    // Control: one that reached the engine keeps its estimate.
    let c = b.admit(&l, 800, 200, &HERE).expect("admitted");
    b.settle(&c, spent(None, true, c.estimate, 0), 300);
    assert_eq!(b.standing(&l, 300, &HERE)[0].used, 800);
}

#[test]
fn an_unlimited_tenant_is_charged_nothing_up_front_and_everything_at_the_end() {
    let l = Limits::default();
    assert!(l.is_unlimited());
    let mut b = Budget::default();
    let c = Budget::unchecked(500, 0);
    assert_eq!(
        b.standing(&l, 0, &HERE)[3].used,
        0,
        "nothing counted before the end"
    );
    b.settle(&c, spent(usage(510, 20, 0), true, 500, 20), 1_000);
    let [input, output, _, requests] = b.standing(&l, 1_000, &HERE);
    assert_eq!((input.used, output.used, requests.used), (510, 20, 1));
    assert_eq!(input.remaining, None);
    assert!(!b.is_idle(1_000));
    assert!(b.is_idle(61_000), "idle once everything slid out");
}

#[test]
fn a_settlement_after_the_charge_left_the_window_adds_only_what_is_new() {
    let l = limits(Some(10_000), Some(10_000), None);
    let mut b = Budget::default();
    let c = b.admit(&l, 1_000, 0, &HERE).expect("admitted");
    // A stream of 90 s: its charge slid out at 60 s.
    b.settle(&c, spent(usage(900, 400, 0), true, 1_000, 0), 90_000);
    let [input, output, ..] = b.standing(&l, 90_000, &HERE);
    assert_eq!(input.used, 0, "less than charged, and the charge is gone");
    assert_eq!(output.used, 400, "its output, counted now");
}

#[test]
fn the_other_replicas_windows_count_against_the_same_limit() {
    let l = limits(None, None, Some(4));
    let mut b = Budget::default();
    // Three requests went through other replicas in this minute.
    let elsewhere: Elsewhere = [0, 0, 0, 3];
    assert!(b.admit(&l, 10, 0, &elsewhere).is_ok(), "the fourth");
    let r = b.admit(&l, 10, 100, &elsewhere).expect_err("the fifth");
    assert_eq!((r.limit, r.remaining), (4, 0));
    assert_eq!(b.standing(&l, 100, &elsewhere)[3].used, 4);
    assert_eq!(b.used(100), [0, 0, 0, 1], "what this replica publishes");
    // Control: alone, this replica has room for all four.
    let mut alone = Budget::default();
    for _ in 0..4 {
        assert!(alone.admit(&l, 10, 0, &HERE).is_ok());
    }
}
