//! Per-sequence token sampling and logits processing.
//!
//! A [`Sampler`] belongs to one sequence. It holds the request's [`SamplingParams`], a
//! seeded ChaCha8 random stream, the prompt's token set and the counts of generated tokens,
//! and turns one row of model logits into a [`SampledToken`].
//!
//! # Order of operations
//!
//! Constrained output ([`Sampler::with_json`], [`Sampler::with_choices`],
//! [`Sampler::with_pattern`]) first sets every token that cannot continue the output to `-inf`
//! (see `constraint`). Then logit space, on a copy of the row (skipped when none of them is
//! on):
//! 1. `logit_bias`: `x[id] += bias` (ids outside the vocabulary are ignored; repeated ids
//!    add up).
//! 2. `repetition_penalty` (Hugging Face): for each distinct token of prompt + generated
//!    tokens, `x < 0 ? x * p : x / p`.
//! 3. `frequency_penalty`, `presence_penalty` (OpenAI): for each generated token,
//!    `x -= count * f + (count > 0) * p`.
//!
//! Greedy decoding (`temperature < 1e-5` or `top_k == 1`) stops here and takes the argmax,
//! ties going to the lowest id. Otherwise, in the order of Hugging Face's
//! `_get_logits_warper` (temperature, top-k, top-p, min-p, typical-p):
//! 4. temperature: `x / t`;
//! 5. top-k: keep tokens whose logit is at least the k-th largest (ties with the k-th are
//!    kept, as in Hugging Face and vLLM);
//! 6. top-p: by probability descending (ties by id), keep each token while the mass before
//!    it is below `top_p`;
//! 7. min-p: keep tokens with `p >= min_p * p_max`, `p_max` over the survivors;
//! 8. typical-p: rank by `|-ln p - H|`, keep each token while the mass before it is below
//!    `typical_p`, plus any token tied with the last one kept.
//!
//! Each truncation renormalises over its survivors before the next one runs, and at least
//! one token always survives. The draw is inverse-CDF over the survivors with one uniform
//! `f64`. [`Sampler::processed_probs`] returns exactly that final distribution (one-hot on
//! the argmax when greedy), for speculative decoding's rejection rule.
//!
//! # Reported log-probabilities
//!
//! [`SampledToken::logprob`] and [`SampledToken::top_logprobs`] are the log-softmax of the
//! **raw** logits, before any processing (vLLM V1's default). `top_logprobs` is sorted by
//! log-probability descending, ties by lower id. Values can be `-inf` (a token the model
//! rules out); they are never NaN.
//!
//! # Reproducibility
//!
//! Draws depend only on the seed, the number of tokens generated so far and the logits:
//! step `n` reads ChaCha8 stream `n` of the seed from its start. So the same seed and
//! logits give the same tokens whatever else is in the batch, and a sequence rebuilt after
//! preemption (a new `Sampler` that [`Sampler::record`]s the tokens generated so far)
//! continues exactly as it would have. Greedy steps draw nothing.
//!
//! # Robustness
//!
//! No input panics. NaN logits count as `-inf`; a token at `-inf` is never drawn, unless
//! every token is at `-inf` after processing, in which case the argmax of the raw logits is
//! returned (id 0 when there is none, including an empty row). If some logits are `+inf`,
//! sampling is uniform over them. Out-of-range parameters are rejected by
//! [`SamplingParams::validate`]; a `Sampler` built from unvalidated ones treats them as off
//! or clamps them rather than failing.
//!
//! # Example
//!
//! ```
//! use tessera_shard::sampling::{Sampler, SamplingParams};
//!
//! let params = SamplingParams { temperature: 0.8, top_p: 0.9, seed: Some(7), ..Default::default() };
//! params.validate().unwrap();
//! let mut sampler = Sampler::new(params, &[1, 2, 3]);
//! let token = sampler.sample(&[0.1, 2.0, -1.0, 0.5]);
//! assert!(token.id < 4);
//! ```

mod byte_language;
mod choice;
mod constraint;
mod json;
mod logprobs;
mod math;
mod pattern;
mod pipeline;
#[cfg(test)]
mod schema_props;
mod set_cache;

use std::sync::Arc;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

pub use tessera_params::{
    MAX_ABS_FREQUENCY_PRESENCE, MAX_ABS_LOGIT_BIAS, MAX_TOP_N_LOGPROBS, OutputConstraint,
    SamplingError, SamplingParams,
};

pub use choice::{Choices, MAX_CHOICES};
pub use constraint::TokenVocab;
pub use pattern::Pattern;

