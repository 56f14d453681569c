//! Sends one streaming request to an OpenAI-compatible server and measures it.
//!
//! The stream is read chunk by chunk through [`SseParser`]; each event goes to a
//! [`StreamAccumulator`], which is pure (it takes the arrival time as an argument) so its
//! arithmetic is unit-tested with exact times.

use std::time::{Duration, Instant};

use futures::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::record::{ErrorKind, RequestError, RequestRecord, Usage};
use crate::sse::{SseEvent, SseParser};

/// Which OpenAI route to call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Endpoint {
    /// `/v1/chat/completions`: the prompt is one user message (the server's chat template
    /// adds tokens around it).
    Chat,
    /// `/v1/completions`: the prompt is sent as is.
    Completions,
}

impl Endpoint {
    /// The route under the server's base URL.
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::Chat => "/v1/chat/completions",
            Endpoint::Completions => "/v1/completions",
        }
    }
}

/// The server and the request parameters shared by every request of a run.
#[derive(Debug, Clone)]
pub struct Target {
    /// Base URL, e.g. `http://127.0.0.1:3000` (a trailing `/v1` is accepted).
    pub base_url: String,
    /// The route.
    pub endpoint: Endpoint,
    /// The `model` field.
    pub model: String,
    /// Sent as `Authorization: Bearer <key>`.
    pub api_key: Option<String>,
    /// Send `ignore_eos: true` (a vLLM extension Tessera, vLLM and SGLang accept).
    pub ignore_eos: bool,
    /// Sampling temperature (0 is greedy).
    pub temperature: f32,
    /// Extra JSON fields merged into every request body (they win over ours).
    pub extra_body: serde_json::Map<String, Value>,
}

impl Target {
    /// The full URL of the endpoint.
    pub fn url(&self) -> String {
        let base = self.base_url.trim_end_matches('/');
        let base = base.strip_suffix("/v1").unwrap_or(base);
        format!("{base}{}", self.endpoint.path())
    }

    /// The JSON body of a streaming request for `spec`.
    pub fn body(&self, spec: &RequestSpec) -> Value {
        let mut body = json!({
            "model": self.model,
            "max_tokens": spec.output_len,
            "temperature": self.temperature,
            "stream": true,
            "stream_options": {"include_usage": true},
        });
        let obj = body.as_object_mut().expect("a JSON object literal");
        match self.endpoint {
            Endpoint::Chat => {
                obj.insert(
                    "messages".into(),
                    json!([{"role": "user", "content": spec.prompt}]),
                );
            }
            Endpoint::Completions => {
                obj.insert("prompt".into(), json!(spec.prompt));
            }
        }
        if self.ignore_eos {
            obj.insert("ignore_eos".into(), json!(true));
        }
        for (k, v) in &self.extra_body {
            obj.insert(k.clone(), v.clone());
        }
        body
    }
}

/// One request to send.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestSpec {
    /// The prompt text.
    pub prompt: String,
    /// Its length in tokens by the benchmark's tokenizer, if known.
    pub prompt_tokens: Option<u64>,
    /// `max_tokens`.
    pub output_len: u32,
}

/// Builds a request's record from its stream events. Times are given by the caller.
#[derive(Debug)]
pub struct StreamAccumulator {
    sent: Instant,
    first: Option<Instant>,
    last: Option<Instant>,
    itl_s: Vec<f64>,
    content_chunks: u64,
    empty_chunks: u64,
    generated_chars: u64,
    usage: Option<Usage>,
    finish_reason: Option<String>,
    done: bool,
    error: Option<RequestError>,
}

impl StreamAccumulator {
    /// Starts measuring a request sent at `sent`.
    pub fn new(sent: Instant) -> Self {
        Self {
            sent,
            first: None,
            last: None,
            itl_s: Vec::new(),
            content_chunks: 0,
            empty_chunks: 0,
            generated_chars: 0,
            usage: None,
            finish_reason: None,
            done: false,
            error: None,
        }
    }

