//! File-level import cycles: no file of an [`ACYCLIC`] folder lies on a circle of files that
//! import each other.
//!
//! A crate's files form a graph: file `a` points at file `b` when `a` names a path into `b`,
//! in a `use` (`use crate::x::Y`, `use super::y::Z`, `use child::W` for a child module) or in
//! code (`crate::x::f()`, also inside macro calls). A path resolves to the file of the deepest
//! module it names, so `super::math::max` points at `math.rs`, not at the parent that only
//! passes through, and through the `use` bindings of the modules on its way, so `crate::Error`
//! re-exported by `lib.rs` from `error.rs` points at `error.rs` (a path to another crate's
//! item, even re-exported, points nowhere). Declaring a child module (`mod x;`) is not an
//! import. Test-only code
//! (`#[cfg(test)]` items and the files they declare) is left out: a test drives its module
//! through the parent's API, which would put every tested file on a circle with its parent.
//! The circles are the graph's strongly connected components of two or more files.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::Path;

use petgraph::algo::tarjan_scc;
use petgraph::graphmap::DiGraphMap;
use proc_macro2::{TokenStream, TokenTree};
use syn::visit::{self, Visit};

/// Files and folders (paths relative to the workspace root, a prefix naming each file under
/// it) none of whose files may lie on an import cycle of their crate; a cycle that leaves the
/// folder counts too.
const ACYCLIC: &[&str] = &[
    // The HTTP front: the app, the state its handlers share, the handlers that are not
    // under `openai/`, and the request deadline.
    "router/src/server.rs",
    "router/src/state.rs",
    "router/src/native.rs",
    "router/src/anthropic/",
    "router/src/openapi.rs",
    "router/src/deadline.rs",
    // The shard's step: the engine, speculation, sampling.
    "shard/src/core/",
    "shard/src/speculative/",
    "shard/src/sampling/",
];

/// A module's path from its crate root (`["batcher", "scheduler"]`; empty: the root).
type ModulePath = Vec<String>;

/// Files by path (relative to the workspace root, with `/`) to their text.
type Sources = BTreeMap<String, String>;

/// For each file, the files it imports.
type Graph = BTreeMap<String, BTreeSet<String>>;

/// One circle of files that import each other.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Cycle {
    /// The [`ACYCLIC`] folder it passes through.
    folder: String,
    /// The files of the strongly connected component, sorted.
    files: Vec<String>,
}

impl fmt::Display for Cycle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "import cycle through {}: {}",
            self.folder,
            self.files.join(", ")
        )
    }
}

/// Whether `attrs` make an item test-only (`#[cfg(test)]`).
fn is_test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && matches!(&a.meta, syn::Meta::List(l) if l.tokens.to_string() == "test")
    })
}

/// The attributes of an item.
fn item_attrs(item: &syn::Item) -> &[syn::Attribute] {
    use syn::Item;
    match item {
        Item::Const(i) => &i.attrs,
        Item::Enum(i) => &i.attrs,
        Item::ExternCrate(i) => &i.attrs,
        Item::Fn(i) => &i.attrs,
        Item::ForeignMod(i) => &i.attrs,
        Item::Impl(i) => &i.attrs,
        Item::Macro(i) => &i.attrs,
        Item::Mod(i) => &i.attrs,
        Item::Static(i) => &i.attrs,
        Item::Struct(i) => &i.attrs,
        Item::Trait(i) => &i.attrs,
        Item::TraitAlias(i) => &i.attrs,
        Item::Type(i) => &i.attrs,
        Item::Union(i) => &i.attrs,
        Item::Use(i) => &i.attrs,
        _ => &[],
    }
}

/// The folder a file's child modules live in: `a/` beside `a.rs`, the file's own folder for
/// `mod.rs`, `lib.rs` and `main.rs`.
fn child_dir(file: &str) -> String {
    let (dir, name) = file.rsplit_once('/').unwrap_or(("", file));
    match name {
        "mod.rs" | "lib.rs" | "main.rs" => format!("{dir}/"),
        other => format!("{dir}/{}/", other.trim_end_matches(".rs")),
    }
}

