//! A route's "room may have freed" signal: an in-flight slot was released
//! (`InFlightGuard`), an adaptive limit rose, or the route's sweeper
//! recounted the live sessions (once a second: a session may have left its
//! engine's live window, and a waiter sees a drain that began). Requests
//! waiting in the route's admission queue (`crate::balance`) sleep on it,
//! warm turns first, new sessions in arrival order; the request path pays
//! one atomic load per released slot when nobody waits.
//!
//! On a route with `fair_share` (the default) the waiters are grouped by
//! priority class and tenant, and only the group [`crate::fair::FairOrder`]
//! picks may try, each group keeping the order above within itself. A
//! group whose try found no room (its warm turn's engine busy, another
//! model's pool) is passed over until room frees again, and the next group
//! is woken at once: the order never keeps room from a waiter that can use
//! it. Every request placed on such a route charges its tenant's counter
//! once, at its end ([`RoomSignal::charge`]): the one lock a request that
//! never waits pays for fairness.

use crate::fair::{FairOrder, TOKEN_WEIGHTS};
use crate::tenants::{FairStanding, Tag};
use parking_lot::Mutex;
use std::cell::Cell;
use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::Notify;

/// A group of waiters: (class rank, tenant).
type GroupKey = (usize, Arc<str>);

/// One group's waiters for one model pool, in the plain queue's order.
/// Kept apart by pool so that a head waiting for a full pool never holds
/// back the group's request for another pool that has room.
#[derive(Debug, Default)]
struct Line {
    warm: usize,
    new_tickets: BTreeSet<u64>,
    /// The room epoch at which it last tried and found no room.
    tried_at: Option<u64>,
}

impl Line {
    fn is_empty(&self) -> bool {
        self.warm == 0 && self.new_tickets.is_empty()
    }
}

/// The fair queue's state, under one lock taken only by waiters, the
/// charge at a request's end, and `/_tenants`.
#[derive(Debug)]
struct FairQueue {
    order: FairOrder<Arc<str>>,
    /// Each group's lines, by pool label.
    groups: HashMap<GroupKey, HashMap<Arc<str>, Line>>,
}

impl Default for FairQueue {
    fn default() -> Self {
        FairQueue {
            order: FairOrder::new(crate::config::tenants::DEFAULT_CLASS_MIN_SHARE),
            groups: HashMap::new(),
        }
    }
}

impl FairQueue {
    /// Every line of the group found no room since it last freed.
    fn passed_over(&self, key: &GroupKey, epoch: u64) -> bool {
        self.groups
            .get(key)
            .is_none_or(|lines| lines.values().all(|l| l.tried_at == Some(epoch)))
    }
}

#[derive(Debug, Default)]
pub struct RoomSignal {
    /// Waiters for a warm turn (a session already bound to an engine) and
    /// for a new session; warm turns are placed first.
    waiting_warm: AtomicUsize,
    waiting_new: AtomicUsize,
    /// Tickets of the new sessions waiting, oldest first: they are placed
    /// in arrival order. New sessions all ask for about the same room (a
    /// newcomer is counted at the pool's mean session size), so one in
    /// front never blocks a smaller one behind it for long; left to race on
    /// each wake-up instead, some won every time and others waited out the
    /// whole timeout and were then placed without room.
    new_tickets: Mutex<BTreeSet<u64>>,
    next_ticket: AtomicU64,
    notify: Notify,
    /// Counts the times room may have freed while someone waited: a fair
    /// group that found no room is passed over until it moves.
    epoch: AtomicU64,
    fair: Mutex<FairQueue>,
    /// The tenant of the last request seen (by hash), and until when the
    /// route counts as shared by more than one tenant: the fair hold
    /// (`balance/queue.rs`) applies only then, so a gateway with one
    /// tenant sends as it always did.
    last_tenant: AtomicU64,
    shared_until_ms: AtomicU64,
    /// Requests waiting for their engine's prompts ahead (the fair hold):
    /// only while there are some does a first token wake the waiters.
    held: AtomicUsize,
}

/// A request counted among those the fair hold keeps, until dropped (also
/// when its client leaves and the wait's future with it).
pub struct HeldMark<'a>(&'a RoomSignal);

