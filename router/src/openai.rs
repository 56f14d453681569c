//! The OpenAI-compatible API: `/v1/chat/completions`, `/v1/completions`, `/v1/models`.
//!
//! Differences from OpenAI, all documented in the field docs: `temperature` defaults to 1
//! (sampling) as OpenAI's does; `n` runs n independent requests (seeds `seed + i` when a
//! seed is given); `best_of > 1` and `suffix` are refused; a few vLLM extensions are
//! accepted (`top_k`, `min_p`, `repetition_penalty`, `ignore_eos`, `skip_special_tokens`).
//! Unknown fields (`user`, `metadata`, ...) are ignored. `response_format: {"type":
//! "json_object"}` is JSON mode (the shard keeps the output one JSON object), vLLM's
//! `guided_choice` makes it one of a list of strings, `guided_regex` a string a regular
//! expression matches; other constrained output (`json_schema`, `tools`, `guided_json`,
//! `guided_grammar`) is not implemented, so asking for it is refused rather than answered with
//! unconstrained text. Errors use OpenAI's shape; invalid requests answer 400 (see
//! [`crate::error`]).

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::time::Instant;

use axum::Json;
use axum::extract::State;
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use tessera_formats::ChatMessage;
use tessera_params::OutputConstraint;
use tokio::sync::OwnedSemaphorePermit;
use tracing::Instrument;

use crate::error::{ApiError, OpenAiError, OpenAiJson};
use crate::infer::{
    InferError, InferResponse, InferStream, InferStreamResponse, PrefillToken, Token,
    ValidGenerateRequest, collect,
};
use crate::server::AppState;
use crate::sse::{done_event, json_event, sse};
use crate::validation::{
    GenerateInput, Prompt, RequestParameters, ValidationError, random_u64, validate_openai_sampling,
};

/// `stop`: one string or a list.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum StopSpec {
    /// One stop sequence.
    One(String),
    /// Several.
    Many(Vec<String>),
}

/// `stream_options`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamOptions {
    /// Send a last chunk with `usage` (and `"usage": null` in the others).
    pub include_usage: Option<bool>,
}

/// `response_format`.
#[derive(Debug, Clone, Deserialize)]
pub struct ResponseFormat {
    /// `text`, `json_object` (JSON mode) or `json_schema` (refused).
    #[serde(rename = "type")]
    pub kind: String,
}

/// Requests for constrained output, shared by chat and completions. Those not implemented are
/// refused, since answering them with free text would break a client that parses the output.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct OutputConstraints {
    /// `{"type": "text"}` or `{"type": "json_object"}`.
    pub response_format: Option<ResponseFormat>,
    /// vLLM extension; refused.
    pub guided_json: Option<serde_json::Value>,
    /// vLLM extension: the output is a string this regular expression matches.
    pub guided_regex: Option<serde_json::Value>,
    /// vLLM extension: the output is one of these strings.
    pub guided_choice: Option<serde_json::Value>,
    /// vLLM extension; refused.
    pub guided_grammar: Option<serde_json::Value>,
}

/// Most `guided_choice` strings (the shard keeps the live ones as bits of a `u64`).
const MAX_GUIDED_CHOICES: usize = 64;

impl OutputConstraints {
    /// What the request asks for; an error for what is not implemented or malformed.
    fn constrained(&self) -> Result<Option<OutputConstraint>, ValidationError> {
        let json_object = match self.response_format.as_ref().map(|f| f.kind.as_str()) {
            None | Some("text") => false,
            Some("json_object") => true,
            Some(_) => {
                return Err(ValidationError::Unsupported {
                    param: "response_format",
                    reason: "JSON schemas are not implemented; use `{\"type\": \
                             \"json_object\"}` (any JSON object) or `{\"type\": \"text\"}`",
                });
            }
        };
        let unsupported = [
            ("guided_json", &self.guided_json),
            ("guided_grammar", &self.guided_grammar),
        ];
        if let Some((param, _)) = unsupported.into_iter().find(|(_, v)| v.is_some()) {
            return Err(ValidationError::Unsupported {
                param,
                reason: "only `guided_choice` and `guided_regex` are implemented; \
                         `response_format: {\"type\": \"json_object\"}` gives any JSON object",
            });
        }
        let one_of = match &self.guided_choice {
            None => Vec::new(),
            Some(v) => guided_choices(v)?,
        };
        let pattern = match &self.guided_regex {
            None => String::new(),
            Some(v) => output_pattern("guided_regex", v)?,
        };
        let asked = [json_object, !one_of.is_empty(), !pattern.is_empty()];
        if asked.iter().filter(|&&a| a).count() > 1 {
            return Err(ValidationError::Unsupported {
                param: if pattern.is_empty() {
                    "guided_choice"
                } else {
                    "guided_regex"
                },
                reason: "JSON mode, `guided_choice` and `guided_regex` exclude each other",
            });
        }
        Ok(if json_object {
            Some(OutputConstraint::JsonObject)
        } else if !one_of.is_empty() {
            Some(OutputConstraint::OneOf(one_of))
        } else if !pattern.is_empty() {
            Some(OutputConstraint::Pattern(pattern))
        } else {
            None
        })
    }
}

