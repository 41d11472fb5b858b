//! The metrics as documented and as graphed cannot drift
//! from the code. A gateway is driven through every path that feeds a
//! metric family (streams, a queued 429, API keys, a reject rule, a body-log
//! frame); its `/metrics` is then the reference for the book's metric
//! table (docs/src/operations/metrics.md: names, types, labels) and for
//! every expression of the Grafana dashboard in `deploy/grafana/`.

mod common;

use common::bodylog::FrameSink;
use common::http;
use common::*;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// `llm_gateway_…` identifiers in `text`, in order of appearance.
fn metric_names(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("llm_gateway_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        out.push(tail[..end].to_string());
        rest = &tail[end..];
    }
    out
}

/// What `/metrics` says: each family's type and label names, and every
/// sample name (`_bucket`, `_sum`, `_count` included).
#[derive(Debug, Default)]
struct Scrape {
    families: BTreeMap<String, (String, BTreeSet<String>)>,
    samples: BTreeSet<String>,
}

impl Scrape {
    fn parse(text: &str) -> Scrape {
        let mut s = Scrape::default();
        for line in text.lines() {
            if let Some(t) = line.strip_prefix("# TYPE ") {
                let mut parts = t.split_whitespace();
                if let (Some(name), Some(kind)) = (parts.next(), parts.next()) {
                    s.families
                        .insert(name.to_string(), (kind.to_string(), BTreeSet::new()));
                }
            }
        }
        for line in text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
        {
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            let name = &line[..end];
            s.samples.insert(name.to_string());
            let family = s
                .family_of(name)
                .unwrap_or_else(|| panic!("{name}: no # TYPE"));
            let labels = label_names(&line[end..]);
            let entry = s.families.get_mut(&family).expect("family");
            entry.1.extend(labels.into_iter().filter(|l| l != "le"));
        }
        s
    }

    /// The family a sample name belongs to.
    fn family_of(&self, sample: &str) -> Option<String> {
        if self.families.contains_key(sample) {
            return Some(sample.to_string());
        }
        ["_bucket", "_sum", "_count"].iter().find_map(|suffix| {
            let base = sample.strip_suffix(suffix)?;
            self.families.contains_key(base).then(|| base.to_string())
        })
    }

    /// Referenced names (in `text`) that the scrape has no sample of.
    fn missing(&self, text: &str) -> Vec<String> {
        metric_names(text)
            .into_iter()
            .filter(|n| !self.samples.contains(n))
            .collect()
    }
}

/// `{a="x",b="y\"z"}` → [a, b].
fn label_names(labels: &str) -> Vec<String> {
    let Some(body) = labels.strip_prefix('{') else {
        return Vec::new();
    };
    let (mut out, mut name, mut in_value, mut escaped) = (Vec::new(), String::new(), false, false);
    for c in body.chars() {
        match (in_value, c) {
            (true, '\\') if !escaped => escaped = true,
            (true, '"') if !escaped => in_value = false,
            (true, _) => escaped = false,
            (false, '"') => in_value = true,
            (false, '=') => out.push(std::mem::take(&mut name)),
            (false, ',') | (false, ' ') => {}
            (false, '}') => break,
            (false, c) => name.push(c),
        }
    }
    out
}

/// A gateway after traffic that touches every metric family.
struct Exercised {
    scrape: Scrape,
    _gw: Gateway,
    _cluster: SimCluster,
    _sink: FrameSink,
    _keys: tempfile::TempDir,
    _redis: common::redis::Redis,
}

