//! Request validation: each API's request, checked once, into the requests to run.
//!
//! A handler makes one call: [`Validation::validate_chat`], [`Validation::validate_completion`]
//! or [`Validation::validate_generate`], which apply the API's own rules (constrained output,
//! tools, messages, logprobs, `n`), render the chat template, translate the request into an
//! API-neutral [`GenerateInput`] and hand it to [`Validation::validate`]: tokenization, limits
//! and parameter ranges into a [`ValidGenerateRequest`]. Every failure is a
//! [`ValidationError`] whose message names the field and the bound. The slow steps (templates,
//! tokenization, compiling output patterns) run off the async runtime.

mod chat;
mod constraint;
mod errors;
mod native;
mod openai;
mod parameters;
mod prompt;
mod structured;
mod tools;
mod validated;

use std::sync::Arc;

use tessera_text::ModelTokenizer;

use crate::assistant::{ReasoningFormat, ToolCallFormat};

pub use self::errors::ValidationError;
pub use self::parameters::RequestParameters;
pub(crate) use self::parameters::random_u64;
pub use self::prompt::Prompt;
pub use self::validated::ValidGenerateRequest;
pub(crate) use self::validated::{
    ChoiceLayout, OpenAiReply, ValidChatRequest, ValidCompletionRequest, ValidNativeRequest,
};

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
    /// How the model writes tool calls (`--tool-call-parser`); detected from the chat
    /// template when unset.
    pub tool_call_format: Option<ToolCallFormat>,
    /// How the model marks its reasoning (`--reasoning-parser`); none read when unset.
    pub reasoning: Option<ReasoningFormat>,
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
            tool_call_format: None,
            reasoning: None,
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

/// Validates requests against a [`ValidationConfig`] and the model's tokenizer.
#[derive(Debug, Clone)]
pub struct Validation {
    config: ValidationConfig,
    tokenizer: Arc<ModelTokenizer>,
    grammars: constraint::Grammars,
}

impl Validation {
    /// A validator for this model.
    pub fn new(config: ValidationConfig, tokenizer: Arc<ModelTokenizer>) -> Self {
        Self {
            config,
            tokenizer,
            grammars: constraint::Grammars::default(),
        }
    }

    /// Builds the grammar compiler of the vocabulary now, so that the first grammar request
    /// does not wait for it.
    pub fn warm_grammars(&self) {
        if let Err(e) = self.grammars.get(&self.tokenizer) {
            tracing::warn!("{e}: grammar-constrained requests will be refused");
        }
    }

    /// The limits.
    pub fn config(&self) -> &ValidationConfig {
        &self.config
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Arc<ModelTokenizer> {
        &self.tokenizer
    }

    /// Tokenizes (off the async runtime) and validates a request.
    pub async fn validate(
        &self,
        input: GenerateInput,
    ) -> Result<ValidGenerateRequest, ValidationError> {
        let prompt = self.tokenize(input.prompt).await?;
        self.validate_tokenized(prompt.text, prompt.ids, input.parameters, input.truncate)
    }

    /// Validates an already tokenized request (all rules but tokenization).
    pub fn validate_tokenized(
        &self,
        inputs: String,
        mut input_ids: Vec<u32>,
        parameters: RequestParameters,
        truncate: Option<usize>,
    ) -> Result<ValidGenerateRequest, ValidationError> {
        self.check_prompt_length(&mut input_ids, truncate)?;
        let stopping = self.validate_stopping(&parameters, input_ids.len())?;
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
            pooling: None,
        })
    }
}

#[cfg(test)]
mod tests;
