//! Request deadlines: the server's `--request-timeout` and a request's `X-Request-Timeout`
//! header (seconds; the shorter of the two applies), counted from the request's arrival.
//!
//! The server's middleware runs the handler [`within`] its deadline, a task-local that
//! [`crate::Infer`] reads ([`current`]) when it queues the request, so no handler passes it
//! along. A request past its deadline ends as a client disconnect does (its event stream
//! closes and the batcher frees its KV blocks before the next step), with
//! [`crate::InferError::DeadlineExceeded`]: 504, `error_type` `deadline_exceeded`.

use std::future::Future;
use std::time::Duration;

use axum::http::HeaderMap;
use tokio::time::Instant;

/// The header a client sets to bound its own request.
pub const REQUEST_TIMEOUT_HEADER: &str = "x-request-timeout";

tokio::task_local! {
    static DEADLINE: Instant;
}

/// The deadline of the request whose handler runs now, if it has one.
pub(crate) fn current() -> Option<Instant> {
    DEADLINE.try_with(|d| *d).ok()
}

/// Runs `handler` with `deadline` as [`current`].
pub(crate) async fn within<F: Future>(deadline: Instant, handler: F) -> F::Output {
    DEADLINE.scope(deadline, handler).await
}

/// An `X-Request-Timeout` header that is not a positive number of seconds.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the {REQUEST_TIMEOUT_HEADER} header must be a positive number of seconds, e.g. `30` or `2.5`"
)]
pub(crate) struct InvalidTimeoutHeader;

/// How long a request that arrived with `headers` may take: the shorter of
/// `server_timeout` and the request's header, if either is set.
pub(crate) fn timeout(
    headers: &HeaderMap,
    server_timeout: Option<Duration>,
) -> Result<Option<Duration>, InvalidTimeoutHeader> {
    Ok(match (header_timeout(headers)?, server_timeout) {
        (Some(asked), Some(server)) => Some(asked.min(server)),
        (asked, server) => asked.or(server),
    })
}

/// The timeout a request's header asks for.
fn header_timeout(headers: &HeaderMap) -> Result<Option<Duration>, InvalidTimeoutHeader> {
    let Some(value) = headers.get(REQUEST_TIMEOUT_HEADER) else {
        return Ok(None);
    };
    let seconds = value
        .to_str()
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0);
    seconds
        .and_then(|s| Duration::try_from_secs_f64(s).ok())
        .map(Some)
        .ok_or(InvalidTimeoutHeader)
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
            assert_eq!(
                header_timeout(&headers(bad)),
                Err(InvalidTimeoutHeader),
                "{bad}"
            );
        }
    }

    #[test]
    fn the_shorter_timeout_applies() {
        let server = Some(Duration::from_secs(2));
        assert_eq!(timeout(&HeaderMap::new(), None), Ok(None));
        assert_eq!(timeout(&HeaderMap::new(), server), Ok(server));
        assert_eq!(timeout(&headers("5"), server), Ok(server));
        assert_eq!(
            timeout(&headers("0.5"), server),
            Ok(Some(Duration::from_millis(500)))
        );
        assert_eq!(
            timeout(&headers("0.5"), None),
            Ok(Some(Duration::from_millis(500)))
        );
    }

    #[tokio::test]
    async fn the_deadline_is_in_scope_only_inside() {
        assert_eq!(current(), None);
        let at = Instant::now() + Duration::from_secs(1);
        assert_eq!(within(at, async { current() }).await, Some(at));
    }
}