/// An output pattern's text: a non-empty string ([`check_pattern`] compiles it).
pub(crate) fn output_pattern(
    param: &'static str,
    v: &serde_json::Value,
) -> Result<String, ValidationError> {
    v.as_str()
        .filter(|p| !p.is_empty())
        .map(str::to_owned)
        .ok_or_else(|| ValidationError::Pattern {
            param,
            message: "must be a non-empty regular expression".into(),
        })
}

/// Compiles a pattern constraint as the shard will, off the async runtime (a pattern near the
/// size cap takes a few hundred milliseconds), so that one the shard could not honour is
/// refused here.
pub(crate) async fn check_pattern(
    param: &'static str,
    constraint: Option<&OutputConstraint>,
) -> Result<(), ValidationError> {
    let Some(OutputConstraint::Pattern(pattern)) = constraint else {
        return Ok(());
    };
    let owned = pattern.to_owned();
    tokio::task::spawn_blocking(move || tessera_formats::compile_output_pattern(&owned).map(drop))
        .await
        .unwrap_or_else(|e| Err(format!("the pattern check failed: {e}")))
        .map_err(|message| ValidationError::Pattern { param, message })
}

/// `guided_choice`: 1 to [`MAX_GUIDED_CHOICES`] non-empty strings.
fn guided_choices(v: &serde_json::Value) -> Result<Vec<String>, ValidationError> {
    let strings: Option<Vec<String>> = v.as_array().and_then(|list| {
        list.iter()
            .map(|c| c.as_str().filter(|s| !s.is_empty()).map(str::to_owned))
            .collect()
    });
    match strings {
        Some(s) if (1..=MAX_GUIDED_CHOICES).contains(&s.len()) => Ok(s),
        _ => Err(ValidationError::OutOfRange {
            param: "guided_choice",
            bound: "a list of 1 to 64 non-empty strings",
            given: v.to_string().chars().take(80).collect(),
        }),
    }
}

/// Tool calling is not implemented: tools are accepted only when the request says not to
/// call them (`tool_choice: "none"`), as are the deprecated `functions`.
fn check_tools(
    tools: Option<&[serde_json::Value]>,
    choice: Option<&serde_json::Value>,
    (tools_param, choice_param): (&'static str, &'static str),
) -> Result<(), ValidationError> {
    let unsupported = |param| ValidationError::Unsupported {
        param,
        reason: "tool calling is not implemented; send no tools, or `\"none\"` as the choice",
    };
    let called = choice.is_none_or(|c| c != "none");
    if tools.is_some_and(|t| !t.is_empty()) && called {
        return Err(unsupported(tools_param));
    }
    if choice.is_some_and(|c| c != "none" && c != "auto") {
        return Err(unsupported(choice_param));
    }
    Ok(())
}

/// The sampling fields shared by chat and completions requests.
#[derive(Debug, Clone, Default, Deserialize)]
#[allow(missing_docs)]
pub struct SamplingFields {
    /// In [0, 2]; default 1; 0 is greedy.
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    /// Number of independent samples (choices).
    pub n: Option<usize>,
    pub stop: Option<StopSpec>,
    pub seed: Option<u64>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    /// Token id (as a string) to bias in [-100, 100].
    pub logit_bias: Option<BTreeMap<String, f32>>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    /// Extension (vLLM): keep the k most likely tokens; -1 or absent is off.
    pub top_k: Option<i64>,
    /// Extension (vLLM).
    pub min_p: Option<f32>,
    /// Extension (vLLM).
    pub repetition_penalty: Option<f32>,
    /// Extension (vLLM).
    pub ignore_eos: Option<bool>,
    /// Extension (vLLM); default true.
    pub skip_special_tokens: Option<bool>,
}

