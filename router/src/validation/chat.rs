//! The chat request's rules: a conversation (tool calls and results included) and its tools
//! into the samples to run and the way their output is read.
//!
//! Checks run in a fixed order (the first failure is the one reported): constrained output,
//! tools, messages, logprobs, `n`, the template's variables, the conversation rendered with the
//! chat template, then the sampling fields and the rendered prompt.

use tessera_params::OutputConstraint;
use tessera_text::ChatMessage;

use super::constraint::check_constraint;
use super::parameters::TopLogprobs;
use super::tools::{GrammarTerms, ToolFields, ToolUse, history_calls, show_tools};
use super::{
    GenerateInput, OpenAiReply, Prompt, RequestParameters, ValidChatRequest, Validation,
    ValidationError,
};
use crate::assistant::{
    OutputReading, ToolCallFormat, harmony_answer_grammar, is_harmony_template,
};
use crate::openai::{ChatCompletionRequest, ContentPart, MessageContent, RequestMessage};

/// Most `top_logprobs` of a chat request.
const MAX_CHAT_TOP_LOGPROBS: u32 = 20;

/// Most `chat_template_kwargs` entries, and their largest size as JSON.
const MAX_TEMPLATE_KWARGS: usize = 32;
const MAX_TEMPLATE_KWARGS_BYTES: usize = 16 << 10;

