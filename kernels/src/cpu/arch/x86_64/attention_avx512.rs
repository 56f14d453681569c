//! AVX-512 F tile kernels of attention (see `attention::tile` for what each computes).
//!
//! Scores keep one key per lane (a 16-key tile is one register), so a score is a plain
//! chain of fused multiply-adds over the head dimension; `p · V` keeps the head dimension in
//! lanes. Only reached through `avx512::KERNELS`, handed out after `avx512f` was detected,
//! which is what makes the safe wrappers sound.
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use half::bf16;

use super::avx512::{hmax16, hsum, hsum16};

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

/// Query vectors per register block of `scores`.
const QB: usize = 8;

/// `2^x` for `x <= 0`, lane-wise as `tile::exp2_portable` but with fused multiply-adds.
#[target_feature(enable = "avx512f")]
#[inline]
fn exp2(x: __m512) -> __m512 {
    let keep = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(x, _mm512_set1_ps(EXP2_MIN));
    let x = _mm512_max_ps(x, _mm512_set1_ps(EXP2_MIN));
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(x);
    let f = _mm512_sub_ps(x, n);
    let mut p = _mm512_set1_ps(EXP2_COEFFS[7]);
    for &c in EXP2_COEFFS[..7].iter().rev() {
        p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c));
    }
    _mm512_maskz_mov_ps(keep, _mm512_scalef_ps(p, n))
}

fn scores(q: &[f32], kt: &[f32], hd: usize, out: &mut [f32]) {
    let tile = Rows {
        data: kt,
        stride: KEY_TILE,
        width: KEY_TILE,
    };
    // SAFETY: avx512f was detected (see avx512::KERNELS).
    unsafe { scores_rows_avx512(q, hd, &[tile], out) }
}

/// Scores of `N` query vectors against `T` key tiles read in place (`k[t]`: tile `t`'s first
/// row, rows `stride` apart): `N · T` independent chains of fused multiply-adds over the head
/// dimension, so the multiply-add latency is hidden even for few vectors. Scores go to
/// `out[(t · n + i) · 16..]` (`n`: the call's vectors).
///
/// # Safety
/// `q` holds `N * hd` values, each `k[t]` `hd` rows of 16, `out` is writable at those places.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn scores_tiles_block<const N: usize, const T: usize, E: Value>(
    q: *const f32,
    k: [*const E; T],
    stride: usize,
    hd: usize,
    n: usize,
    out: *mut f32,
) {
    let mut acc = [[_mm512_setzero_ps(); T]; N];
    // SAFETY: reads `q[i * hd + d]` and rows `d < hd` of each tile; writes the tiles' scores
    // of these vectors, all within the caller's guarantee.
    unsafe {
        for d in 0..hd {
            let kd: [__m512; T] = std::array::from_fn(|t| E::load(k[t].add(d * stride), 16));
            for (i, a) in acc.iter_mut().enumerate() {
                let qd = _mm512_set1_ps(*q.add(i * hd + d));
                for (t, at) in a.iter_mut().enumerate() {
                    *at = _mm512_fmadd_ps(qd, kd[t], *at);
                }
            }
        }
        for (i, a) in acc.iter().enumerate() {
            for (t, at) in a.iter().enumerate() {
                _mm512_storeu_ps(out.add((t * n + i) * KEY_TILE), *at);
            }
        }
    }
}

/// Vectors `i..i + N` against every tile of `k` (one to four).
///
/// # Safety
/// As [`scores_tiles_block`].
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn scores_tiles_n<const N: usize, E: Value>(
    q: *const f32,
    k: &[*const E],
    stride: usize,
    hd: usize,
    n: usize,
    out: *mut f32,
) {
    // SAFETY: forwarded.
    unsafe {
        match *k {
            [a] => scores_tiles_block::<N, 1, E>(q, [a], stride, hd, n, out),
            [a, b] => scores_tiles_block::<N, 2, E>(q, [a, b], stride, hd, n, out),
            [a, b, c] => scores_tiles_block::<N, 3, E>(q, [a, b, c], stride, hd, n, out),
            [a, b, c, d] => scores_tiles_block::<N, 4, E>(q, [a, b, c, d], stride, hd, n, out),
            _ => unreachable!("one to four key tiles"),
        }
    }
}

