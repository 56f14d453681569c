//! AVX-512 products with bfloat16 weights widened in registers: the f32 kernel's tiles
//! (`avx512::tile`) with each weight load replaced by a 16-value bf16 load shifted into the
//! upper half of f32 lanes. Widening is exact, so the results are those of the f32 kernel
//! over the widened matrix, bit for bit, while reading half the bytes.
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use half::bf16;

/// Rows of `x` per register tile.
const MR: usize = 4;
/// Rows of `w` per register tile.
const NR: usize = 4;
/// Rows of `w` per tile when `x` has a single row (decode).
const NR_GEMV: usize = 8;

/// Whether the CPU has what [`gemm`] uses.
pub(crate) fn supported() -> bool {
    is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw")
}

/// 16 bf16 values at `p` as f32 (lanes past `mask` zero).
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
#[inline]
unsafe fn widen(p: *const bf16, mask: __mmask16) -> __m512 {
    // SAFETY: the caller guarantees the masked lanes are readable.
    let h = unsafe { _mm256_maskz_loadu_epi16(mask, p.cast()) };
    _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
}

/// The fixed tree of `avx512::hsum`: `l + 8`, `l + 4`, `l + 2`, `l + 1`.
#[target_feature(enable = "avx512f")]
#[inline]
fn hsum(v: __m512) -> f32 {
    let lo = _mm512_castps512_ps256(v);
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
    let s8 = _mm256_add_ps(lo, hi);
    let s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps::<1>(s8));
    let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    let s1 = _mm_add_ss(s2, _mm_shuffle_ps::<0b01>(s2, s2));
    _mm_cvtss_f32(s1)
}

/// `R × C` dot products of f32 rows of `x` and bf16 rows of `w`, as `avx512::tile`.
///
/// # Safety
/// `x` holds `R` rows and `w` `C` rows of `k` values; `out` is writable at those places.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
#[inline]
unsafe fn tile<const R: usize, const C: usize>(
    x: *const f32,
    w: *const bf16,
    k: usize,
    out: *mut f32,
    ldo: usize,
) {
    let mut acc = [[_mm512_setzero_ps(); C]; R];
    let full = k - k % 16;
    let mut c = 0;
    // SAFETY (whole body): loads read `c..c + 16 <= full` (or the masked tail below `k`) of
    // rows the caller guarantees; stores go to places the caller guarantees.
    unsafe {
        while c < full {
            let wv: [__m512; C] = std::array::from_fn(|r| widen(w.add(r * k + c), !0));
            for (t, row) in acc.iter_mut().enumerate() {
                let xv = _mm512_loadu_ps(x.add(t * k + c));
                for (a, wr) in row.iter_mut().zip(&wv) {
                    *a = _mm512_fmadd_ps(xv, *wr, *a);
                }
            }
            c += 16;
        }
        if c < k {
            let mask = ((1u32 << (k - c)) - 1) as __mmask16;
            let wv: [__m512; C] = std::array::from_fn(|r| widen(w.add(r * k + c), mask));
            for (t, row) in acc.iter_mut().enumerate() {
                let xv = _mm512_maskz_loadu_ps(mask, x.add(t * k + c));
                for (a, wr) in row.iter_mut().zip(&wv) {
                    *a = _mm512_fmadd_ps(xv, *wr, *a);
                }
            }
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
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
#[inline]
unsafe fn row_panel<const R: usize, const C: usize>(
    x: *const f32,
    w: *const bf16,
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

/// `out[i * ldo + j] = dot(x_i, w_j)` for the rows of `x` (`m × k`) and `w` (`n × k`),
/// bit-identical to the AVX-512 f32 kernel over the widened `w`.
///
/// # Safety
/// [`supported`] must hold; `out` must be writable at every such place and not accessed by
/// anything else meanwhile.
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
pub(crate) unsafe fn gemm(x: &[f32], w: &[bf16], k: usize, out: *mut f32, ldo: usize) {
    let (m, n) = (x.len() / k, w.len() / k);
    let (xp, wp) = (x.as_ptr(), w.as_ptr());
    // SAFETY: panels cover rows 0..m of x and 0..n of w, which the slices hold; `out` places
    // are the caller's guarantee.
    unsafe {
        if m == 1 {
            row_panel::<1, NR_GEMV>(xp, wp, n, k, out, ldo);
            return;
        }
        let mut i = 0;
        while i + MR <= m {
            row_panel::<MR, NR>(xp.add(i * k), wp, n, k, out.add(i * ldo), ldo);
            i += MR;
        }
        match m - i {
            3 => row_panel::<3, NR>(xp.add(i * k), wp, n, k, out.add(i * ldo), ldo),
            2 => row_panel::<2, NR>(xp.add(i * k), wp, n, k, out.add(i * ldo), ldo),
            1 => row_panel::<1, NR_GEMV>(xp.add(i * k), wp, n, k, out.add(i * ldo), ldo),
            _ => {}
        }
    }
}
