//! `--family`: engine configurations drawn from a seed, so a placement
//! policy is judged over engines it was not tuned on rather than on one
//! calibrated profile. Each draw is printed as the flags that rerun it on
//! its own (`Draw::flags`).
//!
//! The ranges: KV from half to four times an engine's share of the
//! sessions' working set (log-uniform), 32-256 sequences a batch
//! (log-uniform), prefill 5k-40k tokens a second (log-uniform), a decode
//! step of 5-15 ms plus 90-900 us per sequence (log-uniform: the
//! calibrated small model's 90 us to the 600 us of a large one) plus the
//! calibrated context term times 0.5-1.5, the KV capacity published or
//! not, and engine e0 slowed to 0.4x or not. Drawn as a Latin hypercube,
//! so a family of a few draws still spans every range.

use crate::text::Rng;
use llm_gateway_sim::StepCost;

/// One engine configuration of the family.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Draw {
    /// 1-based, as `--family-only` names it.
    pub index: usize,
    pub kv_factor: f64,
    pub max_num_seqs: usize,
    pub prefill_us: u64,
    pub decode_ms: u64,
    pub per_seq_us: f64,
    pub per_context_us: f64,
    pub publish_kv: bool,
    pub slow_first: bool,
}

/// A uniform draw in `lo..hi`.
fn uniform(rng: &mut Rng, lo: f64, hi: f64) -> f64 {
    let unit = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
    lo + (hi - lo) * unit
}

/// A seeded shuffle of `0..n`.
fn permutation(rng: &mut Rng, n: usize) -> Vec<usize> {
    let mut p: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        let j = rng.range(0, i as u64) as usize;
        p.swap(i, j);
    }
    p
}

impl Draw {
    /// The `n` draws of `seed` as a Latin hypercube: each range cut into
    /// `n` strata and every stratum drawn once, in a shuffled order per
    /// range (so a family of four already covers small and large KV, slow
    /// and fast prefill); each switch on in half the draws.
    fn family(seed: u64, n: usize) -> Vec<Draw> {
        let mut rng = Rng::derive(seed, &[0x4641_4d49, n as u64]);
        let strata: Vec<Vec<usize>> = (0..7).map(|_| permutation(&mut rng, n)).collect();
        let at = |range: usize, k: usize, rng: &mut Rng| {
            (strata[range][k] as f64 + uniform(rng, 0.0, 1.0)) / n as f64
        };
        let log_between = |lo: f64, hi: f64, u: f64| (lo.ln() + (hi.ln() - lo.ln()) * u).exp();
        let mut draws = Vec::with_capacity(n);
        // The two switches in all four combinations, in turn.
        for (k, &switch) in strata[6].iter().enumerate() {
            let decode_ms = (5.0 + 10.0 * at(0, k, &mut rng)).round() as u64;
            let context_scale = 0.5 + at(1, k, &mut rng);
            draws.push(Draw {
                index: k + 1,
                kv_factor: round2(log_between(0.5, 4.0, at(2, k, &mut rng))),
                max_num_seqs: log_between(32.0, 256.0, at(3, k, &mut rng)).round() as usize,
                prefill_us: (1e6 / log_between(5_000.0, 40_000.0, at(4, k, &mut rng))).round()
                    as u64,
                decode_ms,
                per_seq_us: log_between(90.0, 900.0, at(5, k, &mut rng)).round(),
                // The calibrated preset's context term, scaled to the
                // decode time as `StepCost::scaled_to` scales it.
                per_context_us: round4(
                    StepCost::L4_QWEN_0_5B.per_context_token_us * decode_ms as f64 / 5.0
                        * context_scale,
                ),
                publish_kv: switch.is_multiple_of(2),
                slow_first: (switch / 2).is_multiple_of(2),
            });
        }
        draws
    }

    /// `f3`, in labels and the report.
    pub fn label(&self) -> String {
        format!("f{}", self.index)
    }