    /// Whether `data: [DONE]` arrived.
    pub fn done(&self) -> bool {
        self.done
    }

    /// Records the first error (later ones are consequences and ignored).
    pub fn fail(&mut self, error: RequestError) {
        self.error.get_or_insert(error);
    }

    /// Handles one event that arrived at `now`.
    pub fn event(&mut self, now: Instant, event: &SseEvent) {
        let data = event.data.trim();
        if data == "[DONE]" {
            self.done = true;
            return;
        }
        let value: Value = match serde_json::from_str(data) {
            Ok(v) => v,
            Err(e) => {
                self.empty_chunks += 1;
                return self.fail(RequestError::new(
                    ErrorKind::MalformedChunk,
                    format!("{e}: {data}"),
                ));
            }
        };
        if let Some(error) = value.get("error").filter(|e| !e.is_null()) {
            let message = error
                .get("message")
                .and_then(Value::as_str)
                .map_or_else(|| error.to_string(), str::to_string);
            return self.fail(RequestError::new(ErrorKind::ServerError, message));
        }
        if event.event.as_deref() == Some("error") {
            return self.fail(RequestError::new(ErrorKind::ServerError, data));
        }
        if let Some(usage) = value.get("usage").and_then(parse_usage) {
            self.usage = Some(usage);
        }
        let mut text = String::new();
        for choice in value
            .get("choices")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let piece = choice
                .get("delta")
                .and_then(|d| d.get("content"))
                .or_else(|| choice.get("text"))
                .and_then(Value::as_str);
            text.push_str(piece.unwrap_or(""));
            if let Some(reason) = choice.get("finish_reason").and_then(Value::as_str) {
                self.finish_reason = Some(reason.to_string());
            }
        }
        if text.is_empty() {
            self.empty_chunks += 1;
            return;
        }
        self.content_chunks += 1;
        self.generated_chars += text.chars().count() as u64;
        if let Some(last) = self.last {
            self.itl_s.push(now.duration_since(last).as_secs_f64());
        } else {
            self.first = Some(now);
        }
        self.last = Some(now);
    }

    /// The record of a stream that ended at `end`; `run_start` dates `start_s`.
    pub fn finish(mut self, end: Instant, run_start: Instant, spec: &RequestSpec) -> RequestRecord {
        if self.error.is_none() {
            if !self.done && self.finish_reason.is_none() {
                self.fail(RequestError::new(
                    ErrorKind::IncompleteStream,
                    "the stream ended without [DONE] or a finish_reason",
                ));
            } else if self.content_chunks == 0 {
                self.fail(RequestError::new(
                    ErrorKind::NoContent,
                    "the stream carried no generated text",
                ));
            }
        }
        RequestRecord {
            index: 0,
            start_s: self.sent.saturating_duration_since(run_start).as_secs_f64(),
            ttft_s: self
                .first
                .map(|t| t.duration_since(self.sent).as_secs_f64()),
            itl_s: self.itl_s,
            latency_s: end.saturating_duration_since(self.sent).as_secs_f64(),
            content_chunks: self.content_chunks,
            empty_chunks: self.empty_chunks,
            generated_chars: self.generated_chars,
            usage: self.usage,
            expected_prompt_tokens: spec.prompt_tokens,
            max_tokens: spec.output_len,
            finish_reason: self.finish_reason,
            error: self.error,
        }
    }
}

fn parse_usage(value: &Value) -> Option<Usage> {
    Some(Usage {
        prompt_tokens: value.get("prompt_tokens")?.as_u64()?,
        completion_tokens: value.get("completion_tokens")?.as_u64()?,
    })
}

