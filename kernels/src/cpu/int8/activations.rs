//! Activations quantized to two 8-bit digits per value, per 32-value block: the other operand
//! of the integer dot products.
//!
//! llama.cpp quantizes activations to one 8-bit digit (`Q8_1`: `h = round(x / s)` with
//! `s = max|x| / 127`). That moves logits enough to flip near-tied greedy choices. A second
//! digit for the remainder, `l = round((x / s - h) · 254)`, represents `x ≈ s · (h + l / 254)`
//! to about 15 bits for one more `vpdpbusd` per line, so the weights' own rounding dominates
//! again. The
//! kernels sum `254 · Σ w·h + Σ w·l` exactly in integers and scale once by `d = s / 254`.
//!
//! Every level quantizes with the same f32 operations (`max|x|`, `/ 127`, `1 / s`, `x · (1/s)`,
//! nearest-even rounding, `- h`, `· 254`, `/ 254`), so the digits are identical on every level
//! and a row's digits never depend on the other rows of the batch.

use super::packed::QK;

/// `m` rows of `k` values, quantized per block of 32.
#[derive(Debug, Default, Clone)]
pub struct QuantizedRows {
    pub(crate) m: usize,
    pub(crate) blocks: usize,
    /// `m × blocks × 32` high digits `h`.
    pub(crate) q: Vec<i8>,
    /// `m × blocks × 32` low digits `l`.
    pub(crate) q_lo: Vec<i8>,
    /// Scale of the combined digits `254 h + l`, per block.
    pub(crate) d: Vec<f32>,
    /// `d · Σ (254 h + l)` per block (the `m · Σ x` term of `Q4_1`).
    pub(crate) sd: Vec<f32>,
    /// `-128 · Σ (254 h + l)` per block (takes off what the unsigned `Q8_0` quants add).
    pub(crate) s128: Vec<i32>,
    /// `-32 · Σ (254 h + l)` over each 16-value half of each block, when asked for (takes off
    /// what the unsigned `Q6_K` quants add; shifted right by 3, what `Q3_K`'s add).
    pub(crate) s32_halves: Vec<[i32; 2]>,
    /// Every value as one 16-bit `254 h + l`, when asked for (what AVX2's `vpmaddwd` takes).
    pub(crate) combined: Vec<i16>,
}

/// What [`QuantizedRows::quantize`] computes besides the digits, for the kernels that read it.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Extras {
    /// [`QuantizedRows::s32_halves`] (for `Q6_K` and `Q3_K`).
    pub(crate) halves: bool,
    /// [`QuantizedRows::combined`] (for the AVX2 kernel).
    pub(crate) combined: bool,
}

/// One block's input and outputs, as the zipped iterators of [`QuantizedRows::quantize`]
/// hand them out.
type BlockOut<'a> = (
    ((&'a [f32], (&'a mut [i8], &'a mut [i8])), &'a mut f32),
    (&'a mut f32, &'a mut i32),
);

/// The weight of the high digit.
pub(crate) const RADIX: i32 = 254;

/// Quantizes one block: writes the digits `h` and `l`, returns `(d, Σ (254 h + l))`.
pub(crate) type QuantizeBlockFn = fn(x: &[f32], h: &mut [i8], l: &mut [i8]) -> (f32, i32);

/// The reference block quantizer.
pub(crate) fn quantize_block_ref(x: &[f32], h: &mut [i8], l: &mut [i8]) -> (f32, i32) {
    assert!(x.len() == QK && h.len() == QK && l.len() == QK);
    let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
    let s = amax / 127.0;
    let is = if amax != 0.0 { 1.0 / s } else { 0.0 };
    let mut sum = 0i32;
    for ((h, l), v) in h.iter_mut().zip(l.iter_mut()).zip(x) {
        let t = v * is;
        let hi = t.round_ties_even().clamp(-127.0, 127.0);
        let lo = ((t - hi) * RADIX as f32)
            .round_ties_even()
            .clamp(-127.0, 127.0);
        *h = hi as i8;
        *l = lo as i8;
        sum += RADIX * i32::from(*h) + i32::from(*l);
    }
    (s / RADIX as f32, sum)
}

