use super::*;

/// Releases `n` waiters in the order's choice, each costing `cost` and
/// replaced by another of its group (every tenant stays backlogged);
/// returns the tenants released, in order. The replacement arrives before
/// the released one leaves, as a flood's next request does.
fn release(
    order: &mut FairOrder<&'static str>,
    n: usize,
    cost: f64,
    weight: impl Fn(&str) -> f64,
) -> Vec<&'static str> {
    (0..n)
        .map(|_| {
            let (class, tenant) = order.next(|_, _| false).expect("someone waits");
            order.released(&tenant, class, cost, weight(tenant));
            order.arrive(&tenant, class);
            order.leave(&tenant, class);
            tenant
        })
        .collect()
}

fn count(released: &[&str], tenant: &str) -> usize {
    released.iter().filter(|t| **t == tenant).count()
}

#[test]
fn the_tenant_furthest_below_its_weighted_share_goes_first() {
    let mut order = FairOrder::new(0.1);
    // A flood from A arrives first, then one waiter of B.
    for _ in 0..10 {
        order.arrive(&"a", 1);
    }
    order.arrive(&"b", 1);
    let released = release(&mut order, 6, 100.0, |_| 1.0);
    assert_eq!(
        released,
        ["a", "b", "a", "b", "a", "b"],
        "equal weights alternate"
    );
    // Weights: A weight 2 is served twice B's tokens.
    let mut weighted = FairOrder::new(0.1);
    weighted.arrive(&"a", 1);
    weighted.arrive(&"b", 1);
    let released = release(
        &mut weighted,
        300,
        100.0,
        |t| if t == "a" { 2.0 } else { 1.0 },
    );
    assert_eq!(count(&released, "a"), 200);
    assert_eq!(count(&released, "b"), 100);
    // Tokens, not requests: B's requests cost 4 times A's, so A is
    // released 4 times as often.
    let mut by_tokens = FairOrder::new(0.1);
    by_tokens.arrive(&"a", 1);
    by_tokens.arrive(&"b", 1);
    let released: Vec<&str> = (0..50)
        .map(|_| {
            let (class, t) = by_tokens.next(|_, _| false).expect("waits");
            by_tokens.released(&t, class, if t == "a" { 25.0 } else { 100.0 }, 1.0);
            t
        })
        .collect();
    assert_eq!(count(&released, "a"), 40);
    // Control: the same arrivals in arrival order (nothing charged) give
    // the flood's first tenant everything.
    let mut unfair = FairOrder::new(0.1);
    for _ in 0..10 {
        unfair.arrive(&"a", 1);
    }
    unfair.arrive(&"b", 1);
    let released = release(&mut unfair, 6, 0.0, |_| 1.0);
    assert_eq!(count(&released, "b"), 0, "the control starves b");
}

#[test]
fn work_conserving_a_lone_or_blocked_tenant_gets_the_room() {
    let mut alone = FairOrder::new(0.1);
    alone.arrive(&"a", 1);
    alone.charge(&"a", 1e6, 1.0);
    // A alone, far over any share, still gets every release.
    assert_eq!(release(&mut alone, 5, 100.0, |_| 1.0), ["a"; 5]);
    // B waits with the smaller counter, but B's waiter could not be placed
    // (its engine busy, another pool): A, which can, goes.
    let mut order = FairOrder::new(0.1);
    order.arrive(&"a", 1);
    order.arrive(&"b", 1);
    order.charge(&"a", 1e6, 1.0);
    let next = order.next(|_, t| *t == "b");
    assert_eq!(next, Some((1, "a")));
    // Control: the same order with B's group not passed over releases B.
    assert_eq!(order.next(|_, _| false), Some((1, "b")));
    // Every group passed over: nothing.
    assert_eq!(order.next(|_, _| true), None);
}

#[test]
fn an_idle_tenant_banks_no_credit() {
    // B idles while A is served a lot, then starts waiting beside A.
    let mut order = FairOrder::new(0.1);
    order.arrive(&"a", 1);
    release(&mut order, 50, 100.0, |_| 1.0);
    order.charge(&"a", 10_000.0, 1.0);
    order.arrive(&"b", 1);
    let released = release(&mut order, 10, 100.0, |_| 1.0);
    assert!(
        count(&released, "a") >= 4,
        "b was lifted to a's counter, so they share at once: {released:?}"
    );
    // Nobody waits, A was served last: B arriving at an empty queue is
    // lifted to A's counter too.
    let mut quiet = FairOrder::new(0.1);
    quiet.charge(&"a", 5_000.0, 1.0);
    quiet.arrive(&"b", 1);
    assert_eq!(quiet.standing(&"b"), Some((5_000.0, 1)));
    // Control: a B that was already waiting while A was served keeps its
    // lead, and is released many times in a row.
    let mut waiting = FairOrder::new(0.1);
    waiting.arrive(&"b", 1);
    waiting.arrive(&"a", 1);
    waiting.charge(&"a", 10_000.0, 1.0);
    let released = release(&mut waiting, 10, 100.0, |_| 1.0);
    assert_eq!(count(&released, "a"), 0, "{released:?}");
}

