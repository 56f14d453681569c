//! The logits-processing pipeline behind [`super::Sampler`]: penalties and bias in logit
//! space, then temperature and truncation over a candidate list.
//!
//! Everything here is robust to unvalidated parameters and to NaN or infinite logits:
//! [`Plan::new`] turns out-of-range settings into "off" or clamps them, NaN logits count as
//! `-inf`, and a token at `-inf` is never a candidate.

use std::cmp::Ordering;
use std::collections::{HashMap, HashSet};

use super::math::exp;
use tessera_params::{MAX_TOP_N_LOGPROBS, SamplingParams};

/// Above this `top_k`, the k-th largest logit is found with `select_nth_unstable` on a copy
/// instead of a small sorted buffer.
const SMALL_TOP_K: usize = 512;

/// First chunk of the incremental partial sort used by top-p and typical-p.
const FIRST_CHUNK: usize = 64;

/// The sanitised, ready-to-run form of [`SamplingParams`].
#[derive(Clone, Debug)]
pub(super) struct Plan {
    pub(super) greedy: bool,
    inv_temperature: f32,
    top_k: Option<usize>,
    top_p: Option<f64>,
    typical_p: Option<f64>,
    /// `ln(min_p)`, at most 0.
    log_min_p: Option<f32>,
    pub(super) repetition: Option<f32>,
    frequency: f32,
    presence: f32,
    bias: Vec<(u32, f32)>,
    pub(super) top_n_tokens: usize,
}

impl Plan {
    pub(super) fn new(p: &SamplingParams) -> Self {
        let finite_or = |x: f32, off: f32| if x.is_finite() { x } else { off };
        Self {
            greedy: p.is_greedy(),
            inv_temperature: 1.0 / p.temperature,
            top_k: (p.top_k > 0).then_some(p.top_k as usize),
            top_p: (p.top_p < 1.0).then_some(f64::from(p.top_p)),
            typical_p: (p.typical_p < 1.0).then_some(f64::from(p.typical_p)),
            log_min_p: (p.min_p > 0.0).then(|| p.min_p.min(1.0).ln()),
            repetition: (p.repetition_penalty.is_finite()
                && p.repetition_penalty > 0.0
                && p.repetition_penalty != 1.0)
                .then_some(p.repetition_penalty),
            frequency: finite_or(p.frequency_penalty, 0.0),
            presence: finite_or(p.presence_penalty, 0.0),
            bias: p
                .logit_bias
                .iter()
                .copied()
                .filter(|(_, b)| b.is_finite() && *b != 0.0)
                .collect(),
            top_n_tokens: p.top_n_tokens.min(MAX_TOP_N_LOGPROBS) as usize,
        }
    }

    /// Whether frequency or presence penalties need generated-token counts.
    pub(super) fn counts_tokens(&self) -> bool {
        self.frequency != 0.0 || self.presence != 0.0
    }

    fn adjusts_logits(&self) -> bool {
        !self.bias.is_empty() || self.repetition.is_some() || self.counts_tokens()
    }
}

/// The tokens the penalties look at.
#[derive(Clone, Debug, Default)]
pub(super) struct History {
    /// Prompt and generated tokens (only kept when the repetition penalty is on).
    pub(super) seen: HashSet<u32>,
    /// Generated-token counts (only kept when frequency or presence penalties are on).
    pub(super) counts: HashMap<u32, u32>,
}

/// One surviving token: its logit relative to the maximum after temperature (so at most 0),
/// and after [`Outcome::Weights`] its unnormalised probability.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Cand {
    pub(super) value: f32,
    pub(super) id: u32,
}

/// Buffers reused from one step to the next.
#[derive(Clone, Debug, Default)]
pub(super) struct Scratch {
    /// Logits after bias and penalties.
    work: Vec<f32>,
    /// Logit copy for large-k selection.
    values: Vec<f32>,
    /// The candidate set.
    pub(super) cand: Vec<Cand>,
}

/// What the pipeline decided.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Outcome {
    /// Exactly this token (greedy decoding, or nothing was left to sample from).
    Token(u32),
    /// Sample from `scratch.cand`, whose `value`s are now weights summing to `total`.
    Weights { total: f64 },
}

