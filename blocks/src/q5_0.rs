//! `Q5_0`: 32 values per block, one f16 scale, 5-bit quants offset by 16.
//!
//! llama.cpp writes it where a K-quant cannot go: rows whose width is not a multiple of 256
//! (Qwen2.5-0.5B's 896, SmolLM2's 576) in `Q4_K_M` and `Q5_K_M` files.

use half::f16;

use crate::iq4::index4;
use crate::{BlockFormat, QuantFormat};

/// Values per [`BlockQ5_0`].
pub const QK5_0: usize = 32;

/// One `Q5_0` block as ggml stores it (`block_q5_0`).
#[repr(C)]
#[derive(Debug, Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ5_0 {
    /// Scale.
    pub d: f16,
    /// High bits, little-endian: bit `j` belongs to value `j`.
    pub qh: [u8; 4],
    /// Nibbles: the low nibble of byte `j` is value `j`, the high nibble value `j + 16`.
    pub qs: [u8; QK5_0 / 2],
}

const _: () = assert!(std::mem::size_of::<BlockQ5_0>() == 22);

/// Unsigned 5-bit quant `e` (0..32) of a block of nibbles `qs` and high bits `qh`.
pub fn quant5(qs: &[u8; 16], qh: [u8; 4], e: usize) -> u8 {
    let high = (u32::from_le_bytes(qh) >> e) & 1;
    index4(qs, e) | (high as u8) << 4
}

impl BlockFormat for BlockQ5_0 {
    const FORMAT: QuantFormat = QuantFormat::Q5_0;
    const NAME: &'static str = "Q5_0";
    const BLOCK_ELEMENTS: usize = QK5_0;

    /// ggml's `dequantize_row_q5_0` for one block.
    #[inline]
    fn dequantize_block(&self, out: &mut [f32]) {
        debug_assert_eq!(out.len(), Self::BLOCK_ELEMENTS);
        let d = self.d.to_f32();
        for (e, v) in out.iter_mut().enumerate() {
            *v = (i32::from(quant5(&self.qs, self.qh, e)) - 16) as f32 * d;
        }
    }
}

/// Scalar reference dequantizer, equal to ggml's `dequantize_row_q5_0`.
/// `out.len()` must be `blocks.len() * 32`.
pub fn dequantize_row_q5_0(blocks: &[BlockQ5_0], out: &mut [f32]) {
    BlockQ5_0::dequantize_row(blocks, out)
}