use constraint::Constraint;
use logprobs::LogSoftmax;
pub(crate) use logprobs::top_n;
use pipeline::{History, Outcome, Plan, Scratch};

/// One chosen token with its log-probabilities under the raw model logits.
#[derive(Clone, Debug, PartialEq)]
pub struct SampledToken {
    /// The token id.
    pub id: u32,
    /// Its log-probability under the raw logits.
    pub logprob: f32,
    /// The `top_n_tokens` most likely tokens as `(id, logprob)`, best first, ties by id.
    pub top_logprobs: Vec<(u32, f32)>,
}

/// The sampling state of one sequence. See the [module documentation](self).
#[derive(Clone, Debug)]
pub struct Sampler {
    params: SamplingParams,
    plan: Plan,
    history: History,
    generated: u64,
    rng: ChaCha8Rng,
    /// The step whose stream `rng` is positioned in, if any.
    rng_step: Option<u64>,
    scratch: Scratch,
    /// Constrained output (JSON mode, a choice, a pattern): the tokens that may come next.
    constraint: Option<Constraint>,
    /// The row with disallowed tokens at `-inf`, under a constraint.
    masked: Vec<f32>,
}

impl Sampler {
    /// A sampler for a sequence whose prompt is `prompt_ids`. Does not validate `params`
    /// (see [`Sampler::try_new`]).
    pub fn new(params: SamplingParams, prompt_ids: &[u32]) -> Self {
        let plan = Plan::new(&params);
        let mut history = History::default();
        if plan.repetition.is_some() {
            history.seen.extend(prompt_ids.iter().copied());
        }
        Self {
            rng: ChaCha8Rng::seed_from_u64(params.seed.unwrap_or(0)),
            params,
            plan,
            history,
            generated: 0,
            rng_step: None,
            scratch: Scratch::default(),
            constraint: None,
            masked: Vec::new(),
        }
    }

    /// Constrains the output to one JSON object over `vocab` (JSON mode): tokens that cannot
    /// continue it are at `-inf` before any other processing, and end-of-generation tokens
    /// are allowed only once it is complete. Attach before recording replayed tokens.
    pub fn with_json(self, vocab: Arc<TokenVocab>) -> Self {
        self.with_constraint(Constraint::json(vocab))
    }

    /// Constrains the output to one of `choices` (vLLM's `guided_choice`), as
    /// [`Sampler::with_json`] does to a JSON object.
    pub fn with_choices(self, vocab: Arc<TokenVocab>, choices: Arc<Choices>) -> Self {
        self.with_constraint(Constraint::choice(vocab, choices))
    }

    /// Constrains the output to a string `pattern` matches (vLLM's `guided_regex`), as
    /// [`Sampler::with_json`] does to a JSON object.
    pub fn with_pattern(self, vocab: Arc<TokenVocab>, pattern: Arc<Pattern>) -> Self {
        self.with_constraint(Constraint::pattern(vocab, pattern))
    }

    /// Constrains the output to what `source` (a JSON Schema or a Lark grammar) derives, as
    /// [`Sampler::with_json`] does to a JSON object; an error if it cannot be compiled.
    pub fn with_grammar(
        self,
        vocab: Arc<TokenVocab>,
        source: tessera_text::GrammarSource<'_>,
    ) -> Result<Self, tessera_text::GrammarError> {
        Ok(self.with_constraint(Constraint::grammar(vocab, source)?))
    }

    fn with_constraint(mut self, constraint: Constraint) -> Self {
        self.constraint = Some(constraint);
        self
    }

    /// Whether the output is constrained (JSON mode, a choice, a pattern).
    pub fn is_constrained(&self) -> bool {
        self.constraint.is_some()
    }

    /// [`SamplingParams::validate`], then [`Sampler::new`].
    pub fn try_new(params: SamplingParams, prompt_ids: &[u32]) -> Result<Self, SamplingError> {
        params.validate()?;
        Ok(Self::new(params, prompt_ids))
    }

    /// The parameters this sampler was built with.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Whether this sampler decodes greedily.
    pub fn is_greedy(&self) -> bool {
        self.plan.greedy
    }

    /// How many generated tokens have been recorded.
    pub fn num_generated(&self) -> u64 {
        self.generated
    }

    /// Processes `logits` (one row, one entry per vocabulary token), draws the next token,
    /// records it as generated and reports it with its raw log-probabilities.
    pub fn sample(&mut self, logits: &[f32]) -> SampledToken {
        let id = self.choose(logits);
        let token = self.report(logits, id);
        self.record(id);
        token
    }

