//! Tests of [`Sampler`] against hand-computed examples and a dense reference pipeline.

use super::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn ln_probs(p: &[f64]) -> Vec<f32> {
    p.iter().map(|&x| x.ln() as f32).collect()
}

fn softmax(x: &[f32]) -> Vec<f64> {
    let max = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    let e: Vec<f64> = x.iter().map(|&v| f64::from(v - max).exp()).collect();
    let s: f64 = e.iter().sum();
    e.iter().map(|v| v / s).collect()
}

fn assert_probs(got: &[f32], want: &[f64]) {
    assert_eq!(got.len(), want.len());
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            (f64::from(g) - w).abs() < 1e-5,
            "token {i}: got {g}, want {w} (all: {got:?} vs {want:?})"
        );
    }
}

fn sampling(f: impl FnOnce(&mut SamplingParams)) -> SamplingParams {
    let mut p = SamplingParams {
        temperature: 1.0,
        ..Default::default()
    };
    f(&mut p);
    p
}

const P4: [f64; 4] = [0.5, 0.3, 0.15, 0.05];

// ---------------------------------------------------------------- greedy

#[test]
fn greedy_is_argmax_with_lowest_id_on_ties() {
    let mut s = Sampler::new(SamplingParams::default(), &[]);
    assert!(s.is_greedy());
    assert_eq!(s.sample(&[0.1, 3.0, -2.0, 2.9]).id, 1);
    assert_eq!(s.sample(&[1.0, 5.0, 5.0, 5.0]).id, 1);
    assert_eq!(s.sample(&[f32::NAN, -1.0, f32::NAN]).id, 1);
    assert_probs(&s.processed_probs(&[1.0, 5.0, 5.0]), &[0.0, 1.0, 0.0]);
}

#[test]
fn top_k_one_is_greedy_at_any_temperature() {
    let mut s = Sampler::new(
        sampling(|p| {
            p.temperature = 5.0;
            p.top_k = 1;
        }),
        &[],
    );
    assert!(s.is_greedy());
    for _ in 0..50 {
        assert_eq!(s.sample(&[0.0, 0.1, 0.05]).id, 1);
    }
}

#[test]
fn greedy_applies_bias_and_penalties() {
    let params = SamplingParams {
        logit_bias: vec![(0, 2.5)],
        ..Default::default()
    };
    let mut s = Sampler::new(params, &[]);
    assert_eq!(s.sample(&[1.0, 3.0]).id, 0);

    let params = SamplingParams {
        repetition_penalty: 2.0,
        ..Default::default()
    };
    // 3.0 / 2 = 1.5 < 2.0
    let mut s = Sampler::new(params, &[0]);
    assert_eq!(s.sample(&[3.0, 2.0]).id, 1);
}

// ---------------------------------------------------------------- processors by hand

#[test]
fn temperature_scales_logits() {
    // probs ∝ [1, 2^(1/t)]; t = 0.5 gives [1, 4].
    let logits = [0.0, 2f32.ln()];
    let s = Sampler::new(sampling(|p| p.temperature = 0.5), &[]);
    assert_probs(&s.processed_probs(&logits), &[0.2, 0.8]);
    let s = Sampler::new(sampling(|p| p.temperature = 2.0), &[]);
    let r = 2f64.sqrt();
    assert_probs(
        &s.processed_probs(&logits),
        &[1.0 / (1.0 + r), r / (1.0 + r)],
    );
}

#[test]
fn top_k_keeps_k_largest_and_ties() {
    let logits = ln_probs(&P4);
    let s = Sampler::new(sampling(|p| p.top_k = 2), &[]);
    assert_probs(&s.processed_probs(&logits), &[0.625, 0.375, 0.0, 0.0]);
    // Ties with the k-th value are kept (Hugging Face / vLLM threshold semantics).
    let s = Sampler::new(sampling(|p| p.top_k = 2), &[]);
    assert_probs(&s.processed_probs(&[2.0, 1.0, 1.0, 0.0]), &{
        let e = [2f64.exp(), 1f64.exp(), 1f64.exp()];
        let z: f64 = e.iter().sum();
        [e[0] / z, e[1] / z, e[2] / z, 0.0]
    });
    // k beyond the vocabulary is off.
    let s = Sampler::new(sampling(|p| p.top_k = 100), &[]);
    assert_probs(&s.processed_probs(&logits), &P4);
}

