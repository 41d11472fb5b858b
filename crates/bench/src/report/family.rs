//! A scenario run over several engine configurations or seeds (`--family`,
//! `--seeds`): each gateway cell against the best peer of every run, as
//! the median and the worst ratio over the runs, and the run that made
//! the worst, so that a gain on one engine cannot hide a loss on another.

use serde_json::{json, Value};

use crate::options::REFERENCE;
use crate::result::ScenarioResult;
use crate::versus::{best_peer, vs_best, VsBest};

/// One gateway cell over one scenario's runs.
#[derive(Debug, Clone, PartialEq)]
pub struct Spread {
    pub scenario: String,
    pub cell: String,
    /// Each run's label (`uniform f3 s2`), its best peer, and the ratios.
    pub runs: Vec<(String, String, VsBest)>,
}

/// The median of some values and the worst of them by `worse` (the
/// larger for a time, the smaller for a hit or a throughput), with the
/// index of the worst; None without values.
fn median_and_worst(
    values: &[(usize, f64)],
    worse: impl Fn(f64, f64) -> bool,
) -> Option<(f64, f64, usize)> {
    if values.is_empty() {
        return None;
    }
    let mut sorted: Vec<f64> = values.iter().map(|(_, v)| *v).collect();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    let median = if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
    };
    let (at, worst) = values
        .iter()
        .copied()
        .reduce(|a, b| if worse(b.1, a.1) { b } else { a })?;
    Some((median, worst, at))
}

impl Spread {
    fn series(&self, pick: impl Fn(&VsBest) -> Option<f64>) -> Vec<(usize, f64)> {
        self.runs
            .iter()
            .enumerate()
            .filter_map(|(i, (_, _, v))| pick(v).map(|x| (i, x)))
            .collect()
    }

    /// (median, worst, the worst run's label) of TTFT p95 over the best peer's.
    pub fn p95(&self) -> Option<(f64, f64, &str)> {
        self.stat(|v| v.p95, |a, b| a > b)
    }

    pub fn p99(&self) -> Option<(f64, f64, &str)> {
        self.stat(|v| v.p99, |a, b| a > b)
    }

    pub fn hit_points(&self) -> Option<(f64, f64, &str)> {
        self.stat(|v| v.hit_points, |a, b| a < b)
    }

    pub fn tok_s(&self) -> Option<(f64, f64, &str)> {
        self.stat(|v| v.tok_s, |a, b| a < b)
    }

    fn stat(
        &self,
        pick: impl Fn(&VsBest) -> Option<f64>,
        worse: impl Fn(f64, f64) -> bool,
    ) -> Option<(f64, f64, &str)> {
        let (median, worst, at) = median_and_worst(&self.series(pick), worse)?;
        Some((median, worst, self.runs[at].0.as_str()))
    }
}

/// Per scenario with more than one run, each gateway cell's spread.
pub fn spreads(results: &[ScenarioResult]) -> Vec<Spread> {
    let mut out: Vec<Spread> = Vec::new();
    for s in results {
        let name = s.plan.scenario.name();
        let runs = results
            .iter()
            .filter(|r| r.plan.scenario.name() == name)
            .count();
        if runs < 2 {
            continue;
        }
        let Some(best) = best_peer(&s.cells, s.plan.scenario.errors_expected()) else {
            continue;
        };
        let best = &s.cells[best];
        for c in s
            .cells
            .iter()
            .filter(|c| !c.peer && !c.router && c.mode != REFERENCE)
        {
            let run = (s.plan.label(), best.mode.clone(), vs_best(c, best));
            match out
                .iter_mut()
                .find(|sp| sp.scenario == name && sp.cell == c.mode)
            {
                Some(sp) => sp.runs.push(run),
                None => out.push(Spread {
                    scenario: name.to_string(),
                    cell: c.mode.clone(),
                    runs: vec![run],
                }),
            }
        }
    }
    out
}

pub fn markdown(results: &[ScenarioResult]) -> String {
    let spreads = spreads(results);
    if spreads.is_empty() {
        return String::new();
    }
    let mut out = String::from(
        "\n### Over the runs: each gateway cell against each run's best peer\n\n\
         Median and worst over the runs (engine draws x seeds) of TTFT p95 and p99 over the \
         best peer's (below 1 is better), cache hit in points and output tok/s as a ratio; the \
         run that made the worst p95 is named (rerun it with the flags in its header).\n\n\
         | scenario | cell | runs | p95 median | p95 worst | p99 median | p99 worst | hit median \
         | hit worst | tok/s median | tok/s worst | worst p95 in |\n\
         |---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|\n",
    );
    let x = |v: Option<(f64, f64, &str)>, i: usize| {
        v.map_or("-".to_string(), |(m, w, _)| {
            format!("{:.2}x", if i == 0 { m } else { w })
        })
    };
    let pts = |v: Option<(f64, f64, &str)>, i: usize| {
        v.map_or("-".to_string(), |(m, w, _)| {
            format!("{:+.1}", if i == 0 { m } else { w })
        })
    };
    for sp in &spreads {
        let worst_run = sp.p95().map_or("-", |(_, _, run)| run).to_string();
        let worst_best = sp
            .runs
            .iter()
            .find(|(label, _, _)| *label == worst_run)
            .map_or(String::new(), |(_, best, _)| format!(" (vs {best})"));
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {worst_run}{worst_best} |\n",
            sp.scenario,
            sp.cell,
            sp.runs.len(),
            x(sp.p95(), 0),
            x(sp.p95(), 1),
            x(sp.p99(), 0),
            x(sp.p99(), 1),
            pts(sp.hit_points(), 0),
            pts(sp.hit_points(), 1),
            x(sp.tok_s(), 0),
            x(sp.tok_s(), 1),
        ));
    }
    out
}

pub fn json(results: &[ScenarioResult]) -> Value {
    let stat = |v: Option<(f64, f64, &str)>| {
        v.map_or(
            Value::Null,
            |(median, worst, run)| json!({"median": median, "worst": worst, "worst_run": run}),
        )
    };
    Value::Array(
        spreads(results)
            .iter()
            .map(|sp| {
                json!({
                    "scenario": sp.scenario,
                    "cell": sp.cell,
                    "runs": sp.runs.iter().map(|(label, best, v)| json!({
                        "run": label,
                        "best_peer": best,
                        "p95": v.p95,
                        "p99": v.p99,
                        "hit_points": v.hit_points,
                        "tok_s": v.tok_s,
                    })).collect::<Vec<_>>(),
                    "p95": stat(sp.p95()),
                    "p99": stat(sp.p99()),
                    "hit_points": stat(sp.hit_points()),
                    "tok_s": stat(sp.tok_s()),
                })
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_and_the_worst_by_direction() {
        let v = [(0, 1.2), (1, 0.8), (2, 0.9), (3, 1.5)];
        let (m, w, at) = median_and_worst(&v, |a, b| a > b).expect("values");
        assert!((m - 1.05).abs() < 1e-9);
        assert_eq!((w, at), (1.5, 3));
        let (_, w, at) = median_and_worst(&v, |a, b| a < b).expect("values");
        assert_eq!((w, at), (0.8, 1));
        assert_eq!(median_and_worst(&[], |a, b| a > b), None);
    }
}
