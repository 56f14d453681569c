//! The native (TGI-compatible) API: `/generate`, `/generate_stream`, `/tokenize`, `/info`,
//! `/health` (readiness), `/live` (liveness), `/metrics`.

use std::convert::Infallible;
use std::time::Instant;

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use tracing::Instrument;

use crate::error::{ApiError, NativeJson};
use crate::infer::{
    FinishReason, InferError, InferResponse, InferStreamResponse, PrefillToken, Token,
};
use crate::sse::{json_event, sse};
use crate::state::AppState;
use crate::validation::{ValidNativeRequest, ValidationError};

/// `POST /generate` and `/generate_stream` body.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
pub struct GenerateRequest {
    /// The prompt.
    pub inputs: String,
    /// Generation parameters.
    #[serde(default)]
    pub parameters: GenerateParameters,
}

/// TGI's `grammar` parameter.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
pub struct Grammar {
    /// `regex` or `json` (`json_schema` is accepted as `json`).
    #[serde(rename = "type")]
    pub kind: String,
    /// The regular expression, or the JSON Schema (an object or its text).
    pub value: serde_json::Value,
}

/// TGI's generation parameters.
#[derive(Debug, Clone, Default, Deserialize, utoipa::ToSchema)]
#[allow(missing_docs)]
pub struct GenerateParameters {
    /// Only 1 (or absent) is supported.
    pub best_of: Option<usize>,
    pub temperature: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub top_k: Option<i64>,
    pub top_p: Option<f32>,
    pub typical_p: Option<f32>,
    pub min_p: Option<f32>,
    #[serde(default)]
    pub do_sample: bool,
    pub max_new_tokens: Option<u32>,
    /// Prepend the prompt to `generated_text`.
    pub return_full_text: Option<bool>,
    #[serde(default)]
    pub stop: Vec<String>,
    /// Keep only the last `truncate` prompt tokens.
    pub truncate: Option<usize>,
    /// Not supported; must be false.
    #[serde(default)]
    pub watermark: bool,
    /// Return token-level details.
    #[serde(default)]
    pub details: bool,
    /// Return the prompt tokens' logprobs in `details.prefill`.
    #[serde(default)]
    pub decoder_input_details: bool,
    pub seed: Option<u64>,
    pub top_n_tokens: Option<u32>,
    #[serde(default)]
    pub ignore_eos: bool,
    pub skip_special_tokens: Option<bool>,
    /// TGI's grammar: `{"type": "regex", "value": pattern}` or `{"type": "json", "value":
    /// schema}`.
    pub grammar: Option<Grammar>,
}

/// `POST /generate` answer.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct GenerateResponse {
    /// The generated text.
    pub generated_text: String,
    /// Token-level details, when asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub details: Option<Details>,
}

/// Token-level details of a finished request.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Details {
    /// Why generation stopped.
    pub finish_reason: FinishReason,
    /// Number of generated tokens.
    pub generated_tokens: u32,
    /// Sampling seed.
    pub seed: Option<u64>,
    /// Prompt tokens (with `decoder_input_details`).
    pub prefill: Vec<PrefillToken>,
    /// Generated tokens.
    pub tokens: Vec<Token>,
    /// Alternatives per generated token (with `top_n_tokens`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub top_tokens: Vec<Vec<Token>>,
    /// With speculative decoding: per step that verified proposals, how many it accepted
    /// (that step produced one token more).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub accepted_tokens_per_step: Vec<u32>,
}

/// One `/generate_stream` event.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct StreamResponse {
    /// 1-based index of the token.
    pub index: u32,
    /// The token.
    pub token: Token,
    /// Its alternatives.
    pub top_tokens: Vec<Token>,
    /// The whole text, on the last event only.
    pub generated_text: Option<String>,
    /// Summary, on the last event only.
    pub details: Option<StreamDetails>,
}

/// Summary on the last stream event.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct StreamDetails {
    /// Why generation stopped.
    pub finish_reason: FinishReason,
    /// Number of generated tokens.
    pub generated_tokens: u32,
    /// Sampling seed.
    pub seed: Option<u64>,
    /// Prompt length in tokens.
    pub input_length: u32,
    /// With speculative decoding: per step that verified proposals, how many it accepted.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub accepted_tokens_per_step: Vec<u32>,
}

fn timing_headers(out: &InferResponse, prompt_tokens: usize, received: Instant) -> HeaderMap {
    let ms = |d: std::time::Duration| HeaderValue::from(d.as_millis() as u64);
    let now = Instant::now();
    let inference = now.saturating_duration_since(out.start);
    let tokens = out.generated_text.generated_tokens.max(1);
    let mut h = HeaderMap::new();
    h.insert("x-compute-type", HeaderValue::from_static("tessera"));
    h.insert("x-prompt-tokens", HeaderValue::from(prompt_tokens as u64));
    h.insert(
        "x-generated-tokens",
        HeaderValue::from(out.generated_text.generated_tokens),
    );
    h.insert("x-total-time", ms(now.saturating_duration_since(received)));
    h.insert(
        "x-queue-time",
        ms(out.start.saturating_duration_since(out.queued)),
    );
    h.insert("x-inference-time", ms(inference));
    h.insert("x-time-per-token", ms(inference / tokens));
    h
}

