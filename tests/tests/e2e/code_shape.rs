//! The project's code-shape rules, checked on every workspace crate's `src/`: no file over
//! [`MAX_FILE_LINES`] lines, no function over [`MAX_FN_LINES`] lines (kernels' SIMD inner
//! loops, named in [`INNER_LOOPS`], excepted); no import cycle among the files of the folders
//! `imports` names; crates in layers that depend only downwards (`crates`).
//!
//! A function's length runs from the line of its `fn` keyword to the line of its closing
//! brace (attributes and doc comments not counted). Free functions, methods, trait
//! methods with a body and functions nested in other functions all count; closures are
//! part of the function that holds them.

mod crates;
mod imports;

use std::fmt;
use std::path::{Path, PathBuf};

use syn::spanned::Spanned;
use syn::visit::{self, Visit};

/// Longest `src` file, in lines.
const MAX_FILE_LINES: usize = 900;

/// Longest function, in lines.
const MAX_FN_LINES: usize = 100;

/// Folders whose functions may be exempt: the kernels' SIMD code and attention inner loops.
const INNER_LOOP_FOLDERS: &[&str] = &[
    "kernels/src/cpu/arch/",
    "kernels/src/cpu/int8/",
    "kernels/src/cpu/attention/",
];

/// Kernels' hot inner loops exempt from [`MAX_FN_LINES`], as (file, function) with the
/// function named as the report names it (`Type::method` for methods). Splitting them would
/// move register-resident accumulators across calls the compiler may not inline.
const INNER_LOOPS: &[(&str, &str)] = &[
    // The AVX-512 VNNI int8 matmul micro-kernel: R rows by C tiles over every block.
    ("kernels/src/cpu/arch/x86_64/int8.rs", "kernel"),
    // The AVX2 int8 matmul micro-kernel: R rows by one tile over every block.
    ("kernels/src/cpu/arch/x86_64/int8_avx2.rs", "tile_rows"),
    // The AVX-VNNI int8 matmul micro-kernel: R rows by C tiles over every block.
    ("kernels/src/cpu/arch/x86_64/int8_avxvnni.rs", "kernel"),
    // The flash-attention tile loop: scores, online softmax and `p · V` for one partition.
    ("kernels/src/cpu/attention/flash.rs", "attend_partition"),
];

/// One broken rule.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Violation {
    /// A file over [`MAX_FILE_LINES`].
    LongFile { path: String, lines: usize },
    /// A function over [`MAX_FN_LINES`].
    LongFn {
        path: String,
        name: String,
        start: usize,
        lines: usize,
    },
    /// An [`INNER_LOOPS`] entry that no longer names a long function.
    StaleExemption { path: String, name: String },
    /// An [`INNER_LOOPS`] entry outside [`INNER_LOOP_FOLDERS`].
    MisplacedExemption { path: String, name: String },
    /// A file `syn` cannot parse (so its functions cannot be measured).
    Unparsable { path: String, error: String },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::LongFile { path, lines } => {
                write!(f, "{path}: {lines} lines (limit {MAX_FILE_LINES})")
            }
            Violation::LongFn {
                path,
                name,
                start,
                lines,
            } => write!(
                f,
                "{path}:{start}: fn {name}: {lines} lines (limit {MAX_FN_LINES})"
            ),
            Violation::StaleExemption { path, name } => write!(
                f,
                "{path}: INNER_LOOPS exempts fn {name}, which is gone or within the limit"
            ),
            Violation::MisplacedExemption { path, name } => write!(
                f,
                "{path}: INNER_LOOPS exempts fn {name} outside the kernels' inner-loop folders"
            ),
            Violation::Unparsable { path, error } => write!(f, "{path}: cannot parse: {error}"),
        }
    }
}

/// A function's qualified name, first line and length.
#[derive(Debug, Clone, PartialEq, Eq)]
struct FnSpan {
    name: String,
    start: usize,
    lines: usize,
}

/// Collects every function with a body, named by its enclosing modules, impls and functions.
#[derive(Default)]
struct FnCollector {
    scope: Vec<String>,
    fns: Vec<FnSpan>,
}

impl FnCollector {
    fn record(&mut self, ident: &syn::Ident, fn_token: &syn::token::Fn, block: &syn::Block) {
        let start = fn_token.span.start().line;
        let end = block.brace_token.span.close().end().line;
        let mut name = self.scope.join("::");
        if !name.is_empty() {
            name.push_str("::");
        }
        name.push_str(&ident.to_string());
        self.fns.push(FnSpan {
            name,
            start,
            lines: end + 1 - start,
        });
    }

