//! Cost of one placement decision, and memory per remembered session.
//!
//! `cargo bench --bench placement`. Before the timings it prints the heap the
//! session table holds per session, counted by a global allocator wrapper, for
//! 1,000,000 sessions and for a table at its default cap (4 peers x 100,000).

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::time::Duration;

use criterion::{criterion_group, BatchSize, Criterion};
use http::{HeaderMap, HeaderName, HeaderValue};
use llm_gateway::hash::stable_hash64;
use llm_gateway::placement::{
    hash_place, least_conn, Bound, EngineLoad, EngineSpeed, Incoming, PeerLoad, PlacementKind,
    Prefix, SessionTable, TableConfig,
};
use llm_gateway::request_view::RequestView;
use llm_gateway::session::extract_session;

/// Counts live heap bytes so the table's footprint is measured, not estimated.
struct CountingAllocator;

static LIVE_BYTES: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded unchanged to the system allocator.
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            LIVE_BYTES.fetch_add(layout.size(), Relaxed);
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `alloc` above with this layout.
        unsafe { System.dealloc(ptr, layout) };
        LIVE_BYTES.fetch_sub(layout.size(), Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded unchanged to the system allocator.
        let new_ptr = unsafe { System.realloc(ptr, layout, new_size) };
        if !new_ptr.is_null() {
            LIVE_BYTES.fetch_sub(layout.size(), Relaxed);
            LIVE_BYTES.fetch_add(new_size, Relaxed);
        }
        new_ptr
    }
}

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

const T0: u64 = 1_700_000_000_000;
const PEERS: u32 = 4;
const PER_PEER_CAP: usize = 100_000;

fn peers() -> Vec<PeerLoad> {
    (1..=PEERS)
        .map(|id| PeerLoad {
            in_flight: 10 + id,
            engine: Some(EngineLoad {
                running: 10 + id,
                waiting: 0,
                kv_usage: 0.6,
            }),
            ..PeerLoad::idle(id, 64)
        })
        .collect()
}

fn sid(n: u64) -> u64 {
    stable_hash64(&n.to_le_bytes())
}

/// A table with every peer at its cap, and the ids remembered in it.
fn full_table() -> (SessionTable, Vec<u64>) {
    let table = SessionTable::new(TableConfig::default());
    // Equal loads: new sessions spread by their rendezvous tie-break, so the
    // peers fill evenly and the last few ids fall back unremembered.
    let even: Vec<PeerLoad> = (1..=PEERS).map(|id| PeerLoad::idle(id, 64)).collect();
    let mut remembered = Vec::with_capacity(PER_PEER_CAP * PEERS as usize);
    let mut n = 0;
    while table.len() < PER_PEER_CAP * PEERS as usize {
        let placed = table.place(sid(n), &even, T0);
        if placed.map(|p| p.kind) == Some(PlacementKind::New) {
            remembered.push(sid(n));
        }
        n += 1;
    }
    (table, remembered)
}

fn report_memory() {
    let before = LIVE_BYTES.load(Relaxed);
    let table = SessionTable::new(TableConfig {
        max_sessions_per_peer: usize::MAX,
        ..TableConfig::default()
    });
    let even: Vec<PeerLoad> = (1..=PEERS).map(|id| PeerLoad::idle(id, 64)).collect();
    let sessions = 1_000_000u64;
    for n in 0..sessions {
        table.place(sid(n), &even, T0);
    }
    let bytes = LIVE_BYTES.load(Relaxed) - before;
    println!(
        "memory: {sessions} sessions: {bytes} heap bytes = {:.1} bytes/session (estimate from capacities {:.1})",
        bytes as f64 / sessions as f64,
        table.approx_heap_bytes() as f64 / sessions as f64
    );
    drop(table);

    let before = LIVE_BYTES.load(Relaxed);
    let (table, _) = full_table();
    let bytes = LIVE_BYTES.load(Relaxed) - before;
    println!(
        "memory: table at cap ({} sessions): {bytes} heap bytes = {:.1} bytes/session",
        table.len(),
        bytes as f64 / table.len() as f64
    );
}

