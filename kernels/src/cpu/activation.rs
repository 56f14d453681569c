//! Gated activations.

use rayon::prelude::*;

use super::dispatch::{Kernels, kernels};

/// `out[t, i] = silu(gate_up[t, i]) * gate_up[t, d + i]` where each row of `gate_up` is the
/// fused `[gate | up]` projection of width `2d`: SiLU and the product in one pass.
pub fn silu_mul(gate_up: &[f32], d: usize, out: &mut [f32]) {
    silu_mul_with(kernels(), gate_up, d, out)
}

/// [`silu_mul`] at an explicit level.
pub fn silu_mul_with(kernels: &Kernels, gate_up: &[f32], d: usize, out: &mut [f32]) {
    assert_eq!(gate_up.len(), 2 * out.len());
    if d == 0 {
        return;
    }
    let row = |(o, gu): (&mut [f32], &[f32])| {
        let (g, u) = gu.split_at(d);
        (kernels.silu_mul)(g, u, o);
    };
    // One row is a few microseconds of work: not worth waking another thread for.
    if out.len() == d {
        row((out, gate_up));
    } else {
        out.par_chunks_mut(d)
            .zip(gate_up.par_chunks(2 * d))
            .for_each(row);
    }
}

/// gpt-oss's experts' activation over `[gate | up]` rows of width `2d`, as transformers
/// computes it: `g = min(gate, limit)`, `u = clamp(up, -limit, limit)`,
/// `out = (u + 1) · g · sigmoid(alpha · g)`.
pub fn clamped_swiglu(gate_up: &[f32], d: usize, alpha: f32, limit: f32, out: &mut [f32]) {
    assert_eq!(gate_up.len(), 2 * out.len());
    if d == 0 {
        return;
    }
    for (o, gu) in out.chunks_exact_mut(d).zip(gate_up.chunks_exact(2 * d)) {
        let (g, u) = gu.split_at(d);
        for ((o, &g), &u) in o.iter_mut().zip(g).zip(u) {
            let g = g.min(limit);
            let u = u.clamp(-limit, limit);
            *o = (u + 1.0) * (g * (1.0 / (1.0 + (-(g * alpha)).exp())));
        }
    }
}

/// `out[t, i] = gelu_tanh(gate_up[t, i]) * gate_up[t, d + i]`: Gemma's GeGLU, with GELU's
/// tanh approximation as torch computes it (`0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³)))`).
pub fn gelu_tanh_mul(gate_up: &[f32], d: usize, out: &mut [f32]) {
    assert_eq!(gate_up.len(), 2 * out.len());
    if d == 0 {
        return;
    }
    let row = |(o, gu): (&mut [f32], &[f32])| {
        let (g, u) = gu.split_at(d);
        for ((o, &x), &u) in o.iter_mut().zip(g).zip(u) {
            *o = gelu_tanh(x) * u;
        }
    };
    if out.len() == d {
        row((out, gate_up));
    } else {
        out.par_chunks_mut(d)
            .zip(gate_up.par_chunks(2 * d))
            .for_each(row);
    }
}

/// GELU's tanh approximation, in torch's order of operations.
#[inline]
pub fn gelu_tanh(x: f32) -> f32 {
    const BETA: f32 = 0.797_884_6; // √(2/π)
    const KAPPA: f32 = 0.044_715;
    let inner = BETA * (x + KAPPA * x * x * x);
    0.5 * x * (1.0 + inner.tanh())
}

/// `e^x` for `x` in `[EXP_MIN, EXP_MAX]`: `x = n·ln 2 + r` (Cody–Waite, `|r| <= ln 2 / 2`),
/// then `2^n · P(r)` with the Taylor polynomial of degree 7 (truncation below 1e-8
/// relative), highest coefficient first for Horner's scheme.
pub(crate) const EXP_COEFFS: [f32; 8] = [
    1.0 / 5040.0,
    1.0 / 720.0,
    1.0 / 120.0,
    1.0 / 24.0,
    1.0 / 6.0,
    0.5,
    1.0,
    1.0,
];
/// `ln 2` split so that `n · LN2_HI` is exact for the `n` that occur.
pub(crate) const LN2_HI: f32 = 0.693_359_4;
pub(crate) const LN2_LO: f32 = -2.121_944_4e-4;
/// The clamp of `e^x`'s argument: `2^n` stays a normal number, and `1 / (1 + e^x)` is 0 to
/// within 1e-38 at the top.
pub(crate) const EXP_MIN: f32 = -87.0;
pub(crate) const EXP_MAX: f32 = 88.0;