impl SamplingFields {
    fn parameters(
        &self,
        max_new_tokens: Option<u32>,
        top_n_tokens: u32,
        decoder_input_details: bool,
    ) -> Result<RequestParameters, ValidationError> {
        validate_openai_sampling(self.temperature, None)?;
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
            top_n_tokens: Some(top_n_tokens),
            max_new_tokens,
            stop,
            ignore_eos: self.ignore_eos.unwrap_or(false),
            decoder_input_details,
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

/// A chat message's content: a string or a list of parts.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum MessageContent {
    /// Plain text.
    Text(String),
    /// Parts; only `{"type": "text", "text": ...}` is supported.
    Parts(Vec<ContentPart>),
}

/// One part of a message's content.
#[derive(Debug, Clone, Deserialize)]
pub struct ContentPart {
    /// `"text"` (others are refused).
    #[serde(rename = "type")]
    pub kind: String,
    /// The text of a text part.
    pub text: Option<String>,
}

/// A chat message as sent.
#[derive(Debug, Clone, Deserialize)]
pub struct RequestMessage {
    /// `system`, `developer` (treated as `system`), `user`, `assistant` or `tool`.
    pub role: String,
    /// The content (null for an assistant message with only tool calls).
    pub content: Option<MessageContent>,
    /// An assistant's earlier tool calls: refused, since no template here renders them.
    pub tool_calls: Option<Vec<serde_json::Value>>,
}

/// `POST /v1/chat/completions` body.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatCompletionRequest {
    /// Must be the served model's name.
    pub model: String,
    /// The conversation.
    pub messages: Vec<RequestMessage>,
    /// Deprecated alias of `max_completion_tokens`.
    pub max_tokens: Option<u32>,
    /// Most tokens to generate; default: what the context allows.
    pub max_completion_tokens: Option<u32>,
    /// Return the generated tokens' logprobs.
    pub logprobs: Option<bool>,
    /// Alternatives per token, 0..=20 (with `logprobs`).
    pub top_logprobs: Option<u32>,
    /// Tool definitions; refused unless `tool_choice` is `"none"`.
    pub tools: Option<Vec<serde_json::Value>>,
    /// `"none"` or `"auto"` (with no tools); others are refused.
    pub tool_choice: Option<serde_json::Value>,
    /// Deprecated form of `tools`; same rules.
    pub functions: Option<Vec<serde_json::Value>>,
    /// Deprecated form of `tool_choice`; same rules.
    pub function_call: Option<serde_json::Value>,
    /// Sampling fields.
    #[serde(flatten)]
    pub sampling: SamplingFields,
    /// Constrained output: JSON mode, `guided_choice`, `guided_regex` (the rest is refused).
    #[serde(flatten)]
    pub constraints: OutputConstraints,
}

/// `prompt`: a string, a list of strings, a list of token ids, or a list of those.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum PromptInput {
    /// One prompt.
    Text(String),
    /// One choice (or n) per prompt.
    Texts(Vec<String>),
    /// One prompt as token ids.
    Ids(Vec<u32>),
    /// Several prompts as token ids.
    IdLists(Vec<Vec<u32>>),
}

/// `POST /v1/completions` body.
#[derive(Debug, Clone, Deserialize)]
pub struct CompletionRequest {
    /// Must be the served model's name.
    pub model: String,
    /// The prompt(s).
    pub prompt: PromptInput,
    /// Most tokens to generate; default 16 (as OpenAI).
    pub max_tokens: Option<u32>,
    /// Alternatives per token, 0..=5; any value returns the tokens' logprobs.
    pub logprobs: Option<u32>,
    /// Prepend the prompt to the text (and its logprobs with `logprobs`).
    pub echo: Option<bool>,
    /// Only 1 is supported.
    pub best_of: Option<usize>,
    /// Not supported.
    pub suffix: Option<String>,
    /// Sampling fields.
    #[serde(flatten)]
    pub sampling: SamplingFields,
    /// Constrained output: JSON mode, `guided_choice`, `guided_regex` (the rest is refused).
    #[serde(flatten)]
    pub constraints: OutputConstraints,
}

/// `usage`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Usage {
    /// Prompt tokens (each prompt counted once).
    pub prompt_tokens: u32,
    /// Generated tokens over all choices.
    pub completion_tokens: u32,
    /// The sum.
    pub total_tokens: u32,
}

impl Usage {
    fn new(prompt_tokens: u32, completion_tokens: u32) -> Self {
        Self {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
        }
    }
}

/// A token's logprob in the chat shape.
#[derive(Debug, Clone, Serialize)]
pub struct TopLogprob {
    /// Token text.
    pub token: String,
    /// Its logprob.
    pub logprob: f32,
    /// Its UTF-8 bytes.
    pub bytes: Vec<u8>,
}

