//! The `protection:` section: the load gates' settings, validated.

use super::locator::Locator;
use crate::config::file::{AdaptiveFile, ProtectionFile, SessionPrioFile};
use crate::config::units::flag;
use crate::config::ConfigError;
use crate::protect::aimd::Coefficients;
use crate::protect::config::{AdaptiveConfig, Protection, SessionPrio, DEFAULT_ADAPTIVE_TTL_MS};
use crate::protect::limits::{metric_limit, MetricLimit};
use crate::protect::meter::MeterConfig;
use crate::protect::window::{Folds, MAX_FOLDS};
use std::time::Duration;

/// A `ttft_metrics` / `tps_metrics` table, or `None` (with a warning) when
/// any entry is bad: the route then falls back to its static limit.
pub(super) fn metric_table(
    key: String,
    raw: Option<&serde_yaml::Value>,
    warnings: &mut Vec<String>,
) -> Option<Vec<MetricLimit>> {
    let raw = raw?;
    let entry = |v: &serde_yaml::Value| -> Result<MetricLimit, String> {
        let map = v.as_mapping().ok_or("an entry must be a mapping")?;
        for k in map.keys() {
            if !matches!(k.as_str(), Some("metric" | "q" | "threshold")) {
                return Err(format!("unknown key {k:?}"));
            }
        }
        let metric = v
            .get("metric")
            .and_then(serde_yaml::Value::as_str)
            .ok_or("metric must be pNN or avg")?;
        let number = |name: &str| -> Result<Option<f64>, String> {
            match v.get(name) {
                None => Ok(None),
                Some(x) => x
                    .as_f64()
                    .map(Some)
                    .ok_or(format!("{name} must be a number")),
            }
        };
        metric_limit(metric, number("q")?, number("threshold")?)
    };
    let parsed: Result<Vec<MetricLimit>, String> = match raw.as_sequence() {
        Some(rows) if rows.is_empty() => Err("the table is empty".into()),
        Some(rows) if rows.len() > MAX_FOLDS => Err(format!(
            "at most {MAX_FOLDS} entries ({} given)",
            rows.len()
        )),
        Some(rows) => rows
            .iter()
            .enumerate()
            .map(|(i, row)| entry(row).map_err(|e| format!("entry {}: {e}", i + 1)))
            .collect(),
        None => Err("must be a list of {metric, q, threshold}".into()),
    };
    match parsed {
        Ok(table) => Some(table),
        Err(e) => {
            warnings.push(format!(
                "{key} dropped ({e}); the route's static limit applies"
            ));
            None
        }
    }
}

