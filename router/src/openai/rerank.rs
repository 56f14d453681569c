//! `POST /v1/rerank` (Jina's and Cohere's shape, as vLLM serves it) and `POST /v1/score`
//! (vLLM's): relevance scores of text pairs from the served model's classifier. Each pair is
//! tokenized as transformers' `tokenizer(first, second)` does and is one pooling request.

use axum::Json;
use axum::extract::State;
use serde::{Deserialize, Serialize};

use super::embeddings::EmbeddingUsage;
use super::response::Meta;
use crate::error::{OpenAiError, OpenAiJson};
use crate::infer::ValidGenerateRequest;
use crate::pooling::{PoolingAsk, Task, check_prompt, score::score};
use crate::state::AppState;
use crate::validation::ValidationError;

/// Most pairs in one request.
const MAX_PAIRS: usize = 2048;

/// `POST /v1/rerank` body.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
pub struct RerankRequest {
    /// Any name, or none: a server serves one model, so every name means it (as TGI).
    #[serde(default)]
    pub model: Option<String>,
    /// What the documents are ranked against.
    pub query: String,
    /// The documents: strings, or objects with a `text`.
    pub documents: Vec<RerankDocument>,
    /// Return the best `top_n` only (default: all).
    #[serde(default)]
    pub top_n: Option<usize>,
    /// Include each document's text in its result (default true).
    #[serde(default)]
    pub return_documents: Option<bool>,
}

/// A document to rank.
#[derive(Debug, Clone, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum RerankDocument {
    /// Its text.
    Text(String),
    /// `{"text": ...}`.
    Object {
        /// Its text.
        text: String,
    },
}

impl RerankDocument {
    fn text(&self) -> &str {
        match self {
            RerankDocument::Text(t) | RerankDocument::Object { text: t } => t,
        }
    }
}

/// `POST /v1/rerank` answer: the documents by falling relevance.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct RerankResponse {
    /// `rerank-` and random hex digits.
    pub id: String,
    /// The served model's name.
    pub model: String,
    /// Tokens read.
    pub usage: RerankUsage,
    /// The ranked documents.
    pub results: Vec<RerankResult>,
}

/// Tokens a rerank request read.
#[derive(Debug, Clone, Copy, Serialize, utoipa::ToSchema)]
pub struct RerankUsage {
    /// Tokens of every (query, document) pair.
    pub total_tokens: u32,
}

/// One ranked document.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct RerankResult {
    /// Its position in `documents`.
    pub index: usize,
    /// Its text, unless `return_documents` is false.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub document: Option<RerankText>,
    /// How relevant it is to the query, in [0, 1].
    pub relevance_score: f32,
}

/// A returned document.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct RerankText {
    /// Its text.
    pub text: String,
}

/// `POST /v1/score` body: `text_1` against each of `text_2` (one text against many), or the
/// lists pairwise (equal lengths).
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
pub struct ScoreRequest {
    /// Any name, or none: a server serves one model, so every name means it (as TGI).
    #[serde(default)]
    pub model: Option<String>,
    /// The first texts of the pairs (usually the query).
    pub text_1: ScoreTexts,
    /// The second texts of the pairs (usually the documents).
    pub text_2: ScoreTexts,
}

/// One text or several.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum ScoreTexts {
    /// One.
    One(String),
    /// Several.
    Many(Vec<String>),
}

impl ScoreTexts {
    fn into_vec(self) -> Vec<String> {
        match self {
            ScoreTexts::One(t) => vec![t],
            ScoreTexts::Many(t) => t,
        }
    }
}

/// `POST /v1/score` answer.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ScoreResponse {
    /// `score-` and random hex digits.
    pub id: String,
    /// `list`.
    pub object: &'static str,
    /// Unix seconds.
    pub created: u64,
    /// The served model's name.
    pub model: String,
    /// One per pair, in order.
    pub data: Vec<ScoreData>,
    /// Tokens read.
    pub usage: EmbeddingUsage,
}

/// One pair's score.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ScoreData {
    /// The pair's position.
    pub index: usize,
    /// `score`.
    pub object: &'static str,
    /// How relevant the second text is to the first, in [0, 1].
    pub score: f32,
}

