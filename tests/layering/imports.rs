//! The file-level import graph of one crate, read with `syn`.
//!
//! A crate is read from its root file (`lib.rs`, `main.rs`) down its `mod`
//! declarations, leaving out whatever is under `#[cfg(test)]` (and with it the
//! `tests.rs` files such a declaration names). Every name a file uses, through
//! a `use` or a path in its code (`crate::…`, `super::…`, `self::…`, a child
//! module's, an imported name's), is resolved to the file that DEFINES the
//! item: a `pub use` is followed through to the definition, because a
//! re-export is a facade, not a dependency of the file that re-exports; a
//! `mod x;` is not an arrow either. Names of other crates end the walk
//! ([`Target::Outside`]): crates cannot form a circle across each other.
//!
//! Hand-written rather than a tool's: cargo-modules and its kind draw the
//! module tree, not which file uses which, and none follows a re-export to
//! the file behind it. The resolution is the part of Rust's that a workspace
//! without glob imports or macro-made items needs: a name a macro makes, or
//! a trait only a `pub use` brings in for its methods, is not seen.

use proc_macro2::{TokenStream, TokenTree};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;
use std::path::{Path, PathBuf};
use syn::visit::Visit;

type ModId = usize;
pub type FileId = usize;

/// One module: the file it is written in, and the names it has.
struct Module {
    file: FileId,
    parent: Option<ModId>,
    /// Where its `mod x;` declarations find their files.
    child_dir: PathBuf,
    children: BTreeMap<String, ModId>,
    names: BTreeMap<String, Vec<Binding>>,
    /// `use a::b::*;`: the paths whose names are all in scope.
    globs: Vec<Vec<String>>,
}

/// What a name of a module stands for.
#[derive(Clone)]
enum Binding {
    /// An item written in the module (so in its file).
    Defined { file: FileId, name: String },
    /// A `use`: a path to resolve from the module that holds it.
    Imported { path: Vec<String>, from: ModId },
}

/// Where a path leads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// The item `name`, defined in `file`.
    Item { file: FileId, name: String },
    /// A module of this crate: naming one is not an arrow.
    Module,
    /// A name of another crate (or of the prelude), as a full path.
    Outside(Vec<String>),
}

/// One crate's source files and the references of each.
pub struct Crate {
    /// The directory the file names are given relative to (`…/src`).
    pub src: PathBuf,
    pub files: Vec<PathBuf>,
    /// Where each name each file uses leads.
    pub references: Vec<Vec<Target>>,
    modules: Vec<Module>,
}

/// What went wrong reading a crate: a file that is missing or does not parse.
#[derive(Debug)]
pub struct ReadError(pub String);

impl Crate {
    /// Reads the crate whose root file is `root` (`…/src/lib.rs`).
    pub fn read(root: &Path) -> Result<Crate, ReadError> {
        let src = root
            .parent()
            .expect("a root file has a directory")
            .to_path_buf();
        let mut krate = Crate {
            src: src.clone(),
            files: Vec::new(),
            references: Vec::new(),
            modules: Vec::new(),
        };
        let mut parsed = Vec::new();
        krate.read_file(root, None, src, &mut parsed)?;
        // Files are numbered as they are first met, before their children;
        // they are parsed after them.
        parsed.sort_by_key(|(module, _)| krate.modules[*module].file);
        krate.references = parsed
            .iter()
            .map(|(module, ast)| krate.references_of(*module, ast))
            .collect();
        Ok(krate)
    }

    /// A file's name relative to the crate's `src`.
    pub fn name(&self, file: FileId) -> String {
        let path = &self.files[file];
        path.strip_prefix(&self.src)
            .unwrap_or(path)
            .display()
            .to_string()
    }

    /// Every arrow between two files, with the names that make it.
    pub fn arrows(&self) -> BTreeMap<(FileId, FileId), BTreeSet<String>> {
        let mut arrows: BTreeMap<_, BTreeSet<String>> = BTreeMap::new();
        for (from, references) in self.references.iter().enumerate() {
            for target in references {
                if let Target::Item { file, name } = target {
                    if *file != from {
                        arrows
                            .entry((from, *file))
                            .or_default()
                            .insert(name.clone());
                    }
                }
            }
        }
        arrows
    }

