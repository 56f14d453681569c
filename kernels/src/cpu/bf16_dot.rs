//! bf16 weights times bf16-rounded activations, accumulated in f32: what `--dtype bfloat16`
//! computes, as PyTorch does for a bf16 model.
//!
//! The activations are rounded to bf16 (nearest-even) once per call. Products then go through
//! AVX512_BF16's `vdpbf16ps`, two bf16 pairs per f32 lane per instruction: twice the f32 FMA
//! peak, and no widening of the weights. Where the CPU lacks it, [`dot_portable`] computes the
//! same bits in plain Rust.
//!
//! Arithmetic of one output (what `vdpbf16ps` does on this machine, checked bit for bit on
//! random data): both rows are cut into chunks of 32 values, the last zero-padded; lane `l`
//! of 16 takes values `2l` and `2l + 1` of each chunk, in chunk order, as
//! `acc = ftz(ftz(acc + x[2l+1]·w[2l+1]) + x[2l]·w[2l])` (subnormal bf16 inputs read as zero,
//! subnormal results flushed to zero; each product is exact in f32); then the lanes are
//! summed in the tree `l + 8`, `l + 4`, `l + 2`, `l + 1`. A row's outputs do not depend on
//! the batch.
#![allow(unsafe_code)]

use std::cell::RefCell;

use half::bf16;

use super::dispatch::{Kernels, Level, kernels};
use super::matmul::{check_shapes, linear_chunks};

/// Values per chunk: one 512-bit register of bf16.
pub(crate) const CHUNK: usize = 32;

/// `out[i * ldo + j] = dot(x_i, w_j)` for the `m` rows of `x` (bf16, `kp` apart, zero past
/// `k`) and the rows of `w` (`k` apart).
///
/// # Safety
/// `out` must be writable at every such place, and nothing else may access them meanwhile.
pub(crate) type Bf16DotGemm =
    unsafe fn(x: &[bf16], kp: usize, w: &[bf16], k: usize, out: *mut f32, ldo: usize);

thread_local! {
    /// The rounded activations of the current call.
    static ROUNDED: RefCell<Vec<bf16>> = const { RefCell::new(Vec::new()) };
}

/// `out[m, n] = bf16(x)[m, k] · w[n, k]ᵀ + bias[n]` with the dispatched level.
pub fn linear_bf16_dot(
    x: &[f32],
    w: &[bf16],
    bias: Option<&[f32]>,
    m: usize,
    k: usize,
    out: &mut [f32],
) {
    linear_bf16_dot_with(kernels(), x, w, bias, m, k, out)
}

/// [`linear_bf16_dot`] at an explicit level (AVX-512 uses `vdpbf16ps` where the CPU has it;
/// every other case the portable reference).
pub fn linear_bf16_dot_with(
    kernels: &Kernels,
    x: &[f32],
    w: &[bf16],
    bias: Option<&[f32]>,
    m: usize,
    k: usize,
    out: &mut [f32],
) {
    let Some(n) = check_shapes(x, w.len(), bias, m, k, out) else {
        return;
    };
    let gemm = gemm_for(kernels.level);
    let kp = k.next_multiple_of(CHUNK);
    // Taken out of the thread-local for the call, not borrowed: while it waits for the
    // parallel loop, this thread may run another product's task, which needs a buffer too.
    let mut xb = ROUNDED.take();
    xb.clear();
    xb.resize(m * kp, bf16::ZERO);
    for (dst, src) in xb.chunks_exact_mut(kp).zip(x.chunks_exact(k)) {
        round_to_bf16(src, dst);
    }
    let rounded = &xb[..];
    // SAFETY: `linear_chunks` hands each call its own columns of `out`, as `Bf16DotGemm`
    // requires.
    linear_chunks(w, k, m, bias, out, |wc, base| unsafe {
        gemm(rounded, kp, wc, k, base, n)
    });
    ROUNDED.set(xb);
}

