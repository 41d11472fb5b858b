use super::*;
use crate::balance::{discount_completed, half_full as load};

#[test]
fn a_first_token_awaited_on_an_engine_not_timed_yet_bounds_its_speed() {
    let peer = Arc::new(PeerState::new(0, "127.0.0.1:1".into()));
    let mut probe = peer.try_acquire(8).expect("slot");
    probe.cold_prefill(8_000);
    // A second cold prompt while the first is awaited is no probe.
    let mut second = peer.try_acquire(8).expect("slot");
    second.cold_prefill(8_000);
    let now = crate::clock::now_ms();
    let bound = |at| peer.speed_at(at).prefill_us_at_least.unwrap_or(0.0);
    // 2 s on 8k tokens of work: at least ~250 µs a token.
    assert!(
        (240.0..=260.0).contains(&bound(now + 2_000)),
        "{}",
        bound(now + 2_000)
    );
    assert!(bound(now + 4_000) > bound(now + 2_000));
    // The first token came: no bound (its time is a sample instead).
    probe.first_token();
    assert_eq!(peer.speed_at(now + 2_000).prefill_us_at_least, None);
    drop(second);
    // Control: on an engine already timed no prompt is a probe.
    let timed = Arc::new(PeerState::new(1, "127.0.0.1:2".into()));
    for _ in 0..3 {
        timed.learn_first_token(8_000, 0, Duration::from_millis(400));
    }
    let mut cold = timed.try_acquire(8).expect("slot");
    cold.cold_prefill(8_000);
    assert_eq!(timed.speed_at(now + 2_000).prefill_us_at_least, None);
    assert!(timed.speed_at(now + 2_000).prefill_us.is_some());
}

#[test]
fn a_released_slot_counts_as_a_completion_against_the_sample() {
    let peer = Arc::new(PeerState::new(0, "127.0.0.1:1".into()));
    let first = peer.try_acquire(8).expect("slot");
    let second = peer.try_acquire(8).expect("slot");
    peer.record_engine(load(2, 8), 0, 100);
    peer.record_engine(load(2, 8), 1, 100);
    let sample = peer.engine_sample().expect("sample");
    assert_eq!(sample.sustained_waiting, 2);
    assert_eq!(peer.completed_since(&sample), 0);
    drop(first);
    assert_eq!(peer.completed_since(&sample), 1);
    drop(second);
    assert_eq!(
        discount_completed(sample.load, peer.completed_since(&sample)),
        load(0, 8)
    );
    assert_eq!(peer.in_flight(), 0);
}

#[test]
fn the_slot_limit_holds_and_slots_come_back() {
    let peer = Arc::new(PeerState::new(0, "127.0.0.1:1".into()));
    let a = peer.try_acquire(2).expect("first");
    let _b = peer.try_acquire(2).expect("second");
    assert!(peer.try_acquire(2).is_none(), "limit reached");
    drop(a);
    assert!(peer.try_acquire(2).is_some(), "a released slot is reusable");
}

#[test]
fn a_queue_counts_only_when_two_consecutive_scrapes_show_it() {
    let peer = PeerState::new(0, "127.0.0.1:1".into());
    peer.record_engine(load(3, 6), 0, 100);
    assert_eq!(
        peer.engine_sample().unwrap().sustained_waiting,
        0,
        "one sample is a blip"
    );
    peer.record_engine(load(2, 6), 50, 100);
    assert_eq!(
        peer.engine_sample().unwrap().sustained_waiting,
        2,
        "seen twice: the smaller count"
    );
    peer.record_engine(load(0, 6), 100, 100);
    assert_eq!(
        peer.engine_sample().unwrap().sustained_waiting,
        0,
        "drained"
    );
    peer.record_engine(load(4, 6), 150, 100);
    peer.record_engine(load(4, 6), 400, 100);
    assert_eq!(
        peer.engine_sample().unwrap().sustained_waiting,
        0,
        "previous scrape too old to count"
    );
}

#[test]
fn capacity_is_published_else_learned_from_the_tokens_slots_carry() {
    let peer = Arc::new(PeerState::new(0, "127.0.0.1:1".into()));
    assert_eq!(peer.kv_capacity(), None);
    let mut slots: Vec<InFlightGuard> = (0..4)
        .map(|_| {
            let mut slot = peer.try_acquire(8).expect("slot");
            slot.carry_tokens(5_000);
            slot
        })
        .collect();
    for _ in 0..5 {
        peer.learn_kv_capacity(0.2);
    }
    assert_eq!(
        peer.kv_capacity(),
        Some((100_000, CapacitySource::Learned)),
        "20k tokens in flight at 20% usage"
    );
    // Released slots take their tokens with them: readings with nothing
    // in flight teach nothing.
    slots.clear();
    assert_eq!(peer.in_flight_tokens.load(Ordering::Relaxed), 0);
    // What the engine publishes wins over what was learned.
    peer.record_kv_capacity(32_768, CapacitySource::Props);
    assert_eq!(peer.kv_capacity(), Some((32_768, CapacitySource::Props)));
}

#[test]
fn another_replicas_traffic_stops_the_learning_with_a_control() {
    let learn = |remote: u32| {
        let peer = Arc::new(PeerState::new(0, "127.0.0.1:1".into()));
        peer.set_remote_in_flight(remote);
        let mut slot = peer.try_acquire(8).expect("slot");
        slot.carry_tokens(10_000);
        for _ in 0..5 {
            peer.learn_kv_capacity(0.5);
        }
        peer.kv_capacity()
    };
    assert_eq!(
        learn(3),
        None,
        "the KV holds prompts this replica cannot see"
    );
    assert_eq!(learn(0), Some((20_000, CapacitySource::Learned)));
}

#[test]
fn a_slot_awaits_its_first_token_once() {
    let peer = Arc::new(PeerState::new(0, "127.0.0.1:1".into()));
    let mut a = peer.try_acquire(8).expect("slot");
    let mut b = peer.try_acquire(8).expect("slot");
    a.cold_prefill(30_000);
    b.cold_prefill(5_000);
    assert_eq!(peer.awaiting_first_token(), 2);
    assert_eq!(peer.cold_backlog_tokens(), 35_000);
    a.first_token();
    a.first_token();
    assert_eq!(peer.awaiting_first_token(), 1, "counted down once");
    assert_eq!(peer.cold_backlog_tokens(), 5_000);
    a.cold_prefill(30_000);
    assert_eq!(
        peer.cold_backlog_tokens(),
        5_000,
        "past its first token, nothing is ahead of the engine"
    );
    drop(a);
    assert_eq!(peer.awaiting_first_token(), 1, "a's was already gone");
    // A request that ends before any token (an error) stops awaiting too.
    drop(b);
    assert_eq!(peer.awaiting_first_token(), 0);
    assert_eq!(peer.cold_backlog_tokens(), 0);
}
