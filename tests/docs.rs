//! The documentation holds together. Every relative link and image in
//! README.md, BENCHMARKS.md, ARCHITECTURE.md and docs/**/*.md points at a
//! file that exists, and a `#fragment` at a heading of its target, slugged as
//! GitHub and mdBook make them. Every page under docs/src is reachable from
//! the book's SUMMARY.md, and a link in the book stays inside docs/src (the
//! built book has nothing else). The README's first commands are the ones
//! `./dev` has and `.ci/run` runs. Each check runs on the repository and, as
//! its control, on a small tree with the defect planted.
//!
//! The Markdown is parsed with pulldown-cmark (the parser mdBook itself uses),
//! so a link inside a code span, a reference-style link or an image is what
//! the renderers take it for.

use pulldown_cmark::{Event, HeadingLevel, Options, Parser, Tag, TagEnd};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The book's sources, relative to the repository root.
const BOOK_SRC: &str = "docs/src";

/// Where the book is built (`./dev book`); not sources.
const BOOK_OUT: &str = "docs/book";

/// A heading's anchor as GitHub and mdBook make it: lowercased, letters,
/// digits, `_` and `-` kept, each whitespace character a `-`, the rest
/// dropped.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            c if c.is_alphanumeric() || c == '_' || c == '-' => Some(c),
            c if c.is_whitespace() => Some('-'),
            _ => None,
        })
        .collect()
}

fn markdown_options() -> Options {
    Options::ENABLE_TABLES
        | Options::ENABLE_FOOTNOTES
        | Options::ENABLE_STRIKETHROUGH
        | Options::ENABLE_HEADING_ATTRIBUTES
}

/// What a page offers and what it points at.
#[derive(Default)]
struct Page {
    /// Heading anchors; a repeated heading gets `-1`, `-2`, … as both renderers do.
    anchors: BTreeSet<String>,
    /// Link and image destinations, as written.
    links: Vec<String>,
    /// The text of each fenced or indented code block, in order.
    code_blocks: Vec<String>,
}

fn parse(text: &str) -> Page {
    let mut page = Page::default();
    let mut heading: Option<(String, Option<String>)> = None;
    let mut code: Option<String> = None;
    for event in Parser::new_ext(text, markdown_options()) {
        match event {
            Event::Start(Tag::Heading { id, .. }) => {
                heading = Some((String::new(), id.map(|id| id.to_string())));
            }
            Event::End(TagEnd::Heading(_)) => {
                if let Some((words, id)) = heading.take() {
                    let base = id.unwrap_or_else(|| slug(&words));
                    let mut anchor = base.clone();
                    let mut n = 0;
                    while !page.anchors.insert(anchor.clone()) {
                        n += 1;
                        anchor = format!("{base}-{n}");
                    }
                }
            }
            Event::Text(t) | Event::Code(t) => {
                if let Some((words, _)) = heading.as_mut() {
                    words.push_str(&t);
                }
                if let Some(block) = code.as_mut() {
                    block.push_str(&t);
                }
            }
            Event::Start(Tag::Link { dest_url, .. })
            | Event::Start(Tag::Image { dest_url, .. }) => {
                page.links.push(dest_url.to_string());
            }
            Event::Start(Tag::CodeBlock(_)) => code = Some(String::new()),
            Event::End(TagEnd::CodeBlock) => page.code_blocks.extend(code.take()),
            _ => {}
        }
    }
    page
}

/// A destination that leaves the repository (a URL, a mail address).
fn is_external(dest: &str) -> bool {
    dest.contains("://") || dest.starts_with("mailto:")
}

