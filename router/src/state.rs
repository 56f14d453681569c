//! What the handlers share: [`AppState`] (the inference queue, validation, the served
//! model's facts, the server's settings) and its builder.

use std::sync::Arc;
use std::time::Duration;

use axum::http::HeaderValue;
use futures::future::BoxFuture;
use metrics_exporter_prometheus::PrometheusHandle;
use tessera_text::ModelTokenizer;

use crate::infer::Infer;
use crate::pooling::PoolingModel;
use crate::validation::{Validation, ValidationConfig};

/// Answers whether the inference engine is healthy (the batcher provides it).
pub type HealthCheck = Arc<dyn Fn() -> BoxFuture<'static, bool> + Send + Sync>;

/// Static facts about the served model, reported by `/info`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModelInfo {
    /// Model id (hub id or path).
    pub model_id: String,
    /// Model revision, if known.
    pub model_sha: Option<String>,
    /// Weights dtype, e.g. `"bfloat16"`.
    pub model_dtype: String,
    /// Device type, e.g. `"cuda"` or `"cpu"`.
    pub model_device_type: String,
    /// Most tokens a batch may hold, once warmup measured it.
    pub max_batch_total_tokens: Option<u32>,
    /// Most prompt tokens one prefill step takes.
    pub max_batch_prefill_tokens: u32,
    /// Git commit of the build, if known.
    pub sha: Option<String>,
    /// Container label, if any.
    pub docker_label: Option<String>,
}

struct Shared {
    infer: Infer,
    validation: Validation,
    served_model_name: String,
    info: ModelInfo,
    api_key: Option<String>,
    payload_limit: usize,
    health: HealthCheck,
    prometheus: Option<PrometheusHandle>,
    request_timeout: Option<Duration>,
    cors_allow_origin: Vec<HeaderValue>,
    created: u64,
    pooling: PoolingModel,
}

/// Everything the handlers share. Cheap to clone; build it with [`AppState::builder`].
#[derive(Clone)]
pub struct AppState(Arc<Shared>);

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState")
            .field("served_model_name", &self.0.served_model_name)
            .field("info", &self.0.info)
            .field("validation", self.0.validation.config())
            .field("payload_limit", &self.0.payload_limit)
            .field("api_key", &self.0.api_key.as_ref().map(|_| "<set>"))
            .finish_non_exhaustive()
    }
}

/// Builds an [`AppState`].
pub struct AppStateBuilder {
    infer: Infer,
    tokenizer: Arc<ModelTokenizer>,
    served_model_name: String,
    validation: ValidationConfig,
    info: ModelInfo,
    api_key: Option<String>,
    payload_limit: usize,
    health: HealthCheck,
    prometheus: Option<PrometheusHandle>,
    request_timeout: Option<Duration>,
    cors_allow_origin: Vec<HeaderValue>,
    pooling: PoolingModel,
}

/// Default payload limit: 2 MB, as TGI.
pub const DEFAULT_PAYLOAD_LIMIT: usize = 2_000_000;

impl AppState {
    /// A builder with defaults: no API key, a 2 MB payload limit, default validation
    /// limits, an always-healthy health check and no `/metrics`.
    pub fn builder(
        infer: Infer,
        tokenizer: Arc<ModelTokenizer>,
        served_model_name: impl Into<String>,
    ) -> AppStateBuilder {
        AppStateBuilder {
            infer,
            tokenizer,
            served_model_name: served_model_name.into(),
            validation: ValidationConfig::default(),
            info: ModelInfo::default(),
            api_key: None,
            payload_limit: DEFAULT_PAYLOAD_LIMIT,
            health: Arc::new(|| Box::pin(async { true })),
            prometheus: None,
            request_timeout: None,
            cors_allow_origin: Vec::new(),
            pooling: PoolingModel::default(),
        }
    }

    pub(crate) fn infer(&self) -> &Infer {
        &self.0.infer
    }

    pub(crate) fn validation(&self) -> &Validation {
        &self.0.validation
    }

    /// Builds the vocabulary's grammar compiler in the background, so that the first
    /// grammar-constrained request does not wait for it.
    pub fn warm_grammars(&self) {
        let validation = self.0.validation.clone();
        tokio::task::spawn_blocking(move || validation.warm_grammars());
    }

    pub(crate) fn tokenizer(&self) -> &Arc<ModelTokenizer> {
        self.0.validation.tokenizer()
    }

    pub(crate) fn served_model_name(&self) -> &str {
        &self.0.served_model_name
    }

    pub(crate) fn info(&self) -> &ModelInfo {
        &self.0.info
    }

    pub(crate) fn created(&self) -> u64 {
        self.0.created
    }

    pub(crate) async fn healthy(&self) -> bool {
        (self.0.health)().await
    }

    pub(crate) fn prometheus(&self) -> Option<&PrometheusHandle> {
        self.0.prometheus.as_ref()
    }

    pub(crate) fn api_key(&self) -> Option<&str> {
        self.0.api_key.as_deref()
    }

    pub(crate) fn payload_limit(&self) -> usize {
        self.0.payload_limit
    }

    pub(crate) fn request_timeout(&self) -> Option<Duration> {
        self.0.request_timeout
    }

    pub(crate) fn cors_allow_origin(&self) -> &[HeaderValue] {
        &self.0.cors_allow_origin
    }

    pub(crate) fn pooling(&self) -> &PoolingModel {
        &self.0.pooling
    }
}

impl AppStateBuilder {
    /// Validation limits.
    pub fn validation(mut self, config: ValidationConfig) -> Self {
        self.validation = config;
        self
    }

    /// The task the server runs and what its pooling routes need (default: generation).
    pub fn pooling(mut self, pooling: PoolingModel) -> Self {
        self.pooling = pooling;
        self
    }

    /// Facts for `/info`.
    pub fn info(mut self, info: ModelInfo) -> Self {
        self.info = info;
        self
    }

    /// Require `Authorization: Bearer <key>` on generation, tokenize and model routes (or
    /// `x-api-key: <key>` on `/v1/messages*`; `/health`, `/metrics` and `/info` stay open).
    pub fn api_key(mut self, key: Option<String>) -> Self {
        self.api_key = key.filter(|k| !k.is_empty());
        self
    }

    /// Largest request body in bytes.
    pub fn payload_limit(mut self, bytes: usize) -> Self {
        self.payload_limit = bytes;
        self
    }

    /// The health check `/health` calls.
    pub fn health_check(mut self, check: HealthCheck) -> Self {
        self.health = check;
        self
    }

    /// The recorder handle `/metrics` renders.
    pub fn prometheus(mut self, handle: PrometheusHandle) -> Self {
        self.prometheus = Some(handle);
        self
    }

    /// The longest a request may take from its arrival (a request's `X-Request-Timeout`
    /// header can shorten it); none by default.
    pub fn request_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Origins browsers may call the API from (`*`: any); none by default, which sends no
    /// CORS headers.
    pub fn cors_allow_origin(mut self, origins: Vec<HeaderValue>) -> Self {
        self.cors_allow_origin = origins;
        self
    }

    /// The state.
    pub fn build(self) -> AppState {
        let created = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        AppState(Arc::new(Shared {
            infer: self.infer.serving(self.pooling.task()),
            validation: Validation::new(self.validation, self.tokenizer),
            served_model_name: self.served_model_name,
            info: self.info,
            api_key: self.api_key,
            payload_limit: self.payload_limit,
            health: self.health,
            prometheus: self.prometheus,
            request_timeout: self.request_timeout,
            cors_allow_origin: self.cors_allow_origin,
            created,
            pooling: self.pooling,
        }))
    }
}
