//! A pooled vector as a client gets it: cut to the dimensions it asked for (Matryoshka
//! models), then scaled to unit length when the model normalises.

use super::EmbedSpec;
#[cfg(test)]
use super::Pool;

/// `pooled` cut to its first `dimensions` values, normalised when `spec` says.
pub(crate) fn finish(
    spec: &EmbedSpec,
    mut pooled: Vec<f32>,
    dimensions: Option<usize>,
) -> Vec<f32> {
    if let Some(d) = dimensions {
        pooled.truncate(d);
    }
    if spec.normalize {
        // sentence-transformers' Normalize: x / max(‖x‖, 1e-12).
        let norm = pooled
            .iter()
            .map(|x| f64::from(*x).powi(2))
            .sum::<f64>()
            .sqrt();
        let scale = 1.0 / norm.max(1e-12);
        pooled
            .iter_mut()
            .for_each(|x| *x = (f64::from(*x) * scale) as f32);
    }
    pooled
}

/// The vector as OpenAI's `encoding_format: "base64"` sends it: its f32 values, little-endian,
/// base64-encoded.
pub(crate) fn base64(values: &[f32]) -> String {
    use base64::Engine;
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(normalize: bool) -> EmbedSpec {
        EmbedSpec {
            pool: Pool::Last,
            normalize,
            dimensions: 4,
        }
    }

    #[test]
    fn truncates_then_normalises() {
        let v = vec![3.0, 4.0, 12.0, 0.0];
        assert_eq!(finish(&spec(false), v.clone(), None), v);
        assert_eq!(finish(&spec(false), v.clone(), Some(2)), [3.0, 4.0]);
        assert_eq!(finish(&spec(true), v.clone(), Some(2)), [0.6, 0.8]);
        let full = finish(&spec(true), v, None);
        assert!((full[2] - 12.0 / 13.0).abs() < 1e-7);
        assert_eq!(finish(&spec(true), vec![0.0, 0.0], None), [0.0, 0.0]);
    }

    #[test]
    fn base64_is_little_endian_f32() {
        assert_eq!(base64(&[1.0]), "AACAPw==");
        assert_eq!(base64(&[]), "");
    }
}
