//! `Q3_K`: 256-value super-blocks of sixteen 16-value sub-blocks with signed 6-bit scales,
//! 3-bit quants offset by 4 (two low bits, and a high bit that is set when the offset is not
//! taken).

use half::f16;

use crate::q2_k::q2_k_quant;
use crate::q4_k::QK_K;
use crate::{BlockFormat, QuantFormat};

/// One `Q3_K` block as ggml stores it (`block_q3_K`).
#[repr(C)]
#[derive(Debug, Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ3K {
    /// High bits: bit `k` of byte `l` belongs to value `32 k + l`.
    pub hmask: [u8; QK_K / 8],
    /// Low 2 bits of the quants, laid out as `Q2_K`'s.
    pub qs: [u8; QK_K / 4],
    /// Sixteen 6-bit scales (see [`BlockQ3K::scale`]).
    pub scales: [u8; 12],
    /// Super-block scale.
    pub d: f16,
}

const _: () = assert!(std::mem::size_of::<BlockQ3K>() == 110);

impl BlockQ3K {
    /// Sub-block `j`'s scale, `-32..=31`: its low 4 bits are nibble `j / 8` of byte `j % 8`,
    /// its high 2 bits bits `2 (j / 4)` of byte `8 + j % 4`.
    pub fn scale(&self, j: usize) -> i32 {
        let low = (self.scales[j % 8] >> (4 * (j / 8))) & 0x0F;
        let high = (self.scales[8 + j % 4] >> (2 * (j / 4))) & 3;
        i32::from(low | high << 4) - 32
    }

    /// Quant `e` (0..256), `-4..=3`.
    pub fn quant(&self, e: usize) -> i32 {
        let high = (self.hmask[e % 32] >> (e / 32)) & 1;
        i32::from(q2_k_quant(&self.qs, e)) - if high != 0 { 0 } else { 4 }
    }
}

impl BlockFormat for BlockQ3K {
    const FORMAT: QuantFormat = QuantFormat::Q3K;
    const NAME: &'static str = "Q3_K";
    const BLOCK_ELEMENTS: usize = QK_K;

    /// ggml's `dequantize_row_q3_K` for one block.
    #[inline]
    fn dequantize_block(&self, out: &mut [f32]) {
        debug_assert_eq!(out.len(), Self::BLOCK_ELEMENTS);
        let d = self.d.to_f32();
        for (j, y) in out.chunks_exact_mut(16).enumerate() {
            let dl = d * self.scale(j) as f32;
            for (l, v) in y.iter_mut().enumerate() {
                *v = dl * self.quant(16 * j + l) as f32;
            }
        }
    }
}

/// Scalar reference dequantizer, equal to ggml's `dequantize_row_q3_K`.
/// `out.len()` must be `blocks.len() * 256`.
pub fn dequantize_row_q3_k(blocks: &[BlockQ3K], out: &mut [f32]) {
    BlockQ3K::dequantize_row(blocks, out)
}