/// The body of TGI's `POST /`: a generate request and whether to stream it.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
pub struct CompatGenerateRequest {
    /// The prompt.
    pub inputs: String,
    /// Generation parameters.
    #[serde(default)]
    pub parameters: GenerateParameters,
    /// Stream server-sent events instead of one JSON answer.
    #[serde(default)]
    pub stream: bool,
}

/// `POST /`, as TGI (and its `text-generation` client) use it: `/generate_stream` when
/// `stream` is true, otherwise `/generate` with the answer wrapped in a one-element list.
pub(crate) async fn compat_generate(
    State(state): State<AppState>,
    NativeJson(req): NativeJson<CompatGenerateRequest>,
) -> Result<Response, ApiError> {
    let inner = GenerateRequest {
        inputs: req.inputs,
        parameters: req.parameters,
    };
    if req.stream {
        return generate_stream(State(state), NativeJson(inner)).await;
    }
    let response = generate(State(state), NativeJson(inner)).await?;
    let (parts, body) = response.into_parts();
    let bytes = axum::body::to_bytes(body, usize::MAX)
        .await
        .map_err(|e| ApiError::from(InferError::GenerationError(e.to_string())))?;
    let mut list = b"[".to_vec();
    list.extend_from_slice(&bytes);
    list.push(b']');
    Ok(Response::from_parts(parts, axum::body::Body::from(list)))
}

/// `POST /generate`.
pub(crate) async fn generate(
    State(state): State<AppState>,
    NativeJson(req): NativeJson<GenerateRequest>,
) -> Result<Response, ApiError> {
    let received = Instant::now();
    let ValidNativeRequest {
        request,
        details,
        text_prefix,
    } = state
        .validation()
        .validate_generate(req)
        .instrument(tracing::info_span!("validation"))
        .await?;
    crate::metrics::record_validation(received);
    let prompt_tokens = request.input_ids.len();
    let out = state.infer().generate(request).await?;
    let headers = timing_headers(&out, prompt_tokens, received);
    let generated = &out.generated_text;
    let body = GenerateResponse {
        generated_text: format!("{text_prefix}{}", generated.text),
        details: details.then(|| Details {
            finish_reason: generated.finish_reason,
            generated_tokens: generated.generated_tokens,
            seed: generated.seed,
            prefill: out.prefill.clone(),
            tokens: out.tokens.clone(),
            top_tokens: if out.top_tokens.iter().all(Vec::is_empty) {
                Vec::new()
            } else {
                out.top_tokens.clone()
            },
            accepted_tokens_per_step: generated.accepted_per_step.clone(),
        }),
    };
    Ok((headers, Json(body)).into_response())
}

/// `POST /generate_stream`: one SSE event per token, the last with the whole text and
/// details. Errors after the stream started come as `{"error", "error_type"}` events.
pub(crate) async fn generate_stream(
    State(state): State<AppState>,
    NativeJson(req): NativeJson<GenerateRequest>,
) -> Result<Response, ApiError> {
    let received = Instant::now();
    let ValidNativeRequest {
        request,
        text_prefix,
        ..
    } = state
        .validation()
        .validate_generate(req)
        .instrument(tracing::info_span!("validation"))
        .await?;
    crate::metrics::record_validation(received);
    let input_length = request.input_ids.len() as u32;
    let admitted = state.infer().generate_stream(request).await?;
    let stream = async_stream::stream! {
        let _permit = admitted.permit;
        let mut events = admitted.events;
        let mut index = 0;
        while let Some(event) = events.next().await {
            let response = match event {
                // A generation request never pools.
                Ok(InferStreamResponse::Prefill(_) | InferStreamResponse::Pooled { .. }) => continue,
                Ok(InferStreamResponse::Intermediate { token, top_tokens }) => {
                    index += 1;
                    StreamResponse { index, token, top_tokens, generated_text: None, details: None }
                }
                Ok(InferStreamResponse::End { token, top_tokens, generated_text, .. }) => {
                    index += 1;
                    StreamResponse {
                        index,
                        token,
                        top_tokens,
                        generated_text: Some(format!("{text_prefix}{}", generated_text.text)),
                        details: Some(StreamDetails {
                            finish_reason: generated_text.finish_reason,
                            generated_tokens: generated_text.generated_tokens,
                            seed: generated_text.seed,
                            input_length,
                            accepted_tokens_per_step: generated_text.accepted_per_step,
                        }),
                    }
                }
                Err(e) => {
                    yield Ok::<Event, Infallible>(json_event(&ApiError::from(e).native_body()));
                    break;
                }
            };
            yield Ok(json_event(&response));
        }
    };
    Ok(sse(stream))
}

