//! AVX512_BF16 kernel of `bf16_dot`: `vdpbf16ps` on register tiles of `R` activation rows
//! times `C` weight rows. Only handed out after [`supported`], which is what makes its
//! calls sound.
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use half::bf16;

use super::avx512::store_sums;
use crate::cpu::bf16_dot::CHUNK;

/// How far ahead (in values) a tile asks for its weight rows.
const PREFETCH: usize = 8 * CHUNK;

/// Whether this CPU runs the kernel (AVX-512 F and BW, and BF16).
pub(crate) fn supported() -> bool {
    is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512bf16")
}

/// Activation rows per register tile, and weight rows (`MR × NR` accumulators).
const MR: usize = 4;
const NR: usize = 4;
/// Weight rows per tile for a single activation row: more loads in flight.
const NR_GEMV: usize = 8;

/// `R × C` outputs: rows `x[t * kp..]` against rows `w[r * k..]`, at `out[t * ldo + r]`.
///
/// # Safety
/// `x` holds `R` rows of `kp >= k` values (zero past `k`, `kp` a multiple of 32), `w` holds
/// `C` rows of `k`; `out` is writable at those places.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
#[inline]
unsafe fn tile<const R: usize, const C: usize>(
    x: *const bf16,
    kp: usize,
    w: *const bf16,
    k: usize,
    out: *mut f32,
    ldo: usize,
) {
    let mut acc = [[_mm512_setzero_ps(); C]; R];
    let full = k - k % CHUNK;
    let mut c = 0;
    // SAFETY (whole body): weight loads read `c..c + 32 <= full` of a row, or the masked tail
    // below `k`; activation loads read `c..c + 32 <= kp` of a padded row.
    unsafe {
        while c < full {
            // Batched products stream their weights at the pace of the arithmetic: keep the
            // next lines coming (past a row's end this asks for the next row's start, next
            // anyway). A single row has little arithmetic per line; the hardware keeps up.
            if R > 1 {
                for r in 0..C {
                    _mm_prefetch::<_MM_HINT_T0>(w.add(r * k + c + PREFETCH).cast());
                }
            }
            let wv: [__m512bh; C] = std::array::from_fn(|r| {
                std::mem::transmute(_mm512_loadu_si512(w.add(r * k + c).cast()))
            });
            for (t, row) in acc.iter_mut().enumerate() {
                let xv: __m512bh =
                    std::mem::transmute(_mm512_loadu_si512(x.add(t * kp + c).cast()));
                for (a, wr) in row.iter_mut().zip(&wv) {
                    *a = _mm512_dpbf16_ps(*a, xv, *wr);
                }
            }
            c += CHUNK;
        }
        if c < k {
            let mask = ((1u64 << (k - c)) - 1) as __mmask32;
            let wv: [__m512bh; C] = std::array::from_fn(|r| {
                std::mem::transmute(_mm512_maskz_loadu_epi16(mask, w.add(r * k + c).cast()))
            });
            for (t, row) in acc.iter_mut().enumerate() {
                let xv: __m512bh =
                    std::mem::transmute(_mm512_loadu_si512(x.add(t * kp + c).cast()));
                for (a, wr) in row.iter_mut().zip(&wv) {
                    *a = _mm512_dpbf16_ps(*a, xv, *wr);
                }
            }
        }
        store_sums(&acc, out, ldo);
    }
}

/// `R` activation rows against all `n` weight rows, `C` at a time, then one at a time.
///
/// # Safety
/// As [`tile`], for `R` rows of `x` and `n` rows of `w`.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
#[inline]
unsafe fn row_panel<const R: usize, const C: usize>(
    x: *const bf16,
    kp: usize,
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
            tile::<R, C>(x, kp, w.add(j * k), k, out.add(j), ldo);
            j += C;
        }
        while j < n {
            tile::<R, 1>(x, kp, w.add(j * k), k, out.add(j), ldo);
            j += 1;
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn gemm_impl(x: &[bf16], kp: usize, w: &[bf16], k: usize, out: *mut f32, ldo: usize) {
    let (m, n) = (x.len() / kp, w.len() / k);
    let (xp, wp) = (x.as_ptr(), w.as_ptr());
    // SAFETY: panels cover rows 0..m of x and 0..n of w, which the slices hold; `out` places
    // are the caller's guarantee.
    unsafe {
        let mut i = 0;
        while i + MR <= m {
            row_panel::<MR, NR>(xp.add(i * kp), kp, wp, n, k, out.add(i * ldo), ldo);
            i += MR;
        }
        let (xr, o) = (xp.add(i * kp), out.add(i * ldo));
        match m - i {
            3 => row_panel::<3, NR>(xr, kp, wp, n, k, o, ldo),
            2 => row_panel::<2, NR>(xr, kp, wp, n, k, o, ldo),
            1 => row_panel::<1, NR_GEMV>(xr, kp, wp, n, k, o, ldo),
            _ => {}
        }
    }
}

/// `bf16_dot::Bf16DotGemm` with `vdpbf16ps`.
///
/// # Safety
/// As `Bf16DotGemm`, and [`supported`] must hold.
pub(crate) unsafe fn gemm(x: &[bf16], kp: usize, w: &[bf16], k: usize, out: *mut f32, ldo: usize) {
    assert!(kp.is_multiple_of(CHUNK) && kp >= k && x.len().is_multiple_of(kp));
    assert!(w.len().is_multiple_of(k));
    // SAFETY: the caller vouches for the CPU and `out`; the asserts for the slices.
    unsafe { gemm_impl(x, kp, w, k, out, ldo) }
}
