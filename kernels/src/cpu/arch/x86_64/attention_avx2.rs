//! AVX2 + FMA tile kernels of attention (see `attention::tile` for what each computes).
//!
//! A 16-key tile of scores is two registers (keys in lanes), so a score is a plain chain of
//! fused multiply-adds over the head dimension; `p · V` keeps the head dimension in lanes.
//! Only reached through `avx2::KERNELS`, handed out after `avx2` and `fma` were detected,
//! which is what makes the safe wrappers sound.
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use half::bf16;

use super::avx2::{hsum, mask};

use crate::cpu::attention::tile::{
    EXP2_COEFFS, EXP2_MIN, KEY_TILE, Rows, TileOps, check_scores_tiles,
};

pub(crate) const OPS: TileOps = TileOps {
    scores,
    scores_tiles,
    scores_tiles_bf16,
    softmax,
    pv,
    pv_bf16,
    widen_bf16,
};

const _: () = assert!(KEY_TILE == 16);

/// Query vectors per register block of `scores` (two accumulators each).
const QB: usize = 6;

/// Largest lane (exact, so the order does not matter).
#[target_feature(enable = "avx2")]
#[inline]
fn hmax(lo: __m256, hi: __m256) -> f32 {
    let s8 = _mm256_max_ps(lo, hi);
    let s4 = _mm_max_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps::<1>(s8));
    let s2 = _mm_max_ps(s4, _mm_movehl_ps(s4, s4));
    let s1 = _mm_max_ss(s2, _mm_shuffle_ps::<0b01>(s2, s2));
    _mm_cvtss_f32(s1)
}

/// `2^x` for `x <= 0`, lane-wise as `tile::exp2_portable` but with fused multiply-adds.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn exp2(x: __m256) -> __m256 {
    let keep = _mm256_cmp_ps::<_CMP_GE_OQ>(x, _mm256_set1_ps(EXP2_MIN));
    let x = _mm256_max_ps(x, _mm256_set1_ps(EXP2_MIN));
    let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(x);
    let f = _mm256_sub_ps(x, n);
    let mut p = _mm256_set1_ps(EXP2_COEFFS[7]);
    for &c in EXP2_COEFFS[..7].iter().rev() {
        p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(c));
    }
    // 2^n from the biased exponent; n >= -126 keeps it a normal number.
    let bits = _mm256_slli_epi32::<23>(_mm256_add_epi32(
        _mm256_cvtps_epi32(n),
        _mm256_set1_epi32(127),
    ));
    _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(bits)), keep)
}

fn scores(q: &[f32], kt: &[f32], hd: usize, out: &mut [f32]) {
    let tile = Rows {
        data: kt,
        stride: KEY_TILE,
        width: KEY_TILE,
    };
    // SAFETY: avx2 and fma were detected (see avx2::KERNELS).
    unsafe { scores_rows_avx2(q, hd, &[tile], out) }
}

/// Scores of `N` query vectors against one key tile read in place (`k`: its first row, rows
/// `stride` apart): per score a chain of fused multiply-adds over the head dimension, in
/// order; written at `out[i * 16..]`.
///
/// # Safety
/// `q` holds `N * hd` values, `k` `hd` rows of 16, `out` is writable for `N * 16`.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn scores_rows_block<const N: usize, E: Value>(
    q: *const f32,
    k: *const E,
    stride: usize,
    hd: usize,
    out: *mut f32,
) {
    let mut acc = [[_mm256_setzero_ps(); 2]; N];
    // SAFETY: reads `q[i * hd + d]` and rows `d < hd` of the tile; writes `out[..N * 16]`.
    unsafe {
        for d in 0..hd {
            let k0 = E::load(k.add(d * stride), 8);
            let k1 = E::load(k.add(d * stride + 8), 8);
            for (i, a) in acc.iter_mut().enumerate() {
                let qv = _mm256_set1_ps(*q.add(i * hd + d));
                a[0] = _mm256_fmadd_ps(qv, k0, a[0]);
                a[1] = _mm256_fmadd_ps(qv, k1, a[1]);
            }
        }
        for (i, a) in acc.iter().enumerate() {
            _mm256_storeu_ps(out.add(i * KEY_TILE), a[0]);
            _mm256_storeu_ps(out.add(i * KEY_TILE + 8), a[1]);
        }
    }
}

