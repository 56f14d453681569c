//! Server-sent events helpers shared by the native and OpenAI streaming routes.

use std::convert::Infallible;

use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::Stream;
use serde::Serialize;

/// An SSE response with keep-alive comments.
pub(crate) fn sse<S>(stream: S) -> Response
where
    S: Stream<Item = Result<Event, Infallible>> + Send + 'static,
{
    Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// An event whose data is `value` as JSON.
pub(crate) fn json_event(value: &impl Serialize) -> Event {
    // Serializing our own response types cannot fail (string keys, no custom impls).
    let data = serde_json::to_string(value).unwrap_or_else(|e| {
        serde_json::json!({ "error": e.to_string(), "error_type": "internal" }).to_string()
    });
    Event::default().data(data)
}

/// OpenAI's end-of-stream marker, `data: [DONE]`.
pub(crate) fn done_event() -> Event {
    Event::default().data("[DONE]")
}