/// A generated token's logprob with its alternatives (chat shape).
#[derive(Debug, Clone, Serialize)]
pub struct ChatLogprob {
    /// Token text.
    pub token: String,
    /// Its logprob.
    pub logprob: f32,
    /// Its UTF-8 bytes.
    pub bytes: Vec<u8>,
    /// The most likely alternatives.
    pub top_logprobs: Vec<TopLogprob>,
}

/// `choices[].logprobs` of chat responses.
#[derive(Debug, Clone, Serialize)]
pub struct ChatLogprobs {
    /// One entry per token.
    pub content: Vec<ChatLogprob>,
}

fn chat_logprob(token: &Token, top: &[Token]) -> ChatLogprob {
    ChatLogprob {
        token: token.piece.clone(),
        logprob: token.logprob,
        bytes: token.piece.as_bytes().to_vec(),
        top_logprobs: top
            .iter()
            .map(|t| TopLogprob {
                token: t.piece.clone(),
                logprob: t.logprob,
                bytes: t.piece.as_bytes().to_vec(),
            })
            .collect(),
    }
}

/// The assistant's message.
#[derive(Debug, Clone, Serialize)]
pub struct AssistantMessage {
    /// Always `"assistant"`.
    pub role: &'static str,
    /// The text.
    pub content: String,
}

/// One choice of a chat completion.
#[derive(Debug, Clone, Serialize)]
pub struct ChatChoice {
    /// Choice index.
    pub index: usize,
    /// The message.
    pub message: AssistantMessage,
    /// Token logprobs, when asked for.
    pub logprobs: Option<ChatLogprobs>,
    /// `"stop"` or `"length"`.
    pub finish_reason: &'static str,
}

/// `chat.completion` object.
#[derive(Debug, Clone, Serialize)]
pub struct ChatCompletion {
    /// `chatcmpl-…`.
    pub id: String,
    /// `"chat.completion"`.
    pub object: &'static str,
    /// Unix seconds.
    pub created: u64,
    /// Model name.
    pub model: String,
    /// Backend configuration fingerprint.
    pub system_fingerprint: String,
    /// The choices.
    pub choices: Vec<ChatChoice>,
    /// Token counts.
    pub usage: Usage,
}

/// A streamed chat delta.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Delta {
    /// `"assistant"` on the first chunk of a choice.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    /// New text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
}

/// One choice of a chat chunk.
#[derive(Debug, Clone, Serialize)]
pub struct ChunkChoice {
    /// Choice index.
    pub index: usize,
    /// The delta.
    pub delta: Delta,
    /// Logprobs of the tokens in this chunk.
    pub logprobs: Option<ChatLogprobs>,
    /// Set on the choice's last chunk.
    pub finish_reason: Option<&'static str>,
}

/// `chat.completion.chunk` object.
#[derive(Debug, Clone, Serialize)]
pub struct ChatCompletionChunk {
    /// Same id on every chunk.
    pub id: String,
    /// `"chat.completion.chunk"`.
    pub object: &'static str,
    /// Unix seconds.
    pub created: u64,
    /// Model name.
    pub model: String,
    /// Backend configuration fingerprint.
    pub system_fingerprint: String,
    /// Choices in this chunk (empty on the usage chunk).
    pub choices: Vec<ChunkChoice>,
    /// With `include_usage`: null, then the totals on the last chunk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Option<Usage>>,
}

/// Legacy logprobs of completions.
#[derive(Debug, Clone, Default, Serialize)]
pub struct CompletionLogprobs {
    /// Token texts.
    pub tokens: Vec<String>,
    /// Their logprobs (null for the first prompt token).
    pub token_logprobs: Vec<Option<f32>>,
    /// Alternatives per token, text → logprob.
    pub top_logprobs: Vec<Option<BTreeMap<String, f32>>>,
    /// Character offset of each token in the choice's text.
    pub text_offset: Vec<usize>,
}

impl CompletionLogprobs {
    fn push(
        &mut self,
        text: &str,
        logprob: Option<f32>,
        top: Option<&[Token]>,
        offset: &mut usize,
    ) {
        self.tokens.push(text.to_owned());
        self.token_logprobs.push(logprob);
        self.top_logprobs
            .push(top.map(|t| t.iter().map(|t| (t.text.clone(), t.logprob)).collect()));
        self.text_offset.push(*offset);
        *offset += text.chars().count();
    }

    fn prefill(&mut self, prefill: &[PrefillToken], offset: &mut usize) {
        for p in prefill {
            self.push(&p.text, p.logprob, p.logprob.map(|_| &[][..]), offset);
        }
    }
}

