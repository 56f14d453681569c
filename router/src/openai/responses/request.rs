//! The `/v1/responses` request body, and its translation into the chat request it means (the
//! Responses API is chat with another shape: input items are messages, function calls and
//! their outputs; `text.format` is `response_format`).

use serde::Deserialize;
use serde_json::{Value, json};

use crate::openai::request::{
    ChatCompletionRequest, ContentPart, OutputConstraints, RequestMessage, ResponseFormat,
    SamplingFields,
};
use crate::openai::{JsonSchemaFormat, StreamOptions};
use crate::validation::ValidationError;

/// `POST /v1/responses` body.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
pub struct ResponsesRequest {
    /// Any name, or none (one model is served).
    pub model: Option<String>,
    /// A user message, or a list of input items.
    pub input: ResponsesInput,
    /// A system message put first.
    pub instructions: Option<String>,
    /// Function tools: `{"type": "function", "name", "description", "parameters", "strict"}`.
    pub tools: Option<Vec<Value>>,
    /// `"none"`, `"auto"`, `"required"` or `{"type": "function", "name": …}`.
    pub tool_choice: Option<Value>,
    /// `false`: at most one call.
    pub parallel_tool_calls: Option<bool>,
    /// Most tokens to generate.
    pub max_output_tokens: Option<u32>,
    /// In [0, 2]; default 1.
    pub temperature: Option<f32>,
    /// Nucleus sampling.
    pub top_p: Option<f32>,
    /// Answer with server-sent events.
    pub stream: Option<bool>,
    /// `{"format": {"type": "text" | "json_object" | "json_schema", …}}`.
    pub text: Option<TextOptions>,
    /// Refused: this server keeps no responses.
    pub previous_response_id: Option<String>,
    /// Only `false` (or absent) is accepted: this server keeps no responses.
    pub store: Option<bool>,
    /// Echoed back.
    pub metadata: Option<Value>,
    /// `{"effort": "low" | "medium" | "high"}`: how much the model reasons (the chat
    /// template's `reasoning_effort`).
    pub reasoning: Option<ReasoningOptions>,
    /// Extension (vLLM): a seed for sampling.
    pub seed: Option<u64>,
}

/// `reasoning`.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
pub struct ReasoningOptions {
    /// `low`, `medium` or `high`.
    pub effort: Option<String>,
}

/// `input`.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum ResponsesInput {
    /// One user message.
    Text(String),
    /// Messages, function calls and function call outputs.
    Items(Vec<Value>),
}

/// `text`.
#[derive(Debug, Clone, Default, Deserialize, utoipa::ToSchema)]
pub struct TextOptions {
    /// The output's format.
    pub format: Option<TextFormat>,
}

/// `text.format`: the name and schema sit beside `type` (not under `json_schema`).
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
pub struct TextFormat {
    /// `text`, `json_object` or `json_schema`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The schema's name.
    pub name: Option<String>,
    /// The JSON Schema.
    pub schema: Option<Value>,
    /// Accepted; outputs always follow the schema.
    pub strict: Option<bool>,
}

impl ResponsesRequest {
    /// The chat request this asks for; errors for what this server does not keep or read.
    pub(super) fn to_chat(&self) -> Result<ChatCompletionRequest, ValidationError> {
        if self.previous_response_id.is_some() {
            return Err(ValidationError::Unsupported {
                param: "previous_response_id",
                reason: "this server keeps no responses; send the whole conversation as `input`",
            });
        }
        if self.store == Some(true) {
            return Err(ValidationError::Unsupported {
                param: "store",
                reason: "this server keeps no responses; send `store: false` or leave it out",
            });
        }
        let mut messages = Vec::new();
        if let Some(instructions) = &self.instructions {
            messages.push(RequestMessage::text("system", Some(instructions.clone())));
        }
        match &self.input {
            ResponsesInput::Text(text) => {
                messages.push(RequestMessage::text("user", Some(text.clone())))
            }
            ResponsesInput::Items(items) => {
                for (i, item) in items.iter().enumerate() {
                    input_item(item, &mut messages)
                        .map_err(|message| ValidationError::Message { index: i, message })?;
                }
            }
        }
        Ok(ChatCompletionRequest {
            model: self.model.clone(),
            messages,
            max_tokens: None,
            max_completion_tokens: self.max_output_tokens,
            logprobs: None,
            top_logprobs: None,
            tools: self
                .tools
                .as_ref()
                .map(|t| t.iter().map(chat_tool).collect()),
            tool_choice: self.tool_choice.as_ref().map(chat_tool_choice),
            parallel_tool_calls: self.parallel_tool_calls,
            functions: None,
            function_call: None,
            reasoning_effort: self.reasoning.as_ref().and_then(|r| r.effort.clone()),
            chat_template_kwargs: None,
            sampling: SamplingFields {
                temperature: self.temperature,
                top_p: self.top_p,
                seed: self.seed,
                stream: self.stream,
                stream_options: Some(StreamOptions {
                    include_usage: Some(true),
                }),
                ..SamplingFields::default()
            },
            constraints: OutputConstraints {
                response_format: self.text.as_ref().and_then(|t| t.format.as_ref()).map(|f| {
                    ResponseFormat {
                        kind: f.kind.clone(),
                        json_schema: Some(JsonSchemaFormat {
                            name: f.name.clone(),
                            description: None,
                            schema: f.schema.clone(),
                            strict: f.strict,
                        }),
                    }
                }),
                ..OutputConstraints::default()
            },
        })
    }
}

