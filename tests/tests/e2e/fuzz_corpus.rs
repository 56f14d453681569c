//! Every fuzz target's committed corpus and regressions, replayed as ordinary tests through
//! the targets' own bodies (`fuzz/src/lib.rs`): the properties the fuzzers hold (no panic,
//! round trips, no 5xx) hold on every input found so far, without a sanitizer build. Fuzzing
//! itself, which looks for new inputs, is `scripts/fuzz.sh` (see `fuzz/README.md`).

#[allow(unreachable_pub, dead_code, missing_docs)]
#[path = "../../../fuzz/src/lib.rs"]
mod targets;

use std::path::PathBuf;

/// The inputs of `target`: its corpus, then its regressions, in name order.
fn inputs(target: &str) -> Vec<PathBuf> {
    let root = tessera_e2e::workspace_root().join("fuzz");
    let mut files = Vec::new();
    for dir in ["corpus", "regressions"] {
        let Ok(entries) = std::fs::read_dir(root.join(dir).join(target)) else {
            continue;
        };
        let mut found: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
        found.sort();
        files.extend(found);
    }
    files
}

fn replay(target: &str, body: fn(&[u8])) {
    let files = inputs(target);
    assert!(!files.is_empty(), "fuzz/corpus/{target} has no inputs");
    for file in files {
        let data = std::fs::read(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let outcome = std::panic::catch_unwind(|| body(&data));
        assert!(outcome.is_ok(), "{target} failed on {}", file.display());
    }
}

#[test]
fn gguf() {
    replay("gguf", targets::gguf);
}

#[test]
fn safetensors_config() {
    replay("safetensors_config", targets::safetensors_config);
}

#[test]
fn tokenizer_roundtrip() {
    replay("tokenizer_roundtrip", targets::tokenizer_roundtrip);
}

#[test]
fn detokenizer() {
    replay("detokenizer", targets::detokenizer);
}

#[test]
fn chat_template() {
    replay("chat_template", targets::chat_template);
}

#[test]
fn http_bodies() {
    let _router = crate::IN_PROCESS_ROUTER.blocking_lock();
    replay("http_bodies", targets::http_bodies);
}
