//! `--plot FILE.svg`: the results as pictures, so a reader looks rather
//! than reads. One SVG file, one row per scenario: on the left the TTFT
//! distribution (a CDF, one line per cell, the reference cell dashed), on
//! the right one panel per cell with the requests in each engine over the
//! measured window (the 100 ms load samples; failover's outage shaded).

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;

use super::options::REFERENCE;
use super::result::{ModeResult, ScenarioResult};
use super::scenario::Failover;

const WIDTH: u32 = 1400;
const TITLE_H: u32 = 40;
const CDF_W: u32 = 560;
const LOAD_COLS: usize = 2;
const PANEL_H: u32 = 250;
const MIN_BODY_H: u32 = 420;
/// A CDF line needs no more points than the panel has pixels.
const MAX_CDF_POINTS: usize = 600;
const FONT: &str = "sans-serif";

/// Cells, in the order they ran (Tableau 10); the reference cell is black.
const CELL_COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];
const ENGINE_COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];
const OUTAGE_FILL: RGBColor = RGBColor(255, 215, 215);

fn body_height(cells: usize) -> u32 {
    let rows = cells.div_ceil(LOAD_COLS).max(1) as u32;
    (rows * PANEL_H).max(MIN_BODY_H)
}

pub fn draw(path: &Path, scenarios: &[ScenarioResult]) -> Result<(), String> {
    let heights: Vec<u32> = scenarios
        .iter()
        .map(|s| TITLE_H + body_height(s.cells.len()))
        .collect();
    let total = heights.iter().sum::<u32>().max(TITLE_H);
    let root = SVGBackend::new(path, (WIDTH, total)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let mut rest = root.clone();
    for (s, h) in scenarios.iter().zip(heights) {
        let (block, below) = rest.split_vertically(h);
        draw_scenario(&block, s).map_err(|e| format!("scenario {}: {e}", s.plan.scenario))?;
        rest = below;
    }
    root.present().map_err(|e| e.to_string())
}

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;
type DrawResult = Result<(), Box<dyn std::error::Error>>;

fn draw_scenario(block: &Area, s: &ScenarioResult) -> DrawResult {
    let p = &s.plan;
    let title = format!(
        "Scenario {}: {} engines x {} sessions, {} per cell ({} warm-up not shown)",
        p.scenario,
        p.opts.engines,
        p.sessions_per_engine,
        crate::plan::fmt_secs(p.opts.duration),
        crate::plan::fmt_secs(p.warmup),
    );
    let body = block.titled(&title, (FONT, 22))?;
    let (left, right) = body.split_horizontally(CDF_W);
    draw_cdf(&left, &s.cells)?;
    let rows = s.cells.len().div_ceil(LOAD_COLS).max(1);
    let panels = right.split_evenly((rows, LOAD_COLS));
    // One scale for every cell of the scenario, with headroom above the
    // highest line for the legend.
    let peak = s
        .cells
        .iter()
        .flat_map(|c| c.load_series.iter().flat_map(|(_, v)| v.iter().copied()))
        .max()
        .unwrap_or(0)
        .max(1);
    let ymax = (f64::from(peak) * 1.4).ceil();
    let x = (p.warmup.as_secs_f64(), p.opts.duration.as_secs_f64());
    for (panel, cell) in panels.iter().zip(&s.cells) {
        draw_load(panel, cell, x, ymax, p.opts.engines, p.failover)?;
    }
    Ok(())
}

fn cell_color(i: usize, cell: &ModeResult) -> RGBColor {
    if cell.mode == REFERENCE {
        BLACK
    } else {
        CELL_COLORS[i % CELL_COLORS.len()]
    }
}

/// The empirical CDF of `values` (sorted here), thinned to about
/// `MAX_CDF_POINTS` points; positive values only (the axis is logarithmic).
pub fn cdf_points(values: &[f64]) -> Vec<(f64, f64)> {
    let mut v: Vec<f64> = values
        .iter()
        .copied()
        .filter(|x| x.is_finite() && *x > 0.0)
        .collect();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let step = n.div_ceil(MAX_CDF_POINTS).max(1);
    let mut out: Vec<(f64, f64)> = (0..n)
        .step_by(step)
        .map(|k| (v[k], (k + 1) as f64 / n as f64))
        .collect();
    if n > 0 && out.last().is_some_and(|&(_, y)| y < 1.0) {
        out.push((v[n - 1], 1.0));
    }
    out
}

fn draw_cdf(area: &Area, cells: &[ModeResult]) -> DrawResult {
    let all: Vec<f64> = cells
        .iter()
        .flat_map(|c| c.ttft_samples.iter().copied())
        .filter(|v| v.is_finite() && *v > 0.0)
        .collect();
    let (Some(min), Some(max)) = (
        all.iter().copied().reduce(f64::min),
        all.iter().copied().reduce(f64::max),
    ) else {
        area.draw(&Text::new(
            "TTFT: no successful measured requests",
            (20, 20),
            (FONT, 16),
        ))?;
        return Ok(());
    };
    // Whole decades, so the log axis has labelled ends.
    let lo = 10f64.powf(min.log10().floor());
    let hi = 10f64.powf(max.log10().ceil()).max(lo * 10.0);
    let mut chart = ChartBuilder::on(area)
        .caption("TTFT distribution (CDF)", (FONT, 18))
        .margin(14)
        .x_label_area_size(45)
        .y_label_area_size(55)
        .build_cartesian_2d((lo..hi).log_scale(), 0f64..1f64)?;
    chart
        .configure_mesh()
        .x_desc("TTFT, seconds (log scale)")
        .y_desc("share of requests at most x")
        .x_label_formatter(&|v| format_seconds(*v))
        .y_label_formatter(&|v| format!("{:.0}%", v * 100.0))
        .label_style((FONT, 13))
        .draw()?;
    for (i, c) in cells.iter().enumerate() {
        let points = cdf_points(&c.ttft_samples);
        if points.is_empty() {
            continue;
        }
        let color = cell_color(i, c);
        let label = format!(
            "{} (p50 {}, p95 {})",
            c.mode,
            c.ttft_p50.map_or("-".into(), format_seconds),
            c.ttft_p95.map_or("-".into(), format_seconds)
        );
        let style = color.stroke_width(2);
        let drawn = if c.mode == REFERENCE {
            chart.draw_series(DashedLineSeries::new(points, 8, 5, style))?
        } else {
            chart.draw_series(LineSeries::new(points, style))?
        };
        drawn
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], style));
    }
    chart
        .configure_series_labels()
        // CDFs rise from the lower left to the upper right: the upper left
        // corner is where no line goes.
        .position(SeriesLabelPosition::UpperLeft)
        .label_font((FONT, 14))
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}