fn exercised() -> Exercised {
    let cluster = spawn_engines(3, 0, EngineConfig::default()).expect("engines");
    let p = ports(&cluster);
    let sink = FrameSink::start();
    let keys = tempfile::tempdir().expect("keys dir");
    let key_file = keys.path().join("api-keys");
    std::fs::write(&key_file, "sk-metrics:team-m\n").expect("key file");
    let guarded = format!(
        "api_keys_file: {}\nreject_rules:\n  - name: too-many-tokens\n    status: 413\n    when: {{field: max_tokens, op: gt, value: 1000}}\n",
        key_file.display()
    );
    let tight = format!(
        "peers:\n  - {{name: only, host: 127.0.0.1, port: {}, max_concurrency: 1}}\nqueue_timeout: 300ms\n",
        p[2]
    );
    let mut redis = common::redis::Redis::start();
    let store = format!(
        "session_store:\n  kind: redis\n  url: {}\n  timeout: 200ms\n",
        redis.url()
    );
    // One request a minute for the key's owner: its second is a tenant's
    // 429 (the rule's 413 is refused before its tenant is charged).
    let tenants_file = keys.path().join("tenants.yaml");
    std::fs::write(
        &tenants_file,
        "tenants:\n  team-m:\n    requests_per_minute: 1\n",
    )
    .expect("tenants file");
    let store = format!("{store}tenants_file: {}\n", tenants_file.display());
    let gw = Gateway::start_with(
        &[
            (
                "chat",
                route_yaml(&p[..2], "include_usage: true\ncch_strip: true\n"),
            ),
            ("tight", tight),
            ("guarded", route_yaml(&p[..1], &guarded)),
        ],
        GatewayOptions {
            extra_config: sink.config("")
                + &store
                + &format!(
                    "access_log: {{path: {}}}\n",
                    keys.path().join("access.log").display()
                )
                // Nothing listens there: the span counters are registered
                // at start all the same.
                + &format!("tracing: {{endpoint: \"http://127.0.0.1:{}/v1/traces\"}}\n", free_port()),
            ..Default::default()
        },
    );
    let stream = json!({"model": "sim-model", "stream": true,
        "messages": [
            {"role": "system", "content": "x-anthropic-billing-header: cc_version=1; cc_entrypoint=cli; cch=abc12;\nYou help."},
            {"role": "user", "content": "measure me"}],
        "metadata": {"session_id": "metrics-1"}});
    // Two turns of one session (new, then sticky), each long enough for a
    // TTFT and a decode-rate sample (20 tokens over 0.8 s).
    for _ in 0..2 {
        let r = http::post_json(
            gw.addr,
            "/chat/v1/chat/completions",
            &[("x-sim-max-tokens", "20"), ("x-sim-frame-delay-ms", "40")],
            &stream,
        );
        assert_eq!(r.status(), 200, "{}", r.text());
    }
    // The only slot held: the next request queues, then is refused.
    let held = hold_stream(&gw, "/tight/v1/chat/completions", "metrics", &[]);
    let queued = http::post_json(
        gw.addr,
        "/tight/v1/chat/completions",
        &[],
        &chat_body("metrics-2", "wait", false),
    );
    assert_eq!(queued.status(), 429, "{}", queued.text());
    let key = [("authorization", "Bearer sk-metrics")];
    let big = json!({"model": "sim-model", "max_tokens": 5000, "messages": [{"role": "user", "content": "x"}]});
    let path = "/guarded/v1/chat/completions";
    assert_eq!(http::post_json(gw.addr, path, &key, &big).status(), 413);
    assert_eq!(http::post_json(gw.addr, path, &[], &big).status(), 401);
    let small = json!({"model": "sim-model", "messages": [{"role": "user", "content": "x"}]});
    assert_eq!(http::post_json(gw.addr, path, &key, &small).status(), 200);
    assert_eq!(http::post_json(gw.addr, path, &key, &small).status(), 429);
    sink.wait_frames(1);
    cluster.engines[2].open_gate("metrics");
    drop(held);
    // Redis gone: the next new session is placed locally and the failed
    // command counted.
    redis.kill();
    let offline = http::post_json(
        gw.addr,
        "/chat/v1/chat/completions",
        &[],
        &chat_body("metrics-3", "redis is away", false),
    );
    assert_eq!(offline.status(), 200);
    // The streams' samples are recorded as they are logged, just after
    // their answers: wait for them rather than race them.
    let text = wait_for("every family in /metrics", DEADLINE, || {
        let text = http::get(gw.admin, "/metrics").text();
        let seen = Scrape::parse(&text);
        let all = [
            "llm_gateway_ttft_seconds",
            "llm_gateway_decode_tokens_per_second",
            "llm_gateway_queue_wait_seconds",
            "llm_gateway_bodylog_frames_total",
            "llm_gateway_session_store_errors_total",
            "llm_gateway_tenant_tokens_total",
        ];
        all.iter()
            .all(|f| seen.families.contains_key(*f))
            .then_some(text)
    });
    Exercised {
        scrape: Scrape::parse(&text),
        _gw: gw,
        _cluster: cluster,
        _sink: sink,
        _keys: keys,
        _redis: redis,
    }
}

