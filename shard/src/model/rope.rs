//! Rotary frequencies as transformers computes them: plain, linear, Llama 3, YaRN, LongRoPE
//! and dynamic NTK scaling.
//!
//! LongRoPE and dynamic NTK choose a sequence's frequencies by its length, as transformers
//! does when it generates with a cache: the prompt's tokens rotate by the prompt's length,
//! each later token (a decoded one, a verified proposal, one recomputed after preemption) by
//! the length it is decoded at; keys already cached keep their rotation. The choice depends
//! neither on how the prompt is chunked nor on the other sequences of the batch.

use std::borrow::Cow;

use tessera_kernels::cpu::rope as rope_kernel;
use tessera_model_files::{ModelConfig, RopeScaling};

/// A model's rotary frequencies, fixed or chosen per sequence by its length.
pub(crate) struct Rope {
    /// The frequencies of every sequence, or of those within `by_length`'s threshold.
    base: Vec<f32>,
    by_length: Option<ByLength>,
    /// Factor of cos and sin (YaRN, LongRoPE).
    attention_factor: f32,
}

/// Frequencies of sequences longer than a model's original context.
enum ByLength {
    /// LongRoPE's long factors.
    Fixed { threshold: usize, freqs: Vec<f32> },
    /// Dynamic NTK's base, grown with the length.
    Dynamic {
        threshold: usize,
        theta: f32,
        dim: usize,
        factor: f32,
    },
}

impl Rope {
    /// The frequencies of the model's (global) layers.
    pub(crate) fn new(config: &ModelConfig) -> Self {
        let (theta, dim) = (config.rope_theta, config.family.rotary_dim);
        let mut rope = Self {
            base: unscaled(theta, dim),
            by_length: None,
            attention_factor: 1.0,
        };
        match config.rope_scaling.as_ref() {
            None => {}
            Some(RopeScaling::Linear { factor }) => {
                rope.base.iter_mut().for_each(|f| *f /= factor);
            }
            Some(&RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            }) => {
                rope.base = llama3(
                    &rope.base,
                    factor,
                    low_freq_factor,
                    high_freq_factor,
                    original_max_position_embeddings,
                );
            }
            Some(&RopeScaling::Yarn {
                factor,
                original_max_position_embeddings,
                beta_fast,
                beta_slow,
                attention_factor,
                truncate,
            }) => {
                let bounds = yarn_bounds(
                    (beta_fast, beta_slow),
                    dim,
                    theta,
                    original_max_position_embeddings,
                    truncate,
                );
                rope.base = yarn(theta, dim, factor, bounds);
                rope.attention_factor = attention_factor;
            }
            Some(RopeScaling::LongRope {
                short_factor,
                long_factor,
                original_max_position_embeddings,
                attention_factor,
            }) => {
                rope.base = divided(theta, dim, short_factor);
                rope.by_length = Some(ByLength::Fixed {
                    threshold: *original_max_position_embeddings,
                    freqs: divided(theta, dim, long_factor),
                });
                rope.attention_factor = *attention_factor;
            }
            Some(&RopeScaling::DynamicNtk {
                factor,
                original_max_position_embeddings,
            }) => {
                rope.by_length = Some(ByLength::Dynamic {
                    threshold: original_max_position_embeddings,
                    theta,
                    dim,
                    factor,
                });
            }
        }
        rope
    }

    /// The frequencies of layers with a local RoPE (unscaled, of base `local_rope_theta`).
    pub(crate) fn local(config: &ModelConfig) -> Option<Self> {
        let f = &config.family;
        let used = f.layers.iter().any(|l| l.local_rope);
        f.local_rope_theta.filter(|_| used).map(|theta| Self {
            base: unscaled(theta, f.rotary_dim),
            by_length: None,
            attention_factor: 1.0,
        })
    }

    /// The frequencies of every sequence and the factor of cos and sin, when neither depends
    /// on anything but the position (what a device kernel that takes one table can run).
    pub(crate) fn fixed(&self) -> Option<(&[f32], f32)> {
        match self.by_length {
            None => Some((&self.base, self.attention_factor)),
            Some(_) => None,
        }
    }

    /// The frequencies of a sequence `len` tokens long.
    fn freqs(&self, len: usize) -> Cow<'_, [f32]> {
        match &self.by_length {
            Some(ByLength::Fixed { threshold, freqs }) if len > *threshold => Cow::Borrowed(freqs),
            &Some(ByLength::Dynamic {
                threshold,
                theta,
                dim,
                factor,
            }) if len > threshold => {
                let ratio = factor as f64 * len as f64 / threshold as f64 - (factor as f64 - 1.0);
                let grown = theta as f64 * ratio.powf(dim as f64 / (dim as f64 - 2.0));
                Cow::Owned(unscaled(grown as f32, dim))
            }
            _ => Cow::Borrowed(&self.base),
        }
    }

    /// Cosines and sines of every token at `positions`, row `i` rotated as a sequence
    /// `lens[i]` tokens long is.
    pub(crate) fn cos_sin(&self, lens: &[usize], positions: &[u32]) -> (Vec<f32>, Vec<f32>) {
        let (mut cos, mut sin) = match self.fixed() {
            Some((freqs, _)) => rope_kernel::cos_sin(freqs, positions),
            None => {
                let (mut cos, mut sin) = (Vec::new(), Vec::new());
                let mut i = 0;
                while i < lens.len() {
                    let mut j = i + 1;
                    while j < lens.len() && lens[j] == lens[i] {
                        j += 1;
                    }
                    let freqs = self.freqs(lens[i]);
                    let (c, n) = rope_kernel::cos_sin(&freqs, &positions[i..j]);
                    cos.extend(c);
                    sin.extend(n);
                    i = j;
                }
                (cos, sin)
            }
        };
        if self.attention_factor != 1.0 {
            let f = self.attention_factor;
            cos.iter_mut().chain(sin.iter_mut()).for_each(|x| *x *= f);
        }
        (cos, sin)
    }
}

