//! What a cell's own request records say beyond latency: how much it
//! prefilled against what a perfect prefix cache would have, how evenly
//! sessions (and their context) were bound to engines over time, and how
//! well the gateway recognised sessions against the bench's ground truth.
//! Pure, so every mode, the reference cell included, is judged by the same
//! code from the same kind of records.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use crate::ids::IdVia;
use crate::record::Record;

/// Prompt tokens the engines computed, against the fewest a perfect prefix
/// cache (one that forgets nothing and is shared by every engine) would have.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefillBound {
    /// Σ (prompt - cached) of the counted requests.
    pub prefilled: u64,
    /// Σ of what each of them had new: see [`prefill_bound`].
    pub bound: u64,
}

impl PrefillBound {
    /// prefilled / bound: 1.0 is a perfect cache; the excess is re-prefill.
    pub fn ratio(&self) -> Option<f64> {
        (self.bound > 0).then(|| self.prefilled as f64 / self.bound as f64)
    }
}

/// Over the successful requests for which `counted` holds: a turn's bound
/// is its prompt minus the previous successful turn of the same session
/// (prompt + completion: the whole history it re-sends), that is only the
/// new user message and the role tokens around it. A session's first turn
/// in the records has all of its prompt new except the shared system
/// prompt, which only the cell's first request has to compute (a perfect
/// cache shares it from then on, even with requests already in flight).
/// The simulated engine caches prompts only, in whole blocks, so even a
/// perfectly sticky cell sits a little above the bound: it re-prefills the
/// last reply and a partial block every turn. A sub-agent's first turn
/// (`forks`) starts from its parent's history, which a perfect cache holds:
/// only its sub-task is new. Only a retried turn can beat
/// its bound, when the failed attempt had already been prefilled where the
/// retry lands (the records do not say how far a failed attempt got).
pub fn prefill_bound(
    records: &[Record],
    system_tokens: u64,
    counted: impl Fn(&Record) -> bool,
) -> PrefillBound {
    let mut out = PrefillBound::default();
    for (_, prefilled, new) in turn_bounds(records, system_tokens, counted) {
        out.prefilled += prefilled;
        out.bound += new;
    }
    out
}

/// The time to first token each counted request would have had with a
/// perfect prefix cache on an idle engine (`idle_ttft` of its new tokens,
/// as [`prefill_bound`] counts them), at percentile `p` of the cell: the
/// bound a cell's own tail is judged against.
pub fn ttft_bound(
    records: &[Record],
    system_tokens: u64,
    counted: impl Fn(&Record) -> bool,
    idle_ttft: impl Fn(u64) -> Duration,
    p: f64,
) -> Option<f64> {
    let times: Vec<f64> = turn_bounds(records, system_tokens, counted)
        .into_iter()
        .map(|(_, _, new)| idle_ttft(new).as_secs_f64())
        .collect();
    crate::stats::percentile(&times, p)
}

/// Per counted request with usage: (the record, prompt tokens it
/// prefilled, prompt tokens a perfect cache would have had new).
fn turn_bounds(
    records: &[Record],
    system_tokens: u64,
    counted: impl Fn(&Record) -> bool,
) -> Vec<(&Record, u64, u64)> {
    let mut ok: Vec<&Record> = records
        .iter()
        .filter(|r| r.ok && r.usage.is_some())
        .collect();
    ok.sort_by_key(|r| (r.slot, r.generation, r.start));
    let first_start = ok.iter().map(|r| r.start).min();
    let mut out = Vec::new();
    let mut prev: Option<&Record> = None;
    for r in ok {
        let Some(u) = r.usage else { continue };
        let same_session = prev.is_some_and(|p| (p.slot, p.generation) == (r.slot, r.generation));
        let previous = prev.and_then(|p| p.usage).filter(|_| same_session);
        let known = match (previous, r.inherited_tokens) {
            (Some(p), _) => p.prompt_tokens + p.completion_tokens,
            (None, Some(parent)) => parent.max(system_tokens),
            (None, None) if first_start.is_some_and(|s| s < r.start) => system_tokens,
            (None, None) => 0,
        };
        if counted(r) {
            out.push((
                r,
                u.prompt_tokens.saturating_sub(u.cached_tokens),
                u.prompt_tokens.saturating_sub(known),
            ));
        }
        prev = Some(r);
    }
    out
}

