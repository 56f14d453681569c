//! [`Sse`]: a server-sent events reader.

use std::time::Duration;

use futures::StreamExt;
use serde_json::Value;

use crate::{REQUEST_TIMEOUT, within};

/// A server-sent events reader over a streaming response.
pub struct Sse {
    body: futures::stream::BoxStream<'static, reqwest::Result<Vec<u8>>>,
    buf: Vec<u8>,
}

impl std::fmt::Debug for Sse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sse")
            .field("buffered", &self.buf.len())
            .finish()
    }
}

/// One thing read from an SSE stream.
#[derive(Debug, Clone, PartialEq)]
pub enum SseItem {
    /// The `data` of one event (lines joined with `\n`).
    Data(String),
    /// The stream ended cleanly.
    End,
    /// Reading failed (connection reset, ...).
    Error(String),
}

impl Sse {
    /// Reads `response`'s body as SSE.
    pub fn new(response: reqwest::Response) -> Self {
        Self {
            body: response
                .bytes_stream()
                .map(|chunk| chunk.map(|b| b.to_vec()))
                .boxed(),
            buf: Vec::new(),
        }
    }

    fn take_event(&mut self) -> Option<Option<String>> {
        let end = self.buf.windows(2).position(|w| w == b"\n\n")?;
        let raw: Vec<u8> = self.buf.drain(..end + 2).collect();
        let text = String::from_utf8_lossy(&raw).replace("\r\n", "\n");
        let data: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .map(|d| d.strip_prefix(' ').unwrap_or(d))
            .collect();
        // Comment-only events (keep-alives) have no data.
        Some((!data.is_empty()).then(|| data.join("\n")))
    }

    /// The next event's data, skipping keep-alive comments; waits at most `limit`
    /// (panics after that).
    pub async fn next_item(&mut self, limit: Duration) -> SseItem {
        within("the next SSE event", limit, async {
            loop {
                match self.take_event() {
                    Some(Some(data)) => return SseItem::Data(data),
                    Some(None) => continue,
                    None => {}
                }
                match self.body.next().await {
                    Some(Ok(bytes)) => self.buf.extend_from_slice(&bytes),
                    Some(Err(e)) => return SseItem::Error(e.to_string()),
                    None => return SseItem::End,
                }
            }
        })
        .await
    }

    /// The next event's data as JSON (`None` at the end of the stream or for `[DONE]`);
    /// panics on a transport error or on data that is not JSON.
    pub async fn next_json(&mut self) -> Option<Value> {
        match self.next_item(REQUEST_TIMEOUT).await {
            SseItem::Data(d) if d == "[DONE]" => None,
            SseItem::Data(d) => {
                Some(serde_json::from_str(&d).unwrap_or_else(|e| panic!("SSE data {d:?}: {e}")))
            }
            SseItem::End => None,
            SseItem::Error(e) => panic!("SSE stream failed: {e}"),
        }
    }

    /// Every remaining event's data until the end of the stream (`[DONE]` included);
    /// panics on a transport error or when it takes longer than [`REQUEST_TIMEOUT`].
    pub async fn collect_data(mut self) -> Vec<String> {
        within("the whole SSE stream", REQUEST_TIMEOUT, async {
            let mut out = Vec::new();
            loop {
                match self.next_item(REQUEST_TIMEOUT).await {
                    SseItem::Data(d) => out.push(d),
                    SseItem::End => return out,
                    SseItem::Error(e) => panic!("SSE stream failed after {out:?}: {e}"),
                }
            }
        })
        .await
    }

    /// Every remaining event parsed as JSON, `[DONE]` left out; also returns whether
    /// `[DONE]` was the last event.
    pub async fn collect_json(self) -> (Vec<Value>, bool) {
        let data = self.collect_data().await;
        let done = data.last().is_some_and(|d| d == "[DONE]");
        let events = data
            .iter()
            .filter(|d| *d != "[DONE]")
            .map(|d| serde_json::from_str(d).unwrap_or_else(|e| panic!("SSE data {d:?}: {e}")))
            .collect();
        (events, done)
    }
}
