//! The likeliest tokens of a row of logits, which draft heads and layers grow their trees from.

/// The `n` likeliest tokens of a row of logits with their log-softmax, best first (ties to
/// the lower id).
pub(super) fn top_log_probs(row: &[f32], n: usize) -> Vec<(u32, f32)> {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let log_z = max + row.iter().map(|&x| (x - max).exp()).sum::<f32>().ln();
    let mut ids: Vec<u32> = (0..row.len() as u32).collect();
    let n = n.min(ids.len());
    let better = |a: &u32, b: &u32| {
        row[*b as usize]
            .total_cmp(&row[*a as usize])
            .then_with(|| a.cmp(b))
    };
    if n < ids.len() {
        ids.select_nth_unstable_by(n, better);
        ids.truncate(n);
    }
    ids.sort_by(better);
    ids.into_iter()
        .map(|t| (t, row[t as usize] - log_z))
        .collect()
}