/// What one engine holds at one moment, as the client saw it: the live
/// sessions whose last turn went there, and their context (that turn's
/// prompt + completion).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Bound {
    pub sessions: u32,
    pub tokens: u64,
}

/// Per time in `times` (offsets from the cell's start), per engine, what
/// was bound there. A slot's session is live from its first request until
/// the slot starts the next session, or until its last turn (a sub-agent's,
/// `Record::ends_session`) has ended; it is bound to the engine of its last
/// successful turn started by then (placement happens at the start).
pub fn bindings(records: &[Record], engines: usize, times: &[Duration]) -> Vec<Vec<Bound>> {
    let mut slots: BTreeMap<u32, Vec<&Record>> = BTreeMap::new();
    for r in records.iter().filter(|r| !r.cut) {
        slots.entry(r.slot).or_default().push(r);
    }
    for v in slots.values_mut() {
        v.sort_by_key(|r| r.start);
    }
    times
        .iter()
        .map(|&t| {
            let mut per_engine = vec![Bound::default(); engines];
            for recs in slots.values() {
                let started = recs.partition_point(|r| r.start <= t);
                let Some(current) = started.checked_sub(1).map(|i| recs[i]) else {
                    continue;
                };
                let last_ok = recs[..started]
                    .iter()
                    .rev()
                    .take_while(|r| r.generation == current.generation)
                    .find(|r| r.ok && r.engine.is_some())
                    .filter(|r| !(r.ends_session && r.end <= t));
                if let Some(r) = last_ok {
                    if let Some(b) = r.engine.and_then(|e| per_engine.get_mut(e)) {
                        b.sessions += 1;
                        b.tokens += r.usage.map_or(0, |u| u.prompt_tokens + u.completion_tokens);
                    }
                }
            }
            per_engine
        })
        .collect()
}

/// How the gateway attached requests to sessions (`X-Routed-Session`),
/// against the bench's ground truth, over a cell's counted successful
/// requests.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Recognition {
    /// Successful turns after their session's first.
    pub turns: usize,
    /// Of those, the ones whose `X-Routed-Session` equals the one their
    /// session's previous successful turn got.
    pub recognised: usize,
    /// Of those, the ones whose `X-Routed-Session` a different session got
    /// in the cell that is not of its family (a parent, its sub-agents and
    /// their siblings share more than the template; any other two sessions
    /// do not). A turn of two sessions the gateway took for one is both
    /// recognised and wrong.
    pub wrong: usize,
    /// The same turns among those whose request sent no session id.
    pub anonymous_turns: usize,
    pub anonymous_recognised: usize,
    /// `X-Routed-Source` of every counted successful request, first turns
    /// included ("none" without the header).
    pub sources: BTreeMap<String, usize>,
}

fn share(n: usize, of: usize) -> Option<f64> {
    (of > 0).then(|| n as f64 / of as f64)
}

impl Recognition {
    pub fn recognised_share(&self) -> Option<f64> {
        share(self.recognised, self.turns)
    }

    pub fn wrong_share(&self) -> Option<f64> {
        share(self.wrong, self.turns)
    }

    pub fn anonymous_share(&self) -> Option<f64> {
        share(self.anonymous_recognised, self.anonymous_turns)
    }
}

