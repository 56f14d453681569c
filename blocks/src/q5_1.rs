//! `Q5_1`: 32 values per block, an f16 scale and an f16 minimum, unsigned 5-bit quants
//! (llama.cpp's fallback for `Q5_K` rows, as `Q5_0` is for `Q4_K`).

use half::f16;

use crate::q5_0::quant5;
use crate::{BlockFormat, QuantFormat};

/// Values per [`BlockQ5_1`].
pub const QK5_1: usize = 32;

/// One `Q5_1` block as ggml stores it (`block_q5_1`).
#[repr(C)]
#[derive(Debug, Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ5_1 {
    /// Scale.
    pub d: f16,
    /// Minimum; value = `q * d + m`.
    pub m: f16,
    /// High bits, little-endian: bit `j` belongs to value `j`.
    pub qh: [u8; 4],
    /// Nibbles: the low nibble of byte `j` is value `j`, the high nibble value `j + 16`.
    pub qs: [u8; QK5_1 / 2],
}

const _: () = assert!(std::mem::size_of::<BlockQ5_1>() == 24);

impl BlockFormat for BlockQ5_1 {
    const FORMAT: QuantFormat = QuantFormat::Q5_1;
    const NAME: &'static str = "Q5_1";
    const BLOCK_ELEMENTS: usize = QK5_1;

    /// ggml's `dequantize_row_q5_1` for one block.
    #[inline]
    fn dequantize_block(&self, out: &mut [f32]) {
        debug_assert_eq!(out.len(), Self::BLOCK_ELEMENTS);
        let (d, m) = (self.d.to_f32(), self.m.to_f32());
        for (e, v) in out.iter_mut().enumerate() {
            *v = f32::from(quant5(&self.qs, self.qh, e)) * d + m;
        }
    }
}

/// Scalar reference dequantizer, equal to ggml's `dequantize_row_q5_1`.
/// `out.len()` must be `blocks.len() * 32`.
pub fn dequantize_row_q5_1(blocks: &[BlockQ5_1], out: &mut [f32]) {
    BlockQ5_1::dequantize_row(blocks, out)
}
