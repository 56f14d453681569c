//! HTTP requests to a [`Server`] and reading their answers.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::{REQUEST_TIMEOUT, Server, Sse};

/// An HTTP client for the tests: no proxy, [`REQUEST_TIMEOUT`] per request.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(REQUEST_TIMEOUT)
        .connect_timeout(Duration::from_secs(5))
        .build()
        .expect("reqwest client")
}

/// Reads a response as `(status, JSON body)`; a body that is not JSON becomes a
/// `Value::String` of its text.
pub async fn read_json(r: reqwest::Response) -> (u16, Value) {
    let status = r.status().as_u16();
    let text = r.text().await.unwrap_or_default();
    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, body)
}

/// The value of one series in Prometheus text (`series` is everything before the value).
pub fn metric_value(text: &str, series: &str) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (name, value) = l.rsplit_once(' ')?;
        (name == series).then(|| value.parse().ok())?
    })
}

/// The token ids of a `/generate` answer with `details`.
pub fn detail_ids(body: &Value) -> Vec<u64> {
    body["details"]["tokens"]
        .as_array()
        .unwrap_or_else(|| panic!("no details.tokens in {body}"))
        .iter()
        .map(|t| t["id"].as_u64().expect("token id"))
        .collect()
}

/// A JSON array of integers.
pub fn u64s(v: &Value) -> Vec<u64> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an array: {v}"))
        .iter()
        .map(|x| x.as_u64().unwrap_or_else(|| panic!("not an integer: {x}")))
        .collect()
}

impl Server {
    /// `GET /metrics` as text.
    pub async fn metrics_text(&self) -> String {
        let r = self
            .client()
            .get(self.url("/metrics"))
            .timeout(Duration::from_secs(5))
            .send()
            .await
            .expect("GET /metrics");
        assert_eq!(r.status(), 200, "GET /metrics");
        r.text().await.expect("metrics body")
    }

    /// The value of one series of `/metrics` (`name` or `name{labels}` exactly as printed);
    /// 0 when absent.
    pub async fn metric(&self, series: &str) -> f64 {
        metric_value(&self.metrics_text().await, series).unwrap_or(0.0)
    }

    /// Polls `series` until `ok(value)` or `limit` passes; returns the last value and
    /// whether it satisfied `ok`.
    pub async fn wait_metric(
        &self,
        series: &str,
        limit: Duration,
        ok: impl Fn(f64) -> bool,
    ) -> (f64, bool) {
        let deadline = Instant::now() + limit;
        loop {
            let v = self.metric(series).await;
            if ok(v) {
                return (v, true);
            }
            if Instant::now() >= deadline {
                return (v, false);
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// POSTs `body` as JSON to `path`; returns the status and the body parsed as JSON
    /// (`Value::String` of the raw text when it is not JSON).
    pub async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let r = self
            .client()
            .post(self.url(path))
            .json(body)
            .send()
            .await
            .unwrap_or_else(|e| panic!("POST {path}: {e}"));
        read_json(r).await
    }

    /// GETs `path`; returns the status and the JSON body.
    pub async fn get(&self, path: &str) -> (u16, Value) {
        let r = self
            .client()
            .get(self.url(path))
            .send()
            .await
            .unwrap_or_else(|e| panic!("GET {path}: {e}"));
        read_json(r).await
    }

    /// POSTs `body` to a streaming route and returns the SSE reader (panics unless 200).
    pub async fn stream(&self, path: &str, body: &Value) -> Sse {
        let r = self
            .client()
            .post(self.url(path))
            .json(body)
            .send()
            .await
            .unwrap_or_else(|e| panic!("POST {path}: {e}"));
        let status = r.status();
        if status != 200 {
            let text = r.text().await.unwrap_or_default();
            panic!("POST {path} answered {status}: {text}");
        }
        Sse::new(r)
    }

    /// `/tokenize`'s ids for `text`.
    pub async fn tokenize(&self, text: &str) -> Vec<u64> {
        let (status, body) = self
            .post("/tokenize", &serde_json::json!({ "inputs": text }))
            .await;
        assert_eq!(status, 200, "POST /tokenize: {body}");
        body.as_array()
            .unwrap_or_else(|| panic!("/tokenize answered {body}"))
            .iter()
            .map(|t| t["id"].as_u64().expect("token id"))
            .collect()
    }

    /// `POST /generate` with `body`; panics unless it answers 200. Returns the body.
    pub async fn generate(&self, body: &Value) -> Value {
        let (status, answer) = self.post("/generate", body).await;
        assert_eq!(status, 200, "POST /generate {body}: {answer}");
        answer
    }

    /// Greedy `/generate` with details, EOS ignored: the generated token ids.
    pub async fn greedy_ids(&self, text: &str, max_new_tokens: u32) -> Vec<u64> {
        let body = self
            .generate(&serde_json::json!({
                "inputs": text,
                "parameters": {"max_new_tokens": max_new_tokens, "details": true, "ignore_eos": true}
            }))
            .await;
        detail_ids(&body)
    }
}