#[test]
fn top_p_keeps_smallest_nucleus() {
    let logits = ln_probs(&P4);
    let s = Sampler::new(sampling(|p| p.top_p = 0.75), &[]);
    assert_probs(&s.processed_probs(&logits), &[0.625, 0.375, 0.0, 0.0]);
    let s = Sampler::new(sampling(|p| p.top_p = 0.85), &[]);
    assert_probs(
        &s.processed_probs(&logits),
        &[0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0.0],
    );
    let s = Sampler::new(sampling(|p| p.top_p = 0.1), &[]);
    assert_probs(&s.processed_probs(&logits), &[1.0, 0.0, 0.0, 0.0]);
}

#[test]
fn top_p_after_top_k_uses_renormalised_mass() {
    // After top-k = 3: [0.5, 0.3, 0.15] / 0.95; top-p 0.8: mass before token 2 is
    // 0.8 / 0.95 = 0.842 >= 0.8, so it goes.
    let s = Sampler::new(
        sampling(|p| {
            p.top_k = 3;
            p.top_p = 0.8;
        }),
        &[],
    );
    assert_probs(
        &s.processed_probs(&ln_probs(&P4)),
        &[0.625, 0.375, 0.0, 0.0],
    );
}

#[test]
fn min_p_scales_with_top_probability() {
    let logits = ln_probs(&P4);
    // threshold 0.25 * 0.5 = 0.125: keeps 0.5, 0.3, 0.15.
    let s = Sampler::new(sampling(|p| p.min_p = 0.25), &[]);
    assert_probs(
        &s.processed_probs(&logits),
        &[0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0.0],
    );
    let s = Sampler::new(sampling(|p| p.min_p = 1.0), &[]);
    assert_probs(&s.processed_probs(&logits), &[1.0, 0.0, 0.0, 0.0]);
}

#[test]
fn typical_p_prefers_typical_tokens() {
    // H = 1.1421; |-ln p - H| = [0.449, 0.062, 0.755, 1.854]: token 1 first, then 0.
    let logits = ln_probs(&P4);
    let s = Sampler::new(sampling(|p| p.typical_p = 0.5), &[]);
    assert_probs(&s.processed_probs(&logits), &[0.625, 0.375, 0.0, 0.0]);
    // The most typical token alone, even though it is not the most likely.
    let s = Sampler::new(sampling(|p| p.typical_p = 0.2), &[]);
    assert_probs(&s.processed_probs(&logits), &[0.0, 1.0, 0.0, 0.0]);
    // Tokens tied with the last kept one stay.
    let s = Sampler::new(sampling(|p| p.typical_p = 0.1), &[]);
    assert_probs(&s.processed_probs(&[0.0, 0.0, 0.0]), &[1.0 / 3.0; 3]);
}

#[test]
fn repetition_penalty_matches_hugging_face() {
    // Prompt [0, 1, 1] (set semantics: 1 is penalised once), then token 3 is generated.
    let logits = [2.0f32, -1.0, 0.5, 3.0, 1.0];
    let mut s = Sampler::new(sampling(|p| p.repetition_penalty = 2.0), &[0, 1, 1]);
    assert_probs(
        &s.processed_probs(&logits),
        &softmax(&[1.0, -2.0, 0.5, 3.0, 1.0]),
    );
    s.record(3);
    s.record(3);
    assert_probs(
        &s.processed_probs(&logits),
        &softmax(&[1.0, -2.0, 0.5, 1.5, 1.0]),
    );
    // A penalty below 1 rewards repetition.
    let s = Sampler::new(sampling(|p| p.repetition_penalty = 0.5), &[0, 1]);
    assert_probs(
        &s.processed_probs(&logits),
        &softmax(&[4.0, -0.5, 0.5, 3.0, 1.0]),
    );
}