fn placement(c: &mut Criterion) {
    let (table, remembered) = full_table();
    let loads = peers();
    let mut group = c.benchmark_group("place");

    // The case the expiry bound exists for: a client sending a fresh id on
    // every request against a full table.
    let mut fresh = 1u64 << 40;
    group.bench_function("fresh_id_table_at_cap_400k", |b| {
        b.iter(|| {
            fresh += 1;
            black_box(table.place(black_box(sid(fresh)), &loads, T0 + 1_000))
        })
    });

    let mut next = 0usize;
    group.bench_function("sticky_warm_table_400k", |b| {
        b.iter(|| {
            next = (next + 7919) % remembered.len();
            black_box(table.place(black_box(remembered[next]), &loads, T0 + 2_000))
        })
    });

    group.bench_function("peek_sticky_400k", |b| {
        b.iter(|| {
            next = (next + 7919) % remembered.len();
            black_box(table.peek(black_box(remembered[next]), &loads, T0 + 2_000))
        })
    });

    group.bench_function("new_session_with_room", |b| {
        b.iter_batched_ref(
            || SessionTable::new(TableConfig::default()),
            |fresh_table| {
                for n in 0..64 {
                    black_box(fresh_table.place(sid(n), &loads, T0));
                }
            },
            BatchSize::SmallInput,
        )
    });

    group.bench_function("sweep_nothing_expired_400k", |b| {
        b.iter(|| black_box(table.sweep(black_box(T0 + 60_000))))
    });
    group.finish();

    let mut stateless = c.benchmark_group("stateless");
    let eight: Vec<PeerLoad> = (1..=8)
        .map(|id| PeerLoad {
            in_flight: id % 3,
            ..PeerLoad::idle(id, 64)
        })
        .collect();
    let mut rand = 0u64;
    stateless.bench_function("least_conn_8_peers", |b| {
        b.iter(|| {
            rand = rand.wrapping_add(0x9e37_79b9_7f4a_7c15);
            black_box(least_conn(&eight, rand))
        })
    });
    stateless.bench_function("hash_place_8_peers", |b| {
        b.iter(|| {
            rand = rand.wrapping_add(1);
            black_box(hash_place(sid(rand), &eight, rand))
        })
    });
    stateless.finish();

    model(c);
}

/// 64 engines the model knows everything of: learned speeds and
/// completion rates, published KV, live sessions, a queue on some. The
/// decision the issue bounds (20 us at 64 engines): a new session, a
/// template's newcomer, and a warm turn weighing its home against the rest.
fn model(c: &mut Criterion) {
    let engines: Vec<PeerLoad> = (1..=64u32)
        .map(|id| PeerLoad {
            in_flight: 4 + id % 5,
            backlog_tokens: u64::from(id % 3) * 8_000,
            speed: EngineSpeed {
                prefill_us: Some(40.0 + (id % 7) as f32),
                tpot_us: Some(20_000.0),
                completions_per_s: Some(8.0),
                prefill_us_at_least: None,
            },
            engine: Some(EngineLoad {
                running: 20 + id % 9,
                waiting: id % 4,
                kv_usage: 0.6,
            }),
            bound: Bound {
                projected_tokens: 8 * 58_000,
                ..Bound::whole(8, 240_000 + u64::from(id) * 1_000)
            },
            kv_capacity_tokens: Some(434_000),
            ..PeerLoad::idle(id, 256)
        })
        .collect();
    let mut group = c.benchmark_group("model_64_engines");
    let table = SessionTable::new(TableConfig::default());
    let mut n = 0u64;
    group.bench_function("new_session", |b| {
        b.iter(|| {
            n += 1;
            let incoming = Incoming {
                tokens: 8_000,
                ..Incoming::default()
            };
            black_box(table.place_session(sid(n), incoming, &engines, T0))
        })
    });
    let prefix = Prefix::new(8_000, [3, 17, 42]);
    group.bench_function("template_newcomer", |b| {
        b.iter(|| {
            n += 1;
            let incoming = Incoming {
                tokens: 8_500,
                prefix: Some(prefix),
                ..Incoming::default()
            };
            black_box(table.place_session(sid(n), incoming, &engines, T0))
        })
    });
    // Warm sessions whose home the model weighs against every other
    // engine (the cooldown long past).
    let warm: Vec<u64> = (0..1_000u64).map(|k| sid(1 << 50 | k)).collect();
    for &s in &warm {
        table.place(s, &engines, T0);
    }
    let mut k = 0usize;
    group.bench_function("warm_turn_stay_or_move", |b| {
        b.iter(|| {
            k = (k + 1) % warm.len();
            let incoming = Incoming {
                tokens: 30_000,
                ..Incoming::default()
            };
            black_box(table.place_session(warm[k], incoming, &engines, T0 + 120_000))
        })
    });
    group.finish();
}

fn extraction(c: &mut Criterion) {
    let mut group = c.benchmark_group("extract");
    let mut headers = HeaderMap::new();
    headers.insert(
        "x-session-id",
        HeaderValue::from_static("3f2a9c1e-7b4d-4e8a-9f61-0c5d2b7e8a14"),
    );
    let configured = [HeaderName::from_static("x-session-affinity")];
    group.bench_function("builtin_header", |b| {
        b.iter(|| black_box(extract_session(black_box(&headers), &configured, None)))
    });
    let body = serde_json::json!({
        "model": "qwen",
        "messages": [{"role": "user", "content": "hi"}],
        "metadata": {"user_id": "{\"device_id\":\"d0c1\",\"account_uuid\":\"a7\",\"session_id\":\"3f2a9c1e-7b4d-4e8a-9f61-0c5d2b7e8a14\"}"},
    });
    let body = body.to_string();
    let empty = HeaderMap::new();
    // The view is parsed once per request in the proxy; what is timed here is
    // the extraction from it (the parse is the body-view benchmark's).
    let view = RequestView::parse(body.as_bytes()).expect("an object");
    group.bench_function("body_user_id_json_string", |b| {
        b.iter(|| black_box(extract_session(&empty, &configured, Some(black_box(&view)))))
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(30)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = placement, extraction
}

fn main() {
    report_memory();
    benches();
    Criterion::default().configure_from_args().final_summary();
}
