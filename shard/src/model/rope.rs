//! Rotary frequencies as transformers computes them, including Llama 3 and linear scaling.

use tessera_formats::{ModelConfig, RopeScaling};

/// `inv_freq[i] = 1 / theta^(2i / rotary_dim)`, adjusted by the model's rope scaling: the
/// frequencies of the model's (global) layers.
pub(crate) fn inv_freq(config: &ModelConfig) -> Vec<f32> {
    let base = unscaled(config.rope_theta, config.family.rotary_dim);
    scaled(base, config.rope_scaling)
}

/// The frequencies of layers with a local RoPE (unscaled, of base `local_rope_theta`).
pub(crate) fn local_inv_freq(config: &ModelConfig) -> Option<Vec<f32>> {
    let f = &config.family;
    let used = f.layers.iter().any(|l| l.local_rope);
    f.local_rope_theta
        .filter(|_| used)
        .map(|theta| unscaled(theta, f.rotary_dim))
}

fn unscaled(theta: f32, d: usize) -> Vec<f32> {
    (0..d / 2)
        .map(|i| {
            let exponent = (2 * i) as f32 / d as f32;
            // theta^x rounded once from f64 is the correctly rounded f32 torch aims for.
            1.0 / ((theta as f64).powf(exponent as f64) as f32)
        })
        .collect()
}

fn scaled(base: Vec<f32>, scaling: Option<RopeScaling>) -> Vec<f32> {
    match scaling {
        None => base,
        Some(RopeScaling::Linear { factor }) => base.iter().map(|f| f / factor).collect(),
        Some(RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings: old_len,
        }) => {
            let low_freq_wavelen = old_len / low_freq_factor;
            let high_freq_wavelen = old_len / high_freq_factor;
            base.iter()
                .map(|&f| {
                    let wavelen = 2.0 * std::f32::consts::PI / f;
                    if wavelen < high_freq_wavelen {
                        f
                    } else if wavelen > low_freq_wavelen {
                        f / factor
                    } else {
                        let smooth = (old_len / wavelen - low_freq_factor)
                            / (high_freq_factor - low_freq_factor);
                        (1.0 - smooth) * f / factor + smooth * f
                    }
                })
                .collect()
        }
    }
}
