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

/// A Cargo.lock's packages: name → (version, the names it depends on).
fn lock_packages(text: &str) -> Vec<(String, String, Vec<String>)> {
    let field = |block: &str, key: &str| {
        block
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{key} = \"")))
            .map(|v| v.trim_end_matches('"').to_string())
    };
    text.split("[[package]]")
        .skip(1)
        .filter_map(|block| {
            let deps = block
                .split_once("dependencies = [")
                .map(|(_, rest)| rest.split(']').next().unwrap_or_default())
                .unwrap_or_default()
                .lines()
                .filter_map(|l| l.trim().trim_matches([',', '"']).split(' ').next())
                .filter(|d| !d.is_empty())
                .map(str::to_string)
                .collect();
            Some((field(block, "name")?, field(block, "version")?, deps))
        })
        .collect()
}

/// The names under `[dev-dependencies]` of a manifest.
fn dev_dependencies(manifest: &str) -> Vec<String> {
    let mut in_dev = false;
    let mut out = Vec::new();
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            in_dev = line == "[dev-dependencies]";
        } else if in_dev && !line.starts_with('#') {
            if let Some((name, _)) = line.split_once('=') {
                out.push(name.trim().to_string());
            }
        }
    }
    out
}

/// How `fuzz` (fuzz/Cargo.lock) departs from `root` (the workspace's): a
/// package the fuzzed gateway needs that it lacks (the gateway's
/// dependencies, walked in `root` without the workspace members'
/// dev-dependencies), or one both hold at another version.
fn lock_drift(root: &str, fuzz: &str, dev_deps: &[(&str, Vec<String>)]) -> Vec<String> {
    let root = lock_packages(root);
    let fuzz = lock_packages(fuzz);
    let mut drift = Vec::new();
    let mut needed: Vec<String> = vec!["llm-gateway".into()];
    let mut seen = std::collections::BTreeSet::new();
    while let Some(name) = needed.pop() {
        if !seen.insert(name.clone()) {
            continue;
        }
        let dev = dev_deps
            .iter()
            .find(|(member, _)| *member == name)
            .map_or(&[][..], |(_, d)| &d[..]);
        for (_, _, deps) in root.iter().filter(|(n, _, _)| *n == name) {
            needed.extend(deps.iter().filter(|d| !dev.contains(d)).cloned());
        }
    }
    for name in &seen {
        if !fuzz.iter().any(|(n, _, _)| n == name) {
            drift.push(format!("{name} missing"));
        }
    }
    for (name, version, _) in &fuzz {
        let in_root: Vec<&String> = root
            .iter()
            .filter(|(n, _, _)| n == name)
            .map(|(_, v, _)| v)
            .collect();
        if !in_root.is_empty() && !in_root.contains(&version) {
            drift.push(format!("{name} {version}, the workspace has {in_root:?}"));
        }
    }
    drift
}

/// `./dev fuzz-lock` (in `.ci/run`) asks cargo whether fuzz/Cargo.lock is
/// complete for its manifests; this, offline, whether it resolves the
/// gateway as the workspace does.
#[test]
fn the_fuzz_lock_file_has_not_drifted_from_the_workspaces() {
    let root_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let read = |p: &str| std::fs::read_to_string(root_dir.join(p)).expect(p);
    let dev_deps: Vec<(&str, Vec<String>)> = [
        ("llm-gateway", "Cargo.toml"),
        ("llm-gateway-core", "crates/core/Cargo.toml"),
        ("llm-gateway-prom", "crates/prom/Cargo.toml"),
        ("llm-gateway-sim", "crates/sim/Cargo.toml"),
        ("llm-gateway-bench", "crates/bench/Cargo.toml"),
    ]
    .into_iter()
    .map(|(name, manifest)| (name, dev_dependencies(&read(manifest))))
    .collect();
    let (root, fuzz) = (read("Cargo.lock"), read("fuzz/Cargo.lock"));
    let drift = lock_drift(&root, &fuzz, &dev_deps);
    assert!(
        drift.is_empty(),
        "fuzz/Cargo.lock has drifted (./dev fuzz-lock --update):\n{}",
        drift.join("\n")
    );
    // Control: a package gone from it, and one at another version, are seen.
    let without_ring = fuzz.replacen("name = \"ring\"", "name = \"not-ring\"", 1);
    assert!(lock_drift(&root, &without_ring, &dev_deps).contains(&"ring missing".to_string()));
    let (name, version, _) = lock_packages(&fuzz)
        .into_iter()
        .find(|(n, _, _)| n == "bytes")
        .expect("bytes in fuzz/Cargo.lock");
    let older = fuzz.replacen(
        &format!("name = \"{name}\"\nversion = \"{version}\""),
        &format!("name = \"{name}\"\nversion = \"0.0.1\""),
        1,
    );
    assert_eq!(lock_drift(&root, &older, &dev_deps).len(), 1, "bytes 0.0.1");
}
