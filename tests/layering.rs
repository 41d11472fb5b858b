//! The house's arrows, read from the code as Rust (tests/layering/imports.rs
//! draws which file uses which): no file of any crate of the workspace
//! imports another around a circle; the gateway library never uses the
//! simulator or the bench (tools the binary carries, not on the request
//! path); the pure core reads no clock and depends on no runtime; the admin
//! listener and the body log never reach into the proxy; the session store
//! knows nothing of routes. And no source file grows past 800 lines.

#[path = "layering/imports.rs"]
mod imports;

use imports::{circles, Crate, Target};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

fn workspace() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// One crate of the workspace, read.
struct Read {
    /// Its root file, relative to the workspace (`crates/core/src/lib.rs`).
    root: String,
    krate: Crate,
}

/// Every crate of the workspace: the gateway's library and binary
/// (`src/lib.rs`, `src/main.rs`) and each `crates/*/src/{lib,main}.rs`.
fn workspace_crates() -> &'static [Read] {
    static CRATES: OnceLock<Vec<Read>> = OnceLock::new();
    CRATES.get_or_init(|| {
        // syn's parser and visitor recurse as deep as an expression nests:
        // more than a test thread's stack in a debug build.
        std::thread::Builder::new()
            .stack_size(256 << 20)
            .spawn(read_workspace)
            .expect("a thread")
            .join()
            .expect("the workspace read")
    })
}

fn read_workspace() -> Vec<Read> {
    {
        let mut dirs = vec![PathBuf::from("src")];
        let mut members: Vec<PathBuf> = std::fs::read_dir(workspace().join("crates"))
            .expect("crates/")
            .map(|e| e.expect("a dir entry").path())
            .filter(|p| p.join("Cargo.toml").is_file())
            .map(|p| p.strip_prefix(workspace()).expect("inside").join("src"))
            .collect();
        members.sort();
        dirs.extend(members);
        let mut crates = Vec::new();
        for dir in dirs {
            for root in ["lib.rs", "main.rs"] {
                let root = dir.join(root);
                if workspace().join(&root).is_file() {
                    let krate = Crate::read(&workspace().join(&root))
                        .unwrap_or_else(|e| panic!("reading {}: {}", root.display(), e.0));
                    crates.push(Read {
                        root: root.display().to_string(),
                        krate,
                    });
                }
            }
        }
        crates
    }
}

fn the_crate(root: &str) -> &'static Crate {
    &workspace_crates()
        .iter()
        .find(|c| c.root == root)
        .unwrap_or_else(|| panic!("no crate {root}"))
        .krate
}

/// A crate's `src` directory relative to the workspace, to show with its
/// file names.
fn shown_dir(krate: &Crate) -> String {
    let dir = krate.src.strip_prefix(workspace()).unwrap_or(&krate.src);
    dir.display().to_string()
}

#[test]
fn no_file_imports_another_around_a_circle() {
    let crates = workspace_crates();
    let roots: Vec<&str> = crates.iter().map(|c| c.root.as_str()).collect();
    for expected in ["src/lib.rs", "src/main.rs", "crates/core/src/lib.rs"] {
        assert!(roots.contains(&expected), "{expected} not read: {roots:?}");
    }
    let mut found: Vec<String> = Vec::new();
    for read in crates {
        let arrows = read.krate.arrows();
        assert!(
            read.krate.files.len() < 3 || !arrows.is_empty(),
            "{}: {} files and no arrow between them",
            read.root,
            read.krate.files.len()
        );
        found.extend(shown_circles(&read.krate, &shown_dir(&read.krate)));
    }
    assert!(
        found.is_empty(),
        "{} circles between files:\n{}",
        found.len(),
        found.join("\n")
    );
}

/// Each circle of `krate` as a line, its files named under `dir`.
fn shown_circles(krate: &Crate, dir: &str) -> Vec<String> {
    circles(krate, dir)
        .iter()
        .map(ToString::to_string)
        .collect()
}

fn fixture(name: &str) -> Crate {
    let root = workspace()
        .join("tests/fixtures")
        .join(name)
        .join("src/lib.rs");
    Crate::read(&root).unwrap_or_else(|e| panic!("{name}: {}", e.0))
}

