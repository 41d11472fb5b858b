//! The one clock the gateway's runtime state uses: milliseconds since the
//! process started, monotonic. Pure modules (placement, session table,
//! protection windows) take it as a plain number, so their tests inject any
//! time they like.

use std::sync::LazyLock;
use std::time::Instant;

static EPOCH: LazyLock<Instant> = LazyLock::new(Instant::now);

/// Milliseconds since process start.
pub fn now_ms() -> u64 {
    EPOCH.elapsed().as_millis() as u64
}