/// One choice of a text completion (also the streamed chunk's choice).
#[derive(Debug, Clone, Serialize)]
pub struct CompletionChoice {
    /// The text (in chunks: the new text).
    pub text: String,
    /// `prompt_index * n + sample`.
    pub index: usize,
    /// Legacy logprobs, when asked for.
    pub logprobs: Option<CompletionLogprobs>,
    /// `"stop"` or `"length"`; null in chunks before the last.
    pub finish_reason: Option<&'static str>,
}

/// `text_completion` object (whole or chunk).
#[derive(Debug, Clone, Serialize)]
pub struct Completion {
    /// `cmpl-…`.
    pub id: String,
    /// `"text_completion"`.
    pub object: &'static str,
    /// Unix seconds.
    pub created: u64,
    /// Model name.
    pub model: String,
    /// Backend configuration fingerprint.
    pub system_fingerprint: String,
    /// The choices.
    pub choices: Vec<CompletionChoice>,
    /// Token counts (in streams: only with `include_usage`, null until the last chunk).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Option<Usage>>,
}

/// Fields every response of a request shares.
#[derive(Debug, Clone)]
struct Meta {
    id: String,
    created: u64,
    model: String,
    system_fingerprint: String,
}

impl Meta {
    fn new(state: &AppState, prefix: &str) -> Self {
        let created = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        Self {
            id: format!("{prefix}-{:016x}{:016x}", random_u64(), random_u64()),
            created,
            model: state.served_model_name().to_owned(),
            system_fingerprint: format!("tessera-{}", env!("CARGO_PKG_VERSION")),
        }
    }

    fn chat_chunk(&self, choices: Vec<ChunkChoice>, usage: Option<Option<Usage>>) -> Event {
        json_event(&ChatCompletionChunk {
            id: self.id.clone(),
            object: "chat.completion.chunk",
            created: self.created,
            model: self.model.clone(),
            system_fingerprint: self.system_fingerprint.clone(),
            choices,
            usage,
        })
    }

    fn completion(
        &self,
        choices: Vec<CompletionChoice>,
        usage: Option<Option<Usage>>,
    ) -> Completion {
        Completion {
            id: self.id.clone(),
            object: "text_completion",
            created: self.created,
            model: self.model.clone(),
            system_fingerprint: self.system_fingerprint.clone(),
            choices,
            usage,
        }
    }
}

fn check_model(state: &AppState, model: &str) -> Result<(), ApiError> {
    if model == state.served_model_name() {
        Ok(())
    } else {
        Err(ApiError::ModelNotFound(model.to_owned()))
    }
}

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
                Some(MessageContent::Parts(parts)) => {
                    let mut text = String::new();
                    for p in parts {
                        match (p.kind.as_str(), &p.text) {
                            ("text", Some(t)) => text.push_str(t),
                            ("text", None) => return Err(bad("text part without `text`".into())),
                            (kind, _) => {
                                return Err(bad(format!(
                                    "content parts of type `{kind}` are not supported (only `text`)"
                                )));
                            }
                        }
                    }
                    text
                }
            };
            Ok(ChatMessage::new(role, content))
        })
        .collect()
}

/// `n` copies of a request, each with its own seed (`seed + i` when the client gave one).
fn samples(
    valid: ValidGenerateRequest,
    n: usize,
    client_seed: Option<u64>,
) -> Vec<ValidGenerateRequest> {
    (0..n)
        .map(|i| {
            let mut r = valid.clone();
            if i > 0 && r.parameters.seed.is_some() {
                r.parameters.seed = Some(match client_seed {
                    Some(s) => s.wrapping_add(i as u64),
                    None => random_u64(),
                });
            }
            r
        })
        .collect()
}

/// Queues all requests or none (permits first, so a 429 leaves nothing running).
async fn launch(
    state: &AppState,
    requests: Vec<ValidGenerateRequest>,
) -> Result<(Vec<OwnedSemaphorePermit>, Vec<InferStream>), InferError> {
    let permits = requests
        .iter()
        .map(|_| state.infer().try_acquire())
        .collect::<Result<Vec<_>, _>>()?;
    let mut streams = Vec::with_capacity(requests.len());
    for r in requests {
        streams.push(state.infer().enqueue(r).await?);
    }
    Ok((permits, streams))
}

/// Runs requests to the end; dropping the future cancels them all.
async fn run_all(
    state: &AppState,
    requests: Vec<ValidGenerateRequest>,
) -> Result<Vec<InferResponse>, InferError> {
    let (_permits, streams) = launch(state, requests).await?;
    futures::future::try_join_all(streams.into_iter().map(collect)).await
}

