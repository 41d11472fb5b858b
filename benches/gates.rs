//! Cost of the load gates' decision per LLM request (issue 9): the pool's
//! reading, the limit in force, and the verdict, through the same
//! `proxy::guards::gates::check` the request path calls, on a route loaded
//! from a real route file.
//!
//! `cargo bench --bench gates`. Four states: no EWMA yet (fail-open, the
//! usual case between windows on a quiet pool), an EWMA under its limit,
//! the same with session priority grading a warm turn, and a tripped gate
//! refusing (the 429 is built).

use std::hint::black_box;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, Criterion};
use llm_gateway::clock::now_ms;
use llm_gateway::config::{GatewayConfig, Overrides};
use llm_gateway::protect::meter::StreamTiming;
use llm_gateway::protect::prio::Turn;
use llm_gateway::protect::route::TurnBucket;
use llm_gateway::proxy::guards::gates::check;
use llm_gateway::registry::{Registry, Route};

fn route(dir: &Path, name: &str, extra: &str) -> Arc<Route> {
    std::fs::write(
        dir.join(format!("{name}.yaml")),
        // A 1 ms window closes right after the one sample `measured` gives
        // it, so the EWMA exists from the first check on (the clock counts
        // from process start: there is no past to backdate a window into).
        format!("peers:\n  - {{name: e0, host: 127.0.0.1, port: 9}}\newma_ttl: 1h\nttft_window: 1ms\ntps_window: 1ms\n{extra}"),
    )
    .expect("route file");
    let overrides = Overrides {
        routes_dir: Some(dir.to_path_buf()),
        ..Default::default()
    };
    let gateway = GatewayConfig::parse(Path::new("gateway.yaml"), "", &overrides).expect("config");
    let registry = Registry::new(gateway);
    let report = registry.reload();
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    registry.route(name).expect("the route")
}

/// One closed window of 300 ms TTFT samples, so the pool has an EWMA.
fn measured(route: &Route) {
    let cfg = route.config.protection.meter;
    let timing = StreamTiming {
        ttft: Some(Duration::from_millis(300)),
        decode: Some(Duration::from_secs(1)),
        completion_tokens: Some(40),
        content_frames: 40,
    };
    route
        .runtime
        .protection
        .count_stream(&cfg, "_", "e0", &timing, now_ms());
    std::thread::sleep(Duration::from_millis(5));
}

fn gates(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tempdir");
    let quiet = route(dir.path(), "quiet", "");
    let open = route(dir.path(), "open", "");
    measured(&open);
    let graded = route(dir.path(), "graded", "session_prio: true\n");
    measured(&graded);
    let tripped = route(dir.path(), "tripped", "ttft_limit_ms: 100\nprobes: 0\n");
    measured(&tripped);
    let warm = TurnBucket {
        turn: Turn::Known(40),
        bucket: 5,
        share: 1.0,
    };
    // Each state is what its name says, or the timing would be of another.
    assert!(check(&quiet, "_", None, 1, true, None, Some(1)).is_ok());
    assert!(check(&open, "_", None, 1, true, None, Some(1)).is_ok());
    assert!(check(&graded, "_", None, 1, true, Some(warm), Some(1)).is_ok());
    let refused = check(&tripped, "_", None, 1, true, None, Some(1)).expect_err("tripped");
    assert_eq!(refused.status, 429);
    let mut g = c.benchmark_group("load_gate");
    g.bench_function("no_ewma", |b| {
        b.iter(|| black_box(check(&quiet, "_", None, 1, true, None, Some(1)).is_ok()))
    });
    g.bench_function("under_limit", |b| {
        b.iter(|| black_box(check(&open, "_", None, 1, true, None, Some(1)).is_ok()))
    });
    g.bench_function("session_prio_warm_turn", |b| {
        b.iter(|| black_box(check(&graded, "_", None, 1, true, Some(warm), Some(1)).is_ok()))
    });
    g.bench_function("tripped_429", |b| {
        b.iter(|| black_box(check(&tripped, "_", None, 1, true, None, Some(1)).is_err()))
    });
    g.finish();
}

criterion_group!(benches, gates);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
}
