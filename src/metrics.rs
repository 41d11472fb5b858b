//! Prometheus metrics (prefix `llm_gateway_`).
//!
//! Counters are bumped on the request path. Gauges that mirror runtime state
//! (in-flight, readiness, session bindings) are filled from the registry at
//! scrape time instead, so the hot path pays nothing for them and a peer that
//! leaves the config leaves the output too.
//!
//! Labels carry route and peer *names* only, never a session id or a key.
//!
//! The counters and histograms labelled by peer outlive the peer while
//! the gateway runs, so a scrape sees their last values; with `peers_from`
//! every rollout brings new pod names, so [`Metrics::forget_gone_peers`]
//! removes a peer's series once it has been out of its route for
//! `peer_metrics_grace` (gateway.yaml). A peer that comes back starts its
//! series afresh, which Prometheus reads as a counter reset.

use parking_lot::{Mutex, RwLock};
use prometheus::core::{Collector, MetricVec, MetricVecBuilder};
use prometheus::proto::MetricFamily;
use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};
use std::borrow::Borrow;
use std::collections::{HashMap, HashSet};
use std::sync::{LazyLock, OnceLock};

pub struct Metrics {
    registry: Registry,
    pub requests: IntCounterVec,
    pub request_duration: HistogramVec,
    pub reloads: IntCounterVec,
    pub in_flight: IntGaugeVec,
    pub peer_ready: IntGaugeVec,
    pub session_bindings: IntGaugeVec,
    pub placements: IntCounterVec,
    pub prompt_tokens: IntCounterVec,
    pub cached_prompt_tokens: IntCounterVec,
    pub completion_tokens: IntCounterVec,
    pub ttft: HistogramVec,
    pub queue_wait: HistogramVec,
    pub ttft_by_pool: HistogramVec,
    pub load_rejections: IntCounterVec,
    pub decode_rate: HistogramVec,
    pub api_keys_configured: IntGauge,
    pub watching: IntGauge,
    pub auth: IntCounterVec,
    pub rejections: IntCounterVec,
    pub bodylog_frames: IntCounterVec,
    pub access_log_lines: IntCounterVec,
    pub trace_spans: IntCounterVec,
    pub prefix_rewrites: IntCounterVec,
    pub session_store_up: IntGauge,
    pub session_store_errors: IntCounterVec,
    pub session_store_wait: HistogramVec,
    pub session_store_ops: IntCounterVec,
    pub body_forwards: IntCounterVec,
    pub tenant_in_flight: IntGaugeVec,
    pub tenant_refusals: IntCounterVec,
    pub tenant_tokens: IntCounterVec,
    /// (route, peer) → when its series were first seen without the peer
    /// in its route (`forget_gone_peers`).
    gone_since: Mutex<HashMap<(String, String), u64>>,
}

/// A family of series labelled `route` and `peer`, whatever its type.
trait PeerSeries {
    fn families(&self) -> Vec<MetricFamily>;
    fn remove(&self, labels: &HashMap<&str, &str>);
}

impl<T: MetricVecBuilder> PeerSeries for MetricVec<T> {
    fn families(&self) -> Vec<MetricFamily> {
        self.collect()
    }

    fn remove(&self, labels: &HashMap<&str, &str>) {
        // The labels were read from this vector: it has them all.
        let _ = MetricVec::remove(self, labels);
    }
}

/// The value of a collected series' label `name`.
pub fn label<'a>(metric: &'a prometheus::proto::Metric, name: &str) -> Option<&'a str> {
    metric
        .get_label()
        .iter()
        .find(|l| l.name() == name)
        .map(|l| l.value())
}

/// A series' `route` and `peer` labels.
fn route_and_peer(metric: &prometheus::proto::Metric) -> Option<(&str, &str)> {
    Some((label(metric, "route")?, label(metric, "peer")?))
}

fn counter(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), labels).expect("static metric definition");
    registry
        .register(Box::new(c.clone()))
        .expect("metric registered once");
    c
}

