//! What JSON mode costs per token on SmolLM2-135M-Instruct's vocabulary (49,152 tokens).
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

use tessera_formats::ModelFiles;
use tessera_shard::sampling::{Sampler, SamplingParams, TokenVocab};

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
        println!("round {round}: vocabulary built in {build:.1} ms");
        println!("{:<34}{plain:>12.4}", "  greedy, no constraint");
        println!("{:<34}{cold:>12.4}", "  JSON mode, cold (walks)");
        println!("{:<34}{warm:>12.4}", "  JSON mode, warm (cached sets)");
    }
}
