//! Speculative decoding (Leviathan, Kalman, Matias 2023): a cheap proposer guesses the next
//! tokens, the model scores all of them in one pass, and a rejection rule keeps exactly the
//! tokens the model itself would have produced (greedy) or the model's distribution
//! (sampling).

mod ngram;
mod verify;

pub use ngram::propose_ngram;
pub use verify::{Verdict, verify};

/// How proposals are made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Speculator {
    /// Prompt lookup: continue the latest earlier occurrence of the last few tokens.
    Ngram,
    /// A smaller model sharing the tokenizer runs ahead on its own paged KV cache.
    Draft,
}

impl Speculator {
    /// Parses a `--speculator` value.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "ngram" => Some(Self::Ngram),
            "draft" => Some(Self::Draft),
            _ => None,
        }
    }
}

/// Speculation settings of a shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpeculationConfig {
    /// Tokens proposed per step.
    pub depth: usize,
    /// The proposer.
    pub speculator: Speculator,
}
