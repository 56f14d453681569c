//! What one request measured: timings, token counts and how it ended.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Why a request failed. Every failure is counted under its kind; none is dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The server answered a non-2xx status (kept in [`RequestError::status`]).
    Http,
    /// No connection could be made.
    Connect,
    /// The request (including reading its stream) ran past `--timeout`.
    Timeout,
    /// Another error while sending the request or reading the response headers.
    Request,
    /// The connection broke while the stream was being read.
    StreamDropped,
    /// A `data:` payload that is not valid JSON (or not UTF-8); the request counts as failed.
    MalformedChunk,
    /// The stream carried an `{"error": ...}` object.
    ServerError,
    /// The stream ended without `data: [DONE]` and without a `finish_reason`.
    IncompleteStream,
    /// The stream completed but carried no generated text at all.
    NoContent,
}

impl ErrorKind {
    /// The snake_case name used in tables and JSON.
    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::Http => "http",
            ErrorKind::Connect => "connect",
            ErrorKind::Timeout => "timeout",
            ErrorKind::Request => "request",
            ErrorKind::StreamDropped => "stream_dropped",
            ErrorKind::MalformedChunk => "malformed_chunk",
            ErrorKind::ServerError => "server_error",
            ErrorKind::IncompleteStream => "incomplete_stream",
            ErrorKind::NoContent => "no_content",
        }
    }
}

/// A failed request's error.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestError {
    /// The kind, used to count errors.
    pub kind: ErrorKind,
    /// The HTTP status, for [`ErrorKind::Http`].
    pub status: Option<u16>,
    /// Human-readable detail (server message, transport error), truncated.
    pub message: String,
}

impl RequestError {
    /// An error of `kind` with a message (truncated to 300 characters).
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        let mut message: String = message.into();
        if let Some((cut, _)) = message.char_indices().nth(300) {
            message.truncate(cut);
        }
        Self {
            kind,
            status: None,
            message,
        }
    }

    /// The key errors are counted under: the kind, with the status for HTTP errors
    /// (`http_503`).
    pub fn key(&self) -> String {
        match (self.kind, self.status) {
            (ErrorKind::Http, Some(status)) => format!("http_{status}"),
            (kind, _) => kind.name().to_string(),
        }
    }
}

impl fmt::Display for RequestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.key(), self.message)
    }
}

/// Token counts the server reported in a `usage` object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// `prompt_tokens`.
    pub prompt_tokens: u64,
    /// `completion_tokens`.
    pub completion_tokens: u64,
}

/// One request's measurements. Times are seconds as `f64`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RequestRecord {
    /// Position in the request list.
    pub index: usize,
    /// When it was sent, in seconds after the run started.
    pub start_s: f64,
    /// Time to the first chunk carrying generated text; `None` if none came.
    pub ttft_s: Option<f64>,
    /// Gaps between successive chunks carrying generated text.
    pub itl_s: Vec<f64>,
    /// Send to end of stream (`[DONE]`, end of body, or the failure).
    pub latency_s: f64,
    /// Chunks that carried generated text.
    pub content_chunks: u64,
    /// Chunks without generated text (role-only, finish-only, usage, empty strings).
    pub empty_chunks: u64,
    /// Characters of generated text received.
    pub generated_chars: u64,
    /// The `usage` the server sent, if any.
    pub usage: Option<Usage>,
    /// Prompt tokens as counted by the benchmark's tokenizer, if it had one.
    pub expected_prompt_tokens: Option<u64>,
    /// `max_tokens` asked for.
    pub max_tokens: u32,
    /// The last `finish_reason` seen.
    pub finish_reason: Option<String>,
    /// `None` when the request succeeded.
    pub error: Option<RequestError>,
}

impl RequestRecord {
    /// Whether the request succeeded.
    pub fn ok(&self) -> bool {
        self.error.is_none()
    }

    /// Output tokens: the server's `usage.completion_tokens` when given, else the number of
    /// chunks that carried text (one token per chunk, as OpenAI-style servers stream).
    pub fn output_tokens(&self) -> u64 {
        self.usage
            .map_or(self.content_chunks, |u| u.completion_tokens)
    }

    /// Prompt tokens: the server's `usage.prompt_tokens` when given, else the benchmark's
    /// own count (0 when unknown).
    pub fn prompt_tokens(&self) -> u64 {
        self.usage
            .map(|u| u.prompt_tokens)
            .or(self.expected_prompt_tokens)
            .unwrap_or(0)
    }

    /// Time per output token after the first: `(latency - ttft) / (output_tokens - 1)`;
    /// `None` with fewer than two output tokens or no first token.
    pub fn tpot_s(&self) -> Option<f64> {
        let ttft = self.ttft_s?;
        let n = self.output_tokens();
        (n > 1).then(|| (self.latency_s - ttft) / (n - 1) as f64)
    }
}