/// The page that documents every metric.
const METRICS_PAGE: &str = "docs/src/operations/metrics.md";

/// The book's metric table: name → (type, labels).
fn documented_metrics() -> BTreeMap<String, (String, BTreeSet<String>)> {
    let page = read(METRICS_PAGE);
    let table = page
        .split_once("<!-- metrics:begin -->")
        .and_then(|(_, rest)| rest.split_once("<!-- metrics:end -->"))
        .map(|(table, _)| table)
        .unwrap_or_else(|| panic!("{METRICS_PAGE} has the metrics table between its markers"));
    table
        .lines()
        .filter_map(|line| {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            let name = cells.get(1)?.strip_prefix('`')?.strip_suffix('`')?;
            let kind = cells.get(2)?.to_string();
            let labels = cells
                .get(3)?
                .split(',')
                .map(|l| l.trim().trim_matches('`').to_string())
                .filter(|l| !l.is_empty() && l != "none")
                .collect();
            Some((name.to_string(), (kind, labels)))
        })
        .collect()
}

#[test]
fn every_registered_metric_is_in_the_book_with_its_type_and_labels() {
    let registered: BTreeSet<String> = metric_names(&read("src/metrics.rs"))
        .into_iter()
        .filter(|n| n != "llm_gateway_")
        .collect();
    assert!(
        registered.len() >= 20,
        "the scan sees the metrics: {registered:?}"
    );
    let live = exercised().scrape;
    let live_names: BTreeSet<String> = live.families.keys().cloned().collect();
    // The traffic reached every family, and nothing outside metrics.rs
    // registers one (so the source scan is the whole list).
    assert_eq!(
        live_names, registered,
        "families in /metrics vs src/metrics.rs"
    );
    let documented = documented_metrics();
    let documented_names: BTreeSet<String> = documented.keys().cloned().collect();
    assert_eq!(
        documented_names, registered,
        "the book's metric table vs src/metrics.rs"
    );
    for (name, (kind, labels)) in &live.families {
        let (doc_kind, doc_labels) = &documented[name];
        assert_eq!(doc_kind, kind, "{name}: the book's type");
        assert_eq!(doc_labels, labels, "{name}: the book's labels");
    }
}

fn exprs(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, v) in m {
                match (k.as_str(), v) {
                    ("expr", Value::String(e)) => out.push(e.clone()),
                    _ => exprs(v, out),
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|v| exprs(v, out)),
        _ => {}
    }
}

/// Label names an expression aggregates by or matches on.
fn labels_used(expr: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (i, _) in expr.match_indices("by (") {
        let group = &expr[i + 4..];
        let group = &group[..group.find(')').unwrap_or(group.len())];
        out.extend(group.split(',').map(|l| l.trim().to_string()));
    }
    for (i, _) in expr.match_indices('{') {
        let inner = &expr[i + 1..];
        let inner = &inner[..inner.find('}').unwrap_or(inner.len())];
        // Grafana's legend templates `{{route}}` are not in expressions,
        // but a `[$__rate_interval]` may follow; only matchers are here.
        for m in inner.split(',') {
            if let Some(end) = m.find(['=', '!']) {
                out.insert(m[..end].trim().to_string());
            }
        }
    }
    out.retain(|l| !l.is_empty());
    out
}