/// `POST /v1/rerank`.
pub(crate) async fn rerank(
    State(state): State<AppState>,
    OpenAiJson(req): OpenAiJson<RerankRequest>,
) -> Result<Json<RerankResponse>, OpenAiError> {
    let ask = state.pooling().ask_for(Task::Score, "/v1/rerank")?;
    if req.documents.is_empty() {
        return Err(ValidationError::EmptyInput("documents").into());
    }
    let pairs = req
        .documents
        .iter()
        .map(|d| (req.query.clone(), d.text().to_owned()))
        .collect();
    let (scores, usage) = score_pairs(&state, ask, pairs, "documents").await?;
    let mut results: Vec<RerankResult> = scores
        .into_iter()
        .enumerate()
        .map(|(index, relevance_score)| RerankResult {
            index,
            document: (req.return_documents != Some(false)).then(|| RerankText {
                text: req.documents[index].text().to_owned(),
            }),
            relevance_score,
        })
        .collect();
    results.sort_by(|a, b| b.relevance_score.total_cmp(&a.relevance_score));
    if let Some(n) = req.top_n.filter(|&n| n > 0) {
        results.truncate(n);
    }
    let meta = Meta::new(&state, "rerank");
    Ok(Json(RerankResponse {
        id: meta.id,
        model: meta.model,
        usage: RerankUsage {
            total_tokens: usage.total_tokens,
        },
        results,
    }))
}

/// `POST /v1/score`.
pub(crate) async fn score_route(
    State(state): State<AppState>,
    OpenAiJson(req): OpenAiJson<ScoreRequest>,
) -> Result<Json<ScoreResponse>, OpenAiError> {
    let ask = state.pooling().ask_for(Task::Score, "/v1/score")?;
    let (firsts, seconds) = (req.text_1.into_vec(), req.text_2.into_vec());
    let pairs: Vec<(String, String)> = match (firsts.len(), seconds.len()) {
        (0, _) => return Err(ValidationError::EmptyInput("text_1").into()),
        (_, 0) => return Err(ValidationError::EmptyInput("text_2").into()),
        (1, _) => seconds
            .into_iter()
            .map(|s| (firsts[0].clone(), s))
            .collect(),
        (a, b) if a == b => firsts.into_iter().zip(seconds).collect(),
        (a, b) => {
            return Err(ValidationError::OutOfRange {
                param: "text_1",
                bound: "one text, or as many texts as text_2",
                given: format!("{a} texts against {b}"),
            }
            .into());
        }
    };
    let (scores, usage) = score_pairs(&state, ask, pairs, "text_2").await?;
    let meta = Meta::new(&state, "score");
    Ok(Json(ScoreResponse {
        id: meta.id,
        object: "list",
        created: meta.created,
        model: meta.model,
        data: scores
            .into_iter()
            .enumerate()
            .map(|(index, score)| ScoreData {
                index,
                object: "score",
                score,
            })
            .collect(),
        usage,
    }))
}

/// The score of each pair, in order, and the tokens they took.
async fn score_pairs(
    state: &AppState,
    ask: PoolingAsk,
    pairs: Vec<(String, String)>,
    param: &'static str,
) -> Result<(Vec<f32>, EmbeddingUsage), OpenAiError> {
    if pairs.len() > MAX_PAIRS {
        return Err(ValidationError::TooMany {
            param,
            max: MAX_PAIRS,
            given: pairs.len(),
        }
        .into());
    }
    let tokenizing = state.clone();
    let requests = tokio::task::spawn_blocking(move || {
        let tokenizer = tokenizing.tokenizer();
        let vocab = tokenizer.vocab_size();
        let max = tokenizing.validation().config().max_input_tokens;
        pairs
            .iter()
            .map(|(a, b)| {
                let ids = tokenizer
                    .encode_pair(a, b, true)
                    .map_err(|e| ValidationError::Tokenizer(e.to_string()))?;
                check_prompt(&ids, vocab, max, param)?;
                Ok(ValidGenerateRequest::pooled(ids, ask.clone()))
            })
            .collect::<Result<Vec<_>, ValidationError>>()
    })
    .await
    .map_err(|e| ValidationError::Internal(e.to_string()))??;
    let usage = EmbeddingUsage::of(&requests);
    let logits = state.infer().pool(requests).await?;
    Ok((logits.iter().map(|l| score(l)).collect(), usage))
}
