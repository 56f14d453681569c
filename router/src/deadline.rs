//! Request deadlines: the server's `--request-timeout` and a request's `X-Request-Timeout`
//! header (seconds; the shorter of the two applies), counted from the request's arrival.
//!
//! The middleware [`deadlines`] runs the handler with its deadline in a task-local, which
//! [`crate::Infer`] reads when it queues the request, so no handler passes it along. A
//! request past its deadline ends as a client disconnect does (its event stream closes and
//! the batcher frees its KV blocks before the next step), with
//! [`crate::InferError::DeadlineExceeded`]: 504, `error_type` `deadline_exceeded`.

use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::HeaderMap;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tokio::time::Instant;

use crate::error::{ApiError, OpenAiError};

/// The header a client sets to bound its own request.
pub const REQUEST_TIMEOUT_HEADER: &str = "x-request-timeout";

tokio::task_local! {
    static DEADLINE: Instant;
}

/// The deadline of the request whose handler runs now, if it has one.
pub(crate) fn current() -> Option<Instant> {
    DEADLINE.try_with(|d| *d).ok()
}

/// The timeout a request's header asks for, or the error to answer with.
fn header_timeout(headers: &HeaderMap) -> Result<Option<Duration>, ApiError> {
    let Some(value) = headers.get(REQUEST_TIMEOUT_HEADER) else {
        return Ok(None);
    };
    let seconds = value
        .to_str()
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0);
    match seconds.and_then(|s| Duration::try_from_secs_f64(s).ok()) {
        Some(d) => Ok(Some(d)),
        None => Err(ApiError::BadRequest(format!(
            "the {REQUEST_TIMEOUT_HEADER} header must be a positive number of seconds, e.g. `30` or `2.5`"
        ))),
    }
}

/// Middleware: runs the request with its deadline (the shorter of `server_timeout` and the
/// request's header) in scope.
pub(crate) async fn deadlines(
    State(server_timeout): State<Option<Duration>>,
    req: Request,
    next: Next,
) -> Response {
    let arrived = Instant::now();
    let timeout = match header_timeout(req.headers()) {
        Ok(asked) => match (asked, server_timeout) {
            (Some(a), Some(s)) => Some(a.min(s)),
            (a, s) => a.or(s),
        },
        Err(e) if crate::anthropic::is_anthropic_path(req.uri().path()) => {
            return crate::anthropic::AnthropicError(e).into_response();
        }
        Err(e) if req.uri().path().starts_with("/v1/") => return OpenAiError(e).into_response(),
        Err(e) => return e.into_response(),
    };
    match timeout {
        Some(t) => DEADLINE.scope(arrived + t, next.run(req)).await,
        None => next.run(req).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            REQUEST_TIMEOUT_HEADER,
            HeaderValue::from_str(value).unwrap(),
        );
        h
    }

    #[test]
    fn header_values() {
        assert_eq!(header_timeout(&HeaderMap::new()), Ok(None));
        assert_eq!(
            header_timeout(&headers("2.5")),
            Ok(Some(Duration::from_millis(2500)))
        );
        for bad in ["0", "-1", "soon", "inf", "NaN", "1e300"] {
            let e = header_timeout(&headers(bad)).unwrap_err();
            assert_eq!(e.error_type(), "bad_request", "{bad}");
        }
    }

    #[tokio::test]
    async fn the_deadline_is_in_scope_only_inside() {
        assert_eq!(current(), None);
        let at = Instant::now() + Duration::from_secs(1);
        assert_eq!(DEADLINE.scope(at, async { current() }).await, Some(at));
    }
}
