//! The Responses API's event stream, as the OpenAI SDK accumulates it: `response.created`,
//! then per output item `output_item.added`, its deltas and `output_item.done`, then
//! `response.completed` with the whole response (`status: incomplete` when the length limit
//! ended it).

use std::convert::Infallible;

use axum::response::sse::Event;
use futures::StreamExt;
use serde_json::{Value, json};

use super::{ResponseShell, call_item, item_id, message_item, reasoning_item, usage};
use crate::assistant::{OutputReading, OutputSplitter, ParsedCall, Piece};
use crate::error::ApiError;
use crate::infer::InferStreamResponse;
use crate::openai::Launched;

/// One event of a Responses stream; its `type` says which fields it carries
/// (`response`, `item`, `delta`, `text`, `arguments`, …).
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub struct ResponsesStreamEvent {
    /// `response.created`, `response.output_text.delta`, …, `response.completed`.
    #[serde(rename = "type")]
    pub kind: String,
    /// 0, 1, 2, … in the order sent.
    pub sequence_number: u64,
    /// The event's own fields.
    #[serde(flatten)]
    #[schema(value_type = Object)]
    pub fields: serde_json::Map<String, Value>,
}

/// The item being written, when it is text.
#[derive(Debug)]
struct OpenItem {
    reasoning: bool,
    id: String,
    index: usize,
    text: String,
}

/// Turns pieces of output into events, numbering them.
#[derive(Debug, Default)]
struct Emitter {
    sequence: u64,
    done: Vec<Value>,
    open: Option<OpenItem>,
}

impl Emitter {
    fn event(&mut self, kind: &str, body: Value) -> Event {
        let event = ResponsesStreamEvent {
            kind: kind.to_owned(),
            sequence_number: self.sequence,
            fields: match body {
                Value::Object(fields) => fields,
                _ => serde_json::Map::new(),
            },
        };
        self.sequence += 1;
        Event::default()
            .event(kind)
            .data(serde_json::to_string(&event).unwrap_or_default())
    }

    fn piece(&mut self, piece: Piece) -> Vec<Event> {
        match piece {
            Piece::Reasoning(t) => self.text(true, &t),
            Piece::Content(t) => self.text(false, &t),
            Piece::Call(call) => self.call(&call),
        }
    }

    fn text(&mut self, reasoning: bool, delta: &str) -> Vec<Event> {
        let mut out = Vec::new();
        if self.open.as_ref().is_some_and(|o| o.reasoning != reasoning) {
            out.extend(self.close());
        }
        if self.open.is_none() {
            let index = self.done.len();
            let id = item_id(if reasoning { "rs" } else { "msg" });
            let item = if reasoning {
                let mut item = reasoning_item(&id, "");
                item["status"] = json!("in_progress");
                item["content"] = json!([]);
                item
            } else {
                let mut item = message_item(&id, "", "in_progress");
                item["content"] = json!([]);
                item
            };
            out.push(self.event(
                "response.output_item.added",
                json!({"output_index": index, "item": item}),
            ));
            let part = if reasoning {
                json!({"type": "reasoning_text", "text": ""})
            } else {
                json!({"type": "output_text", "text": "", "annotations": [], "logprobs": []})
            };
            out.push(self.event(
                "response.content_part.added",
                json!({"item_id": id, "output_index": index, "content_index": 0, "part": part}),
            ));
            self.open = Some(OpenItem {
                reasoning,
                id,
                index,
                text: String::new(),
            });
        }
        let Some(open) = self.open.as_mut() else {
            return out;
        };
        open.text.push_str(delta);
        let (id, index) = (open.id.clone(), open.index);
        let kind = if reasoning {
            "response.reasoning_text.delta"
        } else {
            "response.output_text.delta"
        };
        out.push(self.event(
            kind,
            json!({"item_id": id, "output_index": index, "content_index": 0, "delta": delta,
                   "logprobs": []}),
        ));
        out
    }