/// `POST /v1/chat/completions`.
pub(crate) async fn chat_completions(
    State(state): State<AppState>,
    OpenAiJson(req): OpenAiJson<ChatCompletionRequest>,
) -> Result<Response, OpenAiError> {
    check_model(&state, &req.model)?;
    let received = Instant::now();
    let constraint = req.constraints.constrained()?;
    check_pattern("guided_regex", constraint.as_ref()).await?;
    check_tools(
        req.tools.as_deref(),
        req.tool_choice.as_ref(),
        ("tools", "tool_choice"),
    )?;
    check_tools(
        req.functions.as_deref(),
        req.function_call.as_ref(),
        ("functions", "function_call"),
    )?;
    let messages = chat_messages(&req.messages)?;
    let top = req.top_logprobs.unwrap_or(0);
    validate_openai_sampling(None, Some(("top_logprobs", top, 20)))?;
    let logprobs = req.logprobs.unwrap_or(false);
    let n = req.sampling.n.unwrap_or(1);
    state.validation().validate_n("n", n)?;
    let validation = state.validation().clone();
    let prompt = tokio::task::spawn_blocking(move || validation.apply_chat_template(&messages))
        .await
        .map_err(|e| ApiError::Internal(e.to_string()))??;
    let mut parameters = req.sampling.parameters(
        req.max_completion_tokens.or(req.max_tokens),
        if logprobs { top } else { 0 },
        false,
    )?;
    parameters.constraint = constraint;
    let input = GenerateInput {
        prompt: Prompt::Text {
            text: prompt,
            add_special_tokens: false,
        },
        parameters,
        truncate: None,
    };
    let valid = state
        .validation()
        .validate(input)
        .instrument(tracing::info_span!("validation"))
        .await?;
    crate::metrics::record_validation(received);
    let prompt_tokens = valid.input_ids.len() as u32;
    let requests = samples(valid, n, req.sampling.seed);
    let meta = Meta::new(&state, "chatcmpl");
    if req.sampling.stream.unwrap_or(false) {
        let (permits, streams) = launch(&state, requests).await?;
        let usage = req.sampling.include_usage().then_some(prompt_tokens);
        return Ok(sse(chat_stream(meta, permits, streams, logprobs, usage)));
    }
    let outputs = run_all(&state, requests).await?;
    let completion_tokens = outputs
        .iter()
        .map(|o| o.generated_text.generated_tokens)
        .sum();
    let choices = outputs
        .into_iter()
        .enumerate()
        .map(|(index, o)| ChatChoice {
            index,
            logprobs: logprobs.then(|| ChatLogprobs {
                content: o
                    .tokens
                    .iter()
                    .zip(&o.top_tokens)
                    .map(|(t, top)| chat_logprob(t, top))
                    .collect(),
            }),
            finish_reason: o.generated_text.finish_reason.openai(),
            message: AssistantMessage {
                role: "assistant",
                content: o.generated_text.text,
            },
        })
        .collect();
    Ok(Json(ChatCompletion {
        id: meta.id,
        object: "chat.completion",
        created: meta.created,
        model: meta.model,
        system_fingerprint: meta.system_fingerprint,
        choices,
        usage: Usage::new(prompt_tokens, completion_tokens),
    })
    .into_response())
}

/// Streams of several choices, merged, each event tagged with its choice index.
fn merged(
    streams: Vec<InferStream>,
) -> impl futures::Stream<Item = (usize, Result<InferStreamResponse, InferError>)> {
    futures::stream::select_all(
        streams
            .into_iter()
            .enumerate()
            .map(|(i, s)| s.map(move |e| (i, e)).boxed()),
    )
}

