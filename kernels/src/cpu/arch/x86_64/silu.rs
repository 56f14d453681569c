//! SiLU·mul (`silu(g) · u`) on 8 or 16 lanes, with `activation::exp_neg`'s arithmetic done in
//! fused multiply-adds. Only reached through the level tables, handed out after the level's
//! features were detected, which is what makes the safe wrappers sound.
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use crate::cpu::activation::{EXP_COEFFS, EXP_MAX, EXP_MIN, LN2_HI, LN2_LO, silu_mul_portable};

#[target_feature(enable = "avx2,fma")]
#[inline]
fn silu_avx2(g: __m256) -> __m256 {
    let z = _mm256_min_ps(
        _mm256_max_ps(
            _mm256_sub_ps(_mm256_setzero_ps(), g),
            _mm256_set1_ps(EXP_MIN),
        ),
        _mm256_set1_ps(EXP_MAX),
    );
    let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
        z,
        _mm256_set1_ps(std::f32::consts::LOG2_E),
    ));
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_HI), z);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_LO), r);
    let mut p = _mm256_set1_ps(EXP_COEFFS[0]);
    for &c in &EXP_COEFFS[1..] {
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
    }
    let scale = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(
        _mm256_cvtps_epi32(n),
        _mm256_set1_epi32(127),
    )));
    let e = _mm256_mul_ps(p, scale);
    _mm256_mul_ps(
        g,
        _mm256_div_ps(_mm256_set1_ps(1.0), _mm256_add_ps(_mm256_set1_ps(1.0), e)),
    )
}

#[target_feature(enable = "avx2,fma")]
fn silu_mul_avx2_impl(g: &[f32], u: &[f32], out: &mut [f32]) {
    assert!(g.len() == out.len() && u.len() == out.len());
    let full = out.len() - out.len() % 8;
    let (gp, up, op) = (g.as_ptr(), u.as_ptr(), out.as_mut_ptr());
    let mut i = 0;
    while i < full {
        // SAFETY: i + 8 <= full <= the three (equal) lengths.
        unsafe {
            let v = _mm256_mul_ps(
                silu_avx2(_mm256_loadu_ps(gp.add(i))),
                _mm256_loadu_ps(up.add(i)),
            );
            _mm256_storeu_ps(op.add(i), v);
        }
        i += 8;
    }
    silu_mul_portable(&g[full..], &u[full..], &mut out[full..]);
}

/// The AVX2 level's `Kernels::silu_mul`.
pub(crate) fn silu_mul_avx2(g: &[f32], u: &[f32], out: &mut [f32]) {
    // SAFETY: the AVX2 table is only handed out when avx2 and fma were detected.
    unsafe { silu_mul_avx2_impl(g, u, out) }
}

#[target_feature(enable = "avx512f")]
#[inline]
fn silu_avx512(g: __m512) -> __m512 {
    let z = _mm512_min_ps(
        _mm512_max_ps(
            _mm512_sub_ps(_mm512_setzero_ps(), g),
            _mm512_set1_ps(EXP_MIN),
        ),
        _mm512_set1_ps(EXP_MAX),
    );
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
        _mm512_mul_ps(z, _mm512_set1_ps(std::f32::consts::LOG2_E)),
    );
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_HI), z);
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_LO), r);
    let mut p = _mm512_set1_ps(EXP_COEFFS[0]);
    for &c in &EXP_COEFFS[1..] {
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
    }
    let e = _mm512_scalef_ps(p, n);
    _mm512_mul_ps(
        g,
        _mm512_div_ps(_mm512_set1_ps(1.0), _mm512_add_ps(_mm512_set1_ps(1.0), e)),
    )
}

#[target_feature(enable = "avx512f")]
fn silu_mul_avx512_impl(g: &[f32], u: &[f32], out: &mut [f32]) {
    assert!(g.len() == out.len() && u.len() == out.len());
    let (gp, up, op) = (g.as_ptr(), u.as_ptr(), out.as_mut_ptr());
    let mut i = 0;
    while i < out.len() {
        let mask = if out.len() - i >= 16 {
            0xFFFF
        } else {
            ((1u32 << (out.len() - i)) - 1) as __mmask16
        };
        // SAFETY: lanes past the three (equal) lengths are masked off.
        unsafe {
            let gv = _mm512_maskz_loadu_ps(mask, gp.add(i));
            let uv = _mm512_maskz_loadu_ps(mask, up.add(i));
            _mm512_mask_storeu_ps(op.add(i), mask, _mm512_mul_ps(silu_avx512(gv), uv));
        }
        i += 16;
    }
}

/// The AVX-512 level's `Kernels::silu_mul`.
pub(crate) fn silu_mul_avx512(g: &[f32], u: &[f32], out: &mut [f32]) {
    // SAFETY: the AVX-512 table is only handed out when avx512f was detected.
    unsafe { silu_mul_avx512_impl(g, u, out) }
}
