//! The `/v1/messages` and `/v1/messages/count_tokens` bodies, and their translation into the
//! chat request they mean: `system` is a system message, text blocks are a turn's text,
//! `tool_use` blocks an assistant's `tool_calls`, `tool_result` blocks `tool` messages (tools
//! and choices: `tools.rs`). Content is read from JSON values, not typed, so that an
//! unsupported block is refused by name rather than by a parse error.

use std::collections::HashMap;

use serde::Deserialize;
use serde_json::{Value, json};

use super::tools::{chat_tool_choice, chat_tools, thinking_kwargs};
use crate::openai::{
    ChatCompletionRequest, MessageContent, OutputConstraints, RequestMessage, SamplingFields,
    StopSpec,
};
use crate::validation::ValidationError;

/// Most content blocks a request may hold, over `system` and every message (a string content
/// counts as one block, a `tool_result`'s blocks count too).
pub(super) const MAX_BLOCKS: usize = 8192;

/// [`MAX_BLOCKS`] in words.
const MAX_BLOCKS_BOUND: &str = "at most 8192 content blocks over `system` and all messages";

/// Block types this server reads, for the messages that refuse the others.
const SUPPORTED: &str = "text, tool_use, tool_result, thinking, redacted_thinking";

/// `POST /v1/messages/count_tokens` body; also the conversation part of [`MessagesRequest`].
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
pub struct CountTokensRequest {
    /// Any name, or none (one model is served).
    pub model: Option<String>,
    /// A string or a list of text blocks, rendered as the system message.
    pub system: Option<Value>,
    /// `user` and `assistant` turns; content a string or a list of `text`, `tool_use`
    /// (assistant), `tool_result` (user) and `thinking` blocks.
    pub messages: Vec<InputMessage>,
    /// Custom tools: `{"name", "description", "input_schema"}`.
    pub tools: Option<Vec<Value>>,
    /// `{"type": "auto" | "any" | "tool" | "none", "name", "disable_parallel_tool_use"}`.
    pub tool_choice: Option<Value>,
    /// `{"type": "enabled" | "disabled"}`: the template's `enable_thinking`
    /// (`budget_tokens` is not enforced).
    pub thinking: Option<Value>,
}

/// One turn of the conversation.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
pub struct InputMessage {
    /// `user` or `assistant`.
    pub role: String,
    /// A string or a list of content blocks.
    pub content: Value,
}

/// `POST /v1/messages` body.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
pub struct MessagesRequest {
    /// The conversation, its tools and thinking.
    #[serde(flatten)]
    pub conversation: CountTokensRequest,
    /// Most tokens to generate (required, as Anthropic's API requires it).
    pub max_tokens: u32,
    /// Strings that end the generation; the one that did is the response's `stop_sequence`.
    pub stop_sequences: Option<Vec<String>>,
    /// Default 1.
    pub temperature: Option<f32>,
    /// Nucleus sampling.
    pub top_p: Option<f32>,
    /// Keep the k likeliest tokens.
    pub top_k: Option<i64>,
    /// Answer with server-sent events.
    pub stream: Option<bool>,
    /// Accepted and ignored.
    pub metadata: Option<Value>,
}

impl MessagesRequest {
    /// The chat request this asks for.
    pub(super) fn to_chat(&self) -> Result<ChatCompletionRequest, ValidationError> {
        let mut chat = self.conversation.to_chat()?;
        chat.max_tokens = Some(self.max_tokens);
        chat.sampling = SamplingFields {
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            stop: self.stop_sequences.clone().map(StopSpec::Many),
            stream: self.stream,
            ..SamplingFields::default()
        };
        Ok(chat)
    }
}

