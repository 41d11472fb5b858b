//! The live dashboard on the admin listener: `GET /dashboard` (one HTML
//! page, its CSS and JS inline, embedded in the binary) and the JSON it
//! polls, `GET /dashboard.json`.
//!
//! The live values are the per-route endpoints' own (`route_endpoints::respond`),
//! picked and joined per peer, so the page can never disagree with
//! `/_route_state` or `/_ttft_status`. The time series come from
//! `History` (pure, `history.rs`), one per route, filled every
//! `SAMPLE_MS` by `Sampler` from counters the gateway keeps anyway.
//! Nothing here carries a session id or a key: peers, pools and counts only.

use super::history::History;
use crate::clock::now_ms;
use crate::metrics::metrics;
use crate::protect::gate::Gate;
use crate::protect::meter::ScopeRef;
use crate::registry::{Registry, Route};
use async_trait::async_trait;
use parking_lot::Mutex;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use prometheus::core::Collector;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

/// The page, inline CSS and JS, no external asset (its CSP says so too).
pub const HTML: &str = include_str!("dashboard.html");

/// One point every 5 s, 10 minutes of them.
pub const SAMPLE_MS: u64 = 5_000;
pub const SAMPLES: usize = 120;

/// The routes' histories, by route name: a reload keeps a route's history,
/// a removed route's goes at the next sample.
#[derive(Default)]
pub struct Dashboard {
    histories: Mutex<HashMap<String, History>>,
}

impl Dashboard {
    /// Takes a point for every route that is due one.
    pub fn sample(&self, registry: &Registry, now: u64) {
        let snapshot = registry.snapshot();
        let mut counters = metric_counters();
        let mut histories = self.histories.lock();
        histories.retain(|name, _| snapshot.contains_key(name));
        for (name, route) in snapshot.iter() {
            let history = histories
                .entry(name.clone())
                .or_insert_with(|| History::new(SAMPLE_MS, SAMPLES));
            if !history.due(now) {
                continue;
            }
            let mut c = counters.remove(name).unwrap_or_default();
            runtime_counters(route, &mut c);
            history.record(now, c, gauges(route, now));
        }
    }

    /// `/dashboard.json`: every route, sorted by name.
    pub fn json(&self, registry: &Registry) -> Value {
        let now = now_ms();
        let snapshot = registry.snapshot();
        let mut names: Vec<&String> = snapshot.keys().collect();
        names.sort();
        let histories = self.histories.lock();
        let routes: Vec<Value> = names
            .into_iter()
            .filter_map(|name| snapshot.get(name))
            .map(|route| route_json(route, registry, histories.get(route.name()), now))
            .collect();
        json!({
            "now_ms": now,
            "draining": crate::lifecycle::is_draining(),
            "sample_ms": SAMPLE_MS,
            "window_s": SAMPLE_MS * SAMPLES as u64 / 1000,
            "routes": routes,
        })
    }
}

/// Samples every route's history in the background, so the page has the
/// last minutes as soon as it is opened, not only since; on the same tick,
/// the `/metrics` series of peers gone from their routes for the gateway's
/// `peer_metrics_grace` are removed ([`forget_gone_peers`]).
pub struct Sampler {
    dashboard: Arc<Dashboard>,
    registry: Arc<Registry>,
}

impl Sampler {
    pub fn new(dashboard: Arc<Dashboard>, registry: Arc<Registry>) -> Self {
        Sampler {
            dashboard,
            registry,
        }
    }
}

#[async_trait]
impl BackgroundService for Sampler {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut tick = tokio::time::interval(Duration::from_millis(SAMPLE_MS));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut sweeps = GoneSweeps::default();
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    let now = now_ms();
                    self.dashboard.sample(&self.registry, now);
                    if sweeps.due(&self.registry) {
                        forget_gone_peers(&self.registry, now);
                    }
                }
                _ = shutdown.changed() => {
                    if *shutdown.borrow() {
                        return;
                    }
                }
            }
        }
    }
}

/// When the sampler looks for gone peers' series: when the route table is
/// another than at the last look (a reload, a rediscovery: the only ways a
/// peer leaves), while a peer is in its grace, and once a minute besides
/// (a request of an older table may have written a series since).
#[derive(Default)]
struct GoneSweeps {
    table: std::sync::Weak<crate::registry::RouteTable>,
    ticks: u64,
}

impl GoneSweeps {
    fn due(&mut self, registry: &Registry) -> bool {
        let table = registry.snapshot();
        self.ticks += 1;
        let changed = !std::ptr::eq(self.table.as_ptr(), Arc::as_ptr(&table));
        self.table = Arc::downgrade(&table);
        changed || metrics().peers_in_grace() || self.ticks.is_multiple_of(60_000 / SAMPLE_MS)
    }
}