#[test]
fn frequency_and_presence_match_openai() {
    let logits = [1.0f32, 1.0, 1.0, 1.0];
    let mut s = Sampler::new(
        sampling(|p| {
            p.frequency_penalty = 0.5;
            p.presence_penalty = 1.0;
        }),
        &[2, 2, 2],
    );
    // The prompt does not count.
    assert_probs(&s.processed_probs(&logits), &[0.25; 4]);
    for id in [0, 0, 1] {
        s.record(id);
    }
    // token 0: 1 - (2 * 0.5 + 1) = -1; token 1: 1 - (0.5 + 1) = -0.5.
    assert_probs(
        &s.processed_probs(&logits),
        &softmax(&[-1.0, -0.5, 1.0, 1.0]),
    );
    // Negative values encourage.
    let mut s = Sampler::new(sampling(|p| p.frequency_penalty = -1.0), &[]);
    s.record(3);
    assert_probs(&s.processed_probs(&logits), &softmax(&[1.0, 1.0, 1.0, 2.0]));
}

#[test]
fn bias_comes_before_penalties() {
    // Token 0: bias 1 -> 0.5, positive, so repetition divides: 0.25; then presence 1: -0.75.
    let logits = [-0.5f32, 0.0];
    let mut s = Sampler::new(
        sampling(|p| {
            p.logit_bias = vec![(0, 1.0), (7, 50.0)];
            p.repetition_penalty = 2.0;
            p.presence_penalty = 1.0;
        }),
        &[],
    );
    s.record(0);
    assert_probs(&s.processed_probs(&logits), &softmax(&[-0.75, 0.0]));
}

// ---------------------------------------------------------------- logprobs

#[test]
fn logprobs_are_raw_log_softmax() {
    let logits = [1.0f32, 3.0, 2.0, 3.0, -1.0];
    let mut s = Sampler::new(
        sampling(|p| {
            p.top_k = 2;
            p.temperature = 0.3;
            p.repetition_penalty = 1.7;
            p.logit_bias = vec![(4, 10.0)];
            p.top_n_tokens = 3;
        }),
        &[1],
    );
    let want = softmax(&logits);
    let t = s.sample(&logits);
    assert!((f64::from(t.logprob) - want[t.id as usize].ln()).abs() < 1e-5);
    let ids: Vec<u32> = t.top_logprobs.iter().map(|&(id, _)| id).collect();
    assert_eq!(ids, vec![1, 3, 2]);
    for &(id, lp) in &t.top_logprobs {
        assert!((f64::from(lp) - want[id as usize].ln()).abs() < 1e-5);
    }
}

#[test]
fn logprobs_sum_to_one_and_top_n_is_capped() {
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let logits: Vec<f32> = (0..1000)
        .map(|_| rng.random::<f32>() * 20.0 - 10.0)
        .collect();
    let mut s = Sampler::new(sampling(|p| p.top_n_tokens = 1000), &[]);
    let top = s.sample(&logits).top_logprobs;
    assert_eq!(top.len(), MAX_TOP_N_LOGPROBS as usize);
    assert!(top.windows(2).all(|w| w[0].1 >= w[1].1));
    let total: f64 = (0..logits.len() as u32)
        .map(|id| f64::from(s.report(&logits, id).logprob).exp())
        .sum();
    assert!((total - 1.0).abs() < 1e-4, "{total}");
    assert_eq!(s.report(&logits, 5000).logprob, f32::NEG_INFINITY);
}

// ---------------------------------------------------------------- reproducibility