impl CountTokensRequest {
    /// The chat request of this conversation (no generation fields).
    pub(super) fn to_chat(&self) -> Result<ChatCompletionRequest, ValidationError> {
        let blocks = self.block_count();
        if blocks > MAX_BLOCKS {
            return Err(ValidationError::out_of_range(
                "messages",
                MAX_BLOCKS_BOUND,
                format!("{blocks} blocks"),
            ));
        }
        let mut messages = Vec::new();
        if let Some(system) = &self.system {
            let text = blocks_text(system).map_err(|message| ValidationError::Constraint {
                param: "system",
                message,
            })?;
            // An empty system prompt is none (templates may then write their default one).
            if !text.is_empty() {
                messages.push(RequestMessage::text("system", Some(text)));
            }
        }
        let mut names = HashMap::new();
        for (index, m) in self.messages.iter().enumerate() {
            turn(m, &mut names, &mut messages)
                .map_err(|message| ValidationError::Message { index, message })?;
        }
        if let Some(index) = self.messages.len().checked_sub(1)
            && self.messages[index].role == "assistant"
        {
            return Err(ValidationError::Message {
                index,
                message: "a last `assistant` message (a prefill to continue) is not supported; \
                          end with a `user` message"
                    .into(),
            });
        }
        let (tool_choice, parallel_tool_calls) = match &self.tool_choice {
            Some(choice) => chat_tool_choice(choice)?,
            None => (None, None),
        };
        Ok(ChatCompletionRequest {
            model: self.model.clone(),
            messages,
            max_tokens: None,
            max_completion_tokens: None,
            logprobs: None,
            top_logprobs: None,
            tools: match &self.tools {
                Some(tools) => Some(chat_tools(tools)?),
                None => None,
            },
            tool_choice,
            parallel_tool_calls,
            functions: None,
            function_call: None,
            reasoning_effort: None,
            chat_template_kwargs: self.thinking.as_ref().map(thinking_kwargs).transpose()?,
            sampling: SamplingFields::default(),
            constraints: OutputConstraints::default(),
        })
    }

    /// Content blocks over `system` and every message, nested `tool_result` blocks included;
    /// a string is one block, and a message counts at least one.
    fn block_count(&self) -> usize {
        let count = |content: &Value| match content {
            Value::Array(blocks) => blocks
                .iter()
                .map(|b| {
                    1 + b
                        .get("content")
                        .and_then(Value::as_array)
                        .map_or(0, Vec::len)
                })
                .sum(),
            _ => 1,
        };
        let system = self.system.as_ref().map_or(0, count);
        let messages = self.messages.iter().map(|m| count(&m.content).max(1));
        messages.fold(system, usize::saturating_add)
    }
}

/// Adds `m`, joined to the message before it when both are plain turns of the same role
/// (Anthropic joins consecutive turns; strict templates refuse them).
fn push_turn(messages: &mut Vec<RequestMessage>, m: RequestMessage) {
    let plain = |m: &RequestMessage| matches!(m.role.as_str(), "user" | "assistant");
    match messages.last_mut() {
        Some(last) if last.role == m.role && plain(last) => {
            let text = |m: &RequestMessage| match &m.content {
                Some(MessageContent::Text(t)) => t.clone(),
                _ => String::new(),
            };
            let (before, after) = (text(last), text(&m));
            let joined = match (before.is_empty(), after.is_empty()) {
                (true, _) => after,
                (_, true) => before,
                _ => format!("{before}\n\n{after}"),
            };
            last.content = Some(MessageContent::Text(joined));
            if let Some(calls) = m.tool_calls {
                last.tool_calls.get_or_insert_with(Vec::new).extend(calls);
            }
            if let Some(thought) = m.reasoning {
                last.reasoning = Some(match last.reasoning.take() {
                    Some(before) => format!("{before}\n\n{thought}"),
                    None => thought,
                });
            }
        }
        _ => messages.push(m),
    }
}