fn draw_load(
    area: &Area,
    cell: &ModeResult,
    x: (f64, f64),
    ymax: f64,
    engines: usize,
    failover: Option<Failover>,
) -> DrawResult {
    let mut chart = ChartBuilder::on(area)
        .caption(
            format!("{}: requests in each engine", cell.mode),
            (FONT, 15),
        )
        .margin(8)
        .x_label_area_size(32)
        .y_label_area_size(36)
        .build_cartesian_2d(x.0..x.1, 0f64..ymax)?;
    chart
        .configure_mesh()
        .x_desc("seconds since the cell started")
        .y_desc("requests")
        .y_label_formatter(&|v| format!("{v:.0}"))
        .x_label_formatter(&|v| format!("{v:.0}"))
        .light_line_style(WHITE.mix(0.0))
        .label_style((FONT, 11))
        .draw()?;
    if let Some(f) = failover {
        let (a, b) = (f.at.as_secs_f64(), f.back().as_secs_f64());
        chart
            .draw_series(std::iter::once(Rectangle::new(
                [(a, 0.0), (b, ymax)],
                OUTAGE_FILL.filled(),
            )))?
            .label(format!("e{} down", f.engine))
            .legend(|(x, y)| Rectangle::new([(x, y - 5), (x + 18, y + 5)], OUTAGE_FILL.filled()));
    }
    for e in 0..engines {
        let color = ENGINE_COLORS[e % ENGINE_COLORS.len()];
        let points = cell
            .load_series
            .iter()
            .map(|(t, v)| (*t, f64::from(v.get(e).copied().unwrap_or(0))));
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(1)))?
            .label(format!("e{e}"))
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .label_font((FONT, 11))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}

fn format_seconds(v: f64) -> String {
    if v >= 1.0 {
        format!("{v:.1} s")
    } else if v >= 0.01 {
        format!("{:.0} ms", v * 1e3)
    } else {
        format!("{:.1} ms", v * 1e3)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::Options;
    use crate::plan::Plan;

    #[test]
    fn cdf_is_sorted_thinned_and_ends_at_one() {
        let pts = cdf_points(&[0.3, 0.1, 0.2, 0.0, f64::NAN]);
        assert_eq!(pts, vec![(0.1, 1.0 / 3.0), (0.2, 2.0 / 3.0), (0.3, 1.0)]);
        let many: Vec<f64> = (1..=10_000).map(|i| i as f64 / 1000.0).collect();
        let pts = cdf_points(&many);
        assert!(pts.len() <= MAX_CDF_POINTS + 1, "{}", pts.len());
        assert_eq!(pts.last(), Some(&(10.0, 1.0)));
        assert!(pts.windows(2).all(|w| w[0].0 <= w[1].0 && w[0].1 < w[1].1));
        assert!(cdf_points(&[]).is_empty());
    }

    #[test]
    fn draws_an_svg_with_a_row_per_scenario() {
        let cell = |mode: &str, ttft: Vec<f64>| ModeResult {
            mode: mode.to_string(),
            ttft_p50: Some(0.2),
            ttft_p95: Some(0.9),
            ttft_samples: ttft,
            load_series: (0..50)
                .map(|i| (2.0 + i as f64 * 0.1, vec![i % 5, 3, 2, 1]))
                .collect(),
            ..ModeResult::default()
        };
        let opts = Options {
            duration: std::time::Duration::from_secs(10),
            warmup: Some(std::time::Duration::from_secs(2)),
            ..Options::default()
        };
        let results = vec![
            ScenarioResult {
                plan: Plan::new(opts.clone()),
                cells: vec![
                    cell("load_aware", vec![0.1, 0.2, 1.5]),
                    cell(REFERENCE, vec![0.05]),
                ],
                peers: Vec::new(),
                skipped_peers: Vec::new(),
            },
            ScenarioResult {
                plan: Plan::for_scenario(opts, crate::scenario::Scenario::Failover).unwrap(),
                // A cell without successful requests still gets its panels.
                cells: vec![cell("hash", vec![])],
                peers: Vec::new(),
                skipped_peers: Vec::new(),
            },
        ];
        let dir = std::env::temp_dir().join(format!("bench-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("p.svg");
        draw(&path, &results).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(svg.starts_with("<svg"), "{}", &svg[..100.min(svg.len())]);
        for text in [
            "Scenario uniform",
            "Scenario failover",
            "TTFT distribution (CDF)",
            "load_aware: requests in each engine",
            "e0 down",
            "reference (p50",
        ] {
            assert!(svg.contains(text), "no {text:?} in the SVG");
        }
    }
}
