//! AVX-512 F kernels: one 16-lane `zmm` accumulator per output, as the portable level's lanes.
//!
//! The public face is [`KERNELS`]; it is only handed out by `Kernels::for_level` after
//! `avx512f` was detected, which is what makes the safe wrappers below sound.
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use crate::cpu::attention::{HeadQuery, attend_head};
use crate::cpu::dispatch::{Kernels, Level};
use crate::cpu::weights::Dequant;
use crate::quant::{BlockQ4_1, BlockQ8_0};
use half::bf16;

/// Rows of `x` per register tile.
const MR: usize = 4;
/// Rows of `w` per register tile (`MR × NR` accumulators).
const NR: usize = 4;
/// Rows of `w` per tile when `x` has a single row (decode): more loads in flight.
const NR_GEMV: usize = 8;

pub(crate) static KERNELS: Kernels = Kernels {
    level: Level::Avx512,
    gemm,
    gemm_bf16: Some(gemm_bf16),
    dot,
    axpy,
    attend,
    silu_mul: super::silu::silu_mul_avx512,
    attention: super::attention_avx512::OPS,
    dequant: Dequant {
        q8_0: dequant_q8_0,
        q4_1: dequant_q4_1,
        bf16: dequant_bf16,
        f16: super::dequant_avx512::f16,
        q4_0: super::dequant_avx512::q4_0,
        q5_0: super::dequant_avx512::q5_0,
        q5_1: super::dequant_avx512::q5_1,
        q4_k: super::dequant_avx512::q4_k,
        q5_k: super::dequant_avx512::q5_k,
        q6_k: super::dequant_avx512::q6_k,
        q2_k: super::dequant_avx512::q2_k,
        q3_k: super::dequant_avx512::q3_k,
        iq4_nl: super::dequant_avx512::iq4_nl,
        iq4_xs: super::dequant_avx512::iq4_xs,
        mxfp4: super::dequant_avx512::mxfp4,
    },
};

/// Lanes `0..n` of a 16-lane mask.
#[inline]
fn tail_mask(n: usize) -> __mmask16 {
    assert!(n < 16);
    ((1u32 << n) - 1) as __mmask16
}

/// The fixed tree: `l + 8`, `l + 4`, `l + 2`, `l + 1`.
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) fn hsum(v: __m512) -> f32 {
    let lo = _mm512_castps512_ps256(v);
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
    let s8 = _mm256_add_ps(lo, hi);
    let s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps::<1>(s8));
    let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    let s1 = _mm_add_ss(s2, _mm_shuffle_ps::<0b01>(s2, s2));
    _mm_cvtss_f32(s1)
}

/// [`hsum`] of 16 registers at once, in the same tree (so the same bits): each step adds the
/// halves of two registers' live lanes in one instruction. Lane `4q + s` of the result is the
/// sum of `v[4s + q]`, written to `out[4s + q]`.
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) fn hsum16(v: &[__m512; 16], out: &mut [f32; 16]) {
    reduce16::<false>(v, out)
}

/// The largest lane of each of 16 registers, `out[i]` for `v[i]` (as [`hsum16`], with max).
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) fn hmax16(v: &[__m512; 16], out: &mut [f32; 16]) {
    reduce16::<true>(v, out)
}

#[target_feature(enable = "avx512f")]
#[inline]
fn combine<const MAX: bool>(x: __m512, y: __m512) -> __m512 {
    if MAX {
        _mm512_max_ps(x, y)
    } else {
        _mm512_add_ps(x, y)
    }
}

#[target_feature(enable = "avx512f")]
#[inline]
fn reduce16<const MAX: bool>(v: &[__m512; 16], out: &mut [f32; 16]) {
    // Lanes l and l + 8: two registers' 8 live lanes per result.
    let b: [__m512; 8] = std::array::from_fn(|i| {
        let (x, y) = (v[2 * i], v[2 * i + 1]);
        combine::<MAX>(
            _mm512_shuffle_f32x4::<0x44>(x, y),
            _mm512_shuffle_f32x4::<0xEE>(x, y),
        )
    });
    // l and l + 4: four registers' 4 live lanes, one per 128-bit quarter.
    let c: [__m512; 4] = std::array::from_fn(|i| {
        let (x, y) = (b[2 * i], b[2 * i + 1]);
        combine::<MAX>(
            _mm512_shuffle_f32x4::<0x88>(x, y),
            _mm512_shuffle_f32x4::<0xDD>(x, y),
        )
    });
    // l and l + 2, then l and l + 1, inside each quarter.
    let d: [__m512; 2] = std::array::from_fn(|i| {
        let (x, y) = (c[2 * i], c[2 * i + 1]);
        combine::<MAX>(
            _mm512_shuffle_ps::<0x44>(x, y),
            _mm512_shuffle_ps::<0xEE>(x, y),
        )
    });
    let e = combine::<MAX>(
        _mm512_shuffle_ps::<0x88>(d[0], d[1]),
        _mm512_shuffle_ps::<0xDD>(d[0], d[1]),
    );
    let mut lanes = [0f32; 16];
    // SAFETY: `lanes` holds 16 values.
    unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), e) };
    for q in 0..4 {
        for s in 0..4 {
            out[4 * s + q] = lanes[4 * q + s];
        }
    }
}

