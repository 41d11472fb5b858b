//! One model behind every placement decision: for each ready engine, the
//! expected time to this request's first token there, in parts, and the
//! prefill its binding there makes other sessions pay.
//!
//! - **Queue**: requests the engine reports waiting, drained at the rate
//!   it has been finishing them, and one completion more when every
//!   gateway slot there is taken.
//! - **Backlog**: prompts still prefilling there before their first token
//!   (the gateway's own, which vLLM's metrics do not show: it admits every
//!   prompt as running and prefills them in chunks in turn), half of them
//!   on average still to do.
//! - **Load** (when a session is bound, [`weigh`]): the requests an engine
//!   carries beyond the lightest candidate: where its batch has room, each
//!   a decode step's worth (the steps the newcomer's prefill shares with
//!   them); where it is full, each a completion's worth (the wait).
//! - **Prefill**: the request's own tokens not cached there. All of them
//!   where nothing of it is; on its home, what the home still holds of it
//!   after the eviction its KV pressure implies (its share of the excess:
//!   vLLM and SGLang free a sequence's blocks tail first, so the rest of
//!   its context is still there); on an engine that was recently sent a
//!   prefix it shares (a template, a parent's history), all but that
//!   prefix.
//! - **Evicts**: binding a session where it was not pushes that engine's
//!   working set up by what the session will grow to (the route's typical
//!   ended session, learned, or its own size when more); what then passes
//!   the engine's KV is evicted between turns, each turn there finding its
//!   share of it gone and prefilling it again. Per turn and per session, so
//!   an engine far past its KV costs more per session than one just past
//!   it: sessions spread evenly rather than piling where one more seems to
//!   change little. On its home the share counts only what the engine
//!   holds now past its line (its sessions, or its reported KV use when
//!   more): a young session on an engine that is evicting moves while its
//!   context is cheap to move, an old one stays. Not what its sessions will
//!   hold once grown: sessions of staggered ages hold about half their end
//!   size, and moves made for that projection cost cold prefills on
//!   engines with room (issue 42's family).
//!
//! Each part is tokens times the engine's prefill speed, learned from its
//! own first tokens ([`super::speed`]), or a wait, so one unit (time)
//! decides stickiness, moves and where a new session or a template's
//! newcomer goes. Near-equal engines (within an eighth of the session's
//! expected cold prefill; between engines that cache as much of it, within
//! the largest backlog among them, as much of it as the session's later
//! turns outlive) are told apart by what they will hold
//! relative to their KV, not by a hash: sessions that start together and
//! grow together then spread evenly instead of by lottery.
//!
//! Pure: the caller hands in the peers as they are now.

use super::{PeerId, PeerLoad, WHOLE};

/// A prefill speed for comparisons before any engine of the route has been
/// timed: 50 µs a token, 20k tokens a second, a mid-size model on one GPU.
/// Where every part compared is prefill the unit cancels; it only weighs a
/// queue against prefill until the first cold turns are timed.
pub const PRIOR_PREFILL_US: f32 = 50.0;

/// The context a session is taken to grow to while the route knows none.
pub const UNKNOWN_SESSION_TOKENS: u64 = 8_192;

/// Engines a shared prefix is remembered on at most.
pub const MAX_HOLDERS: usize = 8;

/// What the model knows of the route beyond each engine.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct RouteModel {
    /// Prefill µs per token for an engine not timed yet: the median of the
    /// engines that were; `None` before any.
    pub prefill_us: Option<f32>,
    /// The median time per output token of the timed engines: an engine
    /// decoding slower than that is taken to prefill slower by as much
    /// until its own first tokens say.
    pub tpot_us: Option<f32>,
    /// The median completion rate of the engines that have one: what a
    /// request in flight is worth on an engine whose own is not known yet.
    pub completions_per_s: Option<f32>,
    /// The context a session of this route grows to: the mean size at which
    /// recent sessions ended (0: none has yet).
    pub typical_session: u64,
    /// Share of an engine's KV (per mille) sessions may fill before what
    /// they hold counts as evicting.
    pub admit_permille: u32,
}

/// A prefix of the request recently sent to some engines (a template's
/// newcomer, a fork's parent history): cached there until their KV
/// pressure evicts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Prefix {
    pub tokens: u64,
    holders: [PeerId; MAX_HOLDERS],
    len: u8,
}

