//! `POST /v1/chat/completions`: a conversation rendered with the chat template, `n` choices.

use std::time::Instant;

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};

use super::assistant_reply::whole_message;
use super::logprobs::{ChatLogprobs, chat_logprob};
use super::request::ChatCompletionRequest;
use super::response::{ChatChoice, ChatCompletion, Meta, Usage};
use super::streaming::chat_stream;
use super::{launch, run_all};
use crate::assistant::OutputReading;
use crate::error::{OpenAiError, OpenAiJson};
use crate::infer::InferResponse;
use crate::sse::sse;
use crate::state::AppState;
use crate::validation::OpenAiReply;

/// `POST /v1/chat/completions`.
pub(crate) async fn chat_completions(
    State(state): State<AppState>,
    OpenAiJson(req): OpenAiJson<ChatCompletionRequest>,
) -> Result<Response, OpenAiError> {
    let received = Instant::now();
    let valid = super::validate_chat(&state, &req, received).await?;
    let meta = Meta::new(&state, "chatcmpl");
    if valid.reply.stream {
        let launched = launch(&state, valid.samples).await?;
        let stream = chat_stream(
            meta,
            launched,
            valid.reply,
            valid.reading,
            valid.prompt_tokens,
        );
        return Ok(sse(stream));
    }
    let outputs = run_all(&state, valid.samples).await?;
    let completion_tokens = outputs
        .iter()
        .map(|o| o.generated_text.generated_tokens)
        .sum();
    Ok(Json(ChatCompletion {
        id: meta.id,
        object: "chat.completion",
        created: meta.created,
        model: meta.model,
        system_fingerprint: meta.system_fingerprint,
        choices: chat_choices(valid.reply, valid.reading, outputs),
        usage: Usage::new(valid.prompt_tokens, completion_tokens),
    })
    .into_response())
}

/// The choices of a finished request, in order, read as `reading` says, with the tokens'
/// logprobs when asked for.
fn chat_choices(
    reply: OpenAiReply,
    reading: OutputReading,
    outputs: Vec<InferResponse>,
) -> Vec<ChatChoice> {
    outputs
        .into_iter()
        .enumerate()
        .map(|(index, o)| {
            let (message, finish_reason) = whole_message(
                reading,
                &o.generated_text.text,
                o.generated_text.finish_reason.openai(),
            );
            ChatChoice {
                index,
                logprobs: reply.logprobs.then(|| ChatLogprobs {
                    content: o
                        .tokens
                        .iter()
                        .zip(&o.top_tokens)
                        .map(|(t, top)| chat_logprob(t, top))
                        .collect(),
                }),
                finish_reason,
                message,
            }
        })
        .collect()
}