/// Weight element types the tiles read: f32 as stored, bfloat16 shifted into the upper half
/// of f32 lanes. Widening is exact, so a bf16 matrix gives the bits of its f32 widening while
/// reading half the bytes.
pub(crate) trait WeightElem: Copy {
    const BF16: bool;
}

impl WeightElem for f32 {
    const BF16: bool = false;
}

impl WeightElem for bf16 {
    const BF16: bool = true;
}

/// `n` (at most 16) weights at `p` as f32 lanes, the rest zero.
///
/// # Safety
/// `p` is readable for `n` values.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn load_weights<W: WeightElem>(p: *const W, n: usize) -> __m512 {
    // SAFETY: reads `n` values at `p`, as the caller guarantees.
    unsafe {
        if W::BF16 {
            let p = p.cast::<u16>();
            let h = if n == 16 {
                _mm256_loadu_si256(p.cast())
            } else {
                // A tail: copied out so that the load reads nothing past the row.
                let mut tail = [0u16; 16];
                std::ptr::copy_nonoverlapping(p, tail.as_mut_ptr(), n);
                _mm256_loadu_si256(tail.as_ptr().cast())
            };
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
        } else if n == 16 {
            _mm512_loadu_ps(p.cast())
        } else {
            _mm512_maskz_loadu_ps(tail_mask(n), p.cast())
        }
    }
}

/// `R × C` dot products: rows `x[t * k..]` against rows `w[r * k..]`, results at
/// `out[t * ldo + r]`.
///
/// # Safety
/// `x` holds `R` rows and `w` holds `C` rows of `k` values; `out` is writable at those places.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn tile<W: WeightElem, const R: usize, const C: usize>(
    x: *const f32,
    w: *const W,
    k: usize,
    out: *mut f32,
    ldo: usize,
) {
    let mut acc = [[_mm512_setzero_ps(); C]; R];
    let full = k - k % 16;
    let mut c = 0;
    // SAFETY (whole body): every load reads `c..c + 16 <= full` (or the masked tail below
    // `k`) of a row the caller guarantees; every store goes to a place the caller guarantees.
    unsafe {
        while c < full {
            let wv: [__m512; C] = std::array::from_fn(|r| load_weights(w.add(r * k + c), 16));
            for (t, row) in acc.iter_mut().enumerate() {
                let xv = _mm512_loadu_ps(x.add(t * k + c));
                for (a, wr) in row.iter_mut().zip(&wv) {
                    *a = _mm512_fmadd_ps(xv, *wr, *a);
                }
            }
            c += 16;
        }
        if c < k {
            let mask = tail_mask(k - c);
            let wv: [__m512; C] = std::array::from_fn(|r| load_weights(w.add(r * k + c), k - c));
            for (t, row) in acc.iter_mut().enumerate() {
                let xv = _mm512_maskz_loadu_ps(mask, x.add(t * k + c));
                for (a, wr) in row.iter_mut().zip(&wv) {
                    *a = _mm512_fmadd_ps(xv, *wr, *a);
                }
            }
        }
        store_sums(&acc, out, ldo);
    }
}

/// `out[t * ldo + r] = hsum(acc[t][r])`, sixteen at once for a 4 × 4 tile.
///
/// # Safety
/// `out` is writable at those places.
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) unsafe fn store_sums<const R: usize, const C: usize>(
    acc: &[[__m512; C]; R],
    out: *mut f32,
    ldo: usize,
) {
    // SAFETY: only the places the caller guarantees are written.
    unsafe {
        if R * C == 16 {
            let v: [__m512; 16] = std::array::from_fn(|i| acc[i / C][i % C]);
            let mut sums = [0f32; 16];
            hsum16(&v, &mut sums);
            for (i, &x) in sums.iter().enumerate() {
                *out.add(i / C * ldo + i % C) = x;
            }
            return;
        }
        for (t, row) in acc.iter().enumerate() {
            for (r, a) in row.iter().enumerate() {
                *out.add(t * ldo + r) = hsum(*a);
            }
        }
    }
}

