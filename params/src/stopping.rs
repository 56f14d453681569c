//! When a request's generation ends, besides an output constraint completing.

use serde::{Deserialize, Serialize};

/// Stopping criteria, applied by the router as tokens arrive.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoppingParams {
    /// Generate at most this many tokens (the prompt plus these fit the context).
    pub max_new_tokens: u32,
    /// Stop when the generated text contains one of these (trimmed from the output).
    pub stop_sequences: Vec<String>,
    /// Keep generating past the model's end-of-sequence tokens.
    pub ignore_eos: bool,
    /// Stop when one of these tokens is generated (vLLM's `stop_token_ids`), as at an
    /// end-of-sequence token.
    #[serde(default)]
    pub stop_token_ids: Vec<u32>,
}
