//! The OpenAI-compatible API: `/v1/chat/completions`, `/v1/completions`, `/v1/models`.
//!
//! Differences from OpenAI, all documented in the field docs: `temperature` defaults to 1
//! (sampling) as OpenAI's does; `n` runs n independent requests (seeds `seed + i` when a
//! seed is given); `best_of > 1` and `suffix` are refused; a few vLLM extensions are
//! accepted (`top_k`, `min_p`, `repetition_penalty`, `ignore_eos`, `skip_special_tokens`).
//! Unknown fields (`user`, `metadata`, ...) are ignored. Constrained output (`response_format`,
//! vLLM's `guided_*` and `structured_outputs`, `tools`) is held by the shard's grammar masks
//! (see [`crate::validation`]). Errors use OpenAI's shape; invalid requests answer 400 (see
//! [`crate::error`]).

mod assistant_reply;
mod chat;
mod completions;
mod embeddings;
mod logprobs;
mod request;
mod rerank;
mod response;
mod responses;
mod streaming;

use axum::Json;
use axum::extract::State;
use tokio::sync::OwnedSemaphorePermit;

use crate::infer::{InferError, InferResponse, InferStream, collect};
use crate::state::AppState;
use crate::validation::{ValidChatRequest, ValidGenerateRequest, ValidationError};

pub(crate) use self::chat::chat_completions;
pub(crate) use self::completions::completions;
pub(crate) use self::embeddings::embeddings;
pub use self::embeddings::{
    Embedding, EmbeddingInput, EmbeddingRequest, EmbeddingResponse, EmbeddingUsage, EmbeddingVector,
};
pub use self::logprobs::{ChatLogprob, ChatLogprobs, CompletionLogprobs, TopLogprob};
pub use self::request::{
    ChatCompletionRequest, CompletionRequest, ContentPart, JsonSchemaFormat, MessageContent,
    OutputConstraints, PromptInput, RequestMessage, ResponseFormat, SamplingFields, StopSpec,
    StreamOptions, StructuredOutputs,
};
pub use self::rerank::{
    RerankDocument, RerankRequest, RerankResponse, RerankResult, RerankText, RerankUsage,
    ScoreData, ScoreRequest, ScoreResponse, ScoreTexts,
};
pub(crate) use self::rerank::{rerank, score_route};
pub use self::response::{
    AssistantMessage, ChatChoice, ChatCompletion, ChatCompletionChunk, ChunkChoice, Completion,
    CompletionChoice, Delta, FunctionCall, FunctionCallDelta, ToolCall, ToolCallDelta, Usage,
};
pub(crate) use self::responses::responses;
pub use self::responses::{
    ResponseObject, ResponsesInput, ResponsesRequest, ResponsesStreamEvent, TextFormat, TextOptions,
};

/// A request's choices, queued: their event streams and the permits they hold (keep them as
/// long as the streams).
pub(crate) struct Launched {
    pub(crate) permits: Vec<OwnedSemaphorePermit>,
    pub(crate) streams: Vec<InferStream>,
}

/// Queues all requests or none (permits first, so a 429 leaves nothing running).
pub(crate) async fn launch(
    state: &AppState,
    requests: Vec<ValidGenerateRequest>,
) -> Result<Launched, InferError> {
    let permits = requests
        .iter()
        .map(|_| state.infer().try_acquire())
        .collect::<Result<Vec<_>, _>>()?;
    let mut streams = Vec::with_capacity(requests.len());
    for r in requests {
        streams.push(state.infer().enqueue(r).await?);
    }
    Ok(Launched { permits, streams })
}

/// Runs requests to the end; dropping the future cancels them all.
pub(crate) async fn run_all(
    state: &AppState,
    requests: Vec<ValidGenerateRequest>,
) -> Result<Vec<InferResponse>, InferError> {
    let launched = launch(state, requests).await?;
    let _permits = launched.permits;
    futures::future::try_join_all(launched.streams.into_iter().map(collect)).await
}

/// `GET /v1/models`.
/// `GET /v1/models` answer.
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub struct ModelList {
    /// `list`.
    pub object: &'static str,
    /// The served model.
    pub data: Vec<ModelCard>,
}

/// One model of [`ModelList`].
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub struct ModelCard {
    /// The name requests use.
    pub id: String,
    /// `model`.
    pub object: &'static str,
    /// When the server started (Unix seconds).
    pub created: u64,
    /// `tessera`.
    pub owned_by: &'static str,
    /// Longest prompt + generation (vLLM's field).
    pub max_model_len: usize,
}

pub(crate) async fn models(State(state): State<AppState>) -> Json<ModelList> {
    Json(ModelList {
        object: "list",
        data: vec![ModelCard {
            id: state.served_model_name().to_owned(),
            object: "model",
            created: state.created(),
            owned_by: "tessera",
            max_model_len: state.validation().config().max_total_tokens,
        }],
    })
}

/// `chat` (as sent, or translated from the Responses or Messages API) validated under the
/// `validation` span, with the time since the request was `received` recorded.
pub(crate) async fn validate_chat(
    state: &AppState,
    chat: &ChatCompletionRequest,
    received: std::time::Instant,
) -> Result<ValidChatRequest, ValidationError> {
    use tracing::Instrument;
    let valid = state
        .validation()
        .validate_chat(chat)
        .instrument(tracing::info_span!("validation"))
        .await?;
    crate::metrics::record_validation(received);
    Ok(valid)
}
