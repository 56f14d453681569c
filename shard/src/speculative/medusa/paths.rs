//! The likeliest paths through Medusa heads' independent per-position guesses: the candidates
//! of their tree.

use crate::speculative::top_tokens::top_log_probs;

/// The `width` likeliest continuations of `depth` tokens under independent per-position
/// distributions (`logits`: `[depth][vocab]`, one head each), best first, by the product of
/// their softmax probabilities.
pub fn likeliest_paths(logits: &[f32], vocab: usize, depth: usize, width: usize) -> Vec<Vec<u32>> {
    // A prefix outside the best `width` cannot start one of the best `width` paths: another
    // prefix with the same suffix beats it. So a beam of `width` is exact.
    let mut beam: Vec<(f32, Vec<u32>)> = vec![(0.0, Vec::new())];
    for k in 0..depth {
        let top = top_log_probs(&logits[k * vocab..(k + 1) * vocab], width);
        let mut next: Vec<(f32, Vec<u32>)> = beam
            .iter()
            .flat_map(|(score, prefix)| {
                top.iter().map(move |&(t, lp)| {
                    let mut p = prefix.clone();
                    p.push(t);
                    (score + lp, p)
                })
            })
            .collect();
        next.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
        next.truncate(width);
        beam = next;
    }
    beam.into_iter().map(|(_, p)| p).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_beam_finds_the_likeliest_paths() {
        // Two positions over four tokens.
        let logits = [
            [2.0f32, 1.9, 0.0, -1.0], // position 1: 0 then 1 (close)
            [0.0, 3.0, 1.0, 2.9],     // position 2: 1 then 3 (close)
        ]
        .concat();
        assert_eq!(likeliest_paths(&logits, 4, 2, 1), vec![vec![0, 1]]);
        assert_eq!(
            likeliest_paths(&logits, 4, 2, 4),
            vec![vec![0, 1], vec![0, 3], vec![1, 1], vec![1, 3]]
        );
        assert_eq!(top_log_probs(&[1.0, 3.0, 3.0, 0.0], 2)[0].0, 1);
    }
}
