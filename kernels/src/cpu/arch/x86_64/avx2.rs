//! AVX2 + FMA kernels: the 16 lanes of the common dot-product order live in two `ymm`
//! accumulators per output (lanes 0–7 and 8–15).
//!
//! The public face is [`KERNELS`]; it is only handed out by `Kernels::for_level` after `avx2`
//! and `fma` were detected, which is what makes the safe wrappers below sound.
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use crate::cpu::attention::{HeadQuery, attend_head};
use crate::cpu::dispatch::{Kernels, Level};
use crate::cpu::weights::Dequant;
use crate::quant::{BlockQ4_1, BlockQ8_0};
use half::bf16;

/// Rows of `x` per register tile (16 `ymm` registers: `2 × MR × NR` accumulators).
const MR: usize = 2;
/// Rows of `w` per register tile.
const NR: usize = 3;
/// Rows of `w` per tile when `x` has a single row (decode).
const NR_GEMV: usize = 4;

pub(crate) static KERNELS: Kernels = Kernels {
    level: Level::Avx2,
    gemm,
    gemm_bf16: None,
    dot,
    axpy,
    attend,
    silu_mul: super::silu::silu_mul_avx2,
    attention: super::attention_avx2::OPS,
    dequant: Dequant {
        q8_0: dequant_q8_0,
        q4_1: dequant_q4_1,
        bf16: dequant_bf16,
        f16: super::dequant_avx2::f16,
        q4_0: super::dequant_avx2::q4_0,
        q5_0: super::dequant_avx2::q5_0,
        q5_1: super::dequant_avx2::q5_1,
        q4_k: super::dequant_avx2::q4_k,
        q5_k: super::dequant_avx2::q5_k,
        q6_k: super::dequant_avx2::q6_k,
        q2_k: super::dequant_avx2::q2_k,
        q3_k: super::dequant_avx2::q3_k,
        iq4_nl: super::dequant_avx2::iq4_nl,
        iq4_xs: super::dequant_avx2::iq4_xs,
        mxfp4: super::dequant_avx2::mxfp4,
    },
};

/// A mask selecting lanes `0..n` (`n` clamped to 0..=8) for `maskload`/`maskstore`.
#[target_feature(enable = "avx2")]
#[inline]
pub(crate) fn mask(n: usize) -> __m256i {
    let n = n.min(8) as i32;
    _mm256_cmpgt_epi32(
        _mm256_set1_epi32(n),
        _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
    )
}

/// The fixed tree: `l + 8`, `l + 4`, `l + 2`, `l + 1`.
#[target_feature(enable = "avx2")]
#[inline]
pub(crate) fn hsum(lo: __m256, hi: __m256) -> f32 {
    let s8 = _mm256_add_ps(lo, hi);
    let s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps::<1>(s8));
    let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    let s1 = _mm_add_ss(s2, _mm_shuffle_ps::<0b01>(s2, s2));
    _mm_cvtss_f32(s1)
}

/// `R × C` dot products: rows `x[t * k..]` against rows `w[r * k..]`, results at
/// `out[t * ldo + r]`.
///
/// # Safety
/// `x` holds `R` rows and `w` holds `C` rows of `k` values; `out` is writable at those places.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn tile<const R: usize, const C: usize>(
    x: *const f32,
    w: *const f32,
    k: usize,
    out: *mut f32,
    ldo: usize,
) {
    let z = _mm256_setzero_ps();
    let mut lo = [[z; C]; R];
    let mut hi = [[z; C]; R];
    let full = k - k % 16;
    let mut c = 0;
    // SAFETY (whole body): loads read `c..c + 16 <= full` (or the masked tail below `k`) of a
    // row the caller guarantees; stores go to places the caller guarantees.
    unsafe {
        while c < full {
            let mut wl = [z; C];
            let mut wh = [z; C];
            for r in 0..C {
                wl[r] = _mm256_loadu_ps(w.add(r * k + c));
                wh[r] = _mm256_loadu_ps(w.add(r * k + c + 8));
            }
            for t in 0..R {
                let xl = _mm256_loadu_ps(x.add(t * k + c));
                let xh = _mm256_loadu_ps(x.add(t * k + c + 8));
                for r in 0..C {
                    lo[t][r] = _mm256_fmadd_ps(xl, wl[r], lo[t][r]);
                    hi[t][r] = _mm256_fmadd_ps(xh, wh[r], hi[t][r]);
                }
            }
            c += 16;
        }
        if c < k {
            let rem = k - c;
            let (ml, mh) = (mask(rem), mask(rem.saturating_sub(8)));
            let mut wl = [z; C];
            let mut wh = [z; C];
            for r in 0..C {
                wl[r] = _mm256_maskload_ps(w.add(r * k + c), ml);
                wh[r] = _mm256_maskload_ps(w.add(r * k + c + 8), mh);
            }
            for t in 0..R {
                let xl = _mm256_maskload_ps(x.add(t * k + c), ml);
                let xh = _mm256_maskload_ps(x.add(t * k + c + 8), mh);
                for r in 0..C {
                    lo[t][r] = _mm256_fmadd_ps(xl, wl[r], lo[t][r]);
                    hi[t][r] = _mm256_fmadd_ps(xh, wh[r], hi[t][r]);
                }
            }
        }
        for t in 0..R {
            for r in 0..C {
                *out.add(t * ldo + r) = hsum(lo[t][r], hi[t][r]);
            }
        }
    }
}