/// `R` rows of `x` against all `n` rows of `w`, `C` at a time, then one at a time.
///
/// # Safety
/// As [`tile`], for `R` rows of `x` and `n` rows of `w`.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn row_panel<W: WeightElem, const R: usize, const C: usize>(
    x: *const f32,
    w: *const W,
    n: usize,
    k: usize,
    out: *mut f32,
    ldo: usize,
) {
    let mut j = 0;
    // SAFETY: tiles stay within rows 0..n of w and columns 0..n of out.
    unsafe {
        while j + C <= n {
            tile::<W, R, C>(x, w.add(j * k), k, out.add(j), ldo);
            j += C;
        }
        while j < n {
            tile::<W, R, 1>(x, w.add(j * k), k, out.add(j), ldo);
            j += 1;
        }
    }
}

#[target_feature(enable = "avx512f")]
unsafe fn gemm_avx512<W: WeightElem>(x: &[f32], w: &[W], k: usize, out: *mut f32, ldo: usize) {
    let (m, n) = (x.len() / k, w.len() / k);
    let (xp, wp) = (x.as_ptr(), w.as_ptr());
    // SAFETY: panels cover rows 0..m of x and 0..n of w, which the slices hold; `out` places
    // are the caller's guarantee.
    unsafe {
        if m == 1 {
            row_panel::<W, 1, NR_GEMV>(xp, wp, n, k, out, ldo);
            return;
        }
        let mut i = 0;
        while i + MR <= m {
            row_panel::<W, MR, NR>(xp.add(i * k), wp, n, k, out.add(i * ldo), ldo);
            i += MR;
        }
        let (xr, o) = (xp.add(i * k), out.add(i * ldo));
        match m - i {
            3 => row_panel::<W, 3, NR>(xr, wp, n, k, o, ldo),
            2 => row_panel::<W, 2, NR>(xr, wp, n, k, o, ldo),
            1 => row_panel::<W, 1, NR_GEMV>(xr, wp, n, k, o, ldo),
            _ => {}
        }
    }
}

/// # Safety
/// As `GemmFn`.
unsafe fn gemm(x: &[f32], w: &[f32], k: usize, out: *mut f32, ldo: usize) {
    // SAFETY: KERNELS is only handed out when avx512f is detected; the rest is the caller's.
    unsafe { gemm_avx512(x, w, k, out, ldo) }
}

/// [`gemm`] with bfloat16 weights widened in registers: bit-identical to [`gemm`] over the
/// widened matrix.
///
/// # Safety
/// As `GemmBf16Fn`.
unsafe fn gemm_bf16(x: &[f32], w: &[bf16], k: usize, out: *mut f32, ldo: usize) {
    // SAFETY: KERNELS is only handed out when avx512f is detected; the rest is the caller's.
    unsafe { gemm_avx512(x, w, k, out, ldo) }
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let mut out = 0f32;
    // SAFETY: avx512f was detected (see KERNELS); both rows hold a.len() values and `out` is a
    // local.
    unsafe { tile::<f32, 1, 1>(a.as_ptr(), b.as_ptr(), a.len(), &mut out, 1) };
    out
}

#[target_feature(enable = "avx512f")]
fn axpy_avx512(a: f32, x: &[f32], y: &mut [f32]) {
    let n = x.len().min(y.len());
    let av = _mm512_set1_ps(a);
    let full = n - n % 16;
    let (xp, yp) = (x.as_ptr(), y.as_mut_ptr());
    // SAFETY: indices stay below n, within both slices (the tail is masked).
    unsafe {
        let mut i = 0;
        while i < full {
            let r = _mm512_fmadd_ps(av, _mm512_loadu_ps(xp.add(i)), _mm512_loadu_ps(yp.add(i)));
            _mm512_storeu_ps(yp.add(i), r);
            i += 16;
        }
        if i < n {
            let mask = tail_mask(n - i);
            let r = _mm512_fmadd_ps(
                av,
                _mm512_maskz_loadu_ps(mask, xp.add(i)),
                _mm512_maskz_loadu_ps(mask, yp.add(i)),
            );
            _mm512_mask_storeu_ps(yp.add(i), mask, r);
        }
    }
}

fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
    // SAFETY: avx512f was detected (see KERNELS).
    unsafe { axpy_avx512(a, x, y) }
}