impl Prefix {
    pub fn new(tokens: u64, holders: impl IntoIterator<Item = PeerId>) -> Self {
        let mut p = Prefix {
            tokens,
            ..Prefix::default()
        };
        for id in holders.into_iter().take(MAX_HOLDERS) {
            p.holders[usize::from(p.len)] = id;
            p.len += 1;
        }
        p
    }

    pub fn holders(&self) -> &[PeerId] {
        &self.holders[..usize::from(self.len)]
    }

    pub fn held_on(&self, id: PeerId) -> bool {
        self.holders().contains(&id)
    }
}

/// The request being placed, as the model sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Ask {
    /// Its context tokens (as estimated before the engine counts them).
    pub tokens: u64,
    /// The engine its session is bound to, and the context the session
    /// held there after its last turn.
    pub home: Option<PeerId>,
    pub held: u64,
    pub prefix: Option<Prefix>,
}

/// One engine's estimate for one request; every time in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Estimate {
    pub peer: PeerId,
    pub queue_ms: f32,
    /// `false`: the engine reports a queue but its completion rate is not
    /// learned yet, so `queue_ms` says nothing.
    pub queue_known: bool,
    pub backlog_ms: f32,
    /// The requests the engine carries beyond the least loaded candidate,
    /// each a completion's worth of waiting (the queue a binding there adds
    /// to): set by [`weigh`], 0 from [`estimate`] alone.
    pub load_ms: f32,
    pub prefill_ms: f32,
    /// Of the request's tokens, those cached there and those not.
    pub cached_tokens: u64,
    pub uncached_tokens: u64,
    /// What each turn there will find evicted once the session is bound
    /// there (the engine's excess over its KV, the sessions grown to their
    /// expected size, shared by its sessions), and its prefill: a cost the
    /// session and every other session there pay each turn. On its home,
    /// the share of what the engine holds now past its line, beyond what
    /// is gone already.
    pub evicts_tokens: u64,
    pub evicts_ms: f32,
    /// What the engine will hold with the session, in tokens, and per
    /// mille of its KV when that is known: what near-equal engines are
    /// told apart by.
    pub hold_tokens: u64,
    pub hold_permille: Option<u64>,
    /// The prefill speed used (µs a token) and whether it is the engine's own.
    pub prefill_us: f32,
    pub timed: bool,
}

impl Estimate {
    /// The expected time to the first token there, plus what binding the
    /// session there costs others.
    pub fn total_ms(&self) -> f32 {
        self.queue_ms + self.backlog_ms + self.load_ms + self.prefill_ms + self.evicts_ms
    }
}

/// The size a session of `tokens` is expected to grow to on this route.
pub fn expected_size(tokens: u64, route: &RouteModel) -> u64 {
    tokens.max(route.typical_session)
}

/// The prefill speed (µs a token) the model uses for `p`.
pub fn prefill_speed(p: &PeerLoad, route: &RouteModel) -> f32 {
    prefill_us(p, route).0
}

/// The prefill speed the model uses for `p`: its own, else the route's
/// scaled by how much slower it decodes, else the prior; an engine not
/// timed yet no faster than its first token still awaited allows. Every
/// engine's first tokens come late at a start, the slower engine's last:
/// until they did, a slow engine was taken to be as fast as the others and
/// given its share of a burst of new sessions, each second more waiting
/// behind the last (issue 42, shared-prefix f4: eleven prompts on e0 in
/// 3 s, first tokens 3-11 s later, the run's p95).
fn prefill_us(p: &PeerLoad, route: &RouteModel) -> (f32, bool) {
    if let Some(us) = p.speed.prefill_us {
        return (us, true);
    }
    let base = route.prefill_us.unwrap_or(PRIOR_PREFILL_US);
    let scale = match (p.speed.tpot_us, route.tpot_us) {
        (Some(own), Some(route)) if route > 0.0 => (own / route).clamp(0.25, 4.0),
        _ => 1.0,
    };
    let at_least = p.speed.prefill_us_at_least.unwrap_or(0.0);
    ((base * scale).max(at_least), false)
}

