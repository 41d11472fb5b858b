use super::*;
use crate::budget::Dimension;
use crate::config::tenants::TenantsConfig;
use std::path::Path;

fn tenants(text: &str) -> Tenants {
    let t = Tenants::default();
    let config = TenantsConfig::parse(Path::new("t.yaml"), text).expect("valid");
    t.config.store(Arc::new(config));
    t
}

fn name(n: &str) -> Arc<str> {
    Arc::from(n)
}

#[test]
fn the_in_flight_cap_refuses_the_next_and_a_dropped_admission_frees_its_place() {
    let t = tenants("tenants:\n  a:\n    max_in_flight: 2\n");
    let a = name("a");
    let first = t.admit(&a, 10, 0).expect("1 of 2");
    let _second = t.admit(&a, 10, 0).expect("2 of 2");
    let refused = t.admit(&a, 10, 0).err().expect("3 of 2");
    assert_eq!(refused.reason, Reason::InFlight);
    assert_eq!(refused.max_in_flight, Some(2));
    // Control: another tenant (on the defaults: no cap) is not held back.
    let _b = t.admit(&name("b"), 10, 0).expect("b has no cap");
    drop(first);
    let state = t.state(&a, 0);
    assert_eq!(state.in_flight(), 1, "the refused one took no place");
    assert!(
        t.admit(&a, 10, 0).is_ok(),
        "the dropped one's place is free"
    );
}

#[test]
fn a_budget_refusal_gives_back_the_place_it_took() {
    let t = tenants("defaults:\n  requests_per_minute: 1\n");
    let c = name("c");
    let kept = t.admit(&c, 10, 0).expect("the first");
    let refused = t.admit(&c, 10, 100).err().expect("one a minute");
    assert_eq!(refused.reason, Reason::Budget(Dimension::Requests));
    assert_eq!(t.state(&c, 0).in_flight(), 1);
    drop(kept);
    assert_eq!(t.state(&c, 0).in_flight(), 0);
}

#[test]
fn a_settled_admission_counts_what_it_spent() {
    let t = tenants("tenants:\n  a:\n    input_tokens_per_minute: 1000\n");
    let a = name("a");
    let admitted = t.admit(&a, 400, 0).expect("400 of 1000");
    assert_eq!(t.state(&a, 0).in_flight(), 1);
    admitted.settle(spent(None, true, 400, 7), 1_000);
    let status = t.status_json(1_000);
    let row = &status["tenants"][0];
    assert_eq!(row["name"], "a");
    assert_eq!(row["last_minute"]["input_tokens"], 400);
    assert_eq!(row["last_minute"]["output_tokens"], 7);
    assert_eq!(row["remaining"]["input_tokens"], 600);
    assert_eq!(row["in_flight"], 0);
}

#[test]
fn past_the_cap_on_tenants_an_unnamed_newcomer_shares_other() {
    let t = tenants("tenants:\n  named:\n");
    let mut held = Vec::new();
    for i in 0..MAX_TRACKED {
        held.push(t.admit(&name(&format!("t{i}")), 1, 0).expect("admitted"));
    }
    let late = t.admit(&name("late"), 1, 0).expect("admitted");
    assert_eq!(&**late.tenant(), "other");
    // Control: a tenant the file names keeps its own state.
    let named = t.admit(&name("named"), 1, 0).expect("admitted");
    assert_eq!(&**named.tenant(), "named");
    drop(held);
    // Idle ones go once the cap is reached again: the newcomer has its own.
    let later = t.admit(&name("later"), 1, 61_000).expect("admitted");
    assert_eq!(&**later.tenant(), "later");
}

#[test]
fn a_reload_that_fails_keeps_the_file_in_force() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("tenants.yaml");
    std::fs::write(&path, "tenants:\n  a:\n    max_in_flight: 1\n").expect("write");
    let t = Tenants::default();
    assert_eq!(t.reload(Some(&path)), Ok(true));
    assert_eq!(t.reload(Some(&path)), Ok(false), "unchanged");
    std::fs::write(&path, "tenants:\n  a:\n    max_in_flight: -1\n").expect("write");
    let e = t.reload(Some(&path)).expect_err("broken");
    assert_eq!(e.line, Some(3), "{e}");
    assert_eq!(t.config().policy("a").max_in_flight, Some(1));
    // Control: no file any more in gateway.yaml is the defaults.
    assert_eq!(t.reload(None), Ok(true));
    assert_eq!(t.config().policy("a").max_in_flight, None);
}

#[test]
fn a_full_table_is_swept_at_most_once_a_second() {
    let t = tenants("");
    let held: Vec<Admission> = (0..MAX_TRACKED)
        .map(|i| {
            t.admit(&name(&format!("t{i}")), 1, 5_000)
                .expect("admitted")
        })
        .collect();
    let late = t.admit(&name("late"), 1, 5_000).expect("admitted");
    assert_eq!(&**late.tenant(), "other", "swept, but every tenant is busy");
    drop(held);
    let soon = t.admit(&name("soon"), 1, 5_500).expect("admitted");
    assert_eq!(
        &**soon.tenant(),
        "other",
        "no second sweep within the second"
    );
    // Control: a second on, the idle ones are swept and the newcomer has
    // its own state.
    let later = t.admit(&name("later"), 1, 6_000).expect("admitted");
    assert_eq!(&**later.tenant(), "later");
}

#[test]
fn a_state_held_outside_the_table_is_not_swept() {
    let t = tenants("");
    // Looked up, not yet counted in flight: as a request between the two.
    let looked_up = t.state(&name("t0"), 5_000);
    for i in 1..MAX_TRACKED {
        drop(t.state(&name(&format!("t{i}")), 5_000));
    }
    let newcomer = t.admit(&name("new"), 1, 6_000).expect("admitted");
    assert_eq!(&**newcomer.tenant(), "new", "the idle ones were swept");
    assert!(
        Arc::ptr_eq(&looked_up, &t.state(&name("t0"), 6_000)),
        "the held one is still the table's"
    );
    // Control: one not held, as idle, was swept (made anew when asked for).
    let swept = t.state(&name("t1"), 6_000);
    assert_eq!(Arc::strong_count(&swept), 2, "the table's and this one");
    assert!(t.states.read().len() < MAX_TRACKED);
}

#[test]
fn only_a_tenants_file_in_force_has_tenants_tracked() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("tenants.yaml");
    let t = Tenants::default();
    assert!(!t.tracked(), "no file at start");
    // An empty file limits nothing but is a file: tenants are counted.
    std::fs::write(&path, "").expect("write");
    assert_eq!(t.reload(Some(&path)), Ok(true));
    assert!(t.tracked());
    // A broken one keeps the one in force, tracked.
    std::fs::write(&path, "tenants: [").expect("write");
    assert!(t.reload(Some(&path)).is_err());
    assert!(t.tracked());
    assert_eq!(t.reload(None), Ok(true));
    assert!(!t.tracked(), "the file gone from gateway.yaml");
}
