//! Property tests of the sampler: over random logits and random valid
//! parameters, the processed distribution sums to one, top-k / top-p / min-p keep exactly
//! the tokens their definitions allow, every drawn token has positive probability, and a
//! seed fixes the draws.
//!
//! The reference values are recomputed here in `f64` from the definitions in the module
//! documentation of `tessera_shard::sampling`; tokens within `EPS` of a threshold are not
//! judged (the sampler works in `f32`).

use proptest::prelude::*;
use tessera_shard::sampling::{Sampler, SamplingParams};

/// Tolerance on probabilities and masses.
const EPS: f64 = 1e-4;

/// Softmax of `logits / t` in f64.
fn softmax(logits: &[f32], t: f64) -> Vec<f64> {
    let max = logits
        .iter()
        .map(|&x| f64::from(x) / t)
        .fold(f64::NEG_INFINITY, f64::max);
    let exp: Vec<f64> = logits
        .iter()
        .map(|&x| (f64::from(x) / t - max).exp())
        .collect();
    let sum: f64 = exp.iter().sum();
    exp.iter().map(|e| e / sum).collect()
}

/// Ids sorted by probability descending, ties by id.
fn by_prob(p: &[f64]) -> Vec<usize> {
    let mut ids: Vec<usize> = (0..p.len()).collect();
    ids.sort_by(|&a, &b| p[b].total_cmp(&p[a]).then(a.cmp(&b)));
    ids
}

fn logits_strategy() -> impl Strategy<Value = Vec<f32>> {
    prop::collection::vec(-8.0f32..8.0, 1..64)
}

