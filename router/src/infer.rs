//! The seam between the HTTP layer and the batcher.
//!
//! Handlers validate a request into a [`ValidGenerateRequest`], then hand it to [`Infer`],
//! which wraps it in an [`Entry`] and sends it to the batcher task over a bounded channel.
//! The batcher answers on the entry's `response_tx` with [`InferStreamResponse`] events.
//!
//! Contract for the batcher:
//! - zero or one [`InferStreamResponse::Prefill`] first (only when `decoder_input_details`),
//!   then any number of [`InferStreamResponse::Intermediate`], then exactly one
//!   [`InferStreamResponse::End`]; or an `Err` at any point, after which nothing is sent.
//! - every event's `token.text` is text that may be shown to the client: already
//!   detokenized, with stop sequences held back and trimmed. The concatenation of all
//!   `token.text` values equals `generated_text.text` (it may be empty for a token).
//! - when `response_tx.is_closed()` (or a send fails) the client is gone: free the request.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Instant;

use futures::{Future, Stream};
use serde::Serialize;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};

use crate::metrics as m;
use crate::pooling::Task;
// Re-exported for the batcher, which names it from here.
pub(crate) use crate::validation::ValidGenerateRequest;
use crate::validation::ValidationError;

/// What the batcher receives for each request.
#[derive(Debug)]
pub struct Entry {
    /// The validated request.
    pub request: ValidGenerateRequest,
    /// Where to send the events; closed when the client went away.
    pub response_tx: mpsc::UnboundedSender<Result<InferStreamResponse, InferError>>,
    /// When the request was queued.
    pub queued: Instant,
    /// The request's tracing span.
    pub span: tracing::Span,
}

/// One event of a running request, sent by the batcher.
#[derive(Debug, Clone, PartialEq)]
pub enum InferStreamResponse {
    /// The prompt tokens with their logprobs (only when `decoder_input_details`).
    Prefill(Vec<PrefillToken>),
    /// A generated token that did not finish the request.
    Intermediate {
        /// The token.
        token: Token,
        /// Its most likely alternatives (`top_n_tokens` of them).
        top_tokens: Vec<Token>,
    },
    /// The last generated token.
    End {
        /// The token.
        token: Token,
        /// Its most likely alternatives.
        top_tokens: Vec<Token>,
        /// The whole output.
        generated_text: GeneratedText,
        /// When the request was queued.
        queued: Instant,
        /// When its prefill started.
        start: Instant,
    },
    /// A pooling request's result (it generates nothing; see [`Infer::pool`]).
    Pooled {
        /// The pooled vector, or the label logits, as the shards computed them.
        values: Vec<f32>,
        /// When the request was queued.
        queued: Instant,
        /// When its prefill started.
        start: Instant,
    },
}

/// A generated token.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct Token {
    /// Token id.
    pub id: u32,
    /// The text this token adds to the output (may be empty, see the module docs).
    pub text: String,
    /// Log-probability of the token.
    pub logprob: f32,
    /// Whether it is a special token.
    pub special: bool,
    /// The token's own text, decoded alone (what logprobs report; `text` is the part of the
    /// output it completes, which differs for characters split across tokens).
    #[serde(skip)]
    pub piece: String,
}

/// A prompt token with its logprob.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct PrefillToken {
    /// Token id.
    pub id: u32,
    /// Its text.
    pub text: String,
    /// Log-probability given the tokens before it; `None` for the first token.
    pub logprob: Option<f32>,
}

/// The final output of a request.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct GeneratedText {
    /// The generated text (stop sequence trimmed).
    pub text: String,
    /// How many tokens were generated.
    pub generated_tokens: u32,
    /// Why generation stopped.
    pub finish_reason: FinishReason,
    /// The stop sequence that ended it (with [`FinishReason::StopSequence`]; `None` when a
    /// stop token id did), which Anthropic's `stop_sequence` reports.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop_sequence: Option<String>,
    /// The sampling seed used, if sampling.
    pub seed: Option<u64>,
    /// For each step that verified a speculator's proposals for this request, how many it
    /// accepted (the step produced one token more); empty without speculation.
    pub accepted_per_step: Vec<u32>,
}