/// One token of `/tokenize`.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct SimpleToken {
    /// Token id.
    pub id: u32,
    /// The text it covers (its own text for added special tokens).
    pub text: String,
    /// Byte offset of its start in the input.
    pub start: usize,
    /// Byte offset of its end.
    pub stop: usize,
}

/// `POST /tokenize`: the prompt's tokens with their byte offsets, special tokens included.
pub(crate) async fn tokenize(
    State(state): State<AppState>,
    NativeJson(req): NativeJson<GenerateRequest>,
) -> Result<Json<Vec<SimpleToken>>, ApiError> {
    let tokenizer = state.tokenizer().clone();
    let inputs = req.inputs;
    let tokens = tokio::task::spawn_blocking(move || {
        let encoding = tokenizer
            .tokenizer
            .encode(inputs.as_str(), true)
            .map_err(|e| ValidationError::Tokenizer(e.to_string()))?;
        let tokens = encoding
            .get_ids()
            .iter()
            .zip(encoding.get_offsets())
            .map(|(&id, &(start, stop))| {
                let text = match inputs.get(start..stop) {
                    Some(t) if !t.is_empty() => t.to_owned(),
                    _ => tokenizer.decode(&[id], false).unwrap_or_default(),
                };
                SimpleToken {
                    id,
                    text,
                    start,
                    stop,
                }
            })
            .collect::<Vec<_>>();
        Ok::<_, ValidationError>(tokens)
    })
    .await
    .map_err(|e| ApiError::Internal(e.to_string()))??;
    Ok(Json(tokens))
}

/// `GET /info` answer.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[allow(missing_docs)]
pub struct Info {
    pub model_id: String,
    pub model_sha: Option<String>,
    pub model_dtype: String,
    pub model_device_type: String,
    pub served_model_name: String,
    pub max_concurrent_requests: usize,
    pub max_best_of: usize,
    pub max_stop_sequences: usize,
    pub max_input_tokens: usize,
    pub max_total_tokens: usize,
    pub max_top_n_tokens: u32,
    pub max_batch_total_tokens: Option<u32>,
    pub max_batch_prefill_tokens: u32,
    pub router: &'static str,
    pub version: &'static str,
    pub sha: Option<String>,
    pub docker_label: Option<String>,
}

/// `GET /info`.
pub(crate) async fn info(State(state): State<AppState>) -> Json<Info> {
    let i = state.info();
    let v = state.validation().config();
    Json(Info {
        model_id: i.model_id.clone(),
        model_sha: i.model_sha.clone(),
        model_dtype: i.model_dtype.clone(),
        model_device_type: i.model_device_type.clone(),
        served_model_name: state.served_model_name().to_owned(),
        max_concurrent_requests: state.infer().max_concurrent_requests(),
        max_best_of: v.max_best_of,
        max_stop_sequences: v.max_stop_sequences,
        max_input_tokens: v.max_input_tokens,
        max_total_tokens: v.max_total_tokens,
        max_top_n_tokens: v.max_top_n_tokens,
        max_batch_total_tokens: i.max_batch_total_tokens,
        max_batch_prefill_tokens: i.max_batch_prefill_tokens,
        router: "tessera-router",
        version: env!("CARGO_PKG_VERSION"),
        sha: i.sha.clone(),
        docker_label: i.docker_label.clone(),
    })
}

/// `GET /health` and `GET /live` answer.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Status {
    /// `ok` (ready) or `alive`.
    pub status: &'static str,
}

/// `GET /health` (readiness): 200 when the engine answers; 503 when it does not, and from
/// the moment the server starts draining, so that load balancers stop sending it requests.
pub(crate) async fn health(State(state): State<AppState>) -> Result<Json<Status>, ApiError> {
    if state.infer().is_draining() {
        return Err(InferError::Draining.into());
    }
    if state.healthy().await {
        Ok(Json(Status { status: "ok" }))
    } else {
        Err(ApiError::Unhealthy)
    }
}

/// `GET /live` (liveness): 200 while the process serves HTTP, draining or not, busy or not,
/// whatever the shards' health; only a wedged or dead server fails it.
pub(crate) async fn live() -> Json<Status> {
    Json(Status { status: "alive" })
}

/// `GET /metrics`: Prometheus text format.
pub(crate) async fn metrics(State(state): State<AppState>) -> Result<Response, ApiError> {
    let handle = state
        .prometheus()
        .ok_or_else(|| ApiError::NotFound("GET /metrics (metrics are disabled)".into()))?;
    handle.run_upkeep();
    metrics::gauge!(crate::metrics::names::ROUTER_HEAP_BYTES).set(crate::heap::live_bytes() as f64);
    Ok((
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        handle.render(),
    )
        .into_response())
}