/// A crate's modules, each with the file that holds it (inline modules: their file).
#[derive(Default)]
struct ModuleTree {
    modules: BTreeMap<ModulePath, String>,
    /// Each module's `use` bindings: the name it brings in and the path, as written there.
    bindings: BTreeMap<ModulePath, BTreeMap<String, Vec<String>>>,
    /// The parsed files, with the module each one is.
    files: Vec<(String, ModulePath, syn::File)>,
}

/// How many `use` bindings one path is followed through (re-exports of re-exports).
const MAX_REEXPORTS: usize = 16;

impl ModuleTree {
    /// The tree under the crate root `root`, following `mod x;` declarations that are not
    /// test-only.
    fn load(sources: &Sources, root: &str) -> Result<Self, String> {
        let mut tree = ModuleTree::default();
        tree.add_file(sources, root.to_owned(), Vec::new())?;
        Ok(tree)
    }

    fn add_file(
        &mut self,
        sources: &Sources,
        file: String,
        module: ModulePath,
    ) -> Result<(), String> {
        let text = sources
            .get(&file)
            .ok_or_else(|| format!("{file}: not found"))?;
        let syntax = syn::parse_file(text).map_err(|e| format!("{file}: {e}"))?;
        if is_test_only(&syntax.attrs) {
            return Ok(());
        }
        self.modules.insert(module.clone(), file.clone());
        let dir = child_dir(&file);
        self.add_items(sources, &file, &dir, &module, &syntax.items)?;
        self.files.push((file, module, syntax));
        Ok(())
    }

    fn add_items(
        &mut self,
        sources: &Sources,
        file: &str,
        dir: &str,
        module: &ModulePath,
        items: &[syn::Item],
    ) -> Result<(), String> {
        for item in items {
            if let syn::Item::Use(u) = item {
                self.add_bindings(module, u);
            }
            let syn::Item::Mod(m) = item else { continue };
            if is_test_only(&m.attrs) {
                continue;
            }
            let name = m.ident.to_string();
            let mut child = module.clone();
            child.push(name.clone());
            match &m.content {
                Some((_, inner)) => {
                    self.modules.insert(child.clone(), file.to_owned());
                    let inner_dir = format!("{dir}{name}/");
                    self.add_items(sources, file, &inner_dir, &child, inner)?;
                }
                None => {
                    let flat = format!("{dir}{name}.rs");
                    let nested = format!("{dir}{name}/mod.rs");
                    let path = if sources.contains_key(&flat) {
                        flat
                    } else {
                        nested
                    };
                    self.add_file(sources, path, child)?;
                }
            }
        }
        Ok(())
    }

    fn add_bindings(&mut self, module: &ModulePath, item: &syn::ItemUse) {
        if item.leading_colon.is_some() || is_test_only(&item.attrs) {
            return;
        }
        let mut paths = Vec::new();
        use_paths(&item.tree, &mut Vec::new(), &mut paths);
        let bindings = self.bindings.entry(module.clone()).or_default();
        for (name, path) in paths {
            if let Some(name) = name.filter(|n| n != "_") {
                bindings.insert(name, path);
            }
        }
    }

    /// The file of the deepest module `segments`, written in `module`, names, following `use`
    /// bindings; `None` for paths into other crates.
    fn resolve(&self, module: &[String], segments: &[String], reexports: usize) -> Option<&String> {
        let first = segments.first()?;
        let (mut at, rest) = match first.as_str() {
            "crate" | "$crate" => (Vec::new(), &segments[1..]),
            "self" => (module.to_vec(), &segments[1..]),
            "super" => {
                let ups = segments.iter().take_while(|s| *s == "super").count();
                let keep = module.len().checked_sub(ups)?;
                (module[..keep].to_vec(), &segments[ups..])
            }
            name => {
                let child = [module, &[name.to_owned()]].concat();
                let bound = self
                    .bindings
                    .get(module)
                    .is_some_and(|b| b.contains_key(name));
                if !self.modules.contains_key(&child) && !bound {
                    return None;
                }
                (module.to_vec(), segments)
            }
        };
        for (i, segment) in rest.iter().enumerate() {
            at.push(segment.clone());
            if self.modules.contains_key(&at) {
                continue;
            }
            at.pop();
            let binding = self.bindings.get(&at).and_then(|b| b.get(segment));
            if let Some(target) = binding.filter(|_| reexports > 0) {
                let through = [target.as_slice(), &rest[i + 1..]].concat();
                return self.resolve(&at, &through, reexports - 1);
            }
            break;
        }
        self.modules.get(&at)
    }

