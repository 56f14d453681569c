//! A branch-free `exp` for the softmax passes over the vocabulary.
//!
//! `f32::exp` calls libm once per element, which dominates a pass over a large vocabulary; this
//! Cephes-style version is plain arithmetic and bit casts, so the compiler vectorises it.
//! Relative error is within a few ulp over the domain used here (`x <= 0`).

/// `e^x` for `x <= 88`; `0` for `x < -87` (including `-inf`) and for NaN.
#[inline(always)]
pub(super) fn exp(x: f32) -> f32 {
    const LOW: f32 = -87.0;
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // 1.5 * 2^23: adding it rounds to an integer held in the low mantissa bits.
    const MAGIC: f32 = 12_582_912.0;
    // Not `clamp`: its NaN pass-through and argument check keep the loop scalar.
    #[allow(clippy::manual_clamp)]
    let xc = x.max(LOW).min(88.0);
    let t = xc * LOG2E + MAGIC;
    let n = t - MAGIC;
    let n_int = t.to_bits().wrapping_sub(MAGIC.to_bits()) as i32;
    let r = xc - n * LN2_HI - n * LN2_LO;
    let mut p = 1.987_569_1e-4f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let y = p * r * r + r + 1.0;
    let scale = f32::from_bits(((n_int + 127) as u32) << 23);
    if x >= LOW { y * scale } else { 0.0 }
}

/// `sum(exp(x - max))` over `xs` (NaN and `-inf` add 0). Each block of 256 is
/// exponentiated into a stack buffer (an elementwise loop the compiler vectorises), summed
/// in eight `f32` lanes, and added to an `f64` total, which bounds the rounding error.
pub(super) fn sum_exp(xs: &[f32], max: f32) -> f64 {
    const BLOCK: usize = 256;
    let mut buf = [0.0f32; BLOCK];
    let mut total = 0.0f64;
    for block in xs.chunks(BLOCK) {
        let buf = &mut buf[..block.len()];
        for (e, &x) in buf.iter_mut().zip(block) {
            *e = exp(x - max);
        }
        let mut lanes = [0.0f32; 8];
        let chunks = buf.chunks_exact(8);
        let rest: f32 = chunks.remainder().iter().sum();
        for c in chunks {
            for (l, &e) in lanes.iter_mut().zip(c) {
                *l += e;
            }
        }
        total += lanes.iter().map(|&l| f64::from(l)).sum::<f64>() + f64::from(rest);
    }
    total
}

/// The largest value of `xs`, ignoring NaN (`-inf` when there is none), in eight lanes so
/// the loop vectorises.
pub(super) fn max(xs: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; 8];
    let chunks = xs.chunks_exact(8);
    let rest = chunks.remainder();
    for c in chunks {
        for (l, &x) in lanes.iter_mut().zip(c) {
            *l = l.max(x);
        }
    }
    rest.iter()
        .chain(&lanes)
        .fold(f32::NEG_INFINITY, |m, &x| m.max(x))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_std_exp() {
        let mut worst = 0.0f64;
        let mut x = -87.0f32;
        while x <= 10.0 {
            let want = f64::from(x).exp();
            let got = f64::from(exp(x));
            worst = worst.max(((got - want) / want).abs());
            x += 0.001_3;
        }
        assert!(worst < 5e-7, "worst relative error {worst}");
    }

    #[test]
    fn max_ignores_nan() {
        assert_eq!(max(&[]), f32::NEG_INFINITY);
        assert_eq!(max(&[f32::NAN; 11]), f32::NEG_INFINITY);
        let mut xs: Vec<f32> = (0..37).map(|i| (i % 7) as f32).collect();
        xs[20] = 9.0;
        xs[3] = f32::NAN;
        assert_eq!(max(&xs), 9.0);
        xs[36] = f32::INFINITY;
        assert_eq!(max(&xs), f32::INFINITY);
    }

    #[test]
    fn edges() {
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(-100.0), 0.0);
        assert_eq!(exp(f32::NAN), 0.0);
        let xs = [
            0.0f32,
            -1.0,
            f32::NAN,
            f32::NEG_INFINITY,
            -2.0,
            0.5,
            1.0,
            -3.0,
            -0.25,
            2.0,
        ];
        let want: f64 = xs
            .iter()
            .filter(|x| x.is_finite())
            .map(|&x| f64::from(x - 2.0).exp())
            .sum();
        assert!((sum_exp(&xs, 2.0) - want).abs() < 1e-6);
    }
}
