//! HTTP errors: every error the router answers goes through [`ApiError`], in one of two
//! shapes.
//!
//! - Native routes: `{"error": "<message>", "error_type": "<kind>"}` (TGI).
//! - `/v1` routes ([`OpenAiError`]): `{"error": {"message", "type", "param", "code"}}`.
//!
//! Status codes (both shapes unless noted):
//!
//! | error | status |
//! |---|---|
//! | invalid parameters ([`ValidationError`]) | 422 native, 400 OpenAI (as OpenAI does) |
//! | malformed JSON | 400 |
//! | well-formed JSON with wrong fields or types | 422 native, 400 OpenAI |
//! | missing `Content-Type: application/json` | 415 |
//! | body over the payload limit | 413 |
//! | missing or wrong API key | 401 |
//! | unknown route | 404 |
//! | wrong method | 405 |
//! | too many requests in flight | 429 |
//! | shard failure, generation error, a validation step failing unexpectedly | 500 |
//! | engine unavailable, request cancelled, unhealthy, draining (shutting down) | 503 |
//! | past its deadline (`--request-timeout`, `X-Request-Timeout`) | 504 |
//!
//! The conversion has no side effects: the response carries the error in an extension and
//! the [`log_errors`] middleware logs it.

use axum::Json;
use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::infer::InferError;
use crate::validation::ValidationError;

/// Native routes' error body.
#[derive(Debug, Clone, PartialEq, serde::Serialize, utoipa::ToSchema)]
pub(crate) struct ErrorBody {
    /// What went wrong and what to change.
    pub(crate) error: String,
    /// The error class (the `err` label of `tessera_request_failure_total`).
    pub(crate) error_type: &'static str,
}

/// The inner object of [`OpenAiErrorBody`].
#[derive(Debug, Clone, PartialEq, serde::Serialize, utoipa::ToSchema)]
pub(crate) struct OpenAiErrorDetail {
    /// What went wrong and what to change.
    pub(crate) message: String,
    /// `invalid_request_error`, `server_error` or `requests`.
    #[serde(rename = "type")]
    pub(crate) kind: &'static str,
    /// The field at fault, if one is.
    pub(crate) param: Option<&'static str>,
    /// A machine-readable code (e.g. `invalid_api_key`, `deadline_exceeded`).
    pub(crate) code: Option<&'static str>,
}

/// `/v1` routes' error body (OpenAI's shape).
#[derive(Debug, Clone, PartialEq, serde::Serialize, utoipa::ToSchema)]
pub(crate) struct OpenAiErrorBody {
    /// The error.
    pub(crate) error: OpenAiErrorDetail,
}

/// Everything the HTTP layer can answer with an error.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ApiError {
    /// The request's parameters are invalid.
    #[error("Input validation error: {0}")]
    Validation(ValidationError),
    /// Running the request failed.
    #[error(transparent)]
    Infer(InferError),
    /// The body is not valid JSON.
    #[error("{0}")]
    JsonSyntax(String),
    /// The body is JSON but not the expected shape.
    #[error("{0}")]
    JsonData(String),
    /// The body is not declared as JSON.
    #[error("{0}")]
    UnsupportedMediaType(String),
    /// The body exceeds the payload limit.
    #[error("request body is larger than the limit of {limit} bytes")]
    PayloadTooLarge {
        /// The limit in bytes.
        limit: usize,
    },
    /// The body could not be read.
    #[error("{0}")]
    BadRequest(String),
    /// Missing or wrong API key.
    #[error("invalid or missing API key; send `Authorization: Bearer <key>`")]
    Unauthorized,
    /// No such route.
    #[error("no route for {0}")]
    NotFound(String),
    /// The route exists but not for this method.
    #[error("method not allowed")]
    MethodNotAllowed,
    /// The health check failed.
    #[error("the inference engine is unhealthy")]
    Unhealthy,
    /// A bug or unexpected failure; the detail is logged, not sent.
    #[error("internal server error")]
    Internal(String),
}

impl From<ValidationError> for ApiError {
    fn from(e: ValidationError) -> Self {
        match e {
            ValidationError::Internal(detail) => ApiError::Internal(detail),
            e => ApiError::Validation(e),
        }
    }
}

impl From<InferError> for ApiError {
    fn from(e: InferError) -> Self {
        match e {
            InferError::Validation(v) => ApiError::from(v),
            e => ApiError::Infer(e),
        }
    }
}

impl From<JsonRejection> for ApiError {
    fn from(r: JsonRejection) -> Self {
        let text = r.body_text();
        match r.status() {
            StatusCode::PAYLOAD_TOO_LARGE => ApiError::PayloadTooLarge { limit: 0 },
            StatusCode::UNSUPPORTED_MEDIA_TYPE => ApiError::UnsupportedMediaType(text),
            _ => match r {
                JsonRejection::JsonDataError(_) => ApiError::JsonData(text),
                JsonRejection::JsonSyntaxError(_) => ApiError::JsonSyntax(text),
                _ => ApiError::BadRequest(text),
            },
        }
    }
}

