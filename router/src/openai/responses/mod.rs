//! `POST /v1/responses`: OpenAI's Responses API, stateless. The request is translated into
//! the chat request it means, validated and run as chat is; the output is read by the same
//! splitter into `reasoning`, `message` and `function_call` items.

mod request;
mod stream;

use std::time::Instant;

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

pub use self::request::{ResponsesInput, ResponsesRequest, TextFormat, TextOptions};
pub use self::stream::ResponsesStreamEvent;
use super::{launch, run_all};
use crate::assistant::{OutputSplitter, ParsedCall, Piece};
use crate::error::{OpenAiError, OpenAiJson};
use crate::sse::sse;
use crate::state::AppState;
use crate::validation::random_u64;

/// `POST /v1/responses`.
pub(crate) async fn responses(
    State(state): State<AppState>,
    OpenAiJson(req): OpenAiJson<ResponsesRequest>,
) -> Result<Response, OpenAiError> {
    let received = Instant::now();
    let chat = req.to_chat()?;
    let valid = super::validate_chat(&state, &chat, received).await?;
    let shell = ResponseShell::new(&state, &req);
    if valid.reply.stream {
        let launched = launch(&state, valid.samples).await?;
        let events = stream::events(shell, launched, valid.reading, valid.prompt_tokens);
        return Ok(sse(events));
    }
    let outputs = run_all(&state, valid.samples).await?;
    let Some(output) = outputs.into_iter().next() else {
        return Err(crate::error::ApiError::BadRequest("no output".into()).into());
    };
    let pieces = OutputSplitter::read_whole(valid.reading, &output.generated_text.text);
    let items = OutputItems::from_pieces(pieces);
    let usage = usage(valid.prompt_tokens, output.generated_text.generated_tokens);
    let length = output.generated_text.finish_reason.openai() == "length";
    Ok(Json(shell.finished(items.0, usage, length)).into_response())
}

/// A `response` object, whole or as a stream event carries it. Output items and usage are
/// OpenAI's shapes (`message`, `function_call`, `reasoning`).
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub struct ResponseObject {
    /// `resp_…`.
    pub id: String,
    /// Always `"response"`.
    pub object: &'static str,
    /// Unix seconds.
    pub created_at: u64,
    /// `in_progress`, `completed`, or `incomplete` (the length limit ended it).
    pub status: &'static str,
    /// Always null (failures are HTTP errors or an `error` event).
    pub error: Option<Value>,
    /// `{"reason": "max_output_tokens"}` when incomplete.
    pub incomplete_details: Option<Value>,
    /// The output items.
    pub output: Vec<Value>,
    /// Token counts (null until the end of a stream).
    pub usage: Option<Value>,
    /// The served model.
    pub model: String,
    /// As sent.
    pub instructions: Option<String>,
    /// As sent.
    pub tools: Vec<Value>,
    /// As sent (default `auto`).
    pub tool_choice: Value,
    /// As sent (default true).
    pub parallel_tool_calls: bool,
    /// As sent.
    pub max_output_tokens: Option<u32>,
    /// As sent (default 1).
    pub temperature: f32,
    /// As sent (default 1).
    pub top_p: f32,
    /// `{"format": …}` as sent (default text).
    pub text: Value,
    /// As sent.
    pub metadata: Value,
    /// Always false: nothing is kept.
    pub store: bool,
    /// Always `"disabled"`.
    pub truncation: &'static str,
}

/// The fields of a response that do not depend on its output.
#[derive(Debug, Clone)]
pub(super) struct ResponseShell(ResponseObject);