    fn read_file(
        &mut self,
        path: &Path,
        parent: Option<ModId>,
        child_dir: PathBuf,
        parsed: &mut Vec<(ModId, syn::File)>,
    ) -> Result<ModId, ReadError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ReadError(format!("{}: {e}", path.display())))?;
        let ast =
            syn::parse_file(&text).map_err(|e| ReadError(format!("{}: {e}", path.display())))?;
        let file = self.files.len();
        self.files.push(path.to_path_buf());
        let module = self.new_module(file, parent, child_dir);
        self.read_items(module, &ast.items, parsed)?;
        parsed.push((module, ast));
        Ok(module)
    }

    fn new_module(&mut self, file: FileId, parent: Option<ModId>, child_dir: PathBuf) -> ModId {
        self.modules.push(Module {
            file,
            parent,
            child_dir,
            children: BTreeMap::new(),
            names: BTreeMap::new(),
            globs: Vec::new(),
        });
        self.modules.len() - 1
    }

    /// Records the names `items` give `module`, and reads its child modules.
    fn read_items(
        &mut self,
        module: ModId,
        items: &[syn::Item],
        parsed: &mut Vec<(ModId, syn::File)>,
    ) -> Result<(), ReadError> {
        let file = self.modules[module].file;
        for item in items {
            if only_for_tests(item_attrs(item)) {
                continue;
            }
            match item {
                syn::Item::Mod(m) => {
                    let name = m.ident.to_string();
                    let dir = self.modules[module].child_dir.join(&name);
                    let child = match &m.content {
                        Some((_, inner)) => {
                            let child = self.new_module(file, Some(module), dir);
                            self.read_items(child, inner, parsed)?;
                            child
                        }
                        None => {
                            let path = self.module_file(module, m)?;
                            self.read_file(&path, Some(module), dir, parsed)?
                        }
                    };
                    self.modules[module].children.insert(name, child);
                }
                syn::Item::Use(u) => {
                    let mut imports = Vec::new();
                    use_leaves(&u.tree, &mut Vec::new(), &mut imports);
                    for leaf in imports {
                        match leaf {
                            UseLeaf::Glob(path) => self.modules[module].globs.push(path),
                            UseLeaf::Name { bound, path } if bound != "_" => {
                                let binding = Binding::Imported { path, from: module };
                                self.bind(module, bound, binding);
                            }
                            UseLeaf::Name { .. } => {}
                        }
                    }
                }
                other => {
                    if let Some(name) = item_name(other) {
                        let binding = Binding::Defined {
                            file,
                            name: name.clone(),
                        };
                        self.bind(module, name, binding);
                    }
                }
            }
        }
        Ok(())
    }

    fn bind(&mut self, module: ModId, name: String, binding: Binding) {
        self.modules[module]
            .names
            .entry(name)
            .or_default()
            .push(binding);
    }

    /// The file of `mod x;`: `#[path]`, `x.rs` or `x/mod.rs`.
    fn module_file(&self, module: ModId, m: &syn::ItemMod) -> Result<PathBuf, ReadError> {
        let dir = &self.modules[module].child_dir;
        for attr in &m.attrs {
            if let syn::Meta::NameValue(nv) = &attr.meta {
                if nv.path.is_ident("path") {
                    if let syn::Expr::Lit(syn::ExprLit {
                        lit: syn::Lit::Str(s),
                        ..
                    }) = &nv.value
                    {
                        let declaring = &self.files[self.modules[module].file];
                        return Ok(declaring.with_file_name(s.value()));
                    }
                }
            }
        }
        let name = m.ident.to_string();
        let candidates = [
            dir.join(format!("{name}.rs")),
            dir.join(&name).join("mod.rs"),
        ];
        candidates
            .iter()
            .find(|p| p.is_file())
            .cloned()
            .ok_or_else(|| ReadError(format!("no file for `mod {name};` in {}", dir.display())))
    }

    fn references_of(&self, module: ModId, ast: &syn::File) -> Vec<Target> {
        let mut collector = Collector {
            krate: self,
            modules: vec![module],
            references: Vec::new(),
        };
        for item in &ast.items {
            collector.visit_item(item);
        }
        collector.references
    }

    /// Where `path`, written in `from`, leads: a name not in scope is taken
    /// for another crate's (a local variable's, a generic's are too, and
    /// make no arrow); `None` for `Self` and for a module's missing name.
    fn resolve(&self, from: ModId, path: &[String]) -> Option<Target> {
        Some(match self.walk(from, path, &mut Vec::new())? {
            Found::Module(_) => Target::Module,
            Found::Target(target) => target,
        })
    }

    /// Follows `path` from `from`, segment by segment. `visiting` holds the
    /// `use` bindings being followed: in `use memchr::memchr;` the first
    /// `memchr` is not the binding itself but the crate.
    fn walk(
        &self,
        from: ModId,
        path: &[String],
        visiting: &mut Vec<(ModId, String)>,
    ) -> Option<Found> {
        let (first, rest) = path.split_first()?;
        let mut at = match first.as_str() {
            "crate" => Found::Module(0),
            "self" => Found::Module(from),
            "super" => Found::Module(self.modules[from].parent?),
            "Self" => return None,
            name => match self.lookup(from, name, rest.is_empty(), visiting) {
                Some(found) => found,
                None => Found::Target(Target::Outside(path.to_vec())),
            },
        };
        for (i, segment) in rest.iter().enumerate() {
            at = match at {
                Found::Module(m) => match segment.as_str() {
                    "self" => Found::Module(m),
                    "super" => Found::Module(self.modules[m].parent?),
                    name => self.lookup(m, name, i + 1 == rest.len(), visiting)?,
                },
                // `Type::method`, `Enum::Variant`: the item's file is the arrow.
                Found::Target(Target::Item { file, name }) => {
                    return Some(Found::Target(Target::Item { file, name }))
                }
                Found::Target(Target::Outside(mut outside)) => {
                    outside.extend(rest[i..].iter().cloned());
                    return Some(Found::Target(Target::Outside(outside)));
                }
                Found::Target(Target::Module) => unreachable!("modules are Found::Module"),
            };
        }
        Some(at)
    }

    /// What `name` stands for in `module`. A path's last segment prefers an
    /// item (`mod foo` and `fn foo` can share a name); any other, a module.
    fn lookup(
        &self,
        module: ModId,
        name: &str,
        last: bool,
        visiting: &mut Vec<(ModId, String)>,
    ) -> Option<Found> {
        let m = &self.modules[module];
        let mut found: Vec<Found> = Vec::new();
        if let Some(child) = m.children.get(name) {
            found.push(Found::Module(*child));
        }
        let key = (module, name.to_string());
        if !visiting.contains(&key) {
            visiting.push(key);
            for binding in m.names.get(name).into_iter().flatten() {
                match binding {
                    Binding::Defined { file, name } => found.push(Found::Target(Target::Item {
                        file: *file,
                        name: name.clone(),
                    })),
                    Binding::Imported { path, from } => {
                        found.extend(self.walk(*from, path, visiting));
                    }
                }
            }
            visiting.pop();
        }
        // A glob's own first segment is not looked up in the glob.
        let globs = (module, "*".to_string());
        if found.is_empty() && !visiting.contains(&globs) {
            visiting.push(globs);
            for glob in &m.globs {
                if let Some(Found::Module(g)) = self.walk(module, glob, visiting) {
                    found.extend(self.lookup(g, name, last, visiting));
                }
            }
            visiting.pop();
        }
        let rank = |f: &Found| match (f, last) {
            (Found::Target(Target::Item { .. }), true) => 0,
            (Found::Module(_), false) => 0,
            (Found::Target(Target::Outside(_)), _) => 1,
            _ => 2,
        };
        found.into_iter().min_by_key(rank)
    }
}

