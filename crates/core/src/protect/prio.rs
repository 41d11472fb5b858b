//! Session turn priority (the OpenResty gateway's "Session turn priority"): a client
//! gateway marks each request with `x-phanrouter-session: {"session_id",
//! "turn"}`; under load, early turns (whose loss costs little cache) are
//! refused before warm ones. Pure: header parsing, the bucket table, and
//! each bucket's concurrency ceiling.

use serde::Deserialize;

/// The header a client gateway sets.
pub const HEADER: &str = "x-phanrouter-session";
/// Turns accepted in the header: 1 to 10^9.
pub const MAX_TURN: u64 = 1_000_000_000;
pub const MAX_SESSION_ID_CHARS: usize = 256;

/// One bucket of the table: turns from `min_turn` up to the next bucket's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bucket {
    pub min_turn: u64,
    /// Share of the concurrency limit this bucket may fill.
    pub share: f64,
    /// Soft TTFT zone: this bucket is refused once the EWMA passes
    /// `threshold × tol` (the hard trip is `threshold × severe`).
    pub tol: f64,
}

/// What the header said, or why it could not be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Turn {
    Known(u64),
    /// Missing, malformed, turn out of range, blank or over-long id: treated
    /// as fully warm (top bucket) but counted apart (`bnohdr`).
    Unusable,
}

#[derive(Deserialize)]
struct HeaderValue<'a> {
    #[serde(borrow)]
    session_id: std::borrow::Cow<'a, str>,
    turn: serde_json::Number,
}

/// Reads the header's value; never fails, an unusable value is `Unusable`.
pub fn parse_header(value: Option<&[u8]>) -> Turn {
    let Some(value) = value else {
        return Turn::Unusable;
    };
    // serde reads a struct from a JSON array as well (`["s", 3]`); the
    // header is an object, anything else is a client that does not speak it.
    let first = value
        .iter()
        .find(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r'));
    if first != Some(&b'{') {
        return Turn::Unusable;
    }
    let Ok(parsed) = serde_json::from_slice::<HeaderValue>(value) else {
        return Turn::Unusable;
    };
    let id = parsed.session_id.trim();
    if id.is_empty() || parsed.session_id.chars().count() > MAX_SESSION_ID_CHARS {
        return Turn::Unusable;
    }
    match parsed.turn.as_u64() {
        Some(turn) if (1..=MAX_TURN).contains(&turn) => Turn::Known(turn),
        _ => Turn::Unusable,
    }
}

/// The default table: buckets 1 / 2–3 / 4–7 / … doubling up to `full_turn`,
/// shares rising evenly from `r_new` to 1.0, tolerances from 1.0 (the
/// first turn is refused at the threshold) to `severe` (the warmest only
/// at the hard trip).
pub fn default_table(r_new: f64, full_turn: u64, severe: f64) -> Vec<Bucket> {
    let mut starts = vec![1u64];
    while let Some(&last) = starts.last() {
        let next = last * 2;
        if next > full_turn.max(2) {
            break;
        }
        starts.push(next);
    }
    let n = starts.len();
    starts
        .into_iter()
        .enumerate()
        .map(|(i, min_turn)| {
            let f = if n > 1 {
                i as f64 / (n - 1) as f64
            } else {
                1.0
            };
            Bucket {
                min_turn,
                share: r_new + (1.0 - r_new) * f,
                tol: 1.0 + (severe - 1.0) * f,
            }
        })
        .collect()
}

/// A table written in a route file must start at turn 1 and ascend.
pub fn validate_table(table: &[Bucket]) -> Result<(), String> {
    match table.first() {
        None => return Err("session_prio_table is empty".into()),
        Some(b) if b.min_turn != 1 => return Err("the first min_turn must be 1".into()),
        _ => {}
    }
    if table.windows(2).any(|w| w[1].min_turn <= w[0].min_turn) {
        return Err("min_turn must be strictly ascending".into());
    }
    if table
        .iter()
        .any(|b| !(b.share > 0.0 && b.share <= 1.0) || b.tol < 1.0)
    {
        return Err("each share must be in (0, 1] and each tol at least 1".into());
    }
    Ok(())
}

/// Index of the bucket for `turn`; an unusable header gets the top bucket.
pub fn bucket_of(table: &[Bucket], turn: Turn) -> usize {
    match turn {
        Turn::Unusable => table.len().saturating_sub(1),
        Turn::Known(t) => table.partition_point(|b| b.min_turn <= t).saturating_sub(1),
    }
}

/// The bucket's concurrency ceiling: `ceil(limit × factor × share)`.
pub fn ceiling(limit: f64, factor: f64, share: f64) -> u64 {
    // Shares built by arithmetic (0.85 + 0.15 × 1.0) land a hair off; a
    // ceiling must not tip over to the next integer for it.
    (limit * factor * share - 1e-9).ceil().max(0.0) as u64
}

/// Per-route counters and the turn-1 hold, for `/_session_status`.
#[derive(Debug, Default)]
pub struct PrioState {
    /// Admitted and refused requests per bucket (index), and those of
    /// requests whose header was unusable (`bnohdr`).
    admits: parking_lot::Mutex<Vec<u64>>,
    rejections: parking_lot::Mutex<Vec<u64>>,
    pub bnohdr_admits: std::sync::atomic::AtomicU64,
    pub bnohdr_rejections: std::sync::atomic::AtomicU64,
    /// Turn 1 is held out until the TTFT EWMA falls below the release line.
    pub hold_turn1: std::sync::atomic::AtomicBool,
    /// Turn 1's own probe budget.
    pub t1_probes: super::gate::ProbeBudget,
    /// This minute's share of requests without a usable header.
    pub no_header: parking_lot::Mutex<NoHeaderShare>,
}

/// Requests in the current minute, and how many had no usable header: a
/// client gateway that stopped sending the header silently turns the
/// feature off, so its share is worth a warning, but at most one a minute.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct NoHeaderShare {
    minute_start_ms: u64,
    total: u64,
    unusable: u64,
    warned: bool,
}

