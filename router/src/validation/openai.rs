//! The OpenAI requests' rules: chat and completions requests into the samples to run.
//!
//! Checks run in a fixed order (the first failure is the one reported): constrained output,
//! then tools and messages (chat) or `best_of` and `suffix` (completions), logprobs, `n`,
//! the prompt, the sampling fields, and last the engine's rules on each tokenized prompt.

use tessera_formats::ChatMessage;

use super::constraint::check_constraint;
use super::parameters::{TopLogprobs, check_openai_temperature};
use super::{
    ChoiceLayout, GenerateInput, OpenAiReply, Prompt, RequestParameters, ValidChatRequest,
    ValidCompletionRequest, Validation, ValidationError,
};
use crate::openai::{
    ChatCompletionRequest, CompletionRequest, MessageContent, PromptInput, RequestMessage,
    SamplingFields, StopSpec,
};

/// Most `top_logprobs` of a chat request.
const MAX_CHAT_TOP_LOGPROBS: u32 = 20;

/// Most `logprobs` of a completions request.
const MAX_COMPLETION_LOGPROBS: u32 = 5;

/// `max_tokens` of a completions request that gives none (as OpenAI).
const DEFAULT_COMPLETION_MAX_TOKENS: u32 = 16;

impl Validation {
    /// Validates a chat request into its `n` samples: constrained output (a pattern compiled
    /// off the async runtime), tools, messages, logprobs, `n`, the conversation rendered with
    /// the chat template, then the sampling fields and the rendered prompt.
    pub(crate) async fn validate_chat(
        &self,
        req: &ChatCompletionRequest,
    ) -> Result<ValidChatRequest, ValidationError> {
        let (param, constraint) = req.constraints.constrained()?;
        check_constraint(param, constraint.as_ref(), &self.grammars, &self.tokenizer).await?;
        for tools in ToolRequest::of(req) {
            tools.check()?;
        }
        let messages = chat_messages(&req.messages)?;
        let top = TopLogprobs {
            param: "top_logprobs",
            given: req.top_logprobs.unwrap_or(0),
            max: MAX_CHAT_TOP_LOGPROBS,
        }
        .check()?;
        let logprobs = req.logprobs.unwrap_or(false);
        let n = req.sampling.n.unwrap_or(1);
        self.validate_n("n", n)?;
        let text = self.render_chat(messages).await?;
        let parameters = RequestParameters {
            max_new_tokens: req.max_completion_tokens.or(req.max_tokens),
            top_n_tokens: Some(if logprobs { top } else { 0 }),
            constraint,
            ..req.sampling.parameters()?
        };
        let input = GenerateInput {
            prompt: Prompt::Text {
                text,
                add_special_tokens: false,
            },
            parameters,
            truncate: None,
        };
        let valid = self.validate(input).await?;
        Ok(ValidChatRequest {
            prompt_tokens: valid.input_ids.len() as u32,
            samples: valid.samples(n, req.sampling.seed),
            reply: OpenAiReply {
                stream: req.sampling.stream.unwrap_or(false),
                logprobs,
                include_usage: req.sampling.include_usage(),
            },
        })
    }

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
        let choices = prompts.len() * n;
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
            samples.extend(valid.samples(n, req.sampling.seed));
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
    if req.best_of.is_some_and(|b| b > 1) {
        return Err(ValidationError::Unsupported {
            param: "best_of",
            reason: "only 1 is supported; use `n`",
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
    fn parameters(&self) -> Result<RequestParameters, ValidationError> {
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
            decoder_input_details: false,
            skip_special_tokens: self.skip_special_tokens.unwrap_or(true),
            constraint: None,
        })
    }

    fn include_usage(&self) -> bool {
        self.stream_options
            .as_ref()
            .and_then(|o| o.include_usage)
            .unwrap_or(false)
    }
}

/// A chat request's tool definitions and tool choice, under the field names it used
/// (`tools`/`tool_choice`, or the deprecated `functions`/`function_call`).
struct ToolRequest<'a> {
    tools: Option<&'a [serde_json::Value]>,
    choice: Option<&'a serde_json::Value>,
    tools_param: &'static str,
    choice_param: &'static str,
}

impl<'a> ToolRequest<'a> {
    /// Both forms, the current one first.
    fn of(req: &'a ChatCompletionRequest) -> [Self; 2] {
        [
            ToolRequest {
                tools: req.tools.as_deref(),
                choice: req.tool_choice.as_ref(),
                tools_param: "tools",
                choice_param: "tool_choice",
            },
            ToolRequest {
                tools: req.functions.as_deref(),
                choice: req.function_call.as_ref(),
                tools_param: "functions",
                choice_param: "function_call",
            },
        ]
    }

    /// Tool calling is not implemented: tools are accepted only when the request says not to
    /// call them (`"none"` as the choice).
    fn check(&self) -> Result<(), ValidationError> {
        let unsupported = |param| ValidationError::Unsupported {
            param,
            reason: "tool calling is not implemented; send no tools, or `\"none\"` as the choice",
        };
        let called = self.choice.is_none_or(|c| c != "none");
        if self.tools.is_some_and(|t| !t.is_empty()) && called {
            return Err(unsupported(self.tools_param));
        }
        if self.choice.is_some_and(|c| c != "none" && c != "auto") {
            return Err(unsupported(self.choice_param));
        }
        Ok(())
    }
}

/// The conversation for the chat template: roles checked (`developer` is `system`), text
/// parts joined; tool calls and other parts refused.
fn chat_messages(messages: &[RequestMessage]) -> Result<Vec<ChatMessage>, ValidationError> {
    messages
        .iter()
        .enumerate()
        .map(|(index, m)| {
            let bad = |message: String| ValidationError::Message { index, message };
            if m.tool_calls.as_ref().is_some_and(|c| !c.is_empty()) {
                return Err(bad(
                    "`tool_calls` are not supported (tool calling is not implemented)".into(),
                ));
            }
            let role = match m.role.as_str() {
                "system" | "developer" => "system",
                r @ ("user" | "assistant" | "tool") => r,
                other => {
                    return Err(bad(format!(
                        "unknown role `{other}`; expected system, developer, user, assistant or tool"
                    )));
                }
            };
            let content = match &m.content {
                None => String::new(),
                Some(MessageContent::Text(t)) => t.clone(),
                Some(MessageContent::Parts(parts)) => parts_text(parts).map_err(bad)?,
            };
            Ok(ChatMessage::new(role, content))
        })
        .collect()
}

/// The text of a message's parts, joined; what is wrong otherwise.
fn parts_text(parts: &[crate::openai::ContentPart]) -> Result<String, String> {
    let mut text = String::new();
    for p in parts {
        match (p.kind.as_str(), &p.text) {
            ("text", Some(t)) => text.push_str(t),
            ("text", None) => return Err("text part without `text`".into()),
            (kind, _) => {
                return Err(format!(
                    "content parts of type `{kind}` are not supported (only `text`)"
                ));
            }
        }
    }
    Ok(text)
}
