//! How one sequence chooses its next token, and the ranges its parameters must lie in.

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// The most alternatives a request may ask for in [`SamplingParams::top_n_tokens`].
pub const MAX_TOP_N_LOGPROBS: u32 = 20;

/// The largest magnitude of one [`SamplingParams::logit_bias`] entry (OpenAI's bound).
pub const MAX_ABS_LOGIT_BIAS: f32 = 100.0;

/// The largest magnitude of [`SamplingParams::frequency_penalty`] and
/// [`SamplingParams::presence_penalty`] (OpenAI's bound).
pub const MAX_ABS_FREQUENCY_PRESENCE: f32 = 2.0;

/// How one sequence chooses its next token. The default is greedy decoding with every
/// processor switched off.
///
/// See the [module documentation](super) for the order in which the fields are applied.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SamplingParams {
    /// Softmax temperature; `0` (or anything below `1e-5`) means greedy decoding.
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens (ties with the k-th are kept); `0` is off,
    /// `1` is greedy decoding.
    pub top_k: u32,
    /// Nucleus sampling: keep the smallest set of most likely tokens whose mass reaches
    /// `top_p`; `1.0` is off.
    pub top_p: f32,
    /// Locally typical sampling mass; `1.0` is off.
    pub typical_p: f32,
    /// Drop tokens whose probability is below `min_p` times the top probability; `0.0` is
    /// off.
    pub min_p: f32,
    /// Hugging Face repetition penalty over the set of prompt and generated tokens:
    /// `logit > 0 ? logit / p : logit * p`; `1.0` is off.
    pub repetition_penalty: f32,
    /// OpenAI frequency penalty over generated tokens: `logit -= count * f`; `0` is off.
    pub frequency_penalty: f32,
    /// OpenAI presence penalty over generated tokens: `logit -= (count > 0) * p`; `0` is
    /// off.
    pub presence_penalty: f32,
    /// Additive biases `(token id, bias)` applied to the raw logits; repeated ids add up.
    pub logit_bias: Vec<(u32, f32)>,
    /// Seed of this sequence's random stream; `None` only when decoding greedily without a
    /// seed from the client (the router draws one for every sampled request).
    pub seed: Option<u64>,
    /// How many most likely alternatives to report with each token (at most
    /// [`MAX_TOP_N_LOGPROBS`]).
    pub top_n_tokens: u32,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            typical_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            logit_bias: Vec::new(),
            seed: None,
            top_n_tokens: 0,
        }
    }
}

/// A sampling parameter outside its allowed range. Each message names the field and the
/// range.
#[derive(Clone, Debug, PartialEq, Error)]
#[non_exhaustive]
pub enum SamplingError {
    /// A floating-point parameter (a `logit_bias` value included) is not finite or outside
    /// its range.
    #[error("`{field}` must be {bound}. Given: {value}")]
    OutOfRange {
        /// The parameter, as requests name it.
        field: &'static str,
        /// Its range, in words.
        bound: &'static str,
        /// The offending value.
        value: f32,
    },
    /// A `logit_bias` token id is not in the vocabulary.
    #[error("`logit_bias` token {token} must be < vocabulary size {vocab_size}")]
    LogitBiasToken {
        /// The offending token id.
        token: u32,
        /// The model's vocabulary size.
        vocab_size: usize,
    },
    /// `top_n_tokens` is above [`MAX_TOP_N_LOGPROBS`].
    #[error("`top_n_tokens` must be <= {MAX_TOP_N_LOGPROBS}. Given: {0}")]
    TopNTokens(u32),
}

/// The range one floating-point parameter must lie in: finite, and accepted by `contains`.
struct Range {
    field: &'static str,
    bound: &'static str,
    contains: fn(f32) -> bool,
}

impl Range {
    fn check(&self, value: f32) -> Result<(), SamplingError> {
        if value.is_finite() && (self.contains)(value) {
            return Ok(());
        }
        Err(SamplingError::OutOfRange {
            field: self.field,
            bound: self.bound,
            value,
        })
    }
}