/// Below this many requests in a minute a share says too little to warn.
const WARN_MIN_REQUESTS: u64 = 10;

impl NoHeaderShare {
    /// Counts one request; `Some((unusable, total))` when this minute's
    /// share has just passed `warn_frac` (once per minute).
    pub fn note(&mut self, turn: Turn, now_ms: u64, warn_frac: f64) -> Option<(u64, u64)> {
        if now_ms.saturating_sub(self.minute_start_ms) >= 60_000 {
            *self = NoHeaderShare {
                minute_start_ms: now_ms,
                ..Default::default()
            };
        }
        self.total += 1;
        self.unusable += u64::from(turn == Turn::Unusable);
        let over =
            self.total >= WARN_MIN_REQUESTS && self.unusable as f64 > warn_frac * self.total as f64;
        if over && !self.warned {
            self.warned = true;
            return Some((self.unusable, self.total));
        }
        None
    }
}

impl PrioState {
    pub fn count(&self, bucket: usize, turn: Turn, admitted: bool) {
        use std::sync::atomic::Ordering::Relaxed;
        let (per_bucket, nohdr) = if admitted {
            (&self.admits, &self.bnohdr_admits)
        } else {
            (&self.rejections, &self.bnohdr_rejections)
        };
        if turn == Turn::Unusable {
            nohdr.fetch_add(1, Relaxed);
        }
        let mut v = per_bucket.lock();
        if v.len() <= bucket {
            v.resize(bucket + 1, 0);
        }
        v[bucket] += 1;
    }

    /// (admits, rejections) of `bucket`.
    pub fn counts(&self, bucket: usize) -> (u64, u64) {
        let get = |m: &parking_lot::Mutex<Vec<u64>>| m.lock().get(bucket).copied().unwrap_or(0);
        (get(&self.admits), get(&self.rejections))
    }
}

/// How hard the TTFT gate bites for one bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grade {
    /// Under the bucket's soft line: admitted.
    Open,
    /// Between `threshold × tol(bucket)` and the hard trip: refused unless
    /// it gets a probe slot.
    Soft,
    /// At or over `threshold × severe`: every bucket is refused but probes.
    Hard,
}