/// What an engine's sessions hold between turns now (each by its chance of
/// coming back), or what the engine reports in use when more: other
/// gateways' traffic fills the same KV.
fn held_now(p: &PeerLoad, cap: u64) -> u64 {
    let reported = p.engine.map_or(0.0, |e| e.kv_usage.clamp(0.0, 1.0));
    p.bound.returning_tokens.max((reported * cap as f64) as u64)
}

/// The live sessions of `p` likely to come back.
fn returning(p: &PeerLoad) -> f64 {
    p.bound.returning_milli as f64 / f64::from(WHOLE)
}

/// An engine's excess spread over the sessions that share it (at least one).
fn per_session(excess: u64, sessions: f64) -> u64 {
    (excess as f64 / sessions.max(1.0)) as u64
}

/// The tokens of the request cached on `p`: on its home, what the home
/// still holds of the session; where its shared prefix was sent, that
/// prefix (a fork bound next to its parent has both, the more counts).
fn cached_on(p: &PeerLoad, ask: &Ask) -> u64 {
    let at_home = (ask.home == Some(p.id)).then(|| {
        // Over its KV by `excess`, the engine evicts sessions' tails (vLLM
        // and SGLang free a sequence's blocks tail first) as they sit idle,
        // and each returning turn finds its share of the excess gone and
        // the rest of its context still there.
        let excess = p
            .kv_capacity_tokens
            .map_or(0, |cap| p.bound.returning_tokens.saturating_sub(cap));
        ask.held.saturating_sub(per_session(excess, returning(p)))
    });
    let shared = ask
        .prefix
        .filter(|prefix| prefix.held_on(p.id))
        .map(|prefix| prefix.tokens);
    at_home
        .unwrap_or(0)
        .max(shared.unwrap_or(0))
        .min(ask.tokens)
}

/// The engine's estimate for `ask`. `unit` is the context one request in
/// flight is taken to hold where no binding says (the route's typical
/// session, or [`UNKNOWN_SESSION_TOKENS`]).
pub fn estimate(p: &PeerLoad, ask: &Ask, route: &RouteModel) -> Estimate {
    let (us, timed) = prefill_us(p, route);
    let ms = |tokens: u64| tokens as f32 * us / 1_000.0;
    let cached = cached_on(p, ask);
    let at_home = ask.home == Some(p.id);
    let size = expected_size(ask.tokens, route);
    let unit = match route.typical_session {
        0 => UNKNOWN_SESSION_TOKENS,
        n => n,
    };
    // A live session holds a typical session's worth at least, whatever it
    // holds today; and so does each request in flight that no binding here
    // accounts for (another gateway's, a sessionless one).
    let sessions = p.bound.returning_milli.saturating_mul(unit) / u64::from(WHOLE);
    let carried = u64::from(p.load()).saturating_mul(unit);
    let holds = p.bound.projected_tokens.max(sessions).max(carried);
    let hold_tokens = if at_home {
        holds
    } else {
        holds.saturating_add(size)
    };
    let (evicts_tokens, hold_permille) = match p.kv_capacity_tokens {
        Some(cap) if cap > 0 => {
            // Bound there, with the others grown to their expected size:
            // what the engine holds past the line, as each of its sessions'
            // turns will find its share of it gone. Its own home's share is
            // already in what the home holds of it (`cached_on`).
            let line = cap.saturating_mul(u64::from(route.admit_permille)) / 1000;
            let held = held_now(p, cap);
            let evicts = if at_home {
                // What the engine holds now past its line will take of it
                // there, beyond what the home has taken already.
                let lost = ask.held.saturating_sub(cached.min(ask.held));
                per_session(held.saturating_sub(line), returning(p)).saturating_sub(lost)
            } else {
                let after = holds.max(held).saturating_add(size);
                per_session(after.saturating_sub(line), returning(p) + 1.0)
            };
            (evicts, Some(hold_tokens.saturating_mul(1000) / cap))
        }
        _ => (0, None),
    };
    let (queue_ms, queue_known) = queue(p);
    Estimate {
        peer: p.id,
        queue_ms,
        queue_known,
        backlog_ms: ms(p.backlog_tokens / 2),
        load_ms: 0.0,
        prefill_ms: ms(ask.tokens.saturating_sub(cached)),
        cached_tokens: cached,
        uncached_tokens: ask.tokens.saturating_sub(cached),
        evicts_tokens,
        evicts_ms: ms(evicts_tokens),
        hold_tokens,
        hold_permille,
        prefill_us: us,
        timed,
    }
}

