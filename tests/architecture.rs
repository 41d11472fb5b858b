//! ARCHITECTURE.md is the map of the code; this holds it to the code. Every
//! path it names in backticks must exist, and every Rust name it gives
//! (`Gateway::admit`, `SessionTable`, `head_complete`) must be defined in the
//! tree, so a move or a rename that forgets the map fails here. Whether a
//! phase is described correctly is still for a reader; the arrows between
//! modules are checked by tests/layering.rs.

use regex::Regex;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Names the map uses that belong to other crates (Pingora, std, tokio,
/// notify) or are not code at all.
const OUTSIDE: &[&str] = &[
    "Arc",
    "ArcSwap",
    "BackgroundService",
    "CTX",
    "None",
    "ReadTimedout",
    "ServerApp",
    "Upgrade",
    "http",
    "notify",
    "select!",
    "include_str!",
    "dev",
    // A variable of the `dev` script, not of the Rust code.
    "FUZZ_TARGETS",
];

/// Backticked tokens with a `/` that are not paths.
const NOT_PATHS: &[&str] = &["group/name"];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        if name == "target" || name == ".git" || name == "node_modules" {
            continue;
        }
        if path.is_dir() {
            files(&path, out);
        } else {
            out.push(path);
        }
    }
}

/// Every Rust source of the workspace and the fuzz harness.
fn rust_sources(root: &Path) -> String {
    let mut all = Vec::new();
    for dir in ["src", "crates", "fuzz", "tests", "benches"] {
        files(&root.join(dir), &mut all);
    }
    all.iter()
        .filter(|p| p.extension().is_some_and(|e| e == "rs"))
        .map(|p| std::fs::read_to_string(p).unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n")
}

/// Whether `name` is defined in `sources`: an item, a method, a field or an
/// enum variant.
fn defined(sources: &str, name: &str) -> bool {
    let name = regex::escape(name.trim_end_matches("()"));
    let item = format!(r"\b(fn|struct|enum|trait|type|const|static|mod|macro_rules!)\s+{name}\b");
    let member = format!(r"(?m)^\s*(pub(\([^)]*\))?\s+)?{name}\s*[:,({{]");
    Regex::new(&item).unwrap().is_match(sources) || Regex::new(&member).unwrap().is_match(sources)
}

/// The source roots a module path (`proxy/conn/`, `placement/rules.rs`) is
/// relative to: the gateway's and its pure core's.
const SOURCE_ROOTS: [&str; 2] = ["src", "crates/core/src"];

/// Whether `token` names an existing file or directory: from the root,
/// from a source root, or, for a bare file name, anywhere under one. A
/// template (`fuzz/corpus/<target>/`) is checked up to its first placeholder.
fn exists(root: &Path, token: &str, src_files: &[PathBuf]) -> bool {
    let token = token.split('<').next().unwrap_or(token);
    let under_a_root = SOURCE_ROOTS
        .iter()
        .any(|r| root.join(r).join(token).exists());
    if root.join(token).exists() || under_a_root {
        return true;
    }
    !token.contains('/') && src_files.iter().any(|p| p.ends_with(token))
}

/// What the map names that the tree does not have.
fn missing(map: &str, root: &Path) -> Vec<String> {
    let sources = rust_sources(root);
    let mut src_files = Vec::new();
    for r in SOURCE_ROOTS {
        files(&root.join(r), &mut src_files);
    }
    let ident =
        Regex::new(r"^[A-Za-z_][A-Za-z0-9_]*(::[A-Za-z_][A-Za-z0-9_]*)*(\(\))?!?$").unwrap();
    let pathlike = Regex::new(
        r"^[A-Za-z0-9_.][A-Za-z0-9_./<>-]*(/|\.(rs|html|md|toml|yaml|py|sh))(::[a-z_]+)?$",
    )
    .unwrap();
    let tokens: BTreeSet<&str> = Regex::new(r"`([^`\n]+)`")
        .unwrap()
        .captures_iter(map)
        .filter_map(|c| c.get(1).map(|m| m.as_str()))
        .collect();
    let mut out = Vec::new();
    for token in tokens {
        if OUTSIDE.contains(&token) || NOT_PATHS.contains(&token) {
            continue;
        }
        if pathlike.is_match(token) && (token.contains('/') || token.contains('.')) {
            let (path, item) = token.split_once("::").unwrap_or((token, ""));
            if !exists(root, path, &src_files) {
                out.push(format!("path {token}"));
            } else if !item.is_empty() && !defined(&sources, item) {
                out.push(format!("name {token}"));
            }
        } else if ident.is_match(token) {
            for part in token.trim_end_matches('!').split("::") {
                if !defined(&sources, part) {
                    out.push(format!("name {token}"));
                    break;
                }
            }
        }
    }
    out
}

#[test]
fn every_path_and_name_the_architecture_map_gives_exists() {
    let root = root();
    let map = std::fs::read_to_string(root.join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let missing = missing(&map, &root);
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md names what the tree does not have: {missing:#?}"
    );
}

#[test]
fn the_check_finds_a_moved_file_and_a_renamed_function() {
    // Control: the same check on a map that names one real and one gone
    // thing of each kind reports exactly the gone ones.
    let map = "`proxy/conn/` `proxy/gone.rs` `head_complete` `head_was_complete` \
               `SessionTable::adopt` `SessionTable::adopt_all` `balance/shared.rs::place_agreed` \
               `balance/shared.rs::place_agreed_later` `fuzz/corpus/<target>/` `nowhere/<x>/`";
    assert_eq!(
        missing(map, &root()),
        [
            "name SessionTable::adopt_all",
            "name balance/shared.rs::place_agreed_later",
            "name head_was_complete",
            "path nowhere/<x>/",
            "path proxy/gone.rs",
        ]
    );
}