    fn in_scope(&mut self, name: String, inner: impl FnOnce(&mut Self)) {
        self.scope.push(name);
        inner(self);
        self.scope.pop();
    }
}

/// The name an impl block's methods are qualified with: the implementing type's last path
/// segment (`ShmComm` for `impl Communicator for ShmComm`).
fn impl_name(item: &syn::ItemImpl) -> String {
    match &*item.self_ty {
        syn::Type::Path(p) => p
            .path
            .segments
            .last()
            .map_or_else(|| "impl".to_owned(), |s| s.ident.to_string()),
        other => {
            let span = other.span().start();
            format!("impl@{}", span.line)
        }
    }
}

impl<'ast> Visit<'ast> for FnCollector {
    fn visit_item_fn(&mut self, node: &'ast syn::ItemFn) {
        self.record(&node.sig.ident, &node.sig.fn_token, &node.block);
        let name = node.sig.ident.to_string();
        self.in_scope(name, |this| visit::visit_item_fn(this, node));
    }

    fn visit_impl_item_fn(&mut self, node: &'ast syn::ImplItemFn) {
        self.record(&node.sig.ident, &node.sig.fn_token, &node.block);
        let name = node.sig.ident.to_string();
        self.in_scope(name, |this| visit::visit_impl_item_fn(this, node));
    }

    fn visit_trait_item_fn(&mut self, node: &'ast syn::TraitItemFn) {
        if let Some(block) = &node.default {
            self.record(&node.sig.ident, &node.sig.fn_token, block);
        }
        let name = node.sig.ident.to_string();
        self.in_scope(name, |this| visit::visit_trait_item_fn(this, node));
    }

    fn visit_item_impl(&mut self, node: &'ast syn::ItemImpl) {
        self.in_scope(impl_name(node), |this| visit::visit_item_impl(this, node));
    }

    fn visit_item_trait(&mut self, node: &'ast syn::ItemTrait) {
        let name = node.ident.to_string();
        self.in_scope(name, |this| visit::visit_item_trait(this, node));
    }

    fn visit_item_mod(&mut self, node: &'ast syn::ItemMod) {
        let name = node.ident.to_string();
        self.in_scope(name, |this| visit::visit_item_mod(this, node));
    }
}

/// Every function with a body in `source`.
fn functions(source: &str) -> syn::Result<Vec<FnSpan>> {
    let file = syn::parse_file(source)?;
    let mut collector = FnCollector::default();
    collector.visit_file(&file);
    Ok(collector.fns)
}

/// The rules broken by one file, `path` relative to the workspace root (with `/`).
fn check_source(path: &str, source: &str, exempt: &[(&str, &str)]) -> Vec<Violation> {
    let mut out = Vec::new();
    let lines = source.lines().count();
    if lines > MAX_FILE_LINES {
        out.push(Violation::LongFile {
            path: path.to_owned(),
            lines,
        });
    }
    let fns = match functions(source) {
        Ok(fns) => fns,
        Err(e) => {
            out.push(Violation::Unparsable {
                path: path.to_owned(),
                error: format!("line {}: {e}", e.span().start().line),
            });
            return out;
        }
    };
    let long = |f: &&FnSpan| f.lines > MAX_FN_LINES;
    for f in fns.iter().filter(long) {
        if !exempt.contains(&(path, f.name.as_str())) {
            out.push(Violation::LongFn {
                path: path.to_owned(),
                name: f.name.clone(),
                start: f.start,
                lines: f.lines,
            });
        }
    }
    for &(_, name) in exempt.iter().filter(|(p, _)| *p == path) {
        if !fns.iter().filter(long).any(|f| f.name == name) {
            out.push(Violation::StaleExemption {
                path: path.to_owned(),
                name: name.to_owned(),
            });
        }
    }
    out
}

/// The workspace members listed in the root `Cargo.toml`.
fn workspace_members(root: &Path) -> Vec<String> {
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).expect("root Cargo.toml");
    let start = manifest
        .find("members")
        .expect("a [workspace] members list");
    let list = &manifest[start..];
    let open = list.find('[').expect("members = [");
    let close = list.find(']').expect("members = [...]");
    list[open + 1..close]
        .split(',')
        .map(|m| m.trim().trim_matches('"').to_owned())
        .filter(|m| !m.is_empty())
        .collect()
}

