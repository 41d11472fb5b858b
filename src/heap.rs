//! The allocator's thresholds, set once when the server starts.
//!
//! A request body is kept in the pieces Pingora reads it in, 64 KiB each
//! (`proxy/request/pieces.rs`). Under glibc's defaults each piece comes from
//! the heap (below the 128 KiB mmap threshold), and when a request ends its
//! freed pieces leave more than the 128 KiB trim threshold free at the top
//! of the heap: glibc gives those pages back, and the next long prompt
//! faults them in again (16 page faults a request for a 300 KB body, and a
//! third more CPU per request in `benches/body_wallclock.sh`). glibc raises
//! both thresholds by itself only after freeing a block it had mmapped,
//! which a body read in pieces never is. Fixed thresholds keep the pages:
//! blocks under 4 MiB come from the heap, and up to 16 MiB of free heap
//! per arena is kept for the next request.

/// Sets the thresholds above; a no-op where the C library is not glibc.
pub fn keep_freed_pages() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator parameters (under the
    // allocator's own lock); it touches no memory of ours.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 4 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 16 << 20);
    }
}
