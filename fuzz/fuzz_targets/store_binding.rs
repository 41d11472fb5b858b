#![no_main]
//! Fuzz target `store_binding`: the harness function of the same name in
//! `fuzz/harness.rs`, which `tests/fuzz_corpus.rs` also runs over the
//! committed corpus and regressions.

#[path = "../harness.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| harness::store_binding(data));