/// How long a request waits before the engine takes it: the sustained
/// queue the engine reports, drained at the rate it finishes requests,
/// and one completion more when every gateway slot there is taken.
fn queue(p: &PeerLoad) -> (f32, bool) {
    let ahead = p.waiting() + u32::from(p.saturated());
    if ahead == 0 {
        return (0.0, true);
    }
    match p.speed.completions_per_s {
        Some(rate) if rate > 0.0 => (ahead as f32 * 1_000.0 / rate, true),
        // Nothing finished lately with requests queued: stuck, as far as
        // anyone can tell.
        Some(_) => (ahead as f32 * 10_000.0, true),
        None => (0.0, false),
    }
}

/// How much better an engine must look to count as better at all: an
/// eighth of what the session costs to prefill cold at its expected size.
/// Below that the difference is noise or passing (a cold prompt ahead
/// that will be done in a moment), and what the engines will hold decides.
pub fn tolerance_ms(ask: &Ask, route: &RouteModel, us: f32) -> f32 {
    expected_size(ask.tokens, route) as f32 * us / 1_000.0 / 8.0
}

/// Each engine passing `eligible` with its estimate, the load it carries
/// beyond the least loaded of them counted in (its requests in flight, or
/// what its live sessions keep in flight on average when more), each
/// request more priced by [`per_request_ms`]: the batch a binding there
/// joins. What keeps a template's holder from drawing every newcomer
/// while it is busier than the rest by more than the template saves.
pub fn weigh<'a>(
    peers: &'a [PeerLoad],
    ask: &Ask,
    route: &RouteModel,
    eligible: impl Fn(&PeerLoad) -> bool,
) -> Vec<(&'a PeerLoad, Estimate)> {
    let mut options: Vec<(&PeerLoad, Estimate)> = peers
        .iter()
        .filter(|p| eligible(p))
        .map(|p| (p, estimate(p, ask, route)))
        .collect();
    // Live sessions between turns come back: an engine carries at least its
    // sessions likely to return, times the share of their time sessions
    // spend in flight (the route's requests in flight over its returning
    // sessions, now).
    let returning = |p: &PeerLoad| p.bound.returning_milli as f32 / WHOLE as f32;
    let in_flight: f32 = options.iter().map(|(p, _)| p.load() as f32).sum();
    let sessions: f32 = options.iter().map(|(p, _)| returning(p)).sum();
    let duty = if sessions > 0.0 {
        (in_flight / sessions).min(1.0)
    } else {
        0.0
    };
    let carried = |p: &PeerLoad| (p.load() as f32).max(returning(p) * duty);
    let lightest = options
        .iter()
        .map(|(p, _)| carried(p))
        .fold(f32::INFINITY, f32::min);
    let unit = match route.typical_session {
        0 => UNKNOWN_SESSION_TOKENS,
        n => n,
    };
    for (p, e) in options.iter_mut() {
        e.load_ms = (carried(p) - lightest).max(0.0) * per_request_ms(p, route, unit, e.prefill_us);
    }
    options
}

/// What each request an engine carries beyond the lightest costs a
/// newcomer there. Where its batch has room (the engine reports nothing
/// waiting and a gateway slot is free) the newcomer starts at once and
/// shares the engine's steps with the others: each one more makes every
/// step of its prefill longer, a decode step's worth at most (the engine's
/// time per output token, else the route's). Counting a completion's time
/// for each, as if it queued, sent a template's newcomer away cold from
/// an engine holding its prefix two requests heavier than the rest, though
/// its batch had room for a hundred more (issue 42's shared-prefix runs).
/// Where the batch is full the newcomer waits for requests to finish: a
/// completion's time each (the engine's rate, else the route's; before
/// any, a typical session's prefill of `unit` tokens at `us`).
fn per_request_ms(p: &PeerLoad, route: &RouteModel, unit: u64, us: f32) -> f32 {
    let completion_ms = match p
        .speed
        .completions_per_s
        .or(route.completions_per_s)
        .filter(|r| *r > 0.0)
    {
        Some(rate) => 1_000.0 / rate,
        None => unit as f32 * us / 1_000.0,
    };
    if p.waiting() > 0 || p.saturated() {
        return completion_ms;
    }
    match p.speed.tpot_us.or(route.tpot_us) {
        Some(tpot_us) => (tpot_us / 1_000.0).min(completion_ms),
        None => completion_ms,
    }
}

