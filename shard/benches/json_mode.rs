//! What JSON mode and JSON Schemas cost per token on SmolLM2-135M-Instruct's vocabulary
//! (49,152 tokens): the project's own JSON recognizer against llguidance on the same object,
//! and llguidance on a nested schema of it, with the time each schema takes to compile.
//!
//! Run with `cargo bench -p tessera-shard --bench json_mode`. A sampler in JSON mode is driven
//! through a pretty-printed JSON object, token by token, with logits that make the next token
//! of that text the argmax; the same run without JSON mode is the baseline. "Cold" builds a
//! fresh vocabulary first, so every state's allowed set is walked from the trie; "warm" runs
//! again over the same vocabulary, whose cache holds them. Needs
//! `${TESSERA_CACHE:-~/.cache/tessera}/SmolLM2-135M-Instruct.Q4_1.gguf` (for its tokenizer).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use tessera_model_files::ModelFiles;
use tessera_shard::sampling::{Sampler, SamplingParams, TokenVocab};
use tessera_text::{GrammarCompiler, GrammarSource};

const GGUF: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

const TEXT: &str = r#"{
  "cities": [
    {"name": "Lisbon", "country": "Portugal", "population": 545923,
     "landmarks": ["Belém Tower", "Jerónimos Monastery"], "coastal": true},
    {"name": "Kraków", "country": "Poland", "population": 804237,
     "landmarks": ["Wawel Castle", "Rynek Główny"], "coastal": false},
    {"name": "Kyoto", "country": "Japan", "population": 1.46e6,
     "landmarks": ["Kinkaku-ji", "Fushimi Inari-taisha"], "coastal": false, "note": null}
  ]
}"#;

/// Milliseconds per token to sample `ids` in turn, each the argmax of its row.
fn run(mut sampler: Sampler, ids: &[u32], vocab: usize) -> f64 {
    let mut logits = vec![0f32; vocab];
    let start = Instant::now();
    for &id in ids {
        logits[id as usize] = 10.0;
        let got = sampler.sample(&logits).id;
        assert_eq!(got, id, "the constraint refused a token of valid JSON");
        logits[id as usize] = 0.0;
    }
    start.elapsed().as_secs_f64() * 1e3 / ids.len() as f64
}

/// Any JSON object, as llguidance reads JSON mode; whitespace as the text has it.
const ANY_OBJECT: &str = r#"{"type": "object", "x-guidance": {"whitespace_flexible": true}}"#;

/// The text's own shape: nested objects, arrays, enums-free strings, numbers, a nullable.
const CITIES: &str = r#"{"type": "object", "x-guidance": {"whitespace_flexible": true},
  "properties": {"cities": {"type": "array", "minItems": 1, "maxItems": 8, "items": {
    "type": "object", "additionalProperties": false,
    "properties": {"name": {"type": "string"}, "country": {"type": "string"},
                   "population": {"type": "number"},
                   "landmarks": {"type": "array", "items": {"type": "string"}, "maxItems": 4},
                   "coastal": {"type": "boolean"}, "note": {"type": "null"}},
    "required": ["name", "country", "population", "landmarks", "coastal"]}}},
  "required": ["cities"], "additionalProperties": false}"#;

/// Milliseconds to compile `schema` (and compute its first mask) on a fresh compiler.
fn compile_ms(compiler: &GrammarCompiler, schema: &str) -> f64 {
    let t = Instant::now();
    compiler
        .compile(GrammarSource::JsonSchema(schema))
        .expect("the bench schemas compile");
    t.elapsed().as_secs_f64() * 1e3
}

fn main() {
    let dir = std::env::var_os("TESSERA_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/tessera")));
    let Some(path) = dir.map(|d| d.join(GGUF)).filter(|p| p.is_file()) else {
        println!("{GGUF} not found (scripts/fetch_smollm2.sh fetches it): skipping");
        return;
    };
    let tok = ModelFiles::open(&path).unwrap().tokenizer().unwrap();
    let bytes = tok.token_bytes();
    let ids = tok.encode(TEXT, false).unwrap();
    let size = tok.vocab_size();
    println!(
        "JSON mode on SmolLM2's vocabulary ({size} tokens), a {}-token object",
        ids.len()
    );
    println!("{:<34}{:>12}", "", "ms/token");
    for round in 0..3 {
        let t = Instant::now();
        let vocab = Arc::new(TokenVocab::new(&bytes, &tok.eos_token_ids));
        let build = t.elapsed().as_secs_f64() * 1e3;
        let plain = run(Sampler::new(SamplingParams::default(), &[]), &ids, size);
        let json =
            |v: &Arc<TokenVocab>| Sampler::new(SamplingParams::default(), &[]).with_json(v.clone());
        let cold = run(json(&vocab), &ids, size);
        let warm = run(json(&vocab), &ids, size);
        let t = Instant::now();
        let fresh = Arc::new(TokenVocab::new(&bytes, &tok.eos_token_ids));
        let compiler = fresh
            .grammars()
            .expect("SmolLM2's vocabulary backs grammars");
        let trie = t.elapsed().as_secs_f64() * 1e3;
        let compile_any = compile_ms(compiler, ANY_OBJECT);
        let compile_cities = compile_ms(compiler, CITIES);
        let schema = |v: &Arc<TokenVocab>, s: &str| {
            Sampler::new(SamplingParams::default(), &[])
                .with_grammar(v.clone(), GrammarSource::JsonSchema(s))
                .expect("the bench schemas compile")
        };
        let llg_any = run(schema(&fresh, ANY_OBJECT), &ids, size);
        let llg_any_again = run(schema(&fresh, ANY_OBJECT), &ids, size);
        let llg_cities = run(schema(&fresh, CITIES), &ids, size);
        println!("round {round}: vocabulary built in {build:.1} ms, llguidance's in {trie:.1} ms");
        println!("{:<34}{plain:>12.4}", "  greedy, no constraint");
        println!("{:<34}{cold:>12.4}", "  JSON mode, cold (walks)");
        println!("{:<34}{warm:>12.4}", "  JSON mode, warm (cached sets)");
        println!("{:<34}{llg_any:>12.4}", "  llguidance any object, first");
        println!(
            "{:<34}{llg_any_again:>12.4}",
            "  llguidance any object, again"
        );
        println!("{:<34}{llg_cities:>12.4}", "  llguidance nested schema");
        println!("{:<34}{compile_any:>12.2}", "  compile any object (ms)");
        println!(
            "{:<34}{compile_cities:>12.2}",
            "  compile nested schema (ms)"
        );
    }
}