/// Whether `kernels`' level has `vdpbf16ps` (AVX512_BF16). Elsewhere the portable reference
/// reproduces its bits value by value, far slower than f32 activations over the same bf16
/// weights, so callers should keep f32 activations there.
pub fn hardware_bf16(kernels: &Kernels) -> bool {
    has_vdpbf16ps(kernels.level)
}

/// Whether `level` runs `vdpbf16ps`.
fn has_vdpbf16ps(level: Level) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        level == Level::Avx512 && super::arch::x86_64::bf16_dot::supported()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = level;
        false
    }
}

/// The kernel `level` runs.
fn gemm_for(level: Level) -> Bf16DotGemm {
    #[cfg(target_arch = "x86_64")]
    if has_vdpbf16ps(level) {
        return super::arch::x86_64::bf16_dot::gemm;
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = level;
    gemm_portable
}

/// The reference kernel: [`dot_portable`] for every pair of rows.
///
/// # Safety
/// As [`Bf16DotGemm`].
unsafe fn gemm_portable(x: &[bf16], kp: usize, w: &[bf16], k: usize, out: *mut f32, ldo: usize) {
    for (i, xr) in x.chunks_exact(kp).enumerate() {
        for (j, wr) in w.chunks_exact(k).enumerate() {
            // SAFETY: (i, j) is inside m × n; the caller vouches for those places.
            unsafe { *out.add(i * ldo + j) = dot_portable(xr, wr) };
        }
    }
}

/// One output as the module documentation defines it: `x` zero-padded to whole chunks, `w`
/// of any length (read as zero past its end).
pub(crate) fn dot_portable(x: &[bf16], w: &[bf16]) -> f32 {
    let value = |v: &[bf16], i: usize| v.get(i).map_or(0.0, |b| daz(*b));
    let mut acc = [0f32; 16];
    for c in (0..w.len()).step_by(CHUNK) {
        for (l, a) in acc.iter_mut().enumerate() {
            let (i0, i1) = (c + 2 * l, c + 2 * l + 1);
            *a = ftz(*a + value(x, i1) * value(w, i1));
            *a = ftz(*a + value(x, i0) * value(w, i0));
        }
    }
    let mut width = 8;
    while width > 0 {
        for l in 0..width {
            acc[l] += acc[l + width];
        }
        width /= 2;
    }
    acc[0]
}

/// A bf16 as f32, subnormals read as (signed) zero.
fn daz(b: bf16) -> f32 {
    let v = b.to_f32();
    if v.is_subnormal() {
        0.0f32.copysign(v)
    } else {
        v
    }
}

/// Subnormal results flushed to (signed) zero.
fn ftz(v: f32) -> f32 {
    if v.is_subnormal() {
        0.0f32.copysign(v)
    } else {
        v
    }
}

/// `dst[i] = bf16::from_f32(src[i])` (round to nearest, ties to even; NaN stays a quiet NaN),
/// written without branches so that the compiler turns it into vector code (`half`'s
/// per-value conversion branches, which would dominate writing a step's K/V).
pub(crate) fn round_to_bf16(src: &[f32], dst: &mut [bf16]) {
    for (d, &s) in dst.iter_mut().zip(src) {
        let b = s.to_bits();
        let rounded = (b.wrapping_add(0x7FFF + ((b >> 16) & 1)) >> 16) as u16;
        let nan = (b & 0x7FFF_FFFF) > 0x7F80_0000;
        let quiet = ((b >> 16) as u16) | 0x0040;
        *d = bf16::from_bits(if nan { quiet } else { rounded });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_to_bf16_matches_half() {
        let mut bits: Vec<u32> = (0..1u32 << 20)
            .map(|i| i.wrapping_mul(0x9E37_79B9))
            .collect();
        bits.extend([
            0,
            0x8000_0000,
            0x7F80_0000,
            0xFF80_0000,
            0x7FC0_0000,
            0x7F80_0001,
            0xFFFF_FFFF,
            0x7F7F_FFFF,
            0x0000_8000,
            0x0001_8000,
            0x3F80_8000,
            0x3F81_8000,
            0x0000_0001,
        ]);
        let src: Vec<f32> = bits.iter().map(|&b| f32::from_bits(b)).collect();
        let mut got = vec![bf16::ZERO; src.len()];
        round_to_bf16(&src, &mut got);
        for (s, g) in src.iter().zip(&got) {
            assert_eq!(
                g.to_bits(),
                bf16::from_f32(*s).to_bits(),
                "{:#010x}",
                s.to_bits()
            );
        }
    }
    use crate::cpu::test_util::{levels, random};
    use rand::SeedableRng;

    /// Within f32 rounding of the f64 product of the bf16-rounded inputs, and the portable
    /// reference's bits on every level, on odd shapes and tails.
    #[test]
    fn every_level_matches_the_reference_on_odd_shapes() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
        for (m, k, n) in [
            (1, 1, 1),
            (1, 31, 9),
            (2, 33, 17),
            (5, 64, 40),
            (4, 576, 33),
            (9, 100, 13),
            (16, 577, 70),
            (1, 1536, 300),
        ] {
            let x = random(&mut rng, m * k);
            let wf = random(&mut rng, n * k);
            let w: Vec<bf16> = wf.iter().map(|&v| bf16::from_f32(v)).collect();
            let b = random(&mut rng, n);
            let mut reference = vec![0f32; m * n];
            linear_bf16_dot_with(
                Kernels::for_level(Level::Portable).unwrap(),
                &x,
                &w,
                Some(&b),
                m,
                k,
                &mut reference,
            );
            for i in 0..m {
                for j in 0..n {
                    let exact: f64 = (0..k)
                        .map(|t| bf16::from_f32(x[i * k + t]).to_f64() * w[j * k + t].to_f64())
                        .sum::<f64>()
                        + b[j] as f64;
                    let got = reference[i * n + j] as f64;
                    assert!(
                        (got - exact).abs() <= 1e-6 * (k as f64).sqrt() * 4.0 + 1e-6,
                        "{m}x{k}x{n} ({i}, {j}): {got} vs {exact}"
                    );
                }
            }
            for kern in levels() {
                let mut out = vec![f32::NAN; m * n];
                linear_bf16_dot_with(kern, &x, &w, Some(&b), m, k, &mut out);
                assert!(
                    out.iter()
                        .zip(&reference)
                        .all(|(a, r)| a.to_bits() == r.to_bits()),
                    "{kern:?} {m}x{k}x{n} differs from the reference"
                );
            }
        }
    }

    #[test]
    fn rows_do_not_depend_on_the_batch() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(12);
        let (m, k, n) = (11, 200, 37);
        let x = random(&mut rng, m * k);
        let w: Vec<bf16> = random(&mut rng, n * k)
            .into_iter()
            .map(bf16::from_f32)
            .collect();
        for kern in levels() {
            let mut all = vec![0f32; m * n];
            linear_bf16_dot_with(kern, &x, &w, None, m, k, &mut all);
            for i in 0..m {
                let mut one = vec![0f32; n];
                linear_bf16_dot_with(kern, &x[i * k..(i + 1) * k], &w, None, 1, k, &mut one);
                assert_eq!(&all[i * n..(i + 1) * n], &one[..], "{kern:?} row {i}");
            }
        }
    }

    #[test]
    fn subnormals_read_as_zero_and_results_flush() {
        let tiny = bf16::from_bits(0x0001);
        assert_eq!(dot_portable(&[tiny, bf16::ZERO], &[bf16::ONE]), 0.0);
        let (a, b) = (bf16::from_f32(1e-20), bf16::from_f32(1e-19));
        assert_eq!(dot_portable(&[a], &[b]), 0.0);
        assert_eq!(
            dot_portable(
                &[bf16::from_f32(2.0), bf16::from_f32(3.0)],
                &[bf16::ONE, bf16::ONE]
            ),
            5.0
        );
    }
}