/// `g · sigmoid(g) · u` element by element, as torch rounds it (`x * sigmoid(x)`), with
/// `sigmoid(x) = 1 / (1 + e^-x)` and the `e^x` above; the SIMD levels do the same steps in
/// fused multiply-adds.
pub(crate) fn silu_mul_portable(g: &[f32], u: &[f32], out: &mut [f32]) {
    for ((o, &g), &u) in out.iter_mut().zip(g).zip(u) {
        let z = (-g).clamp(EXP_MIN, EXP_MAX);
        let n = (z * std::f32::consts::LOG2_E).round_ties_even();
        let r = (z - n * LN2_HI) - n * LN2_LO;
        let mut p = EXP_COEFFS[0];
        for &c in &EXP_COEFFS[1..] {
            p = p * r + c;
        }
        let e = p * f32::from_bits(((n as i32 + 127) as u32) << 23);
        *o = g * (1.0 / (1.0 + e)) * u;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::dispatch::Level;

    fn silu_f64(x: f32) -> f64 {
        let x = x as f64;
        x / (1.0 + (-x).exp())
    }

    #[test]
    fn silu_times_up() {
        let gu = [0.0f32, 1.0, -2.0, 3.0, 2.0, 0.5];
        let mut out = [0.0f32; 3];
        silu_mul(&gu, 3, &mut out);
        assert_eq!(out[0], 0.0);
        assert!((out[1] as f64 - silu_f64(1.0) * 2.0).abs() < 1e-6);
        assert!((out[2] as f64 - silu_f64(-2.0) * 0.5).abs() < 1e-7);
    }

    /// Every level, on rows of odd widths (SIMD tails) over the whole input range: within a
    /// few units in the last place of the exact value, and exact 0 / identity at the ends.
    #[test]
    fn every_level_is_accurate_across_the_range() {
        let d = 1001;
        let rows = 3;
        let gu: Vec<f32> = (0..rows * 2 * d)
            .map(|i| {
                if i % (2 * d) < d {
                    // gates from -120 to 120, through the steep part near 0
                    let t = (i % (2 * d)) as f32 / d as f32;
                    (t - 0.5) * 240.0 * (t - 0.5).abs() * 2.0
                } else {
                    1.0 + (i % 7) as f32 * 0.25
                }
            })
            .collect();
        for level in Level::available() {
            let k = Kernels::for_level(level).unwrap();
            let mut out = vec![f32::NAN; rows * d];
            silu_mul_with(k, &gu, d, &mut out);
            for (t, o) in out.chunks_exact(d).enumerate() {
                let (g, u) = gu[t * 2 * d..(t + 1) * 2 * d].split_at(d);
                for i in 0..d {
                    let want = silu_f64(g[i]) * u[i] as f64;
                    let err = (o[i] as f64 - want).abs();
                    assert!(
                        err <= 4e-7 * want.abs() + 1e-30,
                        "{level:?}: silu({}) * {} = {}, want {want}",
                        g[i],
                        u[i],
                        o[i]
                    );
                }
            }
        }
    }

    #[test]
    fn gelu_tanh_mul_is_the_tanh_approximation_times_up() {
        let d = 37;
        let gu: Vec<f32> = (0..4 * d).map(|i| (i as f32 * 0.37).sin() * 6.0).collect();
        let mut out = vec![0f32; 2 * d];
        gelu_tanh_mul(&gu, d, &mut out);
        for (r, row) in gu.chunks(2 * d).enumerate() {
            for i in 0..d {
                let x = row[i] as f64;
                let inner = (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x);
                let want = 0.5 * x * (1.0 + inner.tanh()) * row[d + i] as f64;
                let got = out[r * d + i] as f64;
                assert!(
                    (got - want).abs() <= 1e-5 * (1.0 + want.abs()),
                    "{x}: {got} vs {want}"
                );
            }
        }
    }
}

#[cfg(test)]
mod clamped_swiglu_tests {
    use super::clamped_swiglu;

    #[test]
    fn clamps_gate_above_and_up_both_sides() {
        let (alpha, limit) = (1.702f32, 7.0f32);
        // [gate | up] rows of width 2 · 3.
        let gate_up = [0.5, 9.0, -3.0, 2.0, -8.0, 8.0];
        let mut out = [0.0; 3];
        clamped_swiglu(&gate_up, 3, alpha, limit, &mut out);
        let want = |g: f32, u: f32| (u + 1.0) * g / (1.0 + (-(g * alpha)).exp());
        for (got, want) in out
            .iter()
            .zip([want(0.5, 2.0), want(7.0, -7.0), want(-3.0, 7.0)])
        {
            assert!(
                (got - want).abs() <= 1e-6 * want.abs().max(1.0),
                "{got} vs {want}"
            );
        }
    }
}
