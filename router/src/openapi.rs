//! The API's OpenAPI 3.1 document (`GET /openapi.json`) and its Swagger UI (`GET /docs`).
//!
//! The schemas are derived from the request and response types themselves
//! (`utoipa::ToSchema`); [`ROUTES`] lists every route with its body, answers and error
//! statuses, and a test checks that it names exactly the routes [`crate::app`] serves. The
//! Swagger UI's assets are compiled in (no download, no CDN).

use axum::Router;
use utoipa::OpenApi;
use utoipa::openapi::path::{HttpMethod, OperationBuilder, PathItem, PathsBuilder};
use utoipa::openapi::request_body::RequestBodyBuilder;
use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, Type};
use utoipa::openapi::{
    ContentBuilder, Ref, RefOr, Required, ResponseBuilder, ResponsesBuilder, Schema,
};
use utoipa_swagger_ui::SwaggerUi;

use crate::anthropic::{
    AnthropicErrorBody, AnthropicErrorDetail, BlockDelta, ContentBlock, CountTokensRequest,
    DeltaUsage, InputMessage, Message, MessageDelta, MessageStreamEvent, MessageUsage,
    MessagesRequest, StopReason, TokenCount, is_anthropic_path,
};
use crate::error::{ErrorBody, OpenAiErrorBody, OpenAiErrorDetail};
use crate::infer::{FinishReason, PrefillToken, Token};
use crate::native::Status;
use crate::native::{
    CompatGenerateRequest, Details, GenerateParameters, GenerateRequest, GenerateResponse, Grammar,
    Info, SimpleToken, StreamDetails, StreamResponse,
};
use crate::openai::{
    AssistantMessage, ChatChoice, ChatCompletion, ChatCompletionChunk, ChatCompletionRequest,
    ChatLogprob, ChatLogprobs, ChunkChoice, Completion, CompletionChoice, CompletionLogprobs,
    CompletionRequest, ContentPart, Delta, MessageContent, PromptInput, RequestMessage,
    ResponseFormat, SamplingFields, StopSpec, StreamOptions, TopLogprob, Usage,
};
use crate::openai::{
    Embedding, EmbeddingInput, EmbeddingRequest, EmbeddingResponse, EmbeddingUsage,
    EmbeddingVector, RerankDocument, RerankRequest, RerankResponse, RerankResult, RerankText,
    RerankUsage, ScoreData, ScoreRequest, ScoreResponse, ScoreTexts,
};
use crate::openai::{
    FunctionCall, FunctionCallDelta, JsonSchemaFormat, ResponseObject, ResponsesInput,
    ResponsesRequest, ResponsesStreamEvent, StructuredOutputs, TextFormat, TextOptions, ToolCall,
    ToolCallDelta,
};
use crate::openai::{ModelCard, ModelList, OutputConstraints};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Tessera",
        description = "Text generation: the OpenAI-compatible API under /v1, Anthropic's \
                       Messages API (/v1/messages) and the TGI-compatible native API. Errors \
                       are JSON: `{error, error_type}` on native routes, `{type: \"error\", \
                       error: {type, message}}` under /v1/messages, `{error: {message, type, \
                       param, code}}` elsewhere under /v1. A request's `X-Request-Timeout: \
                       <seconds>` header bounds it (504 past it)."
    ),
    components(schemas(
        GenerateRequest,
        GenerateParameters,
        Grammar,
        CompatGenerateRequest,
        GenerateResponse,
        Details,
        StreamResponse,
        StreamDetails,
        SimpleToken,
        Info,
        Token,
        PrefillToken,
        FinishReason,
        ChatCompletionRequest,
        CompletionRequest,
        SamplingFields,
        OutputConstraints,
        ResponseFormat,
        StopSpec,
        StreamOptions,
        MessageContent,
        ContentPart,
        RequestMessage,
        PromptInput,
        ChatCompletion,
        ChatChoice,
        AssistantMessage,
        ChatCompletionChunk,
        ChunkChoice,
        Delta,
        Completion,
        CompletionChoice,
        Usage,
        ChatLogprobs,
        ChatLogprob,
        TopLogprob,
        CompletionLogprobs,
        JsonSchemaFormat,
        StructuredOutputs,
        ToolCall,
        FunctionCall,
        ToolCallDelta,
        FunctionCallDelta,
        ResponsesRequest,
        ResponsesInput,
        TextOptions,
        TextFormat,
        ResponseObject,
        ResponsesStreamEvent,
        ModelList,
        ModelCard,
        EmbeddingRequest,
        EmbeddingInput,
        EmbeddingResponse,
        Embedding,
        EmbeddingVector,
        EmbeddingUsage,
        RerankRequest,
        RerankDocument,
        RerankResponse,
        RerankResult,
        RerankText,
        RerankUsage,
        ScoreRequest,
        ScoreTexts,
        ScoreResponse,
        ScoreData,
        MessagesRequest,
        CountTokensRequest,
        InputMessage,
        Message,
        ContentBlock,
        StopReason,
        MessageUsage,
        TokenCount,
        MessageStreamEvent,
        BlockDelta,
        MessageDelta,
        DeltaUsage,
        AnthropicErrorBody,
        AnthropicErrorDetail,
        ErrorBody,
        OpenAiErrorBody,
        OpenAiErrorDetail,
        Status
    ))
)]
struct Components;

