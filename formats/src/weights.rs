//! The one interface the engine uses to read weights, whatever the file format.

use crate::FormatError;

/// A dense f32 tensor in host memory, row-major, shaped as in Hugging Face transformers.
#[derive(Debug, Clone, PartialEq)]
pub struct HostTensor {
    /// Dimensions, outermost first (a linear weight is `[out_features, in_features]`).
    pub shape: Vec<usize>,
    /// `shape.iter().product()` values.
    pub data: Vec<f32>,
}

/// Weights addressed by their Hugging Face name (`model.layers.0.self_attn.q_proj.weight`).
///
/// Implementations translate names and layouts of their format (GGUF's `blk.0.attn_q.weight`
/// with llama.cpp's q/k row permutation) so that the engine sees one convention.
pub trait WeightSource: Send + Sync {
    /// Whether a tensor of this name exists.
    fn contains(&self, name: &str) -> bool;
    /// The tensor's Hugging Face shape.
    fn shape(&self, name: &str) -> Result<Vec<usize>, FormatError>;
    /// The tensor converted (or dequantized) to f32.
    fn load_f32(&self, name: &str) -> Result<HostTensor, FormatError>;
}