impl Drop for HeldMark<'_> {
    fn drop(&mut self) {
        self.0.held.fetch_sub(1, Ordering::AcqRel);
    }
}

/// How long after two tenants' requests follow each other the route still
/// counts as shared: longer than an agent's think time between turns, so a
/// quiet tenant's sessions keep it shared while they live.
pub const SHARED_FOR_MS: u64 = 10_000;

impl RoomSignal {
    /// Wakes every waiter so each tries to place itself again.
    pub fn room_may_have_freed(&self) {
        if self.anyone_waits() {
            self.epoch.fetch_add(1, Ordering::AcqRel);
            self.notify.notify_waiters();
        }
    }

    /// A request of `tenant` arrived at `now_ms`: whether more than one
    /// tenant sends on the route now. Two atomic operations when the
    /// tenant is the last one's.
    pub fn note_tenant(&self, tenant: &str, now_ms: u64) -> bool {
        let hash = crate::hash::stable_hash64(tenant.as_bytes());
        let last = self.last_tenant.swap(hash, Ordering::AcqRel);
        // 0: no request before this one.
        if last != hash && last != 0 {
            self.shared_until_ms
                .fetch_max(now_ms.saturating_add(SHARED_FOR_MS), Ordering::AcqRel);
        }
        now_ms < self.shared_until_ms.load(Ordering::Acquire)
    }

    /// A request starts waiting for its engine's prompts ahead.
    pub fn hold(&self) -> HeldMark<'_> {
        self.held.fetch_add(1, Ordering::AcqRel);
        HeldMark(self)
    }

    /// An engine's prompt had its first token: a request held for its
    /// engine's prompts ahead may go. Nothing else waits for that, so only
    /// held requests are woken (one atomic load when none is).
    pub fn first_token_seen(&self) {
        if self.held.load(Ordering::Acquire) > 0 {
            self.room_may_have_freed();
        }
    }

    pub fn anyone_waits(&self) -> bool {
        self.waiting_warm.load(Ordering::Acquire) + self.waiting_new.load(Ordering::Acquire) > 0
    }

    /// A request of `tag` placed on a fair route ended, served `served`
    /// tokens' cost (`crate::fair::Served::cost`), of which `charged` was
    /// charged when the queue released it.
    pub fn charge(&self, tag: &Tag, served: f64, charged: f64) {
        self.fair
            .lock()
            .order
            .charge(&tag.name, served - charged, tag.weight);
    }

    /// Every tenant the fair queue knows: its waiters and counter.
    pub fn fair_standings(&self) -> Vec<FairStanding> {
        self.fair
            .lock()
            .order
            .each()
            .map(|(tenant, standing)| FairStanding {
                tenant: Arc::clone(tenant),
                standing,
            })
            .collect()
    }

    pub fn notify(&self) -> &Notify {
        &self.notify
    }

    /// (warm, new) requests waiting now.
    pub fn waiting(&self) -> (usize, usize) {
        (
            self.waiting_warm.load(Ordering::Acquire),
            self.waiting_new.load(Ordering::Acquire),
        )
    }

    /// Counts the caller as waiting until the returned place is dropped
    /// (placed, timed out, or the client went away). A new session entering
    /// at `now_ms` lets warm turns go first for `precedence_ms`, then tries
    /// alongside them. With `fair` (its tenant's tag, and each lower class's
    /// minimum share) it waits in its group's turn, in the line of its
    /// pool (`pool`, the pool's label).
    pub fn enter(
        &self,
        warm: bool,
        now_ms: u64,
        precedence_ms: u64,
        fair: Option<(&Tag, f64)>,
        pool: &str,
    ) -> QueuePlace<'_> {
        self.counter(warm).fetch_add(1, Ordering::AcqRel);
        let ticket = (!warm).then(|| self.next_ticket.fetch_add(1, Ordering::Relaxed));
        let group = fair.map(|(tag, min_share)| {
            let key: GroupKey = (tag.class, Arc::clone(&tag.name));
            let mut q = self.fair.lock();
            q.order.set_min_share(min_share);
            q.order.arrive(&tag.name, tag.class);
            let pool: Arc<str> = Arc::from(pool);
            let line = q
                .groups
                .entry(key.clone())
                .or_default()
                .entry(Arc::clone(&pool))
                .or_default();
            // A newcomer that can try at once (warm, or first in its line)
            // may fit where the line's earlier try did not. One behind a
            // head that found no room leaves the mark: cleared, the group
            // counted as not passed over while its sleeping head waits for
            // a wake-up nobody sends, and the other groups' waiters, one
            // for an idle pool among them, stopped trying (the review).
            if ticket.is_none() || line.new_tickets.is_empty() {
                line.tried_at = None;
            }
            match ticket {
                Some(t) => {
                    line.new_tickets.insert(t);
                }
                None => line.warm += 1,
            }
            FairPlace {
                key,
                pool,
                weight: tag.weight,
            }
        });
        if let (Some(t), None) = (ticket, &group) {
            self.new_tickets.lock().insert(t);
        }
        QueuePlace {
            signal: self,
            warm,
            ticket,
            warm_first_until_ms: now_ms.saturating_add(precedence_ms),
            group,
            tried_at: Cell::new(0),
        }
    }

    fn counter(&self, warm: bool) -> &AtomicUsize {
        if warm {
            &self.waiting_warm
        } else {
            &self.waiting_new
        }
    }
}