impl ApiError {
    /// The HTTP status on native routes.
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::Validation(_) | ApiError::JsonData(_) => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::JsonSyntax(_) | ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::Unhealthy => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            ApiError::Infer(e) => match e {
                InferError::Overloaded => StatusCode::TOO_MANY_REQUESTS,
                InferError::Validation(_) => StatusCode::UNPROCESSABLE_ENTITY,
                InferError::ShardFailure(_)
                | InferError::GenerationError(_)
                | InferError::IncompleteGeneration => StatusCode::INTERNAL_SERVER_ERROR,
                InferError::Cancelled | InferError::Unavailable | InferError::Draining => {
                    StatusCode::SERVICE_UNAVAILABLE
                }
                InferError::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
            },
        }
    }

    /// The HTTP status on `/v1` routes: OpenAI answers 400 for every invalid request.
    pub fn openai_status(&self) -> StatusCode {
        match self.status() {
            StatusCode::UNPROCESSABLE_ENTITY => StatusCode::BAD_REQUEST,
            s => s,
        }
    }

    /// The native `error_type`.
    pub fn error_type(&self) -> &'static str {
        match self {
            ApiError::Validation(_) => "validation",
            ApiError::Infer(e) => e.error_type(),
            ApiError::JsonSyntax(_) | ApiError::JsonData(_) => "json",
            ApiError::UnsupportedMediaType(_) => "unsupported_media_type",
            ApiError::PayloadTooLarge { .. } => "payload_too_large",
            ApiError::BadRequest(_) => "bad_request",
            ApiError::Unauthorized => "unauthorized",
            ApiError::NotFound(_) => "not_found",
            ApiError::MethodNotAllowed => "method_not_allowed",
            ApiError::Unhealthy => "unhealthy",
            ApiError::Internal(_) => "internal",
        }
    }

    /// The native JSON body.
    pub fn native_body(&self) -> Value {
        let body = ErrorBody {
            error: self.to_string(),
            error_type: self.error_type(),
        };
        serde_json::to_value(body).unwrap_or(Value::Null)
    }

    /// The OpenAI JSON body.
    pub fn openai_body(&self) -> Value {
        let status = self.status();
        let (kind, param, code): (&str, Option<&str>, Option<&str>) = match self {
            ApiError::Validation(v) | ApiError::Infer(InferError::Validation(v)) => {
                ("invalid_request_error", v.param(), None)
            }
            ApiError::Unauthorized => ("invalid_request_error", None, Some("invalid_api_key")),
            ApiError::Infer(InferError::Overloaded) => {
                ("requests", None, Some("rate_limit_exceeded"))
            }
            _ if status.is_server_error() => ("server_error", None, Some(self.error_type())),
            _ => ("invalid_request_error", None, None),
        };
        let body = OpenAiErrorBody {
            error: OpenAiErrorDetail {
                message: self.to_string(),
                kind,
                param,
                code,
            },
        };
        serde_json::to_value(body).unwrap_or(Value::Null)
    }

    fn respond(&self, status: StatusCode, body: Value) -> Response {
        let mut response = (status, Json(body)).into_response();
        response.extensions_mut().insert(self.clone());
        response
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        self.respond(self.status(), self.native_body())
    }
}

/// An [`ApiError`] answered in OpenAI's shape (for `/v1` routes).
#[derive(Debug, Clone, PartialEq)]
pub struct OpenAiError(pub ApiError);

impl IntoResponse for OpenAiError {
    fn into_response(self) -> Response {
        self.0.respond(self.0.openai_status(), self.0.openai_body())
    }
}

impl From<ApiError> for OpenAiError {
    fn from(e: ApiError) -> Self {
        Self(e)
    }
}

impl From<ValidationError> for OpenAiError {
    fn from(e: ValidationError) -> Self {
        Self(e.into())
    }
}

impl From<InferError> for OpenAiError {
    fn from(e: InferError) -> Self {
        Self(e.into())
    }
}

/// The payload limit, stored in request extensions so rejections can name it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PayloadLimit(pub(crate) usize);

/// The request's JSON body, its rejections as [`ApiError`]s (413 naming the limit).
pub(crate) async fn json_body<T: DeserializeOwned>(req: Request) -> Result<T, ApiError> {
    let limit = req.extensions().get::<PayloadLimit>().map(|l| l.0);
    match Json::<T>::from_request(req, &()).await {
        Ok(Json(value)) => Ok(value),
        Err(r) => Err(match ApiError::from(r) {
            ApiError::PayloadTooLarge { .. } => ApiError::PayloadTooLarge {
                limit: limit.unwrap_or(0),
            },
            e => e,
        }),
    }
}

/// A JSON body whose rejections are native [`ApiError`]s.
#[derive(Debug, Clone)]
pub(crate) struct NativeJson<T>(pub(crate) T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for NativeJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, _state: &S) -> Result<Self, Self::Rejection> {
        json_body(req).await.map(Self)
    }
}