fn gauge(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    let g = IntGaugeVec::new(Opts::new(name, help), labels).expect("static metric definition");
    registry
        .register(Box::new(g.clone()))
        .expect("metric registered once");
    g
}

fn histogram(
    registry: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
    buckets: Vec<f64>,
) -> HistogramVec {
    let h = HistogramVec::new(HistogramOpts::new(name, help).buckets(buckets), labels)
        .expect("static metric definition");
    registry
        .register(Box::new(h.clone()))
        .expect("metric registered once");
    h
}

/// The OpenResty gateway's buckets plus its overflow bucket (twice the last bound).
fn with_overflow(bounds: &[f64]) -> Vec<f64> {
    let mut out = bounds.to_vec();
    out.extend(bounds.last().map(|b| b * 2.0));
    out
}

impl Metrics {
    fn new() -> Self {
        let registry = Registry::new();
        let latency_buckets = vec![
            0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
        ];
        let api_keys_configured = IntGauge::new(
            "llm_gateway_api_keys_configured",
            "1 when a readable API key file with at least one key is loaded",
        )
        .expect("static metric definition");
        registry
            .register(Box::new(api_keys_configured.clone()))
            .expect("metric registered once");
        let watching = IntGauge::new(
            "llm_gateway_config_watch_active",
            "1 while routes_dir and the key files are watched for changes (watch: true and the watcher started)",
        )
        .expect("static metric definition");
        registry
            .register(Box::new(watching.clone()))
            .expect("metric registered once");
        Metrics {
            requests: counter(
                &registry,
                "llm_gateway_requests_total",
                "Requests answered, by route, peer (\"-\" when none was chosen) and status code",
                &["route", "peer", "code"],
            ),
            request_duration: histogram(
                &registry,
                "llm_gateway_request_duration_seconds",
                "Time from request start to the last response byte",
                &["route"],
                latency_buckets.clone(),
            ),
            reloads: counter(
                &registry,
                "llm_gateway_reloads_total",
                "Route and key reloads by trigger (start, signal, watch); result=error counts reloads in which at least one file was rejected",
                &["trigger", "result"],
            ),
            in_flight: gauge(
                &registry,
                "llm_gateway_in_flight",
                "Requests in flight through this gateway",
                &["route", "peer"],
            ),
            peer_ready: gauge(
                &registry,
                "llm_gateway_peer_ready",
                "1 when the peer is ready (not banned)",
                &["route", "peer"],
            ),
            session_bindings: gauge(
                &registry,
                "llm_gateway_session_bindings",
                "Sessions remembered on each peer (used within idle_timeout)",
                &["route", "peer"],
            ),
            placements: counter(
                &registry,
                "llm_gateway_placements_total",
                "Placement decisions by kind (new, sticky, spill, migrated, ...) and reason",
                &["route", "peer", "kind", "reason"],
            ),
            prompt_tokens: counter(
                &registry,
                "llm_gateway_prompt_tokens_total",
                "Prompt tokens reported by engines in usage",
                &["route", "peer"],
            ),
            cached_prompt_tokens: counter(
                &registry,
                "llm_gateway_cached_prompt_tokens_total",
                "Prompt tokens the engine served from its prefix cache",
                &["route", "peer"],
            ),
            completion_tokens: counter(
                &registry,
                "llm_gateway_completion_tokens_total",
                "Completion tokens reported by engines in usage",
                &["route", "peer"],
            ),
            ttft: histogram(
                &registry,
                "llm_gateway_time_to_first_token_seconds",
                "Time from request start to the first streamed content event",
                &["route"],
                latency_buckets,
            ),
            queue_wait: histogram(
                &registry,
                "llm_gateway_queue_wait_seconds",
                "Time a request waited in its route's admission queue (placed or refused after it)",
                &["route"],
                vec![0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0],
            ),
            ttft_by_pool: histogram(
                &registry,
                "llm_gateway_ttft_seconds",
                "Time from sending a request upstream to its first content frame (2xx streams)",
                &["route", "pool", "peer"],
                with_overflow(crate::protect::window::TTFT_MS_BUCKETS)
                    .into_iter()
                    .map(|ms| ms / 1000.0)
                    .collect(),
            ),
            decode_rate: histogram(
                &registry,
                "llm_gateway_decode_tokens_per_second",
                "Completion tokens per second from first to last content frame (2xx streams, 16+ tokens, 0.5 s+ of decode)",
                &["route", "pool", "peer"],
                with_overflow(crate::protect::window::TPS_BUCKETS),
            ),
            load_rejections: counter(
                &registry,
                "llm_gateway_load_rejections_total",
                "Requests refused by a load gate (concurrency, session_prio, ttft, tps)",
                &["route", "gate"],
            ),
            auth: counter(
                &registry,
                "llm_gateway_auth_total",
                "API key checks by result (ok, missing, invalid) and key owner (\"-\" unless ok)",
                &["route", "owner", "result"],
            ),
            rejections: counter(
                &registry,
                "llm_gateway_rejected_by_rule_total",
                "Requests refused by a content reject rule",
                &["route", "rule"],
            ),
            bodylog_frames: counter(
                &registry,
                "llm_gateway_bodylog_frames_total",
                "Body-log frames: sent to the listener, dropped (queue full), or error (write failed)",
                &["result"],
            ),
            access_log_lines: counter(
                &registry,
                "llm_gateway_access_log_lines_total",
                "Access-log lines: written, dropped (queue full) or error (write failed)",
                &["result"],
            ),
            trace_spans: counter(
                &registry,
                "llm_gateway_trace_spans_total",
                "OpenTelemetry spans: exported (the collector took them), dropped (queue full) or failed (export refused, unanswered or unreachable)",
                &["result"],
            ),
            prefix_rewrites: counter(
                &registry,
                "llm_gateway_prefix_rewrites_total",
                "Request bodies changed by a prefix-stability transform (cch_strip, kimi_normalize)",
                &["route", "transform"],
            ),
            session_store_up: {
                let g = IntGauge::new(
                    "llm_gateway_session_store_up",
                    "1 while the shared session store (Redis) answers; 0 while requests are placed from the local table",
                )
                .expect("static metric definition");
                registry
                    .register(Box::new(g.clone()))
                    .expect("metric registered once");
                g
            },
            session_store_errors: counter(
                &registry,
                "llm_gateway_session_store_errors_total",
                "Shared session store commands that failed or timed out, by operation",
                &["op"],
            ),
            session_store_wait: histogram(
                &registry,
                "llm_gateway_session_store_wait_seconds",
                "Time a request waited on the shared session store before placement (0 when its binding was agreed within the last second)",
                &["route"],
                vec![
                    0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5,
                    0.005, 0.01, 0.02, 0.05, 0.1,
                ],
            ),
            session_store_ops: counter(
                &registry,
                "llm_gateway_session_store_ops_total",
                "Commands (or pipelines) sent to the shared session store, by operation",
                &["op"],
            ),
            body_forwards: counter(
                &registry,
                "llm_gateway_request_body_forwards_total",
                "Request bodies read by the gateway and handed back to Pingora, by how: retry_buffer (up to 64 KiB) or replay",
                &["via"],
            ),
            tenant_in_flight: gauge(
                &registry,
                "llm_gateway_tenant_in_flight",
                "Requests in flight per tenant (tenants the tenants file names; the others summed as \"other\")",
                &["tenant"],
            ),
            tenant_refusals: counter(
                &registry,
                "llm_gateway_tenant_refusals_total",
                "Requests refused (429) for their tenant's budget or cap, by reason (input_tokens, output_tokens, cached_input_tokens, requests, in_flight); apart from the load gates' refusals",
                &["tenant", "reason"],
            ),
            tenant_tokens: counter(
                &registry,
                "llm_gateway_tenant_tokens_total",
                "Tokens served per tenant, by kind (input, output, cached_input), as reconciled when each request ends",
                &["tenant", "kind"],
            ),
            api_keys_configured,
            watching,
            registry,
            gone_since: Mutex::default(),
        }
    }