#[target_feature(enable = "avx512f")]
fn scores_rows_avx512<E: Value>(q: &[f32], hd: usize, keys: &[Rows<'_, E>], out: &mut [f32]) {
    let n = check_scores_tiles(q, hd, keys, out);
    let stride = keys.first().map_or(KEY_TILE, |k| k.stride);
    // Tiles of one call share a stride (blocks of one cache, or the staging buffer).
    assert!(keys.iter().all(|k| k.stride == stride));
    let (qp, op) = (q.as_ptr(), out.as_mut_ptr());
    // Eight chains per block hide the multiply-add latency: eight vectors against one tile
    // (prefill), up to four against several (decode).
    let per = if keys.len() == 1 { QB } else { 4 };
    for (c, chunk) in keys.chunks(4).enumerate() {
        let k: [*const E; 4] = std::array::from_fn(|t| chunk[t.min(chunk.len() - 1)].data.as_ptr());
        let k = &k[..chunk.len()];
        let o = op.wrapping_add(4 * c * n * KEY_TILE);
        let mut i = 0;
        // SAFETY: the checks above cover what each block reads and writes.
        unsafe {
            while i < n {
                let (qi, oi) = (qp.add(i * hd), o.add(i * KEY_TILE));
                match (n - i).min(per) {
                    1 => scores_tiles_n::<1, E>(qi, k, stride, hd, n, oi),
                    2 => scores_tiles_n::<2, E>(qi, k, stride, hd, n, oi),
                    3 => scores_tiles_n::<3, E>(qi, k, stride, hd, n, oi),
                    4 => scores_tiles_n::<4, E>(qi, k, stride, hd, n, oi),
                    5 => scores_tiles_n::<5, E>(qi, k, stride, hd, n, oi),
                    6 => scores_tiles_n::<6, E>(qi, k, stride, hd, n, oi),
                    7 => scores_tiles_n::<7, E>(qi, k, stride, hd, n, oi),
                    _ => scores_tiles_n::<QB, E>(qi, k, stride, hd, n, oi),
                }
                i += per;
            }
        }
    }
}

fn scores_tiles(q: &[f32], hd: usize, keys: &[Rows<'_>], out: &mut [f32]) {
    // SAFETY: avx512f was detected (see avx512::KERNELS).
    unsafe { scores_rows_avx512(q, hd, keys, out) }
}

fn scores_tiles_bf16(q: &[f32], hd: usize, keys: &[Rows<'_, bf16>], out: &mut [f32]) {
    // SAFETY: avx512f was detected (see avx512::KERNELS).
    unsafe { scores_rows_avx512(q, hd, keys, out) }
}

#[target_feature(enable = "avx512f")]
fn softmax_avx512(
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
    let valid = (((1u32 << (hi + 1)) - 1) & !((1u32 << lo) - 1)) as __mmask16;
    let neg_inf = _mm512_set1_ps(f32::NEG_INFINITY);
    if heads >= WIDE_HEADS {
        for g0 in (0..heads).step_by(WIDE_HEADS) {
            // SAFETY: heads g0.. exist in every slice (asserted above).
            unsafe { softmax_wide_group(s, valid, g0, m, l, corr) };
        }
        return;
    }
    // Heads in groups, each step for the whole group before the next: the maxima's and sums'
    // reductions are long dependency chains, and the heads' chains then overlap. The
    // corrections of a group are one `exp2` (lane i: head i, the same lane-wise operations).
    for g0 in (0..heads).step_by(SOFTMAX_HEADS) {
        let n = (heads - g0).min(SOFTMAX_HEADS);
        let lanes = ((1u32 << n) - 1) as __mmask16;
        let mut v = [neg_inf; SOFTMAX_HEADS];
        let mut m_new = [0f32; SOFTMAX_HEADS];
        for i in 0..n {
            // SAFETY: `s` holds 16 scores per head (asserted above).
            v[i] =
                unsafe { _mm512_mask_loadu_ps(neg_inf, valid, s[(g0 + i) * KEY_TILE..].as_ptr()) };
            m_new[i] = m[g0 + i].max(_mm512_reduce_max_ps(v[i]));
        }
        // SAFETY: lanes below `n` of `m[g0..]`, `m_new` and `corr[g0..]` exist.
        unsafe {
            let old = _mm512_maskz_loadu_ps(lanes, m[g0..].as_ptr());
            let c = exp2(_mm512_sub_ps(
                old,
                _mm512_maskz_loadu_ps(lanes, m_new.as_ptr()),
            ));
            _mm512_mask_storeu_ps(corr[g0..].as_mut_ptr(), lanes, c);
        };
        for i in 0..n {
            let g = g0 + i;
            let p = exp2(_mm512_sub_ps(v[i], _mm512_set1_ps(m_new[i])));
            l[g] = l[g] * corr[g] + hsum(p);
            m[g] = m_new[i];
            // SAFETY: as the load.
            unsafe { _mm512_storeu_ps(s[g * KEY_TILE..].as_mut_ptr(), p) };
        }
    }
}

/// [`softmax_avx512`] for heads `g0..g0 + 16` (fewer at the end) of a call with many heads (a
/// prefill tile's rows): their maxima and sums are reduced together (`hmax16`, `hsum16`: the
/// tree of `hsum`, so each head's bits are its own), and their corrections and new sums are
/// lane-wise vectors, lane i for head i.
///
/// # Safety
/// `m`, `l` and `corr` hold more than `g0` heads, and `s` 16 scores for each head of `m`.
#[target_feature(enable = "avx512f")]
unsafe fn softmax_wide_group(
    s: &mut [f32],
    valid: __mmask16,
    g0: usize,
    m: &mut [f32],
    l: &mut [f32],
    corr: &mut [f32],
) {
    let neg_inf = _mm512_set1_ps(f32::NEG_INFINITY);
    let n = (m.len() - g0).min(WIDE_HEADS);
    let lanes = ((1u32 << n) - 1) as __mmask16;
    // SAFETY (whole body): heads g0..g0 + n exist in every slice (the caller's contract);
    // lanes at and past `n` are neither loaded nor stored.
    unsafe {
        let mut v = [neg_inf; WIDE_HEADS];
        for (i, vi) in v.iter_mut().enumerate().take(n) {
            *vi = _mm512_mask_loadu_ps(neg_inf, valid, s[(g0 + i) * KEY_TILE..].as_ptr());
        }
        let mut tile_max = [0f32; WIDE_HEADS];
        hmax16(&v, &mut tile_max);
        let old = _mm512_mask_loadu_ps(neg_inf, lanes, m[g0..].as_ptr());
        let m_new = _mm512_max_ps(old, _mm512_loadu_ps(tile_max.as_ptr()));
        let c = exp2(_mm512_sub_ps(old, m_new));
        let mut maxima = [0f32; WIDE_HEADS];
        _mm512_storeu_ps(maxima.as_mut_ptr(), m_new);
        let mut p = [_mm512_setzero_ps(); WIDE_HEADS];
        for i in 0..n {
            p[i] = exp2(_mm512_sub_ps(v[i], _mm512_set1_ps(maxima[i])));
            _mm512_storeu_ps(s[(g0 + i) * KEY_TILE..].as_mut_ptr(), p[i]);
        }
        let mut sums = [0f32; WIDE_HEADS];
        hsum16(&p, &mut sums);
        let l_old = _mm512_maskz_loadu_ps(lanes, l[g0..].as_ptr());
        let l_new = _mm512_add_ps(_mm512_mul_ps(l_old, c), _mm512_loadu_ps(sums.as_ptr()));
        _mm512_mask_storeu_ps(l[g0..].as_mut_ptr(), lanes, l_new);
        _mm512_mask_storeu_ps(m[g0..].as_mut_ptr(), lanes, m_new);
        _mm512_mask_storeu_ps(corr[g0..].as_mut_ptr(), lanes, c);
    }
}

/// Heads per group of [`softmax_avx512`].
const SOFTMAX_HEADS: usize = 8;

/// Heads per group of [`softmax_wide_group`], and the fewest a call needs to use it.
const WIDE_HEADS: usize = 16;

fn softmax(s: &mut [f32], lo: usize, hi: usize, m: &mut [f32], l: &mut [f32], corr: &mut [f32]) {
    // SAFETY: avx512f was detected (see avx512::KERNELS).
    unsafe { softmax_avx512(s, lo, hi, m, l, corr) }
}

/// Value elements `pv` reads: f32 as stored, bf16 widened in registers (exact).
trait Value: Copy {
    /// `n` (at most 16) values at `p` as f32 lanes, the rest zero.
    ///
    /// # Safety
    /// `p` is readable for `n` values.
    unsafe fn load(p: *const Self, n: usize) -> __m512;
}

impl Value for f32 {
    #[inline(always)]
    unsafe fn load(p: *const f32, n: usize) -> __m512 {
        // SAFETY: avx512f is enabled in every caller; `n` values are readable.
        unsafe {
            if n == 16 {
                _mm512_loadu_ps(p)
            } else {
                _mm512_maskz_loadu_ps(((1u32 << n) - 1) as __mmask16, p)
            }
        }
    }
}

impl Value for bf16 {
    #[inline(always)]
    unsafe fn load(p: *const bf16, n: usize) -> __m512 {
        // SAFETY: avx512f is enabled in every caller; `n` values are readable (a tail is
        // copied out, so nothing past them is read).
        unsafe {
            let h = if n == 16 {
                _mm256_loadu_si256(p.cast())
            } else {
                let mut tail = [0u16; 16];
                std::ptr::copy_nonoverlapping(p.cast::<u16>(), tail.as_mut_ptr(), n);
                _mm256_loadu_si256(tail.as_ptr().cast())
            };
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
        }
    }
}

/// `p · V` for `N` heads of one row, 16 lanes of the head dimension at a time.
///
/// # Safety
/// `p` holds `N * 16` values, `corr` `N`, `v` rows `lo..=hi` of `hd` values `stride` apart,
/// `o` is writable for `N * hd`.
#[target_feature(enable = "avx512f")]
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
        // Four vectors of the head dimension at once: each value row is then one 64-value
        // read, and 4·N independent chains keep the multiply-adds busy while it arrives.
        while c + 64 <= hd {
            let mut acc = [[_mm512_setzero_ps(); 4]; N];
            for (h, a) in acc.iter_mut().enumerate() {
                let ch = _mm512_set1_ps(*corr.add(h));
                for (u, x) in a.iter_mut().enumerate() {
                    *x = _mm512_mul_ps(_mm512_loadu_ps(o.add(h * hd + c + 16 * u)), ch);
                }
            }
            for j in lo..=hi {
                let vj: [__m512; 4] =
                    std::array::from_fn(|u| E::load(v.add(j * stride + c + 16 * u), 16));
                for (h, a) in acc.iter_mut().enumerate() {
                    let pj = _mm512_set1_ps(*p.add(h * KEY_TILE + j));
                    for (x, vu) in a.iter_mut().zip(&vj) {
                        *x = _mm512_fmadd_ps(pj, *vu, *x);
                    }
                }
            }
            for (h, a) in acc.iter().enumerate() {
                for (u, x) in a.iter().enumerate() {
                    _mm512_storeu_ps(o.add(h * hd + c + 16 * u), *x);
                }
            }
            c += 64;
        }
        while c < hd {
            let n = (hd - c).min(16);
            let mask: __mmask16 = if n == 16 {
                0xFFFF
            } else {
                ((1u32 << n) - 1) as __mmask16
            };
            // Whole vectors use plain loads and stores: the next tile reloads what this one
            // stores, and a masked store cannot be forwarded to that load (it waits for L1).
            let full = mask == 0xFFFF;
            let mut acc = [_mm512_setzero_ps(); N];
            for (h, a) in acc.iter_mut().enumerate() {
                let x = if full {
                    _mm512_loadu_ps(o.add(h * hd + c))
                } else {
                    _mm512_maskz_loadu_ps(mask, o.add(h * hd + c))
                };
                *a = _mm512_mul_ps(x, _mm512_set1_ps(*corr.add(h)));
            }
            for j in lo..=hi {
                let vj = E::load(v.add(j * stride + c), n);
                for (h, a) in acc.iter_mut().enumerate() {
                    *a = _mm512_fmadd_ps(_mm512_set1_ps(*p.add(h * KEY_TILE + j)), vj, *a);
                }
            }
            for (h, a) in acc.iter().enumerate() {
                if full {
                    _mm512_storeu_ps(o.add(h * hd + c), *a);
                } else {
                    _mm512_mask_storeu_ps(o.add(h * hd + c), mask, *a);
                }
            }
            c += 16;
        }
    }
}

#[target_feature(enable = "avx512f")]
fn pv_avx512<E: Value>(
    p: &[f32],
    corr: &[f32],
    v: Rows<'_, E>,
    lo: usize,
    hi: usize,
    o: &mut [f32],
) {
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

fn pv(p: &[f32], corr: &[f32], v: Rows<'_>, lo: usize, hi: usize, o: &mut [f32]) {
    // SAFETY: avx512f was detected (see avx512::KERNELS).
    unsafe { pv_avx512(p, corr, v, lo, hi, o) }
}

fn pv_bf16(p: &[f32], corr: &[f32], v: Rows<'_, bf16>, lo: usize, hi: usize, o: &mut [f32]) {
    // SAFETY: avx512f was detected (see avx512::KERNELS).
    unsafe { pv_avx512(p, corr, v, lo, hi, o) }
}

#[target_feature(enable = "avx512f")]
fn widen_bf16_avx512(src: &[bf16], stride: usize, width: usize, rows: usize, dst: &mut [f32]) {
    if rows == 0 {
        return;
    }
    assert!(width <= stride && src.len() >= (rows - 1) * stride + width);
    assert!(dst.len() >= rows * width);
    let full = width - width % 16;
    let (sp, dp) = (src.as_ptr(), dst.as_mut_ptr());
    for j in 0..rows {
        let mut c = 0;
        // SAFETY: columns c..c + 16 <= width of row j, within both slices (asserted).
        unsafe {
            while c < full {
                let v = _mm512_cvtepu16_epi32(_mm256_loadu_si256(
                    sp.add(j * stride + c).cast::<__m256i>(),
                ));
                _mm512_storeu_ps(
                    dp.add(j * width + c),
                    _mm512_castsi512_ps(_mm512_slli_epi32::<16>(v)),
                );
                c += 16;
            }
        }
        for c in full..width {
            dst[j * width + c] = src[j * stride + c].to_f32();
        }
    }
}

fn widen_bf16(src: &[bf16], stride: usize, width: usize, rows: usize, dst: &mut [f32]) {
    // SAFETY: avx512f was detected (see avx512::KERNELS).
    unsafe { widen_bf16_avx512(src, stride, width, rows, dst) }
}