/// The chat SSE stream: a role chunk per choice, content chunks, a finish chunk per choice,
/// the usage chunk (when `usage_prompt_tokens` is set), then `[DONE]`.
fn chat_stream(
    meta: Meta,
    permits: Vec<OwnedSemaphorePermit>,
    streams: Vec<InferStream>,
    logprobs: bool,
    usage_prompt_tokens: Option<u32>,
) -> impl futures::Stream<Item = Result<Event, Infallible>> {
    let usage_null = usage_prompt_tokens.map(|_| None);
    let n = streams.len();
    async_stream::stream! {
        let _permits = permits;
        let mut events = merged(streams);
        for index in 0..n {
            let delta = Delta { role: Some("assistant"), content: Some(String::new()) };
            let choice = ChunkChoice { index, delta, logprobs: None, finish_reason: None };
            yield Ok::<Event, Infallible>(meta.chat_chunk(vec![choice], usage_null));
        }
        let mut completion_tokens = 0;
        while let Some((index, event)) = events.next().await {
            let (token, top, end) = match event {
                Ok(InferStreamResponse::Prefill(_)) => continue,
                Ok(InferStreamResponse::Intermediate { token, top_tokens }) => (token, top_tokens, None),
                Ok(InferStreamResponse::End { token, top_tokens, generated_text, .. }) => {
                    completion_tokens += generated_text.generated_tokens;
                    (token, top_tokens, Some(generated_text.finish_reason.openai()))
                }
                Err(e) => {
                    yield Ok(json_event(&ApiError::from(e).openai_body()));
                    return;
                }
            };
            if logprobs || !token.text.is_empty() {
                let choice = ChunkChoice {
                    index,
                    logprobs: logprobs.then(|| ChatLogprobs { content: vec![chat_logprob(&token, &top)] }),
                    delta: Delta { role: None, content: Some(token.text) },
                    finish_reason: None,
                };
                yield Ok(meta.chat_chunk(vec![choice], usage_null));
            }
            if let Some(reason) = end {
                let choice = ChunkChoice { index, delta: Delta::default(), logprobs: None, finish_reason: Some(reason) };
                yield Ok(meta.chat_chunk(vec![choice], usage_null));
            }
        }
        if let Some(prompt_tokens) = usage_prompt_tokens {
            yield Ok(meta.chat_chunk(Vec::new(), Some(Some(Usage::new(prompt_tokens, completion_tokens)))));
        }
        yield Ok(done_event());
    }
}

/// A validated completions request: the requests to run, in choice order, and what the
/// responses need.
struct CompletionPlan {
    requests: Vec<ValidGenerateRequest>,
    prompts: Vec<String>,
    prompt_tokens: u32,
    n: usize,
}

async fn plan_completions(
    state: &AppState,
    req: &CompletionRequest,
) -> Result<CompletionPlan, ValidationError> {
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
    let constraint = req.constraints.constrained()?;
    check_pattern("guided_regex", constraint.as_ref()).await?;
    let top = req.logprobs.unwrap_or(0);
    validate_openai_sampling(None, Some(("logprobs", top, 5)))?;
    let n = req.sampling.n.unwrap_or(1);
    state.validation().validate_n("n", n)?;
    let echo = req.echo.unwrap_or(false);
    let prompts: Vec<Prompt> = match &req.prompt {
        PromptInput::Text(t) => vec![text_prompt(t)],
        PromptInput::Texts(v) => v.iter().map(|t| text_prompt(t)).collect(),
        PromptInput::Ids(ids) => vec![Prompt::Ids(ids.clone())],
        PromptInput::IdLists(v) => v.iter().cloned().map(Prompt::Ids).collect(),
    };
    if prompts.is_empty() {
        return Err(ValidationError::EmptyInput("prompt"));
    }
    state
        .validation()
        .validate_n("n", prompts.len() * n)
        .map_err(|_| ValidationError::TooMany {
            param: "prompt",
            max: state.validation().config().max_best_of,
            given: prompts.len() * n,
        })?;
    let mut parameters = req.sampling.parameters(
        Some(req.max_tokens.unwrap_or(16)),
        top,
        echo && req.logprobs.is_some(),
    )?;
    parameters.constraint = constraint;
    let mut plan = CompletionPlan {
        requests: Vec::new(),
        prompts: Vec::new(),
        prompt_tokens: 0,
        n,
    };
    for prompt in prompts {
        let input = GenerateInput {
            prompt,
            parameters: parameters.clone(),
            truncate: None,
        };
        let valid = state
            .validation()
            .validate(input)
            .instrument(tracing::info_span!("validation"))
            .await?;
        plan.prompt_tokens += valid.input_ids.len() as u32;
        plan.prompts.push(if echo {
            valid.inputs.clone()
        } else {
            String::new()
        });
        plan.requests.extend(samples(valid, n, req.sampling.seed));
    }
    Ok(plan)
}

fn text_prompt(text: &str) -> Prompt {
    Prompt::Text {
        text: text.to_owned(),
        add_special_tokens: true,
    }
}

fn completion_choice(
    index: usize,
    echo: &str,
    out: InferResponse,
    logprobs: bool,
) -> CompletionChoice {
    let logprobs = logprobs.then(|| {
        let mut lp = CompletionLogprobs::default();
        let mut offset = 0;
        if !echo.is_empty() {
            lp.prefill(&out.prefill, &mut offset);
            offset = echo.chars().count();
        }
        for (t, top) in out.tokens.iter().zip(&out.top_tokens) {
            lp.push(&t.text, Some(t.logprob), Some(top), &mut offset);
        }
        lp
    });
    CompletionChoice {
        text: format!("{echo}{}", out.generated_text.text),
        index,
        logprobs,
        finish_reason: Some(out.generated_text.finish_reason.openai()),
    }
}