/// The grade of `bucket` (its index in `table`) at `pressure`, the EWMA
/// as a multiple of its limit (TTFT: ewma / threshold; decode rate, graded
/// inverted: floor / ewma). Turn 1 (`bucket == 0`) also stays out while
/// `hold_turn1` is set, even under its soft line: the hysteresis that keeps
/// new sessions away until the TTFT has fallen well below the threshold.
pub fn grade(
    pressure: Option<f64>,
    table: &[Bucket],
    bucket: usize,
    severe: f64,
    hold_turn1: bool,
) -> Grade {
    let Some(v) = pressure else {
        return Grade::Open;
    };
    if v >= severe {
        return Grade::Hard;
    }
    let tol = table.get(bucket).map_or(1.0, |b| b.tol);
    if v >= tol || (bucket == 0 && hold_turn1) {
        return Grade::Soft;
    }
    Grade::Open
}

/// The turn-1 hold is released once the EWMA falls below
/// `threshold × release` or expires.
pub fn releases_turn1_hold(ewma_ms: Option<f64>, threshold_ms: f64, release: f64) -> bool {
    ewma_ms.is_none_or(|v| v < threshold_ms * release)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_seeds_ceiling_table() {
        let table = default_table(0.85, 32, 1.5);
        assert_eq!(
            table.iter().map(|b| b.min_turn).collect::<Vec<_>>(),
            vec![1, 2, 4, 8, 16, 32]
        );
        let ceilings = |limit: f64| -> Vec<u64> {
            table.iter().map(|b| ceiling(limit, 1.0, b.share)).collect()
        };
        assert_eq!(ceilings(6.0), vec![6, 6, 6, 6, 6, 6]);
        assert_eq!(ceilings(7.0), vec![6, 7, 7, 7, 7, 7]);
        assert_eq!(ceilings(10.0), vec![9, 9, 10, 10, 10, 10]);
        assert_eq!(ceilings(20.0), vec![17, 18, 19, 19, 20, 20]);
    }

    #[test]
    fn turns_map_to_buckets_and_bad_headers_to_the_top_one() {
        let table = default_table(0.85, 32, 1.5);
        let b = |turn| bucket_of(&table, turn);
        assert_eq!(b(Turn::Known(1)), 0);
        assert_eq!((b(Turn::Known(2)), b(Turn::Known(3))), (1, 1));
        assert_eq!((b(Turn::Known(4)), b(Turn::Known(7))), (2, 2));
        assert_eq!(b(Turn::Known(31)), 4);
        assert_eq!(b(Turn::Known(32)), 5);
        assert_eq!(b(Turn::Known(MAX_TURN)), 5);
        assert_eq!(b(Turn::Unusable), 5);
    }

    #[test]
    fn the_header_is_validated() {
        let p = |s: &str| parse_header(Some(s.as_bytes()));
        assert_eq!(p(r#"{"session_id":"s","turn":3}"#), Turn::Known(3));
        assert_eq!(parse_header(None), Turn::Unusable);
        for bad in [
            "not json",
            r#"{"session_id":"s"}"#,
            r#"{"session_id":"s","turn":0}"#,
            r#"{"session_id":"s","turn":1000000001}"#,
            r#"{"session_id":"s","turn":2.5}"#,
            r#"{"session_id":"s","turn":"3"}"#,
            r#"{"session_id":"  ","turn":3}"#,
        ] {
            assert_eq!(p(bad), Turn::Unusable, "{bad}");
        }
        let long = format!(r#"{{"session_id":"{}","turn":3}}"#, "x".repeat(257));
        assert_eq!(p(&long), Turn::Unusable);
        let ok = format!(r#"{{"session_id":"{}","turn":3}}"#, "x".repeat(256));
        assert_eq!(p(&ok), Turn::Known(3));
    }

    /// Found by the `prio_header` fuzz target: serde reads a struct from a
    /// JSON array too, so `["s", 3]` counted as a usable header (turn 3)
    /// rather than as one without the documented object.
    #[test]
    fn only_an_object_is_a_header() {
        let p = |s: &str| parse_header(Some(s.as_bytes()));
        for bad in [r#"["s",3]"#, "[\n\"da\",1\n]", r#" ["s", 3] "#] {
            assert_eq!(p(bad), Turn::Unusable, "{bad}");
        }
        assert_eq!(p(r#" {"turn":3,"session_id":"s"} "#), Turn::Known(3));
    }

    #[test]
    fn a_written_table_starts_at_one_and_ascends() {
        let b = |min_turn| Bucket {
            min_turn,
            share: 0.9,
            tol: 1.1,
        };
        assert!(validate_table(&[b(1), b(4)]).is_ok());
        assert!(validate_table(&[b(2), b(4)]).is_err());
        assert!(validate_table(&[b(1), b(1)]).is_err());
        assert!(validate_table(&[]).is_err());
    }

    #[test]
    fn the_ttft_gate_grades_by_bucket_and_holds_turn_one() {
        let table = default_table(0.85, 32, 1.5);
        let g = |ewma: f64, bucket: usize, hold: bool| {
            grade(Some(ewma / 1_000.0), &table, bucket, 1.5, hold)
        };
        // At the threshold only turn 1 is in its soft zone.
        assert_eq!(g(1_000.0, 0, false), Grade::Soft);
        assert_eq!(g(1_000.0, 1, false), Grade::Open);
        // Higher, warmer buckets follow; the warmest only at the hard trip.
        assert_eq!(g(1_300.0, 2, false), Grade::Soft);
        assert_eq!(g(1_499.0, 5, false), Grade::Open);
        assert_eq!(g(1_500.0, 5, false), Grade::Hard);
        // The hold keeps turn 1 out below its line, and only turn 1.
        assert_eq!(g(500.0, 0, true), Grade::Soft);
        assert_eq!(g(500.0, 1, true), Grade::Open);
        assert_eq!(grade(None, &table, 0, 1.5, true), Grade::Open);
        assert!(!releases_turn1_hold(Some(950.0), 1_000.0, 0.9));
        assert!(releases_turn1_hold(Some(899.0), 1_000.0, 0.9));
        assert!(releases_turn1_hold(None, 1_000.0, 0.9));
    }

    #[test]
    fn a_minute_with_too_many_unusable_headers_warns_once() {
        let mut share = NoHeaderShare::default();
        let good = Turn::Known(2);
        // 2 of 10 is not over 0.2; the third unusable one is.
        let mut warned = Vec::new();
        for (i, turn) in [good; 8]
            .into_iter()
            .chain([Turn::Unusable; 2])
            .chain([Turn::Unusable; 3])
            .enumerate()
        {
            if let Some(w) = share.note(turn, 1_000 + i as u64, 0.2) {
                warned.push(w);
            }
        }
        assert_eq!(warned, vec![(3, 11)], "once, when the share passed 0.2");
        // A new minute starts over and may warn again.
        for i in 0..10 {
            share.note(Turn::Unusable, 61_000 + i, 0.2);
        }
        let mut fresh = NoHeaderShare::default();
        assert_eq!(
            (0..9)
                .filter_map(|i| fresh.note(Turn::Unusable, i, 0.2))
                .count(),
            0,
            "too few requests to tell"
        );
        assert!(fresh.note(Turn::Unusable, 9, 0.2).is_some());
    }

    #[test]
    fn the_decode_rate_gate_grades_inverted() {
        let table = default_table(0.85, 32, 1.5);
        // A floor of 30 tok/s: pressure is floor / ewma.
        let g = |tps: f64, bucket: usize| grade(Some(30.0 / tps), &table, bucket, 1.5, false);
        assert_eq!(g(31.0, 0), Grade::Open);
        assert_eq!(g(30.0, 0), Grade::Soft, "at the floor turn 1 is refused");
        assert_eq!(g(30.0, 5), Grade::Open, "the warmest bucket is not");
        assert_eq!(g(20.0, 5), Grade::Hard, "floor / severe is the hard trip");
        assert_eq!(g(21.0, 5), Grade::Open);
    }
}
