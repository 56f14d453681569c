//! Tessera router: the HTTP front of the cluster.
//!
//! Requests come in through the native (TGI-compatible), OpenAI or Anthropic API, are
//! validated into a [`ValidGenerateRequest`] and handed to the batcher through [`Infer`],
//! which answers with a stream of [`InferStreamResponse`] events. The batcher turns token ids
//! into text with an [`IncrementalDecoder`] and trims stop sequences with a
//! [`StopSequenceMatcher`].
//!
//! ```
//! use std::sync::Arc;
//! use tessera_router::{AppState, Infer, ModelInfo, ValidationConfig, app};
//! # fn tokenizer() -> Arc<tessera_text::ModelTokenizer> {
//! #     let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/tiny-llama");
//! #     Arc::new(tessera_text::ModelTokenizer::from_hf_dir(&dir, &[]).unwrap())
//! # }
//! let (queue, _batcher_rx) = tokio::sync::mpsc::channel(128);
//! let state = AppState::builder(Infer::new(queue, 128), tokenizer(), "tiny-llama")
//!     .validation(ValidationConfig { max_input_tokens: 200, max_total_tokens: 256, ..Default::default() })
//!     .info(ModelInfo { model_id: "fixtures/tiny-llama".into(), ..Default::default() })
//!     .build();
//! let router: axum::Router = app(state);
//! ```
#![deny(missing_docs)]

mod anthropic;
mod assistant;
pub mod batcher;
pub mod client;
mod deadline;
mod detokenizer;
mod error;
mod heap;
mod infer;
mod metrics;
mod native;
mod openai;
mod openapi;
mod pooling;
mod server;
mod sse;
mod state;
mod stop;
mod telemetry;
mod validation;

pub use crate::anthropic::AnthropicError;
pub use crate::assistant::{ReasoningFormat, ToolCallFormat};
pub use crate::deadline::REQUEST_TIMEOUT_HEADER;
pub use crate::detokenizer::{DecodeError, IncrementalDecoder};
pub use crate::error::{ApiError, OpenAiError};
pub use crate::heap::{CountingAllocator, fix_malloc_thresholds, live_bytes, spawn_trimmer};
pub use crate::infer::{
    AdmittedRequest, Entry, FinishReason, GeneratedText, Infer, InferError, InferResponse,
    InferStream, InferStreamResponse, PrefillToken, Token,
};
pub use crate::metrics::{
    build_recorder, install_recorder, names as metric_names, set_speculator,
    vllm as vllm_metric_names,
};
pub use crate::pooling::{EmbedSpec, ModelFacts, Pool, PoolingModel, ScoreSpec, Task, TaskError};
pub use crate::server::{app, serve};
pub use crate::state::{AppState, AppStateBuilder, DEFAULT_PAYLOAD_LIMIT, HealthCheck, ModelInfo};
pub use crate::stop::{StopMatch, StopSequenceMatcher};
pub use crate::validation::{
    GenerateInput, Prompt, RequestParameters, ValidGenerateRequest, Validation, ValidationConfig,
    ValidationError,
};
pub use tessera_params::{OutputConstraint, SamplingParams, StoppingParams};

/// Wire types of the native (TGI-compatible) API.
pub mod native_api {
    pub use crate::native::{
        CompatGenerateRequest, Details, GenerateParameters, GenerateRequest, GenerateResponse,
        Info, SimpleToken, Status, StreamDetails, StreamResponse,
    };
}

/// Wire types of the OpenAI-compatible API.
pub mod openai_api {
    pub use crate::openai::{
        AssistantMessage, ChatChoice, ChatCompletion, ChatCompletionChunk, ChatCompletionRequest,
        ChatLogprob, ChatLogprobs, ChunkChoice, Completion, CompletionChoice, CompletionLogprobs,
        CompletionRequest, ContentPart, Delta, MessageContent, ModelCard, ModelList, PromptInput,
        RequestMessage, ResponseFormat, SamplingFields, StopSpec, StreamOptions, TopLogprob, Usage,
    };
    pub use crate::openai::{
        Embedding, EmbeddingInput, EmbeddingRequest, EmbeddingResponse, EmbeddingUsage,
        EmbeddingVector, RerankDocument, RerankRequest, RerankResponse, RerankResult, RerankText,
        RerankUsage, ScoreData, ScoreRequest, ScoreResponse, ScoreTexts,
    };
    pub use crate::openai::{
        FunctionCall, FunctionCallDelta, JsonSchemaFormat, OutputConstraints, ResponseObject,
        ResponsesInput, ResponsesRequest, ResponsesStreamEvent, StructuredOutputs, TextFormat,
        TextOptions, ToolCall, ToolCallDelta,
    };
}

/// Wire types of the Anthropic-compatible Messages API.
pub mod anthropic_api {
    pub use crate::anthropic::{
        AnthropicErrorBody, AnthropicErrorDetail, BlockDelta, ContentBlock, CountTokensRequest,
        DeltaUsage, InputMessage, Message, MessageDelta, MessageStreamEvent, MessageUsage,
        MessagesRequest, StopReason, TokenCount,
    };
}