pub(super) fn parse_protection(
    at: &Locator,
    file: &ProtectionFile,
    warnings: &mut Vec<String>,
) -> Result<Protection, ConfigError> {
    let d = MeterConfig::default();
    let ms = |v: Option<crate::config::units::Dur>, default: u64| {
        v.map_or(default, |d| d.0.as_millis() as u64)
    };
    let positive = |path: &str, v: Option<f64>| -> Result<Option<f64>, ConfigError> {
        match v {
            Some(x) if !(x.is_finite() && x > 0.0) => Err(at.at_key(
                path,
                format!("{} must be a positive number", at.written(path)),
            )),
            other => Ok(other),
        }
    };
    let (ttft, tps) = (&file.ttft, &file.tps);
    let alpha = file.ewma.alpha.unwrap_or(d.alpha);
    if !alpha.is_finite() {
        let path = "protection.ewma.alpha";
        return Err(at.at_key(path, format!("{} must be a number", at.written(path))));
    }
    let ttft_metrics = metric_table(
        at.written("protection.ttft.metrics"),
        ttft.metrics.as_ref(),
        warnings,
    );
    let tps_metrics = metric_table(
        at.written("protection.tps.metrics"),
        tps.metrics.as_ref(),
        warnings,
    );
    let folds = |table: &Option<Vec<MetricLimit>>, default: Folds| {
        table
            .as_deref()
            .and_then(|t| Folds::of(&t.iter().map(|m| m.fold).collect::<Vec<_>>()))
            .unwrap_or(default)
    };
    let meter = MeterConfig {
        ttft_folds: folds(&ttft_metrics, d.ttft_folds),
        tps_folds: folds(&tps_metrics, d.tps_folds),
        ttft_window_ms: ms(ttft.window, d.ttft_window_ms).max(1),
        tps_window_ms: ms(tps.window, d.tps_window_ms).max(1),
        // Clamped as the OpenResty gateway does rather than refused: 1.5
        // means "all in".
        alpha: alpha.clamp(0.0, 1.0),
        ttl_ms: ms(file.ewma.ttl, d.ttl_ms).max(1),
        tps_min_tokens: tps.min_tokens.unwrap_or(d.tps_min_tokens),
        tps_min_decode_ms: positive("protection.tps.min_decode_s", tps.min_decode_s)?
            .map_or(d.tps_min_decode_ms, |s| (s * 1000.0) as u64),
    };
    let mut by_model = Vec::new();
    for (model, limit) in ttft.limit_by_model.clone().unwrap_or_default() {
        let limit = positive("protection.ttft.limit_by_model", Some(limit))?.unwrap_or(limit);
        by_model.push((model, limit));
    }
    let adaptive = adaptive_config(at, &file.adaptive, meter.tps_window_ms)?;
    Ok(Protection {
        meter,
        ttft_limit_ms: positive("protection.ttft.limit_ms", ttft.limit_ms)?.unwrap_or(30_000.0),
        ttft_limit_by_model: by_model,
        tps_limit_tps: positive("protection.tps.limit_tps", tps.limit_tps)?,
        ttft_metrics,
        tps_metrics,
        load_rate_limit: file.rate_limit.map(|f| f.0),
        adaptive,
        session_prio: session_prio(at, &file.session_prio)?,
        probes: file.probes.unwrap_or(5),
        probe_window: file.probe_window.map_or(Duration::from_secs(10), |d| d.0),
    })
}

pub(super) fn session_prio(
    at: &Locator,
    file: &SessionPrioFile,
) -> Result<SessionPrio, ConfigError> {
    use crate::protect::prio::{default_table, validate_table, Bucket};
    let refuse =
        |path: &str, what: &str| at.at_key(path, format!("{} must be {what}", at.written(path)));
    let severe = file.severe.unwrap_or(1.5);
    if severe.is_nan() || severe < 1.0 {
        return Err(refuse("protection.session_prio.severe", "at least 1"));
    }
    let r_new = file.r_new.unwrap_or(0.85);
    if r_new.is_nan() || r_new <= 0.0 || r_new > 1.0 {
        return Err(refuse("protection.session_prio.r_new", "in (0, 1]"));
    }
    let table = match &file.table {
        None => default_table(r_new, file.full_turn.unwrap_or(32), severe),
        Some(rows) => {
            let n = rows.len();
            let table: Vec<Bucket> = rows
                .iter()
                .enumerate()
                .map(|(i, r)| Bucket {
                    min_turn: r.min_turn,
                    share: r.share,
                    tol: r.tol.unwrap_or(if n > 1 {
                        1.0 + (severe - 1.0) * i as f64 / (n - 1) as f64
                    } else {
                        severe
                    }),
                })
                .collect();
            let path = "protection.session_prio.table";
            validate_table(&table)
                .map_err(|e| at.at_key(path, format!("{}: {e}", at.written(path))))?;
            table
        }
    };
    let in_range = |path: &str, v: Option<f64>, default: f64, ok: fn(f64) -> bool, what: &str| {
        bounded(at, path, v, default, ok, what)
    };
    if file.full_turn == Some(0) {
        return Err(refuse("protection.session_prio.full_turn", "at least 1"));
    }
    Ok(SessionPrio {
        enabled: flag(file.enabled, false),
        table,
        rt_limit_factor: in_range(
            "protection.session_prio.rt_limit_factor",
            file.rt_limit_factor,
            1.0,
            |v| v.is_finite() && v > 0.0,
            "a positive number",
        )?,
        severe,
        release: in_range(
            "protection.session_prio.release",
            file.release,
            0.9,
            |v| v > 0.0 && v <= 1.0,
            "in (0, 1]",
        )?,
        t1_probes: file.t1_probes.unwrap_or(1),
        warn_frac: in_range(
            "protection.session_prio.warn_frac",
            file.warn_frac,
            0.2,
            |v| (0.0..=1.0).contains(&v),
            "in [0, 1]",
        )?,
    })
}