fn run(seed: u64, steps: usize, other: Option<&mut Sampler>) -> Vec<u32> {
    let params = sampling(|p| {
        p.seed = Some(seed);
        p.top_p = 0.95;
        p.frequency_penalty = 0.3;
    });
    let mut s = Sampler::new(params, &[1, 2]);
    let mut rng = ChaCha8Rng::seed_from_u64(99);
    let mut other = other;
    (0..steps)
        .map(|_| {
            let logits: Vec<f32> = (0..64).map(|_| rng.random::<f32>() * 4.0).collect();
            if let Some(o) = other.as_deref_mut() {
                o.sample(&logits);
            }
            s.sample(&logits).id
        })
        .collect()
}

#[test]
fn seeded_draws_are_reproducible_and_batch_independent() {
    let a = run(42, 200, None);
    assert_eq!(a, run(42, 200, None));
    let mut neighbour = Sampler::new(sampling(|p| p.seed = Some(42)), &[]);
    assert_eq!(a, run(42, 200, Some(&mut neighbour)));
    assert_ne!(a, run(43, 200, None));
}

#[test]
fn replay_after_preemption_continues_identically() {
    let params = sampling(|p| {
        p.seed = Some(5);
        p.top_k = 20;
        p.presence_penalty = 0.5;
        p.repetition_penalty = 1.3;
    });
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let rows: Vec<Vec<f32>> = (0..30)
        .map(|_| (0..50).map(|_| rng.random::<f32>() * 3.0).collect())
        .collect();
    let mut whole = Sampler::new(params.clone(), &[3, 4]);
    let want: Vec<u32> = rows.iter().map(|r| whole.sample(r).id).collect();

    let mut resumed = Sampler::new(params, &[3, 4]);
    for &id in &want[..12] {
        resumed.record(id);
    }
    let got: Vec<u32> = rows[12..].iter().map(|r| resumed.sample(r).id).collect();
    assert_eq!(got, want[12..]);
}

#[test]
fn uniform_continues_within_a_step_and_restarts_per_step() {
    let mut a = Sampler::new(sampling(|p| p.seed = Some(8)), &[]);
    let mut b = Sampler::new(sampling(|p| p.seed = Some(8)), &[]);
    let (a0, a1) = (a.uniform(), a.uniform());
    assert_ne!(a0, a1);
    assert_eq!(b.uniform(), a0);
    a.record(0);
    b.record(0);
    let a2 = a.uniform();
    assert_eq!(b.uniform(), a2);
    assert_ne!(a2, a0);
}

// ---------------------------------------------------------------- distribution

/// Pearson's statistic of `counts` against `probs` (only cells with probability > 0; any
/// draw in a zero cell fails).
fn chi_square(counts: &[u64], probs: &[f64]) -> f64 {
    let n: u64 = counts.iter().sum();
    counts
        .iter()
        .zip(probs)
        .map(|(&c, &p)| {
            if p == 0.0 {
                assert_eq!(c, 0, "drew a token of probability 0");
                0.0
            } else {
                let e = p * n as f64;
                (c as f64 - e).powi(2) / e
            }
        })
        .sum()
}

#[test]
fn sampling_matches_the_distribution() {
    // 3 degrees of freedom: P(chi2 > 16.27) = 0.001. Deterministic for the fixed seed.
    let probs = [0.4, 0.3, 0.2, 0.1];
    let logits = ln_probs(&probs);
    let mut s = Sampler::new(sampling(|p| p.seed = Some(1234)), &[]);
    let mut counts = [0u64; 4];
    for _ in 0..40_000 {
        counts[s.sample(&logits).id as usize] += 1;
    }
    let stat = chi_square(&counts, &probs);
    assert!(stat < 16.27, "chi2 = {stat}, counts {counts:?}");
}