/// Runs the whole pipeline on `logits`.
pub(super) fn process(
    plan: &Plan,
    history: &History,
    logits: &[f32],
    scratch: &mut Scratch,
) -> Outcome {
    let Scratch { work, values, cand } = scratch;
    let src: &[f32] = if plan.adjusts_logits() {
        work.clear();
        work.extend_from_slice(logits);
        apply_bias(work, &plan.bias);
        if let Some(penalty) = plan.repetition {
            apply_repetition(work, &history.seen, penalty);
        }
        if plan.counts_tokens() {
            apply_frequency_presence(work, &history.counts, plan.frequency, plan.presence);
        }
        work
    } else {
        logits
    };
    let fallback = || Outcome::Token(argmax(logits).unwrap_or(0));
    if plan.greedy {
        return argmax(src).map_or_else(fallback, Outcome::Token);
    }

    let (max, threshold) = match plan.top_k {
        Some(k) if k < src.len() => kth_largest(src, k, values),
        _ => (max_of(src), f32::NEG_INFINITY),
    };
    cand.clear();
    if max == f32::INFINITY {
        cand.extend(
            (0u32..)
                .zip(src)
                .filter(|&(_, &x)| x == f32::INFINITY)
                .map(|(id, _)| Cand { value: 0.0, id }),
        );
    } else if max == f32::NEG_INFINITY {
        return fallback();
    } else {
        let s = plan.inv_temperature;
        cand.extend((0u32..).zip(src).filter_map(|(id, &x)| {
            let value = (x - max) * s;
            (x >= threshold && value > f32::NEG_INFINITY).then_some(Cand { value, id })
        }));
    }
    // `cand` is in id order here; top-p and typical-p leave it in their own sort order.
    // Either way the order is a pure function of the logits, so draws are reproducible.
    if let Some(p) = plan.top_p {
        top_p(cand, p);
    }
    if let Some(log_min_p) = plan.log_min_p {
        min_p(cand, log_min_p);
    }
    if let Some(mass) = plan.typical_p {
        typical_p(cand, mass);
    }
    match to_weights(cand) {
        Some(total) => Outcome::Weights { total },
        None => fallback(),
    }
}

/// Adds each bias to its token's logit (ids outside the vocabulary are ignored).
fn apply_bias(logits: &mut [f32], bias: &[(u32, f32)]) {
    for &(id, b) in bias {
        if let Some(x) = logits.get_mut(id as usize) {
            *x += b;
        }
    }
}

/// Hugging Face `RepetitionPenaltyLogitsProcessor`: `x < 0 ? x * p : x / p`, once per
/// distinct token.
fn apply_repetition(logits: &mut [f32], seen: &HashSet<u32>, penalty: f32) {
    for &id in seen {
        if let Some(x) = logits.get_mut(id as usize) {
            *x = if *x < 0.0 { *x * penalty } else { *x / penalty };
        }
    }
}

/// OpenAI frequency and presence penalties: `x -= count * f + (count > 0) * p`.
fn apply_frequency_presence(
    logits: &mut [f32],
    counts: &HashMap<u32, u32>,
    frequency: f32,
    presence: f32,
) {
    for (&id, &count) in counts {
        if let Some(x) = logits.get_mut(id as usize) {
            *x -= count as f32 * frequency + presence;
        }
    }
}

/// The lowest id holding the largest value above `-inf` (NaN never wins).
pub(super) fn argmax(xs: &[f32]) -> Option<u32> {
    let max = max_of(xs);
    if max == f32::NEG_INFINITY {
        return None;
    }
    xs.iter().position(|&x| x == max).map(|i| i as u32)
}

fn max_of(xs: &[f32]) -> f32 {
    super::math::max(xs)
}

/// `(max, k-th largest)` of the non-NaN values of `xs`, for `1 <= k < xs.len()`. Returns
/// `-inf` as the k-th value when fewer than `k` values are above `-inf`.
fn kth_largest(xs: &[f32], k: usize, values: &mut Vec<f32>) -> (f32, f32) {
    debug_assert!(k >= 1 && k < xs.len());
    if k <= SMALL_TOP_K {
        // Ascending buffer of the k largest seen so far; after the first few thousand
        // elements almost every value fails the first comparison.
        values.clear();
        for &x in xs {
            if x.is_nan() || x == f32::NEG_INFINITY {
                continue;
            }
            if values.len() == k {
                if x <= values[0] {
                    continue;
                }
                values.remove(0);
            }
            let pos = values.partition_point(|&v| v < x);
            values.insert(pos, x);
        }
        let max = values.last().copied().unwrap_or(f32::NEG_INFINITY);
        let kth = if values.len() == k {
            values[0]
        } else {
            f32::NEG_INFINITY
        };
        (max, kth)
    } else {
        values.clear();
        values.extend(
            xs.iter()
                .map(|&x| if x.is_nan() { f32::NEG_INFINITY } else { x }),
        );
        let (_, kth, _) = values.select_nth_unstable_by(k - 1, |a, b| b.total_cmp(a));
        let kth = *kth;
        (max_of(xs), kth)
    }
}

/// Logit descending, then id ascending: the rank order of top-p.
fn by_value_desc(a: &Cand, b: &Cand) -> Ordering {
    b.value.total_cmp(&a.value).then(a.id.cmp(&b.id))
}