    /// Processes `logits` and draws the next token without recording it.
    pub fn choose(&mut self, logits: &[f32]) -> u32 {
        let logits = masked(self.constraint.as_ref(), logits, &mut self.masked);
        match pipeline::process(&self.plan, &self.history, logits, &mut self.scratch) {
            Outcome::Token(id) => id,
            Outcome::Weights { total } => {
                let u = self.uniform();
                pipeline::draw(&self.scratch.cand, total, u)
            }
        }
    }

    /// Reports token `id` with its log-probability and the `top_n_tokens` alternatives,
    /// all from the log-softmax of the raw `logits`. An `id` outside `logits` gets `-inf`.
    pub fn report(&self, logits: &[f32], id: u32) -> SampledToken {
        let ls = LogSoftmax::new(logits);
        let logprob = logits
            .get(id as usize)
            .map_or(f32::NEG_INFINITY, |&x| ls.of(x));
        let top_logprobs = logprobs::top_n(logits, self.plan.top_n_tokens)
            .into_iter()
            .map(|(id, x)| (id, ls.of(x)))
            .collect();
        SampledToken {
            id,
            logprob,
            top_logprobs,
        }
    }

    /// Records `id` as generated: it feeds the penalties and moves the random stream to the
    /// next step. [`Sampler::sample`] calls this itself; call it directly to replay tokens
    /// generated before a preemption, or for tokens chosen outside `sample` (speculative
    /// decoding).
    pub fn record(&mut self, id: u32) {
        if let Some(c) = &mut self.constraint {
            c.advance(id);
        }
        if self.plan.repetition.is_some() {
            self.history.seen.insert(id);
        }
        if self.plan.counts_tokens() {
            *self.history.counts.entry(id).or_insert(0) += 1;
        }
        self.generated += 1;
    }

    /// The distribution [`Sampler::sample`] would draw from for `logits` now, as one
    /// probability per vocabulary token summing to 1 (one-hot on the argmax when greedy;
    /// empty for an empty row).
    pub fn processed_probs(&self, logits: &[f32]) -> Vec<f32> {
        let mut buffer = Vec::new();
        let logits = masked(self.constraint.as_ref(), logits, &mut buffer);
        let mut scratch = Scratch::default();
        let mut probs = vec![0.0f32; logits.len()];
        match pipeline::process(&self.plan, &self.history, logits, &mut scratch) {
            Outcome::Token(id) => {
                if let Some(p) = probs.get_mut(id as usize) {
                    *p = 1.0;
                }
            }
            Outcome::Weights { total } => {
                for c in &scratch.cand {
                    probs[c.id as usize] = (f64::from(c.value) / total) as f32;
                }
            }
        }
        probs
    }

    /// A uniform number in `[0, 1)` from this step's random stream. Successive calls within
    /// one step (before the next [`Sampler::record`]) continue the stream; the first call
    /// of step `n` starts stream `n` from its beginning.
    pub fn uniform(&mut self) -> f64 {
        if self.rng_step != Some(self.generated) {
            self.rng.set_stream(self.generated);
            self.rng.set_word_pos(0);
            self.rng_step = Some(self.generated);
        }
        self.rng.random::<f64>()
    }

    /// Draws an index with probability proportional to `weights` (negative and NaN weights
    /// count as 0) from this step's random stream; `None` when no weight is positive or the
    /// weights do not have a finite sum. For speculative decoding's residual distribution.
    pub fn draw_weighted(&mut self, weights: &[f32]) -> Option<u32> {
        let total: f64 = weights
            .iter()
            .filter(|w| **w > 0.0)
            .map(|&w| f64::from(w))
            .sum();
        if !(total > 0.0 && total.is_finite()) {
            return None;
        }
        let target = self.uniform() * total;
        let mut cum = 0.0f64;
        let mut last = None;
        for (id, &w) in (0u32..).zip(weights) {
            if w > 0.0 {
                cum += f64::from(w);
                last = Some(id);
                if cum > target {
                    return Some(id);
                }
            }
        }
        last
    }
}

/// `logits` as the constraint (if any) lets them be: disallowed tokens at `-inf`, in `buffer`.
fn masked<'a>(
    constraint: Option<&Constraint>,
    logits: &'a [f32],
    buffer: &'a mut Vec<f32>,
) -> &'a [f32] {
    match constraint {
        Some(c) => {
            c.mask_into(logits, buffer);
            buffer
        }
        None => logits,
    }
}

#[cfg(test)]
mod tests;
