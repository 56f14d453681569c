//! The `message` object: the assistant's output, read by the chat splitter, as `thinking`,
//! `text` and `tool_use` content blocks in the order the model wrote them, with Anthropic's
//! stop reason and usage; and the `count_tokens` answer.

use serde::Serialize;
use serde_json::Value;

use crate::assistant::{ParsedCall, Piece};
use crate::infer::{FinishReason, GeneratedText};
use crate::state::AppState;
use crate::validation::random_u64;

/// A content block of a message.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentBlock {
    /// Answer text.
    Text {
        /// The text.
        text: String,
    },
    /// The model's reasoning (read with `--reasoning-parser`).
    Thinking {
        /// The reasoning text.
        thinking: String,
        /// Always empty: nothing is signed.
        signature: String,
    },
    /// A call of one of the request's tools.
    ToolUse {
        /// `toolu_…`, for the `tool_result` that answers it.
        id: String,
        /// The tool.
        name: String,
        /// Its input (the model's arguments; their text as a string if they are not JSON).
        input: Value,
    },
}

/// Why the message ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// The model ended its turn.
    EndTurn,
    /// `max_tokens` was reached.
    MaxTokens,
    /// One of `stop_sequences` was generated (named in `stop_sequence`).
    StopSequence,
    /// The model called tools and ended its turn.
    ToolUse,
}

/// `usage` of a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct MessageUsage {
    /// Tokens of the rendered prompt.
    pub input_tokens: u32,
    /// Generated tokens.
    pub output_tokens: u32,
    /// Always 0 (no prompt caching is billed).
    pub cache_creation_input_tokens: u32,
    /// Always 0.
    pub cache_read_input_tokens: u32,
}

impl MessageUsage {
    pub(super) fn new(input_tokens: u32, output_tokens: u32) -> Self {
        Self {
            input_tokens,
            output_tokens,
            cache_creation_input_tokens: 0,
            cache_read_input_tokens: 0,
        }
    }
}

/// `message` object, whole or (no content, no stop reason) as `message_start` carries it.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct Message {
    /// `msg_…`.
    pub id: String,
    /// Always `"message"`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// Always `"assistant"`.
    pub role: &'static str,
    /// The served model.
    pub model: String,
    /// The output's blocks.
    pub content: Vec<ContentBlock>,
    /// Null until the end of a stream.
    pub stop_reason: Option<StopReason>,
    /// The stop sequence that ended the message, if one did.
    pub stop_sequence: Option<String>,
    /// Token counts.
    pub usage: MessageUsage,
}

/// `POST /v1/messages/count_tokens` answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct TokenCount {
    /// Tokens of the prompt the conversation renders to.
    pub input_tokens: u32,
}

/// The fields of a message that do not depend on its output.
#[derive(Debug, Clone)]
pub(super) struct MessageShell {
    id: String,
    model: String,
    input_tokens: u32,
}

impl MessageShell {
    pub(super) fn new(state: &AppState, input_tokens: u32) -> Self {
        Self::named(state.served_model_name(), input_tokens)
    }

    pub(super) fn named(model: &str, input_tokens: u32) -> Self {
        Self {
            id: format!("msg_{:016x}{:016x}", random_u64(), random_u64()),
            model: model.to_owned(),
            input_tokens,
        }
    }

    pub(super) fn input_tokens(&self) -> u32 {
        self.input_tokens
    }

    /// The message before any output.
    pub(super) fn started(&self) -> Message {
        Message {
            id: self.id.clone(),
            kind: "message",
            role: "assistant",
            model: self.model.clone(),
            content: Vec::new(),
            stop_reason: None,
            stop_sequence: None,
            usage: MessageUsage::new(self.input_tokens, 0),
        }
    }

    /// The whole message of a finished output.
    pub(super) fn finished(
        &self,
        content: Vec<ContentBlock>,
        generated: &GeneratedText,
    ) -> Message {
        let called = content
            .iter()
            .any(|b| matches!(b, ContentBlock::ToolUse { .. }));
        let (stop_reason, stop_sequence) = stop_reason(generated, called);
        Message {
            content,
            stop_reason: Some(stop_reason),
            stop_sequence,
            usage: MessageUsage::new(self.input_tokens, generated.generated_tokens),
            ..self.started()
        }
    }
}

/// Why the output ended, and the stop sequence that ended it. A stop token id (which only
/// other APIs set) ends a turn as the end-of-sequence token does.
pub(super) fn stop_reason(generated: &GeneratedText, called: bool) -> (StopReason, Option<String>) {
    let end = if called {
        StopReason::ToolUse
    } else {
        StopReason::EndTurn
    };
    match (generated.finish_reason, &generated.stop_sequence) {
        (FinishReason::Length, _) => (StopReason::MaxTokens, None),
        (FinishReason::StopSequence, Some(s)) => (StopReason::StopSequence, Some(s.clone())),
        (FinishReason::StopSequence | FinishReason::EosToken, _) => (end, None),
    }
}

/// A call as a `tool_use` block with a fresh id.
pub(super) fn tool_use(call: ParsedCall) -> ContentBlock {
    ContentBlock::ToolUse {
        id: format!("toolu_{:016x}{:08x}", random_u64(), random_u64() as u32),
        name: call.name,
        input: serde_json::from_str(&call.arguments).unwrap_or(Value::String(call.arguments)),
    }
}

/// A whole output's blocks: adjacent text pieces (and reasoning pieces) joined into one block.
pub(super) fn blocks(pieces: Vec<Piece>) -> Vec<ContentBlock> {
    let mut out: Vec<ContentBlock> = Vec::new();
    for piece in pieces {
        match (out.last_mut(), piece) {
            (Some(ContentBlock::Text { text }), Piece::Content(more)) => text.push_str(&more),
            (Some(ContentBlock::Thinking { thinking, .. }), Piece::Reasoning(more)) => {
                thinking.push_str(&more)
            }
            (_, Piece::Content(text)) => out.push(ContentBlock::Text { text }),
            (_, Piece::Reasoning(thinking)) => out.push(ContentBlock::Thinking {
                thinking,
                signature: String::new(),
            }),
            (_, Piece::Call(call)) => out.push(tool_use(call)),
        }
    }
    out
}
