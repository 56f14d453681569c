//! Sampling and stopping parameters: the API-neutral [`RequestParameters`] checked against
//! their ranges and the limits into [`SamplingParams`] and [`StoppingParams`].

use tessera_params::{OutputConstraint, SamplingParams, StoppingParams};

use super::{Validation, ValidationError};

/// Sampling and stopping parameters as the client gave them (API-neutral).
#[derive(Debug, Clone, PartialEq)]
pub struct RequestParameters {
    /// Sample instead of decoding greedily (with `temperature`, default 1).
    pub do_sample: bool,
    /// Softmax temperature, >= 0; 0 is greedy.
    pub temperature: Option<f32>,
    /// Keep the k most likely tokens; > 0.
    pub top_k: Option<i64>,
    /// Nucleus mass, in (0, 1].
    pub top_p: Option<f32>,
    /// Typical mass, in (0, 1].
    pub typical_p: Option<f32>,
    /// Minimum relative probability, in [0, 1].
    pub min_p: Option<f32>,
    /// Repetition penalty, > 0.
    pub repetition_penalty: Option<f32>,
    /// Frequency penalty, in [-2, 2].
    pub frequency_penalty: Option<f32>,
    /// Presence penalty, in [-2, 2].
    pub presence_penalty: Option<f32>,
    /// Token id (as a string, OpenAI style) and bias in [-100, 100].
    pub logit_bias: Vec<(String, f32)>,
    /// Sampling seed.
    pub seed: Option<u64>,
    /// Alternatives to report per token.
    pub top_n_tokens: Option<u32>,
    /// Tokens to generate at most; default: what the context allows.
    pub max_new_tokens: Option<u32>,
    /// Stop sequences.
    pub stop: Vec<String>,
    /// Generate past end-of-sequence tokens.
    pub ignore_eos: bool,
    /// Tokens that end the generation as an end-of-sequence token does.
    pub stop_token_ids: Vec<u32>,
    /// Return the prompt tokens' logprobs.
    pub decoder_input_details: bool,
    /// Leave special tokens out of the text.
    pub skip_special_tokens: bool,
    /// The shape the output must take (a pattern is checked when set).
    pub constraint: Option<OutputConstraint>,
}

impl Default for RequestParameters {
    fn default() -> Self {
        Self {
            do_sample: false,
            temperature: None,
            top_k: None,
            top_p: None,
            typical_p: None,
            min_p: None,
            repetition_penalty: None,
            frequency_penalty: None,
            presence_penalty: None,
            logit_bias: Vec::new(),
            seed: None,
            top_n_tokens: None,
            max_new_tokens: None,
            stop: Vec::new(),
            ignore_eos: false,
            stop_token_ids: Vec::new(),
            decoder_input_details: false,
            skip_special_tokens: true,
            constraint: None,
        }
    }
}

/// Most `stop_token_ids` of a request.
const MAX_STOP_TOKEN_IDS: usize = 64;

impl Validation {
    /// `max_new_tokens` (defaulted to what the context allows), the stop sequences and
    /// `ignore_eos`, for a prompt of `input` tokens.
    pub(super) fn validate_stopping(
        &self,
        p: &RequestParameters,
        input: usize,
    ) -> Result<StoppingParams, ValidationError> {
        let cfg = &self.config;
        let room = u32::try_from(cfg.max_total_tokens.saturating_sub(input)).unwrap_or(u32::MAX);
        let max_new_tokens = match p.max_new_tokens {
            Some(0) => {
                return Err(ValidationError::out_of_range(
                    "max_new_tokens",
                    "strictly positive",
                    0,
                ));
            }
            Some(n) => n,
            None => room.min(cfg.default_max_new_tokens.unwrap_or(u32::MAX)),
        };
        if max_new_tokens == 0 || input + max_new_tokens as usize > cfg.max_total_tokens {
            return Err(ValidationError::MaxTotalTokens {
                max: cfg.max_total_tokens,
                input,
                new: max_new_tokens,
            });
        }
        if p.stop.len() > cfg.max_stop_sequences {
            return Err(ValidationError::TooMany {
                param: "stop",
                max: cfg.max_stop_sequences,
                given: p.stop.len(),
            });
        }
        if p.stop.iter().any(String::is_empty) {
            return Err(ValidationError::EmptyStopSequence);
        }
        if p.stop_token_ids.len() > MAX_STOP_TOKEN_IDS {
            return Err(ValidationError::TooMany {
                param: "stop_token_ids",
                max: MAX_STOP_TOKEN_IDS,
                given: p.stop_token_ids.len(),
            });
        }
        let vocab_size = self.tokenizer.vocab_size();
        if let Some(&id) = p
            .stop_token_ids
            .iter()
            .find(|&&id| id as usize >= vocab_size)
        {
            return Err(ValidationError::TokenId {
                param: "stop_token_ids",
                token: id.to_string(),
                vocab_size,
            });
        }
        Ok(StoppingParams {
            max_new_tokens,
            stop_sequences: p.stop.clone(),
            ignore_eos: p.ignore_eos,
            stop_token_ids: p.stop_token_ids.clone(),
        })
    }