    /// The flags that run this configuration without `--family`.
    pub fn flags(&self) -> String {
        let mut out = format!(
            "--kv-factor {} --max-running {} --prefill-us {} --decode-ms {} --per-seq-us {} \
             --per-context-us {}",
            self.kv_factor,
            self.max_num_seqs,
            self.prefill_us,
            self.decode_ms,
            self.per_seq_us,
            self.per_context_us
        );
        if !self.publish_kv {
            out.push_str(" --hide-kv-capacity");
        }
        if self.slow_first {
            out.push_str(" --slow-first");
        }
        out
    }
}

fn round2(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}

fn round4(v: f64) -> f64 {
    (v * 10_000.0).round() / 10_000.0
}

/// The `n` draws of `seed`, or of them only those `only` names.
pub fn draws(n: usize, seed: u64, only: &[usize]) -> Result<Vec<Draw>, String> {
    if let Some(bad) = only.iter().find(|&&k| k == 0 || k > n) {
        return Err(format!("--family-only {bad}: the draws are 1-{n}"));
    }
    Ok(Draw::family(seed, n)
        .into_iter()
        .filter(|d| only.is_empty() || only.contains(&d.index))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_cover_their_ranges_and_repeat_for_a_seed() {
        let all = draws(64, 1, &[]).expect("draws");
        assert_eq!(all, draws(64, 1, &[]).expect("draws"));
        assert_ne!(all, draws(64, 2, &[]).expect("draws"));
        for d in &all {
            assert!((0.5..=4.0).contains(&d.kv_factor), "{d:?}");
            assert!((32..=256).contains(&d.max_num_seqs), "{d:?}");
            assert!((25..=200).contains(&d.prefill_us), "{d:?}");
            assert!((5..=15).contains(&d.decode_ms), "{d:?}");
            assert!((90.0..=900.0).contains(&d.per_seq_us), "{d:?}");
        }
        // Both halves of each range, and both of each switch, come up.
        assert!(all.iter().any(|d| d.kv_factor < 1.0) && all.iter().any(|d| d.kv_factor > 2.0));
        assert!(all.iter().any(|d| d.prefill_us < 50) && all.iter().any(|d| d.prefill_us > 100));
        assert!(all.iter().any(|d| d.publish_kv) && all.iter().any(|d| !d.publish_kv));
        assert!(all.iter().any(|d| d.slow_first) && all.iter().any(|d| !d.slow_first));
    }

    #[test]
    fn four_draws_already_span_each_range() {
        for seed in 1..=5 {
            let d = draws(4, seed, &[]).expect("draws");
            let kv: Vec<f64> = d.iter().map(|d| d.kv_factor).collect();
            // One in each quarter of the log range: below 0.84, above 2.38.
            assert!(
                kv.iter().any(|&f| f < 0.85) && kv.iter().any(|&f| f > 2.35),
                "{kv:?}"
            );
            let prefill: Vec<u64> = d.iter().map(|d| d.prefill_us).collect();
            assert!(
                prefill.iter().any(|&p| p < 42) && prefill.iter().any(|&p| p > 118),
                "{prefill:?}"
            );
            assert_eq!(d.iter().filter(|d| d.publish_kv).count(), 2);
            assert_eq!(d.iter().filter(|d| d.slow_first).count(), 2);
        }
    }

    #[test]
    fn only_picks_draws_by_number_and_flags_rerun_one() {
        let picked = draws(8, 3, &[2, 5]).expect("draws");
        let all = draws(8, 3, &[]).expect("draws");
        assert_eq!(picked, vec![all[1], all[4]]);
        assert!(draws(8, 3, &[9]).is_err());
        assert!(draws(8, 3, &[0]).is_err());
        let d = Draw {
            publish_kv: false,
            slow_first: true,
            ..all[0]
        };
        let flags = d.flags();
        assert!(flags.contains("--hide-kv-capacity") && flags.contains("--slow-first"));
        assert!(flags.starts_with(&format!("--kv-factor {} ", d.kv_factor)));
    }
}