#[test]
fn sampling_matches_processed_probs_with_truncation() {
    let mut rng = ChaCha8Rng::seed_from_u64(17);
    let logits: Vec<f32> = (0..12).map(|_| rng.random::<f32>() * 3.0).collect();
    let params = sampling(|p| {
        p.seed = Some(77);
        p.temperature = 0.7;
        p.top_k = 8;
        p.top_p = 0.9;
        p.min_p = 0.05;
    });
    let mut s = Sampler::new(params, &[]);
    let probs: Vec<f64> = s
        .processed_probs(&logits)
        .iter()
        .map(|&p| f64::from(p))
        .collect();
    let support = probs.iter().filter(|&&p| p > 0.0).count();
    assert!((3..8).contains(&support), "support {support}");
    let mut counts = vec![0u64; logits.len()];
    for _ in 0..40_000 {
        counts[s.choose(&logits) as usize] += 1;
    }
    // support - 1 <= 6 degrees of freedom: P(chi2 > 22.46) = 0.001.
    let stat = chi_square(&counts, &probs);
    assert!(
        stat < 22.46,
        "chi2 = {stat}, counts {counts:?}, probs {probs:?}"
    );
}

#[test]
fn draw_weighted_follows_weights() {
    let mut s = Sampler::new(sampling(|p| p.seed = Some(3)), &[]);
    assert_eq!(s.draw_weighted(&[0.0, -1.0, f32::NAN]), None);
    assert_eq!(s.draw_weighted(&[]), None);
    assert_eq!(s.draw_weighted(&[0.0, 2.0, 0.0]), Some(1));
    let w = [1.0f32, 0.0, 3.0];
    let mut counts = [0u64; 3];
    for _ in 0..20_000 {
        counts[s.draw_weighted(&w).unwrap() as usize] += 1;
    }
    let stat = chi_square(&counts, &[0.25, 0.0, 0.75]);
    assert!(stat < 10.83, "chi2 = {stat}");
}

// ---------------------------------------------------------------- reference pipeline

/// A dense, sort-everything rendition of the documented pipeline in `f64`.
fn reference(params: &SamplingParams, prompt: &[u32], generated: &[u32], raw: &[f32]) -> Vec<f64> {
    let x = reference_logits(params, prompt, generated, raw);
    let n = x.len();
    let mut out = vec![0.0; n];
    if params.is_greedy() {
        let mut best = 0;
        for i in 0..n {
            if x[i] > x[best] {
                best = i;
            }
        }
        out[best] = 1.0;
        return out;
    }
    let mut v: Vec<f64> = x
        .iter()
        .map(|&a| f64::from(a) / f64::from(params.temperature))
        .collect();
    let alive = reference_alive(params, &v);
    for i in 0..n {
        if !alive[i] {
            v[i] = f64::NEG_INFINITY;
        }
    }
    softmax_alive(&v, &alive)
}

/// The reference's logits after the bias and the repetition, frequency and presence
/// penalties.
fn reference_logits(
    params: &SamplingParams,
    prompt: &[u32],
    generated: &[u32],
    raw: &[f32],
) -> Vec<f32> {
    let mut x: Vec<f32> = raw.to_vec();
    for &(id, b) in &params.logit_bias {
        x[id as usize] += b;
    }
    if params.repetition_penalty != 1.0 {
        let mut seen: Vec<u32> = prompt.iter().chain(generated).copied().collect();
        seen.sort_unstable();
        seen.dedup();
        for id in seen {
            let v = &mut x[id as usize];
            *v = if *v < 0.0 {
                *v * params.repetition_penalty
            } else {
                *v / params.repetition_penalty
            };
        }
    }
    for id in 0..raw.len() as u32 {
        let count = generated.iter().filter(|&&g| g == id).count();
        if count > 0 {
            x[id as usize] -= count as f32 * params.frequency_penalty + params.presence_penalty;
        }
    }
    x
}