impl Validation {
    /// Validates a chat request into its `n` samples and how their output is read.
    pub(crate) async fn validate_chat(
        &self,
        req: &ChatCompletionRequest,
    ) -> Result<ValidChatRequest, ValidationError> {
        let (param, constraint) = req.constraints.constrained()?;
        let tool_use = self.tool_use(req)?;
        let harmony = self.writes_harmony();
        let constraint = match (constraint, &tool_use) {
            (Some(_), Some(_)) => {
                return Err(ValidationError::Unsupported {
                    param,
                    reason: "exclusive with tools the model may call; send `tool_choice: \
                             \"none\"` or no constraint",
                });
            }
            (None, Some(tools)) => Some(tools.constraint.clone()),
            (Some(c), None) if harmony => Some(self.in_final_channel(param, &c)?),
            (c, None) => c,
        };
        let param = if tool_use.is_some() { "tools" } else { param };
        check_constraint(param, constraint.as_ref(), &self.grammars, &self.tokenizer).await?;
        let mut messages = chat_messages(&req.messages)?;
        if matches!(
            constraint,
            Some(OutputConstraint::JsonObject | OutputConstraint::JsonSchema(_))
        ) {
            ask_for_json(&mut messages);
        }
        let top = TopLogprobs {
            param: "top_logprobs",
            given: req.top_logprobs.unwrap_or(0),
            max: MAX_CHAT_TOP_LOGPROBS,
        }
        .check()?;
        let logprobs = req.logprobs.unwrap_or(false);
        let n = req.sampling.n.unwrap_or(1);
        self.validate_n("n", n)?;
        let extra = template_vars(req)?;
        let text = self
            .render_with_tools(messages, tool_use.as_ref(), extra)
            .await?;
        let sampling = req.sampling.parameters()?;
        let parameters = RequestParameters {
            max_new_tokens: req.max_completion_tokens.or(req.max_tokens),
            top_n_tokens: Some(if logprobs { top } else { 0 }),
            // Harmony's channels and the start of some formats' calls are special tokens,
            // which the text must keep to be read.
            skip_special_tokens: sampling.skip_special_tokens
                && !harmony
                && !tool_use.as_ref().is_some_and(|t| t.keeps_special_tokens),
            constraint,
            ..sampling
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
            reading: OutputReading {
                tools: tool_use.as_ref().map(|t| t.format),
                single_call: tool_use.as_ref().is_some_and(|t| t.single_call),
                reasoning: self.config.reasoning,
                harmony,
            },
        })
    }

    /// The length in tokens of the prompt [`Validation::validate_chat`] would render for
    /// `req` (its tools and template variables included), without the generation rules.
    pub(crate) async fn count_chat_tokens(
        &self,
        req: &ChatCompletionRequest,
    ) -> Result<u32, ValidationError> {
        let tool_use = self.tool_use(req)?;
        let messages = chat_messages(&req.messages)?;
        let extra = template_vars(req)?;
        let text = self
            .render_with_tools(messages, tool_use.as_ref(), extra)
            .await?;
        let prompt = self
            .tokenize(Prompt::Text {
                text,
                add_special_tokens: false,
            })
            .await?;
        Ok(u32::try_from(prompt.ids.len()).unwrap_or(u32::MAX))
    }

    /// The tools the model may call (under `tools`, or the deprecated `functions`).
    fn tool_use(&self, req: &ChatCompletionRequest) -> Result<Option<ToolUse>, ValidationError> {
        let legacy = req.tools.is_none() && req.functions.is_some();
        let fields = ToolFields {
            tools: if legacy {
                req.functions.as_deref()
            } else {
                req.tools.as_deref()
            },
            choice: if legacy {
                req.function_call.as_ref()
            } else {
                req.tool_choice.as_ref()
            },
            parallel: req.parallel_tool_calls,
            legacy,
        };
        fields.tool_use(self.tool_call_format(), &self.tokenizer)
    }

    /// The configured tool-call format, or the one the chat template shows.
    fn tool_call_format(&self) -> ToolCallFormat {
        self.config.tool_call_format.unwrap_or_else(|| {
            match self.tokenizer.chat_template.as_ref() {
                Some(t) if t.renders_tools() => ToolCallFormat::detect(t.source()),
                _ => ToolCallFormat::Hermes,
            }
        })
    }

    /// Whether the model writes the harmony format (gpt-oss): its template does, or the
    /// server was told so (`--tool-call-parser openai`).
    fn writes_harmony(&self) -> bool {
        self.config.tool_call_format == Some(ToolCallFormat::Harmony)
            || self
                .tokenizer
                .chat_template
                .as_ref()
                .is_some_and(|t| is_harmony_template(t.source()))
    }

    /// The request's constraint on the answer, applied to harmony's `final` channel.
    fn in_final_channel(
        &self,
        param: &'static str,
        constraint: &OutputConstraint,
    ) -> Result<OutputConstraint, ValidationError> {
        let terms = GrammarTerms::of(&self.tokenizer);
        harmony_answer_grammar(constraint, &|t| terms.term(t))
            .map(OutputConstraint::Lark)
            .ok_or(ValidationError::Unsupported {
                param,
                reason: "this model writes the harmony format, where the answer can be held to \
                         a JSON schema, JSON mode or a choice, not to a regular expression or \
                         grammar of its own",
            })
    }

    /// The conversation rendered, the tools handed to a template that renders them or shown
    /// in the system message of one that does not.
    async fn render_with_tools(
        &self,
        messages: Vec<ChatMessage>,
        tool_use: Option<&ToolUse>,
        extra: Option<serde_json::Map<String, serde_json::Value>>,
    ) -> Result<String, ValidationError> {
        let renders_tools = self
            .tokenizer
            .chat_template
            .as_ref()
            .is_some_and(|t| t.renders_tools());
        match tool_use {
            Some(tools) if renders_tools => {
                self.render_chat(messages, Some(tools.definitions.clone()), extra)
                    .await
            }
            Some(tools) => {
                let messages = show_tools(messages, &tools.definitions);
                self.render_chat(messages, None, extra).await
            }
            None => self.render_chat(messages, None, extra).await,
        }
    }
}

/// What the system message says when a JSON answer is required and the conversation does
/// not ask for one.
const JSON_HINT: &str = "Respond in JSON.";

