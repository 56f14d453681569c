//! The acceptance rule of the paper: accept proposal d with probability min(1, p(d) / q(d)),
//! otherwise draw from norm(max(0, p − q)) and stop. For n-gram proposals q is a point mass
//! at d, so this is: accept with probability p(d), otherwise draw from p without d. With
//! greedy decoding p is one-hot on the argmax, so a proposal is accepted exactly when it is
//! the argmax.

use crate::sampling::{SampledToken, Sampler};

/// What one sequence's speculative step produced.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    /// Accepted proposals, then the model's own next token.
    pub tokens: Vec<SampledToken>,
    /// How many proposals were accepted.
    pub accepted: usize,
}

/// Verifies `proposals` against `rows`: `rows[i]` are the logits after the step's input
/// token `i` (the last token, then the proposals), so `rows.len() == proposals.len() + 1`.
/// `draft_probs[i]` is the distribution proposal `i` was drawn from (`None`: point masses).
/// Every token returned is recorded in `sampler`.
pub fn verify(
    sampler: &mut Sampler,
    rows: &[&[f32]],
    proposals: &[u32],
    draft_probs: Option<&[Vec<f32>]>,
) -> Verdict {
    debug_assert_eq!(rows.len(), proposals.len() + 1);
    let mut tokens = Vec::with_capacity(rows.len());
    for (i, row) in rows.iter().enumerate() {
        let Some(&d) = proposals.get(i) else {
            // Every proposal was accepted: the last row gives a bonus token.
            tokens.push(sampler.sample(row));
            break;
        };
        let chosen = if sampler.is_greedy() {
            sampler.choose(row)
        } else {
            let probs = sampler.processed_probs(row);
            let p = probs.get(d as usize).copied().unwrap_or(0.0);
            let q = draft_probs.and_then(|q| q.get(i));
            let q_d = q.map_or(1.0, |q| q.get(d as usize).copied().unwrap_or(0.0));
            if q_d <= 0.0 || (sampler.uniform() as f32) * q_d < p {
                d
            } else {
                let residual: Vec<f32> = match q {
                    Some(q) => probs.iter().zip(q).map(|(p, q)| (p - q).max(0.0)).collect(),
                    None => {
                        let mut r = probs;
                        if let Some(x) = r.get_mut(d as usize) {
                            *x = 0.0;
                        }
                        r
                    }
                };
                // p(d) < q(d) here, so some other token has positive residual mass.
                sampler.draw_weighted(&residual).unwrap_or(d)
            }
        };
        let token = sampler.report(row, chosen);
        sampler.record(chosen);
        tokens.push(token);
        if chosen != d {
            break;
        }
    }
    let accepted = tokens.len() - 1;
    Verdict { tokens, accepted }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::SamplingParams;

    #[test]
    fn greedy_accepts_the_agreeing_prefix_then_corrects() {
        let rows: Vec<Vec<f32>> = vec![
            vec![0.0, 5.0, 0.0], // argmax 1
            vec![0.0, 0.0, 5.0], // argmax 2
            vec![5.0, 0.0, 0.0], // argmax 0
        ];
        let refs: Vec<&[f32]> = rows.iter().map(|r| r.as_slice()).collect();
        let mut s = Sampler::new(SamplingParams::default(), &[]);
        let v = verify(&mut s, &refs, &[1, 1], None);
        assert_eq!(v.accepted, 1);
        assert_eq!(
            v.tokens.iter().map(|t| t.id).collect::<Vec<_>>(),
            vec![1, 2]
        );
        let mut s = Sampler::new(SamplingParams::default(), &[]);
        let v = verify(&mut s, &refs, &[1, 2], None);
        assert_eq!(v.accepted, 2);
        assert_eq!(
            v.tokens.iter().map(|t| t.id).collect::<Vec<_>>(),
            vec![1, 2, 0]
        );
        assert_eq!(s.num_generated(), 3);
    }

    /// The first token's distribution with a proposal must equal the model's own, whatever
    /// the proposal: chi-square over many seeds.
    #[test]
    fn sampling_keeps_the_target_distribution() {
        let row = [1.0f32, 0.5, -0.3, 0.9, -2.0];
        let z: f32 = row.iter().map(|x| x.exp()).sum();
        let p: Vec<f64> = row.iter().map(|x| (x.exp() / z) as f64).collect();
        let n = 20_000;
        for proposal in [0u32, 2, 4] {
            let mut counts = [0usize; 5];
            for seed in 0..n {
                let params = SamplingParams {
                    temperature: 1.0,
                    seed: Some(seed),
                    ..Default::default()
                };
                let mut s = Sampler::new(params, &[]);
                let rows: [&[f32]; 2] = [&row, &row];
                let v = verify(&mut s, &rows, &[proposal], None);
                counts[v.tokens[0].id as usize] += 1;
            }
            let chi2: f64 = counts
                .iter()
                .zip(&p)
                .map(|(&c, &pi)| {
                    let e = pi * n as f64;
                    (c as f64 - e).powi(2) / e
                })
                .sum();
            // 4 degrees of freedom: P(chi2 > 18.47) = 0.001.
            assert!(
                chi2 < 18.47,
                "proposal {proposal}: chi2 {chi2}, counts {counts:?}"
            );
        }
    }

    /// With a draft distribution q (here deliberately unlike p), proposals drawn from q and
    /// verified by the rule give exactly p.
    #[test]
    fn draft_distribution_rule_keeps_the_target_distribution() {
        let row = [1.0f32, 0.5, -0.3, 0.9, -2.0];
        let z: f32 = row.iter().map(|x| x.exp()).sum();
        let p: Vec<f64> = row.iter().map(|x| (x.exp() / z) as f64).collect();
        let q = vec![vec![0.05f32, 0.6, 0.05, 0.1, 0.2]];
        let n = 20_000;
        let mut counts = [0usize; 5];
        for seed in 0..n {
            let params = SamplingParams {
                temperature: 1.0,
                seed: Some(seed),
                ..Default::default()
            };
            let mut s = Sampler::new(params, &[]);
            let d = s.draw_weighted(&q[0]).unwrap();
            let rows: [&[f32]; 2] = [&row, &row];
            let v = verify(&mut s, &rows, &[d], Some(&q));
            counts[v.tokens[0].id as usize] += 1;
        }
        let chi2: f64 = counts
            .iter()
            .zip(&p)
            .map(|(&c, &pi)| (c as f64 - pi * n as f64).powi(2) / (pi * n as f64))
            .sum();
        assert!(chi2 < 18.47, "chi2 {chi2}, counts {counts:?}");
    }
}