enum Found {
    Module(ModId),
    Target(Target),
}

/// The leaves of a `use` tree.
enum UseLeaf {
    /// `a::b::c as bound` (`bound` is `c` without `as`; `_` binds nothing).
    Name {
        bound: String,
        path: Vec<String>,
    },
    Glob(Vec<String>),
}

fn use_leaves(tree: &syn::UseTree, prefix: &mut Vec<String>, out: &mut Vec<UseLeaf>) {
    match tree {
        syn::UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            use_leaves(&p.tree, prefix, out);
            prefix.pop();
        }
        syn::UseTree::Name(n) if n.ident == "self" => out.push(UseLeaf::Name {
            bound: prefix.last().cloned().unwrap_or_default(),
            path: prefix.clone(),
        }),
        syn::UseTree::Name(n) => {
            let mut path = prefix.clone();
            path.push(n.ident.to_string());
            out.push(UseLeaf::Name {
                bound: n.ident.to_string(),
                path,
            });
        }
        syn::UseTree::Rename(r) => {
            let mut path = prefix.clone();
            if r.ident != "self" {
                path.push(r.ident.to_string());
            }
            out.push(UseLeaf::Name {
                bound: r.rename.to_string(),
                path,
            });
        }
        syn::UseTree::Glob(_) => out.push(UseLeaf::Glob(prefix.clone())),
        syn::UseTree::Group(g) => {
            for tree in &g.items {
                use_leaves(tree, prefix, out);
            }
        }
    }
}

