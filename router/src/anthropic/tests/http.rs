//! The routes over HTTP: `app(state)` driven with `oneshot()`, the test playing the batcher
//! (it reads each `Entry` and answers with real events). Hostile bodies get typed 4xx.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tessera_text::ModelTokenizer;
use tokio::sync::mpsc;
use tower::ServiceExt;

use crate::infer::{Entry, FinishReason, GeneratedText, Infer, InferStreamResponse, Token};
use crate::server::app;
use crate::state::AppState;
use crate::validation::ValidationConfig;

const KEY: &str = "sk-test";

fn setup(api_key: Option<&str>) -> (Router, mpsc::Receiver<Entry>) {
    setup_with(api_key, 4 << 20)
}

fn setup_with(api_key: Option<&str>, payload_limit: usize) -> (Router, mpsc::Receiver<Entry>) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/tiny-llama");
    let tokenizer = Arc::new(ModelTokenizer::from_hf_dir(&dir, &[]).expect("fixture tokenizer"));
    let (tx, rx) = mpsc::channel(4);
    let state = AppState::builder(Infer::new(tx, 4), tokenizer, "tiny")
        .validation(ValidationConfig {
            max_input_tokens: 200,
            max_total_tokens: 256,
            ..ValidationConfig::default()
        })
        .api_key(api_key.map(str::to_owned))
        .payload_limit(payload_limit)
        .build();
    (app(state), rx)
}

fn post(uri: &str) -> axum::http::request::Builder {
    Request::post(uri).header(header::CONTENT_TYPE, "application/json")
}

async fn send(app: &Router, req: Request<Body>) -> (StatusCode, String) {
    let r = app.clone().oneshot(req).await.expect("a response");
    let status = r.status();
    let bytes = r.into_body().collect().await.expect("a body").to_bytes();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

async fn call(app: &Router, uri: &str, body: Value) -> (StatusCode, Value) {
    let req = post(uri)
        .body(Body::from(body.to_string()))
        .expect("request");
    let (status, text) = send(app, req).await;
    let body = serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
    (status, body)
}

fn hello() -> Value {
    json!({"model": "claude-x", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]})
}

fn token(text: &str) -> Token {
    Token {
        id: 7,
        text: text.into(),
        logprob: -0.5,
        special: false,
        piece: text.into(),
    }
}

/// Plays the batcher for one entry: one event per piece, the last one `End`.
async fn answer(
    rx: &mut mpsc::Receiver<Entry>,
    pieces: &[&str],
    finish: FinishReason,
    stop: Option<&str>,
) -> Entry {
    let entry = rx.recv().await.expect("an entry");
    for (i, piece) in pieces.iter().enumerate() {
        let event = if i + 1 < pieces.len() {
            InferStreamResponse::Intermediate {
                token: token(piece),
                top_tokens: Vec::new(),
            }
        } else {
            InferStreamResponse::End {
                token: token(piece),
                top_tokens: Vec::new(),
                generated_text: GeneratedText {
                    text: pieces.concat(),
                    generated_tokens: pieces.len() as u32,
                    finish_reason: finish,
                    stop_sequence: stop.map(str::to_owned),
                    seed: None,
                    accepted_per_step: Vec::new(),
                },
                queued: entry.queued,
                start: Instant::now(),
            }
        };
        let _ = entry.response_tx.send(Ok(event));
    }
    entry
}

#[tokio::test]
async fn a_message_is_created_with_the_request_s_generation_fields() {
    let (app, mut rx) = setup(None);
    let mut body = hello();
    body["stop_sequences"] = json!(["END"]);
    body["temperature"] = json!(0.5);
    body["top_k"] = json!(3);
    let request = tokio::spawn({
        let app = app.clone();
        async move { call(&app, "/v1/messages", body).await }
    });
    let entry = answer(
        &mut rx,
        &["Hel", "lo"],
        FinishReason::StopSequence,
        Some("END"),
    )
    .await;
    let (status, b) = request.await.expect("joined");
    assert_eq!(status, 200, "{b}");
    assert_eq!(entry.request.stopping.max_new_tokens, 8);
    assert_eq!(entry.request.stopping.stop_sequences, ["END"]);
    assert_eq!(entry.request.parameters.temperature, 0.5);
    assert_eq!(entry.request.parameters.top_k, 3);
    assert_eq!(b["type"], "message");
    assert_eq!(b["model"], "tiny");
    assert_eq!(b["content"], json!([{"type": "text", "text": "Hello"}]));
    assert_eq!(b["stop_reason"], "stop_sequence");
    assert_eq!(b["stop_sequence"], "END");
    let input_tokens = entry.request.input_ids.len();
    assert_eq!(b["usage"]["input_tokens"], input_tokens, "{b}");
    assert_eq!(b["usage"]["output_tokens"], 2);
    let (status, count) = call(&app, "/v1/messages/count_tokens", hello()).await;
    assert_eq!(status, 200, "{count}");
    assert_eq!(
        count,
        json!({"input_tokens": input_tokens}),
        "the same prompt"
    );
}