/// The largest candidate value (`-inf` when there are none).
fn max_value(cand: &[Cand]) -> f32 {
    cand.iter().fold(
        f32::NEG_INFINITY,
        |m, c| if c.value > m { c.value } else { m },
    )
}

/// `sum(exp(value - max))` over the candidates, in `f64`.
fn normaliser(cand: &[Cand], max: f32) -> f64 {
    cand.iter().map(|c| f64::from(exp(c.value - max))).sum()
}

/// Sorts `cand` by `order` just far enough to find the shortest prefix whose probability
/// mass reaches `mass` (a token is kept while the mass before it is below `mass`, and at
/// least one is always kept) and returns its length. The prefix ends sorted by `order`, and
/// everything after it ranks at or after it.
///
/// The sort is incremental: `select_nth_unstable_by` splits off the next chunk (64, then 4×
/// larger each round) and only that chunk is sorted, so a peaked distribution costs O(n)
/// rather than O(n log n).
fn mass_prefix_len(
    cand: &mut [Cand],
    mass: f64,
    order: impl Fn(&Cand, &Cand) -> Ordering,
) -> usize {
    let n = cand.len();
    let max = max_value(cand);
    let inv_sum = 1.0 / normaliser(cand, max);
    let mut sorted = 0;
    let mut chunk = FIRST_CHUNK;
    let mut before = 0.0f64;
    while sorted < n {
        let end = (sorted + chunk).min(n);
        if end < n {
            cand[sorted..].select_nth_unstable_by(end - sorted - 1, &order);
        }
        cand[sorted..end].sort_unstable_by(&order);
        for (i, c) in cand.iter().enumerate().take(end).skip(sorted) {
            if i > 0 && before >= mass {
                return i;
            }
            before += f64::from(exp(c.value - max)) * inv_sum;
        }
        sorted = end;
        chunk = chunk.saturating_mul(4);
    }
    n
}

/// Hugging Face `TopPLogitsWarper`: keep the most likely tokens while the mass before each
/// is below `p`.
fn top_p(cand: &mut Vec<Cand>, p: f64) {
    let kept = mass_prefix_len(cand, p, by_value_desc);
    cand.truncate(kept);
}

/// Hugging Face `MinPLogitsWarper`: keep tokens with `prob >= min_p * max_prob`, i.e.
/// `value >= max_value + ln(min_p)`.
fn min_p(cand: &mut Vec<Cand>, log_min_p: f32) {
    let threshold = max_value(cand) + log_min_p;
    cand.retain(|c| c.value >= threshold);
}

/// Hugging Face `TypicalLogitsWarper`: rank tokens by `|-log p - H|` (H the entropy), keep
/// them in that order while the mass before each is below `mass`, plus any token whose
/// score ties the last one kept.
fn typical_p(cand: &mut Vec<Cand>, mass: f64) {
    let max = max_value(cand);
    let sum = normaliser(cand, max);
    let lse = f64::from(max) + sum.ln();
    let entropy: f64 = -cand
        .iter()
        .map(|c| f64::from(exp(c.value - max)) / sum * (f64::from(c.value) - lse))
        .sum::<f64>();
    let score = |c: &Cand| ((lse - f64::from(c.value)) - entropy).abs();
    let order = |a: &Cand, b: &Cand| score(a).total_cmp(&score(b)).then(a.id.cmp(&b.id));
    let prefix = mass_prefix_len(cand, mass, order);
    if prefix == 0 || prefix == cand.len() {
        return;
    }
    let last = score(&cand[prefix - 1]);
    let mut kept = prefix;
    for i in prefix..cand.len() {
        if score(&cand[i]) <= last {
            cand.swap(kept, i);
            kept += 1;
        }
    }
    cand.truncate(kept);
    if kept > prefix {
        cand.sort_unstable_by(order);
    }
}

/// Turns candidate values into weights `exp(value - max)` and returns their sum, or `None`
/// when there is nothing to sample from.
fn to_weights(cand: &mut [Cand]) -> Option<f64> {
    let max = max_value(cand);
    if !max.is_finite() {
        return None;
    }
    let mut total = 0.0f64;
    for c in cand.iter_mut() {
        c.value = exp(c.value - max);
        total += f64::from(c.value);
    }
    (total > 0.0).then_some(total)
}

/// Inverse-CDF draw: the first candidate whose cumulative weight exceeds `u * total`.
pub(super) fn draw(cand: &[Cand], total: f64, u: f64) -> u32 {
    let target = u * total;
    let mut cum = 0.0f64;
    let mut last = None;
    for c in cand {
        if c.value > 0.0 {
            cum += f64::from(c.value);
            last = Some(c.id);
            if cum > target {
                return c.id;
            }
        }
    }
    // Only reachable through rounding when u is within an ulp of 1.
    last.or(cand.first().map(|c| c.id)).unwrap_or(0)
}
