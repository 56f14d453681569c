//! `Q5_K`: like `Q4_K` with a fifth bit per value stored in `qh`.

use half::f16;

use crate::q4_k::{K_SCALE_SIZE, QK_K, get_scale_min_k4};
use crate::{BlockFormat, QuantFormat};

/// One `Q5_K` block as ggml stores it (`block_q5_K`).
#[repr(C)]
#[derive(Debug, Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ5K {
    /// Super-block scale for the sub-block scales.
    pub d: f16,
    /// Super-block scale for the sub-block minimums.
    pub dmin: f16,
    /// Eight 6-bit scales and eight 6-bit minimums, packed as in `Q4_K`.
    pub scales: [u8; K_SCALE_SIZE],
    /// High bits: bit `k` of byte `l` belongs to value `32 * k + l`.
    pub qh: [u8; QK_K / 8],
    /// Low nibbles: 64 values per 32 bytes, low nibbles first.
    pub qs: [u8; QK_K / 2],
}

const _: () = assert!(std::mem::size_of::<BlockQ5K>() == 176);

impl BlockFormat for BlockQ5K {
    const FORMAT: QuantFormat = QuantFormat::Q5K;
    const NAME: &'static str = "Q5_K";
    const BLOCK_ELEMENTS: usize = QK_K;

    /// ggml's `dequantize_row_q5_K` for one block.
    #[inline]
    fn dequantize_block(&self, out: &mut [f32]) {
        debug_assert_eq!(out.len(), Self::BLOCK_ELEMENTS);
        let d = self.d.to_f32();
        let min = self.dmin.to_f32();
        for (g, (ql, y)) in self
            .qs
            .chunks_exact(32)
            .zip(out.chunks_exact_mut(64))
            .enumerate()
        {
            let (sc, m) = get_scale_min_k4(2 * g, &self.scales);
            let (d1, m1) = (d * f32::from(sc), min * f32::from(m));
            let (sc, m) = get_scale_min_k4(2 * g + 1, &self.scales);
            let (d2, m2) = (d * f32::from(sc), min * f32::from(m));
            let u1 = 1u8 << (2 * g);
            let u2 = 2u8 << (2 * g);
            let (lo, hi) = y.split_at_mut(32);
            for l in 0..32 {
                let h1 = if self.qh[l] & u1 != 0 { 16 } else { 0 };
                let h2 = if self.qh[l] & u2 != 0 { 16 } else { 0 };
                lo[l] = d1 * f32::from((ql[l] & 0x0F) + h1) - m1;
                hi[l] = d2 * f32::from((ql[l] >> 4) + h2) - m2;
            }
        }
    }
}

/// Scalar reference dequantizer, equal to ggml's `dequantize_row_q5_K`.
/// `out.len()` must be `blocks.len() * 256`.
pub fn dequantize_row_q5_k(blocks: &[BlockQ5K], out: &mut [f32]) {
    BlockQ5K::dequantize_row(blocks, out)
}
