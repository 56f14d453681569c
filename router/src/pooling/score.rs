//! A classifier's logits as one relevance score, as sentence-transformers' CrossEncoder and
//! vLLM give it: the sigmoid of a single logit; with several labels, the softmax probability
//! of the last one ("yes" after "no", a two-label head's positive class).

/// The score of `logits` (one per label).
pub(crate) fn score(logits: &[f32]) -> f32 {
    match logits {
        [] => f32::NAN,
        [x] => sigmoid(f64::from(*x)) as f32,
        [.., last] => {
            let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let total: f64 = logits.iter().map(|&l| f64::from(l - max).exp()).sum();
            (f64::from(last - max).exp() / total) as f32
        }
    }
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_logit_is_a_sigmoid_and_several_a_softmax() {
        assert_eq!(score(&[0.0]), 0.5);
        assert!((score(&[2.0]) - 0.880_797).abs() < 1e-6);
        // softmax([no, yes])[yes] = sigmoid(yes - no)
        assert!((score(&[1.0, 3.0]) - 0.880_797).abs() < 1e-6);
        assert!((score(&[1000.0, 0.0])).abs() < 1e-6);
        assert!((score(&[0.0, 0.0, 0.0]) - 1.0 / 3.0).abs() < 1e-6);
        assert!(score(&[]).is_nan());
    }
}