/// Softmax of `v` over the `alive` tokens (0 for the others).
fn softmax_alive(v: &[f64], alive: &[bool]) -> Vec<f64> {
    let n = v.len();
    let max = (0..n)
        .filter(|&i| alive[i])
        .map(|i| v[i])
        .fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = (0..n)
        .map(|i| if alive[i] { (v[i] - max).exp() } else { 0.0 })
        .collect();
    let z: f64 = e.iter().sum();
    e.iter().map(|a| a / z).collect()
}

/// Keeps the shortest prefix of `order` whose probability reaches `mass` (at least one
/// token) and drops the rest; returns the prefix's length.
fn keep_prefix(order: &[usize], p: &[f64], mass: f64, alive: &mut [bool]) -> usize {
    let mut before = 0.0;
    let mut kept = 0;
    for (rank, &i) in order.iter().enumerate() {
        if rank > 0 && before >= mass {
            alive[i] = false;
        } else {
            before += p[i];
            kept = rank + 1;
        }
    }
    kept
}

/// Which tokens of the scaled logits `v` survive top-k, top-p, min-p and typical-p, applied
/// in that order.
fn reference_alive(params: &SamplingParams, v: &[f64]) -> Vec<bool> {
    let n = v.len();
    let mut alive = vec![true; n];
    let k = params.top_k as usize;
    if k > 0 && k < n {
        let mut sorted = v.to_vec();
        sorted.sort_by(|a, b| b.total_cmp(a));
        let thr = sorted[k - 1];
        for i in 0..n {
            alive[i] &= v[i] >= thr;
        }
    }
    if params.top_p < 1.0 {
        let p = softmax_alive(v, &alive);
        let mut order: Vec<usize> = (0..n).filter(|&i| alive[i]).collect();
        order.sort_by(|&a, &b| v[b].total_cmp(&v[a]).then(a.cmp(&b)));
        keep_prefix(&order, &p, f64::from(params.top_p), &mut alive);
    }
    if params.min_p > 0.0 {
        let p = softmax_alive(v, &alive);
        let pmax = p.iter().copied().fold(0.0, f64::max);
        for i in 0..n {
            alive[i] &= p[i] >= f64::from(params.min_p) * pmax * (1.0 - 1e-9);
        }
    }
    if params.typical_p < 1.0 {
        let p = softmax_alive(v, &alive);
        let h: f64 = -(0..n)
            .filter(|&i| alive[i])
            .map(|i| p[i] * p[i].ln())
            .sum::<f64>();
        let score: Vec<f64> = (0..n).map(|i| (-p[i].ln() - h).abs()).collect();
        let mut order: Vec<usize> = (0..n).filter(|&i| alive[i]).collect();
        order.sort_by(|&a, &b| score[a].total_cmp(&score[b]).then(a.cmp(&b)));
        let kept = keep_prefix(&order, &p, f64::from(params.typical_p), &mut alive);
        let last = score[order[kept - 1]];
        for &i in &order[kept..] {
            if (score[i] - last).abs() < 1e-9 {
                alive[i] = true;
            }
        }
    }
    alive
}

fn random_params(rng: &mut ChaCha8Rng, n: usize) -> SamplingParams {
    let mut maybe = |on: f32| rng.random::<f32>() < on;
    let (a, b, c, d, e, f, g) = (
        maybe(0.5),
        maybe(0.5),
        maybe(0.4),
        maybe(0.4),
        maybe(0.3),
        maybe(0.3),
        maybe(0.1),
    );
    SamplingParams {
        temperature: if g {
            0.0
        } else {
            0.2 + rng.random::<f32>() * 1.8
        },
        top_k: if a {
            1 + rng.random_range(0..n as u32 + 5)
        } else {
            0
        },
        top_p: if b {
            0.05 + rng.random::<f32>() * 0.95
        } else {
            1.0
        },
        min_p: if c { rng.random::<f32>() * 0.5 } else { 0.0 },
        typical_p: if d {
            0.05 + rng.random::<f32>() * 0.95
        } else {
            1.0
        },
        repetition_penalty: if e {
            0.5 + rng.random::<f32>() * 1.5
        } else {
            1.0
        },
        frequency_penalty: if f {
            rng.random::<f32>() * 4.0 - 2.0
        } else {
            0.0
        },
        presence_penalty: if f {
            rng.random::<f32>() * 4.0 - 2.0
        } else {
            0.0
        },
        logit_bias: if e {
            vec![(
                rng.random_range(0..n as u32),
                rng.random::<f32>() * 10.0 - 5.0,
            )]
        } else {
            vec![]
        },
        seed: Some(rng.random()),
        top_n_tokens: rng.random_range(0..=MAX_TOP_N_LOGPROBS),
    }
}

