//! Anthropic's error shape, `{"type": "error", "error": {"type", "message"}}`, for every error
//! the `/v1/messages` routes answer: invalid requests and bodies, authentication, unknown
//! routes, overload and engine failures, whole or as a stream's `error` event.

use axum::Json;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;

use crate::error::{ApiError, json_body};
use crate::infer::InferError;
use crate::validation::ValidationError;

/// Where the Messages API lives: errors under it take Anthropic's shape.
pub(crate) fn is_anthropic_path(path: &str) -> bool {
    path == "/v1/messages" || path.starts_with("/v1/messages/")
}

/// `error` of an [`AnthropicErrorBody`].
#[derive(Debug, Clone, PartialEq, serde::Serialize, utoipa::ToSchema)]
pub struct AnthropicErrorDetail {
    /// `invalid_request_error`, `authentication_error`, `not_found_error`,
    /// `request_too_large`, `rate_limit_error`, `api_error`, `overloaded_error` or
    /// `timeout_error`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// What went wrong and what to change.
    pub message: String,
}

/// The `/v1/messages` routes' error body (Anthropic's shape).
#[derive(Debug, Clone, PartialEq, serde::Serialize, utoipa::ToSchema)]
pub struct AnthropicErrorBody {
    /// Always `"error"`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The error.
    pub error: AnthropicErrorDetail,
}

/// An [`ApiError`] answered in Anthropic's shape.
#[derive(Debug, Clone, PartialEq)]
pub struct AnthropicError(pub ApiError);

impl AnthropicError {
    /// The status: the one `/v1` routes answer (400 for every invalid request).
    pub(crate) fn status(&self) -> StatusCode {
        self.0.openai_status()
    }

    /// Anthropic's error type for the status.
    pub(crate) fn kind(&self) -> &'static str {
        match self.status().as_u16() {
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            413 => "request_too_large",
            429 => "rate_limit_error",
            503 | 529 => "overloaded_error",
            504 => "timeout_error",
            s if s >= 500 => "api_error",
            _ => "invalid_request_error",
        }
    }

    /// The error object.
    pub(crate) fn detail(&self) -> AnthropicErrorDetail {
        let message = match &self.0 {
            // The SDK sends the key as `x-api-key`; name both ways.
            ApiError::Unauthorized => {
                "invalid or missing API key; send `x-api-key: <key>` or `Authorization: Bearer \
                 <key>`"
                    .to_owned()
            }
            e => e.to_string(),
        };
        AnthropicErrorDetail {
            kind: self.kind(),
            message,
        }
    }

    /// The JSON body.
    pub(crate) fn body(&self) -> AnthropicErrorBody {
        AnthropicErrorBody {
            kind: "error",
            error: self.detail(),
        }
    }
}

impl IntoResponse for AnthropicError {
    fn into_response(self) -> Response {
        let mut response = (self.status(), Json(self.body())).into_response();
        // For the error log and the failure metrics, as every route's errors.
        response.extensions_mut().insert(self.0);
        response
    }
}

impl From<ApiError> for AnthropicError {
    fn from(e: ApiError) -> Self {
        Self(e)
    }
}

impl From<ValidationError> for AnthropicError {
    fn from(e: ValidationError) -> Self {
        Self(e.into())
    }
}

impl From<InferError> for AnthropicError {
    fn from(e: InferError) -> Self {
        Self(e.into())
    }
}

/// A JSON body whose rejections are [`AnthropicError`]s.
#[derive(Debug, Clone)]
pub(crate) struct AnthropicJson<T>(pub(crate) T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for AnthropicJson<T> {
    type Rejection = AnthropicError;

    async fn from_request(req: Request, _state: &S) -> Result<Self, Self::Rejection> {
        json_body(req).await.map(Self).map_err(AnthropicError)
    }
}