/// What a route answers with on success.
#[derive(Debug, Clone, Copy)]
enum Answer {
    /// One JSON value of this schema.
    Json(&'static str),
    /// A JSON list of this schema.
    JsonList(&'static str),
    /// Server-sent events, each `data:` a JSON value of this schema.
    Events(&'static str),
    /// Prometheus text.
    Text,
    /// The Swagger UI page.
    Html,
}

/// One route of the API.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Route {
    pub(crate) path: &'static str,
    /// POST, else GET.
    post: bool,
    summary: &'static str,
    body: Option<&'static str>,
    answer: Answer,
    /// Another success answer (`POST /` streams when asked to).
    or_stream: Option<&'static str>,
    errors: &'static [u16],
}

/// Statuses a generation request can fail with (see `crate::error`).
const GENERATION_ERRORS: &[u16] = &[400, 401, 404, 413, 415, 422, 429, 500, 503, 504];

/// Statuses a pooling request can fail with.
const POOLING_ERRORS: &[u16] = &[400, 401, 413, 415, 422, 429, 500, 503, 504];

const fn post(path: &'static str, summary: &'static str, body: &'static str) -> Route {
    Route {
        path,
        post: true,
        summary,
        body: Some(body),
        answer: Answer::Json(""),
        or_stream: None,
        errors: GENERATION_ERRORS,
    }
}

const fn get(path: &'static str, summary: &'static str, answer: Answer) -> Route {
    Route {
        path,
        post: false,
        summary,
        body: None,
        answer,
        or_stream: None,
        errors: &[],
    }
}

/// Every route [`crate::app`] serves.
pub(crate) const ROUTES: &[Route] = &[
    Route {
        answer: Answer::JsonList("GenerateResponse"),
        or_stream: Some("StreamResponse"),
        ..post(
            "/",
            "TGI's compat route: /generate, or /generate_stream with `stream: true`",
            "CompatGenerateRequest",
        )
    },
    Route {
        answer: Answer::Json("GenerateResponse"),
        ..post("/generate", "Generate text", "GenerateRequest")
    },
    Route {
        answer: Answer::Events("StreamResponse"),
        ..post(
            "/generate_stream",
            "Generate text, one server-sent event per token",
            "GenerateRequest",
        )
    },
    Route {
        answer: Answer::JsonList("SimpleToken"),
        errors: &[400, 401, 413, 415, 422],
        ..post("/tokenize", "Tokenize a prompt", "GenerateRequest")
    },
    Route {
        answer: Answer::Json("ChatCompletion"),
        or_stream: Some("ChatCompletionChunk"),
        ..post(
            "/v1/chat/completions",
            "OpenAI chat completion (server-sent chunks with `stream: true`)",
            "ChatCompletionRequest",
        )
    },
    Route {
        answer: Answer::Json("Completion"),
        or_stream: Some("Completion"),
        ..post(
            "/v1/completions",
            "OpenAI text completion (server-sent chunks with `stream: true`)",
            "CompletionRequest",
        )
    },
    Route {
        answer: Answer::Json("ResponseObject"),
        or_stream: Some("ResponsesStreamEvent"),
        ..post(
            "/v1/responses",
            "OpenAI Responses API, stateless (server-sent events with `stream: true`)",
            "ResponsesRequest",
        )
    },
    Route {
        answer: Answer::Json("Message"),
        or_stream: Some("MessageStreamEvent"),
        errors: &[400, 401, 404, 413, 415, 429, 500, 503, 504],
        ..post(
            "/v1/messages",
            "Anthropic Messages API (server-sent events with `stream: true`); `x-api-key` or \
             a bearer token",
            "MessagesRequest",
        )
    },
    Route {
        answer: Answer::Json("TokenCount"),
        errors: &[400, 401, 413, 415, 500],
        ..post(
            "/v1/messages/count_tokens",
            "Anthropic token counting: the tokens of the prompt a conversation renders to",
            "CountTokensRequest",
        )
    },
    Route {
        errors: &[401],
        ..get("/v1/models", "The served model", Answer::Json("ModelList"))
    },
    Route {
        answer: Answer::Json("EmbeddingResponse"),
        errors: POOLING_ERRORS,
        ..post(
            "/v1/embeddings",
            "OpenAI embeddings of texts or token ids (a server started with `--task embed`)",
            "EmbeddingRequest",
        )
    },
    Route {
        answer: Answer::Json("RerankResponse"),
        errors: POOLING_ERRORS,
        ..post(
            "/v1/rerank",
            "Documents ranked by relevance to a query, Jina's and Cohere's shape (a server \
             started with `--task score`)",
            "RerankRequest",
        )
    },
    Route {
        answer: Answer::Json("ScoreResponse"),
        errors: POOLING_ERRORS,
        ..post(
            "/v1/score",
            "Relevance scores of text pairs, vLLM's shape (a server started with `--task score`)",
            "ScoreRequest",
        )
    },
    Route {
        errors: &[503],
        ..get(
            "/health",
            "Readiness: 200 when the engine answers; 503 when it does not or the server drains",
            Answer::Json("Status"),
        )
    },
    get(
        "/live",
        "Liveness: 200 while the server serves HTTP",
        Answer::Json("Status"),
    ),
    get("/info", "Model and server limits", Answer::Json("Info")),
    Route {
        errors: &[404],
        ..get("/metrics", "Prometheus metrics", Answer::Text)
    },
    get("/openapi.json", "This document", Answer::Json("")),
    get("/docs", "Swagger UI of this document", Answer::Html),
];

fn schema_ref(name: &str) -> RefOr<Schema> {
    if name.is_empty() {
        ObjectBuilder::new().into()
    } else {
        Ref::from_schema_name(name).into()
    }
}

/// A server-sent event (its fields, as OpenAPI 3.2 and Schemathesis describe a stream's
/// items): `data` is one JSON `event`, or the `error` body that ends a failed stream (or, under
/// /v1, the closing `[DONE]`).
fn event_schema(event: &str, error: &str) -> RefOr<Schema> {
    let string = |description: String| {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .description(Some(description))
    };
    let data = format!("A JSON `{event}`, or a JSON `{error}` that ends the stream");
    ObjectBuilder::new()
        .property("data", string(data))
        .property("event", string("Event type (absent: `message`)".into()))
        .property("id", string("Event id".into()))
        .property("retry", ObjectBuilder::new().schema_type(Type::Integer))
        .required("data")
        .into()
}

fn content(answer: Answer, error: &str) -> (&'static str, RefOr<Schema>) {
    let string = || ObjectBuilder::new().schema_type(Type::String).into();
    match answer {
        Answer::Json(name) => ("application/json", schema_ref(name)),
        Answer::JsonList(name) => (
            "application/json",
            ArrayBuilder::new().items(schema_ref(name)).into(),
        ),
        Answer::Events(name) => ("text/event-stream", event_schema(name, error)),
        Answer::Text => ("text/plain", string()),
        Answer::Html => ("text/html", string()),
    }
}

fn operation(route: &Route) -> utoipa::openapi::path::Operation {
    let error_schema = if is_anthropic_path(route.path) {
        "AnthropicErrorBody"
    } else if route.path.starts_with("/v1/") {
        "OpenAiErrorBody"
    } else {
        "ErrorBody"
    };
    let (kind, schema) = content(route.answer, error_schema);
    let mut ok = ResponseBuilder::new()
        .description("Success")
        .content(kind, ContentBuilder::new().schema(Some(schema)).build());
    if let Some(event) = route.or_stream {
        let events = event_schema(event, error_schema);
        let events = ContentBuilder::new().schema(Some(events)).build();
        ok = ok.content("text/event-stream", events);
    }
    let mut responses = ResponsesBuilder::new().response("200", ok.build());
    for status in route.errors {
        let body = ContentBuilder::new().schema(Some(schema_ref(error_schema)));
        let answer = ResponseBuilder::new()
            .description(error_description(*status))
            .content("application/json", body.build());
        responses = responses.response(status.to_string(), answer.build());
    }
    let mut op = OperationBuilder::new()
        .summary(Some(route.summary))
        .responses(responses.build());
    if let Some(body) = route.body {
        let json = ContentBuilder::new().schema(Some(schema_ref(body))).build();
        let request = RequestBodyBuilder::new()
            .required(Some(Required::True))
            .content("application/json", json);
        op = op.request_body(Some(request.build()));
    }
    op.build()
}

fn error_description(status: u16) -> &'static str {
    match status {
        400 => "Malformed JSON, an invalid header, or (under /v1) invalid parameters",
        401 => "Missing or wrong API key",
        404 => "Unknown route, or metrics disabled",
        413 => "Body over the payload limit",
        415 => "Body not declared as JSON",
        422 => "Invalid parameters (native routes)",
        429 => "Too many requests in flight",
        500 => "Shard failure or generation error",
        503 => "Engine unavailable, unhealthy, or the server is draining",
        504 => "The request ran past its deadline",
        _ => "Error",
    }
}

/// The OpenAPI document of every route.
pub(crate) fn document() -> utoipa::openapi::OpenApi {
    let mut doc = Components::openapi();
    doc.info.version = env!("CARGO_PKG_VERSION").into();
    let mut paths = PathsBuilder::new();
    for route in ROUTES {
        let method = match route.post {
            true => HttpMethod::Post,
            false => HttpMethod::Get,
        };
        paths = paths.path(route.path, PathItem::new(method, operation(route)));
    }
    doc.paths = paths.build();
    doc
}

/// `/openapi.json` and `/docs`.
pub(crate) fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::from(SwaggerUi::new("/docs").url("/openapi.json", document()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_route_served_is_documented_and_no_other() {
        let source = include_str!("server.rs");
        let mut served: Vec<&str> = source
            .split(".route(\"")
            .skip(1)
            .filter_map(|s| s.split('"').next())
            .collect();
        served.extend(["/openapi.json", "/docs"]);
        served.sort_unstable();
        let mut documented: Vec<&str> = ROUTES.iter().map(|r| r.path).collect();
        documented.sort_unstable();
        assert_eq!(served, documented);
    }

    #[test]
    fn the_document_is_openapi_3_and_its_references_resolve() {
        let doc = serde_json::to_value(document()).expect("serializable");
        assert!(doc["openapi"].as_str().is_some_and(|v| v.starts_with("3.")));
        let schemas = doc["components"]["schemas"].as_object().expect("schemas");
        let text = doc.to_string();
        for r in text.split("\"#/components/schemas/").skip(1) {
            let name = r.split('"').next().expect("name");
            assert!(schemas.contains_key(name), "unresolved reference {name}");
        }
        for route in ROUTES {
            let method = if route.post { "post" } else { "get" };
            assert!(
                doc["paths"][route.path][method].is_object(),
                "{method} {}",
                route.path
            );
        }
    }
}
