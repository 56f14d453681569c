//! `MXFP4` (OCP microscaling FP4): 32 values per block, each a 4-bit E2M1 float, and one
//! shared power-of-two scale (E8M0). gpt-oss's experts ship in it, both in Hugging Face
//! checkpoints (`*_blocks` and `*_scales` tensors, see [`BlockMXFP4::from_checkpoint`]) and in
//! GGUF files (type 39, ggml's `block_mxfp4`, this struct's layout).

use crate::{BlockFormat, QuantFormat};

/// Values per [`BlockMXFP4`].
pub const QK_MXFP4: usize = 32;

/// The E2M1 values doubled, so that they are integers (ggml's `kvalues_mxfp4`): index `i`
/// stands for `KVALUES_MXFP4[i] / 2`, and the block scale is halved to match.
pub const KVALUES_MXFP4: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// One `MXFP4` block as ggml stores it (`block_mxfp4`).
#[repr(C)]
#[derive(Debug, Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BlockMXFP4 {
    /// The E8M0 scale: the block's values are multiplied by `2^(e - 127)`.
    pub e: u8,
    /// Indices: the low nibble of byte `j` is value `j`, the high nibble value `j + 16`.
    pub qs: [u8; QK_MXFP4 / 2],
}

const _: () = assert!(std::mem::size_of::<BlockMXFP4>() == 17);

/// `2^(e - 128)`, the scale of the doubled table values (ggml's `ggml_e8m0_to_fp32_half`):
/// exact in f32, subnormal for `e < 2`.
pub const fn e8m0_to_f32_half(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        (e as u32 - 1) << 23
    };
    f32::from_bits(bits)
}

impl BlockMXFP4 {
    /// A block from a Hugging Face checkpoint's layout: its `*_scales` byte (the same E8M0
    /// exponent) and its 16 `*_blocks` bytes, whose low nibble of byte `j` is value `2 j` and
    /// high nibble value `2 j + 1` (transformers' `convert_moe_packed_tensors`).
    pub fn from_checkpoint(scale: u8, packed: &[u8; QK_MXFP4 / 2]) -> Self {
        let index = |e: usize| (packed[e / 2] >> (4 * (e % 2))) & 0x0F;
        Self {
            e: scale,
            qs: std::array::from_fn(|j| index(j) | index(j + 16) << 4),
        }
    }
}

impl BlockFormat for BlockMXFP4 {
    const FORMAT: QuantFormat = QuantFormat::MXFP4;
    const NAME: &'static str = "MXFP4";
    const BLOCK_ELEMENTS: usize = QK_MXFP4;

    /// ggml's `dequantize_row_mxfp4` for one block.
    #[inline]
    fn dequantize_block(&self, out: &mut [f32]) {
        debug_assert_eq!(out.len(), Self::BLOCK_ELEMENTS);
        let d = e8m0_to_f32_half(self.e);
        let (lo, hi) = out.split_at_mut(QK_MXFP4 / 2);
        for (j, &q) in self.qs.iter().enumerate() {
            lo[j] = f32::from(KVALUES_MXFP4[usize::from(q & 0x0F)]) * d;
            hi[j] = f32::from(KVALUES_MXFP4[usize::from(q >> 4)]) * d;
        }
    }
}

/// Scalar reference dequantizer, equal to ggml's `dequantize_row_mxfp4`.
/// `out.len()` must be `blocks.len() * 32`.
pub fn dequantize_row_mxfp4(blocks: &[BlockMXFP4], out: &mut [f32]) {
    BlockMXFP4::dequantize_row(blocks, out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scale_is_a_power_of_two_halved() {
        assert_eq!(e8m0_to_f32_half(127), 0.5);
        assert_eq!(e8m0_to_f32_half(128), 1.0);
        assert_eq!(e8m0_to_f32_half(130), 4.0);
        assert_eq!(e8m0_to_f32_half(1), 2f32.powi(-127));
        assert_eq!(e8m0_to_f32_half(0), 2f32.powi(-128));
        assert_eq!(e8m0_to_f32_half(254), 2f32.powi(126));
    }

    #[test]
    fn checkpoint_blocks_interleave_their_nibbles() {
        // Value k holds index k % 16 in the checkpoint's order: byte j = (2j) | (2j+1) << 4.
        let packed: [u8; 16] =
            std::array::from_fn(|j| ((2 * j) % 16) as u8 | (((2 * j + 1) % 16) as u8) << 4);
        let block = BlockMXFP4::from_checkpoint(128, &packed);
        let mut out = [0.0; 32];
        block.dequantize_block(&mut out);
        let want: Vec<f32> = (0..32).map(|k| f32::from(KVALUES_MXFP4[k % 16])).collect();
        assert_eq!(out.to_vec(), want);
    }
}