/// Removes the per-peer `/metrics` series of the peers no route has now,
/// once gone for `peer_metrics_grace` (a route's `-`, its requests that
/// reached no peer, stays with the route).
pub fn forget_gone_peers(registry: &Registry, now: u64) {
    let snapshot = registry.snapshot();
    let live: std::collections::HashSet<(&str, &str)> = snapshot
        .iter()
        .flat_map(|(name, route)| {
            route
                .peers
                .iter()
                .map(|p| p.config.name.as_str())
                .chain(["-"])
                .map(move |peer| (name.as_str(), peer))
        })
        .collect();
    let grace = registry.gateway().peer_metrics_grace.as_millis();
    let removed = metrics().forget_gone_peers(&live, now, u64::try_from(grace).unwrap_or(u64::MAX));
    if removed > 0 {
        log::info!("metrics: removed {removed} series of peers gone from their routes");
    }
}

/// Placements by kind/reason and requests by status class, per route, from
/// the Prometheus counters (one walk over each family for all routes).
fn metric_counters() -> HashMap<String, BTreeMap<String, u64>> {
    let m = metrics();
    counters_by_route(
        m.placements
            .collect()
            .into_iter()
            .chain(m.requests.collect()),
    )
}

/// The history's counters of each route, each kept per peer
/// (`placements/<kind>/<reason>/<peer>`, `requests/<class>/<peer>`): a
/// peer whose series are removed (`forget_gone_peers`) then leaves its
/// keys, which the history reads as no new counts, where a sum over the
/// route's peers would go down and read as a counter reset, all it still
/// holds counted again as new.
fn counters_by_route(
    families: impl Iterator<Item = prometheus::proto::MetricFamily>,
) -> HashMap<String, BTreeMap<String, u64>> {
    let mut out: HashMap<String, BTreeMap<String, u64>> = HashMap::new();
    for family in families {
        for metric in family.get_metric() {
            let label = |name: &str| crate::metrics::label(metric, name);
            let (Some(route), Some(peer)) = (label("route"), label("peer")) else {
                continue;
            };
            let key = match (label("kind"), label("reason"), label("code")) {
                (Some(kind), Some(reason), _) => format!("placements/{kind}/{reason}/{peer}"),
                (_, _, Some(code)) => format!("requests/{}/{peer}", status_class(code)),
                _ => continue,
            };
            let n = metric.get_counter().get_value() as u64;
            *out.entry(route.to_string())
                .or_default()
                .entry(key)
                .or_default() += n;
        }
    }
    out
}

fn status_class(code: &str) -> &'static str {
    match code.as_bytes().first() {
        Some(b'2') => "2xx",
        Some(b'3') => "3xx",
        Some(b'4') if code == "429" => "429",
        Some(b'4') => "4xx",
        Some(b'5') => "5xx",
        _ => "other",
    }
}

/// 429s by gate and the tokens behind the hit rate, from `RouteRuntime`.
fn runtime_counters(route: &Route, out: &mut BTreeMap<String, u64>) {
    let r = &route.runtime;
    let refusals = r.protection.snapshot().refusals;
    for gate in Gate::ALL {
        out.insert(format!("refusals/{}", gate.as_str()), refusals.get(gate));
    }
    let (prompt, cached) = r.prompt_tokens();
    out.insert("tokens/prompt".into(), prompt);
    out.insert("tokens/cached".into(), cached);
}

/// What one pool is judged by: the EWMA each gate compares and its limit,
/// exactly as the gates (`judge_ttft` / `judge_tps`) see them.
struct PoolLimits {
    ttft_ewma_ms: Option<f64>,
    ttft_limit_ms: f64,
    ttft_source: &'static str,
    tps_ewma: Option<f64>,
    tps_floor: Option<f64>,
    tps_source: Option<&'static str>,
}

fn pool_limits(route: &Route, label: &str, now: u64) -> PoolLimits {
    let p = &route.config.protection;
    let protection = route.runtime.protection.snapshot();
    let reading = protection
        .meter
        .reading(ScopeRef::Pool(label), p.meter.ttl_ms, now);
    let o = protection.overrides;
    let model = (label != "_").then_some(label);
    let ttft = p.judge_ttft(&reading, model, o.ttft_ms.get(now));
    let tps = p.judge_tps(&reading, o.tps.get(now));
    PoolLimits {
        ttft_ewma_ms: ttft.ewma,
        ttft_limit_ms: ttft.limit,
        ttft_source: ttft.source.as_str(),
        tps_ewma: tps.as_ref().map_or(reading.tps, |j| j.ewma),
        tps_floor: tps.as_ref().map(|j| j.limit),
        tps_source: tps.as_ref().map(|j| j.source.as_str()),
    }
}