fn transport_error(e: &reqwest::Error, reading: bool) -> RequestError {
    let kind = if e.is_timeout() {
        ErrorKind::Timeout
    } else if e.is_connect() {
        ErrorKind::Connect
    } else if reading {
        ErrorKind::StreamDropped
    } else {
        ErrorKind::Request
    };
    // The chain carries the useful part ("connection reset", "unexpected EOF").
    let mut message = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        message.push_str(": ");
        message.push_str(&s.to_string());
        source = s.source();
    }
    RequestError::new(kind, message)
}

/// An HTTP client for benchmarking: no proxy, `timeout` per request (stream included).
pub fn http_client(timeout: Duration, pool_size: usize) -> reqwest::Result<reqwest::Client> {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(timeout)
        .connect_timeout(Duration::from_secs(10).min(timeout))
        .pool_max_idle_per_host(pool_size)
        .tcp_nodelay(true)
        .build()
}

/// Sends `spec` and reads its stream to the end; never fails (failures are in the record).
pub async fn send(
    client: &reqwest::Client,
    target: &Target,
    spec: &RequestSpec,
    run_start: Instant,
) -> RequestRecord {
    let mut request = client.post(target.url()).json(&target.body(spec));
    if let Some(key) = &target.api_key {
        request = request.bearer_auth(key);
    }
    let sent = Instant::now();
    let mut acc = StreamAccumulator::new(sent);
    let response = match request.send().await {
        Ok(r) => r,
        Err(e) => {
            acc.fail(transport_error(&e, false));
            return acc.finish(Instant::now(), run_start, spec);
        }
    };
    let status = response.status();
    if !status.is_success() {
        let body = response.text().await.unwrap_or_default();
        acc.fail(RequestError {
            status: Some(status.as_u16()),
            ..RequestError::new(ErrorKind::Http, body)
        });
        return acc.finish(Instant::now(), run_start, spec);
    }
    let mut parser = SseParser::new();
    let mut body = response.bytes_stream();
    let mut end = None;
    'read: while let Some(chunk) = body.next().await {
        let now = Instant::now();
        let bytes = match chunk {
            Ok(b) => b,
            Err(e) => {
                acc.fail(transport_error(&e, true));
                break;
            }
        };
        for item in parser.push(&bytes) {
            match item {
                Ok(event) => acc.event(now, &event),
                Err(e) => acc.fail(RequestError::new(ErrorKind::MalformedChunk, e.to_string())),
            }
            if acc.done() {
                end = Some(now);
                break 'read;
            }
        }
    }
    let now = Instant::now();
    if !acc.done() {
        match parser.finish() {
            Some(Ok(event)) => acc.event(now, &event),
            Some(Err(e)) => acc.fail(RequestError::new(ErrorKind::MalformedChunk, e.to_string())),
            None => {}
        }
    }
    acc.finish(end.unwrap_or(now), run_start, spec)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(data: &str) -> SseEvent {
        SseEvent {
            event: None,
            data: data.into(),
        }
    }

    fn spec() -> RequestSpec {
        RequestSpec {
            prompt: "p".into(),
            prompt_tokens: Some(5),
            output_len: 8,
        }
    }

    #[test]
    fn chat_stream_timings_are_exact() {
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let mut acc = StreamAccumulator::new(ms(10));
        acc.event(
            ms(20),
            &ev(r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}],"usage":null}"#),
        );
        acc.event(ms(60), &ev(r#"{"choices":[{"delta":{"content":"He"}}]}"#));
        acc.event(ms(85), &ev(r#"{"choices":[{"delta":{"content":"llo"}}]}"#));
        acc.event(ms(125), &ev(r#"{"choices":[{"delta":{"content":"!"}}]}"#));
        acc.event(
            ms(126),
            &ev(r#"{"choices":[{"delta":{},"finish_reason":"length"}]}"#),
        );
        acc.event(
            ms(127),
            &ev(r#"{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":4,"total_tokens":9}}"#),
        );
        acc.event(ms(128), &ev("[DONE]"));
        assert!(acc.done());
        let r = acc.finish(ms(128), t0, &spec());
        assert!(r.ok(), "{:?}", r.error);
        assert_eq!(r.start_s, 0.010);
        assert_eq!(r.ttft_s, Some(0.050));
        assert_eq!(r.itl_s, vec![0.025, 0.040]);
        assert_eq!(r.latency_s, 0.118);
        assert_eq!(
            (r.content_chunks, r.empty_chunks, r.generated_chars),
            (3, 3, 6)
        );
        assert_eq!(r.output_tokens(), 4);
        assert_eq!(r.prompt_tokens(), 5);
        assert_eq!(r.finish_reason.as_deref(), Some("length"));
        assert!((r.tpot_s().unwrap() - (0.118 - 0.050) / 3.0).abs() < 1e-12);
    }

    #[test]
    fn completions_text_without_usage_counts_chunks() {
        let t0 = Instant::now();
        let mut acc = StreamAccumulator::new(t0);
        acc.event(
            t0 + Duration::from_millis(5),
            &ev(r#"{"choices":[{"text":"a"}]}"#),
        );
        acc.event(
            t0 + Duration::from_millis(9),
            &ev(r#"{"choices":[{"text":"b","finish_reason":"stop"}]}"#),
        );
        // No [DONE], but a finish_reason: complete.
        let r = acc.finish(t0 + Duration::from_millis(10), t0, &spec());
        assert!(r.ok());
        assert_eq!(r.usage, None);
        assert_eq!(r.output_tokens(), 2);
        assert_eq!(r.itl_s, vec![0.004]);
    }

    #[test]
    fn failures_are_classified() {
        let t0 = Instant::now();
        let mut acc = StreamAccumulator::new(t0);
        acc.event(t0, &ev(r#"{"choices":[{"text":"a"}]}"#));
        acc.event(t0, &ev(r#"{"choices":[{"text":"#));
        acc.event(t0, &ev("[DONE]"));
        let r = acc.finish(t0, t0, &spec());
        assert_eq!(r.error.unwrap().kind, ErrorKind::MalformedChunk);

        let mut acc = StreamAccumulator::new(t0);
        acc.event(t0, &ev(r#"{"error":{"message":"shard died","type":"x"}}"#));
        let r = acc.finish(t0, t0, &spec());
        let e = r.error.unwrap();
        assert_eq!(
            (e.kind, e.message.as_str()),
            (ErrorKind::ServerError, "shard died")
        );

        let mut acc = StreamAccumulator::new(t0);
        acc.event(t0, &ev(r#"{"choices":[{"text":"a"}]}"#));
        let r = acc.finish(t0, t0, &spec());
        assert_eq!(r.error.unwrap().kind, ErrorKind::IncompleteStream);

        let mut acc = StreamAccumulator::new(t0);
        acc.event(t0, &ev("[DONE]"));
        let r = acc.finish(t0, t0, &spec());
        assert_eq!(r.error.unwrap().kind, ErrorKind::NoContent);
    }

    #[test]
    fn bodies_and_urls() {
        let mut target = Target {
            base_url: "http://h:1/v1/".into(),
            endpoint: Endpoint::Chat,
            model: "m".into(),
            api_key: None,
            ignore_eos: true,
            temperature: 0.0,
            extra_body: serde_json::Map::new(),
        };
        assert_eq!(target.url(), "http://h:1/v1/chat/completions");
        let body = target.body(&spec());
        assert_eq!(body["messages"][0]["content"], "p");
        assert_eq!(body["ignore_eos"], true);
        assert_eq!(body["stream_options"]["include_usage"], true);
        target.endpoint = Endpoint::Completions;
        target.ignore_eos = false;
        target.extra_body.insert("min_tokens".into(), json!(8));
        let body = target.body(&spec());
        assert_eq!(body["prompt"], "p");
        assert_eq!(body["max_tokens"], 8);
        assert_eq!(body["min_tokens"], 8);
        assert!(body.get("ignore_eos").is_none());
    }
}
