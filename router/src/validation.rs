//! Request validation: tokenization, limits and parameter ranges, before anything is queued.
//!
//! Both APIs translate their requests into a [`GenerateInput`] (API-neutral, unvalidated);
//! [`Validation::validate`] turns it into a [`ValidGenerateRequest`] or a
//! [`ValidationError`] whose message names the field and the bound.

use std::sync::Arc;

use tessera_formats::{ChatMessage, ModelTokenizer};

use crate::infer::ValidGenerateRequest;
use tessera_params::{OutputConstraint, SamplingParams, StoppingParams};

/// Limits requests are checked against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidationConfig {
    /// Longest prompt, in tokens.
    pub max_input_tokens: usize,
    /// Longest prompt + generation, in tokens.
    pub max_total_tokens: usize,
    /// Most stop sequences per request.
    pub max_stop_sequences: usize,
    /// Most alternatives reported per token (`top_n_tokens`, `top_logprobs`).
    pub max_top_n_tokens: u32,
    /// Most samples per request (OpenAI `n`, native `best_of`).
    pub max_best_of: usize,
    /// `max_new_tokens` when the request gives none, if lower than what the context allows.
    pub default_max_new_tokens: Option<u32>,
}

impl Default for ValidationConfig {
    fn default() -> Self {
        Self {
            max_input_tokens: 4095,
            max_total_tokens: 4096,
            max_stop_sequences: 4,
            max_top_n_tokens: 20,
            max_best_of: 8,
            default_max_new_tokens: None,
        }
    }
}

/// The prompt of a request.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    /// Text to tokenize.
    Text {
        /// The text.
        text: String,
        /// Whether the tokenizer adds the model's special tokens (BOS). Chat prompts come
        /// from the template, which writes them itself.
        add_special_tokens: bool,
    },
    /// Token ids given by the client.
    Ids(Vec<u32>),
}

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
            decoder_input_details: false,
            skip_special_tokens: true,
            constraint: None,
        }
    }
}

/// An unvalidated generation request.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerateInput {
    /// The prompt.
    pub prompt: Prompt,
    /// Its parameters.
    pub parameters: RequestParameters,
    /// Keep only the last `truncate` prompt tokens.
    pub truncate: Option<usize>,
}

/// Why a request is invalid. Messages name the field and the bound.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ValidationError {
    /// The prompt is empty.
    #[error("`{0}` cannot be empty")]
    EmptyInput(&'static str),
    /// The prompt has too many tokens.
    #[error("`inputs` must have at most {max} tokens. Given: {given}")]
    InputLength {
        /// `max_input_tokens`.
        max: usize,
        /// The prompt's length.
        given: usize,
    },
    /// Prompt + `max_new_tokens` exceed the context.
    #[error(
        "`inputs` tokens + `max_new_tokens` must be <= {max}. Given: {input} `inputs` tokens and {new} `max_new_tokens`"
    )]
    MaxTotalTokens {
        /// `max_total_tokens`.
        max: usize,
        /// The prompt's length.
        input: usize,
        /// The requested `max_new_tokens`.
        new: u32,
    },
    /// A numeric parameter is out of its range.
    #[error("`{param}` must be {bound}. Given: {given}")]
    OutOfRange {
        /// The parameter.
        param: &'static str,
        /// Its range, in words.
        bound: &'static str,
        /// The given value.
        given: String,
    },
    /// A count exceeds its limit.
    #[error("`{param}` must be <= {max}. Given: {given}")]
    TooMany {
        /// The parameter.
        param: &'static str,
        /// The limit.
        max: usize,
        /// The given count.
        given: usize,
    },
    /// A stop sequence is the empty string.
    #[error("`stop` sequences cannot be empty strings")]
    EmptyStopSequence,
    /// A token id is not in the vocabulary.
    #[error("`{param}` token id {token} is not in the vocabulary (size {vocab_size})")]
    TokenId {
        /// The parameter.
        param: &'static str,
        /// The id as given.
        token: String,
        /// The vocabulary size.
        vocab_size: usize,
    },
    /// A parameter is recognised but not supported.
    #[error("`{param}` is not supported: {reason}")]
    Unsupported {
        /// The parameter.
        param: &'static str,
        /// Why, or what to use instead.
        reason: &'static str,
    },
    /// An output pattern cannot be compiled.
    #[error("`{param}`: {message}")]
    Pattern {
        /// The parameter.
        param: &'static str,
        /// Why.
        message: String,
    },
    /// A chat message is malformed.
    #[error("`messages[{index}]`: {message}")]
    Message {
        /// The message's index.
        index: usize,
        /// What is wrong.
        message: String,
    },
    /// The model has no chat template.
    #[error("this model has no chat template; use /v1/completions or /generate")]
    NoChatTemplate,
    /// The chat template rejected the conversation.
    #[error("chat template: {0}")]
    ChatTemplate(String),
    /// The tokenizer failed.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
}

