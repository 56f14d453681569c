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
use tracing::Instrument;

pub use self::request::{ResponsesInput, ResponsesRequest, TextFormat, TextOptions};
use super::{launch, run_all};
use crate::assistant::{OutputSplitter, ParsedCall, Piece};
use crate::error::{OpenAiError, OpenAiJson};
use crate::server::AppState;
use crate::sse::sse;
use crate::validation::random_u64;

/// `POST /v1/responses`.
pub(crate) async fn responses(
    State(state): State<AppState>,
    OpenAiJson(req): OpenAiJson<ResponsesRequest>,
) -> Result<Response, OpenAiError> {
    let received = Instant::now();
    let chat = req.to_chat()?;
    let valid = state
        .validation()
        .validate_chat(&chat)
        .instrument(tracing::info_span!("validation"))
        .await?;
    crate::metrics::record_validation(received);
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
    let mut splitter = OutputSplitter::new(valid.reading);
    let mut pieces = splitter.push(&output.generated_text.text);
    pieces.extend(splitter.finish());
    let items = OutputItems::from_pieces(pieces);
    let usage = usage(valid.prompt_tokens, output.generated_text.generated_tokens);
    let length = output.generated_text.finish_reason.openai() == "length";
    Ok(Json(shell.finished(items.0, usage, length)).into_response())
}

/// The fields of a response that do not depend on its output.
#[derive(Debug, Clone)]
pub(super) struct ResponseShell {
    id: String,
    created_at: u64,
    fields: Value,
}

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
        Self {
            id: format!("resp_{:016x}{:016x}", random_u64(), random_u64()),
            created_at,
            fields: json!({
                "model": state.served_model_name(),
                "instructions": req.instructions,
                "tools": req.tools.clone().unwrap_or_default(),
                "tool_choice": req.tool_choice.clone().unwrap_or(json!("auto")),
                "parallel_tool_calls": req.parallel_tool_calls.unwrap_or(true),
                "max_output_tokens": req.max_output_tokens,
                "temperature": req.temperature.unwrap_or(1.0),
                "top_p": req.top_p.unwrap_or(1.0),
                "text": {"format": format},
                "metadata": req.metadata.clone().unwrap_or(json!({})),
                "store": false,
                "truncation": "disabled",
            }),
        }
    }

    /// The response object in `status` with `output` so far.
    fn object(&self, status: &str, output: Vec<Value>, usage: Value, length: bool) -> Value {
        let mut object = json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": null,
            "incomplete_details": if length { json!({"reason": "max_output_tokens"}) } else { Value::Null },
            "output": output,
            "usage": usage,
        });
        if let (Some(o), Some(fields)) = (object.as_object_mut(), self.fields.as_object()) {
            o.extend(fields.clone());
        }
        object
    }

    /// A finished response: `completed`, or `incomplete` when the length limit ended it.
    fn finished(&self, output: Vec<Value>, usage: Value, length: bool) -> Value {
        let status = if length { "incomplete" } else { "completed" };
        self.object(status, output, usage, length)
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