/// One input item as chat messages: a message, a function call (joined to the assistant
/// message before it, as chat carries calls), or a call's output (a tool message).
fn input_item(item: &Value, messages: &mut Vec<RequestMessage>) -> Result<(), String> {
    let kind = item
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("message");
    let text = |key: &str| item.get(key).and_then(Value::as_str).map(str::to_owned);
    match kind {
        "message" => {
            let role = text("role").ok_or("a message item needs a `role`")?;
            let content = match item.get("content") {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Array(parts)) => parts_text(parts)?,
                _ => return Err("a message item needs `content`".into()),
            };
            messages.push(RequestMessage::text(&role, Some(content)));
        }
        "function_call" => {
            let call = json!({
                "id": text("call_id").ok_or("a function_call item needs a `call_id`")?,
                "type": "function",
                "function": {
                    "name": text("name").ok_or("a function_call item needs a `name`")?,
                    "arguments": text("arguments").unwrap_or_else(|| "{}".into()),
                },
            });
            match messages.last_mut() {
                Some(last) if last.role == "assistant" => {
                    last.tool_calls.get_or_insert_with(Vec::new).push(call);
                }
                _ => {
                    let mut m = RequestMessage::text("assistant", None);
                    m.tool_calls = Some(vec![call]);
                    messages.push(m);
                }
            }
        }
        "function_call_output" => {
            let output = match item.get("output") {
                Some(Value::String(s)) => s.clone(),
                Some(other) => other.to_string(),
                None => return Err("a function_call_output item needs an `output`".into()),
            };
            let mut m = RequestMessage::text("tool", Some(output));
            m.tool_call_id = text("call_id");
            messages.push(m);
        }
        "reasoning" => {}
        other => {
            return Err(format!(
                "input items of type `{other}` are not supported (message, function_call, \
                 function_call_output)"
            ));
        }
    }
    Ok(())
}

/// The text of `input_text` / `output_text` parts, joined.
fn parts_text(parts: &[Value]) -> Result<String, String> {
    let mut out = String::new();
    for part in parts {
        let part: ContentPart = serde_json::from_value(part.clone())
            .map_err(|e| format!("a content part is malformed: {e}"))?;
        match (part.kind.as_str(), part.text) {
            ("input_text" | "output_text" | "text", Some(t)) => out.push_str(&t),
            (kind, _) => {
                return Err(format!(
                    "content parts of type `{kind}` are not supported (input_text, output_text)"
                ));
            }
        }
    }
    Ok(out)
}

/// A Responses function tool (`{"type": "function", "name", …}`) as a chat tool.
fn chat_tool(tool: &Value) -> Value {
    match tool.get("function") {
        Some(_) => tool.clone(),
        None => json!({
            "type": tool.get("type").cloned().unwrap_or(Value::Null),
            "function": {
                "name": tool.get("name").cloned().unwrap_or(Value::Null),
                "description": tool.get("description").cloned().unwrap_or(Value::Null),
                "parameters": tool.get("parameters").cloned().unwrap_or(Value::Null),
                "strict": tool.get("strict").cloned().unwrap_or(Value::Null),
            },
        }),
    }
}

/// A Responses tool choice (`{"type": "function", "name"}`) as a chat tool choice.
fn chat_tool_choice(choice: &Value) -> Value {
    match (choice.get("name"), choice.get("function")) {
        (Some(name), None) => json!({"type": "function", "function": {"name": name}}),
        _ => choice.clone(),
    }
}
