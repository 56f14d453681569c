//! Compute primitives that know nothing of models: matrix products, normalisation, rotary
//! embeddings, activations, attention over paged KV blocks, and GGUF quantized blocks.
#![deny(missing_docs)]

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
/// The GGUF/ggml block layouts and their scalar reference dequantizers (`tessera-blocks`),
/// against which the CPU and GPU dequantizers are tested.
pub use tessera_blocks as quant;