#[test]
fn the_grafana_dashboard_reads_only_metrics_and_labels_the_gateway_exports() {
    let dash: Value =
        serde_json::from_str(&read("deploy/grafana/llm-gateway.json")).expect("valid JSON");
    // A Prometheus datasource variable that every panel and the route
    // variable query through.
    let vars = dash["templating"]["list"].as_array().expect("variables");
    assert!(
        vars.iter().any(|v| v["name"] == "datasource"
            && v["type"] == "datasource"
            && v["query"] == "prometheus"),
        "{vars:?}"
    );
    let panels = dash["panels"].as_array().expect("panels");
    let mut ids = BTreeSet::new();
    let mut cells = BTreeSet::new();
    for p in panels {
        assert!(
            ids.insert(p["id"].as_u64().expect("id")),
            "duplicate id {}",
            p["id"]
        );
        let g = &p["gridPos"];
        let (x, y, w, h) = (
            g["x"].as_u64().expect("x"),
            g["y"].as_u64().expect("y"),
            g["w"].as_u64().expect("w"),
            g["h"].as_u64().expect("h"),
        );
        assert!(x + w <= 24, "{} wider than the grid", p["title"]);
        for cx in x..x + w {
            for cy in y..y + h {
                assert!(
                    cells.insert((cx, cy)),
                    "{} overlaps another panel",
                    p["title"]
                );
            }
        }
        if p["type"] == "row" {
            continue;
        }
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{}", p["title"]);
        let targets = p["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{} has no query", p["title"]);
        let refs: BTreeSet<_> = targets.iter().map(|t| t["refId"].to_string()).collect();
        assert_eq!(refs.len(), targets.len(), "{}: refIds unique", p["title"]);
    }

    let mut all = Vec::new();
    exprs(&dash, &mut all);
    assert!(all.len() >= 20, "the scan sees the queries: {all:?}");
    let live = exercised().scrape;
    for e in &all {
        assert_eq!(
            live.missing(e),
            Vec::<String>::new(),
            "not in /metrics: {e}"
        );
        let families: Vec<String> = metric_names(e)
            .iter()
            .filter_map(|n| live.family_of(n))
            .collect();
        let mut known: BTreeSet<String> = families
            .iter()
            .flat_map(|f| live.families[f].1.iter().cloned())
            .collect();
        known.insert("le".into());
        for label in labels_used(e) {
            assert!(
                known.contains(&label),
                "{e}: label {label} is not on {families:?}"
            );
        }
        if e.contains("histogram_quantile") {
            assert!(e.contains("_bucket{") && e.contains("by (le"), "{e}");
        }
    }
    // The panels the issue asks for are there.
    let text = all.join("\n");
    for needed in [
        "llm_gateway_requests_total",
        "llm_gateway_ttft_seconds_bucket",
        "llm_gateway_decode_tokens_per_second_bucket",
        "llm_gateway_cached_prompt_tokens_total",
        "llm_gateway_placements_total",
        "llm_gateway_load_rejections_total",
        "llm_gateway_in_flight",
        "llm_gateway_queue_wait_seconds_bucket",
    ] {
        assert!(
            metric_names(&text).iter().any(|n| n == needed),
            "no panel reads {needed}"
        );
    }
    // Controls: a name the gateway does not export, and a label its
    // metric does not have, are caught by the same checks.
    assert_eq!(
        live.missing("rate(llm_gateway_nope_total[5m])"),
        vec!["llm_gateway_nope_total".to_string()]
    );
    assert!(labels_used(r#"sum by (route, model) (rate(x{peer="a"}[1m]))"#).contains("model"));
    assert!(!live.families["llm_gateway_placements_total"]
        .1
        .contains("model"));
}
