//! Anthropic's Messages API: `POST /v1/messages` and `POST /v1/messages/count_tokens`, so
//! that the `anthropic` SDKs (and the agents built on them) work with their base URL pointed
//! here. As the Responses API does, a request is translated into the chat request it means
//! ([`request`], [`tools`]), validated, rendered and run as chat is, and the output is read by
//! the same splitter into `thinking`, `text` and `tool_use` blocks ([`response`], [`stream`]).
//! Errors take Anthropic's shape ([`error`]).
//!
//! Refused with a 400 naming what is not supported: image, document and other non-text
//! content blocks, server tools, and a last `assistant` message (prefill). Thinking blocks
//! of earlier turns ride with their turn as chat's `reasoning`; `metadata` is ignored,
//! thinking's `budget_tokens` is not enforced and no signature is made.

mod error;
mod request;
mod response;
mod stream;
mod tools;

use std::convert::Infallible;
use std::time::Instant;

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use tracing::Instrument;

use self::error::AnthropicJson;
pub(crate) use self::error::is_anthropic_path;
pub use self::error::{AnthropicError, AnthropicErrorBody, AnthropicErrorDetail};
pub use self::request::{CountTokensRequest, InputMessage, MessagesRequest};
pub use self::response::{ContentBlock, Message, MessageUsage, StopReason, TokenCount};
use self::response::{MessageShell, blocks};
pub use self::stream::{BlockDelta, DeltaUsage, MessageDelta, MessageStreamEvent};
use crate::assistant::OutputSplitter;
use crate::error::ApiError;
use crate::openai::{Launched, launch, run_all};
use crate::sse::sse;
use crate::state::AppState;

/// `POST /v1/messages`.
pub(crate) async fn messages(
    State(state): State<AppState>,
    AnthropicJson(req): AnthropicJson<MessagesRequest>,
) -> Result<Response, AnthropicError> {
    let received = Instant::now();
    let chat = req.to_chat()?;
    let valid = crate::openai::validate_chat(&state, &chat, received).await?;
    let shell = MessageShell::new(&state, valid.prompt_tokens);
    if valid.reply.stream {
        let Launched { permits, streams } = launch(&state, valid.samples).await?;
        let Some(output) = streams.into_iter().next() else {
            return Err(ApiError::Internal("a message without its output".into()).into());
        };
        let events = stream::events(shell, permits, output, valid.reading);
        return Ok(sse(events.map(|e| Ok::<_, Infallible>(e.sse()))));
    }
    let outputs = run_all(&state, valid.samples).await?;
    let Some(output) = outputs.into_iter().next() else {
        return Err(ApiError::Internal("a message without its output".into()).into());
    };
    let pieces = OutputSplitter::read_whole(valid.reading, &output.generated_text.text);
    let message = shell.finished(blocks(pieces), &output.generated_text);
    Ok(Json(message).into_response())
}

/// `POST /v1/messages/count_tokens`: the prompt the conversation renders to, in tokens.
pub(crate) async fn count_tokens(
    State(state): State<AppState>,
    AnthropicJson(req): AnthropicJson<CountTokensRequest>,
) -> Result<Json<TokenCount>, AnthropicError> {
    let chat = req.to_chat()?;
    let input_tokens = state
        .validation()
        .count_chat_tokens(&chat)
        .instrument(tracing::info_span!("validation"))
        .await?;
    Ok(Json(TokenCount { input_tokens }))
}

#[cfg(test)]
mod tests;