/// Why generation stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// `max_new_tokens` reached.
    Length,
    /// The model produced an end-of-sequence token.
    EosToken,
    /// A stop sequence matched.
    StopSequence,
}

impl FinishReason {
    /// The OpenAI name: `"length"` or `"stop"`.
    pub fn openai(self) -> &'static str {
        match self {
            FinishReason::Length => "length",
            FinishReason::EosToken | FinishReason::StopSequence => "stop",
        }
    }
}

/// Why a request could not be served.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum InferError {
    /// Too many requests in flight.
    #[error("Model is overloaded")]
    Overloaded,
    /// A shard failed while running the request.
    #[error("Shard failure: {0}")]
    ShardFailure(String),
    /// The request was cancelled by the server (shutdown, preemption given up, ...).
    #[error("Request was cancelled")]
    Cancelled,
    /// The request is invalid (found after queueing, e.g. by the scheduler).
    #[error("Input validation error: {0}")]
    Validation(#[from] ValidationError),
    /// Generation failed.
    #[error("Request failed during generation: {0}")]
    GenerationError(String),
    /// The batcher stopped answering before the request finished.
    #[error("Incomplete generation")]
    IncompleteGeneration,
    /// The batcher is not running.
    #[error("Inference engine is unavailable")]
    Unavailable,
    /// The request ran past its deadline (`--request-timeout` or `X-Request-Timeout`).
    #[error(
        "the request ran past its deadline; raise `X-Request-Timeout` (or the server's --request-timeout) or ask for fewer tokens"
    )]
    DeadlineExceeded,
    /// The server is shutting down and takes no new requests.
    #[error("the server is shutting down and takes no new requests; send it to another replica")]
    Draining,
}

impl InferError {
    /// A short label for metrics and logs.
    pub fn error_type(&self) -> &'static str {
        match self {
            InferError::Overloaded => "overloaded",
            InferError::ShardFailure(_) => "shard_failure",
            InferError::Cancelled => "cancelled",
            InferError::Validation(_) => "validation",
            InferError::GenerationError(_) => "generation",
            InferError::IncompleteGeneration => "incomplete_generation",
            InferError::Unavailable => "unavailable",
            InferError::Draining => "draining",
            InferError::DeadlineExceeded => "deadline_exceeded",
        }
    }
}

/// Everything a finished, non-streamed request produced.
#[derive(Debug, Clone, PartialEq)]
pub struct InferResponse {
    /// The output.
    pub generated_text: GeneratedText,
    /// Every generated token, in order (the last one included).
    pub tokens: Vec<Token>,
    /// The alternatives of each generated token (empty lists when not asked for).
    pub top_tokens: Vec<Vec<Token>>,
    /// The prompt tokens (empty unless `decoder_input_details`).
    pub prefill: Vec<PrefillToken>,
    /// When the request was queued.
    pub queued: Instant,
    /// When its prefill started.
    pub start: Instant,
}

/// The handle the HTTP layer uses to run requests. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Infer {
    queue: mpsc::Sender<Entry>,
    limit: Arc<Semaphore>,
    max_concurrent_requests: usize,
    draining: Arc<AtomicBool>,
    /// The task the server runs: requests of another are refused.
    task: Task,
}

impl Infer {
    /// A handle sending entries on `queue`, with at most `max_concurrent_requests` requests
    /// in flight (more are refused at once with [`InferError::Overloaded`]).
    pub fn new(queue: mpsc::Sender<Entry>, max_concurrent_requests: usize) -> Self {
        Self {
            queue,
            limit: Arc::new(Semaphore::new(max_concurrent_requests)),
            max_concurrent_requests,
            draining: Arc::new(AtomicBool::new(false)),
            task: Task::Generate,
        }
    }