fn gauges(route: &Route, now: u64) -> BTreeMap<String, f64> {
    let mut g = BTreeMap::new();
    let mut limit = 0.0;
    for (label, pool) in route.pools() {
        let (max, _) = route.pool_load(&pool);
        limit += route.adaptive_limit(label, &pool).unwrap_or(max);
        let l = pool_limits(route, label, now);
        let mut put = |group: &str, v: Option<f64>| {
            if let Some(v) = v {
                g.insert(format!("{group}/{label}"), v);
            }
        };
        put("ttft_ewma_ms", l.ttft_ewma_ms);
        put("ttft_limit_ms", Some(l.ttft_limit_ms));
        put("tps_ewma", l.tps_ewma);
        put("tps_floor", l.tps_floor);
    }
    let in_flight: u32 = route.peers.iter().map(|p| p.state.in_flight()).sum();
    let ready = route.peers.iter().filter(|p| p.is_usable(now)).count();
    let (warm, new) = route.runtime.queue.waiting();
    g.insert("in_flight".into(), f64::from(in_flight));
    g.insert("limit".into(), limit);
    g.insert("queue".into(), (warm + new) as f64);
    g.insert("ready".into(), ready as f64);
    g
}

/// The first part of a key's rest: a placement's kind, a request's class.
fn kind_of(rest: &str) -> String {
    rest.split('/').next().unwrap_or(rest).to_string()
}

fn history_json(h: &History) -> Value {
    let whole = |rest: &str| rest.to_string();
    json!({
        "every_ms": h.every_ms(),
        "t_ms": h.t_ms(),
        "in_flight": h.gauge("in_flight"),
        "limit": h.gauge("limit"),
        "queue": h.gauge("queue"),
        "ready": h.gauge("ready"),
        "placements_per_s": h.rates("placements", kind_of),
        "refusals_per_s": h.rates("refusals", whole)
            .into_iter()
            .filter(|(_, v)| v.iter().any(|x| x.is_some_and(|x| x > 0.0)))
            .collect::<BTreeMap<_, _>>(),
        "requests_per_s": h.rates("requests", kind_of),
        "hit_rate": h.ratio("tokens/cached", "tokens/prompt"),
        "ttft_ewma_ms": h.gauges("ttft_ewma_ms"),
        "ttft_limit_ms": h.gauges("ttft_limit_ms"),
        "tps_ewma": h.gauges("tps_ewma"),
        "tps_floor": h.gauges("tps_floor"),
    })
}

/// Placements over the history's window by kind and reason, most first.
fn placements_window(h: &History) -> Value {
    let mut by_reason: BTreeMap<(String, String), u64> = BTreeMap::new();
    for (rest, n) in h.totals("placements") {
        // kind/reason/peer: the peer, last, may hold a '/' of its own.
        let mut parts = rest.splitn(3, '/');
        let kind = parts.next().unwrap_or_default().to_string();
        let reason = parts.next().unwrap_or("none").to_string();
        *by_reason.entry((kind, reason)).or_default() += n;
    }
    let mut rows: Vec<(String, String, u64)> = by_reason
        .into_iter()
        .map(|((kind, reason), n)| (kind, reason, n))
        .collect();
    rows.sort_by(|a, b| b.2.cmp(&a.2).then_with(|| a.0.cmp(&b.0)));
    json!(rows
        .into_iter()
        .map(|(kind, reason, count)| json!({"kind": kind, "reason": reason, "count": count}))
        .collect::<Vec<_>>())
}

/// `name` → the entry of `list` (an endpoint's `peers` or `series`) with it.
fn by_name(list: &Value, filter: impl Fn(&Value) -> bool) -> HashMap<&str, &Value> {
    list.as_array()
        .into_iter()
        .flatten()
        .filter(|v| filter(v))
        .filter_map(|v| Some((v["name"].as_str()?, v)))
        .collect()
}