impl ValidationError {
    /// The request field at fault, for OpenAI's `param`.
    pub fn param(&self) -> Option<&'static str> {
        match self {
            ValidationError::EmptyInput(p) => Some(p),
            ValidationError::InputLength { .. } => Some("inputs"),
            ValidationError::MaxTotalTokens { .. } => Some("max_tokens"),
            ValidationError::OutOfRange { param, .. }
            | ValidationError::TooMany { param, .. }
            | ValidationError::TokenId { param, .. }
            | ValidationError::Unsupported { param, .. }
            | ValidationError::Pattern { param, .. } => Some(param),
            ValidationError::EmptyStopSequence => Some("stop"),
            ValidationError::Message { .. }
            | ValidationError::NoChatTemplate
            | ValidationError::ChatTemplate(_) => Some("messages"),
            ValidationError::Tokenizer(_) => None,
        }
    }
}

fn out_of_range(param: &'static str, bound: &'static str, given: impl ToString) -> ValidationError {
    ValidationError::OutOfRange {
        param,
        bound,
        given: given.to_string(),
    }
}

/// Checks `value` (when given) against `ok`; `bound` describes the range.
fn check_f32(
    param: &'static str,
    value: Option<f32>,
    bound: &'static str,
    ok: impl Fn(f32) -> bool,
) -> Result<(), ValidationError> {
    match value {
        Some(v) if !(v.is_finite() && ok(v)) => Err(out_of_range(param, bound, v)),
        _ => Ok(()),
    }
}

/// Validates requests against a [`ValidationConfig`] and the model's tokenizer.
#[derive(Debug, Clone)]
pub struct Validation {
    config: ValidationConfig,
    tokenizer: Arc<ModelTokenizer>,
}

impl Validation {
    /// A validator for this model.
    pub fn new(config: ValidationConfig, tokenizer: Arc<ModelTokenizer>) -> Self {
        Self { config, tokenizer }
    }