fn in_unit_interval(x: f32) -> bool {
    x > 0.0 && x <= 1.0
}

fn within_frequency_presence(x: f32) -> bool {
    x.abs() <= MAX_ABS_FREQUENCY_PRESENCE
}

const TEMPERATURE: Range = Range {
    field: "temperature",
    bound: ">= 0",
    contains: |t| t >= 0.0,
};
const TOP_P: Range = Range {
    field: "top_p",
    bound: "in (0, 1]",
    contains: in_unit_interval,
};
const TYPICAL_P: Range = Range {
    field: "typical_p",
    bound: "in (0, 1]",
    contains: in_unit_interval,
};
const MIN_P: Range = Range {
    field: "min_p",
    bound: "in [0, 1]",
    contains: |p| (0.0..=1.0).contains(&p),
};
const REPETITION_PENALTY: Range = Range {
    field: "repetition_penalty",
    bound: "strictly positive",
    contains: |p| p > 0.0,
};
const FREQUENCY_PENALTY: Range = Range {
    field: "frequency_penalty",
    bound: "in [-2, 2]",
    contains: within_frequency_presence,
};
const PRESENCE_PENALTY: Range = Range {
    field: "presence_penalty",
    bound: "in [-2, 2]",
    contains: within_frequency_presence,
};
const LOGIT_BIAS: Range = Range {
    field: "logit_bias",
    bound: "in [-100, 100]",
    contains: |b| b.abs() <= MAX_ABS_LOGIT_BIAS,
};

impl SamplingParams {
    /// Checks every field against its allowed range, in the order the fields are declared.
    /// Token ids in `logit_bias` are not checked here (see
    /// [`SamplingParams::validate_for_vocab`]).
    pub fn validate(&self) -> Result<(), SamplingError> {
        TEMPERATURE.check(self.temperature)?;
        TOP_P.check(self.top_p)?;
        TYPICAL_P.check(self.typical_p)?;
        MIN_P.check(self.min_p)?;
        REPETITION_PENALTY.check(self.repetition_penalty)?;
        FREQUENCY_PENALTY.check(self.frequency_penalty)?;
        PRESENCE_PENALTY.check(self.presence_penalty)?;
        for &(_, bias) in &self.logit_bias {
            LOGIT_BIAS.check(bias)?;
        }
        if self.top_n_tokens > MAX_TOP_N_LOGPROBS {
            return Err(SamplingError::TopNTokens(self.top_n_tokens));
        }
        Ok(())
    }

    /// [`SamplingParams::validate`], and also checks that every `logit_bias` token id is
    /// below `vocab_size`.
    pub fn validate_for_vocab(&self, vocab_size: usize) -> Result<(), SamplingError> {
        self.validate()?;
        self.check_vocab(vocab_size)
    }

    /// Checks only that every `logit_bias` token id is below `vocab_size` (what a shard must
    /// know to index its logits safely).
    pub fn check_vocab(&self, vocab_size: usize) -> Result<(), SamplingError> {
        match self
            .logit_bias
            .iter()
            .find(|(token, _)| *token as usize >= vocab_size)
        {
            Some(&(token, _)) => Err(SamplingError::LogitBiasToken { token, vocab_size }),
            None => Ok(()),
        }
    }

    /// Whether these parameters decode greedily (temperature below `1e-5`, or `top_k == 1`).
    pub fn is_greedy(&self) -> bool {
        self.temperature.is_nan() || self.temperature <= GREEDY_TEMPERATURE || self.top_k == 1
    }
}

/// Temperatures at or below this decode greedily (vLLM's `_SAMPLING_EPS`).
const GREEDY_TEMPERATURE: f32 = 1e-5;

#[cfg(test)]
mod tests {
    use super::*;

