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

/// The modules that take time and I/O as arguments, never from the world:
/// their tests inject both. ARCHITECTURE.md's "Arrows" names them.
const PURE: [&str; 9] = [
    "json_bytes",
    "placement",
    "protect",
    "reject",
    "rewrite",
    "stream",
    "request_view",
    "session",
    "hash",
];

/// What a pure module may not name: the modules above it, and the runtime,
/// the proxy framework and the clock.
const ABOVE_PURE: [&str; 14] = [
    "crate::proxy",
    "crate::balance",
    "crate::registry",
    "crate::admin",
    "crate::health",
    "crate::controller",
    "crate::server",
    "crate::store",
    "crate::bodylog",
    "crate::config",
    "crate::metrics",
    "crate::lifecycle",
    "crate::clock",
    "crate::watch",
];
const WORLD: [&str; 4] = ["pingora", "tokio", "Instant::now", "SystemTime::now"];

/// Where a pure module still reads the clock, with the reason it is allowed
/// until the pure core becomes a crate of its own.
const CLOCK_READ_UNTIL_THE_CORE_CRATE: [&str; 1] = [
    // The first and last content frame are stamped where they are seen.
    "stream/pipeline.rs",
];

/// The code of `path`, comments left out (a doc comment may name anything).
fn code_of(path: &Path) -> String {
    std::fs::read_to_string(path)
        .expect("readable source file")
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Each file under the module `module` (a directory, a file, or both) that
/// names one of `forbidden`, with what it names.
fn offenders(module: &str, forbidden: &[&str]) -> Vec<String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    if src.join(module).is_dir() {
        rust_files(&src.join(module), &mut files);
    }
    if src.join(format!("{module}.rs")).is_file() {
        files.push(src.join(format!("{module}.rs")));
    }
    assert!(!files.is_empty(), "module {module} has no files");
    let mut out = Vec::new();
    for file in files {
        let code = code_of(&file);
        for name in forbidden.iter().filter(|n| code.contains(*n)) {
            let shown = file.strip_prefix(&src).unwrap_or(&file).display();
            out.push(format!("{shown} names {name}"));
        }
    }
    out
}

#[test]
fn the_architecture_maps_arrows_hold() {
    let mut found = Vec::new();
    for module in PURE {
        found.extend(offenders(module, &ABOVE_PURE));
        found.extend(offenders(module, &WORLD).into_iter().filter(|o| {
            !CLOCK_READ_UNTIL_THE_CORE_CRATE
                .iter()
                .any(|f| o.starts_with(f))
        }));
    }
    // The admin listener and the body log never reach into the proxy.
    found.extend(offenders("admin", &["crate::proxy"]));
    found.extend(offenders("bodylog", &["crate::proxy"]));
    assert!(found.is_empty(), "arrows broken: {found:#?}");
    // Control: the scan sees an arrow that does exist.
    assert!(!offenders("proxy", &["crate::balance"]).is_empty());
    assert!(!offenders("stream", &["Instant::now"]).is_empty());
}

#[test]
fn the_session_store_knows_nothing_of_routes() {
    let above = [
        "crate::registry",
        "crate::balance",
        "crate::placement",
        "crate::proxy",
    ];
    let found = offenders("store", &above);
    assert!(found.is_empty(), "store reaches up: {found:#?}");
    // Control: the cluster sync, which bridges the two, does name the registry.
    assert!(!offenders("balance", &["crate::registry"]).is_empty());
}
