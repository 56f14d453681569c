//! How reasoning models mark their thinking, named as vLLM's `--reasoning-parser` names them.

/// A reasoning format: the thinking sits between `<think>` and `</think>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReasoningFormat {
    /// Qwen3 and its kind: the output may open with `<think>`; without it there is no
    /// reasoning (thinking switched off).
    Qwen3,
    /// DeepSeek-R1 and its distills: the template opens `<think>` in the prompt, so the output
    /// starts inside the reasoning (a `<think>` the model repeats is dropped).
    DeepSeekR1,
}

impl ReasoningFormat {
    /// The formats as `--reasoning-parser` names them.
    pub const NAMES: &'static str = "qwen3, deepseek_r1";

    /// The format named `name`.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "qwen3" => Some(Self::Qwen3),
            "deepseek_r1" => Some(Self::DeepSeekR1),
            _ => None,
        }
    }

    /// Opens the reasoning.
    pub const START: &'static str = "<think>";
    /// Closes it.
    pub const END: &'static str = "</think>";
}
