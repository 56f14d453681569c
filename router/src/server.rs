//! The axum application: shared state, routes, middleware, and `serve`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{HeaderName, HeaderValue, Method, Uri, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures::future::BoxFuture;
use metrics_exporter_prometheus::PrometheusHandle;
use tessera_text::ModelTokenizer;
use tower_http::cors::{AllowOrigin, CorsLayer};

use crate::anthropic::{self, AnthropicError, is_anthropic_path};
use crate::error::{ApiError, OpenAiError, PayloadLimit, log_errors};
use crate::infer::Infer;
use crate::validation::{Validation, ValidationConfig};
use crate::{native, openai};

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
}

impl AppStateBuilder {
    /// Validation limits.
    pub fn validation(mut self, config: ValidationConfig) -> Self {
        self.validation = config;
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
            infer: self.infer,
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
        }))
    }
}

/// The router with every route; separate from [`serve`] so tests can call it directly.
pub fn app(state: AppState) -> Router {
    let native_protected = Router::new()
        .route("/", post(native::compat_generate))
        .route("/generate", post(native::generate))
        .route("/generate_stream", post(native::generate_stream))
        .route("/tokenize", post(native::tokenize))
        .route_layer(middleware::from_fn_with_state(state.clone(), native_auth));
    let openai = Router::new()
        .route("/v1/chat/completions", post(openai::chat_completions))
        .route("/v1/completions", post(openai::completions))
        .route("/v1/responses", post(openai::responses))
        .route("/v1/models", get(openai::models))
        .route_layer(middleware::from_fn_with_state(state.clone(), openai_auth));
    let messages = Router::new()
        .route("/v1/messages", post(anthropic::messages))
        .route("/v1/messages/count_tokens", post(anthropic::count_tokens))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            anthropic_auth,
        ));
    let open = Router::new()
        .route("/health", get(native::health))
        .route("/live", get(native::live))
        .route("/info", get(native::info))
        .route("/metrics", get(native::metrics))
        .merge(crate::openapi::routes());
    let limit = state.0.payload_limit;
    let cors = cors_layer(&state.0.cors_allow_origin);
    let routes = native_protected
        .merge(openai)
        .merge(messages)
        .merge(open)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(
            state.0.request_timeout,
            crate::deadline::deadlines,
        ))
        .layer(DefaultBodyLimit::max(limit))
        .layer(axum::Extension(PayloadLimit(limit)))
        .layer(middleware::from_fn(crate::metrics::track_requests))
        .layer(middleware::from_fn(log_errors))
        .layer(
            tower_http::trace::TraceLayer::new_for_http()
                .make_span_with(crate::telemetry::http_span),
        );
    // Outermost, so that preflight requests are answered before authentication.
    let routes = match cors {
        Some(cors) => routes.layer(cors),
        None => routes,
    };
    routes.with_state(state)
}

/// The CORS layer for `origins` (`*` among them: any origin), if any.
fn cors_layer(origins: &[HeaderValue]) -> Option<CorsLayer> {
    if origins.is_empty() {
        return None;
    }
    let allow = if origins.iter().any(|o| o == "*") {
        AllowOrigin::any()
    } else {
        AllowOrigin::list(origins.iter().cloned())
    };
    Some(
        CorsLayer::new()
            .allow_origin(allow)
            .allow_methods([Method::GET, Method::POST])
            .allow_headers([
                header::AUTHORIZATION,
                header::CONTENT_TYPE,
                HeaderName::from_static(crate::deadline::REQUEST_TIMEOUT_HEADER),
                HeaderName::from_static(API_KEY_HEADER),
                HeaderName::from_static("anthropic-version"),
                HeaderName::from_static("anthropic-beta"),
            ])
            .max_age(Duration::from_secs(3600)),
    )
}

fn is_openai(uri: &Uri) -> bool {
    uri.path().starts_with("/v1/")
}

async fn not_found(method: Method, uri: Uri) -> Response {
    let e = ApiError::NotFound(format!("{method} {}", uri.path()));
    if is_anthropic_path(uri.path()) {
        AnthropicError(e).into_response()
    } else if is_openai(&uri) {
        OpenAiError(e).into_response()
    } else {
        e.into_response()
    }
}

async fn method_not_allowed(uri: Uri) -> Response {
    if is_anthropic_path(uri.path()) {
        AnthropicError(ApiError::MethodNotAllowed).into_response()
    } else if is_openai(&uri) {
        OpenAiError(ApiError::MethodNotAllowed).into_response()
    } else {
        ApiError::MethodNotAllowed.into_response()
    }
}

/// Whether the request carries the key as `Authorization: Bearer <key>`, or, with
/// `x_api_key`, as `x-api-key: <key>` (Anthropic's SDKs); always with no key set.
fn authorized_by(state: &AppState, req: &Request, x_api_key: bool) -> bool {
    let Some(key) = &state.0.api_key else {
        return true;
    };
    let header = |name| req.headers().get(name).and_then(|v| v.to_str().ok());
    let matches = |given: Option<&str>| {
        given.is_some_and(|given| constant_time_eq(given.trim().as_bytes(), key.as_bytes()))
    };
    let bearer = header(header::AUTHORIZATION.as_str()).and_then(|v| v.strip_prefix("Bearer "));
    matches(bearer) || (x_api_key && matches(header(API_KEY_HEADER)))
}

fn authorized(state: &AppState, req: &Request) -> bool {
    authorized_by(state, req, false)
}

/// The header Anthropic's SDKs send the key in.
const API_KEY_HEADER: &str = "x-api-key";

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn native_auth(State(state): State<AppState>, req: Request, next: Next) -> Response {
    if authorized(&state, &req) {
        next.run(req).await
    } else {
        ApiError::Unauthorized.into_response()
    }
}

async fn openai_auth(State(state): State<AppState>, req: Request, next: Next) -> Response {
    if authorized(&state, &req) {
        next.run(req).await
    } else {
        OpenAiError(ApiError::Unauthorized).into_response()
    }
}

async fn anthropic_auth(State(state): State<AppState>, req: Request, next: Next) -> Response {
    if authorized_by(&state, &req, true) {
        next.run(req).await
    } else {
        AnthropicError(ApiError::Unauthorized).into_response()
    }
}

/// Serves `app(state)` on `addr` until `shutdown` completes (then finishes in-flight
/// requests).
pub async fn serve(
    state: AppState,
    addr: SocketAddr,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(%addr, "router listening");
    axum::serve(listener, app(state))
        .with_graceful_shutdown(shutdown)
        .await
}