/// The control: circles planted in a fixture are found, one of them behind
/// a `pub use`, and what only a test module names is no arrow.
#[test]
fn a_planted_circle_is_found_also_behind_a_re_export() {
    let planted = fixture("circles");
    assert_eq!(
        shown_circles(&planted, "circles"),
        [
            "circles: direct_a.rs -> direct_b.rs (B) -> direct_a.rs (A)",
            "circles: facade/deep.rs -> hidden.rs (Shallow) -> facade/deep.rs (Deep)",
        ]
    );
    assert!(
        !planted.files.iter().any(|f| f.ends_with("tests.rs")),
        "a #[cfg(test)] module was read: {:?}",
        planted.files
    );
}

/// The other side: a parent module that re-exports its child, which uses
/// the parent, is no circle; nor is a test module that names a user of its
/// file. The arrows it does have are seen.
#[test]
fn a_re_export_and_a_test_module_make_no_circle() {
    let acyclic = fixture("acyclic");
    let found = shown_circles(&acyclic, "acyclic");
    assert!(found.is_empty(), "{found:#?}");
    let arrows: Vec<String> = acyclic
        .arrows()
        .iter()
        .map(|((from, to), names)| {
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            format!(
                "{} -> {} ({})",
                acyclic.name(*from),
                acyclic.name(*to),
                names.join(", ")
            )
        })
        .collect();
    assert_eq!(
        arrows,
        [
            "parent/child.rs -> parent/mod.rs (Parent)",
            "user.rs -> parent/mod.rs (Parent)",
            "user.rs -> parent/child.rs (Child)",
        ]
    );
}

/// Where each reference of the files under `dir` (a prefix of the crate's
/// file names) leads: a file of the crate, or another crate's `a::b::c`.
fn destinations(krate: &Crate, dir: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (file, references) in krate.references.iter().enumerate() {
        let name = krate.name(file);
        if !name.starts_with(dir) {
            continue;
        }
        for target in references {
            let to = match target {
                Target::Item { file, .. } => krate.name(*file),
                Target::Outside(path) => path.join("::"),
                Target::Module => continue,
            };
            out.push((name.clone(), to));
        }
    }
    out
}

/// What files under `dir` name of `forbidden` (each a prefix of a file
/// name of the crate or of another crate's path), one line each.
fn offenders(krate: &Crate, dir: &str, forbidden: &[&str]) -> Vec<String> {
    let mut found: Vec<String> = destinations(krate, dir)
        .into_iter()
        .filter(|(_, to)| forbidden.iter().any(|f| to.starts_with(f)))
        .map(|(from, to)| format!("{from} names {to}"))
        .collect();
    found.dedup();
    found
}

#[test]
fn no_library_module_uses_the_simulator_or_the_bench() {
    let tools = ["llm_gateway_sim", "llm_gateway_bench"];
    let library = the_crate("src/lib.rs");
    assert!(library.files.len() > 20, "the scan must see the library");
    let found = offenders(library, "", &tools);
    assert!(found.is_empty(), "library modules using a tool: {found:#?}");
    // Control: the binary does use them, and the scan sees that.
    assert!(!offenders(the_crate("src/main.rs"), "", &tools).is_empty());
}