/// Walks one file's code and resolves each path it names.
struct Collector<'a> {
    krate: &'a Crate,
    /// The module the code being read is in (inline modules push one).
    modules: Vec<ModId>,
    references: Vec<Target>,
}

impl Collector<'_> {
    fn module(&self) -> ModId {
        *self.modules.last().expect("a module")
    }

    fn refer(&mut self, path: &[String]) {
        if let Some(target) = self.krate.resolve(self.module(), path) {
            self.references.push(target);
        }
    }

    /// Paths inside a macro's tokens (`format!`, `matches!`, `assert!`):
    /// a sequence `a::b::c` of two or more segments.
    fn scan_tokens(&mut self, tokens: TokenStream) {
        let trees: Vec<TokenTree> = tokens.into_iter().collect();
        let mut i = 0;
        while i < trees.len() {
            match &trees[i] {
                TokenTree::Group(g) => {
                    self.scan_tokens(g.stream());
                    i += 1;
                }
                TokenTree::Ident(first) => {
                    let mut path = vec![first.to_string()];
                    let mut j = i + 1;
                    while let (
                        Some(TokenTree::Punct(a)),
                        Some(TokenTree::Punct(b)),
                        Some(TokenTree::Ident(next)),
                    ) = (trees.get(j), trees.get(j + 1), trees.get(j + 2))
                    {
                        if a.as_char() != ':' || b.as_char() != ':' {
                            break;
                        }
                        path.push(next.to_string());
                        j += 3;
                    }
                    if path.len() > 1 {
                        self.refer(&path);
                    }
                    i = j;
                }
                _ => i += 1,
            }
        }
    }
}