fn route_json(route: &Route, registry: &Registry, history: Option<&History>, now: u64) -> Value {
    let get =
        |path: &str| crate::route_endpoints::respond(route, registry, path).unwrap_or(Value::Null);
    let state = get("/_route_state");
    let health = get("/_health_status");
    let measured = get("/_ttft_status");
    let refusals = get("/_429_status");
    let session = get("/_session_status");
    let cluster = get("/_cluster_avg");

    let health_by = by_name(&health["peers"], |_| true);
    let series_by = by_name(&measured["series"], |s| s["scope"] == "peer");
    let pool_series = by_name(&measured["series"], |s| s["scope"] == "pool");
    let peers: Vec<Value> = state["peers"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            let name = p["name"].as_str().unwrap_or("");
            let h = health_by.get(name).copied().unwrap_or(&Value::Null);
            let s = series_by.get(name).copied().unwrap_or(&Value::Null);
            json!({
                "name": p["name"], "address": p["address"], "priority": p["priority"],
                "ready": p["ready"], "failing": h["failing"], "banned_for_ms": h["banned_for_ms"],
                "in_flight": p["in_flight"], "max_concurrency": p["max_concurrency"],
                "load": p["load"], "kv_full": p["kv_full"], "engine": p["engine"],
                "sessions": p["sessions"], "live_sessions": p["live_sessions"],
                "live_tokens": p["live_tokens"], "kv_capacity_tokens": p["kv_capacity_tokens"],
                "ttft_ewma_ms": s["ttft_ewma_ms"], "tps_ewma": s["tps_ewma"],
            })
        })
        .collect();
    let adaptive_pool = |label: &str| {
        measured["adaptive_cc"]["pools"]
            .as_array()
            .and_then(|a| a.iter().find(|p| p["pool"] == label))
            .cloned()
    };
    let pools: Vec<Value> = cluster["pools"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            let label = c["pool"].as_str().unwrap_or("_");
            let l = pool_limits(route, label, now);
            let s = pool_series.get(label).copied().unwrap_or(&Value::Null);
            json!({
                "pool": label,
                "in_flight": c["in_flight"],
                "limit": c["limit"],
                "avg_in_flight_5m": c["avg_in_flight_5m"],
                "adaptive": adaptive_pool(label),
                "ttft": {"ewma_ms": l.ttft_ewma_ms, "limit_ms": l.ttft_limit_ms, "source": l.ttft_source,
                         "window_samples": s["ttft_window_samples"]},
                "tps": {"ewma": l.tps_ewma, "floor": l.tps_floor, "source": l.tps_source,
                        "window_samples": s["tps_window_samples"]},
            })
        })
        .collect();
    let ready = peers.iter().filter(|p| p["ready"] == true).count();
    json!({
        "name": route.name(),
        "mode": state["mode"],
        "peers_ready": ready,
        "peers_total": peers.len(),
        "queue": state["queue"],
        "sessions": route.runtime.sessions.len(),
        "rate_limit": {
            "on": refusals["rate_limit"]["on"],
            "source": refusals["rate_limit"]["source"],
            "trips_while_off": refusals["rate_limit"]["trips_while_off"],
        },
        "refusals": {"total": refusals["total"], "by_gate": refusals["by_reason"]},
        "cache_hit_rate": session["cache_hit_rate"],
        "switches": {
            "ttft": measured["switches"]["ttft"]["on"],
            "tps": measured["switches"]["tps"]["on"],
            "session_prio": session["enabled"]["on"],
        },
        "pools": pools,
        "peers": peers,
        "placements_window": history.map_or(json!([]), placements_window),
        "history": history.map_or(Value::Null, history_json),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_codes_fold_into_classes_with_429_apart() {
        let classes: Vec<_> = ["200", "302", "404", "429", "503", "0", ""]
            .iter()
            .map(|c| status_class(c))
            .collect();
        assert_eq!(
            classes,
            ["2xx", "3xx", "4xx", "429", "5xx", "other", "other"]
        );
    }

    #[test]
    fn a_peer_whose_series_are_removed_reads_as_no_requests_not_as_a_reset() {
        use prometheus::{IntCounterVec, Opts};
        let requests =
            IntCounterVec::new(Opts::new("r", "r"), &["route", "peer", "code"]).expect("vec");
        requests
            .with_label_values(&["chat", "e0", "200"])
            .inc_by(100);
        requests
            .with_label_values(&["chat", "e1", "200"])
            .inc_by(50);
        let counters = || {
            counters_by_route(requests.collect().into_iter())
                .remove("chat")
                .unwrap_or_default()
        };
        let mut h = History::new(1_000, 10);
        h.record(0, counters(), BTreeMap::new());
        requests.with_label_values(&["chat", "e0", "200"]).inc_by(2);
        h.record(1_000, counters(), BTreeMap::new());
        let before: u64 = counters().values().sum();
        requests
            .remove_label_values(&["chat", "e1", "200"])
            .expect("e1's series");
        h.record(2_000, counters(), BTreeMap::new());
        assert_eq!(
            h.rates("requests", kind_of)["2xx"],
            vec![None, Some(2.0), Some(0.0)]
        );
        // Control: summed over the route's peers, the same removal would
        // have read as a reset, e0's whole count new again.
        let after: u64 = counters().values().sum();
        assert_eq!(
            (
                before,
                after,
                super::super::history::counter_delta(before, after)
            ),
            (152, 102, 102)
        );
    }

    #[test]
    fn the_page_is_self_contained() {
        // No asset from anywhere: no src/href to a URL, no CDN, no import.
        for needle in ["http://", "https://", "src=\"", "@import", "<link"] {
            assert!(!HTML.contains(needle), "the page names {needle}");
        }
        // Control: the page does poll its JSON and draw SVG charts.
        assert!(HTML.contains("dashboard.json") && HTML.contains("<svg"));
    }
}
