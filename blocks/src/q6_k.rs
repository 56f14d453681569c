//! `Q6_K`: 256-value super-blocks of sixteen 16-value sub-blocks with signed 8-bit scales,
//! 6-bit quants offset by 32.

use half::f16;

use crate::q4_k::QK_K;
use crate::{BlockFormat, QuantFormat};

/// One `Q6_K` block as ggml stores it (`block_q6_K`).
#[repr(C)]
#[derive(Debug, Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockQ6K {
    /// Low 4 bits of the quants.
    pub ql: [u8; QK_K / 2],
    /// High 2 bits of the quants.
    pub qh: [u8; QK_K / 4],
    /// Sub-block scales.
    pub scales: [i8; QK_K / 16],
    /// Super-block scale.
    pub d: f16,
}

const _: () = assert!(std::mem::size_of::<BlockQ6K>() == 210);

impl BlockFormat for BlockQ6K {
    const FORMAT: QuantFormat = QuantFormat::Q6K;
    const NAME: &'static str = "Q6_K";
    const BLOCK_ELEMENTS: usize = QK_K;

    /// ggml's `dequantize_row_q6_K` for one block.
    #[inline]
    fn dequantize_block(&self, out: &mut [f32]) {
        debug_assert_eq!(out.len(), Self::BLOCK_ELEMENTS);
        let d = self.d.to_f32();
        // Two halves of 128 values, each using 64 bytes of `ql`, 32 of `qh`, 8 scales.
        for half in 0..2 {
            let ql = &self.ql[64 * half..64 * half + 64];
            let qh = &self.qh[32 * half..32 * half + 32];
            let sc = &self.scales[8 * half..8 * half + 8];
            let y = &mut out[128 * half..128 * half + 128];
            for l in 0..32 {
                let is = l / 16;
                let q1 = i32::from((ql[l] & 0x0F) | (qh[l] & 3) << 4) - 32;
                let q2 = i32::from((ql[l + 32] & 0x0F) | ((qh[l] >> 2) & 3) << 4) - 32;
                let q3 = i32::from((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4) - 32;
                let q4 = i32::from((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4) - 32;
                y[l] = d * f32::from(sc[is]) * q1 as f32;
                y[l + 32] = d * f32::from(sc[is + 2]) * q2 as f32;
                y[l + 64] = d * f32::from(sc[is + 4]) * q3 as f32;
                y[l + 96] = d * f32::from(sc[is + 6]) * q4 as f32;
            }
        }
    }
}

/// Scalar reference dequantizer, equal to ggml's `dequantize_row_q6_K`.
/// `out.len()` must be `blocks.len() * 256`.
pub fn dequantize_row_q6_k(blocks: &[BlockQ6K], out: &mut [f32]) {
    BlockQ6K::dequantize_row(blocks, out)
}