    /// The counters and histograms written per peer on the request path.
    /// (The in-flight, readiness and bindings gauges are filled at scrape
    /// time from the routes, so a gone peer is not in them.)
    fn peer_series(&self) -> [&dyn PeerSeries; 7] {
        [
            &self.requests,
            &self.placements,
            &self.prompt_tokens,
            &self.cached_prompt_tokens,
            &self.completion_tokens,
            &self.ttft_by_pool,
            &self.decode_rate,
        ]
    }

    /// Whether a gone peer's series wait out their grace.
    pub fn peers_in_grace(&self) -> bool {
        !self.gone_since.lock().is_empty()
    }

    /// Removes the per-peer series of every (route, peer) not in `live`
    /// that has been seen out of it for `grace_ms` or more; the first time
    /// one is seen out starts its grace. Returns how many series went.
    /// Called every few seconds (the dashboard's sampler); a peer back in
    /// `live` before its grace ends keeps its series.
    pub fn forget_gone_peers(
        &self,
        live: &HashSet<(&str, &str)>,
        now_ms: u64,
        grace_ms: u64,
    ) -> usize {
        let families: Vec<(&dyn PeerSeries, Vec<MetricFamily>)> = self
            .peer_series()
            .into_iter()
            .map(|vec| (vec, vec.families()))
            .collect();
        let mut out: HashSet<(&str, &str)> = HashSet::new();
        for (_, family) in &families {
            for metric in family.iter().flat_map(|f| f.get_metric()) {
                if let Some(pair) = route_and_peer(metric).filter(|pair| !live.contains(pair)) {
                    out.insert(pair);
                }
            }
        }
        let mut gone_since = self.gone_since.lock();
        gone_since.retain(|(route, peer), _| out.contains(&(route.as_str(), peer.as_str())));
        let due: HashSet<(&str, &str)> = out
            .into_iter()
            .filter(|&(route, peer)| {
                let since = *gone_since
                    .entry((route.to_string(), peer.to_string()))
                    .or_insert(now_ms);
                now_ms.saturating_sub(since) >= grace_ms
            })
            .collect();
        if due.is_empty() {
            return 0;
        }
        let mut removed = 0;
        for (vec, family) in &families {
            for metric in family.iter().flat_map(|f| f.get_metric()) {
                if !route_and_peer(metric).is_some_and(|pair| due.contains(&pair)) {
                    continue;
                }
                let labels: HashMap<&str, &str> = metric
                    .get_label()
                    .iter()
                    .map(|l| (l.name(), l.value()))
                    .collect();
                vec.remove(&labels);
                removed += 1;
            }
        }
        for (route, peer) in due {
            gone_since.remove(&(route.to_string(), peer.to_string()));
        }
        removed
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(16 * 1024);
        // Encoding our own registry into a Vec cannot fail.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        out
    }
}