/// Seeded property test: for random logits (some with ties) and random parameters,
/// `processed_probs` matches the reference, sums to 1, and every draw lies in its support.
#[test]
fn random_cases_match_reference_and_stay_in_bounds() {
    let mut rng = ChaCha8Rng::seed_from_u64(2024);
    for case in 0..400 {
        let n = rng.random_range(1..200usize);
        let quantise = rng.random::<bool>();
        let logits: Vec<f32> = (0..n)
            .map(|_| {
                let x = rng.random::<f32>() * 12.0 - 6.0;
                if quantise { (x * 2.0).round() / 2.0 } else { x }
            })
            .collect();
        let params = random_params(&mut rng, n);
        assert_eq!(params.validate(), Ok(()));
        let prompt: Vec<u32> = (0..rng.random_range(0..10))
            .map(|_| rng.random_range(0..n as u32))
            .collect();
        let generated: Vec<u32> = (0..rng.random_range(0..10))
            .map(|_| rng.random_range(0..n as u32))
            .collect();

        let mut s = Sampler::new(params.clone(), &prompt);
        for &id in &generated {
            s.record(id);
        }
        let got = s.processed_probs(&logits);
        let want = reference(&params, &prompt, &generated, &logits);
        let total: f64 = got.iter().map(|&p| f64::from(p)).sum();
        assert!((total - 1.0).abs() < 1e-5, "case {case}: sum {total}");
        for i in 0..n {
            assert_eq!(
                got[i] > 0.0,
                want[i] > 0.0,
                "case {case}: support differs at {i}: {params:?}\n{got:?}\n{want:?}"
            );
            assert!(
                (f64::from(got[i]) - want[i]).abs() < 1e-4,
                "case {case}: token {i} got {} want {}",
                got[i],
                want[i]
            );
        }
        for _ in 0..20 {
            let id = s.choose(&logits) as usize;
            assert!(got[id] > 0.0, "case {case}: drew {id} outside the support");
        }
        let t = s.sample(&logits);
        assert!(got[t.id as usize] > 0.0);
        assert_eq!(t.top_logprobs.len(), (params.top_n_tokens as usize).min(n));
    }
}

#[test]
fn large_vocab_paths_match_reference() {
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let n = 50_000;
    let logits: Vec<f32> = (0..n).map(|_| rng.random::<f32>() * 16.0 - 8.0).collect();
    for params in [
        sampling(|p| p.top_k = 50),
        sampling(|p| p.top_k = 2000),
        sampling(|p| p.top_p = 0.9),
        sampling(|p| p.top_p = 0.3),
        sampling(|p| {
            p.top_k = 40;
            p.top_p = 0.95;
            p.temperature = 0.7;
        }),
        sampling(|p| p.typical_p = 0.9),
        sampling(|p| p.min_p = 0.1),
    ] {
        let mut s = Sampler::new(params.clone(), &[]);
        let got = s.processed_probs(&logits);
        let want = reference(&params, &[], &[], &logits);
        for i in 0..n {
            assert_eq!(
                got[i] > 0.0,
                want[i] > 0.0,
                "{params:?}: support differs at {i}"
            );
            assert!((f64::from(got[i]) - want[i]).abs() < 1e-5);
        }
        for _ in 0..50 {
            let id = s.sample(&logits).id as usize;
            assert!(got[id] > 0.0, "{params:?}: drew {id}");
        }
    }
}

