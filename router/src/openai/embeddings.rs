//! `POST /v1/embeddings`: OpenAI's embeddings API over the served model's pooling (one text,
//! a list of texts, or token ids; float or base64 vectors; `dimensions` for Matryoshka
//! models). Each input is one pooling request, batched with the others by the scheduler.

use axum::Json;
use axum::extract::State;
use serde::{Deserialize, Serialize};

use crate::error::{OpenAiError, OpenAiJson};
use crate::infer::ValidGenerateRequest;
use crate::pooling::{PoolingAsk, embeddings};
use crate::state::AppState;
use crate::validation::ValidationError;

/// Most inputs in one request (OpenAI's limit).
const MAX_INPUTS: usize = 2048;

/// `POST /v1/embeddings` body.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
pub struct EmbeddingRequest {
    /// What to embed: a string, a list of strings, a list of token ids, or a list of lists of
    /// token ids (ids are taken as they are, without special tokens added).
    pub input: EmbeddingInput,
    /// Any name, or none: a server serves one model, so every name means it (as TGI).
    #[serde(default)]
    pub model: Option<String>,
    /// `float` (default) or `base64` (the f32 values, little-endian, base64-encoded).
    #[serde(default)]
    pub encoding_format: Option<String>,
    /// Keep the first `dimensions` values (Matryoshka models), normalised again when the
    /// model normalises.
    #[serde(default)]
    pub dimensions: Option<usize>,
    /// Add the tokenizer's special tokens to text inputs (vLLM's extension; default true).
    #[serde(default)]
    pub add_special_tokens: Option<bool>,
}

/// The inputs of an [`EmbeddingRequest`].
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum EmbeddingInput {
    /// One text.
    Text(String),
    /// Several texts.
    Texts(Vec<String>),
    /// One input as token ids.
    Tokens(Vec<u32>),
    /// Several inputs as token ids.
    TokenLists(Vec<Vec<u32>>),
}

/// `POST /v1/embeddings` answer.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct EmbeddingResponse {
    /// `list`.
    pub object: &'static str,
    /// One per input, in order.
    pub data: Vec<Embedding>,
    /// The served model's name.
    pub model: String,
    /// Tokens read.
    pub usage: EmbeddingUsage,
}

/// One input's vector.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Embedding {
    /// `embedding`.
    pub object: &'static str,
    /// Its input's position.
    pub index: usize,
    /// The vector: numbers, or a base64 string of little-endian f32s.
    pub embedding: EmbeddingVector,
}

/// A vector as `encoding_format` asked.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum EmbeddingVector {
    /// `float`.
    Float(Vec<f32>),
    /// `base64`.
    Base64(String),
}

/// Tokens an embeddings or scoring request read.
#[derive(Debug, Clone, Copy, Serialize, utoipa::ToSchema)]
pub struct EmbeddingUsage {
    /// Tokens of every input.
    pub prompt_tokens: u32,
    /// The same.
    pub total_tokens: u32,
}

impl EmbeddingUsage {
    pub(crate) fn of(inputs: &[ValidGenerateRequest]) -> Self {
        let tokens = inputs.iter().map(|r| r.input_ids.len() as u32).sum();
        Self {
            prompt_tokens: tokens,
            total_tokens: tokens,
        }
    }
}

/// `POST /v1/embeddings`.
pub(crate) async fn embeddings(
    State(state): State<AppState>,
    OpenAiJson(req): OpenAiJson<EmbeddingRequest>,
) -> Result<Json<EmbeddingResponse>, OpenAiError> {
    let spec = state.pooling().embedding("/v1/embeddings")?;
    let ask = PoolingAsk::Embed(spec.pool);
    let base64 = match req.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(ValidationError::out_of_range(
                "encoding_format",
                "\"float\" or \"base64\"",
                other,
            )
            .into());
        }
    };
    if let Some(d) = req.dimensions
        && !(1..=spec.dimensions).contains(&d)
    {
        return Err(ValidationError::OutOfRange {
            param: "dimensions",
            bound: "between 1 and the model's embedding size",
            given: format!("{d} (the model's embeddings have {})", spec.dimensions),
        }
        .into());
    }
    let add_special = req.add_special_tokens.unwrap_or(true);
    let ids = input_ids(&state, req.input, add_special).await?;
    let requests: Vec<ValidGenerateRequest> = ids
        .into_iter()
        .map(|ids| ValidGenerateRequest::pooled(ids, ask.clone()))
        .collect();
    let usage = EmbeddingUsage::of(&requests);
    let pooled = state.infer().pool(requests).await?;
    let data = pooled
        .into_iter()
        .enumerate()
        .map(|(index, v)| {
            let v = embeddings::finish(spec, v, req.dimensions);
            Embedding {
                object: "embedding",
                index,
                embedding: match base64 {
                    true => EmbeddingVector::Base64(embeddings::base64(&v)),
                    false => EmbeddingVector::Float(v),
                },
            }
        })
        .collect();
    Ok(Json(EmbeddingResponse {
        object: "list",
        data,
        model: state.served_model_name().to_owned(),
        usage,
    }))
}

/// The token ids of each input, checked against the vocabulary and the prompt limit.
async fn input_ids(
    state: &AppState,
    input: EmbeddingInput,
    add_special: bool,
) -> Result<Vec<Vec<u32>>, ValidationError> {
    let count = match &input {
        EmbeddingInput::Text(_) | EmbeddingInput::Tokens(_) => 1,
        EmbeddingInput::Texts(t) => t.len(),
        EmbeddingInput::TokenLists(t) => t.len(),
    };
    if count == 0 {
        return Err(ValidationError::EmptyInput("input"));
    }
    if count > MAX_INPUTS {
        return Err(ValidationError::TooMany {
            param: "input",
            max: MAX_INPUTS,
            given: count,
        });
    }
    let state = state.clone();
    tokio::task::spawn_blocking(move || {
        let tokenizer = state.tokenizer();
        let ids: Vec<Vec<u32>> = match input {
            EmbeddingInput::Text(t) => vec![encode(tokenizer, &t, add_special)?],
            EmbeddingInput::Texts(texts) => texts
                .iter()
                .map(|t| encode(tokenizer, t, add_special))
                .collect::<Result<_, _>>()?,
            EmbeddingInput::Tokens(ids) => vec![ids],
            EmbeddingInput::TokenLists(lists) => lists,
        };
        let vocab = tokenizer.vocab_size();
        let max = state.validation().config().max_input_tokens;
        for ids in &ids {
            crate::pooling::check_prompt(ids, vocab, max, "input")?;
        }
        Ok(ids)
    })
    .await
    .map_err(|e| ValidationError::Internal(e.to_string()))?
}

fn encode(
    tokenizer: &tessera_text::ModelTokenizer,
    text: &str,
    add_special: bool,
) -> Result<Vec<u32>, ValidationError> {
    tokenizer
        .encode(text, add_special)
        .map_err(|e| ValidationError::Tokenizer(e.to_string()))
}