/// How a pre-read request body went back to Pingora
/// (`proxy::request::forward`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyVia {
    RetryBuffer,
    Replay,
}

/// Counts one forwarded body; both handles resolved once per process.
pub fn body_forwarded(via: BodyVia) {
    static HANDLES: LazyLock<[IntCounter; 2]> = LazyLock::new(|| {
        let m = &metrics().body_forwards;
        [
            m.with_label_values(&["retry_buffer"]),
            m.with_label_values(&["replay"]),
        ]
    });
    HANDLES[via as usize].inc();
}

/// The process-wide metrics.
pub fn metrics() -> &'static Metrics {
    static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);
    &METRICS
}

/// The request path's series of one route version, each looked up by its
/// labels once and then kept: `with_label_values` hashes every label and
/// takes the vector's lock on each call, and a request makes half a dozen of
/// them. Resolved on first use rather than at load, so `/metrics` shows a
/// series only once it has counted something, as before. A reload builds
/// the route (and so this) anew; the series themselves live on in the
/// process-wide vectors, so a count never restarts.
#[derive(Debug, Default)]
pub struct RouteMetrics {
    request_duration: OnceLock<Histogram>,
    ttft: OnceLock<Histogram>,
    queue_wait: OnceLock<Histogram>,
    load_rejections: Few<&'static str, IntCounter>,
    /// The per-peer series of requests that reached no peer (peer `"-"`).
    pub unplaced: PeerMetrics,
}