/// The pure core (`crates/core`) cannot name the gateway's modules, pingora
/// or tokio: they are not its dependencies, and the compiler refuses. What
/// the compiler cannot refuse: the standard library's clock (a test may
/// read it), and a dependency added to its Cargo.toml.
#[test]
fn the_pure_core_reads_no_clock_and_depends_on_no_runtime() {
    let reads_the_clock = |krate: &Crate, dir: &str| -> Vec<String> {
        destinations(krate, dir)
            .into_iter()
            .filter(|(_, to)| to.ends_with("Instant::now") || to.ends_with("SystemTime::now"))
            .map(|(from, to)| format!("{from} calls {to}"))
            .collect()
    };
    let found = reads_the_clock(the_crate("crates/core/src/lib.rs"), "");
    assert!(found.is_empty(), "the core reads the clock: {found:#?}");
    // Control: the gateway itself does read it, and the scan sees that.
    assert!(!reads_the_clock(the_crate("src/lib.rs"), "clock").is_empty());

    let manifest = std::fs::read_to_string(workspace().join("crates/core/Cargo.toml"))
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
    let gateway = the_crate("src/lib.rs");
    // The admin listener and the body log never reach into the proxy;
    // the access log, the trace context, the span exporter and the TLS
    // certificate store know only the config (and the exporter the access
    // log's line, which its spans are made from).
    let mut found = offenders(gateway, "admin/", &["proxy/"]);
    found.extend(offenders(gateway, "bodylog/", &["proxy/"]));
    for leaf in ["accesslog/", "trace_context.rs", "tls.rs", "otlp/"] {
        found.extend(offenders(
            gateway,
            leaf,
            &["proxy/", "registry/", "balance/"],
        ));
    }
    // TLS to engines is loaded by the config and used by the proxy and
    // the probes: it names none of them.
    found.extend(offenders(
        gateway,
        "engine_tls.rs",
        &["config/", "proxy/", "registry/", "balance/", "health/"],
    ));
    // Tenants are below the proxy and the registry, which both call them.
    found.extend(offenders(gateway, "tenants/", &["proxy/", "registry/"]));
    assert!(found.is_empty(), "arrows broken: {found:#?}");
    // Control: the scan reads them (the trace context and the certificate
    // store name the config).
    assert!(!offenders(gateway, "trace_context.rs", &["config/"]).is_empty());
    assert!(!offenders(gateway, "tls.rs", &["config/"]).is_empty());
    assert!(!offenders(gateway, "otlp/", &["accesslog/"]).is_empty());
    // Control: the scan sees an arrow that does exist.
    assert!(!offenders(gateway, "proxy/", &["balance/"]).is_empty());
}

#[test]
fn the_session_store_knows_nothing_of_routes() {
    let gateway = the_crate("src/lib.rs");
    let above = [
        "registry/",
        "balance/",
        "proxy/",
        "llm_gateway_core::placement",
    ];
    let found = offenders(gateway, "store/", &above);
    assert!(found.is_empty(), "store reaches up: {found:#?}");
    // Control: the cluster sync, which bridges the two, does name the
    // registry, and placement through the core's re-export.
    assert!(!offenders(gateway, "balance/", &["registry/"]).is_empty());
    assert!(!offenders(gateway, "balance/", &["llm_gateway_core::placement"]).is_empty());
}

const MOST_LINES: usize = 800;

/// The files of `files` longer than `limit` lines, longest first.
fn over(files: &[PathBuf], limit: usize) -> Vec<(usize, String)> {
    let mut long: Vec<(usize, String)> = files
        .iter()
        .map(|path| {
            let text = std::fs::read_to_string(path).expect("a readable source file");
            let shown = path.strip_prefix(workspace()).unwrap_or(path);
            (text.lines().count(), shown.display().to_string())
        })
        .filter(|(lines, _)| *lines > limit)
        .collect();
    long.sort_by(|a, b| b.cmp(a));
    long
}

/// Every source file that is not a test's: those the crates' module trees
/// reach outside `#[cfg(test)]`, and the fuzz targets' harness (`fuzz/
/// harness.rs` and the files it includes from `fuzz/harness/`).
#[test]
fn no_source_file_is_over_800_lines() {
    let mut files: Vec<PathBuf> = workspace_crates()
        .iter()
        .flat_map(|c| c.krate.files.iter().cloned())
        .collect();
    files.push(workspace().join("fuzz/harness.rs"));
    let included = std::fs::read_dir(workspace().join("fuzz/harness")).expect("fuzz/harness/");
    files.extend(included.map(|e| e.expect("a dir entry").path()));
    files.sort();
    files.dedup();
    let long = over(&files, MOST_LINES);
    let shown: Vec<String> = long.iter().map(|(n, f)| format!("{n:>6} {f}")).collect();
    assert!(
        long.is_empty(),
        "files over {MOST_LINES} lines:\n{}",
        shown.join("\n")
    );
    // Control: the same count does find long files below the limit.
    assert!(!over(&files, MOST_LINES / 2).is_empty());
}
