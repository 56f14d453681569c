//! The likeliest tokens of a row of logits, which draft heads and layers grow their trees from.

/// The `n` likeliest tokens of a row of logits with their log-softmax, best first (ties to
/// the lower id).
pub(super) fn top_log_probs(row: &[f32], n: usize) -> Vec<(u32, f32)> {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let log_z = max + row.iter().map(|&x| (x - max).exp()).sum::<f32>().ln();
    top_logits(row, n)
        .into_iter()
        .map(|(t, x)| (t, x - log_z))
        .collect()
}

/// The `n` largest logits with their ids, best first (ties to the lower id), in one pass:
/// a token joins the list only if it beats the worst kept, which after the first few
/// hundred tokens almost none does.
fn top_logits(row: &[f32], n: usize) -> Vec<(u32, f32)> {
    let mut best: Vec<(u32, f32)> = Vec::with_capacity(n + 1);
    if n == 0 {
        return best;
    }
    for (t, &x) in row.iter().enumerate() {
        if best.len() == n && best[n - 1].1.total_cmp(&x).is_ge() {
            continue;
        }
        // Ids arrive in increasing order, so an equal logit already kept stays ahead.
        let at = best.partition_point(|&(_, b)| b.total_cmp(&x).is_ge());
        best.insert(at, (t as u32, x));
        best.truncate(n);
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The definition: every id, sorted by logit (descending) and then id.
    fn sorted(row: &[f32], n: usize) -> Vec<(u32, f32)> {
        let mut all: Vec<(u32, f32)> = row
            .iter()
            .enumerate()
            .map(|(t, &x)| (t as u32, x))
            .collect();
        all.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        all.truncate(n);
        all
    }

    #[test]
    fn the_largest_logits_best_first_with_ties_to_the_lower_id() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for len in [1, 2, 7, 64, 1000] {
            // Few distinct values, so that ties are common.
            let row: Vec<f32> = (0..len)
                .map(|_| {
                    state = state
                        .wrapping_mul(6_364_136_223_846_793_005)
                        .wrapping_add(1);
                    ((state >> 33) % 9) as f32 - 4.0
                })
                .collect();
            for n in [0, 1, 3, 16, len, len + 5] {
                let top = top_logits(&row, n);
                let want = sorted(&row, n);
                assert_eq!(
                    top.iter().map(|p| p.0).collect::<Vec<_>>(),
                    want.iter().map(|p| p.0).collect::<Vec<_>>(),
                    "{len} logits, top {n}"
                );
            }
        }
    }

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
