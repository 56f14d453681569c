//! Why a request is invalid: [`ValidationError`], whose messages name the field and the bound.

use tessera_params::{MAX_TOP_N_LOGPROBS, SamplingError};

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
    /// An output constraint (pattern, schema, grammar) is malformed or cannot be compiled.
    #[error("`{param}`: {message}")]
    Constraint {
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
    /// The route needs the server to run another task (`--task`).
    #[error(
        "this server runs the `{running}` task; {route} needs a server started with `--task {needed}` on a model that supports it"
    )]
    Task {
        /// The route asked.
        route: &'static str,
        /// The task it needs.
        needed: &'static str,
        /// The task the server runs.
        running: &'static str,
    },
    /// The tokenizer failed.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// A validation step failed for a reason of the server's, not of the request (its worker
    /// thread panicked); answered as an internal server error, the detail only logged.
    #[error("validation failed unexpectedly: {0}")]
    Internal(String),
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
            | ValidationError::Constraint { param, .. } => Some(param),
            ValidationError::EmptyStopSequence => Some("stop"),
            ValidationError::Message { .. }
            | ValidationError::NoChatTemplate
            | ValidationError::ChatTemplate(_) => Some("messages"),
            ValidationError::Tokenizer(_)
            | ValidationError::Internal(_)
            | ValidationError::Task { .. } => None,
        }
    }

    /// `param` is outside `bound` (in words); `given` is the value as the client sent it.
    pub(crate) fn out_of_range(
        param: &'static str,
        bound: &'static str,
        given: impl ToString,
    ) -> Self {
        ValidationError::OutOfRange {
            param,
            bound,
            given: given.to_string(),
        }
    }
}

impl From<SamplingError> for ValidationError {
    fn from(e: SamplingError) -> Self {
        match e {
            SamplingError::OutOfRange {
                field,
                bound,
                value,
            } => ValidationError::out_of_range(field, bound, value),
            SamplingError::LogitBiasToken { token, vocab_size } => ValidationError::TokenId {
                param: "logit_bias",
                token: token.to_string(),
                vocab_size,
            },
            SamplingError::TopNTokens(given) => ValidationError::TooMany {
                param: "top_n_tokens",
                max: MAX_TOP_N_LOGPROBS as usize,
                given: given as usize,
            },
            other => ValidationError::Internal(other.to_string()),
        }
    }
}
