//! The OpenAI requests' rules: completions requests into the samples to run, and the fields
//! chat and completions share (`chat.rs` has the chat rules).
//!
//! Checks run in a fixed order (the first failure is the one reported): constrained output,
//! then `best_of` and `suffix`, logprobs, `n`, the prompts, the sampling fields, and last the
//! engine's rules on each tokenized prompt.

use super::constraint::check_constraint;
use super::parameters::{TopLogprobs, check_openai_temperature};
use super::{
    ChoiceLayout, GenerateInput, OpenAiReply, Prompt, RequestParameters, ValidCompletionRequest,
    Validation, ValidationError,
};
use crate::openai::{CompletionRequest, PromptInput, SamplingFields, StopSpec};

/// Most `logprobs` of a completions request.
const MAX_COMPLETION_LOGPROBS: u32 = 5;

/// `max_tokens` of a completions request that gives none (as OpenAI).
const DEFAULT_COMPLETION_MAX_TOKENS: u32 = 16;

impl Validation {
    /// Validates a completions request into `n` samples per prompt: `best_of`, `suffix`,
    /// constrained output (a pattern compiled off the async runtime), logprobs, `n`, the
    /// prompts and their count, the sampling fields, then each prompt.
    pub(crate) async fn validate_completion(
        &self,
        req: &CompletionRequest,
    ) -> Result<ValidCompletionRequest, ValidationError> {
        check_completion_extras(req)?;
        let (param, constraint) = req.constraints.constrained()?;
        check_constraint(param, constraint.as_ref(), &self.grammars, &self.tokenizer).await?;
        let top = TopLogprobs {
            param: "logprobs",
            given: req.logprobs.unwrap_or(0),
            max: MAX_COMPLETION_LOGPROBS,
        }
        .check()?;
        let n = req.sampling.n.unwrap_or(1);
        self.validate_n("n", n)?;
        let echo = req.echo.unwrap_or(false);
        let prompts = completion_prompts(&req.prompt)?;
        let best_of = req.best_of.unwrap_or(n);
        if best_of < n {
            return Err(ValidationError::OutOfRange {
                param: "best_of",
                bound: "at least `n`",
                given: best_of.to_string(),
            });
        }
        let choices = prompts.len() * best_of;
        self.validate_n("n", choices)
            .map_err(|_| ValidationError::TooMany {
                param: "prompt",
                max: self.config.max_best_of,
                given: choices,
            })?;
        let parameters = RequestParameters {
            max_new_tokens: Some(req.max_tokens.unwrap_or(DEFAULT_COMPLETION_MAX_TOKENS)),
            top_n_tokens: Some(top),
            decoder_input_details: echo && req.logprobs.is_some(),
            constraint,
            ..req.sampling.parameters()?
        };
        let mut samples = Vec::with_capacity(choices);
        let mut layout = ChoiceLayout {
            echoes: Vec::with_capacity(prompts.len()),
            n,
            best_of,
            prompt_tokens: 0,
        };
        for prompt in prompts {
            let input = GenerateInput {
                prompt,
                parameters: parameters.clone(),
                truncate: None,
            };
            let valid = self.validate(input).await?;
            layout.prompt_tokens += valid.input_ids.len() as u32;
            layout.echoes.push(if echo {
                valid.inputs.clone()
            } else {
                String::new()
            });
            samples.extend(valid.samples(best_of, req.sampling.seed));
        }
        Ok(ValidCompletionRequest {
            samples,
            choices: layout,
            reply: OpenAiReply {
                stream: req.sampling.stream.unwrap_or(false),
                logprobs: req.logprobs.is_some(),
                include_usage: req.sampling.include_usage(),
            },
        })
    }
}

/// `best_of > 1` and `suffix` are refused.
fn check_completion_extras(req: &CompletionRequest) -> Result<(), ValidationError> {
    if req.best_of.is_some_and(|b| b > 1) && req.sampling.stream == Some(true) {
        return Err(ValidationError::Unsupported {
            param: "best_of",
            reason: "cannot be streamed (the best samples are known only at the end)",
        });
    }
    if req.suffix.as_ref().is_some_and(|s| !s.is_empty()) {
        return Err(ValidationError::Unsupported {
            param: "suffix",
            reason: "insertion is not implemented",
        });
    }
    Ok(())
}

/// The prompts of a completions request, at least one.
fn completion_prompts(prompt: &PromptInput) -> Result<Vec<Prompt>, ValidationError> {
    let text = |text: &String| Prompt::Text {
        text: text.clone(),
        add_special_tokens: true,
    };
    let prompts: Vec<Prompt> = match prompt {
        PromptInput::Text(t) => vec![text(t)],
        PromptInput::Texts(v) => v.iter().map(text).collect(),
        PromptInput::Ids(ids) => vec![Prompt::Ids(ids.clone())],
        PromptInput::IdLists(v) => v.iter().cloned().map(Prompt::Ids).collect(),
    };
    if prompts.is_empty() {
        return Err(ValidationError::EmptyInput("prompt"));
    }
    Ok(prompts)
}

impl SamplingFields {
    /// The fields as engine parameters (OpenAI samples by default), once `temperature` is
    /// within OpenAI's range; the endpoint sets the length, logprobs and constraint fields.
    pub(super) fn parameters(&self) -> Result<RequestParameters, ValidationError> {
        check_openai_temperature(self.temperature)?;
        let stop = match &self.stop {
            None => Vec::new(),
            Some(StopSpec::One(s)) => vec![s.clone()],
            Some(StopSpec::Many(v)) => v.clone(),
        };
        Ok(RequestParameters {
            do_sample: true,
            temperature: self.temperature,
            top_k: self.top_k.filter(|&k| k != -1),
            top_p: self.top_p,
            typical_p: None,
            min_p: self.min_p,
            repetition_penalty: self.repetition_penalty,
            frequency_penalty: self.frequency_penalty,
            presence_penalty: self.presence_penalty,
            logit_bias: self
                .logit_bias
                .iter()
                .flatten()
                .map(|(k, v)| (k.clone(), *v))
                .collect(),
            seed: self.seed,
            top_n_tokens: None,
            max_new_tokens: None,
            stop,
            ignore_eos: self.ignore_eos.unwrap_or(false),
            stop_token_ids: self.stop_token_ids.clone().unwrap_or_default(),
            decoder_input_details: false,
            skip_special_tokens: self.skip_special_tokens.unwrap_or(true),
            constraint: None,
        })
    }

    pub(super) fn include_usage(&self) -> bool {
        self.stream_options
            .as_ref()
            .and_then(|o| o.include_usage)
            .unwrap_or(false)
    }
}