#[target_feature(enable = "avx512f")]
fn attend_avx512(
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
        unsafe { tile::<f32, 1, 1>(a.as_ptr(), b.as_ptr(), a.len(), &mut d, 1) };
        d
    };
    attend_head(hq, cache_k, cache_v, scores, out, dot, |a, x, y| {
        axpy_avx512(a, x, y)
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
    unsafe { attend_avx512(hq, cache_k, cache_v, scores, out) }
}

#[target_feature(enable = "avx512f")]
fn dequant_q8_0_avx512(blocks: &[BlockQ8_0], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * 32, "32 values per block");
    let op = out.as_mut_ptr();
    for (i, b) in blocks.iter().enumerate() {
        let d = _mm512_set1_ps(b.d.to_f32());
        let q = b.qs.as_ptr().cast::<__m128i>();
        // SAFETY: `qs` holds 32 bytes (two 16-byte loads); `out` holds 32 values at i * 32.
        unsafe {
            let lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(q)));
            let hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(q.add(1))));
            _mm512_storeu_ps(op.add(i * 32), _mm512_mul_ps(lo, d));
            _mm512_storeu_ps(op.add(i * 32 + 16), _mm512_mul_ps(hi, d));
        }
    }
}

fn dequant_q8_0(blocks: &[BlockQ8_0], out: &mut [f32]) {
    // SAFETY: avx512f was detected (see KERNELS).
    unsafe { dequant_q8_0_avx512(blocks, out) }
}

/// `q·d + m` with one rounding: `q·d` is exact (4-bit times f16), so the fused form equals
/// the reference's multiply-then-add.
#[target_feature(enable = "avx512f")]
fn dequant_q4_1_avx512(blocks: &[BlockQ4_1], out: &mut [f32]) {
    assert_eq!(out.len(), blocks.len() * 32, "32 values per block");
    let op = out.as_mut_ptr();
    let low = _mm512_set1_epi32(0x0F);
    for (i, b) in blocks.iter().enumerate() {
        let d = _mm512_set1_ps(b.d.to_f32());
        let m = _mm512_set1_ps(b.m.to_f32());
        // SAFETY: `qs` holds 16 bytes; `out` holds 32 values at i * 32.
        unsafe {
            let q = _mm512_cvtepu8_epi32(_mm_loadu_si128(b.qs.as_ptr().cast::<__m128i>()));
            let lo = _mm512_cvtepi32_ps(_mm512_and_si512(q, low));
            let hi = _mm512_cvtepi32_ps(_mm512_srli_epi32::<4>(q));
            _mm512_storeu_ps(op.add(i * 32), _mm512_fmadd_ps(lo, d, m));
            _mm512_storeu_ps(op.add(i * 32 + 16), _mm512_fmadd_ps(hi, d, m));
        }
    }
}

fn dequant_q4_1(blocks: &[BlockQ4_1], out: &mut [f32]) {
    // SAFETY: avx512f was detected (see KERNELS).
    unsafe { dequant_q4_1_avx512(blocks, out) }
}

#[target_feature(enable = "avx512f")]
fn dequant_bf16_avx512(src: &[bf16], out: &mut [f32]) {
    assert_eq!(out.len(), src.len(), "one value per bfloat16");
    let n = src.len();
    let full = n - n % 16;
    let (sp, op) = (src.as_ptr(), out.as_mut_ptr());
    // SAFETY: every load reads 16 values below `full <= n` of `src`, every store 16 of `out`.
    unsafe {
        let mut i = 0;
        while i < full {
            let v = _mm512_cvtepu16_epi32(_mm256_loadu_si256(sp.add(i).cast::<__m256i>()));
            _mm512_storeu_ps(op.add(i), _mm512_castsi512_ps(_mm512_slli_epi32::<16>(v)));
            i += 16;
        }
    }
    crate::cpu::weights::bf16_to_f32_ref(&src[full..], &mut out[full..]);
}

fn dequant_bf16(src: &[bf16], out: &mut [f32]) {
    // SAFETY: avx512f was detected (see KERNELS).
    unsafe { dequant_bf16_avx512(src, out) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sixteen_sums_and_maxima_at_once_equal_one_at_a_time() {
        if !is_x86_feature_detected!("avx512f") {
            return;
        }
        let vals: Vec<f32> = (0..256)
            .map(|i| ((i * 7919) % 1000) as f32 * 1.37e-3 - 0.61 + (i as f32).sin() * 1e3)
            .collect();
        // SAFETY: avx512f was detected above; every load reads 16 of the 256 values.
        unsafe {
            let v: [__m512; 16] = std::array::from_fn(|i| _mm512_loadu_ps(vals[i * 16..].as_ptr()));
            let mut got = [0f32; 16];
            hsum16(&v, &mut got);
            for (i, x) in v.iter().enumerate() {
                assert_eq!(got[i].to_bits(), hsum(*x).to_bits(), "register {i}");
            }
            hmax16(&v, &mut got);
            for (i, x) in v.iter().enumerate() {
                assert_eq!(got[i], _mm512_reduce_max_ps(*x), "register {i}");
            }
        }
    }
}