impl<'ast> Visit<'ast> for Collector<'_> {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        if !only_for_tests(item_attrs(item)) {
            syn::visit::visit_item(self, item);
        }
    }

    fn visit_impl_item(&mut self, item: &'ast syn::ImplItem) {
        let attrs = match item {
            syn::ImplItem::Const(c) => &c.attrs,
            syn::ImplItem::Fn(f) => &f.attrs,
            syn::ImplItem::Type(t) => &t.attrs,
            syn::ImplItem::Macro(m) => &m.attrs,
            _ => return,
        };
        if !only_for_tests(attrs) {
            syn::visit::visit_impl_item(self, item);
        }
    }

    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        // `mod x;` is no arrow; an inline module's code is read in its scope.
        if let Some((_, items)) = &m.content {
            let Some(&child) = self.krate.modules[self.module()]
                .children
                .get(&m.ident.to_string())
            else {
                return;
            };
            self.modules.push(child);
            for item in items {
                self.visit_item(item);
            }
            self.modules.pop();
        }
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        // A re-export (`pub use`, `pub(crate) use`) is a facade: what the
        // file itself uses of it, its code names. A private `use` is the
        // file's own (a trait's, for its methods, is named nowhere else).
        if !matches!(u.vis, syn::Visibility::Inherited) {
            return;
        }
        let mut leaves = Vec::new();
        use_leaves(&u.tree, &mut Vec::new(), &mut leaves);
        for leaf in leaves {
            match leaf {
                UseLeaf::Name { path, .. } | UseLeaf::Glob(path) => self.refer(&path),
            }
        }
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        if path.leading_colon.is_none() {
            let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
            self.refer(&segments);
        }
        syn::visit::visit_path(self, path);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        syn::visit::visit_macro(self, mac);
        self.scan_tokens(mac.tokens.clone());
    }
}

/// Whether `#[cfg(test)]` (or `#[cfg(all(test, …))]`) leaves the item out
/// of the build that is not a test's.
fn only_for_tests(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|attr| {
        if !attr.path().is_ident("cfg") {
            return false;
        }
        let Ok(meta) = attr.parse_args::<syn::Meta>() else {
            return false;
        };
        match &meta {
            syn::Meta::Path(p) => p.is_ident("test"),
            syn::Meta::List(list) if list.path.is_ident("all") => {
                let mut test = false;
                let _ = list.parse_nested_meta(|nested| {
                    test |= nested.path.is_ident("test");
                    Ok(())
                });
                test
            }
            _ => false,
        }
    })
}

fn item_attrs(item: &syn::Item) -> &[syn::Attribute] {
    match item {
        syn::Item::Const(i) => &i.attrs,
        syn::Item::Enum(i) => &i.attrs,
        syn::Item::ExternCrate(i) => &i.attrs,
        syn::Item::Fn(i) => &i.attrs,
        syn::Item::ForeignMod(i) => &i.attrs,
        syn::Item::Impl(i) => &i.attrs,
        syn::Item::Macro(i) => &i.attrs,
        syn::Item::Mod(i) => &i.attrs,
        syn::Item::Static(i) => &i.attrs,
        syn::Item::Struct(i) => &i.attrs,
        syn::Item::Trait(i) => &i.attrs,
        syn::Item::TraitAlias(i) => &i.attrs,
        syn::Item::Type(i) => &i.attrs,
        syn::Item::Union(i) => &i.attrs,
        syn::Item::Use(i) => &i.attrs,
        _ => &[],
    }
}

/// The name an item gives its module (`mod` and `use` are handled apart).
fn item_name(item: &syn::Item) -> Option<String> {
    let ident = match item {
        syn::Item::Const(i) => &i.ident,
        syn::Item::Enum(i) => &i.ident,
        syn::Item::Fn(i) => &i.sig.ident,
        syn::Item::Macro(i) => i.ident.as_ref()?,
        syn::Item::Static(i) => &i.ident,
        syn::Item::Struct(i) => &i.ident,
        syn::Item::Trait(i) => &i.ident,
        syn::Item::TraitAlias(i) => &i.ident,
        syn::Item::Type(i) => &i.ident,
        syn::Item::Union(i) => &i.ident,
        _ => return None,
    };
    Some(ident.to_string())
}

/// One circle: files, each with the names by which the one before it
/// reaches it; the last is the first again.
pub struct Circle {
    pub crate_dir: String,
    pub hops: Vec<(String, BTreeSet<String>)>,
}

impl fmt::Display for Circle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: ", self.crate_dir)?;
        for (i, (file, names)) in self.hops.iter().enumerate() {
            if i == 0 {
                write!(f, "{file}")?;
            } else {
                let names: Vec<&str> = names.iter().map(String::as_str).collect();
                write!(f, " -> {file} ({})", names.join(", "))?;
            }
        }
        Ok(())
    }
}