/// Tells the model that its answer is JSON, unless a message already mentions JSON. The
/// grammar holds the output to the schema either way, but a model that does not know it is
/// writing JSON writes prose into the first string it opens and never closes it (OpenAI's
/// JSON mode asks the same of the conversation; its structured outputs show the model the
/// schema).
fn ask_for_json(messages: &mut Vec<ChatMessage>) {
    let mentions_json = |text: &str| {
        text.as_bytes()
            .windows(4)
            .any(|w| w.eq_ignore_ascii_case(b"json"))
    };
    if messages.iter().any(|m| mentions_json(&m.content)) {
        return;
    }
    match messages.first_mut() {
        Some(first) if first.role == "system" => {
            if !first.content.is_empty() {
                first.content.push_str("\n\n");
            }
            first.content.push_str(JSON_HINT);
        }
        _ => messages.insert(0, ChatMessage::new("system", JSON_HINT)),
    }
}

/// The template's extra variables: `chat_template_kwargs`, and `reasoning_effort` unless the
/// kwargs set it.
fn template_vars(
    req: &ChatCompletionRequest,
) -> Result<Option<serde_json::Map<String, serde_json::Value>>, ValidationError> {
    let mut vars = template_kwargs(req.chat_template_kwargs.as_ref())?;
    if let Some(effort) = &req.reasoning_effort {
        if !REASONING_EFFORTS.contains(&effort.as_str()) {
            return Err(ValidationError::OutOfRange {
                param: "reasoning_effort",
                bound: "one of low, medium, high",
                given: effort.chars().take(32).collect(),
            });
        }
        vars.get_or_insert_default()
            .entry("reasoning_effort")
            .or_insert_with(|| effort.as_str().into());
    }
    Ok(vars)
}

/// The reasoning efforts templates know (gpt-oss's system message states one).
const REASONING_EFFORTS: [&str; 3] = ["low", "medium", "high"];

/// `chat_template_kwargs`, bounded.
fn template_kwargs(
    kwargs: Option<&serde_json::Map<String, serde_json::Value>>,
) -> Result<Option<serde_json::Map<String, serde_json::Value>>, ValidationError> {
    let Some(kwargs) = kwargs else {
        return Ok(None);
    };
    let size = serde_json::to_string(kwargs).map_or(usize::MAX, |s| s.len());
    if kwargs.len() > MAX_TEMPLATE_KWARGS || size > MAX_TEMPLATE_KWARGS_BYTES {
        return Err(ValidationError::OutOfRange {
            param: "chat_template_kwargs",
            bound: "at most 32 entries and 16 KiB of JSON",
            given: format!("{} entries, {size} bytes", kwargs.len()),
        });
    }
    Ok(Some(kwargs.clone()))
}

/// The conversation for the chat template: roles checked (`developer` is `system`), text
/// parts joined, assistant tool calls read, tool results kept with their call id.
fn chat_messages(messages: &[RequestMessage]) -> Result<Vec<ChatMessage>, ValidationError> {
    messages
        .iter()
        .enumerate()
        .map(|(index, m)| {
            let bad = |message: String| ValidationError::Message { index, message };
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
            let mut message = ChatMessage::new(role, content);
            match m.tool_calls.as_deref() {
                Some(calls) if !calls.is_empty() => {
                    if role != "assistant" {
                        return Err(bad("only assistant messages carry `tool_calls`".into()));
                    }
                    message.tool_calls = Some(history_calls(calls).map_err(bad)?);
                }
                _ => {}
            }
            let thinking = m.reasoning.as_ref().or(m.reasoning_content.as_ref());
            if role == "assistant" {
                message.reasoning_content = thinking.filter(|t| !t.is_empty()).cloned();
                message.thinking = message.reasoning_content.clone();
            }
            message.tool_call_id = m.tool_call_id.clone();
            message.name = m.name.clone();
            Ok(message)
        })
        .collect()
}

/// The text of a message's parts, joined; what is wrong otherwise.
fn parts_text(parts: &[ContentPart]) -> Result<String, String> {
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