impl ResponseShell {
    fn new(state: &AppState, req: &ResponsesRequest) -> Self {
        let created_at = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let format = req.text.as_ref().and_then(|t| t.format.as_ref()).map_or(
            json!({"type": "text"}),
            |f| json!({"type": f.kind, "name": f.name, "schema": f.schema, "strict": f.strict}),
        );
        Self(ResponseObject {
            id: format!("resp_{:016x}{:016x}", random_u64(), random_u64()),
            object: "response",
            created_at,
            status: "in_progress",
            error: None,
            incomplete_details: None,
            output: Vec::new(),
            usage: None,
            model: state.served_model_name().to_owned(),
            instructions: req.instructions.clone(),
            tools: req.tools.clone().unwrap_or_default(),
            tool_choice: req.tool_choice.clone().unwrap_or(json!("auto")),
            parallel_tool_calls: req.parallel_tool_calls.unwrap_or(true),
            max_output_tokens: req.max_output_tokens,
            temperature: req.temperature.unwrap_or(1.0),
            top_p: req.top_p.unwrap_or(1.0),
            text: json!({"format": format}),
            metadata: req.metadata.clone().unwrap_or(json!({})),
            store: false,
            truncation: "disabled",
        })
    }

    /// The response before any output.
    fn started(&self) -> ResponseObject {
        self.0.clone()
    }

    /// A finished response: `completed`, or `incomplete` when the length limit ended it.
    fn finished(&self, output: Vec<Value>, usage: Value, length: bool) -> ResponseObject {
        ResponseObject {
            status: if length { "incomplete" } else { "completed" },
            incomplete_details: length.then(|| json!({"reason": "max_output_tokens"})),
            output,
            usage: Some(usage),
            ..self.0.clone()
        }
    }
}

/// `usage` of a response.
fn usage(input_tokens: u32, output_tokens: u32) -> Value {
    json!({
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": input_tokens + output_tokens,
    })
}

/// A reasoning item.
fn reasoning_item(id: &str, text: &str) -> Value {
    json!({"type": "reasoning", "id": id, "summary": [],
           "content": [{"type": "reasoning_text", "text": text}], "status": "completed"})
}

/// A message item with one `output_text` part.
fn message_item(id: &str, text: &str, status: &str) -> Value {
    json!({"type": "message", "id": id, "role": "assistant", "status": status,
           "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]})
}

/// A function call item.
fn call_item(id: &str, call_id: &str, call: &ParsedCall, status: &str) -> Value {
    json!({"type": "function_call", "id": id, "call_id": call_id, "name": call.name,
           "arguments": call.arguments, "status": status})
}

fn item_id(prefix: &str) -> String {
    format!("{prefix}_{:016x}{:08x}", random_u64(), random_u64() as u32)
}

/// A whole output's items in the order the model wrote them: reasoning, text (adjacent
/// pieces joined into one message) and calls; an empty message when there is nothing else.
struct OutputItems(Vec<Value>);

impl OutputItems {
    fn from_pieces(pieces: Vec<Piece>) -> Self {
        enum Open {
            Reasoning(String),
            Text(String),
        }
        let close = |open: Option<Open>, items: &mut Vec<Value>| match open {
            Some(Open::Reasoning(t)) => items.push(reasoning_item(&item_id("rs"), &t)),
            Some(Open::Text(t)) => items.push(message_item(&item_id("msg"), &t, "completed")),
            None => {}
        };
        let mut items = Vec::new();
        let mut open = None;
        for piece in pieces {
            open = match (open, piece) {
                (Some(Open::Reasoning(mut a)), Piece::Reasoning(b)) => {
                    a.push_str(&b);
                    Some(Open::Reasoning(a))
                }
                (Some(Open::Text(mut a)), Piece::Content(b)) => {
                    a.push_str(&b);
                    Some(Open::Text(a))
                }
                (prev, Piece::Reasoning(t)) => {
                    close(prev, &mut items);
                    Some(Open::Reasoning(t))
                }
                (prev, Piece::Content(t)) => {
                    close(prev, &mut items);
                    Some(Open::Text(t))
                }
                (prev, Piece::Call(call)) => {
                    close(prev, &mut items);
                    items.push(call_item(
                        &item_id("fc"),
                        &item_id("call"),
                        &call,
                        "completed",
                    ));
                    None
                }
            };
        }
        close(open, &mut items);
        if items.is_empty() {
            items.push(message_item(&item_id("msg"), "", "completed"));
        }
        Self(items)
    }
}