/// The engine to bind a session to among those passing `eligible`: the
/// least expected time ([`weigh`]: with the load it joins and what it
/// evicts); among those within the tolerance of it, the one that will hold
/// the least relative to its KV; then the least time, then the fewest
/// requests in flight; exact ties by `rand` (the rules pass the session's
/// hash, so a prediction of the placement holds).
pub fn choose<'a>(
    peers: &'a [PeerLoad],
    ask: &Ask,
    route: &RouteModel,
    rand: u64,
    eligible: impl Fn(&PeerLoad) -> bool,
) -> Option<(&'a PeerLoad, Estimate)> {
    let options = weigh(peers, ask, route, eligible);
    let fastest = options
        .iter()
        .map(|(_, e)| e.total_ms())
        .fold(f32::INFINITY, f32::min);
    let us = route.prefill_us.unwrap_or(PRIOR_PREFILL_US);
    // Between engines that hold as much of the request (none of it, for a
    // new session), the cold prompts ahead pass within seconds while a
    // binding lasts the session's life: their backlogs, which leave an
    // engine a whole prompt at a time, are no reason to pick one, and what
    // the engines will hold decides. A conversation of one or two turns (a
    // tenant's template with a question) lives little longer than the
    // wait, so only the share of its life after this turn passes (issue
    // 42's shared-prefix runs: new tenants sent cold, three at a time, to
    // the slow engine while a fast one had two prompts ahead). Against an
    // engine holding more of it (a template's holder) the backlog counts
    // in full: the prefill it saves is worth a wait no longer than that.
    // And nothing passes where every engine's KV is known and the
    // fullest would hold under half its line with this session: a balance
    // that evicts nothing until the sessions double buys no wait, while
    // the allowance, the largest backlog, excused its own engine's, which
    // each placement there made larger (issue 42's shared-prefix f1, KV
    // 3.5x the working set: five new conversations sent in 1.4 s behind
    // an 8 s backlog for holding 3 permille of KV less than an engine
    // that would start them in 2.6 s).
    let least_cached = options
        .iter()
        .map(|(_, e)| e.cached_tokens)
        .min()
        .unwrap_or(0);
    let passing = options
        .iter()
        .filter(|(_, e)| e.cached_tokens == least_cached)
        .map(|(_, e)| e.backlog_ms)
        .fold(0.0, f32::max)
        * backlog_passing(ask, route);
    let passing = if balance_buys_nothing(&options, route) {
        0.0
    } else {
        passing
    };
    let near = fastest + tolerance_ms(ask, route, us).max(passing);
    // Relative to each engine's KV where every one's is known: a larger
    // engine takes more.
    let by_share = options.iter().all(|(_, e)| e.hold_permille.is_some());
    let key = |e: &Estimate| match (by_share, e.hold_permille) {
        (true, Some(permille)) => permille,
        _ => e.hold_tokens,
    };
    let mut chosen: Option<(&PeerLoad, Estimate)> = None;
    let mut ties = 0u64;
    for (p, e) in options.into_iter().filter(|(_, e)| e.total_ms() <= near) {
        let order = chosen.map_or(std::cmp::Ordering::Less, |(cp, c)| {
            let c_load = cp.load();
            key(&e)
                .cmp(&key(&c))
                .then(e.total_ms().total_cmp(&c.total_ms()))
                .then(p.load().cmp(&c_load))
        });
        match order {
            std::cmp::Ordering::Less => {
                ties = 1;
                chosen = Some((p, e));
            }
            std::cmp::Ordering::Equal => {
                // Each exact tie equally likely (reservoir sampling).
                ties += 1;
                if crate::hash::mix64(rand, ties).is_multiple_of(ties) {
                    chosen = Some((p, e));
                }
            }
            std::cmp::Ordering::Greater => {}
        }
    }
    chosen
}

/// Whether every option's KV is known and the fullest of them, with the
/// session bound there at its expected size, would hold under half of its
/// admission line.
fn balance_buys_nothing(options: &[(&PeerLoad, Estimate)], route: &RouteModel) -> bool {
    let half_line = u64::from(route.admit_permille) / 2;
    options
        .iter()
        .all(|(_, e)| e.hold_permille.is_some_and(|held| held < half_line))
}

