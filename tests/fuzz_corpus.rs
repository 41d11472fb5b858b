//! The fuzz targets' committed inputs as regression tests: every file of
//! `fuzz/corpus/<target>/` (the minimized corpus a fuzz run left) and of
//! `fuzz/regressions/<target>/` (inputs that once crashed a target, kept
//! after the fix) goes through the same harness function the target runs
//! (`fuzz/harness.rs`). Fuzzing itself is `./dev fuzz`; this only replays.

#[path = "../fuzz/harness.rs"]
mod harness;

use std::path::{Path, PathBuf};

fn inputs(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

fn replay(target: &str) {
    let (_, run) = harness::TARGETS
        .iter()
        .find(|(name, _)| *name == target)
        .expect("a harness of that name");
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let corpus = inputs(&root.join("corpus").join(target));
    assert!(!corpus.is_empty(), "fuzz/corpus/{target} holds the seeds");
    for file in corpus
        .iter()
        .chain(&inputs(&root.join("regressions").join(target)))
    {
        let data = std::fs::read(file).expect("readable");
        // The file's name in the panic message says which input broke.
        let result = std::panic::catch_unwind(|| run(&data));
        assert!(result.is_ok(), "{target}: {} fails", file.display());
    }
}

#[test]
fn every_target_has_a_corpus_and_this_test() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let source = include_str!("fuzz_corpus.rs");
    for (name, _) in harness::TARGETS {
        assert!(
            root.join("fuzz_targets")
                .join(format!("{name}.rs"))
                .is_file(),
            "fuzz/fuzz_targets/{name}.rs"
        );
        assert!(
            source.contains(&format!("fn {name}()")),
            "a test for {name}"
        );
    }
}

#[test]
fn config_route() {
    replay("config_route");
}

#[test]
fn config_gateway() {
    replay("config_gateway");
}

#[test]
fn request_body() {
    replay("request_body");
}

#[test]
fn reject_rules() {
    replay("reject_rules");
}

#[test]
fn sse_pipeline() {
    replay("sse_pipeline");
}

#[test]
fn prio_header() {
    replay("prio_header");
}

#[test]
fn bodylog_frame() {
    replay("bodylog_frame");
}

#[test]
fn store_binding() {
    replay("store_binding");
}