    /// The handle of a server that runs `task` (generation by default): generation requests
    /// are refused by a server that embeds or scores, whose model may have no LM head.
    /// [`crate::AppStateBuilder`] sets it from the server's [`crate::PoolingModel`].
    pub(crate) fn serving(mut self, task: Task) -> Self {
        self.task = task;
        self
    }

    /// Stops taking requests: from now on [`Infer::try_acquire`] fails with
    /// [`InferError::Draining`] and the readiness check fails; requests in flight go on.
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    /// Whether [`Infer::start_draining`] was called.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// Requests holding a permit now.
    pub fn in_flight(&self) -> usize {
        self.max_concurrent_requests
            .saturating_sub(self.limit.available_permits())
    }

    /// Resolves once no request holds a permit (every permit is back).
    pub async fn drained(&self) {
        let all = u32::try_from(self.max_concurrent_requests).unwrap_or(u32::MAX);
        // Taking every permit at once waits for the last request; they are released at once
        // (the semaphore is never closed, so the error arm cannot happen).
        let _all = self.limit.acquire_many(all).await;
    }

    /// The configured concurrency limit.
    pub fn max_concurrent_requests(&self) -> usize {
        self.max_concurrent_requests
    }

    /// Takes a concurrency permit, or fails at once with [`InferError::Overloaded`] (or
    /// [`InferError::Draining`] once draining started).
    pub fn try_acquire(&self) -> Result<OwnedSemaphorePermit, InferError> {
        if self.is_draining() {
            return Err(InferError::Draining);
        }
        self.limit
            .clone()
            .try_acquire_owned()
            .map_err(|_| InferError::Overloaded)
    }

    /// Queues a request and returns its event stream with the permit it holds.
    pub async fn generate_stream(
        &self,
        request: ValidGenerateRequest,
    ) -> Result<AdmittedRequest, InferError> {
        let permit = self.try_acquire()?;
        let events = self.enqueue(request).await?;
        Ok(AdmittedRequest { permit, events })
    }

    /// Queues a request under a permit taken earlier with [`Infer::try_acquire`]. The
    /// stream ends with [`InferError::DeadlineExceeded`] at the request's deadline, if it has
    /// one (see [`crate::deadline`]).
    pub async fn enqueue(&self, request: ValidGenerateRequest) -> Result<InferStream, InferError> {
        if request.pooling.is_none() && self.task != Task::Generate {
            return Err(InferError::Validation(ValidationError::Task {
                route: "text generation",
                needed: Task::Generate.name(),
                running: self.task.name(),
            }));
        }
        let deadline = crate::deadline::current();
        if deadline.is_some_and(|d| d <= tokio::time::Instant::now()) {
            m::record_refused(InferError::DeadlineExceeded.error_type());
            return Err(InferError::DeadlineExceeded);
        }
        let (response_tx, response_rx) = mpsc::unbounded_channel();
        let input_length = request.input_ids.len();
        let max_new_tokens = request.stopping.max_new_tokens;
        let entry = Entry {
            request,
            response_tx,
            queued: Instant::now(),
            span: crate::telemetry::infer_span(input_length, max_new_tokens),
        };
        let queued = entry.queued;
        // Refused here, the request is counted by the HTTP layer (`metrics::track_requests`).
        self.queue
            .send(entry)
            .await
            .map_err(|_| InferError::Unavailable)?;
        m::record_request(input_length, max_new_tokens);
        Ok(InferStream {
            rx: response_rx,
            done: false,
            queued,
            last_token: None,
            deadline: deadline.map(|d| Box::pin(tokio::time::sleep_until(d))),
        })
    }

    /// Runs pooling requests (one per input of a client's request, under one permit) and
    /// returns their results in order; the first failure fails them all.
    pub(crate) async fn pool(
        &self,
        requests: Vec<ValidGenerateRequest>,
    ) -> Result<Vec<Vec<f32>>, InferError> {
        let _permit = self.try_acquire()?;
        let mut streams = Vec::with_capacity(requests.len());
        for request in requests {
            streams.push(self.enqueue(request).await?);
        }
        futures::future::try_join_all(streams.into_iter().map(pooled)).await
    }

