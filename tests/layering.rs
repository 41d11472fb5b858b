//! The simulator and the bench are tools the binary carries; the gateway
//! library must never depend on them (they are not on the request path and
//! must not become so). Only the binary's own modules may name them.

use std::path::{Path, PathBuf};

/// The binary's modules: `main.rs` declares them, the library does not.
const BINARY_ONLY: [&str; 3] = ["main.rs", "cli.rs", "demo.rs"];
const TOOL_CRATES: [&str; 2] = ["llm_gateway_sim", "llm_gateway_bench"];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("readable source dir") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn mentions_a_tool(path: &Path) -> bool {
    let text = std::fs::read_to_string(path).expect("readable source file");
    TOOL_CRATES.iter().any(|c| text.contains(c))
}

#[test]
fn no_library_module_uses_the_simulator_or_the_bench() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let library: Vec<&PathBuf> = files
        .iter()
        .filter(|p| {
            p.parent() != Some(src.as_path()) || !BINARY_ONLY.iter().any(|b| p.ends_with(b))
        })
        .collect();
    assert!(
        library.len() > 20,
        "the scan must see the library: {library:?}"
    );
    let offenders: Vec<&&PathBuf> = library.iter().filter(|p| mentions_a_tool(p)).collect();
    assert!(
        offenders.is_empty(),
        "library modules using a tool crate: {offenders:?}"
    );
    // Control: the binary does use them, so the scan would see a use.
    assert!(mentions_a_tool(&src.join("main.rs")));
}

/// The code of `path`, comments and its `#[cfg(test)]` tail left out (a doc
/// comment may name anything, and a test may read the clock).
fn code_of(path: &Path) -> String {
    let text = std::fs::read_to_string(path).expect("readable source file");
    if path.ends_with("tests.rs") {
        return String::new();
    }
    text.lines()
        .take_while(|l| l.trim() != "#[cfg(test)]")
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Each file under `dir` (relative to the workspace) that names one of
/// `forbidden`, with what it names.
fn offenders(dir: &str, forbidden: &[&str]) -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    if root.join(dir).is_dir() {
        rust_files(&root.join(dir), &mut files);
    }
    if root.join(format!("{dir}.rs")).is_file() {
        files.push(root.join(format!("{dir}.rs")));
    }
    assert!(!files.is_empty(), "{dir} has no files");
    let mut out = Vec::new();
    for file in files {
        let code = code_of(&file);
        for name in forbidden.iter().filter(|n| code.contains(*n)) {
            let shown = file.strip_prefix(root).unwrap_or(&file).display();
            out.push(format!("{shown} names {name}"));
        }
    }
    out
}

/// The pure core (`crates/core`) cannot name the gateway's modules, pingora
/// or tokio: they are not its dependencies, and the compiler refuses. What
/// the compiler cannot refuse: the standard library's clock, and a
/// dependency added to its Cargo.toml.
#[test]
fn the_pure_core_reads_no_clock_and_depends_on_no_runtime() {
    let clock = ["Instant::now", "SystemTime::now"];
    let found = offenders("crates/core/src", &clock);
    assert!(found.is_empty(), "the core reads the clock: {found:#?}");
    // Control: the gateway itself does read it, and the scan sees that.
    assert!(!offenders("src/clock", &clock).is_empty());

    let manifest = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/core/Cargo.toml"),
    )
    .expect("crates/core/Cargo.toml");
    let deps = manifest
        .split("[dependencies]")
        .nth(1)
        .and_then(|rest| rest.split("\n[").next())
        .expect("a [dependencies] table");
    for runtime in ["pingora", "tokio", "llm-gateway"] {
        let named = deps.lines().any(|l| l.trim_start().starts_with(runtime));
        assert!(!named, "crates/core depends on {runtime}");
    }
    assert!(deps.contains("serde_json"), "the table was read: {deps}");
}

#[test]
fn the_architecture_maps_arrows_hold() {
    // The admin listener and the body log never reach into the proxy.
    let mut found = offenders("src/admin", &["crate::proxy"]);
    found.extend(offenders("src/bodylog", &["crate::proxy"]));
    assert!(found.is_empty(), "arrows broken: {found:#?}");
    // Control: the scan sees an arrow that does exist.
    assert!(!offenders("src/proxy", &["crate::balance"]).is_empty());
}

#[test]
fn the_session_store_knows_nothing_of_routes() {
    let above = [
        "crate::registry",
        "crate::balance",
        "crate::placement",
        "crate::proxy",
    ];
    let found = offenders("src/store", &above);
    assert!(found.is_empty(), "store reaches up: {found:#?}");
    // Control: the cluster sync, which bridges the two, does name the registry.
    assert!(!offenders("src/balance", &["crate::registry"]).is_empty());
}