    /// The sampling parameters with defaults filled in, checked against their ranges
    /// ([`SamplingParams::validate`]), and a seed drawn when sampling without one.
    pub(super) fn validate_parameters(
        &self,
        p: RequestParameters,
    ) -> Result<SamplingParams, ValidationError> {
        let top_k = match p.top_k {
            None => 0,
            Some(k) => u32::try_from(k)
                .ok()
                .filter(|&k| k > 0)
                .ok_or_else(|| ValidationError::out_of_range("top_k", "strictly positive", k))?,
        };
        let top_n_tokens = p.top_n_tokens.unwrap_or(0);
        if top_n_tokens > self.config.max_top_n_tokens {
            return Err(ValidationError::TooMany {
                param: "top_n_tokens",
                max: self.config.max_top_n_tokens as usize,
                given: top_n_tokens as usize,
            });
        }
        let off = SamplingParams::default();
        let mut params = SamplingParams {
            temperature: p.temperature.unwrap_or(SAMPLING_TEMPERATURE),
            top_k,
            top_p: p.top_p.unwrap_or(off.top_p),
            typical_p: p.typical_p.unwrap_or(off.typical_p),
            min_p: p.min_p.unwrap_or(off.min_p),
            repetition_penalty: p.repetition_penalty.unwrap_or(off.repetition_penalty),
            frequency_penalty: p.frequency_penalty.unwrap_or(off.frequency_penalty),
            presence_penalty: p.presence_penalty.unwrap_or(off.presence_penalty),
            logit_bias: self.logit_bias_ids(&p.logit_bias)?,
            seed: p.seed,
            top_n_tokens,
        };
        // A temperature sent without `do_sample` is checked too, then greedy decoding drops it.
        params.validate()?;
        if !p.do_sample {
            params.temperature = 0.0;
        }
        if params.seed.is_none() && params.temperature > 0.0 {
            params.seed = Some(random_u64());
        }
        Ok(params)
    }

    /// The `logit_bias` entries with their token ids (given as strings) parsed and checked
    /// against the vocabulary; the biases are checked with the other ranges.
    fn logit_bias_ids(&self, bias: &[(String, f32)]) -> Result<Vec<(u32, f32)>, ValidationError> {
        let vocab_size = self.tokenizer.vocab_size();
        bias.iter()
            .map(|(token, b)| {
                let id = token
                    .trim()
                    .parse::<u32>()
                    .ok()
                    .filter(|&id| (id as usize) < vocab_size)
                    .ok_or_else(|| ValidationError::TokenId {
                        param: "logit_bias",
                        token: token.clone(),
                        vocab_size,
                    })?;
                Ok((id, *b))
            })
            .collect()
    }

    /// Checks the number of samples (`n`, `best_of`) against `max_best_of`.
    pub fn validate_n(&self, param: &'static str, n: usize) -> Result<(), ValidationError> {
        if n == 0 {
            return Err(ValidationError::out_of_range(param, "strictly positive", 0));
        }
        if n > self.config.max_best_of {
            return Err(ValidationError::TooMany {
                param,
                max: self.config.max_best_of,
                given: n,
            });
        }
        Ok(())
    }
}

/// The temperature of a request that samples without giving one.
const SAMPLING_TEMPERATURE: f32 = 1.0;

/// OpenAI's `temperature` range, narrower than the engine's.
pub(crate) fn check_openai_temperature(temperature: Option<f32>) -> Result<(), ValidationError> {
    match temperature {
        Some(t) if !(0.0..=2.0).contains(&t) => {
            Err(ValidationError::out_of_range("temperature", "in [0, 2]", t))
        }
        _ => Ok(()),
    }
}

/// How many alternatives per token an OpenAI request asks for, under its endpoint's field
/// name and bound (narrower than `max_top_n_tokens`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TopLogprobs {
    /// `top_logprobs` (chat) or `logprobs` (completions).
    pub(crate) param: &'static str,
    /// The count asked for.
    pub(crate) given: u32,
    /// The endpoint's bound.
    pub(crate) max: u32,
}

impl TopLogprobs {
    /// The count, when within the bound.
    pub(crate) fn check(self) -> Result<u32, ValidationError> {
        if self.given > self.max {
            return Err(ValidationError::TooMany {
                param: self.param,
                max: self.max as usize,
                given: self.given as usize,
            });
        }
        Ok(self.given)
    }
}

/// A random 64-bit number (seeds, ids) from the standard library's per-process random keys.
pub(crate) fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    h.finish()
}
