//! GGUF/ggml quantized blocks (and MXFP4, which Hugging Face checkpoints use too): block layouts and their scalar reference dequantizers, and the
//! storage formats of Tessera's weight matrices. No SIMD here: the kernels' fast
//! dequantizers live in `tessera-kernels` and are tested against these references.
//!
//! One file per format (`q8_0.rs`, `q4_0.rs`, …), each with a `#[repr(C)]` block, a size
//! assertion and a [`BlockFormat`] implementation equal to ggml's (`ggml-quants.c`).
//! [`dequantize`] is the byte-level entry point: it accepts unaligned bytes (a slice of a
//! memory-mapped file) and splits large inputs across threads.
//!
//! ```
//! use tessera_blocks::{dequantize, QuantFormat};
//! // One Q8_0 block: f16 scale 0.5 (0x3800), then 32 signed quants.
//! let mut bytes = vec![0x00, 0x38];
//! bytes.extend((0..32).map(|i| i as u8));
//! let mut out = vec![0.0; 32];
//! dequantize(QuantFormat::Q8_0, &bytes, &mut out)?;
//! assert_eq!(out[3], 1.5);
//! # Ok::<(), tessera_blocks::QuantError>(())
//! ```

mod block_format;
mod dequantize;
mod error;
mod iq4;
mod mxfp4;
mod q2_k;
mod q3_k;
mod q4_0;
mod q4_1;
mod q4_k;
mod q5_0;
mod q5_1;
mod q5_k;
mod q6_k;
mod q8_0;
mod quant_format;
mod weight_format;

pub use block_format::BlockFormat;
pub use dequantize::{bf16_bytes_to_f32, dequantize, f16_bytes_to_f32, f32_bytes_to_f32};
pub use error::QuantError;
pub use iq4::{
    BlockIQ4NL, BlockIQ4XS, KVALUES_IQ4NL, QK4_NL, dequantize_row_iq4_nl, dequantize_row_iq4_xs,
    index4,
};
pub use mxfp4::{BlockMXFP4, KVALUES_MXFP4, QK_MXFP4, dequantize_row_mxfp4, e8m0_to_f32_half};
pub use q2_k::{BlockQ2K, dequantize_row_q2_k};
pub use q3_k::{BlockQ3K, dequantize_row_q3_k};
pub use q4_0::{BlockQ4_0, QK4_0, dequantize_row_q4_0};
pub use q4_1::{BlockQ4_1, QK4_1, dequantize_row_q4_1};
pub use q4_k::{
    BlockQ4K, K_SCALE_SIZE, QK_K, dequantize_row_q4_k, get_scale_min_k4, scales_mins_k4,
};
pub use q5_0::{BlockQ5_0, QK5_0, dequantize_row_q5_0, quant5};
pub use q5_1::{BlockQ5_1, QK5_1, dequantize_row_q5_1};
pub use q5_k::{BlockQ5K, dequantize_row_q5_k};
pub use q6_k::{BlockQ6K, dequantize_row_q6_k};
pub use q8_0::{BlockQ8_0, QK8_0, dequantize_row_q8_0};
pub use quant_format::QuantFormat;
pub use weight_format::WeightFormat;

#[cfg(test)]
mod tests;