impl QuantizedRows {
    /// Quantizes `x` (`m × k`, `k` a multiple of 32) with `quantize`, reusing the buffers, and
    /// computes the `extras` asked for.
    pub(crate) fn quantize(
        &mut self,
        x: &[f32],
        m: usize,
        k: usize,
        quantize: QuantizeBlockFn,
        extras: Extras,
    ) {
        assert!(k.is_multiple_of(QK), "int8 rows need whole blocks");
        assert_eq!(x.len(), m * k, "x must be m×k");
        let blocks = m * k / QK;
        self.m = m;
        self.blocks = k / QK;
        self.q.resize(blocks * QK, 0);
        self.q_lo.resize(blocks * QK, 0);
        self.d.resize(blocks, 0.0);
        self.sd.resize(blocks, 0.0);
        self.s128.resize(blocks, 0);
        let per = |(((xb, (qh, ql)), d), (sd, s)): BlockOut<'_>| {
            let (scale, sum) = quantize(xb, qh, ql);
            *d = scale;
            *sd = scale * sum as f32;
            *s = -128 * sum;
        };
        let it = x
            .chunks_exact(QK)
            .zip(
                self.q
                    .chunks_exact_mut(QK)
                    .zip(self.q_lo.chunks_exact_mut(QK)),
            )
            .zip(self.d.iter_mut())
            .zip(self.sd.iter_mut().zip(self.s128.iter_mut()));
        if blocks >= 2048 {
            use rayon::prelude::*;
            x.par_chunks_exact(QK)
                .zip(
                    self.q
                        .par_chunks_exact_mut(QK)
                        .zip(self.q_lo.par_chunks_exact_mut(QK)),
                )
                .zip(self.d.par_iter_mut())
                .zip(self.sd.par_iter_mut().zip(self.s128.par_iter_mut()))
                .for_each(per);
        } else {
            it.for_each(per);
        }
        self.s32_halves.clear();
        if extras.halves {
            let sum = |h: &[i8], l: &[i8]| -> i32 {
                h.iter()
                    .zip(l)
                    .map(|(&h, &l)| RADIX * i32::from(h) + i32::from(l))
                    .sum()
            };
            let half = QK / 2;
            self.s32_halves
                .extend(
                    self.q
                        .chunks_exact(QK)
                        .zip(self.q_lo.chunks_exact(QK))
                        .map(|(h, l)| {
                            [
                                -32 * sum(&h[..half], &l[..half]),
                                -32 * sum(&h[half..], &l[half..]),
                            ]
                        }),
                );
        }
        self.combined.clear();
        if extras.combined {
            self.combined.extend(
                self.q
                    .iter()
                    .zip(&self.q_lo)
                    .map(|(&h, &l)| RADIX as i16 * i16::from(h) + i16::from(l)),
            );
        }
    }

    /// High digits of block `b` of row `i`.
    pub(crate) fn block(&self, i: usize, b: usize) -> &[i8] {
        let j = i * self.blocks + b;
        &self.q[j * QK..(j + 1) * QK]
    }

    /// Low digits of block `b` of row `i`.
    pub(crate) fn block_lo(&self, i: usize, b: usize) -> &[i8] {
        let j = i * self.blocks + b;
        &self.q_lo[j * QK..(j + 1) * QK]
    }

    /// Index of block `b` of row `i` in the per-block vectors.
    pub(crate) fn at(&self, i: usize, b: usize) -> usize {
        i * self.blocks + b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_digits_represent_the_block_to_about_15_bits() {
        let x: Vec<f32> = (0..QK)
            .map(|i| ((i * 37 % 19) as f32 - 9.3) * 0.173)
            .collect();
        let (mut h, mut l) = ([0i8; QK], [0i8; QK]);
        let (d, sum) = quantize_block_ref(&x, &mut h, &mut l);
        let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
        assert!(h.iter().any(|&v| v.abs() == 127));
        let mut want_sum = 0;
        for i in 0..QK {
            let combined = RADIX * i32::from(h[i]) + i32::from(l[i]);
            want_sum += combined;
            let err = (combined as f32 * d - x[i]).abs();
            assert!(err <= amax / 127.0 / 254.0 * 0.51, "value {i}: error {err}");
        }
        assert_eq!(sum, want_sum);
        let (d, sum) = quantize_block_ref(&[0.0; QK], &mut h, &mut l);
        assert_eq!((d, sum), (0.0, 0));
        assert!(h.iter().chain(&l).all(|&v| v == 0));
    }
}
