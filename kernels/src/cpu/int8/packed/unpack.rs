//! Reading a packed matrix back: one quant, or a whole row as f32.

use half::f16;

use super::{PackedKind, PackedMatrix, QK, TILE};
use crate::quant::{
    BlockQ4_0, BlockQ4_1, BlockQ8_0, KVALUES_IQ4NL, KVALUES_MXFP4, dequantize_row_q4_0,
    dequantize_row_q4_1, dequantize_row_q8_0,
};

impl PackedMatrix {
    /// Quant `e` of block `b` of row `row`: unsigned (`Q8_0`: `q + 128`).
    pub(crate) fn quant(&self, row: usize, b: usize, e: usize) -> u8 {
        let (t, r) = (row / TILE, row % TILE);
        let lines = self.lines(t, b);
        let u = e % 4;
        match self.kind {
            PackedKind::Q8_0 => lines[e / 4].0[4 * r + u],
            PackedKind::Q3K => {
                let (g, bit) = (e / 4, 4 * r + u);
                let crumb = (lines[g / 4].0[bit] >> (2 * (g % 4))) & 3;
                crumb | ((lines[2].0[8 * g + bit / 8] >> (bit % 8)) & 1) << 2
            }
            _ => {
                let h = e / 4;
                let (nibble, word) = if h < QK / 8 {
                    (lines[h].0[4 * r + u] & 0x0F, 2 * h)
                } else {
                    (lines[h - QK / 8].0[4 * r + u] >> 4, 2 * (h - QK / 8) + 1)
                };
                let bit = 4 * r + u;
                (0..self.kind.high_lines()).fold(nibble, |q, level| {
                    let plane = &lines[QK / 8 + level].0;
                    q | (((plane[8 * word + bit / 8] >> (bit % 8)) & 1) << (4 + level))
                })
            }
        }
    }

    /// Row `row` as f32, exactly as the GGUF dequantizer writes it (but for the sign of zeros
    /// in `Q4_K` and `Q5_K` rows with a negative scale).
    pub fn row_f32(&self, row: usize, out: &mut [f32]) {
        assert!(row < self.rows, "row {row} of a {}-row matrix", self.rows);
        assert_eq!(out.len(), self.cols, "a row has cols values");
        let (t, r) = (row / TILE, row % TILE);
        for (b, y) in out.chunks_exact_mut(QK).enumerate() {
            let s = self.block_scales(t, b);
            let (first, second) = (s[0][r], s[1][r]);
            match self.kind {
                PackedKind::Q8_0 => {
                    let blk = BlockQ8_0 {
                        d: f16::from_f32(first),
                        qs: std::array::from_fn(|e| (self.quant(row, b, e) ^ 0x80) as i8),
                    };
                    dequantize_row_q8_0(std::slice::from_ref(&blk), y);
                }
                PackedKind::Q4_1 => {
                    let blk = BlockQ4_1 {
                        d: f16::from_f32(first),
                        m: f16::from_f32(second),
                        qs: std::array::from_fn(|j| {
                            self.quant(row, b, j) | (self.quant(row, b, j + QK / 2) << 4)
                        }),
                    };
                    dequantize_row_q4_1(std::slice::from_ref(&blk), y);
                }
                PackedKind::Q6K | PackedKind::Q3K => {
                    let offset = (32 >> self.kind.half_shift()) as f32;
                    for (e, v) in y.iter_mut().enumerate() {
                        let d = s[e / (QK / 2)][r];
                        *v = d * (f32::from(self.quant(row, b, e)) - offset);
                    }
                }
                // `d · q - dmin · m` as ggml's, with `-dmin · m` held.
                PackedKind::Q4K | PackedKind::Q5K | PackedKind::Q5_1 => {
                    for (e, v) in y.iter_mut().enumerate() {
                        *v = first * f32::from(self.quant(row, b, e)) + second;
                    }
                }
                PackedKind::IQ4NL | PackedKind::IQ4XS => {
                    for (e, v) in y.iter_mut().enumerate() {
                        let q = usize::from(self.quant(row, b, e));
                        *v = first * f32::from(KVALUES_IQ4NL[q]);
                    }
                }
                PackedKind::MXFP4 => {
                    for (e, v) in y.iter_mut().enumerate() {
                        let q = usize::from(self.quant(row, b, e));
                        *v = f32::from(KVALUES_MXFP4[q]) * first;
                    }
                }
                PackedKind::Q5_0 => {
                    for (e, v) in y.iter_mut().enumerate() {
                        *v = (i32::from(self.quant(row, b, e)) - 16) as f32 * first;
                    }
                }
                PackedKind::Q4_0 => {
                    let blk = BlockQ4_0 {
                        d: f16::from_f32(first),
                        qs: std::array::from_fn(|j| {
                            self.quant(row, b, j) | (self.quant(row, b, j + QK / 2) << 4)
                        }),
                    };
                    dequantize_row_q4_0(std::slice::from_ref(&blk), y);
                }
            }
        }
    }
}
