//! Where the workspace, its fixtures and its built binaries are, and whether a binary is
//! older than its sources.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde_json::Value;

/// The workspace root (the parent of this crate's folder).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the e2e crate lives in the workspace")
        .to_path_buf()
}

/// A test model folder under `fixtures/`.
pub fn fixture(name: &str) -> PathBuf {
    let path = workspace_root().join("fixtures").join(name);
    assert!(path.is_dir(), "fixture {} is missing", path.display());
    path
}

/// A fixture's `golden.json`.
pub fn golden(name: &str) -> Value {
    fixture_json(name, "golden.json")
}

/// The JSON file `file` of fixture `name` (`golden_embeddings.json`, …).
pub fn fixture_json(name: &str, file: &str) -> Value {
    let path = fixture(name).join(file);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("bad {}: {e}", path.display()))
}

/// `target/<profile>/`: the folder of the test executable, or its parent when the
/// executable is in `deps/`.
pub fn binary_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("cannot locate the test executable");
    let dir = exe.parent().expect("the test executable has a folder");
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir.parent().expect("deps/ has a parent").to_path_buf()
    } else {
        dir.to_path_buf()
    }
}

/// Source folders (relative to the workspace root) each binary is built from.
fn sources_of(name: &str) -> &'static [&'static str] {
    match name {
        "tessera-launcher" => &["launcher/src"],
        "tessera-router" => &["router/src", "text/src", "params/src", "proto"],
        "tessera-shard" => &[
            "shard/src",
            "kernels/src",
            "blocks/src",
            "model-files/src",
            "text/src",
            "params/src",
            "proto",
        ],
        _ => &[],
    }
}

/// The source files cargo built `binary` from, as its dep-info file beside it lists them
/// (`tessera-shard.d`): exactly what a rebuild depends on, so a change to a test-only module
/// does not make the binary look stale. `None` without one.
fn dep_info_sources(binary: &Path) -> Option<Vec<PathBuf>> {
    let name = binary.file_name()?.to_string_lossy().into_owned();
    let text = std::fs::read_to_string(binary.with_file_name(format!("{name}.d"))).ok()?;
    let first = text.lines().next()?;
    let (_, deps) = first.split_once(": ")?;
    // Make escapes a space inside a path as `\ `.
    let files = deps
        .replace("\\ ", "\0")
        .split_whitespace()
        .map(|p| PathBuf::from(p.replace('\0', " ")))
        .collect();
    Some(files)
}

/// The newest modification time among `files`, with the file.
fn newest_of(files: Vec<PathBuf>) -> Option<(SystemTime, PathBuf)> {
    files
        .into_iter()
        .filter_map(|f| Some((std::fs::metadata(&f).ok()?.modified().ok()?, f)))
        .max()
}

/// The newest modification time of the `.rs` and `.proto` files under `dir`, with the file.
fn newest_source(dir: &Path) -> Option<(SystemTime, PathBuf)> {
    let mut newest: Option<(SystemTime, PathBuf)> = None;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let Ok(meta) = entry.metadata() else { continue };
            if meta.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs" || e == "proto")
                && let Ok(modified) = meta.modified()
                && newest.as_ref().is_none_or(|(t, _)| modified > *t)
            {
                newest = Some((modified, path));
            }
        }
    }
    newest
}

/// The path of a workspace binary (`tessera-launcher`, `tessera-shard`, `tessera-router`)
/// next to the test executable. Panics with instructions when it is missing or older than
/// one of its source files (`cargo test` builds only the binaries of packages that have
/// integration tests, so a stale launcher would otherwise be tested silently);
/// `TESSERA_E2E_ALLOW_STALE=1` turns the staleness failure into a warning.
pub fn binary(name: &str) -> PathBuf {
    let path = binary_dir().join(name);
    let meta = std::fs::metadata(&path).unwrap_or_else(|_| {
        panic!(
            "{} is missing: build the binaries first with `cargo build --workspace --bins` \
             (same profile as the tests), then rerun the end-to-end tests",
            path.display()
        )
    });
    let built = meta.modified().expect("binary mtime");
    let root = workspace_root();
    let newest = match dep_info_sources(&path) {
        Some(files) => newest_of(files),
        None => sources_of(name)
            .iter()
            .filter_map(|dir| newest_source(&root.join(dir)))
            .max(),
    };
    if let Some((changed, file)) = newest
        && changed > built
    {
        let message = format!(
            "{} is older than {}: rebuild it with `cargo build --workspace --bins` (same \
             profile as the tests) before running the end-to-end tests, or set \
             TESSERA_E2E_ALLOW_STALE=1 to test the old binary anyway",
            path.display(),
            file.display()
        );
        if std::env::var_os("TESSERA_E2E_ALLOW_STALE").is_some_and(|v| v != "0") {
            eprintln!("warning: {message}");
        } else {
            panic!("{message}");
        }
    }
    path
}
