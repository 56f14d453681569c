//! Log-probabilities of the raw model logits, as reported with each token.
//!
//! NaN logits count as `-inf`. If some logits are `+inf`, the distribution is uniform over
//! them; if every logit is `-inf` (or NaN), it is uniform over the whole vocabulary, so
//! every reported value is a number or `-inf`, never NaN.

use std::cmp::Ordering;

/// The log-softmax of one logit vector, ready to answer for any token.
#[derive(Clone, Copy, Debug)]
pub(super) struct LogSoftmax {
    kind: Kind,
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    /// `logprob(x) = (x - max) - log_sum`, which keeps precision for large logits.
    Finite { max: f32, log_sum: f32 },
    /// `count` logits are `+inf`, each with probability `1 / count`.
    PosInf { log_count: f32 },
    /// No logit above `-inf`: uniform over `n` tokens.
    Uniform { log_n: f32 },
}

impl LogSoftmax {
    /// Computes the normaliser of `logits` in two passes (max, then a sum of exponentials
    /// in `f64`).
    pub(super) fn new(logits: &[f32]) -> Self {
        let max = super::math::max(logits);
        let pos_inf = if max == f32::INFINITY {
            logits.iter().filter(|&&x| x == f32::INFINITY).count()
        } else {
            0
        };
        let kind = if pos_inf > 0 {
            Kind::PosInf {
                log_count: (pos_inf as f32).ln(),
            }
        } else if max == f32::NEG_INFINITY {
            Kind::Uniform {
                log_n: (logits.len().max(1) as f32).ln(),
            }
        } else {
            let sum = super::math::sum_exp(logits, max);
            Kind::Finite {
                max,
                log_sum: sum.ln() as f32,
            }
        };
        Self { kind }
    }

    /// The log-probability of a token whose raw logit is `x`.
    pub(super) fn of(&self, x: f32) -> f32 {
        match self.kind {
            Kind::Finite { max, log_sum } => {
                if x.is_nan() {
                    f32::NEG_INFINITY
                } else {
                    (x - max) - log_sum
                }
            }
            Kind::PosInf { log_count } => {
                if x == f32::INFINITY {
                    -log_count
                } else {
                    f32::NEG_INFINITY
                }
            }
            Kind::Uniform { log_n } => -log_n,
        }
    }
}

/// Orders `(id, logit)` by logit descending (NaN as `-inf`), then id ascending.
fn better(a: (u32, f32), b: (u32, f32)) -> Ordering {
    let key = |x: f32| if x.is_nan() { f32::NEG_INFINITY } else { x };
    key(b.1).total_cmp(&key(a.1)).then(a.0.cmp(&b.0))
}

/// The `n` highest raw logits as `(id, logit)`, best first, ties by lower id, in one pass
/// with a small sorted buffer (`n` is at most about 20).
pub(crate) fn top_n(logits: &[f32], n: usize) -> Vec<(u32, f32)> {
    let n = n.min(logits.len());
    let mut top: Vec<(u32, f32)> = Vec::with_capacity(n + 1);
    if n == 0 {
        return top;
    }
    for (i, &x) in logits.iter().enumerate() {
        let cand = (i as u32, x);
        if top.len() == n {
            // Ids only grow, so a candidate must be strictly better than the worst.
            let worst = top[n - 1];
            if better(cand, worst) != Ordering::Less {
                continue;
            }
        }
        let pos = top.partition_point(|&t| better(t, cand) == Ordering::Less);
        top.insert(pos, cand);
        top.truncate(n);
    }
    top
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f32, b: f32) -> bool {
        (a - b).abs() < 1e-5
    }

    #[test]
    fn matches_log_softmax() {
        let logits = [1.0f32, 2.0, 3.0, 0.5];
        let ls = LogSoftmax::new(&logits);
        let z: f32 = logits.iter().map(|x| x.exp()).sum();
        for &x in &logits {
            assert!(close(ls.of(x), x - z.ln()));
        }
        let total: f32 = logits.iter().map(|&x| ls.of(x).exp()).sum();
        assert!(close(total, 1.0));
    }

    #[test]
    fn large_logits_do_not_overflow() {
        let logits = [1000.0f32, 999.0, -1000.0];
        let ls = LogSoftmax::new(&logits);
        let total: f32 = logits.iter().map(|&x| ls.of(x).exp()).sum();
        assert!(close(total, 1.0));
        assert!(close(ls.of(1000.0), -(1.0f32 + (-1.0f32).exp()).ln()));
    }

    #[test]
    fn nan_and_infinities() {
        let ls = LogSoftmax::new(&[f32::NAN, 0.0, f32::NEG_INFINITY]);
        assert_eq!(ls.of(f32::NAN), f32::NEG_INFINITY);
        assert!(close(ls.of(0.0), 0.0));
        assert_eq!(ls.of(f32::NEG_INFINITY), f32::NEG_INFINITY);

        let ls = LogSoftmax::new(&[f32::INFINITY, 1.0, f32::INFINITY]);
        assert!(close(ls.of(f32::INFINITY), -(2.0f32).ln()));
        assert_eq!(ls.of(1.0), f32::NEG_INFINITY);

        let ls = LogSoftmax::new(&[f32::NEG_INFINITY, f32::NAN, f32::NEG_INFINITY, f32::NAN]);
        assert!(close(ls.of(f32::NAN), -(4.0f32).ln()));

        let ls = LogSoftmax::new(&[]);
        assert!(ls.of(0.0).is_finite());
    }

    #[test]
    fn top_n_sorted_with_id_ties() {
        let logits = [0.5f32, 2.0, f32::NAN, 2.0, -1.0, 3.0, 0.5];
        assert_eq!(top_n(&logits, 0), vec![]);
        assert_eq!(top_n(&logits, 3), vec![(5, 3.0), (1, 2.0), (3, 2.0)]);
        assert_eq!(
            top_n(&logits, 5),
            vec![(5, 3.0), (1, 2.0), (3, 2.0), (0, 0.5), (6, 0.5)]
        );
        let all = top_n(&logits, 100);
        assert_eq!(all.len(), logits.len());
        assert_eq!(all[6].0, 2, "NaN ranks last");
    }

    #[test]
    fn top_n_matches_full_sort() {
        // A fixed pseudo-random vector with many ties.
        let logits: Vec<f32> = (0..1000u32)
            .map(|i| ((i.wrapping_mul(2_654_435_761) >> 7) % 50) as f32)
            .collect();
        let mut all: Vec<(u32, f32)> = logits
            .iter()
            .enumerate()
            .map(|(i, &x)| (i as u32, x))
            .collect();
        all.sort_by(|&a, &b| better(a, b));
        for n in [1, 7, 20] {
            assert_eq!(top_n(&logits, n), all[..n].to_vec());
        }
    }
}