    /// The limits.
    pub fn config(&self) -> &ValidationConfig {
        &self.config
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Arc<ModelTokenizer> {
        &self.tokenizer
    }

    /// Renders a conversation with the model's chat template (generation prompt added).
    pub fn apply_chat_template(&self, messages: &[ChatMessage]) -> Result<String, ValidationError> {
        if messages.is_empty() {
            return Err(ValidationError::EmptyInput("messages"));
        }
        let template = self
            .tokenizer
            .chat_template
            .as_ref()
            .ok_or(ValidationError::NoChatTemplate)?;
        template
            .render(messages, true)
            .map_err(|e| ValidationError::ChatTemplate(e.to_string()))
    }

    /// Tokenizes (off the async runtime) and validates a request.
    pub async fn validate(
        &self,
        input: GenerateInput,
    ) -> Result<ValidGenerateRequest, ValidationError> {
        let (inputs, input_ids) = match input.prompt {
            Prompt::Text {
                text,
                add_special_tokens,
            } => {
                if text.is_empty() {
                    return Err(ValidationError::EmptyInput("inputs"));
                }
                let tokenizer = self.tokenizer.clone();
                tokio::task::spawn_blocking(move || {
                    let ids = tokenizer
                        .encode(&text, add_special_tokens)
                        .map_err(|e| ValidationError::Tokenizer(e.to_string()))?;
                    Ok::<_, ValidationError>((text, ids))
                })
                .await
                .map_err(|e| ValidationError::Tokenizer(e.to_string()))??
            }
            Prompt::Ids(ids) => {
                self.check_ids("prompt", &ids)?;
                let text = self
                    .tokenizer
                    .decode(&ids, false)
                    .map_err(|e| ValidationError::Tokenizer(e.to_string()))?;
                (text, ids)
            }
        };
        self.validate_tokenized(inputs, input_ids, input.parameters, input.truncate)
    }

    fn check_ids(&self, param: &'static str, ids: &[u32]) -> Result<(), ValidationError> {
        let vocab_size = self.tokenizer.vocab_size();
        match ids.iter().find(|&&id| id as usize >= vocab_size) {
            Some(id) => Err(ValidationError::TokenId {
                param,
                token: id.to_string(),
                vocab_size,
            }),
            None => Ok(()),
        }
    }

    /// Validates an already tokenized request (all rules but tokenization).
    pub fn validate_tokenized(
        &self,
        inputs: String,
        mut input_ids: Vec<u32>,
        parameters: RequestParameters,
        truncate: Option<usize>,
    ) -> Result<ValidGenerateRequest, ValidationError> {
        let cfg = &self.config;
        if let Some(t) = truncate {
            if t == 0 || t > cfg.max_input_tokens {
                return Err(out_of_range("truncate", "in [1, max_input_tokens]", t));
            }
            let drop = input_ids.len().saturating_sub(t);
            input_ids.drain(..drop);
        }
        if input_ids.is_empty() {
            return Err(ValidationError::EmptyInput("inputs"));
        }
        let input = input_ids.len();
        if input > cfg.max_input_tokens {
            return Err(ValidationError::InputLength {
                max: cfg.max_input_tokens,
                given: input,
            });
        }
        let stopping = self.validate_stopping(&parameters, input)?;
        let decoder_input_details = parameters.decoder_input_details;
        let skip_special_tokens = parameters.skip_special_tokens;
        let constraint = parameters.constraint.clone();
        Ok(ValidGenerateRequest {
            inputs,
            input_ids,
            parameters: self.validate_parameters(parameters)?,
            stopping,
            constraint,
            decoder_input_details,
            skip_special_tokens,
        })
    }

    fn validate_stopping(
        &self,
        p: &RequestParameters,
        input: usize,
    ) -> Result<StoppingParams, ValidationError> {
        let cfg = &self.config;
        let room = u32::try_from(cfg.max_total_tokens.saturating_sub(input)).unwrap_or(u32::MAX);
        let max_new_tokens = match p.max_new_tokens {
            Some(0) => return Err(out_of_range("max_new_tokens", "strictly positive", 0)),
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
        Ok(StoppingParams {
            max_new_tokens,
            stop_sequences: p.stop.clone(),
            ignore_eos: p.ignore_eos,
        })
    }

    fn validate_parameters(&self, p: RequestParameters) -> Result<SamplingParams, ValidationError> {
        check_f32("temperature", p.temperature, ">= 0", |t| t >= 0.0)?;
        check_f32("top_p", p.top_p, "in (0, 1]", |v| v > 0.0 && v <= 1.0)?;
        check_f32("typical_p", p.typical_p, "in (0, 1]", |v| {
            v > 0.0 && v <= 1.0
        })?;
        check_f32("min_p", p.min_p, "in [0, 1]", |v| (0.0..=1.0).contains(&v))?;
        check_f32(
            "repetition_penalty",
            p.repetition_penalty,
            "strictly positive",
            |v| v > 0.0,
        )?;
        let penalty = |v: f32| (-2.0..=2.0).contains(&v);
        check_f32(
            "frequency_penalty",
            p.frequency_penalty,
            "in [-2, 2]",
            penalty,
        )?;
        check_f32(
            "presence_penalty",
            p.presence_penalty,
            "in [-2, 2]",
            penalty,
        )?;
        let top_k = match p.top_k {
            None => 0,
            Some(k) => u32::try_from(k)
                .ok()
                .filter(|&k| k > 0)
                .ok_or_else(|| out_of_range("top_k", "strictly positive", k))?,
        };
        let top_n_tokens = p.top_n_tokens.unwrap_or(0);
        if top_n_tokens > self.config.max_top_n_tokens {
            return Err(ValidationError::TooMany {
                param: "top_n_tokens",
                max: self.config.max_top_n_tokens as usize,
                given: top_n_tokens as usize,
            });
        }
        let logit_bias = self.validate_logit_bias(&p.logit_bias)?;
        let temperature = if p.do_sample {
            p.temperature.unwrap_or(1.0)
        } else {
            0.0
        };
        let seed = match p.seed {
            Some(seed) => Some(seed),
            None if temperature > 0.0 => Some(random_u64()),
            None => None,
        };
        Ok(SamplingParams {
            temperature,
            top_k,
            top_p: p.top_p.unwrap_or(1.0),
            typical_p: p.typical_p.unwrap_or(1.0),
            min_p: p.min_p.unwrap_or(0.0),
            repetition_penalty: p.repetition_penalty.unwrap_or(1.0),
            frequency_penalty: p.frequency_penalty.unwrap_or(0.0),
            presence_penalty: p.presence_penalty.unwrap_or(0.0),
            logit_bias,
            seed,
            top_n_tokens,
        })
    }

    fn validate_logit_bias(
        &self,
        bias: &[(String, f32)],
    ) -> Result<Vec<(u32, f32)>, ValidationError> {
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
                check_f32("logit_bias", Some(*b), "in [-100, 100]", |v| {
                    (-100.0..=100.0).contains(&v)
                })?;
                Ok((id, *b))
            })
            .collect()
    }