/// A waiter's group, its pool's line in it, and its tenant's weight.
#[derive(Debug)]
struct FairPlace {
    key: GroupKey,
    pool: Arc<str>,
    weight: f64,
}

/// One request's place in the queue; dropping it leaves the queue.
#[derive(Debug)]
pub struct QueuePlace<'a> {
    signal: &'a RoomSignal,
    warm: bool,
    ticket: Option<u64>,
    /// A new session: until when waiting warm turns go before it.
    warm_first_until_ms: u64,
    /// On a fair route: its group, line and weight.
    group: Option<FairPlace>,
    /// The room epoch its last [`QueuePlace::may_try`] saw.
    tried_at: Cell<u64>,
}

impl QueuePlace<'_> {
    /// Whether this waiter may try for room now: a warm turn always; a new
    /// session when it arrived before every other new session still
    /// waiting, and no warm turn waits or it has given them precedence long
    /// enough. Without that bound, a fleet kept busy by warm turns left new
    /// sessions waiting out the whole queue timeout (the replay bench's
    /// overload tail on vLLM-like engines).
    pub fn may_try(&self, now_ms: u64) -> bool {
        if let Some(place) = &self.group {
            return self.may_try_fair(place, now_ms);
        }
        let Some(ticket) = self.ticket else {
            return true;
        };
        let warm_first = self.signal.waiting_warm.load(Ordering::Acquire) > 0
            && now_ms < self.warm_first_until_ms;
        !warm_first && self.signal.new_tickets.lock().first() == Some(&ticket)
    }

    /// On a fair route: its group is the one picked among those that have
    /// not found the room lacking since it last freed, its line has not,
    /// and within the line the plain order lets it.
    fn may_try_fair(&self, place: &FairPlace, now_ms: u64) -> bool {
        let epoch = self.signal.epoch.load(Ordering::Acquire);
        self.tried_at.set(epoch);
        let q = self.signal.fair.lock();
        let passed_over =
            |class: usize, tenant: &Arc<str>| q.passed_over(&(class, Arc::clone(tenant)), epoch);
        if q.order.next(passed_over).as_ref() != Some(&place.key) {
            return false;
        }
        let Some(line) = q.groups.get(&place.key).and_then(|g| g.get(&place.pool)) else {
            return false;
        };
        if line.tried_at == Some(epoch) {
            return false;
        }
        let Some(ticket) = self.ticket else {
            return true;
        };
        let warm_first = line.warm > 0 && now_ms < self.warm_first_until_ms;
        !warm_first && line.new_tickets.first() == Some(&ticket)
    }

    /// Its try found no room: on a fair route its line is passed over
    /// until room frees again, and the next line or group is woken to try.
    pub fn found_no_room(&self) {
        let Some(place) = &self.group else {
            return;
        };
        let mut q = self.signal.fair.lock();
        if let Some(line) = q
            .groups
            .get_mut(&place.key)
            .and_then(|g| g.get_mut(&place.pool))
        {
            line.tried_at = Some(self.tried_at.get());
        }
        drop(q);
        self.signal.notify.notify_waiters();
    }

    /// It was placed with a prompt of `tokens`: on a fair route its
    /// tenant's counter is charged the prompt now (so that its next waiter
    /// sees it) and the lower classes earn their share; returns the charge.
    pub fn placed(&self, tokens: u64) -> f64 {
        let Some(place) = &self.group else {
            return 0.0;
        };
        let (class, tenant) = &place.key;
        let cost = TOKEN_WEIGHTS.input * tokens as f64;
        self.signal
            .fair
            .lock()
            .order
            .released(tenant, *class, cost, place.weight);
        cost
    }
}