    /// Each file's imports of other files of the tree.
    fn graph(&self) -> Graph {
        let mut graph = Graph::new();
        for (file, module, syntax) in &self.files {
            let mut collector = ImportCollector {
                tree: self,
                module: module.clone(),
                targets: BTreeSet::new(),
            };
            collector.visit_file(syntax);
            collector.targets.remove(file);
            graph.insert(file.clone(), collector.targets);
        }
        graph
    }
}

/// The files one file imports, collected while walking its syntax.
struct ImportCollector<'a> {
    tree: &'a ModuleTree,
    /// The module being walked (a file's module, or an inline module inside it).
    module: ModulePath,
    targets: BTreeSet<String>,
}

impl ImportCollector<'_> {
    fn add(&mut self, segments: &[String]) {
        if let Some(file) = self.tree.resolve(&self.module, segments, MAX_REEXPORTS) {
            self.targets.insert(file.clone());
        }
    }
}

/// The paths a `use` tree imports, each with the name it binds (`self` in a group: the
/// prefix, bound by its last segment; a glob binds no one name).
type UsePath = (Option<String>, Vec<String>);

fn use_paths(tree: &syn::UseTree, prefix: &mut Vec<String>, out: &mut Vec<UsePath>) {
    let with = |prefix: &[String], ident: &syn::Ident| [prefix, &[ident.to_string()]].concat();
    match tree {
        syn::UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            use_paths(&p.tree, prefix, out);
            prefix.pop();
        }
        syn::UseTree::Name(n) if n.ident == "self" => {
            out.push((prefix.last().cloned(), prefix.clone()))
        }
        syn::UseTree::Name(n) => out.push((Some(n.ident.to_string()), with(prefix, &n.ident))),
        syn::UseTree::Rename(r) => out.push((Some(r.rename.to_string()), with(prefix, &r.ident))),
        syn::UseTree::Glob(_) => out.push((None, prefix.clone())),
        syn::UseTree::Group(g) => g.items.iter().for_each(|t| use_paths(t, prefix, out)),
    }
}

/// The `crate::…`, `$crate::…`, `self::…` and `super::…` paths in a macro call's tokens.
fn macro_paths(tokens: TokenStream, out: &mut Vec<Vec<String>>) {
    let tokens: Vec<TokenTree> = tokens.into_iter().collect();
    let is_sep = |i: usize| {
        matches!((tokens.get(i), tokens.get(i + 1)),
            (Some(TokenTree::Punct(a)), Some(TokenTree::Punct(b))) if a.as_char() == ':' && b.as_char() == ':')
    };
    let mut i = 0;
    while i < tokens.len() {
        match &tokens[i] {
            TokenTree::Group(g) => macro_paths(g.stream(), out),
            TokenTree::Ident(id)
                if ["crate", "self", "super"].contains(&id.to_string().as_str()) =>
            {
                let mut path = vec![id.to_string()];
                while is_sep(i + 1) {
                    let Some(TokenTree::Ident(next)) = tokens.get(i + 3) else {
                        break;
                    };
                    path.push(next.to_string());
                    i += 3;
                }
                if path.len() > 1 {
                    out.push(path);
                }
            }
            _ => {}
        }
        i += 1;
    }
}

impl<'ast> Visit<'ast> for ImportCollector<'_> {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        if !is_test_only(item_attrs(item)) {
            visit::visit_item(self, item);
        }
    }

    fn visit_impl_item(&mut self, item: &'ast syn::ImplItem) {
        let attrs = match item {
            syn::ImplItem::Const(i) => &i.attrs,
            syn::ImplItem::Fn(i) => &i.attrs,
            syn::ImplItem::Type(i) => &i.attrs,
            syn::ImplItem::Macro(i) => &i.attrs,
            _ => return,
        };
        if !is_test_only(attrs) {
            visit::visit_impl_item(self, item);
        }
    }

    fn visit_item_mod(&mut self, item: &'ast syn::ItemMod) {
        if let Some((_, items)) = &item.content {
            self.module.push(item.ident.to_string());
            items.iter().for_each(|i| self.visit_item(i));
            self.module.pop();
        }
    }

    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        if item.leading_colon.is_none() {
            let mut paths = Vec::new();
            use_paths(&item.tree, &mut Vec::new(), &mut paths);
            paths.iter().for_each(|(_, p)| self.add(p));
        }
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        if path.leading_colon.is_none() && path.segments.len() > 1 {
            let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
            self.add(&segments);
        }
        visit::visit_path(self, path);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        let mut paths = Vec::new();
        macro_paths(mac.tokens.clone(), &mut paths);
        paths.iter().for_each(|p| self.add(p));
        visit::visit_macro(self, mac);
    }
}

