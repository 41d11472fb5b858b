//! The request body view costs about the body's own size, whatever the body
//! holds: counted allocations, not time. A 10 MB body of five million small
//! numbers used to become a `serde_json::Value` tree of ~40x its size before
//! any concurrency slot was taken.

use llm_gateway::request_view::RequestView;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let live = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
        PEAK.fetch_max(live, Ordering::Relaxed);
        System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        System.dealloc(ptr, layout)
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Bytes allocated at the peak of `f`, beyond what was live before it.
fn peak_during(f: impl FnOnce()) -> usize {
    let before = LIVE.load(Ordering::Relaxed);
    PEAK.store(before, Ordering::Relaxed);
    f();
    PEAK.load(Ordering::Relaxed) - before
}

#[test]
fn viewing_a_body_of_millions_of_numbers_allocates_almost_nothing() {
    let mut body =
        br#"{"model":"m","stream":true,"metadata":{"session_id":"s"},"messages":["#.to_vec();
    while body.len() < 10 << 20 {
        body.extend_from_slice(b"0,");
    }
    body.extend_from_slice(b"0]}");
    let size = body.len();

    let view_peak = peak_during(|| {
        let view = RequestView::parse(&body).expect("valid body");
        assert_eq!(view.model().as_deref(), Some("m"));
        assert!(view.is_stream());
    });
    assert!(
        view_peak < size / 100,
        "the view allocated {view_peak} bytes for a {size}-byte body"
    );

    // Control: the counter does see a full parse's amplification.
    let tree_peak = peak_during(|| {
        let tree: serde_json::Value = serde_json::from_slice(&body).expect("valid body");
        assert!(tree.is_object());
    });
    assert!(
        tree_peak > 10 * size,
        "a full parse allocated only {tree_peak} bytes for {size}"
    );
}