// ---------------------------------------------------------------- robustness

#[test]
fn non_finite_logits_never_panic() {
    let nan = f32::NAN;
    let (inf, ninf) = (f32::INFINITY, f32::NEG_INFINITY);
    let params = sampling(|p| {
        p.top_p = 0.9;
        p.typical_p = 0.9;
        p.min_p = 0.1;
        p.top_k = 3;
        p.repetition_penalty = 1.2;
        p.frequency_penalty = 1.0;
        p.top_n_tokens = 5;
    });
    let mut s = Sampler::new(params.clone(), &[0, 1, 2, 100]);
    for _ in 0..50 {
        let t = s.sample(&[nan, 1.0, ninf, 0.5, nan]);
        assert!(t.id == 1 || t.id == 3, "{t:?}");
        assert!(!t.logprob.is_nan());
        assert!(t.top_logprobs.iter().all(|(_, lp)| !lp.is_nan()));
    }
    // +inf: uniform over the infinite ones.
    let probs = s.processed_probs(&[1.0, inf, 3.0, inf]);
    assert_probs(&probs, &[0.0, 0.5, 0.0, 0.5]);
    // Everything ruled out: the raw argmax (id 0 when none), with finite logprobs.
    let t = s.sample(&[ninf, ninf, ninf]);
    assert_eq!(t.id, 0);
    assert!(t.logprob.is_finite());
    assert_eq!(s.sample(&[nan, nan]).id, 0);
    assert_eq!(s.processed_probs(&[ninf, ninf]), vec![1.0, 0.0]);
    // An empty row.
    let t = s.sample(&[]);
    assert_eq!(t.id, 0);
    assert!(t.top_logprobs.is_empty());
    assert!(s.processed_probs(&[]).is_empty());
    // Greedy with NaN and -inf.
    let mut g = Sampler::new(SamplingParams::default(), &[]);
    assert_eq!(g.sample(&[nan, ninf, -3.0]).id, 2);
    assert_eq!(g.sample(&[ninf, ninf]).id, 0);
}

#[test]
fn unvalidated_params_never_panic() {
    let wild = [
        sampling(|p| p.temperature = -1.0),
        sampling(|p| p.temperature = f32::INFINITY),
        sampling(|p| p.temperature = f32::NAN),
        sampling(|p| p.top_p = 0.0),
        sampling(|p| p.top_p = -3.0),
        sampling(|p| p.top_p = f32::NAN),
        sampling(|p| p.typical_p = 0.0),
        sampling(|p| p.min_p = 7.0),
        sampling(|p| p.min_p = f32::NAN),
        sampling(|p| p.repetition_penalty = 0.0),
        sampling(|p| p.repetition_penalty = -2.0),
        sampling(|p| p.frequency_penalty = f32::INFINITY),
        sampling(|p| p.presence_penalty = f32::NAN),
        sampling(|p| p.logit_bias = vec![(u32::MAX, 1.0), (0, f32::NAN), (1, f32::NEG_INFINITY)]),
        sampling(|p| p.top_n_tokens = u32::MAX),
        sampling(|p| p.top_k = u32::MAX),
    ];
    let logits = [0.3f32, 2.0, -1.0, 0.0];
    for params in wild {
        assert!(Sampler::try_new(params.clone(), &[]).is_err() || params.top_k == u32::MAX);
        let mut s = Sampler::new(params.clone(), &[0, u32::MAX]);
        for _ in 0..5 {
            let t = s.sample(&logits);
            assert!(t.id < 4, "{params:?}");
            assert!(t.top_logprobs.len() <= MAX_TOP_N_LOGPROBS as usize);
            let total: f32 = s.processed_probs(&logits).iter().sum();
            assert!((total - 1.0).abs() < 1e-5, "{params:?}: {total}");
        }
    }
}
