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