/// The strongly connected components of `graph` with two or more files, each sorted.
fn cycles(graph: &Graph) -> Vec<Vec<String>> {
    let mut g = DiGraphMap::<&str, ()>::new();
    for (from, imports) in graph {
        g.add_node(from.as_str());
        for to in imports {
            g.add_edge(from.as_str(), to.as_str(), ());
        }
    }
    tarjan_scc(&g)
        .into_iter()
        .filter(|component| component.len() > 1)
        .map(|component| {
            let mut files: Vec<String> = component.into_iter().map(str::to_owned).collect();
            files.sort();
            files
        })
        .collect()
}

/// The crate roots among `sources` under the crate folder `krate` (`router/`).
fn crate_roots(sources: &Sources, krate: &str) -> Vec<String> {
    ["src/lib.rs", "src/main.rs"]
        .iter()
        .map(|root| format!("{krate}{root}"))
        .filter(|root| sources.contains_key(root))
        .collect()
}

/// The cycles through each of `folders` (each `<crate>/src/…`) among `sources`; an error for
/// a folder that holds no file of its crate's module tree.
fn check_folders(sources: &Sources, folders: &[&str]) -> Result<Vec<Cycle>, String> {
    let mut found = Vec::new();
    for folder in folders {
        let krate = folder.split_once("src/").map_or("", |(k, _)| k);
        let mut graphs = Vec::new();
        for root in crate_roots(sources, krate) {
            graphs.push(ModuleTree::load(sources, &root)?.graph());
        }
        if !graphs
            .iter()
            .flat_map(Graph::keys)
            .any(|f| f.starts_with(folder))
        {
            return Err(format!("{folder} names no file of its crate"));
        }
        for graph in &graphs {
            for files in cycles(graph) {
                if files.iter().any(|f| f.starts_with(folder)) {
                    found.push(Cycle {
                        folder: (*folder).to_owned(),
                        files,
                    });
                }
            }
        }
    }
    found.sort();
    Ok(found)
}

/// Every `.rs` file of the crates that [`ACYCLIC`] names.
fn workspace_sources(root: &Path) -> Sources {
    let mut sources = Sources::new();
    for folder in ACYCLIC {
        let src = folder.split_once("src/").map_or("", |(k, _)| k).to_owned() + "src";
        for file in super::rust_files(&root.join(&src)) {
            let relative = file
                .strip_prefix(root)
                .expect("under the workspace")
                .to_string_lossy()
                .replace('\\', "/");
            let text = std::fs::read_to_string(&file)
                .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            sources.insert(relative, text);
        }
    }
    sources
}

#[test]
fn named_folders_have_no_import_cycles() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate lives in the workspace");
    let cycles = check_folders(&workspace_sources(root), ACYCLIC).unwrap_or_else(|e| panic!("{e}"));
    let list: Vec<String> = cycles.iter().map(ToString::to_string).collect();
    assert!(cycles.is_empty(), "{}", list.join("\n"));
}

fn sources(files: &[(&str, &str)]) -> Sources {
    files
        .iter()
        .map(|(path, text)| ((*path).to_owned(), (*text).to_owned()))
        .collect()
}

