//! Gated activations.

use rayon::prelude::*;

/// `out[t, i] = silu(gate_up[t, i]) * gate_up[t, d + i]` where each row of `gate_up` is the
/// fused `[gate | up]` projection of width `2d`: SiLU and the product in one pass.
pub fn silu_mul(gate_up: &[f32], d: usize, out: &mut [f32]) {
    assert_eq!(gate_up.len(), 2 * out.len());
    out.par_chunks_mut(d)
        .zip(gate_up.par_chunks(2 * d))
        .for_each(|(o, gu)| {
            let (g, u) = gu.split_at(d);
            for ((o, g), u) in o.iter_mut().zip(g).zip(u) {
                // Same rounding as torch: x * sigmoid(x).
                *o = g * (1.0 / (1.0 + (-g).exp())) * u;
            }
        });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn silu_times_up() {
        let gu = [0.0f32, 1.0, -2.0, 3.0, 2.0, 0.5];
        let mut out = [0.0f32; 3];
        silu_mul(&gu, 3, &mut out);
        let silu = |x: f32| x * (1.0 / (1.0 + (-x).exp()));
        assert_eq!(out[0], 0.0);
        assert!((out[1] - silu(1.0) * 2.0).abs() < 1e-7);
        assert!((out[2] - silu(-2.0) * 0.5).abs() < 1e-7);
    }
}
