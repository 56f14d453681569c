//! The axum application: routes, middleware (API keys, deadlines, CORS, limits, metrics,
//! tracing), and `serve`.

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{HeaderName, HeaderValue, Method, Uri, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use tokio::time::Instant;
use tower_http::cors::{AllowOrigin, CorsLayer};

use crate::anthropic::{self, AnthropicError, is_anthropic_path};
use crate::deadline::{self, REQUEST_TIMEOUT_HEADER};
use crate::error::{ApiError, OpenAiError, PayloadLimit, log_errors};
use crate::state::AppState;
use crate::{native, openai};

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
        .route("/v1/embeddings", post(openai::embeddings))
        .route("/v1/rerank", post(openai::rerank))
        .route("/v1/score", post(openai::score_route))
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
    let limit = state.payload_limit();
    let cors = cors_layer(state.cors_allow_origin());
    let routes = native_protected
        .merge(openai)
        .merge(messages)
        .merge(open)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(
            state.request_timeout(),
            deadlines,
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
                HeaderName::from_static(REQUEST_TIMEOUT_HEADER),
                HeaderName::from_static(API_KEY_HEADER),
                HeaderName::from_static("anthropic-version"),
                HeaderName::from_static("anthropic-beta"),
            ])
            .max_age(Duration::from_secs(3600)),
    )
}

/// `e` in the shape of the API that `path` belongs to (Anthropic's, OpenAI's or the native
/// one).
fn error_response(path: &str, e: ApiError) -> Response {
    if is_anthropic_path(path) {
        AnthropicError(e).into_response()
    } else if path.starts_with("/v1/") {
        OpenAiError(e).into_response()
    } else {
        e.into_response()
    }
}

async fn not_found(method: Method, uri: Uri) -> Response {
    let e = ApiError::NotFound(format!("{method} {}", uri.path()));
    error_response(uri.path(), e)
}

async fn method_not_allowed(uri: Uri) -> Response {
    error_response(uri.path(), ApiError::MethodNotAllowed)
}

/// Middleware: runs the request within its deadline (the shorter of `server_timeout` and the
/// request's `X-Request-Timeout` header), if it has one.
async fn deadlines(
    State(server_timeout): State<Option<Duration>>,
    req: Request,
    next: Next,
) -> Response {
    let arrived = Instant::now();
    match deadline::timeout(req.headers(), server_timeout) {
        Ok(Some(timeout)) => deadline::within(arrived + timeout, next.run(req)).await,
        Ok(None) => next.run(req).await,
        Err(e) => error_response(req.uri().path(), ApiError::BadRequest(e.to_string())),
    }
}

/// Whether the request carries the key as `Authorization: Bearer <key>`, or, with
/// `x_api_key`, as `x-api-key: <key>` (Anthropic's SDKs); always with no key set.
fn authorized_by(state: &AppState, req: &Request, x_api_key: bool) -> bool {
    let Some(key) = state.api_key() else {
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