#[tokio::test]
async fn a_stream_names_its_events() {
    let (app, mut rx) = setup(None);
    let mut body = hello();
    body["stream"] = json!(true);
    let request = tokio::spawn({
        let app = app.clone();
        let req = post("/v1/messages").body(Body::from(body.to_string()));
        async move { send(&app, req.expect("request")).await }
    });
    answer(&mut rx, &["a", "b"], FinishReason::Length, None).await;
    let (status, text) = request.await.expect("joined");
    assert_eq!(status, 200, "{text}");
    let events: Vec<(String, Value)> = text
        .split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .map(|e| {
            let field = |name: &str| {
                e.lines()
                    .find_map(|l| l.strip_prefix(name))
                    .map(|v| v.trim().to_owned())
                    .unwrap_or_else(|| panic!("no {name} in {e:?}"))
            };
            let data = serde_json::from_str(&field("data:")).expect("JSON data");
            (field("event:"), data)
        })
        .collect();
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "message_start",
            "ping",
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    for (name, data) in &events {
        assert_eq!(
            data["type"],
            name.as_str(),
            "the data's type is the event's name"
        );
    }
    assert_eq!(events[6].1["delta"]["stop_reason"], "max_tokens");
    assert_eq!(events[6].1["usage"]["output_tokens"], 2);
}

#[tokio::test]
async fn the_key_is_read_from_x_api_key_or_a_bearer_token() {
    let (app, _rx) = setup(Some(KEY));
    let body = hello();
    let req = |header: Option<(&str, String)>| {
        let mut r = post("/v1/messages/count_tokens");
        if let Some((name, value)) = header {
            r = r.header(name, value);
        }
        r.body(Body::from(body.to_string())).expect("request")
    };
    let (status, text) = send(&app, req(None)).await;
    assert_eq!(status, 401, "{text}");
    let b: Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(b["type"], "error");
    assert_eq!(b["error"]["type"], "authentication_error");
    let (status, _) = send(&app, req(Some(("x-api-key", "wrong".into())))).await;
    assert_eq!(status, 401);
    let (status, text) = send(&app, req(Some(("x-api-key", KEY.into())))).await;
    assert_eq!(status, 200, "{text}");
    let bearer = format!("Bearer {KEY}");
    let (status, _) = send(&app, req(Some(("authorization", bearer)))).await;
    assert_eq!(status, 200);
    // Other routes keep their own rule.
    let chat = json!({"messages": [{"role": "user", "content": "x"}]});
    let r = post("/v1/chat/completions")
        .header("x-api-key", KEY)
        .body(Body::from(chat.to_string()))
        .expect("request");
    assert_eq!(send(&app, r).await.0, 401);
}

#[tokio::test]
async fn bad_bodies_get_typed_invalid_request_errors() {
    let (app, _rx) = setup(None);
    let invalid = |b: &Value| {
        assert_eq!(b["type"], "error", "{b}");
        assert_eq!(b["error"]["type"], "invalid_request_error", "{b}");
        b["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };
    let req = post("/v1/messages").body(Body::from("{not json"));
    let (status, text) = send(&app, req.expect("request")).await;
    assert_eq!(status, 400, "{text}");
    invalid(&serde_json::from_str(&text).expect("JSON"));
    let mut no_max = hello();
    no_max.as_object_mut().map(|o| o.remove("max_tokens"));
    let (status, b) = call(&app, "/v1/messages", no_max).await;
    assert_eq!(status, 400);
    assert!(invalid(&b).contains("max_tokens"), "{b}");
    let image = json!([{"type": "image", "source": {"type": "base64", "media_type": "image/png",
                        "data": "AAAA"}}]);
    let mut with_image = hello();
    with_image["messages"][0]["content"] = image;
    let (status, b) = call(&app, "/v1/messages", with_image.clone()).await;
    assert_eq!(status, 400);
    assert!(invalid(&b).contains("`image`"), "{b}");
    let (status, b) = call(&app, "/v1/messages/count_tokens", with_image).await;
    assert_eq!(status, 400);
    assert!(invalid(&b).contains("`image`"), "{b}");
    let mut huge = hello();
    huge["max_tokens"] = json!(1_000_000);
    let (status, b) = call(&app, "/v1/messages", huge).await;
    assert_eq!(status, 400);
    assert!(invalid(&b).contains("must be <= 256"), "{b}");
    let (status, b) = call(&app, "/v1/messages/batches", json!({})).await;
    assert_eq!(status, 404);
    assert_eq!(b["error"]["type"], "not_found_error", "{b}");
    let (small, _rx) = setup_with(None, 64);
    let (status, b) = call(&small, "/v1/messages", hello()).await;
    assert_eq!(status, 413, "{b}");
    assert_eq!(b["error"]["type"], "request_too_large", "{b}");
    assert!(
        b["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("64 bytes")),
        "{b}"
    );
}

#[tokio::test]
async fn ten_thousand_blocks_get_a_typed_400() {
    let (app, _rx) = setup(None);
    let blocks = vec![json!({"type": "text", "text": "x"}); 10_000];
    let messages: Vec<Value> = (0..10_000)
        .map(|i| json!({"role": if i % 2 == 0 { "user" } else { "assistant" }, "content": "x"}))
        .collect();
    for body in [
        json!({"max_tokens": 4, "messages": [{"role": "user", "content": blocks}]}),
        json!({"max_tokens": 4, "messages": messages}),
    ] {
        let (status, b) = call(&app, "/v1/messages", body).await;
        assert_eq!(status, 400, "{b}");
        assert_eq!(b["error"]["type"], "invalid_request_error");
        assert!(
            b["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("content blocks")),
            "{b}"
        );
    }
}