/// `path` with `.` and `..` taken out, without asking the file system (a
/// symbolic link stays where it is written).
fn lexical(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// Reads and parses Markdown files once each.
#[derive(Default)]
struct Pages(BTreeMap<PathBuf, Option<Page>>);

impl Pages {
    fn get(&mut self, path: &Path) -> Option<&Page> {
        self.0
            .entry(path.to_path_buf())
            .or_insert_with(|| std::fs::read_to_string(path).ok().map(|t| parse(&t)))
            .as_ref()
    }
}

/// Every relative link of the page at `file` (under `root`) that resolves to
/// nothing, or to a file without the heading its fragment names. `inside`:
/// the directory the links must not leave.
fn link_problems(
    root: &Path,
    file: &Path,
    inside: Option<&Path>,
    pages: &mut Pages,
) -> Vec<String> {
    let at = file
        .strip_prefix(root)
        .unwrap_or(file)
        .display()
        .to_string();
    let Some(links) = pages.get(file).map(|p| p.links.clone()) else {
        return vec![format!("{at}: cannot be read")];
    };
    let mut problems = Vec::new();
    for dest in links {
        if is_external(&dest) {
            continue;
        }
        let (path, fragment) = dest.split_once('#').unwrap_or((dest.as_str(), ""));
        let target = if path.is_empty() {
            file.to_path_buf()
        } else if path.starts_with('/') {
            problems.push(format!("{at}: `{dest}` is absolute; links are relative"));
            continue;
        } else {
            lexical(&file.parent().unwrap_or(root).join(path))
        };
        if let Some(inside) = inside {
            if !target.starts_with(inside) {
                problems.push(format!(
                    "{at}: `{dest}` leaves {}, which is all the built book has",
                    inside.strip_prefix(root).unwrap_or(inside).display()
                ));
                continue;
            }
        }
        if !target.exists() {
            problems.push(format!("{at}: `{dest}` points at no file"));
            continue;
        }
        if fragment.is_empty() {
            continue;
        }
        if target.extension().and_then(|e| e.to_str()) != Some("md") {
            problems.push(format!(
                "{at}: `{dest}` has a fragment into a file that is not Markdown"
            ));
            continue;
        }
        let found = pages
            .get(&target)
            .is_some_and(|page| page.anchors.contains(fragment));
        if !found {
            problems.push(format!("{at}: `{dest}` names no heading of its target"));
        }
    }
    problems
}

/// The Markdown files the link check reads: the three at the root and every
/// one under docs/ (regular files; the book's symbolic links are read as
/// the chapters they are, below).
fn repository_docs(root: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = ["README.md", "BENCHMARKS.md", "ARCHITECTURE.md"]
        .iter()
        .map(|f| root.join(f))
        .collect();
    let out = root.join(BOOK_OUT);
    for entry in walkdir::WalkDir::new(root.join("docs"))
        .into_iter()
        .filter_entry(|e| e.path() != out)
    {
        let entry = entry.unwrap_or_else(|e| panic!("walking docs/: {e}"));
        if entry.file_type().is_file() && entry.path().extension().is_some_and(|e| e == "md") {
            files.push(entry.into_path());
        }
    }
    files
}

/// What is wrong with the book: chapters SUMMARY.md names that do not exist,
/// pages under its source that no chapter is, and a chapter's links that
/// break or leave the source (read where the chapter is, so a chapter that
/// is a symbolic link is held to the book's paths).
fn book_problems(root: &Path, pages: &mut Pages) -> Vec<String> {
    let src = root.join(BOOK_SRC);
    let summary = src.join("SUMMARY.md");
    let mut problems = link_problems(root, &summary, Some(&src), pages);
    let chapters: BTreeSet<PathBuf> = pages
        .get(&summary)
        .map(|p| p.links.clone())
        .unwrap_or_default()
        .iter()
        .filter(|dest| !dest.is_empty() && !is_external(dest))
        .map(|dest| lexical(&src.join(dest.split('#').next().unwrap_or(dest))))
        .collect();
    for chapter in &chapters {
        if chapter.exists() {
            problems.extend(link_problems(root, chapter, Some(&src), pages));
        }
    }
    for entry in walkdir::WalkDir::new(&src) {
        let entry = entry.unwrap_or_else(|e| panic!("walking {BOOK_SRC}: {e}"));
        let path = entry.path();
        let is_page = !entry.file_type().is_dir() && path.extension().is_some_and(|e| e == "md");
        if is_page && path != summary && !chapters.contains(path) {
            problems.push(format!(
                "{}: no chapter of SUMMARY.md, so no reader of the book reaches it",
                path.strip_prefix(root).unwrap_or(path).display()
            ));
        }
    }
    problems
}

/// Every documentation problem under `root`.
fn problems(root: &Path) -> Vec<String> {
    let mut pages = Pages::default();
    let mut out = Vec::new();
    for file in repository_docs(root) {
        out.extend(link_problems(root, &file, None, &mut pages));
    }
    out.extend(book_problems(root, &mut pages));
    out.sort();
    out.dedup();
    out
}

#[test]
fn every_link_resolves_and_every_page_of_the_book_is_reachable() {
    let root = root();
    let checked = repository_docs(&root);
    assert!(
        checked.len() > 30,
        "the walk finds the book's pages: {checked:?}"
    );
    let problems = problems(&root);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Writes `files` (path → text) under a fresh directory.
fn tree(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    for (path, text) in files {
        let path = dir.path().join(path);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(path, text).expect("write");
    }
    dir
}

const SOUND_BOOK: &[(&str, &str)] = &[
    (
        "README.md",
        "# Fixture\n\nSee [the guide](docs/src/guide.md#the-two-commands), \
         [the site](https://example.com/x.md#nothing) and [below](#fixture).\n",
    ),
    (
        "BENCHMARKS.md",
        "# Results\n\n![a plot](docs/bench/plot.svg)\n",
    ),
    ("ARCHITECTURE.md", "# Map\n\n[README](README.md)\n"),
    ("docs/bench/plot.svg", "<svg/>"),
    ("docs/src/SUMMARY.md", "# Summary\n\n- [Guide](guide.md)\n"),
    (
        "docs/src/guide.md",
        "# Guide\n\n## The two commands\n\n## The two commands\n\n\
         [again](#the-two-commands-1), `[not a link](nowhere.md)`\n",
    ),
];

#[test]
fn a_sound_tree_has_no_problem() {
    let dir = tree(SOUND_BOOK);
    assert_eq!(problems(dir.path()), Vec::<String>::new());
}

/// The same tree with one defect planted at a time: each is reported, once,
/// naming the file and the link.
#[test]
fn a_planted_broken_link_fragment_orphan_or_escape_is_reported() {
    let planted: &[(&str, &str, &str)] = &[
        (
            "README.md",
            "# Fixture\n\n[gone](docs/src/gone.md)\n",
            "README.md: `docs/src/gone.md` points at no file",
        ),
        (
            "README.md",
            "# Fixture\n\n[bad anchor](docs/src/guide.md#three-commands)\n",
            "README.md: `docs/src/guide.md#three-commands` names no heading of its target",
        ),
        (
            "BENCHMARKS.md",
            "# Results\n\n![a plot](docs/bench/missing.svg)\n",
            "BENCHMARKS.md: `docs/bench/missing.svg` points at no file",
        ),
        (
            "docs/src/orphan.md",
            "# Orphan\n",
            "docs/src/orphan.md: no chapter of SUMMARY.md",
        ),
        (
            "docs/src/guide.md",
            "# Guide\n\n## The two commands\n\n[the map](../../ARCHITECTURE.md)\n",
            "docs/src/guide.md: `../../ARCHITECTURE.md` leaves docs/src",
        ),
        (
            "docs/src/SUMMARY.md",
            "# Summary\n\n- [Guide](guide.md)\n- [Missing](missing.md)\n",
            "docs/src/SUMMARY.md: `missing.md` points at no file",
        ),
        (
            "docs/bench/history/old.md",
            "# Old\n\n[up](../plot.svg) [page](../../../BENCHMARKS.md#nothing-here)\n",
            "docs/bench/history/old.md: `../../../BENCHMARKS.md#nothing-here` names no heading",
        ),
    ];
    for (path, text, expected) in planted {
        let mut files: BTreeMap<&str, &str> = SOUND_BOOK.iter().copied().collect();
        files.insert(path, text);
        let files: Vec<(&str, &str)> = files.into_iter().collect();
        let dir = tree(&files);
        let found = problems(dir.path());
        assert!(
            found.len() == 1 && found[0].starts_with(expected),
            "planted in {path}, expected {expected:?}, got {found:#?}"
        );
    }
}

#[test]
fn slugs_are_the_renderers() {
    assert_eq!(
        slug("Per-route endpoints (main listener)"),
        "per-route-endpoints-main-listener"
    );
    assert_eq!(
        slug("Scale (issue 12): 5,000 slow streams held, next to nginx"),
        "scale-issue-12-5000-slow-streams-held-next-to-nginx"
    );
    assert_eq!(
        slug("A real engine: llama.cpp's llama-server (issue 32)"),
        "a-real-engine-llamacpps-llama-server-issue-32"
    );
    // Code spans count by their text.
    let page = parse("# `peers_from: {dns: NAME, port: N}`\n\n# Über uns\n");
    assert_eq!(
        page.anchors,
        BTreeSet::from(["peers_from-dns-name-port-n".into(), "über-uns".into()])
    );
}

/// The `./dev` commands: the arms of its closing `case`.
fn dev_commands(dev: &str) -> BTreeSet<String> {
    let dispatch = dev.rsplit_once("case \"${1:-}\" in").map_or("", |(_, d)| d);
    dispatch
        .lines()
        .filter_map(|line| {
            let arm = line.trim().split_once(')')?.0;
            let name = arm.trim();
            (!name.is_empty() && name.chars().all(|c| c.is_ascii_lowercase() || c == '-'))
                .then(|| name.to_string())
        })
        .collect()
}

/// `./dev X` commands a script runs (comments left out).
fn dev_calls(script: &str) -> Vec<String> {
    script
        .lines()
        .map(|line| line.split('#').next().unwrap_or("").trim())
        .filter_map(|line| line.strip_prefix("./dev "))
        .filter_map(|rest| rest.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

/// The commands of the README's first block, when it is the first thing
/// under its title: `./dev demo`, `./dev test`.
fn first_commands(readme: &str) -> Vec<String> {
    let mut events = Parser::new_ext(readme, markdown_options())
        .filter(|e| !matches!(e, Event::SoftBreak | Event::HardBreak));
    let mut block = None;
    let mut in_title = false;
    for event in events.by_ref() {
        match event {
            Event::Start(Tag::Heading {
                level: HeadingLevel::H1,
                ..
            }) => in_title = true,
            Event::End(TagEnd::Heading(_)) => in_title = false,
            _ if in_title => {}
            Event::Start(Tag::CodeBlock(_)) => {
                block = Some(String::new());
                break;
            }
            _ => break,
        }
    }
    let Some(mut block) = block else {
        return Vec::new();
    };
    for event in events {
        match event {
            Event::Text(t) => block.push_str(&t),
            Event::End(TagEnd::CodeBlock) => break,
            _ => {}
        }
    }
    block
        .lines()
        .map(|line| line.split('#').next().unwrap_or("").trim().to_string())
        .filter(|line| !line.is_empty())
        .collect()
}

#[test]
fn the_readme_starts_with_the_commands_dev_has_and_ci_runs() {
    let root = root();
    let readme = read(&root.join("README.md"));
    let dev = dev_commands(&read(&root.join("dev")));
    let ci = dev_calls(&read(&root.join(".ci/run")));
    assert_eq!(first_commands(&readme), ["./dev demo", "./dev test"]);
    assert!(dev.contains("demo") && dev.contains("test"), "{dev:?}");
    // "CI runs exactly this via .ci/run", and builds the book.
    assert!(ci.iter().any(|c| c == "test"), "{ci:?}");
    assert!(ci.iter().any(|c| c == "book"), "{ci:?}");
    for call in &ci {
        assert!(
            dev.contains(call),
            ".ci/run calls ./dev {call}, which ./dev lacks"
        );
    }
    // Every `./dev X` the README and the book name is one ./dev has.
    let mut named = BTreeSet::new();
    let mut docs = vec![root.join("README.md")];
    docs.extend(
        repository_docs(&root)
            .into_iter()
            .filter(|p| p.starts_with(root.join(BOOK_SRC))),
    );
    for file in docs {
        let page = parse(&read(&file));
        for block in page.code_blocks {
            named.extend(dev_calls(&block));
        }
    }
    assert!(named.len() >= 5, "{named:?}");
    let missing: Vec<_> = named.iter().filter(|c| !dev.contains(*c)).collect();
    assert!(
        missing.is_empty(),
        "the docs name ./dev {missing:?}, which ./dev lacks"
    );
}

/// The controls of the command checks: a README whose first block is not
/// the commands, or comes after prose, and scripts that call other commands.
#[test]
fn commands_out_of_place_are_seen() {
    assert_eq!(
        first_commands("# T\n\n```sh\n./dev demo   # x\n./dev test\n```\n"),
        ["./dev demo", "./dev test"]
    );
    assert_eq!(
        first_commands("# T\n\nSome words.\n\n```sh\n./dev demo\n```\n"),
        Vec::<String>::new()
    );
    assert_eq!(
        first_commands("# T\n\n```sh\ncargo test\n```\n"),
        ["cargo test"]
    );
    let dev = "f() {\n  case $x in\n    a) ;;\n  esac\n}\ncase \"${1:-}\" in\n  deps) deps ;;\n  demo) run ;;\n  fuzz-merge) shift ;;\n  *) usage ;;\nesac\n";
    assert_eq!(
        dev_commands(dev),
        BTreeSet::from(["demo".into(), "deps".into(), "fuzz-merge".into()])
    );
    assert_eq!(
        dev_calls("./dev deps\n# ./dev lint\n./dev test --x\ncargo fmt\n"),
        ["deps", "test"]
    );
}