    /// Runs a request to the end and collects its output.
    pub async fn generate(
        &self,
        request: ValidGenerateRequest,
    ) -> Result<InferResponse, InferError> {
        let admitted = self.generate_stream(request).await?;
        let _permit = admitted.permit;
        collect(admitted.events).await
    }
}

/// A queued request: its events, and the concurrency permit it holds. The permit bounds the
/// number of requests in flight: keep it alive as long as the stream. Dropping the stream
/// cancels the request.
#[derive(Debug)]
pub struct AdmittedRequest {
    /// The permit.
    pub permit: OwnedSemaphorePermit,
    /// The request's events.
    pub events: InferStream,
}

/// Collects a request's events into an [`InferResponse`].
pub(crate) async fn collect(mut stream: InferStream) -> Result<InferResponse, InferError> {
    use futures::StreamExt;
    let mut tokens = Vec::new();
    let mut top = Vec::new();
    let mut prefill = Vec::new();
    while let Some(event) = stream.next().await {
        match event? {
            InferStreamResponse::Prefill(p) => prefill = p,
            InferStreamResponse::Pooled { .. } => break,
            InferStreamResponse::Intermediate { token, top_tokens } => {
                tokens.push(token);
                top.push(top_tokens);
            }
            InferStreamResponse::End {
                token,
                top_tokens,
                generated_text,
                queued,
                start,
            } => {
                tokens.push(token);
                top.push(top_tokens);
                return Ok(InferResponse {
                    generated_text,
                    tokens,
                    top_tokens: top,
                    prefill,
                    queued,
                    start,
                });
            }
        }
    }
    Err(InferError::IncompleteGeneration)
}

/// A pooling request's result.
async fn pooled(mut stream: InferStream) -> Result<Vec<f32>, InferError> {
    use futures::StreamExt;
    match stream.next().await {
        Some(Ok(InferStreamResponse::Pooled { values, .. })) => Ok(values),
        Some(Err(e)) => Err(e),
        Some(Ok(_)) | None => Err(InferError::IncompleteGeneration),
    }
}

/// The events of one request. Ends after [`InferStreamResponse::End`] or an error; yields
/// [`InferError::IncompleteGeneration`] if the batcher drops the request without either, and
/// [`InferError::DeadlineExceeded`] at the request's deadline. Dropping it before its end
/// (the client went away) or its deadline closes the channel, which tells the batcher to
/// free the request; either counts as a failure (`cancelled`, `deadline_exceeded`).
#[derive(Debug)]
pub struct InferStream {
    rx: mpsc::UnboundedReceiver<Result<InferStreamResponse, InferError>>,
    done: bool,
    /// When the request was queued (time to first token).
    queued: Instant,
    /// When the last token arrived (inter-token latency).
    last_token: Option<Instant>,
    /// Fires at the request's deadline.
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl Drop for InferStream {
    fn drop(&mut self) {
        if !self.done {
            m::record_failure("cancelled");
        }
    }
}

impl Stream for InferStream {
    type Item = Result<InferStreamResponse, InferError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.done {
            return Poll::Ready(None);
        }
        // Before the channel, which may always have an event ready.
        let past_deadline =
            (self.deadline.as_mut()).is_some_and(|d| d.as_mut().poll(cx).is_ready());
        let item = match self.rx.poll_recv(cx) {
            _ if past_deadline => Err(InferError::DeadlineExceeded),
            Poll::Pending => return Poll::Pending,
            Poll::Ready(None) => Err(InferError::IncompleteGeneration),
            Poll::Ready(Some(item)) => item,
        };
        if let Ok(InferStreamResponse::Intermediate { .. } | InferStreamResponse::End { .. }) =
            &item
        {
            self.last_token = Some(m::record_token(self.queued, self.last_token));
        }
        match &item {
            Ok(InferStreamResponse::End {
                generated_text,
                queued,
                start,
                ..
            }) => {
                self.done = true;
                m::record_success(generated_text, *queued, *start);
            }
            Ok(InferStreamResponse::Pooled { queued, start, .. }) => {
                self.done = true;
                m::record_pooled(*queued, *start);
            }
            Err(e) => {
                self.done = true;
                m::record_failure(e.error_type());
            }
            Ok(_) => {}
        }
        if self.done {
            // Release the channel now: the batcher sees it closed even if the
            // consumer keeps this stream around.
            self.rx.close();
        }
        Poll::Ready(Some(item))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;
    use tessera_params::{SamplingParams, StoppingParams};

