//! The likeliest tokens of a row of logits, which draft heads and layers grow their trees from.

use crate::sampling::top_n;

/// The `n` likeliest tokens of a row of logits with their log-softmax, best first (ties to
/// the lower id).
pub(super) fn top_log_probs(row: &[f32], n: usize) -> Vec<(u32, f32)> {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let log_z = max + row.iter().map(|&x| (x - max).exp()).sum::<f32>().ln();
    top_n(row, n)
        .into_iter()
        .map(|(t, x)| (t, x - log_z))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_probs_are_the_log_softmax() {
        let row = [1.0f32, 3.0, 3.0, 0.0];
        let z: f32 = row.iter().map(|x| x.exp()).sum();
        let top = top_log_probs(&row, 2);
        assert_eq!(top.iter().map(|p| p.0).collect::<Vec<_>>(), [1, 2]);
        for (t, lp) in top {
            assert!((lp - (row[t as usize].exp() / z).ln()).abs() < 1e-6);
        }
    }
}