impl RouteMetrics {
    pub fn request_duration(&self, route: &str) -> &Histogram {
        self.request_duration
            .get_or_init(|| metrics().request_duration.with_label_values(&[route]))
    }

    pub fn ttft(&self, route: &str) -> &Histogram {
        self.ttft
            .get_or_init(|| metrics().ttft.with_label_values(&[route]))
    }

    pub fn queue_wait(&self, route: &str) -> &Histogram {
        self.queue_wait
            .get_or_init(|| metrics().queue_wait.with_label_values(&[route]))
    }

    pub fn load_rejections(&self, route: &str, gate: &'static str) -> IntCounter {
        self.load_rejections.get(&gate, || {
            metrics().load_rejections.with_label_values(&[route, gate])
        })
    }
}

/// The series one peer of a route version writes per request (see
/// [`RouteMetrics`]). `route` and `peer` must be the names of the route and
/// peer that own this.
#[derive(Debug, Default)]
pub struct PeerMetrics {
    requests: Few<u16, IntCounter>,
    placements: Few<(&'static str, &'static str), IntCounter>,
    prompt_tokens: OnceLock<IntCounter>,
    cached_prompt_tokens: OnceLock<IntCounter>,
    completion_tokens: OnceLock<IntCounter>,
    ttft_by_pool: Few<String, Histogram>,
    decode_rate: Few<String, Histogram>,
}

impl PeerMetrics {
    /// `requests_total` for status `code` (its label from `code_label`).
    pub fn requests(&self, route: &str, peer: &str, code: u16, code_label: &str) -> IntCounter {
        self.requests.get(&code, || {
            metrics()
                .requests
                .with_label_values(&[route, peer, code_label])
        })
    }

    pub fn placements(
        &self,
        route: &str,
        peer: &str,
        kind: &'static str,
        reason: &'static str,
    ) -> IntCounter {
        self.placements.get(&(kind, reason), || {
            metrics()
                .placements
                .with_label_values(&[route, peer, kind, reason])
        })
    }

    pub fn prompt_tokens(&self, route: &str, peer: &str) -> &IntCounter {
        self.prompt_tokens
            .get_or_init(|| metrics().prompt_tokens.with_label_values(&[route, peer]))
    }

    pub fn cached_prompt_tokens(&self, route: &str, peer: &str) -> &IntCounter {
        self.cached_prompt_tokens.get_or_init(|| {
            metrics()
                .cached_prompt_tokens
                .with_label_values(&[route, peer])
        })
    }

    pub fn completion_tokens(&self, route: &str, peer: &str) -> &IntCounter {
        self.completion_tokens.get_or_init(|| {
            metrics()
                .completion_tokens
                .with_label_values(&[route, peer])
        })
    }

    pub fn ttft_by_pool(&self, route: &str, pool: &str, peer: &str) -> Histogram {
        self.ttft_by_pool.get(pool, || {
            metrics()
                .ttft_by_pool
                .with_label_values(&[route, pool, peer])
        })
    }

    pub fn decode_rate(&self, route: &str, pool: &str, peer: &str) -> Histogram {
        self.decode_rate.get(pool, || {
            metrics()
                .decode_rate
                .with_label_values(&[route, pool, peer])
        })
    }
}

/// The few label values one metric takes for one route or peer (status
/// codes, placement kinds, model pools: all bounded by the code or the
/// config), each resolved once: a read lock and a short scan instead of
/// hashing the labels.
pub struct Few<K, M>(RwLock<Vec<(K, M)>>);

impl<K, M> Default for Few<K, M> {
    fn default() -> Self {
        Few(RwLock::new(Vec::new()))
    }
}

impl<K, M> std::fmt::Debug for Few<K, M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Few({} series)", self.0.read().len())
    }
}