impl Drop for QueuePlace<'_> {
    fn drop(&mut self) {
        if let Some(place) = &self.group {
            let mut q = self.signal.fair.lock();
            let (class, tenant) = &place.key;
            q.order.leave(tenant, *class);
            if let Some(lines) = q.groups.get_mut(&place.key) {
                if let Some(line) = lines.get_mut(&place.pool) {
                    match self.ticket {
                        Some(t) => {
                            line.new_tickets.remove(&t);
                        }
                        None => line.warm = line.warm.saturating_sub(1),
                    }
                    if line.is_empty() {
                        lines.remove(&place.pool);
                    }
                }
                if lines.is_empty() {
                    q.groups.remove(&place.key);
                }
            }
        } else if let Some(ticket) = self.ticket {
            self.signal.new_tickets.lock().remove(&ticket);
        }
        self.signal
            .counter(self.warm)
            .fetch_sub(1, Ordering::AcqRel);
        // A new session holding back behind this warm turn may go now.
        self.signal.room_may_have_freed();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_route_is_shared_from_a_second_tenant_until_the_mix_is_old() {
        let signal = RoomSignal::default();
        // One tenant alone, however long: not shared.
        assert!(!signal.note_tenant("a", 1_000));
        assert!(!signal.note_tenant("a", 50_000));
        // A second tenant: shared, for both, for a while.
        assert!(signal.note_tenant("b", 60_000));
        assert!(signal.note_tenant("a", 61_000));
        assert!(signal.note_tenant("a", 60_000 + SHARED_FOR_MS));
        // The last switch (b to a at 61 s) carries it a little further,
        // then only one tenant has sent for longer than the window.
        assert!(!signal.note_tenant("a", 61_000 + SHARED_FOR_MS));
    }

    #[test]
    fn new_sessions_try_in_arrival_order_and_after_every_warm_turn() {
        let signal = RoomSignal::default();
        let first = signal.enter(false, 0, 1_000, None, "_");
        let second = signal.enter(false, 0, 1_000, None, "_");
        assert!(first.may_try(0));
        assert!(!second.may_try(0), "the later new session waits its turn");
        let warm = signal.enter(true, 0, 1_000, None, "_");
        assert!(warm.may_try(0));
        assert!(!first.may_try(0), "a warm turn goes before any new session");
        drop(warm);
        assert!(first.may_try(0));
        // Leaving the queue (placed, timed out, hung up) hands the turn on.
        drop(first);
        assert!(second.may_try(0));
        assert_eq!(signal.waiting(), (0, 1));
        drop(second);
        assert_eq!(signal.waiting(), (0, 0));
    }

    #[test]
    fn warm_turns_go_first_only_for_a_bounded_time() {
        let signal = RoomSignal::default();
        let new = signal.enter(false, 10_000, 2_000, None, "_");
        let behind = signal.enter(false, 10_500, 2_000, None, "_");
        let _warm = signal.enter(true, 10_000, 2_000, None, "_");
        assert!(!new.may_try(11_999), "warm turns first while it is young");
        assert!(new.may_try(12_000), "then it tries alongside them");
        assert!(
            !behind.may_try(13_000),
            "still in arrival order among new sessions"
        );
        // The control: with no warm turn waiting, precedence never applies.
        let quiet = RoomSignal::default();
        let alone = quiet.enter(false, 10_000, 60_000, None, "_");
        assert!(alone.may_try(10_000));
    }

    fn tag(name: &str) -> Tag {
        Tag {
            name: Arc::from(name),
            class: 1,
            weight: 1.0,
        }
    }

    #[test]
    fn a_fair_queue_lets_the_tenant_served_least_go_past_a_flood() {
        let signal = RoomSignal::default();
        let (a, b) = (tag("a"), tag("b"));
        let flood: Vec<QueuePlace> = (0..3)
            .map(|_| signal.enter(false, 0, 1_000, Some((&a, 0.1)), "_"))
            .collect();
        let quiet = signal.enter(false, 0, 1_000, Some((&b, 0.1)), "_");
        assert!(flood[0].may_try(0), "equal counters: the earlier tenant");
        assert!(!quiet.may_try(0) && !flood[1].may_try(0));
        // A's head is placed and charged its prompt: B is now furthest below.
        let mut flood = flood.into_iter();
        let head = flood.next().expect("three");
        assert_eq!(head.placed(100), 100.0);
        drop(head);
        let second = flood.next().expect("two left");
        assert!(quiet.may_try(0), "b goes before a's second");
        assert!(!second.may_try(0));
        // Work-conserving: B found no room (its pool is another's), so A's
        // next tries; once room frees again B is first again.
        quiet.found_no_room();
        assert!(second.may_try(0));
        signal.room_may_have_freed();
        assert!(quiet.may_try(0) && !second.may_try(0));
        // The standings show both tenants' waiters and counters.
        let mut standings = signal.fair_standings();
        standings.sort_by(|x, y| x.tenant.cmp(&y.tenant));
        assert_eq!(
            standings
                .iter()
                .map(|s| (s.standing.waiting, s.standing.counter))
                .collect::<Vec<_>>(),
            [(2, 100.0), (1, 0.0)]
        );
        // Control: the same arrivals without fairness go in arrival order,
        // B behind the whole flood.
        let plain = RoomSignal::default();
        let mut flood = (0..3)
            .map(|_| plain.enter(false, 0, 1_000, None, "_"))
            .collect::<Vec<_>>()
            .into_iter();
        let quiet = plain.enter(false, 0, 1_000, None, "_");
        drop(flood.next());
        assert!(!quiet.may_try(0), "b still waits behind a's second");
    }

    #[test]
    fn a_head_waiting_for_a_full_pool_does_not_hold_back_its_group_in_another() {
        let signal = RoomSignal::default();
        let a = tag("a");
        let for_x = signal.enter(false, 0, 1_000, Some((&a, 0.1)), "x");
        let for_y = signal.enter(false, 0, 1_000, Some((&a, 0.1)), "y");
        assert!(
            for_x.may_try(0) && for_y.may_try(0),
            "each pool's head tries"
        );
        for_x.found_no_room();
        assert!(!for_x.may_try(0), "x is passed over until room frees");
        assert!(for_y.may_try(0), "y still tries");
        // Control: behind the same head in the same pool, it waits.
        let behind = signal.enter(false, 0, 1_000, Some((&a, 0.1)), "x");
        assert!(!behind.may_try(0));
        // Its arrival leaves the head's mark: with y's pool full too, a's
        // group is passed over and another tenant's waiter for an idle
        // pool tries.
        for_y.found_no_room();
        let b = tag("b");
        let other = signal.enter(false, 0, 1_000, Some((&b, 0.1)), "z");
        assert!(
            other.may_try(0),
            "a newcomer behind a passed-over head stalls nobody"
        );
    }

    #[test]
    fn a_newcomer_first_in_its_line_clears_the_mark_and_tries() {
        let signal = RoomSignal::default();
        let a = tag("a");
        let head = signal.enter(false, 0, 1_000, Some((&a, 0.1)), "x");
        assert!(head.may_try(0));
        head.found_no_room();
        drop(head);
        // The line is empty again: the newcomer is its head and may fit.
        let next = signal.enter(false, 0, 1_000, Some((&a, 0.1)), "x");
        assert!(next.may_try(0));
    }
}