#[target_feature(enable = "avx2,fma")]
fn scores_rows_avx2<E: Value>(q: &[f32], hd: usize, keys: &[Rows<'_, E>], out: &mut [f32]) {
    let n = check_scores_tiles(q, hd, keys, out);
    let qp = q.as_ptr();
    for (t, key) in keys.iter().enumerate() {
        let (kp, o) = (key.data.as_ptr(), out[t * n * KEY_TILE..].as_mut_ptr());
        let mut i = 0;
        // SAFETY: the checks above cover what each block reads and writes.
        unsafe {
            while i < n {
                let (qi, oi) = (qp.add(i * hd), o.add(i * KEY_TILE));
                match n - i {
                    1 => scores_rows_block::<1, E>(qi, kp, key.stride, hd, oi),
                    2 => scores_rows_block::<2, E>(qi, kp, key.stride, hd, oi),
                    3 => scores_rows_block::<3, E>(qi, kp, key.stride, hd, oi),
                    4 => scores_rows_block::<4, E>(qi, kp, key.stride, hd, oi),
                    5 => scores_rows_block::<5, E>(qi, kp, key.stride, hd, oi),
                    _ => scores_rows_block::<QB, E>(qi, kp, key.stride, hd, oi),
                }
                i += QB;
            }
        }
    }
}

fn scores_tiles(q: &[f32], hd: usize, keys: &[Rows<'_>], out: &mut [f32]) {
    // SAFETY: avx2 and fma were detected (see avx2::KERNELS).
    unsafe { scores_rows_avx2(q, hd, keys, out) }
}

fn scores_tiles_bf16(q: &[f32], hd: usize, keys: &[Rows<'_, bf16>], out: &mut [f32]) {
    // SAFETY: avx2 and fma were detected (see avx2::KERNELS).
    unsafe { scores_rows_avx2(q, hd, keys, out) }
}

#[target_feature(enable = "avx2,fma")]
fn softmax_avx2(
    s: &mut [f32],
    lo: usize,
    hi: usize,
    m: &mut [f32],
    l: &mut [f32],
    corr: &mut [f32],
) {
    assert!(lo <= hi && hi < KEY_TILE);
    let heads = m.len();
    assert!(s.len() >= heads * KEY_TILE && l.len() >= heads && corr.len() >= heads);
    let idx0 = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    let idx1 = _mm256_add_epi32(idx0, _mm256_set1_epi32(8));
    // Lane j is valid when lo <= j <= hi, i.e. j > lo - 1 and hi + 1 > j.
    let (lo_m1, hi_p1) = (
        _mm256_set1_epi32(lo as i32 - 1),
        _mm256_set1_epi32(hi as i32 + 1),
    );
    let valid = |idx: __m256i| {
        _mm256_castsi256_ps(_mm256_and_si256(
            _mm256_cmpgt_epi32(idx, lo_m1),
            _mm256_cmpgt_epi32(hi_p1, idx),
        ))
    };
    let (v0, v1) = (valid(idx0), valid(idx1));
    let neg_inf = _mm256_set1_ps(f32::NEG_INFINITY);
    // Heads in groups of eight, each step for the whole group (as the AVX-512 kernel): the
    // heads' reduction chains overlap, and their corrections are one `exp2`, lane i for head i.
    for g0 in (0..heads).step_by(8) {
        let n = (heads - g0).min(8);
        let mut v = [(neg_inf, neg_inf); 8];
        let mut m_new = [0f32; 8];
        for i in 0..n {
            let sp = s[(g0 + i) * KEY_TILE..].as_ptr();
            // SAFETY: `s` holds 16 scores per head (asserted above).
            let (a, b) = unsafe { (_mm256_loadu_ps(sp), _mm256_loadu_ps(sp.add(8))) };
            v[i] = (
                _mm256_blendv_ps(neg_inf, a, v0),
                _mm256_blendv_ps(neg_inf, b, v1),
            );
            m_new[i] = m[g0 + i].max(hmax(v[i].0, v[i].1));
        }
        let mut old = [0f32; 8];
        old[..n].copy_from_slice(&m[g0..g0 + n]);
        let mut c = [0f32; 8];
        // SAFETY: 8 lanes from and into 8-value arrays.
        unsafe {
            let (o, mn) = (
                _mm256_loadu_ps(old.as_ptr()),
                _mm256_loadu_ps(m_new.as_ptr()),
            );
            _mm256_storeu_ps(c.as_mut_ptr(), exp2(_mm256_sub_ps(o, mn)));
        }
        for i in 0..n {
            let (g, (a, b)) = (g0 + i, v[i]);
            let mv = _mm256_set1_ps(m_new[i]);
            let (pa, pb) = (exp2(_mm256_sub_ps(a, mv)), exp2(_mm256_sub_ps(b, mv)));
            l[g] = l[g] * c[i] + hsum(pa, pb);
            m[g] = m_new[i];
            corr[g] = c[i];
            let sp = s[g * KEY_TILE..].as_mut_ptr();
            // SAFETY: as the load.
            unsafe {
                _mm256_storeu_ps(sp, pa);
                _mm256_storeu_ps(sp.add(8), pb);
            }
        }
    }
}

fn softmax(s: &mut [f32], lo: usize, hi: usize, m: &mut [f32], l: &mut [f32], corr: &mut [f32]) {
    // SAFETY: avx2 and fma were detected (see avx2::KERNELS).
    unsafe { softmax_avx2(s, lo, hi, m, l, corr) }
}

/// Value elements `pv` reads: f32 as stored, bf16 widened in registers (exact).
trait Value: Copy {
    /// `n` (at most 8) values at `p` as f32 lanes, the rest zero.
    ///
    /// # Safety
    /// `p` is readable for `n` values; AVX2 is available.
    unsafe fn load(p: *const Self, n: usize) -> __m256;
}

impl Value for f32 {
    #[inline(always)]
    unsafe fn load(p: *const f32, n: usize) -> __m256 {
        // SAFETY: the caller guarantees AVX2 and `n` readable values.
        unsafe {
            if n >= 8 {
                _mm256_loadu_ps(p)
            } else {
                _mm256_maskload_ps(p, mask(n))
            }
        }
    }
}

impl Value for bf16 {
    #[inline(always)]
    unsafe fn load(p: *const bf16, n: usize) -> __m256 {
        // SAFETY: the caller guarantees AVX2 and `n` readable values (a tail is copied out,
        // so nothing past them is read).
        unsafe {
            let h = if n >= 8 {
                _mm_loadu_si128(p.cast())
            } else {
                let mut tail = [0u16; 8];
                std::ptr::copy_nonoverlapping(p.cast::<u16>(), tail.as_mut_ptr(), n);
                _mm_loadu_si128(tail.as_ptr().cast())
            };
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
        }
    }
}

/// `p · V` for `N` heads of one row, 8 lanes of the head dimension at a time.
///
/// # Safety
/// `p` holds `N * 16` values, `corr` `N`, `v` rows `lo..=hi` of `hd` values `stride` apart,
/// `o` is writable for `N * hd`.
#[target_feature(enable = "avx2,fma")]
#[inline]
#[allow(clippy::too_many_arguments)]
unsafe fn pv_block<const N: usize, E: Value>(
    p: *const f32,
    corr: *const f32,
    v: *const E,
    stride: usize,
    hd: usize,
    lo: usize,
    hi: usize,
    o: *mut f32,
) {
    let mut c = 0;
    // SAFETY: every access is below the bounds the caller guarantees; the tail is masked.
    unsafe {
        while c < hd {
            let n = (hd - c).min(8);
            let mask = mask(n);
            let mut acc = [_mm256_setzero_ps(); N];
            for (h, a) in acc.iter_mut().enumerate() {
                let x = _mm256_maskload_ps(o.add(h * hd + c), mask);
                *a = _mm256_mul_ps(x, _mm256_set1_ps(*corr.add(h)));
            }
            for j in lo..=hi {
                let vj = E::load(v.add(j * stride + c), n);
                for (h, a) in acc.iter_mut().enumerate() {
                    *a = _mm256_fmadd_ps(_mm256_set1_ps(*p.add(h * KEY_TILE + j)), vj, *a);
                }
            }
            for (h, a) in acc.iter().enumerate() {
                _mm256_maskstore_ps(o.add(h * hd + c), mask, *a);
            }
            c += 8;
        }
    }
}

#[target_feature(enable = "avx2,fma")]
fn pv_avx2<E: Value>(p: &[f32], corr: &[f32], v: Rows<'_, E>, lo: usize, hi: usize, o: &mut [f32]) {
    let (heads, hd, stride) = (corr.len(), v.width, v.stride);
    assert!(lo <= hi && hi < KEY_TILE && v.holds(hi));
    assert!(p.len() >= heads * KEY_TILE && o.len() >= heads * hd);
    let mut g = 0;
    // SAFETY: blocks cover heads g..g + N <= heads, within the asserted lengths.
    unsafe {
        while g < heads {
            let (pp, cp, op) = (
                p.as_ptr().add(g * KEY_TILE),
                corr.as_ptr().add(g),
                o.as_mut_ptr().add(g * hd),
            );
            let vp = v.data.as_ptr();
            match heads - g {
                1 => pv_block::<1, E>(pp, cp, vp, stride, hd, lo, hi, op),
                2 => pv_block::<2, E>(pp, cp, vp, stride, hd, lo, hi, op),
                3 => pv_block::<3, E>(pp, cp, vp, stride, hd, lo, hi, op),
                _ => pv_block::<4, E>(pp, cp, vp, stride, hd, lo, hi, op),
            }
            g += 4;
        }
    }
}

fn pv_bf16(p: &[f32], corr: &[f32], v: Rows<'_, bf16>, lo: usize, hi: usize, o: &mut [f32]) {
    // SAFETY: avx2 and fma were detected (see avx2::KERNELS).
    unsafe { pv_avx2(p, corr, v, lo, hi, o) }
}

fn pv(p: &[f32], corr: &[f32], v: Rows<'_>, lo: usize, hi: usize, o: &mut [f32]) {
    // SAFETY: avx2 and fma were detected (see avx2::KERNELS).
    unsafe { pv_avx2(p, corr, v, lo, hi, o) }
}

#[target_feature(enable = "avx2")]
fn widen_bf16_avx2(src: &[bf16], stride: usize, width: usize, rows: usize, dst: &mut [f32]) {
    if rows == 0 {
        return;
    }
    assert!(width <= stride && src.len() >= (rows - 1) * stride + width);
    assert!(dst.len() >= rows * width);
    let full = width - width % 8;
    let (sp, dp) = (src.as_ptr(), dst.as_mut_ptr());
    for j in 0..rows {
        let mut c = 0;
        // SAFETY: columns c..c + 8 <= width of row j, within both slices (asserted).
        unsafe {
            while c < full {
                let v = _mm256_cvtepu16_epi32(_mm_loadu_si128(
                    sp.add(j * stride + c).cast::<__m128i>(),
                ));
                _mm256_storeu_ps(
                    dp.add(j * width + c),
                    _mm256_castsi256_ps(_mm256_slli_epi32::<16>(v)),
                );
                c += 8;
            }
        }
        for c in full..width {
            dst[j * width + c] = src[j * stride + c].to_f32();
        }
    }
}

fn widen_bf16(src: &[bf16], stride: usize, width: usize, rows: usize, dst: &mut [f32]) {
    // SAFETY: avx2 was detected (see avx2::KERNELS).
    unsafe { widen_bf16_avx2(src, stride, width, rows, dst) }
}
