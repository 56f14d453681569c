//! The OpenAI response bodies: chat completions and text completions, whole and streamed,
//! and the fields every response of a request shares.

use serde::Serialize;

use super::logprobs::{ChatLogprobs, CompletionLogprobs};
use crate::state::AppState;
use crate::validation::random_u64;

/// `usage`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Usage {
    /// Prompt tokens (each prompt counted once).
    pub prompt_tokens: u32,
    /// Generated tokens over all choices.
    pub completion_tokens: u32,
    /// The sum.
    pub total_tokens: u32,
}

impl Usage {
    /// The counts and their sum.
    pub(super) fn new(prompt_tokens: u32, completion_tokens: u32) -> Self {
        Self {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
        }
    }
}

/// The assistant's message.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct AssistantMessage {
    /// Always `"assistant"`.
    pub role: &'static str,
    /// The answer's text (null when the message is only tool calls).
    pub content: Option<String>,
    /// The model's thinking, with `--reasoning-parser` (vLLM's current name).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<String>,
    /// The same thinking under its earlier name, which other clients still read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// The calls the model made.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
}

/// A tool call in a message.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ToolCall {
    /// `call_…`, unique in the response.
    pub id: String,
    /// Always `"function"`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The function and its arguments.
    pub function: FunctionCall,
}

/// The function of a tool call.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct FunctionCall {
    /// Its name.
    pub name: String,
    /// Its arguments as JSON text.
    pub arguments: String,
}

/// A streamed piece of a tool call: the first has its id, type and name, the next ones
/// fragments of its arguments.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ToolCallDelta {
    /// Which call of the message (0-based).
    pub index: usize,
    /// On the call's first delta.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// `"function"`, on the call's first delta.
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    /// The name (first delta) or an arguments fragment.
    pub function: FunctionCallDelta,
}

/// The function part of a [`ToolCallDelta`].
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct FunctionCallDelta {
    /// On the call's first delta.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// A fragment of the arguments' text.
    pub arguments: String,
}

/// One choice of a chat completion.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ChatChoice {
    /// Choice index.
    pub index: usize,
    /// The message.
    pub message: AssistantMessage,
    /// Token logprobs, when asked for.
    pub logprobs: Option<ChatLogprobs>,
    /// `"stop"`, `"length"` or `"tool_calls"`.
    pub finish_reason: &'static str,
}

/// `chat.completion` object.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
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
#[derive(Debug, Clone, Default, Serialize, utoipa::ToSchema)]
pub struct Delta {
    /// `"assistant"` on the first chunk of a choice.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    /// New text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// New thinking, with `--reasoning-parser` (vLLM's current name).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<String>,
    /// The same thinking under its earlier name, which other clients still read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// Tool-call pieces.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallDelta>>,
}

/// One choice of a chat chunk.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
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
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
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

/// One choice of a text completion (also the streamed chunk's choice).
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
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
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
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
pub(super) struct Meta {
    /// `{prefix}-` and 32 random hex digits.
    pub(super) id: String,
    /// Unix seconds.
    pub(super) created: u64,
    /// The served model's name.
    pub(super) model: String,
    /// Backend configuration fingerprint.
    pub(super) system_fingerprint: String,
}

impl Meta {
    /// The fields of a new response, its id prefixed with `prefix` (`chatcmpl`, `cmpl`).
    pub(super) fn new(state: &AppState, prefix: &str) -> Self {
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

    /// A `chat.completion.chunk` of this response.
    pub(super) fn chat_chunk(
        &self,
        choices: Vec<ChunkChoice>,
        usage: Option<Option<Usage>>,
    ) -> ChatCompletionChunk {
        ChatCompletionChunk {
            id: self.id.clone(),
            object: "chat.completion.chunk",
            created: self.created,
            model: self.model.clone(),
            system_fingerprint: self.system_fingerprint.clone(),
            choices,
            usage,
        }
    }

    /// A `text_completion` of this response (whole or chunk).
    pub(super) fn completion(
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