#[test]
fn finds_a_cycle_through_use_code_and_macro_paths() {
    let files = sources(&[
        ("x/src/lib.rs", "mod a; mod b; mod c; mod d;"),
        ("x/src/a.rs", "use crate::b::B; pub struct A;"),
        (
            "x/src/b.rs",
            "pub struct B; fn f() { let _ = super::a::A; }",
        ),
        (
            "x/src/c.rs",
            "pub fn g() { tracing::info!(\"{}\", crate::d::h()); }",
        ),
        (
            "x/src/d.rs",
            "pub fn h() -> u8 { self::k() } fn k() -> u8 { 0 } fn m() { crate::c::g() }",
        ),
    ]);
    let found = check_folders(&files, &["x/src/"]).expect("loads");
    let files: Vec<Vec<&str>> = found
        .iter()
        .map(|c| c.files.iter().map(String::as_str).collect())
        .collect();
    assert_eq!(
        files,
        [
            vec!["x/src/a.rs", "x/src/b.rs"],
            vec!["x/src/c.rs", "x/src/d.rs"]
        ]
    );
}

#[test]
fn a_parent_passed_through_declared_or_tested_is_no_cycle() {
    let files = sources(&[
        ("x/src/lib.rs", "mod p; pub use p::Out;"),
        (
            "x/src/p/mod.rs",
            "mod child; mod math; use child::Out as O; pub struct Out(O);",
        ),
        (
            "x/src/p/child.rs",
            "pub struct Out; fn f() -> f32 { super::math::max() }\n\
             #[cfg(test)] mod tests { use super::*; use crate::p::Out; }\n\
             mod inner { use super::Out; }",
        ),
        (
            "x/src/p/math.rs",
            "pub fn max() -> f32 { 0.0 }\n#[cfg(test)] mod t { use crate::Out; }",
        ),
    ]);
    let tree = ModuleTree::load(&files, "x/src/lib.rs").expect("loads");
    let graph = tree.graph();
    let edges = |f: &str| graph[f].iter().cloned().collect::<Vec<_>>();
    assert_eq!(edges("x/src/lib.rs"), ["x/src/p/mod.rs"]);
    assert_eq!(edges("x/src/p/mod.rs"), ["x/src/p/child.rs"]);
    assert_eq!(edges("x/src/p/child.rs"), ["x/src/p/math.rs"]);
    assert!(edges("x/src/p/math.rs").is_empty());
    assert!(
        check_folders(&files, &["x/src/"])
            .expect("loads")
            .is_empty()
    );
}

#[test]
fn a_child_that_imports_its_parent_closes_a_cycle() {
    let files = sources(&[
        ("x/src/lib.rs", "mod p;"),
        (
            "x/src/p/mod.rs",
            "mod child; pub struct State; pub use child::handler;",
        ),
        (
            "x/src/p/child.rs",
            "use super::State; pub fn handler(_: State) {}",
        ),
    ]);
    let found = check_folders(&files, &["x/src/p/"]).expect("loads");
    assert_eq!(
        check_folders(&files, &["x/src/q/"]),
        Err("x/src/q/ names no file of its crate".into())
    );
    assert_eq!(
        found,
        [Cycle {
            folder: "x/src/p/".into(),
            files: vec!["x/src/p/child.rs".into(), "x/src/p/mod.rs".into()],
        }]
    );
}

#[test]
fn a_path_through_a_re_export_points_at_the_defining_file() {
    let files = sources(&[
        (
            "x/src/lib.rs",
            "mod core; mod error; pub use core::Engine; pub use error::Error as EngineError;\n\
             pub use std::fmt::Debug;",
        ),
        (
            "x/src/core/mod.rs",
            "mod pass; pub use self::pass::Engine; use crate::Debug;\n\
             fn f() -> Result<(), crate::EngineError> { Ok(()) }",
        ),
        (
            "x/src/core/pass.rs",
            "use super::super::EngineError as E; pub struct Engine;",
        ),
        ("x/src/error.rs", "pub struct Error;"),
    ]);
    let graph = ModuleTree::load(&files, "x/src/lib.rs")
        .expect("loads")
        .graph();
    let edges = |f: &str| graph[f].iter().cloned().collect::<Vec<_>>();
    assert_eq!(
        edges("x/src/lib.rs"),
        ["x/src/core/pass.rs", "x/src/error.rs"]
    );
    assert_eq!(
        edges("x/src/core/mod.rs"),
        ["x/src/core/pass.rs", "x/src/error.rs"]
    );
    assert_eq!(edges("x/src/core/pass.rs"), ["x/src/error.rs"]);
    assert!(
        check_folders(&files, &["x/src/"])
            .expect("loads")
            .is_empty()
    );
}