#[test]
fn a_lower_class_keeps_its_minimum_share() {
    let mut order = FairOrder::new(0.1);
    // Interactive (rank 0) always waiting, batch (rank 2) too.
    order.arrive(&"chat", 0);
    order.arrive(&"eval", 2);
    let released = release(&mut order, 100, 10.0, |_| 1.0);
    assert_eq!(count(&released, "eval"), 10, "a tenth of the releases");
    assert_eq!(released[0], "chat", "the higher class goes first");
    // Control: without a minimum share the lower class starves.
    let mut strict = FairOrder::new(0.0);
    strict.arrive(&"chat", 0);
    strict.arrive(&"eval", 2);
    let released = release(&mut strict, 100, 10.0, |_| 1.0);
    assert_eq!(count(&released, "eval"), 0);
}

#[test]
fn a_class_banks_no_turns_while_it_does_not_wait() {
    let mut order = FairOrder::new(0.25);
    order.arrive(&"chat", 0);
    order.arrive(&"eval", 2);
    release(&mut order, 2, 10.0, |_| 1.0);
    order.leave(&"eval", 2);
    release(&mut order, 40, 10.0, |_| 1.0);
    order.arrive(&"eval", 2);
    let released = release(&mut order, 4, 10.0, |_| 1.0);
    assert_eq!(
        released,
        ["chat", "chat", "chat", "eval"],
        "earned again from nothing, not 40 releases' worth"
    );
}

#[test]
fn idle_tenants_are_forgotten_past_the_bound() {
    let mut order: FairOrder<String> = FairOrder::new(0.1);
    order.arrive(&"busy".to_string(), 1);
    for i in 0..(MAX_IDLE_TENANTS + 10) {
        order.charge(&format!("t{i}"), 1.0, 1.0);
    }
    assert!(order.each().count() <= MAX_IDLE_TENANTS + 1);
    assert_eq!(order.standing(&"busy".to_string()).map(|s| s.1), Some(1));
}

#[test]
fn a_leave_without_an_arrival_changes_nothing() {
    let mut order = FairOrder::new(0.1);
    order.arrive(&"a", 1);
    order.leave(&"b", 1);
    order.leave(&"a", 2);
    // A still waits, so b is lifted to a's counter, not to the floor.
    order.charge(&"a", 500.0, 1.0);
    order.arrive(&"b", 1);
    assert_eq!(order.standing(&"b"), Some((500.0, 1)));
    // Control: once a has left, the backlog is empty and the floor rules.
    order.leave(&"a", 1);
    order.leave(&"b", 1);
    order.charge(&"c", 10.0, 1.0);
    order.arrive(&"c", 1);
    assert_eq!(order.standing(&"c").map(|s| s.0), Some(500.0));
}

#[test]
fn a_turn_served_is_charged_once_not_on_top_of_a_lift() {
    // N floods; Q sends one turn at a time. Q's turn (200 in all) ends while
    // N, still waiting, is served 400 more. When Q asks again it stands
    // where the paper puts it, level with N, and goes first on arrival
    // order's tie-break rather than behind N.
    let mut order = FairOrder::new(0.1);
    order.arrive(&"n", 1);
    order.arrive(&"n", 1);
    order.released(&"n", 1, 100.0, 1.0);
    order.leave(&"n", 1);
    order.arrive(&"q", 1);
    order.released(&"q", 1, 100.0, 1.0);
    order.leave(&"q", 1);
    order.released(&"n", 1, 400.0, 1.0);
    order.arrive(&"n", 1);
    order.leave(&"n", 1);
    order.charge(&"q", 100.0, 1.0);
    order.arrive(&"q", 1);
    let n = order.standing(&"n").expect("n").0;
    let q = order.standing(&"q").expect("q").0;
    assert!(q <= n, "q at {q}, n at {n}");
    // Control: charged while still waiting, Q's counter does rise by it.
    let before = order.standing(&"q").expect("q").0;
    order.charge(&"q", 50.0, 1.0);
    assert_eq!(order.standing(&"q").expect("q").0, before + 50.0);
}