/// One Anthropic turn as chat messages; what is wrong with it otherwise.
fn turn(
    m: &InputMessage,
    names: &mut HashMap<String, String>,
    out: &mut Vec<RequestMessage>,
) -> Result<(), String> {
    let assistant = match m.role.as_str() {
        "user" => false,
        "assistant" => true,
        other => {
            return Err(format!(
                "unknown role `{other}`; expected `user` or `assistant` (the system prompt goes \
                 in the top-level `system`)"
            ));
        }
    };
    let blocks = match &m.content {
        Value::String(text) => {
            push_turn(out, RequestMessage::text(&m.role, Some(text.clone())));
            return Ok(());
        }
        Value::Array(blocks) => blocks,
        _ => return Err("`content` must be a string or a list of content blocks".into()),
    };
    let mut text = Vec::new();
    let mut thinking = Vec::new();
    let mut calls = Vec::new();
    for (i, block) in blocks.iter().enumerate() {
        let at = |e: String| format!("`content[{i}]`: {e}");
        match (block_type(block).map_err(at)?, assistant) {
            ("text", _) => text.push(block_text(block).map_err(at)?),
            ("thinking", true) => {
                if let Some(t) = block.get("thinking").and_then(Value::as_str) {
                    thinking.push(t.to_owned());
                }
            }
            ("redacted_thinking", true) => {}
            ("tool_use", true) => calls.push(tool_use(block, names).map_err(at)?),
            ("tool_result", false) => {
                if !text.is_empty() {
                    push_turn(out, RequestMessage::text("user", Some(text.join("\n\n"))));
                    text.clear();
                }
                out.push(tool_result(block, names).map_err(at)?);
            }
            (kind @ ("thinking" | "redacted_thinking" | "tool_use"), false) => {
                return Err(at(format!(
                    "`{kind}` blocks belong to `assistant` messages"
                )));
            }
            ("tool_result", true) => {
                return Err(at("`tool_result` blocks belong to `user` messages".into()));
            }
            (kind, _) => return Err(at(unsupported(kind))),
        }
    }
    // A turn of only results (sent above) or only thinking adds no message; thinking rides
    // with the turn's answer, where the template shows it.
    if !text.is_empty() || !calls.is_empty() || blocks.is_empty() {
        let mut m = RequestMessage::text(&m.role, Some(text.join("\n\n")));
        m.tool_calls = (!calls.is_empty()).then_some(calls);
        m.reasoning = (!thinking.is_empty()).then(|| thinking.join("\n\n"));
        push_turn(out, m);
    }
    Ok(())
}

fn unsupported(kind: &str) -> String {
    format!("content blocks of type `{kind}` are not supported; this server reads {SUPPORTED}")
}

fn block_type(block: &Value) -> Result<&str, String> {
    block
        .get("type")
        .and_then(Value::as_str)
        .ok_or_else(|| "a content block needs a string `type`".into())
}

fn block_text(block: &Value) -> Result<String, String> {
    block
        .get("text")
        .and_then(Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| "a `text` block needs a string `text`".into())
}

/// A string, or the text of a list of text blocks (joined by blank lines); errors name the
/// block by its index in the list.
fn blocks_text(content: &Value) -> Result<String, String> {
    match content {
        Value::String(text) => Ok(text.clone()),
        Value::Array(blocks) => {
            let mut texts = Vec::with_capacity(blocks.len());
            for (i, block) in blocks.iter().enumerate() {
                let at = |e: String| format!("[{i}]: {e}");
                match block_type(block).map_err(at)? {
                    "text" => texts.push(block_text(block).map_err(at)?),
                    kind => return Err(at(unsupported(kind))),
                }
            }
            Ok(texts.join("\n\n"))
        }
        _ => Err("must be a string or a list of text blocks".into()),
    }
}

/// A `tool_use` block as a chat tool call (its id remembered with its name, for the results).
fn tool_use(block: &Value, names: &mut HashMap<String, String>) -> Result<Value, String> {
    let field = |key: &str| {
        block
            .get(key)
            .and_then(Value::as_str)
            .ok_or_else(|| format!("a `tool_use` block needs a string `{key}`"))
    };
    let (id, name) = (field("id")?, field("name")?);
    let input = match block.get("input") {
        None | Some(Value::Null) => json!({}),
        Some(input @ Value::Object(_)) => input.clone(),
        Some(_) => return Err("a `tool_use` block's `input` must be an object".into()),
    };
    names.insert(id.to_owned(), name.to_owned());
    Ok(json!({"id": id, "type": "function", "function": {"name": name, "arguments": input}}))
}

/// A `tool_result` block as a `tool` message; an error result's text says so.
fn tool_result(block: &Value, names: &HashMap<String, String>) -> Result<RequestMessage, String> {
    let id = block
        .get("tool_use_id")
        .and_then(Value::as_str)
        .ok_or("a `tool_result` block needs a string `tool_use_id`")?;
    let mut text = match block.get("content") {
        None | Some(Value::Null) => String::new(),
        Some(content) => blocks_text(content).map_err(|e| format!("its `content` {e}"))?,
    };
    if block.get("is_error").and_then(Value::as_bool) == Some(true) {
        text.insert_str(0, "Error: ");
    }
    let mut m = RequestMessage::text("tool", Some(text));
    m.tool_call_id = Some(id.to_owned());
    m.name = names.get(id).cloned();
    Ok(m)
}