/// `POST /v1/completions`.
pub(crate) async fn completions(
    State(state): State<AppState>,
    OpenAiJson(req): OpenAiJson<CompletionRequest>,
) -> Result<Response, OpenAiError> {
    check_model(&state, &req.model)?;
    let received = Instant::now();
    let plan = plan_completions(&state, &req).await?;
    crate::metrics::record_validation(received);
    let meta = Meta::new(&state, "cmpl");
    let logprobs = req.logprobs.is_some();
    if req.sampling.stream.unwrap_or(false) {
        let usage = req.sampling.include_usage().then_some(plan.prompt_tokens);
        let (permits, streams) = launch(&state, plan.requests).await?;
        let stream = completion_stream(
            meta,
            permits,
            streams,
            plan.prompts,
            plan.n,
            logprobs,
            usage,
        );
        return Ok(sse(stream));
    }
    let outputs = run_all(&state, plan.requests).await?;
    let completion_tokens = outputs
        .iter()
        .map(|o| o.generated_text.generated_tokens)
        .sum();
    let choices = outputs
        .into_iter()
        .enumerate()
        .map(|(index, out)| completion_choice(index, &plan.prompts[index / plan.n], out, logprobs))
        .collect();
    let usage = Usage::new(plan.prompt_tokens, completion_tokens);
    Ok(Json(meta.completion(choices, Some(Some(usage)))).into_response())
}

/// The completions SSE stream: text chunks per choice (the echoed prompt first), the last
/// with `finish_reason`, the usage chunk (when `usage_prompt_tokens` is set), then `[DONE]`.
fn completion_stream(
    meta: Meta,
    permits: Vec<OwnedSemaphorePermit>,
    streams: Vec<InferStream>,
    echoes: Vec<String>,
    n: usize,
    logprobs: bool,
    usage_prompt_tokens: Option<u32>,
) -> impl futures::Stream<Item = Result<Event, Infallible>> {
    let usage_null = usage_prompt_tokens.map(|_| None);
    let choices = streams.len();
    async_stream::stream! {
        let _permits = permits;
        let mut events = merged(streams);
        let mut offsets = vec![0usize; choices];
        let mut echoed = vec![false; choices];
        let mut completion_tokens = 0;
        while let Some((index, event)) = events.next().await {
            let echo = &echoes[index / n];
            let mut lp = CompletionLogprobs::default();
            let (text, finish_reason) = match event {
                Ok(InferStreamResponse::Prefill(prefill)) => {
                    lp.prefill(&prefill, &mut offsets[index]);
                    echoed[index] = true;
                    (echo.clone(), None)
                }
                Ok(InferStreamResponse::Intermediate { token, top_tokens }) => {
                    lp.push(&token.text, Some(token.logprob), Some(&top_tokens), &mut offsets[index]);
                    (token.text, None)
                }
                Ok(InferStreamResponse::End { token, top_tokens, generated_text, .. }) => {
                    completion_tokens += generated_text.generated_tokens;
                    lp.push(&token.text, Some(token.logprob), Some(&top_tokens), &mut offsets[index]);
                    (token.text, Some(generated_text.finish_reason.openai()))
                }
                Err(e) => {
                    yield Ok::<Event, Infallible>(json_event(&ApiError::from(e).openai_body()));
                    return;
                }
            };
            // Without a prefill event (no logprobs), the echo goes before the first token.
            let text = if echoed[index] || echo.is_empty() {
                text
            } else {
                echoed[index] = true;
                format!("{echo}{text}")
            };
            if text.is_empty() && finish_reason.is_none() && !logprobs {
                continue;
            }
            let choice = CompletionChoice { text, index, logprobs: logprobs.then_some(lp), finish_reason };
            yield Ok(json_event(&meta.completion(vec![choice], usage_null)));
        }
        if let Some(prompt_tokens) = usage_prompt_tokens {
            let usage = Usage::new(prompt_tokens, completion_tokens);
            yield Ok(json_event(&meta.completion(Vec::new(), Some(Some(usage)))));
        }
        yield Ok(done_event());
    }
}

/// `GET /v1/models`.
pub(crate) async fn models(State(state): State<AppState>) -> Json<serde_json::Value> {
    Json(serde_json::json!({
        "object": "list",
        "data": [{
            "id": state.served_model_name(),
            "object": "model",
            "created": state.created(),
            "owned_by": "tessera",
            "max_model_len": state.validation().config().max_total_tokens,
        }]
    }))
}