fn sampled_params() -> impl Strategy<Value = SamplingParams> {
    (
        0.05f32..3.0,
        prop_oneof![Just(0u32), 1u32..20],
        prop_oneof![Just(1.0f32), 0.01f32..1.0],
        prop_oneof![Just(0.0f32), 0.0f32..1.0],
        prop_oneof![Just(1.0f32), 0.01f32..1.0],
        prop_oneof![Just(1.0f32), 0.5f32..2.0],
        -2.0f32..2.0,
        -2.0f32..2.0,
        any::<u64>(),
    )
        .prop_map(
            |(temperature, top_k, top_p, min_p, typical_p, rep, freq, pres, seed)| SamplingParams {
                temperature,
                top_k,
                top_p,
                min_p,
                typical_p,
                repetition_penalty: rep,
                frequency_penalty: freq,
                presence_penalty: pres,
                seed: Some(seed),
                ..Default::default()
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Any valid parameters: the processed distribution is a distribution, and the drawn
    /// token is one it gives positive probability to.
    #[test]
    fn processed_probs_sum_to_one_and_draws_are_supported(
        logits in logits_strategy(),
        params in sampled_params(),
        history in prop::collection::vec(0u32..64, 0..8),
    ) {
        prop_assert!(params.validate().is_ok());
        let mut sampler = Sampler::new(params, &[0, 1, 2]);
        for &id in &history {
            sampler.record(id);
        }
        let probs = sampler.processed_probs(&logits);
        prop_assert_eq!(probs.len(), logits.len());
        prop_assert!(probs.iter().all(|p| p.is_finite() && *p >= 0.0), "{:?}", probs);
        let sum: f64 = probs.iter().map(|&p| f64::from(p)).sum();
        prop_assert!((sum - 1.0).abs() < 1e-4, "sum {} of {:?}", sum, probs);
        let token = sampler.sample(&logits);
        prop_assert!((token.id as usize) < logits.len());
        prop_assert!(probs[token.id as usize] > 0.0, "drew {} with p = 0", token.id);
        prop_assert!(token.logprob <= 0.0 && !token.logprob.is_nan());
    }

    /// Top-k alone: survivors are exactly the tokens whose logit is at least the k-th
    /// largest (ties with the k-th kept), and they keep their softmax proportions.
    #[test]
    fn top_k_keeps_the_k_largest(
        logits in logits_strategy(),
        k in 2u32..20,
        t in 0.1f32..2.0,
    ) {
        let sampler = Sampler::new(SamplingParams { temperature: t, top_k: k, ..Default::default() }, &[]);
        let probs = sampler.processed_probs(&logits);
        let mut sorted = logits.clone();
        sorted.sort_by(|a, b| b.total_cmp(a));
        let kth = sorted[(k as usize).min(sorted.len()) - 1];
        let reference = softmax(&logits, f64::from(t));
        let p_max = reference.iter().copied().fold(0.0, f64::max);
        for (i, ((&x, &p), &r)) in logits.iter().zip(&probs).zip(&reference).enumerate() {
            if p > 0.0 {
                prop_assert!(x >= kth, "token {} logit {} below the k-th {} kept", i, x, kth);
            } else if x >= kth {
                // Dropped only by f32 underflow.
                prop_assert!(r < p_max * 1e-30, "token {} logit {} >= k-th {} dropped", i, x, kth);
            }
        }
        // Proportions among survivors are the softmax's.
        let reference = softmax(&logits, f64::from(t));
        let mass: f64 = logits.iter().zip(&reference).filter(|(x, _)| **x >= kth).map(|(_, p)| p).sum();
        for ((&x, &p), &r) in logits.iter().zip(&probs).zip(&reference) {
            if x >= kth {
                prop_assert!((f64::from(p) - r / mass).abs() < EPS, "p {} want {}", p, r / mass);
            }
        }
    }

    /// Top-p alone: the survivors are a prefix of the tokens by probability, the mass
    /// before the last survivor is below `top_p`, and the survivors' mass reaches it.
    #[test]
    fn top_p_keeps_the_smallest_nucleus(
        logits in logits_strategy(),
        top_p in 0.01f32..1.0,
        t in 0.1f32..2.0,
    ) {
        let sampler = Sampler::new(SamplingParams { temperature: t, top_p, ..Default::default() }, &[]);
        let probs = sampler.processed_probs(&logits);
        let reference = softmax(&logits, f64::from(t));
        let order = by_prob(&reference);
        let top_p = f64::from(top_p);
        let mut before = 0.0;
        for &id in &order {
            let kept = probs[id] > 0.0;
            if before < top_p - EPS {
                prop_assert!(kept, "token {} (mass before {}) dropped, top_p {}", id, before, top_p);
            } else if before > top_p + EPS {
                prop_assert!(!kept, "token {} (mass before {}) kept, top_p {}", id, before, top_p);
            }
            before += reference[id];
        }
        let kept_mass: f64 = order.iter().filter(|&&i| probs[i] > 0.0).map(|&i| reference[i]).sum();
        prop_assert!(kept_mass >= top_p.min(1.0) - EPS, "kept mass {} < top_p {}", kept_mass, top_p);
    }

    /// Min-p alone: a token survives iff its probability is at least `min_p * p_max`.
    #[test]
    fn min_p_keeps_tokens_above_the_scaled_max(
        logits in logits_strategy(),
        min_p in 0.0f32..1.0,
        t in 0.1f32..2.0,
    ) {
        let sampler = Sampler::new(SamplingParams { temperature: t, min_p, ..Default::default() }, &[]);
        let probs = sampler.processed_probs(&logits);
        let reference = softmax(&logits, f64::from(t));
        let p_max = reference.iter().copied().fold(0.0, f64::max);
        let bar = f64::from(min_p) * p_max;
        for (i, (&p, &r)) in probs.iter().zip(&reference).enumerate() {
            if r >= bar * (1.0 + 1e-4) {
                prop_assert!(p > 0.0, "token {} p {} >= bar {} dropped", i, r, bar);
            } else if r < bar * (1.0 - 1e-4) {
                prop_assert!(p == 0.0, "token {} p {} < bar {} kept", i, r, bar);
            }
        }
    }

    /// Greedy decoding takes the argmax (ties to the lowest id) and is one-hot.
    #[test]
    fn greedy_is_the_argmax(logits in logits_strategy()) {
        let mut sampler = Sampler::new(SamplingParams::default(), &[]);
        let probs = sampler.processed_probs(&logits);
        let best = by_prob(&logits.iter().map(|&x| f64::from(x)).collect::<Vec<_>>())[0];
        prop_assert_eq!(sampler.sample(&logits).id as usize, best);
        prop_assert_eq!(probs[best], 1.0);
        prop_assert_eq!(probs.iter().filter(|&&p| p > 0.0).count(), 1);
    }

    /// The same seed and logits give the same tokens, whether or not the sampler is
    /// rebuilt midway (preemption) by recording the tokens generated so far.
    #[test]
    fn seeded_draws_are_deterministic(
        rows in prop::collection::vec(prop::collection::vec(-4.0f32..4.0, 16), 1..12),
        params in sampled_params(),
        split in 0usize..12,
    ) {
        let mut a = Sampler::new(params.clone(), &[3, 4]);
        let first: Vec<u32> = rows.iter().map(|r| a.sample(r).id).collect();
        let mut b = Sampler::new(params.clone(), &[3, 4]);
        let second: Vec<u32> = rows.iter().map(|r| b.sample(r).id).collect();
        prop_assert_eq!(&first, &second);
        // Rebuilt after `split` tokens.
        let split = split.min(rows.len());
        let mut c = Sampler::new(params, &[3, 4]);
        for &id in &first[..split] {
            c.record(id);
        }
        let rest: Vec<u32> = rows[split..].iter().map(|r| c.sample(r).id).collect();
        prop_assert_eq!(&first[split..], &rest[..]);
    }

    /// No input panics, whatever the logits (NaN, infinities, empty) and however wild the
    /// unvalidated parameters; the chosen id is inside the row (or 0 for an empty row).
    #[test]
    fn hostile_inputs_do_not_panic(
        logits in prop::collection::vec(prop_oneof![
            any::<f32>(), Just(f32::NAN), Just(f32::INFINITY), Just(f32::NEG_INFINITY)
        ], 0..32),
        temperature in any::<f32>(),
        top_k in any::<u32>(),
        top_p in any::<f32>(),
        min_p in any::<f32>(),
        typical_p in any::<f32>(),
        repetition_penalty in any::<f32>(),
        seed in any::<u64>(),
    ) {
        let params = SamplingParams {
            temperature, top_k, top_p, min_p, typical_p, repetition_penalty, seed: Some(seed),
            top_n_tokens: 5,
            ..Default::default()
        };
        let mut sampler = Sampler::new(params, &[1, 2]);
        let token = sampler.sample(&logits);
        prop_assert!(logits.is_empty() && token.id == 0 || (token.id as usize) < logits.len());
        prop_assert!(!token.logprob.is_nan());
        let probs = sampler.processed_probs(&logits);
        prop_assert_eq!(probs.len(), logits.len());
    }
}