/// Session recognition over the successful requests for which `counted`
/// holds (every successful request is history, and says which session got
/// which `X-Routed-Session`). See [`Recognition`].
pub fn recognition(records: &[Record], counted: impl Fn(&Record) -> bool) -> Recognition {
    let mut ok: Vec<&Record> = records.iter().filter(|r| r.ok).collect();
    ok.sort_by_key(|r| (r.session_key(), r.start));
    // A session's family: its parent's key, or its own.
    let family = |r: &Record| r.parent.unwrap_or(r.session_key());
    let mut owners: HashMap<&str, HashSet<(u32, u32)>> = HashMap::new();
    for r in &ok {
        if let Some(h) = r.routed_session.as_deref() {
            owners.entry(h).or_default().insert(family(r));
        }
    }
    let mut out = Recognition::default();
    let mut prev: Option<&Record> = None;
    for r in ok {
        let later = prev.filter(|p| p.session_key() == r.session_key());
        prev = Some(r);
        if !counted(r) {
            continue;
        }
        let source = r.routed_source.as_deref().unwrap_or("none");
        *out.sources.entry(source.to_string()).or_insert(0) += 1;
        let Some(p) = later else { continue };
        let routed = r.routed_session.as_deref();
        let recognised = routed.is_some() && routed == p.routed_session.as_deref();
        let wrong = routed
            .and_then(|h| owners.get(h))
            .is_some_and(|f| f.iter().any(|f| *f != family(r)));
        out.turns += 1;
        out.recognised += usize::from(recognised);
        out.wrong += usize::from(wrong);
        if r.id_via == IdVia::Nothing {
            out.anonymous_turns += 1;
            out.anonymous_recognised += usize::from(recognised);
        }
    }
    out
}

/// How uneven a per-engine quantity was: at each sample its minimum and
/// maximum over engines; here their means over the samples and the
/// extremes over all samples.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spread {
    pub min_mean: f64,
    pub max_mean: f64,
    pub min: f64,
    pub max: f64,
}

pub fn spread(samples: &[Vec<f64>]) -> Option<Spread> {
    let mut n = 0usize;
    let (mut min_sum, mut max_sum) = (0.0, 0.0);
    let (mut min, mut max) = (f64::INFINITY, f64::NEG_INFINITY);
    for s in samples.iter().filter(|s| !s.is_empty()) {
        let lo = s.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        n += 1;
        min_sum += lo;
        max_sum += hi;
        min = min.min(lo);
        max = max.max(hi);
    }
    (n > 0).then(|| Spread {
        min_mean: min_sum / n as f64,
        max_mean: max_sum / n as f64,
        min,
        max,
    })
}

