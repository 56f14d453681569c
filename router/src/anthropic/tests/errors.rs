//! Every error in Anthropic's shape, with the status and type Anthropic uses for its kind.

use axum::http::StatusCode;
use serde_json::json;

use super::super::error::{AnthropicError, is_anthropic_path};
use crate::error::ApiError;
use crate::infer::InferError;
use crate::validation::ValidationError;

#[test]
fn statuses_types_and_shape() {
    let cases: Vec<(ApiError, u16, &str)> = vec![
        (
            ValidationError::EmptyInput("messages").into(),
            400,
            "invalid_request_error",
        ),
        (
            ApiError::JsonSyntax("bad".into()),
            400,
            "invalid_request_error",
        ),
        (
            ApiError::JsonData("missing field `max_tokens`".into()),
            400,
            "invalid_request_error",
        ),
        (
            ApiError::UnsupportedMediaType("json".into()),
            415,
            "invalid_request_error",
        ),
        (ApiError::Unauthorized, 401, "authentication_error"),
        (
            ApiError::NotFound("GET /v1/messages/x".into()),
            404,
            "not_found_error",
        ),
        (
            ApiError::PayloadTooLarge { limit: 9 },
            413,
            "request_too_large",
        ),
        (InferError::Overloaded.into(), 429, "rate_limit_error"),
        (
            InferError::ShardFailure("x".into()).into(),
            500,
            "api_error",
        ),
        (ApiError::Internal("secret".into()), 500, "api_error"),
        (InferError::Unavailable.into(), 503, "overloaded_error"),
        (InferError::Draining.into(), 503, "overloaded_error"),
        (InferError::DeadlineExceeded.into(), 504, "timeout_error"),
    ];
    for (e, status, kind) in cases {
        let a = AnthropicError(e.clone());
        assert_eq!(
            a.status(),
            StatusCode::from_u16(status).expect("status"),
            "{e}"
        );
        let body = serde_json::to_value(a.body()).expect("serializable");
        assert_eq!(body["type"], "error", "{body}");
        assert_eq!(body["error"]["type"], kind, "{e}");
        assert!(
            body["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{body}"
        );
        assert_eq!(
            body.as_object().map(|o| o.len()),
            Some(2),
            "only `type` and `error`: {body}"
        );
        assert!(
            !body.to_string().contains("secret"),
            "details are logged only"
        );
    }
    let body =
        serde_json::to_value(AnthropicError(ValidationError::EmptyInput("messages").into()).body())
            .expect("serializable");
    assert_eq!(
        body,
        json!({"type": "error", "error": {"type": "invalid_request_error",
               "message": "Input validation error: `messages` cannot be empty"}})
    );
    let auth = AnthropicError(ApiError::Unauthorized).detail().message;
    assert!(auth.contains("x-api-key"), "{auth}");
}

#[test]
fn the_messages_routes_are_anthropic_paths() {
    assert!(is_anthropic_path("/v1/messages"));
    assert!(is_anthropic_path("/v1/messages/count_tokens"));
    assert!(is_anthropic_path("/v1/messages/batches"));
    assert!(!is_anthropic_path("/v1/messagesx"));
    assert!(!is_anthropic_path("/v1/chat/completions"));
}