/// `theta^(2i / d)` for each frequency `i`, rounded once from f64: the correctly rounded f32
/// torch aims for.
fn powers(theta: f32, d: usize) -> impl Iterator<Item = f32> {
    (0..d / 2).map(move |i| {
        let exponent = (2 * i) as f32 / d as f32;
        (theta as f64).powf(exponent as f64) as f32
    })
}

/// `inv_freq[i] = 1 / theta^(2i / d)`.
fn unscaled(theta: f32, d: usize) -> Vec<f32> {
    powers(theta, d).map(|p| 1.0 / p).collect()
}

/// LongRoPE: `1 / (factor[i] · theta^(2i / d))`.
fn divided(theta: f32, d: usize, factors: &[f32]) -> Vec<f32> {
    powers(theta, d)
        .zip(factors)
        .map(|(p, f)| 1.0 / (f * p))
        .collect()
}

fn llama3(base: &[f32], factor: f32, low: f32, high: f32, old_len: f32) -> Vec<f32> {
    let low_freq_wavelen = old_len / low;
    let high_freq_wavelen = old_len / high;
    base.iter()
        .map(|&f| {
            let wavelen = 2.0 * std::f32::consts::PI / f;
            if wavelen < high_freq_wavelen {
                f
            } else if wavelen > low_freq_wavelen {
                f / factor
            } else {
                let smooth = (old_len / wavelen - low) / (high - low);
                (1.0 - smooth) * f / factor + smooth * f
            }
        })
        .collect()
}

/// YaRN's blend bounds (in frequency indices) for rotations `(beta_fast, beta_slow)`.
fn yarn_bounds(
    (beta_fast, beta_slow): (f32, f32),
    dim: usize,
    theta: f32,
    original: f32,
    truncate: bool,
) -> (f64, f64) {
    let correction = |rotations: f32| {
        let turns = original as f64 / (rotations as f64 * 2.0 * std::f64::consts::PI);
        dim as f64 * turns.ln() / (2.0 * (theta as f64).ln())
    };
    let (mut low, mut high) = (correction(beta_fast), correction(beta_slow));
    if truncate {
        (low, high) = (low.floor(), high.ceil());
    }
    (low.max(0.0), high.min(dim as f64 - 1.0))
}

/// YaRN's frequencies: interpolated (÷ `factor`) below the blend, extrapolated above it.
fn yarn(theta: f32, dim: usize, factor: f32, (low, high): (f64, f64)) -> Vec<f32> {
    let (low, mut high) = (low as f32, high as f32);
    if low == high {
        high += 0.001;
    }
    powers(theta, dim)
        .enumerate()
        .map(|(i, p)| {
            let extrapolated = 1.0 / p;
            let interpolated = 1.0 / (factor * p);
            let ramp = ((i as f32 - low) / (high - low)).clamp(0.0, 1.0);
            let keep = 1.0 - ramp;
            interpolated * (1.0 - keep) + extrapolated * keep
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dynamic_ntk_keeps_the_base_within_the_original_context_and_grows_past_it() {
        let rope = Rope {
            base: unscaled(1e4, 8),
            by_length: Some(ByLength::Dynamic {
                threshold: 16,
                theta: 1e4,
                dim: 8,
                factor: 2.0,
            }),
            attention_factor: 1.0,
        };
        assert_eq!(rope.freqs(16).as_ref(), &rope.base[..]);
        let longer = rope.freqs(40);
        assert_eq!(longer[0], 1.0);
        assert!(longer[1..].iter().zip(&rope.base[1..]).all(|(l, b)| l < b));
        assert!(rope.fixed().is_none());
    }
}