/// Every `.rs` file under `dir`, sorted.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let entries = std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display()));
        for entry in entries {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// The rules broken anywhere in the workspace's `src` folders, and how many files were read.
fn check_workspace(root: &Path) -> (Vec<Violation>, usize) {
    let mut violations = Vec::new();
    let mut files = 0;
    for member in workspace_members(root) {
        let src = root.join(&member).join("src");
        assert!(src.is_dir(), "workspace member {member} has no src/");
        for file in rust_files(&src) {
            let relative = file
                .strip_prefix(root)
                .expect("under the workspace")
                .to_string_lossy()
                .replace('\\', "/");
            let source = std::fs::read_to_string(&file)
                .unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            violations.extend(check_source(&relative, &source, INNER_LOOPS));
            files += 1;
        }
    }
    for &(path, name) in INNER_LOOPS {
        if !INNER_LOOP_FOLDERS.iter().any(|f| path.starts_with(f)) {
            violations.push(Violation::MisplacedExemption {
                path: path.to_owned(),
                name: name.to_owned(),
            });
        }
        if !root.join(path).is_file() {
            violations.push(Violation::StaleExemption {
                path: path.to_owned(),
                name: name.to_owned(),
            });
        }
    }
    violations.sort();
    (violations, files)
}

#[test]
fn src_files_and_functions_stay_short() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate lives in the workspace");
    let (violations, files) = check_workspace(root);
    assert!(
        files > 100,
        "only {files} source files found under {}",
        root.display()
    );
    let list: Vec<String> = violations.iter().map(ToString::to_string).collect();
    assert!(
        violations.is_empty(),
        "{} code-shape violations:\n{}",
        violations.len(),
        list.join("\n")
    );
}

/// A function of `body_lines` statement lines (plus its `fn` and closing-brace lines).
fn function_of(name: &str, body_lines: usize) -> String {
    let mut text = format!("fn {name}() {{\n");
    for i in 0..body_lines {
        text.push_str(&format!("    let _x{i} = {i};\n"));
    }
    text.push_str("}\n");
    text
}

#[test]
fn the_checker_measures_functions_from_fn_to_closing_brace() {
    let source = format!(
        "{}\nstruct S;\nimpl S {{\n    /// Doc.\n    #[inline]\n    {}}}\n",
        function_of("short", 98),
        function_of("long", 99).replace('\n', "\n    "),
    );
    let fns = functions(&source).expect("parses");
    let lengths: Vec<(&str, usize)> = fns.iter().map(|f| (f.name.as_str(), f.lines)).collect();
    assert_eq!(lengths, [("short", 100), ("S::long", 101)]);
    assert_eq!(
        check_source("x/src/a.rs", &source, &[]),
        [Violation::LongFn {
            path: "x/src/a.rs".into(),
            name: "S::long".into(),
            start: 106,
            lines: 101,
        }]
    );
    assert!(check_source("x/src/a.rs", &source, &[("x/src/a.rs", "S::long")]).is_empty());
    assert_eq!(
        check_source("x/src/a.rs", &source, &[("x/src/a.rs", "short")]).len(),
        2,
        "the long fn is reported and the needless exemption is stale"
    );
}

#[test]
fn the_checker_finds_nested_and_trait_functions_and_long_files() {
    let nested = format!(
        "fn outer() {{\n{}}}\ntrait T {{\n    fn provided(&self) {{\n{}    }}\n}}\n",
        function_of("inner", 101),
        "        let _ = 0;\n".repeat(101),
    );
    let names: Vec<String> = check_source("x/src/b.rs", &nested, &[])
        .into_iter()
        .map(|v| match v {
            Violation::LongFn { name, .. } => name,
            other => panic!("unexpected {other}"),
        })
        .collect();
    assert_eq!(names, ["outer", "outer::inner", "T::provided"]);
    let long_file = "// line\n".repeat(MAX_FILE_LINES + 1);
    assert_eq!(
        check_source("x/src/c.rs", &long_file, &[]),
        [Violation::LongFile {
            path: "x/src/c.rs".into(),
            lines: MAX_FILE_LINES + 1
        }]
    );
    assert!(check_source("x/src/d.rs", &"// line\n".repeat(MAX_FILE_LINES), &[]).is_empty());
}