/// `R` rows of `x` against all `n` rows of `w`, `C` at a time, then one at a time.
///
/// # Safety
/// As [`tile`], for `R` rows of `x` and `n` rows of `w`.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn row_panel<const R: usize, const C: usize>(
    x: *const f32,
    w: *const f32,
    n: usize,
    k: usize,
    out: *mut f32,
    ldo: usize,
) {
    let mut j = 0;
    // SAFETY: tiles stay within rows 0..n of w and columns 0..n of out.
    unsafe {
        while j + C <= n {
            tile::<R, C>(x, w.add(j * k), k, out.add(j), ldo);
            j += C;
        }
        while j < n {
            tile::<R, 1>(x, w.add(j * k), k, out.add(j), ldo);
            j += 1;
        }
    }
}

/// Bytes of `x` rows one pass over a `w` tile walks: a block that stays in L2 while each tile
/// of `w` rows, loaded once from further away, is reused from L1 by every row pair.
const X_BLOCK_BYTES: usize = 192 * 1024;

#[target_feature(enable = "avx2,fma")]
unsafe fn gemm_avx2(x: &[f32], w: &[f32], k: usize, out: *mut f32, ldo: usize) {
    let (m, n) = (x.len() / k, w.len() / k);
    let (xp, wp) = (x.as_ptr(), w.as_ptr());
    // SAFETY: blocks and panels cover rows 0..m of x and 0..n of w, which the slices hold;
    // `out` places are the caller's guarantee.
    unsafe {
        if m == 1 {
            row_panel::<1, NR_GEMV>(xp, wp, n, k, out, ldo);
            return;
        }
        let paired = m - m % MR;
        let block = (X_BLOCK_BYTES / (4 * k)).max(MR) / MR * MR;
        let mut i0 = 0;
        while i0 < paired {
            let rows = block.min(paired - i0);
            col_panel(xp.add(i0 * k), rows, wp, n, k, out.add(i0 * ldo), ldo);
            i0 += rows;
        }
        if paired < m {
            row_panel::<1, NR_GEMV>(xp.add(paired * k), wp, n, k, out.add(paired * ldo), ldo);
        }
    }
}

/// `rows` (a multiple of `MR`) rows of `x` against all `n` rows of `w`: each tile of `NR`
/// rows of `w` meets every row pair before the next tile, through [`row_panel`], so every
/// output is the same [`tile`] dot.
///
/// # Safety
/// As [`tile`], for `rows` rows of `x` and `n` rows of `w`.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn col_panel(
    x: *const f32,
    rows: usize,
    w: *const f32,
    n: usize,
    k: usize,
    out: *mut f32,
    ldo: usize,
) {
    let mut j = 0;
    // SAFETY: panels stay within rows 0..rows of x, 0..n of w and the matching places of out.
    unsafe {
        while j < n {
            let cols = NR.min(n - j);
            for i in (0..rows).step_by(MR) {
                row_panel::<MR, NR>(
                    x.add(i * k),
                    w.add(j * k),
                    cols,
                    k,
                    out.add(i * ldo + j),
                    ldo,
                );
            }
            j += cols;
        }
    }
}

/// # Safety
/// As `GemmFn`.
unsafe fn gemm(x: &[f32], w: &[f32], k: usize, out: *mut f32, ldo: usize) {
    // SAFETY: KERNELS is only handed out when avx2 and fma are detected; the rest is the
    // caller's.
    unsafe { gemm_avx2(x, w, k, out, ldo) }
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let mut out = 0f32;
    // SAFETY: avx2 and fma were detected (see KERNELS); both rows hold a.len() values and
    // `out` is a local.
    unsafe { tile::<1, 1>(a.as_ptr(), b.as_ptr(), a.len(), &mut out, 1) };
    out
}

#[target_feature(enable = "avx2,fma")]
fn axpy_avx2(a: f32, x: &[f32], y: &mut [f32]) {
    let n = x.len().min(y.len());
    let av = _mm256_set1_ps(a);
    let (xp, yp) = (x.as_ptr(), y.as_mut_ptr());
    let mut i = 0;
    // SAFETY: indices stay below n, within both slices (the tail is masked).
    unsafe {
        while i + 8 <= n {
            let r = _mm256_fmadd_ps(av, _mm256_loadu_ps(xp.add(i)), _mm256_loadu_ps(yp.add(i)));
            _mm256_storeu_ps(yp.add(i), r);
            i += 8;
        }
        if i < n {
            let m = mask(n - i);
            let r = _mm256_fmadd_ps(
                av,
                _mm256_maskload_ps(xp.add(i), m),
                _mm256_maskload_ps(yp.add(i), m),
            );
            _mm256_maskstore_ps(yp.add(i), m, r);
        }
    }
}

fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
    // SAFETY: avx2 and fma were detected (see KERNELS).
    unsafe { axpy_avx2(a, x, y) }
}

#[target_feature(enable = "avx2,fma")]
fn attend_avx2(
    hq: &HeadQuery<'_>,
    cache_k: &[f32],
    cache_v: &[f32],
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    let dot = |a: &[f32], b: &[f32]| {
        assert_eq!(a.len(), b.len());
        let mut d = 0f32;
        // SAFETY: this function only runs where the level's features were detected (see
        // KERNELS); both rows hold a.len() values and `d` is a local.
        unsafe { tile::<1, 1>(a.as_ptr(), b.as_ptr(), a.len(), &mut d, 1) };
        d
    };
    attend_head(hq, cache_k, cache_v, scores, out, dot, |a, x, y| {
        axpy_avx2(a, x, y)
    });
}

fn attend(
    hq: &HeadQuery<'_>,
    cache_k: &[f32],
    cache_v: &[f32],
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    // SAFETY: the level's features were detected (see KERNELS).
    unsafe { attend_avx2(hq, cache_k, cache_v, scores, out) }
}

#[target_feature(enable = "avx2")]
fn dequant_q8_0_avx2(blocks: &[BlockQ8_0], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * 32, "32 values per block");
    let op = out.as_mut_ptr();
    for (i, b) in blocks.iter().enumerate() {
        let d = _mm256_set1_ps(b.d.to_f32());
        let q = b.qs.as_ptr();
        for g in 0..4 {
            // SAFETY: bytes 8g..8g + 8 of the 32 in `qs`; values i * 32 + 8g.. of `out`.
            unsafe {
                let v = _mm256_cvtepi8_epi32(_mm_loadl_epi64(q.add(8 * g).cast::<__m128i>()));
                _mm256_storeu_ps(
                    op.add(i * 32 + 8 * g),
                    _mm256_mul_ps(_mm256_cvtepi32_ps(v), d),
                );
            }
        }
    }
}

fn dequant_q8_0(blocks: &[BlockQ8_0], out: &mut [f32]) {
    // SAFETY: avx2 was detected (see KERNELS).
    unsafe { dequant_q8_0_avx2(blocks, out) }
}

/// `q·d + m` with one rounding: `q·d` is exact (4-bit times f16), so the fused form equals
/// the reference's multiply-then-add.
#[target_feature(enable = "avx2,fma")]
fn dequant_q4_1_avx2(blocks: &[BlockQ4_1], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * 32, "32 values per block");
    let op = out.as_mut_ptr();
    let low = _mm256_set1_epi32(0x0F);
    for (i, b) in blocks.iter().enumerate() {
        let d = _mm256_set1_ps(b.d.to_f32());
        let m = _mm256_set1_ps(b.m.to_f32());
        let q = b.qs.as_ptr();
        for g in 0..2 {
            // SAFETY: bytes 8g..8g + 8 of the 16 in `qs`; values i * 32 + 8g.. and
            // i * 32 + 16 + 8g.. of `out`.
            unsafe {
                let v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(q.add(8 * g).cast::<__m128i>()));
                let lo = _mm256_cvtepi32_ps(_mm256_and_si256(v, low));
                let hi = _mm256_cvtepi32_ps(_mm256_srli_epi32::<4>(v));
                _mm256_storeu_ps(op.add(i * 32 + 8 * g), _mm256_fmadd_ps(lo, d, m));
                _mm256_storeu_ps(op.add(i * 32 + 16 + 8 * g), _mm256_fmadd_ps(hi, d, m));
            }
        }
    }
}

fn dequant_q4_1(blocks: &[BlockQ4_1], out: &mut [f32]) {
    // SAFETY: avx2 and fma were detected (see KERNELS).
    unsafe { dequant_q4_1_avx2(blocks, out) }
}

#[target_feature(enable = "avx2")]
fn dequant_bf16_avx2(src: &[bf16], out: &mut [f32]) {
    assert_eq!(out.len(), src.len(), "one value per bfloat16");
    let n = src.len();
    let full = n - n % 8;
    let (sp, op) = (src.as_ptr(), out.as_mut_ptr());
    // SAFETY: every load reads 8 values below `full <= n` of `src`, every store 8 of `out`.
    unsafe {
        let mut i = 0;
        while i < full {
            let v = _mm256_cvtepu16_epi32(_mm_loadu_si128(sp.add(i).cast::<__m128i>()));
            _mm256_storeu_ps(op.add(i), _mm256_castsi256_ps(_mm256_slli_epi32::<16>(v)));
            i += 8;
        }
    }
    crate::cpu::weights::bf16_to_f32_ref(&src[full..], &mut out[full..]);
}

fn dequant_bf16(src: &[bf16], out: &mut [f32]) {
    // SAFETY: avx2 was detected (see KERNELS).
    unsafe { dequant_bf16_avx2(src, out) }
}