/// Every circle among the crate's files: for each arrow inside a strongly
/// connected group, the shortest way back, each circle once.
pub fn circles(krate: &Crate, crate_dir: &str) -> Vec<Circle> {
    let arrows = krate.arrows();
    let mut next: Vec<Vec<FileId>> = vec![Vec::new(); krate.files.len()];
    for (from, to) in arrows.keys() {
        next[*from].push(*to);
    }
    let group = strongly_connected(&next);
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for (from, to) in arrows.keys() {
        if group[*from] != group[*to] {
            continue;
        }
        let Some(back) = shortest_path(&next, &group, *to, *from) else {
            continue;
        };
        let mut cycle = vec![*from];
        cycle.extend(back);
        // The same circle entered at another file is the same circle.
        let start = (0..cycle.len() - 1)
            .min_by_key(|i| cycle[*i])
            .expect("a circle has files");
        let mut turned: Vec<FileId> = cycle[start..cycle.len() - 1].to_vec();
        turned.extend(&cycle[..start]);
        turned.push(turned[0]);
        if !seen.insert(turned.clone()) {
            continue;
        }
        let hops = turned
            .iter()
            .enumerate()
            .map(|(i, file)| {
                let names = if i == 0 {
                    BTreeSet::new()
                } else {
                    arrows[&(turned[i - 1], *file)].clone()
                };
                (krate.name(*file), names)
            })
            .collect();
        out.push(Circle {
            crate_dir: crate_dir.to_string(),
            hops,
        });
    }
    out
}

/// Tarjan's strongly connected components: each node's group number.
fn strongly_connected(next: &[Vec<usize>]) -> Vec<usize> {
    struct State<'a> {
        next: &'a [Vec<usize>],
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        on_stack: Vec<bool>,
        stack: Vec<usize>,
        group: Vec<usize>,
        counter: usize,
        groups: usize,
    }
    fn visit(s: &mut State, v: usize) {
        s.index[v] = Some(s.counter);
        s.low[v] = s.counter;
        s.counter += 1;
        s.stack.push(v);
        s.on_stack[v] = true;
        for &w in &s.next[v] {
            match s.index[w] {
                None => {
                    visit(s, w);
                    s.low[v] = s.low[v].min(s.low[w]);
                }
                Some(iw) if s.on_stack[w] => s.low[v] = s.low[v].min(iw),
                Some(_) => {}
            }
        }
        if Some(s.low[v]) == s.index[v] {
            while let Some(w) = s.stack.pop() {
                s.on_stack[w] = false;
                s.group[w] = s.groups;
                if w == v {
                    break;
                }
            }
            s.groups += 1;
        }
    }
    let n = next.len();
    let mut s = State {
        next,
        index: vec![None; n],
        low: vec![0; n],
        on_stack: vec![false; n],
        stack: Vec::new(),
        group: vec![0; n],
        counter: 0,
        groups: 0,
    };
    for v in 0..n {
        if s.index[v].is_none() {
            visit(&mut s, v);
        }
    }
    s.group
}

/// The shortest path `from` → … → `to` inside `from`'s group, both ends
/// included.
fn shortest_path(
    next: &[Vec<usize>],
    group: &[usize],
    from: usize,
    to: usize,
) -> Option<Vec<usize>> {
    let mut came_from: BTreeMap<usize, usize> = BTreeMap::new();
    let mut queue = VecDeque::from([from]);
    let mut reached = BTreeSet::from([from]);
    while let Some(v) = queue.pop_front() {
        if v == to {
            let mut path = vec![to];
            let mut at = to;
            while let Some(&before) = came_from.get(&at) {
                path.push(before);
                at = before;
            }
            path.reverse();
            return Some(path);
        }
        for &w in &next[v] {
            if group[w] == group[from] && reached.insert(w) {
                came_from.insert(w, v);
                queue.push_back(w);
            }
        }
    }
    None
}