    fn call(&mut self, call: &ParsedCall) -> Vec<Event> {
        let mut out = self.close();
        let index = self.done.len();
        let (id, call_id) = (item_id("fc"), item_id("call"));
        let pending = ParsedCall {
            name: call.name.clone(),
            arguments: String::new(),
        };
        let added = call_item(&id, &call_id, &pending, "in_progress");
        out.push(self.event(
            "response.output_item.added",
            json!({"output_index": index, "item": added}),
        ));
        out.push(self.event(
            "response.function_call_arguments.delta",
            json!({"item_id": id, "output_index": index, "delta": call.arguments}),
        ));
        out.push(self.event(
            "response.function_call_arguments.done",
            json!({"item_id": id, "output_index": index, "arguments": call.arguments,
                   "name": call.name}),
        ));
        let item = call_item(&id, &call_id, call, "completed");
        out.push(self.event(
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        ));
        self.done.push(item);
        out
    }

    /// Closes the open text item.
    fn close(&mut self) -> Vec<Event> {
        let Some(open) = self.open.take() else {
            return Vec::new();
        };
        let (id, index, text) = (open.id, open.index, open.text);
        let (done_kind, part, item) = if open.reasoning {
            (
                "response.reasoning_text.done",
                json!({"type": "reasoning_text", "text": text}),
                reasoning_item(&id, &text),
            )
        } else {
            (
                "response.output_text.done",
                json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []}),
                message_item(&id, &text, "completed"),
            )
        };
        let mut out = vec![self.event(
            done_kind,
            json!({"item_id": id, "output_index": index, "content_index": 0, "text": text,
                   "logprobs": []}),
        )];
        out.push(self.event(
            "response.content_part.done",
            json!({"item_id": id, "output_index": index, "content_index": 0, "part": part}),
        ));
        out.push(self.event(
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        ));
        self.done.push(item);
        out
    }
}

/// The events of one response.
pub(super) fn events(
    shell: ResponseShell,
    launched: Launched,
    reading: OutputReading,
    prompt_tokens: u32,
) -> impl futures::Stream<Item = Result<Event, Infallible>> {
    let Launched { permits, streams } = launched;
    async_stream::stream! {
        let _permits = permits;
        let mut emitter = Emitter::default();
        let mut splitter = OutputSplitter::new(reading);
        let start = shell.started();
        yield Ok::<Event, Infallible>(emitter.event("response.created", json!({"response": start.clone()})));
        yield Ok(emitter.event("response.in_progress", json!({"response": start})));
        let Some(mut stream) = streams.into_iter().next() else {
            return;
        };
        while let Some(event) = stream.next().await {
            let (text, end) = match event {
                // A generation request never pools.
                Ok(InferStreamResponse::Prefill(_) | InferStreamResponse::Pooled { .. }) => continue,
                Ok(InferStreamResponse::Intermediate { token, .. }) => (token.text, None),
                Ok(InferStreamResponse::End { token, generated_text, .. }) => (token.text, Some(generated_text)),
                Err(e) => {
                    let error = ApiError::from(e).openai_body();
                    yield Ok(emitter.event("error", json!({"message": error["error"]["message"], "code": error["error"]["code"]})));
                    return;
                }
            };
            let mut pieces = splitter.push(&text);
            if end.is_some() {
                pieces.extend(splitter.finish());
            }
            for piece in pieces {
                for e in emitter.piece(piece) {
                    yield Ok(e);
                }
            }
            if let Some(generated) = end {
                if emitter.done.is_empty() && emitter.open.is_none() {
                    for e in emitter.text(false, "") {
                        yield Ok(e);
                    }
                }
                for e in emitter.close() {
                    yield Ok(e);
                }
                let length = generated.finish_reason.openai() == "length";
                let usage = usage(prompt_tokens, generated.generated_tokens);
                let response = shell.finished(std::mem::take(&mut emitter.done), usage, length);
                // As vLLM does: `completed` even when the length limit ended it (the status
                // says so), since SDKs finish a stream only on that event.
                yield Ok(emitter.event("response.completed", json!({"response": response})));
                return;
            }
        }
    }
}