    fn err_of(f: impl FnOnce(&mut SamplingParams)) -> SamplingError {
        let mut p = SamplingParams::default();
        f(&mut p);
        p.validate().expect_err("should be rejected")
    }

    #[test]
    fn default_is_valid_and_greedy() {
        let p = SamplingParams::default();
        assert_eq!(p.validate(), Ok(()));
        assert!(p.is_greedy());
    }

    #[test]
    fn accepts_range_edges() {
        let p = SamplingParams {
            temperature: 2.0,
            top_k: 1_000_000,
            top_p: 1.0,
            typical_p: 1e-6,
            min_p: 1.0,
            repetition_penalty: 1e-3,
            frequency_penalty: -2.0,
            presence_penalty: 2.0,
            logit_bias: vec![(5, -100.0), (6, 100.0)],
            seed: Some(u64::MAX),
            top_n_tokens: 20,
        };
        assert_eq!(p.validate(), Ok(()));
        assert_eq!(p.validate_for_vocab(7), Ok(()));
        assert!(!p.is_greedy());
    }

    #[test]
    fn rejections_name_field_and_range() {
        let cases: Vec<(SamplingError, &str)> = vec![
            (
                err_of(|p| p.temperature = -0.1),
                "`temperature` must be >= 0. Given: -0.1",
            ),
            (
                err_of(|p| p.temperature = f32::NAN),
                "`temperature` must be >= 0. Given: NaN",
            ),
            (err_of(|p| p.temperature = f32::INFINITY), "temperature"),
            (err_of(|p| p.top_p = 0.0), "`top_p` must be in (0, 1]"),
            (err_of(|p| p.top_p = 1.5), "top_p"),
            (
                err_of(|p| p.typical_p = f32::NAN),
                "`typical_p` must be in (0, 1]",
            ),
            (err_of(|p| p.min_p = -0.5), "`min_p` must be in [0, 1]"),
            (err_of(|p| p.min_p = 1.01), "min_p"),
            (
                err_of(|p| p.repetition_penalty = 0.0),
                "`repetition_penalty` must be strictly positive. Given: 0",
            ),
            (
                err_of(|p| p.repetition_penalty = f32::INFINITY),
                "repetition_penalty",
            ),
            (
                err_of(|p| p.frequency_penalty = 2.5),
                "`frequency_penalty` must be in [-2, 2]. Given: 2.5",
            ),
            (
                err_of(|p| p.presence_penalty = -2.5),
                "`presence_penalty` must be in [-2, 2]",
            ),
            (
                err_of(|p| p.logit_bias = vec![(3, 101.0)]),
                "`logit_bias` must be in [-100, 100]. Given: 101",
            ),
            (
                err_of(|p| p.logit_bias = vec![(3, f32::NAN)]),
                "[-100, 100]",
            ),
            (
                err_of(|p| p.top_n_tokens = 21),
                "`top_n_tokens` must be <= 20. Given: 21",
            ),
        ];
        for (err, needle) in cases {
            let msg = err.to_string();
            assert!(msg.contains(needle), "{msg:?} should contain {needle:?}");
        }
    }

    #[test]
    fn vocab_check_names_token() {
        let p = SamplingParams {
            logit_bias: vec![(1, 1.0), (10, 1.0)],
            ..Default::default()
        };
        let err = p.validate_for_vocab(10).unwrap_err();
        assert_eq!(
            err,
            SamplingError::LogitBiasToken {
                token: 10,
                vocab_size: 10
            }
        );
        assert!(err.to_string().contains("`logit_bias` token 10"));
    }

    #[test]
    fn greedy_detection() {
        let mut p = SamplingParams {
            temperature: 0.7,
            ..Default::default()
        };
        assert!(!p.is_greedy());
        p.top_k = 1;
        assert!(p.is_greedy());
        p.top_k = 0;
        p.temperature = 1e-6;
        assert!(p.is_greedy());
        p.temperature = f32::NAN;
        assert!(p.is_greedy());
    }
}