/// Adaptive concurrency is opt-in, as the OpenResty gateway's README has it:
/// a decode-rate floor alone sheds on decode rate, and only
/// `enabled: true` turns that floor into the AIMD limit's signal instead.
/// Its settings are validated whether it is on or not, so a bad value is
/// found before it is used; each is refused with its line, in the bounds
/// the OpenResty gateway checks (it fell back to the default instead).
pub(super) fn adaptive_config(
    at: &Locator,
    file: &AdaptiveFile,
    tps_window_ms: u64,
) -> Result<AdaptiveConfig, ConfigError> {
    let refuse = |key: &str, what: String| {
        let path = format!("protection.adaptive.{key}");
        at.at_key(&path, format!("{} must be {what}", at.written(&path)))
    };
    let d = Coefficients::default();
    let number = |key: &str, v: Option<f64>, default: f64, ok: &dyn Fn(f64) -> bool, what: &str| {
        bounded(
            at,
            &format!("protection.adaptive.{key}"),
            v,
            default,
            ok,
            what,
        )
    };
    if file.min.is_some_and(|m| m.is_nan() || m < 1.0) {
        return Err(refuse("min", "at least 1".into()));
    }
    let pressure_frac = number(
        "pressure_frac",
        file.pressure_frac,
        d.pressure_frac,
        &|v| v > 0.0 && v <= 1.0,
        "in (0, 1]",
    )?;
    let coefficients = Coefficients {
        inc: number("inc", file.inc, d.inc, &|v| v > 1.0, "over 1")?,
        dec: number("dec", file.dec, d.dec, &|v| v > 0.0 && v < 1.0, "in (0, 1)")?,
        pressure_frac,
        slack_frac: number(
            "slack_frac",
            file.slack_frac,
            d.slack_frac,
            &|v| v > 0.0 && v < pressure_frac,
            &format!("in (0, pressure_frac {pressure_frac})"),
        )?,
        abs: number("abs", file.abs, d.abs, &|v| v >= 0.0, "at least 0")?,
        min_frac: number(
            "min_frac",
            file.min_frac,
            d.min_frac,
            &|v| v > 0.0 && v <= 1.0,
            "in (0, 1]",
        )?,
    };
    let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    let ttl_ms = file.ttl.map_or(DEFAULT_ADAPTIVE_TTL_MS, |t| ms(t.0));
    if ttl_ms == 0 {
        return Err(refuse("ttl", "longer than 0s".into()));
    }
    // Unset, the decode-rate window (whose EWMA a step reads), which the
    // tick keeps to 50 ms at least; set, it must be that already.
    let interval_ms = match file.interval.map(|t| ms(t.0)) {
        Some(set) if set < 50 => return Err(refuse("interval", "at least 50ms".into())),
        Some(set) => set,
        None => tps_window_ms,
    };
    Ok(AdaptiveConfig {
        enabled: flag(file.enabled, false),
        min: file.min,
        init: file.init,
        init_frac: file.init_frac,
        hold_when_idle: flag(file.hold_when_idle, true),
        use_ttft: flag(file.use_ttft, true),
        coefficients,
        ttl_ms,
        interval_ms,
    })
}

/// A number option: `default` when unset, the value when finite and `ok`,
/// else refused with its line and what it must be.
fn bounded(
    at: &Locator,
    path: &str,
    v: Option<f64>,
    default: f64,
    ok: impl Fn(f64) -> bool,
    what: &str,
) -> Result<f64, ConfigError> {
    match v {
        None => Ok(default),
        Some(x) if x.is_finite() && ok(x) => Ok(x),
        Some(x) => Err(at.at_key(
            path,
            format!("{} must be {what} (got {x})", at.written(path)),
        )),
    }
}