    fn request() -> ValidGenerateRequest {
        ValidGenerateRequest {
            inputs: "hi".into(),
            input_ids: vec![1, 2],
            parameters: SamplingParams::default(),
            stopping: StoppingParams {
                max_new_tokens: 4,
                stop_sequences: vec![],
                ignore_eos: false,
                stop_token_ids: vec![],
            },
            constraint: None,
            decoder_input_details: false,
            skip_special_tokens: true,
            pooling: None,
        }
    }

    fn token(id: u32, text: &str) -> Token {
        Token {
            id,
            text: text.into(),
            logprob: -0.5,
            special: false,
            piece: text.into(),
        }
    }

    #[tokio::test]
    async fn generate_collects_events() {
        let (tx, mut rx) = mpsc::channel(4);
        let infer = Infer::new(tx, 2);
        let batcher = tokio::spawn(async move {
            let entry = rx.recv().await.unwrap();
            assert_eq!(entry.request.input_ids, vec![1, 2]);
            let send = |e| entry.response_tx.send(Ok(e)).unwrap();
            send(InferStreamResponse::Intermediate {
                token: token(5, "a"),
                top_tokens: vec![],
            });
            send(InferStreamResponse::End {
                token: token(6, "b"),
                top_tokens: vec![],
                generated_text: GeneratedText {
                    text: "ab".into(),
                    generated_tokens: 2,
                    finish_reason: FinishReason::Length,
                    stop_sequence: None,
                    seed: None,
                    accepted_per_step: vec![],
                },
                queued: entry.queued,
                start: Instant::now(),
            });
        });
        let out = infer.generate(request()).await.unwrap();
        assert_eq!(out.generated_text.text, "ab");
        assert_eq!(out.tokens.len(), 2);
        batcher.await.unwrap();
    }

    #[tokio::test]
    async fn overloaded_and_permits() {
        let (tx, _rx) = mpsc::channel(4);
        let infer = Infer::new(tx, 1);
        let AdmittedRequest { permit, events: _s } =
            infer.generate_stream(request()).await.unwrap();
        assert_eq!(
            infer.generate_stream(request()).await.unwrap_err(),
            InferError::Overloaded
        );
        drop(permit);
        assert!(infer.generate_stream(request()).await.is_ok());
    }

    #[tokio::test]
    async fn dropped_batcher_is_incomplete_and_closed_queue_unavailable() {
        let (tx, mut rx) = mpsc::channel(4);
        let infer = Infer::new(tx, 4);
        let AdmittedRequest {
            permit: _p,
            events: mut s,
        } = infer.generate_stream(request()).await.unwrap();
        drop(rx.recv().await.unwrap());
        assert_eq!(
            s.next().await.unwrap().unwrap_err(),
            InferError::IncompleteGeneration
        );
        assert!(s.next().await.is_none());
        drop(rx);
        assert_eq!(
            infer.generate(request()).await.unwrap_err(),
            InferError::Unavailable
        );
    }

    #[tokio::test]
    async fn dropping_the_stream_closes_the_sender() {
        let (tx, mut rx) = mpsc::channel(4);
        let infer = Infer::new(tx, 4);
        let AdmittedRequest {
            permit: _p,
            events: s,
        } = infer.generate_stream(request()).await.unwrap();
        let entry = rx.recv().await.unwrap();
        assert!(!entry.response_tx.is_closed());
        drop(s);
        assert!(entry.response_tx.is_closed());
    }
}