/// The engine index of a peer name from the generated route (`e0`, `e1`, ...).
pub fn engine_index(peer: &str) -> Option<usize> {
    peer.strip_prefix('e')?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::Usage;

    fn s(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    /// An ok request of session (slot, generation) on `engine`.
    fn rec(slot: u32, generation: u32, start: u64, engine: usize, u: (u64, u64, u64)) -> Record {
        Record {
            slot,
            generation,
            start: s(start),
            end: s(start + 1),
            ok: true,
            engine: Some(engine),
            peer: Some(format!("e{engine}")),
            usage: Some(Usage {
                prompt_tokens: u.0,
                cached_tokens: u.1,
                completion_tokens: u.2,
            }),
            ..Record::default()
        }
    }

    #[test]
    fn bound_counts_only_each_turns_new_suffix() {
        let records = vec![
            // Session (0, 0): 1000 prompt (500 of it system), 100 back; then
            // 1300 = 1100 known + 200 new; then 1600 = 1400 + 200.
            rec(0, 0, 0, 0, (1000, 0, 100)),
            rec(0, 0, 2, 0, (1300, 1000, 100)),
            rec(0, 0, 4, 1, (1600, 0, 100)),
            // A failed retry carries no usage and changes nothing.
            Record {
                slot: 0,
                generation: 0,
                start: s(3),
                ok: false,
                ..Record::default()
            },
            // Session (1, 0) starts after the first request: only its system
            // prompt is known.
            rec(1, 0, 3, 1, (700, 500, 50)),
        ];
        let all = prefill_bound(&records, 500, |_| true);
        // prefilled: 1000 + 300 + 1600 + 200; bound: 1000 + 200 + 200 + 200.
        assert_eq!(
            all,
            PrefillBound {
                prefilled: 3100,
                bound: 1600
            }
        );
        assert!((all.ratio().unwrap() - 3100.0 / 1600.0).abs() < 1e-9);
        // Counting only later requests still uses earlier ones as history.
        let late = prefill_bound(&records, 500, |r| r.start >= s(3));
        assert_eq!(
            late,
            PrefillBound {
                prefilled: 1800,
                bound: 400
            }
        );
        assert_eq!(PrefillBound::default().ratio(), None);
    }

    #[test]
    fn the_system_prompt_is_new_only_to_the_first_request() {
        // Both open the cell cold; the second, in flight before the first
        // ended, still shares the system prompt in a perfect cache.
        let records = vec![
            rec(0, 0, 0, 0, (3000, 0, 100)),
            Record {
                start: Duration::from_millis(500),
                ..rec(1, 0, 0, 1, (4000, 2000, 100))
            },
        ];
        let b = prefill_bound(&records, 2000, |_| true);
        assert_eq!((b.prefilled, b.bound), (5000, 5000));
    }

    #[test]
    fn bindings_follow_the_last_turn_and_end_with_the_session() {
        let records = vec![
            rec(0, 0, 0, 0, (100, 0, 10)),
            rec(0, 0, 5, 1, (200, 0, 10)),
            // Slot 0 starts its next session at 8; its first turn fails.
            Record {
                slot: 0,
                generation: 1,
                start: s(8),
                ..Record::default()
            },
            rec(0, 1, 9, 0, (50, 0, 5)),
            rec(1, 0, 1, 0, (300, 0, 30)),
        ];
        let times = [s(0), s(2), s(6), s(8), s(10)];
        let b = bindings(&records, 2, &times);
        let at =
            |i: usize| -> Vec<(u32, u64)> { b[i].iter().map(|x| (x.sessions, x.tokens)).collect() };
        assert_eq!(at(0), vec![(1, 110), (0, 0)]);
        assert_eq!(at(1), vec![(2, 440), (0, 0)]);
        // Slot 0's session moved to e1.
        assert_eq!(at(2), vec![(1, 330), (1, 210)]);
        // Its next session is not bound anywhere until a turn succeeds.
        assert_eq!(at(3), vec![(1, 330), (0, 0)]);
        assert_eq!(at(4), vec![(2, 385), (0, 0)]);
    }

    /// A successful turn of session (slot, generation) at `start` that the
    /// gateway answered with `routed` (and `source`).
    fn turn(slot: u32, generation: u32, start: u64, routed: Option<&str>) -> Record {
        Record {
            routed_session: routed.map(str::to_string),
            routed_source: routed.map(|_| "content".to_string()),
            id_via: IdVia::Nothing,
            ..rec(slot, generation, start, 0, (100, 0, 10))
        }
    }

    #[test]
    fn recognition_counts_continuity_and_merges_but_not_a_fork_family() {
        let child = |start, routed| Record {
            parent: Some((0, 0)),
            ..turn(8, 0, start, routed)
        };
        let records = vec![
            // Parent (0, 0): three turns, one conversation.
            turn(0, 0, 0, Some("aaaa")),
            turn(0, 0, 2, Some("aaaa")),
            turn(0, 0, 10, Some("aaaa")),
            // Its sub-agent (8, 0), attached to the parent's conversation
            // (they share its history): recognised, and not wrong.
            child(3, Some("aaaa")),
            child(5, Some("aaaa")),
            // (1, 0): its third turn is taken for another conversation,
            // (3, x)'s: neither recognised nor right.
            turn(1, 0, 1, Some("bbbb")),
            turn(1, 0, 4, Some("bbbb")),
            turn(1, 0, 7, Some("eeee")),
            // A failed attempt between turns changes nothing.
            Record {
                slot: 1,
                generation: 0,
                start: s(6),
                ..Record::default()
            },
            // (2, 0): not recognised at all.
            turn(2, 0, 0, None),
            turn(2, 0, 3, None),
            // (3, 0) and the slot's next session (3, 1) taken for one:
            // recognised each, and wrong each.
            turn(3, 0, 0, Some("eeee")),
            turn(3, 0, 2, Some("eeee")),
            turn(3, 1, 4, Some("eeee")),
            turn(3, 1, 6, Some("eeee")),
            // (4, 0) sent its id in the header.
            Record {
                id_via: IdVia::Header,
                routed_source: Some("header:x-session-id".into()),
                ..turn(4, 0, 0, Some("ffff"))
            },
            Record {
                id_via: IdVia::Header,
                routed_source: Some("header:x-session-id".into()),
                ..turn(4, 0, 2, Some("ffff"))
            },
        ];
        let g = recognition(&records, |_| true);
        // Later turns: 2 + 1 + 2 + 1 + 1 + 1 + 1.
        assert_eq!(g.turns, 9);
        // (0,0) x2, (8,0), (1,0) once, (3,0), (3,1), (4,0).
        assert_eq!(g.recognised, 7);
        // (1,0)'s third turn, (3,0)'s and (3,1)'s later turns.
        assert_eq!(g.wrong, 3);
        assert_eq!((g.anonymous_turns, g.anonymous_recognised), (8, 6));
        assert_eq!(g.recognised_share(), Some(7.0 / 9.0));
        assert_eq!(g.wrong_share(), Some(3.0 / 9.0));
        assert_eq!(g.sources.get("content"), Some(&12));
        assert_eq!(g.sources.get("none"), Some(&2));
        assert_eq!(g.sources.get("header:x-session-id"), Some(&2));
        // Counting from 4 s on: earlier turns are still each session's
        // history and still say who got which hash.
        let late = recognition(&records, |r| r.start >= s(4));
        assert_eq!((late.turns, late.recognised, late.wrong), (5, 4, 2));
        assert_eq!(recognition(&[], |_| true), Recognition::default());
        assert_eq!(Recognition::default().recognised_share(), None);
    }

    #[test]
    fn a_sub_agent_inherits_its_parents_history_and_ends_with_its_last_turn() {
        let records = vec![
            rec(0, 0, 0, 0, (1000, 0, 100)),
            // The sub-agent starts from the parent's 1100 tokens.
            Record {
                parent: Some((0, 0)),
                inherited_tokens: Some(1100),
                ..rec(8, 0, 2, 1, (1300, 0, 50))
            },
            Record {
                parent: Some((0, 0)),
                inherited_tokens: Some(1100),
                ends_session: true,
                ..rec(8, 0, 4, 1, (1550, 1300, 50))
            },
        ];
        let b = prefill_bound(&records, 500, |_| true);
        // bound: 1000 + (1300 - 1100) + (1550 - 1350).
        assert_eq!((b.prefilled, b.bound), (1000 + 1300 + 250, 1400));
        // Bound to e1 while it runs; gone once its last turn has ended (5 s).
        let at = bindings(&records, 2, &[s(3), s(6)]);
        assert_eq!(at[0][1].sessions, 1);
        assert_eq!(at[1][1].sessions, 0);
        assert_eq!(at[1][0].sessions, 1);
    }

    #[test]
    fn spread_is_min_and_max_over_engines_then_over_time() {
        let samples = vec![vec![1.0, 3.0, 2.0], vec![2.0, 2.0, 2.0], vec![]];
        let sp = spread(&samples).unwrap();
        assert_eq!((sp.min_mean, sp.max_mean), (1.5, 2.5));
        assert_eq!((sp.min, sp.max), (1.0, 3.0));
        assert_eq!(spread(&[]), None);
    }

    #[test]
    fn peer_names_map_to_engine_indices() {
        assert_eq!(engine_index("e0"), Some(0));
        assert_eq!(engine_index("e12"), Some(12));
        assert_eq!(engine_index("x1"), None);
        assert_eq!(engine_index("e"), None);
    }
}
