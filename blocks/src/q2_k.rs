//! `Q2_K`: 256-value super-blocks of sixteen 16-value sub-blocks, each with a 4-bit scale and
//! a 4-bit minimum, unsigned 2-bit quants.

use half::f16;

use crate::q4_k::QK_K;
use crate::{BlockFormat, QuantFormat};

/// One `Q2_K` block as ggml stores it (`block_q2_K`).
#[repr(C)]
#[derive(Debug, Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ2K {
    /// Sub-block `j`'s scale in the low nibble of byte `j`, its minimum in the high one.
    pub scales: [u8; QK_K / 16],
    /// Quants, four per byte: see [`q2_k_quant`].
    pub qs: [u8; QK_K / 4],
    /// Super-block scale for the sub-block scales.
    pub d: f16,
    /// Super-block scale for the sub-block minimums.
    pub dmin: f16,
}

const _: () = assert!(std::mem::size_of::<BlockQ2K>() == 84);

/// Quant `e` (0..256) of `qs`: each 128-value half uses 32 bytes, bits `2 k` of byte `l` being
/// value `32 k + l`.
pub(crate) fn q2_k_quant(qs: &[u8; QK_K / 4], e: usize) -> u8 {
    let (half, k, l) = (e / 128, e % 128 / 32, e % 32);
    (qs[32 * half + l] >> (2 * k)) & 3
}

impl BlockFormat for BlockQ2K {
    const FORMAT: QuantFormat = QuantFormat::Q2K;
    const NAME: &'static str = "Q2_K";
    const BLOCK_ELEMENTS: usize = QK_K;

    /// ggml's `dequantize_row_q2_K` for one block.
    #[inline]
    fn dequantize_block(&self, out: &mut [f32]) {
        debug_assert_eq!(out.len(), Self::BLOCK_ELEMENTS);
        let (d, min) = (self.d.to_f32(), self.dmin.to_f32());
        for (j, y) in out.chunks_exact_mut(16).enumerate() {
            let sc = self.scales[j];
            let (dl, ml) = (d * f32::from(sc & 0x0F), min * f32::from(sc >> 4));
            for (l, v) in y.iter_mut().enumerate() {
                *v = dl * f32::from(q2_k_quant(&self.qs, 16 * j + l)) - ml;
            }
        }
    }
}

/// Scalar reference dequantizer, equal to ggml's `dequantize_row_q2_K`.
/// `out.len()` must be `blocks.len() * 256`.
pub fn dequantize_row_q2_k(blocks: &[BlockQ2K], out: &mut [f32]) {
    BlockQ2K::dequantize_row(blocks, out)
}