    /// Checks the number of samples (`n`, `best_of`) against `max_best_of`.
    pub fn validate_n(&self, param: &'static str, n: usize) -> Result<(), ValidationError> {
        if n == 0 {
            return Err(out_of_range(param, "strictly positive", 0));
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

/// OpenAI's bounds that are narrower than the engine's.
pub(crate) fn validate_openai_sampling(
    temperature: Option<f32>,
    top_logprobs: Option<(&'static str, u32, u32)>,
) -> Result<(), ValidationError> {
    check_f32("temperature", temperature, "in [0, 2]", |t| {
        (0.0..=2.0).contains(&t)
    })?;
    if let Some((param, given, max)) = top_logprobs
        && given > max
    {
        return Err(ValidationError::TooMany {
            param,
            max: max as usize,
            given: given as usize,
        });
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::detokenizer::tests::byte_level;

    fn validation() -> Validation {
        Validation::new(
            ValidationConfig {
                max_input_tokens: 10,
                max_total_tokens: 16,
                max_stop_sequences: 2,
                max_top_n_tokens: 5,
                max_best_of: 3,
                default_max_new_tokens: None,
            },
            byte_level(),
        )
    }

    fn validate(params: RequestParameters) -> Result<ValidGenerateRequest, ValidationError> {
        validation().validate_tokenized("abc".into(), vec![1, 2, 3], params, None)
    }

    fn err(params: RequestParameters) -> String {
        validate(params).unwrap_err().to_string()
    }

    #[tokio::test]
    async fn tokenizes_with_and_without_special_tokens() {
        let v = validation();
        let text = |add_special_tokens| GenerateInput {
            prompt: Prompt::Text {
                text: "hello".into(),
                add_special_tokens,
            },
            parameters: RequestParameters::default(),
            truncate: None,
        };
        let r = v.validate(text(true)).await.unwrap();
        assert_eq!(r.input_ids, vec![261, 259]);
        assert_eq!(r.inputs, "hello");
        assert_eq!(r.stopping.max_new_tokens, 14);
        let r = v.validate(text(false)).await.unwrap();
        assert_eq!(r.input_ids, vec![259]);
        let ids = GenerateInput {
            prompt: Prompt::Ids(vec![259]),
            ..text(true)
        };
        assert_eq!(v.validate(ids).await.unwrap().inputs, "hello");
    }

    #[tokio::test]
    async fn empty_and_out_of_vocabulary_prompts() {
        let v = validation();
        let input = |prompt| GenerateInput {
            prompt,
            parameters: RequestParameters::default(),
            truncate: None,
        };
        let e = v
            .validate(input(Prompt::Text {
                text: String::new(),
                add_special_tokens: true,
            }))
            .await
            .unwrap_err();
        assert_eq!(e.to_string(), "`inputs` cannot be empty");
        let e = v.validate(input(Prompt::Ids(vec![]))).await.unwrap_err();
        assert_eq!(e, ValidationError::EmptyInput("inputs"));
        let e = v
            .validate(input(Prompt::Ids(vec![9999])))
            .await
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "`prompt` token id 9999 is not in the vocabulary (size 263)"
        );
    }

    #[test]
    fn input_length_and_total_tokens() {
        let v = validation();
        let p = RequestParameters::default;
        let e = v
            .validate_tokenized("x".into(), vec![1; 11], p(), None)
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "`inputs` must have at most 10 tokens. Given: 11"
        );
        // Truncation keeps the last tokens.
        let r = v
            .validate_tokenized("x".into(), (0..11).collect(), p(), Some(4))
            .unwrap();
        assert_eq!(r.input_ids, vec![7, 8, 9, 10]);
        let e = v
            .validate_tokenized("x".into(), vec![1], p(), Some(11))
            .unwrap_err();
        assert_eq!(e.param(), Some("truncate"));
        let e = err(RequestParameters {
            max_new_tokens: Some(14),
            ..p()
        });
        assert_eq!(
            e,
            "`inputs` tokens + `max_new_tokens` must be <= 16. Given: 3 `inputs` tokens and 14 `max_new_tokens`"
        );
        let e = err(RequestParameters {
            max_new_tokens: Some(0),
            ..p()
        });
        assert_eq!(e, "`max_new_tokens` must be strictly positive. Given: 0");
        let r = validate(RequestParameters {
            max_new_tokens: Some(13),
            ..p()
        })
        .unwrap();
        assert_eq!(r.stopping.max_new_tokens, 13);
        // Default: what the context allows, capped by the configured default.
        assert_eq!(validate(p()).unwrap().stopping.max_new_tokens, 13);
        let mut v = validation();
        v.config.default_max_new_tokens = Some(5);
        let r = v
            .validate_tokenized("x".into(), vec![1], p(), None)
            .unwrap();
        assert_eq!(r.stopping.max_new_tokens, 5);
    }

    #[test]
    fn parameter_ranges() {
        let p = RequestParameters::default;
        let cases: Vec<(RequestParameters, &str)> = vec![
            (
                RequestParameters {
                    temperature: Some(-0.1),
                    ..p()
                },
                "`temperature` must be >= 0. Given: -0.1",
            ),
            (
                RequestParameters {
                    temperature: Some(f32::NAN),
                    ..p()
                },
                "`temperature` must be >= 0. Given: NaN",
            ),
            (
                RequestParameters {
                    top_p: Some(0.0),
                    ..p()
                },
                "`top_p` must be in (0, 1]. Given: 0",
            ),
            (
                RequestParameters {
                    top_p: Some(1.5),
                    ..p()
                },
                "`top_p` must be in (0, 1]. Given: 1.5",
            ),
            (
                RequestParameters {
                    typical_p: Some(0.0),
                    ..p()
                },
                "`typical_p` must be in (0, 1]. Given: 0",
            ),
            (
                RequestParameters {
                    min_p: Some(1.1),
                    ..p()
                },
                "`min_p` must be in [0, 1]. Given: 1.1",
            ),
            (
                RequestParameters {
                    top_k: Some(0),
                    ..p()
                },
                "`top_k` must be strictly positive. Given: 0",
            ),
            (
                RequestParameters {
                    top_k: Some(-3),
                    ..p()
                },
                "`top_k` must be strictly positive. Given: -3",
            ),
            (
                RequestParameters {
                    repetition_penalty: Some(0.0),
                    ..p()
                },
                "`repetition_penalty` must be strictly positive. Given: 0",
            ),
            (
                RequestParameters {
                    frequency_penalty: Some(2.5),
                    ..p()
                },
                "`frequency_penalty` must be in [-2, 2]. Given: 2.5",
            ),
            (
                RequestParameters {
                    presence_penalty: Some(-2.5),
                    ..p()
                },
                "`presence_penalty` must be in [-2, 2]. Given: -2.5",
            ),
            (
                RequestParameters {
                    top_n_tokens: Some(6),
                    ..p()
                },
                "`top_n_tokens` must be <= 5. Given: 6",
            ),
            (
                RequestParameters {
                    stop: vec!["a".into(), "b".into(), "c".into()],
                    ..p()
                },
                "`stop` must be <= 2. Given: 3",
            ),
            (
                RequestParameters {
                    stop: vec![String::new()],
                    ..p()
                },
                "`stop` sequences cannot be empty strings",
            ),
            (
                RequestParameters {
                    logit_bias: vec![("263".into(), 1.0)],
                    ..p()
                },
                "`logit_bias` token id 263 is not in the vocabulary (size 263)",
            ),
            (
                RequestParameters {
                    logit_bias: vec![("abc".into(), 1.0)],
                    ..p()
                },
                "`logit_bias` token id abc is not in the vocabulary (size 263)",
            ),
            (
                RequestParameters {
                    logit_bias: vec![("5".into(), 101.0)],
                    ..p()
                },
                "`logit_bias` must be in [-100, 100]. Given: 101",
            ),
        ];
        for (params, message) in cases {
            assert_eq!(err(params), message);
        }
    }

    #[test]
    fn valid_parameters_and_sampling() {
        let r = validate(RequestParameters::default()).unwrap();
        assert_eq!(r.parameters, SamplingParams::default());
        assert!(r.skip_special_tokens);
        let r = validate(RequestParameters {
            do_sample: true,
            top_k: Some(5),
            top_p: Some(1.0),
            min_p: Some(0.1),
            logit_bias: vec![("7".into(), -100.0)],
            stop: vec!["x".into(), "y".into()],
            top_n_tokens: Some(5),
            ..RequestParameters::default()
        })
        .unwrap();
        assert_eq!(r.parameters.temperature, 1.0);
        assert_eq!(r.parameters.top_k, 5);
        assert_eq!(r.parameters.logit_bias, vec![(7, -100.0)]);
        assert_eq!(r.parameters.top_n_tokens, 5);
        assert!(r.parameters.seed.is_some(), "sampling gets a seed");
        assert_eq!(r.stopping.stop_sequences, ["x", "y"]);
        let r = validate(RequestParameters {
            do_sample: true,
            temperature: Some(0.0),
            seed: Some(3),
            ..RequestParameters::default()
        })
        .unwrap();
        assert_eq!(r.parameters.temperature, 0.0);
        assert_eq!(r.parameters.seed, Some(3));
    }

    #[test]
    fn n_and_openai_bounds() {
        let v = validation();
        assert!(v.validate_n("n", 3).is_ok());
        assert_eq!(
            v.validate_n("n", 4).unwrap_err().to_string(),
            "`n` must be <= 3. Given: 4"
        );
        assert_eq!(
            v.validate_n("n", 0).unwrap_err().to_string(),
            "`n` must be strictly positive. Given: 0"
        );
        assert_eq!(
            validate_openai_sampling(Some(2.1), None)
                .unwrap_err()
                .to_string(),
            "`temperature` must be in [0, 2]. Given: 2.1"
        );
        assert_eq!(
            validate_openai_sampling(None, Some(("top_logprobs", 21, 20)))
                .unwrap_err()
                .to_string(),
            "`top_logprobs` must be <= 20. Given: 21"
        );
        assert!(validate_openai_sampling(Some(0.0), Some(("logprobs", 5, 5))).is_ok());
    }

    #[test]
    fn chat_template_errors() {
        let v = validation();
        assert_eq!(
            v.apply_chat_template(&[]).unwrap_err(),
            ValidationError::EmptyInput("messages")
        );
        assert_eq!(
            v.apply_chat_template(&[ChatMessage::new("user", "hi")])
                .unwrap_err(),
            ValidationError::NoChatTemplate
        );
    }

    #[test]
    fn random_numbers_differ() {
        assert_ne!(random_u64(), random_u64());
    }
}