/// A JSON body whose rejections are [`OpenAiError`]s.
#[derive(Debug, Clone)]
pub(crate) struct OpenAiJson<T>(pub(crate) T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for OpenAiJson<T> {
    type Rejection = OpenAiError;

    async fn from_request(req: Request, _state: &S) -> Result<Self, Self::Rejection> {
        json_body(req).await.map(Self).map_err(OpenAiError)
    }
}

/// Middleware: logs the [`ApiError`] a response carries (server errors as errors, client
/// errors at debug level).
pub(crate) async fn log_errors(req: Request, next: Next) -> Response {
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let response = next.run(req).await;
    if let Some(error) = response.extensions().get::<ApiError>() {
        let status = response.status().as_u16();
        match error {
            ApiError::Internal(detail) => {
                tracing::error!(%method, %path, status, detail, "internal error")
            }
            e if response.status().is_server_error() => {
                tracing::error!(%method, %path, status, error = %e, "request failed")
            }
            e => tracing::debug!(%method, %path, status, error = %e, "request rejected"),
        }
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn statuses_and_shapes() {
        let v = ApiError::from(ValidationError::EmptyStopSequence);
        assert_eq!(v.status(), StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(v.openai_status(), StatusCode::BAD_REQUEST);
        assert_eq!(
            v.native_body(),
            json!({"error": "Input validation error: `stop` sequences cannot be empty strings",
                   "error_type": "validation"})
        );
        assert_eq!(v.openai_body()["error"]["param"], "stop");
        assert_eq!(v.openai_body()["error"]["type"], "invalid_request_error");
        let o = ApiError::from(InferError::Overloaded);
        assert_eq!(o.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(o.native_body()["error_type"], "overloaded");
        let s = ApiError::from(InferError::ShardFailure("boom".into()));
        assert_eq!(s.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(s.openai_body()["error"]["type"], "server_error");
        assert_eq!(
            ApiError::from(InferError::Validation(ValidationError::EmptyInput(
                "inputs"
            ))),
            ApiError::Validation(ValidationError::EmptyInput("inputs"))
        );
        let i = ApiError::Internal("secret detail".into());
        assert!(!i.native_body().to_string().contains("secret"));
    }

    #[test]
    fn a_validation_step_that_failed_is_internal() {
        let e = ApiError::from(ValidationError::Internal("worker panicked".into()));
        assert_eq!(e, ApiError::Internal("worker panicked".into()));
        assert_eq!(e.status(), StatusCode::INTERNAL_SERVER_ERROR);
        let e = ApiError::from(InferError::Validation(ValidationError::Internal(
            "x".into(),
        )));
        assert_eq!(e.status(), StatusCode::INTERNAL_SERVER_ERROR);
    }

    /// One error of every kind (the match fails to compile when a variant is added, so the
    /// new one is added here and to `FAILURE_CLASSES`).
    fn one_of_each() -> Vec<ApiError> {
        let all = vec![
            ApiError::Validation(ValidationError::EmptyStopSequence),
            ApiError::JsonSyntax(String::new()),
            ApiError::JsonData(String::new()),
            ApiError::UnsupportedMediaType(String::new()),
            ApiError::PayloadTooLarge { limit: 1 },
            ApiError::BadRequest(String::new()),
            ApiError::Unauthorized,
            ApiError::NotFound(String::new()),
            ApiError::MethodNotAllowed,
            ApiError::Unhealthy,
            ApiError::Internal(String::new()),
            ApiError::Infer(InferError::Overloaded),
            ApiError::Infer(InferError::ShardFailure(String::new())),
            ApiError::Infer(InferError::Cancelled),
            ApiError::Infer(InferError::GenerationError(String::new())),
            ApiError::Infer(InferError::IncompleteGeneration),
            ApiError::Infer(InferError::Unavailable),
            ApiError::Infer(InferError::Draining),
            ApiError::Infer(InferError::DeadlineExceeded),
        ];
        for e in &all {
            match e {
                ApiError::Validation(_)
                | ApiError::JsonSyntax(_)
                | ApiError::JsonData(_)
                | ApiError::UnsupportedMediaType(_)
                | ApiError::PayloadTooLarge { .. }
                | ApiError::BadRequest(_)
                | ApiError::Unauthorized
                | ApiError::NotFound(_)
                | ApiError::MethodNotAllowed
                | ApiError::Unhealthy
                | ApiError::Internal(_) => {}
                ApiError::Infer(i) => match i {
                    InferError::Overloaded
                    | InferError::ShardFailure(_)
                    | InferError::Cancelled
                    | InferError::Validation(_)
                    | InferError::GenerationError(_)
                    | InferError::IncompleteGeneration
                    | InferError::Unavailable
                    | InferError::Draining
                    | InferError::DeadlineExceeded => {}
                },
            }
        }
        all
    }

    #[test]
    fn every_error_type_is_a_failure_class_exported_from_the_start() {
        use crate::metrics::names::FAILURE_CLASSES;
        let mut types: Vec<&str> = one_of_each().iter().map(ApiError::error_type).collect();
        types.sort_unstable();
        types.dedup();
        let mut classes = FAILURE_CLASSES.to_vec();
        classes.sort_unstable();
        assert_eq!(types, classes);
    }
}
