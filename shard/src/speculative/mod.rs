//! Speculative decoding (Leviathan, Kalman, Matias 2023): a cheap proposer guesses the next
//! tokens, the model scores all of them in one pass, and a rejection rule keeps exactly the
//! tokens the model itself would have produced (greedy) or the model's distribution
//! (sampling). Proposers that offer several candidates per position (draft heads) verify a
//! tree of them in one pass (`tree`).

use std::path::{Path, PathBuf};

use tessera_model_files::FormatError;

use crate::EngineError;

mod eagle;
mod medusa;
mod ngram;
mod tree;
mod verify;

pub use eagle::EagleHead;
pub(crate) use medusa::top_log_probs;
pub use medusa::{MedusaHeads, likeliest_paths};
pub use ngram::propose_ngram;
pub use tree::{TokenTree, TreeVerdict, verify_tree};
pub use verify::{Verdict, verify};

/// How proposals are made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Speculator {
    /// Prompt lookup: continue the latest earlier occurrence of the last few tokens.
    Ngram,
    /// A smaller model sharing the tokenizer runs ahead on its own paged KV cache.
    Draft,
    /// Medusa heads over the model's final hidden state propose a tree of candidates.
    Medusa,
    /// An EAGLE-style draft layer over the model's hidden states, run a few times on its own
    /// guesses, proposes a tree of candidates.
    Eagle,
}

impl Speculator {
    /// Its `--speculator` name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Ngram => "ngram",
            Self::Draft => "draft",
            Self::Medusa => "medusa",
            Self::Eagle => "eagle",
        }
    }

    /// Parses a `--speculator` value.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "ngram" => Some(Self::Ngram),
            "draft" => Some(Self::Draft),
            "medusa" => Some(Self::Medusa),
            "eagle" => Some(Self::Eagle),
            _ => None,
        }
    }
}

/// The safetensors file of draft heads in `dir`: `named`, or the directory's only one.
fn heads_file(dir: &Path, named: &str) -> Result<PathBuf, EngineError> {
    let path = dir.join(named);
    if path.exists() {
        return Ok(path);
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| FormatError::io(dir, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    match found.len() {
        1 => Ok(found.remove(0)),
        n => Err(EngineError::Weights {
            path: dir.display().to_string(),
            message: format!(
                "expected {named} (or a single .safetensors file), found {n} safetensors files"
            ),
        }),
    }
}

/// Candidate paths a draft head's tree holds by default.
pub const DEFAULT_TREE_WIDTH: usize = 4;

/// Speculation settings of a shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpeculationConfig {
    /// Tokens proposed per step.
    pub depth: usize,
    /// The proposer.
    pub speculator: Speculator,
}