impl<K, M: Clone> Few<K, M> {
    /// The handle for `key`, made by `make` the first time.
    pub fn get<Q>(&self, key: &Q, make: impl FnOnce() -> M) -> M
    where
        K: Borrow<Q>,
        Q: PartialEq + ToOwned<Owned = K> + ?Sized,
    {
        let found = |entries: &[(K, M)]| {
            entries
                .iter()
                .find(|(k, _)| k.borrow() == key)
                .map(|(_, m)| m.clone())
        };
        if let Some(m) = found(&self.0.read()) {
            return m;
        }
        let mut entries = self.0.write();
        // Another request may have resolved it between the two locks.
        if let Some(m) = found(&entries) {
            return m;
        }
        let m = make();
        entries.push((key.to_owned(), m.clone()));
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn few_resolves_each_key_once() {
        let few: Few<String, u32> = Few::default();
        let mut made = 0;
        for _ in 0..3 {
            assert_eq!(
                few.get("a", || {
                    made += 1;
                    7
                }),
                7
            );
        }
        assert_eq!(few.get("b", || 8), 8);
        assert_eq!(made, 1);
        assert_eq!(few.get("a", || 0), 7);
    }

    #[test]
    fn a_gone_peers_series_go_after_its_grace_and_a_live_or_returning_peers_stay() {
        let m = metrics();
        let route = "metrics-gone-peer-test";
        for peer in ["live", "gone", "back"] {
            m.requests.with_label_values(&[route, peer, "200"]).inc();
            m.prompt_tokens.with_label_values(&[route, peer]).inc_by(7);
        }
        let has = |peer: &str| {
            m.requests
                .collect()
                .iter()
                .flat_map(|f| f.get_metric())
                .any(|s| route_and_peer(s) == Some((route, peer)))
        };
        // The other tests' series share the process-wide metrics: theirs
        // are live whenever a sweep runs.
        let sweep = |peers: &[&str], now: u64| {
            let others: Vec<(String, String)> = m
                .peer_series()
                .iter()
                .flat_map(|v| v.families())
                .flat_map(|f| f.get_metric().to_vec())
                .filter_map(|s| route_and_peer(&s).map(|(r, p)| (r.to_string(), p.to_string())))
                .filter(|(r, _)| r != route)
                .collect();
            let live: HashSet<(&str, &str)> = others
                .iter()
                .map(|(r, p)| (r.as_str(), p.as_str()))
                .chain(peers.iter().map(|p| (route, *p)))
                .collect();
            m.forget_gone_peers(&live, now, 1_000)
        };
        assert_eq!(sweep(&["live"], 10_000), 0, "grace starts");
        assert_eq!(sweep(&["live"], 10_999), 0);
        assert!(has("gone") && has("back"));
        // "back" returns within its grace: its grace is over.
        sweep(&["live", "back"], 10_999);
        assert_eq!(sweep(&["live", "back"], 11_000), 2, "gone's two series");
        assert!(!has("gone"));
        assert_eq!(
            m.prompt_tokens.with_label_values(&[route, "gone"]).get(),
            0,
            "a fresh series"
        );
        // Control: the same sweeps left the live and the returning peer's.
        assert!(has("live") && has("back"));
        assert_eq!(m.prompt_tokens.with_label_values(&[route, "live"]).get(), 7);
    }

    #[test]
    fn cached_handles_count_in_the_shared_series() {
        let route = RouteMetrics::default();
        let peer = PeerMetrics::default();
        let name = "metrics-cache-test";
        peer.requests(name, "e0", 200, "200").inc();
        peer.requests(name, "e0", 200, "200").inc();
        peer.requests(name, "e0", 503, "503").inc();
        route.request_duration(name).observe(0.5);
        let m = metrics();
        assert_eq!(m.requests.with_label_values(&[name, "e0", "200"]).get(), 2);
        assert_eq!(m.requests.with_label_values(&[name, "e0", "503"]).get(), 1);
        assert_eq!(
            m.request_duration
                .with_label_values(&[name])
                .get_sample_count(),
            1
        );
    }
}