/// How much of a backlog is set aside between engines caching alike: it
/// delays this turn only, so the share of the session's turns left that
/// come after this one. While the route's sessions' size is unknown, all
/// of it (a binding is taken to last), as the balance of what engines
/// hold then matters most.
fn backlog_passing(ask: &Ask, route: &RouteModel) -> f32 {
    if route.typical_session == 0 {
        return 1.0;
    }
    1.0 - 1.0 / turns_left(ask, route)
}

/// Turns ahead a move's gain is counted over at most: past that the
/// engines will have changed too much to say.
const MAX_TURNS_AHEAD: f32 = 16.0;

/// The turns a session has left on this route: what it will still grow by
/// (to the route's typical session) over what this turn adds; 1 while the
/// typical size is unknown or the session is past it.
pub fn turns_left(ask: &Ask, route: &RouteModel) -> f32 {
    let new = ask.tokens.saturating_sub(ask.held).max(1);
    let left = route.typical_session.saturating_sub(ask.held);
    (left as f32 / new as f32).clamp(1.0, MAX_TURNS_AHEAD)
}

/// Staying against moving, over the turns a session has left: a move pays
/// the prefill of what its home holds of it once, and gains the difference
/// in every later turn (a slower home, a home past its KV); a
/// queue or a backlog lasts this turn only.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Lifetime {
    pub turns: f32,
    pub stay_ms: f32,
    pub move_ms: f32,
    /// How much less a move must cost to be made: half of what its first
    /// turn costs there, at least the tolerance (one turn's hysteresis).
    pub margin_ms: f32,
}

impl Lifetime {
    pub fn moves(&self) -> bool {
        self.move_ms + self.margin_ms < self.stay_ms
    }
}

/// [`Lifetime`] of a session bound to `home` against `other` (the
/// request's estimates there, `other`'s as if cold).
pub fn lifetime(home: &Estimate, other: &Estimate, ask: &Ask, route: &RouteModel) -> Lifetime {
    let turns = turns_left(ask, route);
    let (once, each) = move_prefill(ask, other.uncached_tokens, other.prefill_us);
    let move_now = other.queue_ms + other.backlog_ms + other.load_ms + once;
    let move_each = each + other.evicts_ms;
    Lifetime {
        turns,
        stay_ms: stay_ms(home, ask, route),
        move_ms: move_now + turns * move_each,
        margin_ms: move_margin(move_now + move_each, ask, route, other.prefill_us),
    }
}

/// The least a move can cost over the session's life on any engine that
/// prefills at `us` or slower and shares at most `shared` tokens of it,
/// with its margin: when staying costs no more, no engine need be weighed.
pub fn least_move_ms(ask: &Ask, route: &RouteModel, shared: u64, us: f32) -> f32 {
    let (once, each) = move_prefill(ask, ask.tokens.saturating_sub(shared), us);
    once + turns_left(ask, route) * each + move_margin(once + each, ask, route, us)
}

/// The prefill a move costs at `us` a token where `cold` of the request's
/// tokens are not cached: what this turn pays once beyond its new tokens,
/// and the new tokens every turn pays there.
fn move_prefill(ask: &Ask, cold: u64, us: f32) -> (f32, f32) {
    let ms = |tokens: u64| tokens as f32 * us / 1_000.0;
    let warm_there = ask.tokens.saturating_sub(ask.held).min(cold);
    (ms(cold - warm_there), ms(warm_there))
}

/// How much less a move must cost than staying: half its first turn
/// there, at least the tolerance (one turn's hysteresis).
fn move_margin(first_turn_ms: f32, ask: &Ask, route: &RouteModel, us: f32) -> f32 {
    (first_turn_ms * 0.5).max(tolerance_ms(ask, route, us))
}

/// The cost of staying on `home` over the session's life (see [`lifetime`]).
pub fn stay_ms(home: &Estimate, ask: &Ask, route: &RouteModel) -> f32 {
    home.queue_ms + home.backlog_ms + turns_left(ask, route) * (home.prefill_ms + home.evicts_ms)
}

#[cfg(test)]
mod tests;
