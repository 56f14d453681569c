//! HTTP-level tests of the router: `app(state)` driven with `oneshot()`, the test itself
//! playing the batcher (it reads each `Entry` and answers with real events).

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, Response, StatusCode, header};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tessera_router::{
    AppState, Entry, FinishReason, GeneratedText, Infer, InferError, InferStreamResponse,
    ModelInfo, OutputConstraint, PrefillToken, Token, ValidationConfig, app,
};
use tessera_text::ModelTokenizer;
use tokio::sync::mpsc;
use tower::ServiceExt;

const MODEL: &str = "tiny";

fn tokenizer() -> Arc<ModelTokenizer> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/tiny-llama");
    Arc::new(ModelTokenizer::from_hf_dir(&dir, &[]).expect("fixture tokenizer"))
}

struct Setup {
    max_concurrent: usize,
    api_key: Option<String>,
    payload_limit: usize,
    max_input_tokens: usize,
    healthy: Arc<AtomicBool>,
}

impl Default for Setup {
    fn default() -> Self {
        Self {
            max_concurrent: 8,
            api_key: None,
            payload_limit: 10_000,
            max_input_tokens: 100,
            healthy: Arc::new(AtomicBool::new(true)),
        }
    }
}

fn setup(s: Setup) -> (Router, mpsc::Receiver<Entry>) {
    let (tx, rx) = mpsc::channel(16);
    let healthy = s.healthy.clone();
    let state = AppState::builder(Infer::new(tx, s.max_concurrent), tokenizer(), MODEL)
        .validation(ValidationConfig {
            max_input_tokens: s.max_input_tokens,
            max_total_tokens: s.max_input_tokens + 28,
            max_stop_sequences: 2,
            max_top_n_tokens: 5,
            max_best_of: 4,
            ..Default::default()
        })
        .info(ModelInfo {
            model_id: "fixtures/tiny-llama".into(),
            model_dtype: "float32".into(),
            model_device_type: "cpu".into(),
            ..Default::default()
        })
        .api_key(s.api_key)
        .payload_limit(s.payload_limit)
        .health_check(Arc::new(move || {
            let ok = healthy.load(Ordering::SeqCst);
            Box::pin(async move { ok })
        }))
        .prometheus(tessera_router::build_recorder().handle())
        .build();
    (app(state), rx)
}

fn app_only() -> Router {
    setup(Setup::default()).0
}

fn post(uri: &str, body: Value) -> Request<Body> {
    Request::post(uri)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))
        .unwrap()
}

fn get(uri: &str) -> Request<Body> {
    Request::get(uri).body(Body::empty()).unwrap()
}

async fn call(app: &Router, req: Request<Body>) -> Response<Body> {
    app.clone().oneshot(req).await.unwrap()
}

async fn text(resp: Response<Body>) -> String {
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}

async fn json_of(resp: Response<Body>) -> Value {
    let t = text(resp).await;
    serde_json::from_str(&t).unwrap_or_else(|e| panic!("not JSON ({e}): {t}"))
}

/// The `data:` payloads of an SSE body.
fn sse_data(body: &str) -> Vec<String> {
    body.split("\n\n")
        .filter_map(|event| {
            event
                .lines()
                .find_map(|l| l.strip_prefix("data: ").or_else(|| l.strip_prefix("data:")))
        })
        .map(str::to_owned)
        .collect()
}

fn token(id: u32, text: &str) -> Token {
    Token {
        id,
        text: text.into(),
        logprob: -0.25,
        special: false,
        piece: text.into(),
    }
}

/// Plays the batcher for one entry: one event per piece, the last one `End`.
fn answer(entry: &Entry, pieces: &[&str], finish_reason: FinishReason, top_n: usize) {
    let start = Instant::now();
    if entry.request.decoder_input_details {
        let prefill = entry
            .request
            .input_ids
            .iter()
            .enumerate()
            .map(|(i, &id)| PrefillToken {
                id,
                text: format!("p{i}"),
                logprob: (i > 0).then_some(-1.0),
            })
            .collect();
        let _ = entry
            .response_tx
            .send(Ok(InferStreamResponse::Prefill(prefill)));
    }
    for (i, piece) in pieces.iter().enumerate() {
        let tok = token(10 + i as u32, piece);
        let top: Vec<Token> = (0..top_n)
            .map(|k| token(100 + k as u32, &format!("alt{k}")))
            .collect();
        let event = if i + 1 < pieces.len() {
            InferStreamResponse::Intermediate {
                token: tok,
                top_tokens: top,
            }
        } else {
            InferStreamResponse::End {
                token: tok,
                top_tokens: top,
                generated_text: GeneratedText {
                    text: pieces.concat(),
                    generated_tokens: pieces.len() as u32,
                    finish_reason,
                    stop_sequence: None,
                    seed: entry.request.parameters.seed,
                    accepted_per_step: Vec::new(),
                },
                queued: entry.queued,
                start,
            }
        };
        let _ = entry.response_tx.send(Ok(event));
    }
}

/// Sends `req` while the test answers `entries` requests with `pieces`.
async fn run(
    app: &Router,
    rx: &mut mpsc::Receiver<Entry>,
    req: Request<Body>,
    entries: usize,
    pieces: &[&str],
) -> (Response<Body>, Vec<Entry>) {
    let handle = tokio::spawn(app.clone().oneshot(req));
    let mut got = Vec::new();
    for _ in 0..entries {
        let entry = rx.recv().await.unwrap();
        let top_n = entry.request.parameters.top_n_tokens as usize;
        answer(&entry, pieces, FinishReason::Length, top_n);
        got.push(entry);
    }
    (handle.await.unwrap().unwrap(), got)
}

// ---------------------------------------------------------------- native

#[tokio::test]
async fn generate_returns_text_and_details() {
    let (app, mut rx) = setup(Setup::default());
    let body = json!({"inputs": "Hello", "parameters": {"max_new_tokens": 3, "details": true,
                      "decoder_input_details": true, "top_n_tokens": 2, "stop": ["x"]}});
    let (resp, entries) = run(&app, &mut rx, post("/generate", body), 1, &["a", "b", "c"]).await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.headers()["x-generated-tokens"], "3");
    let r = &entries[0].request;
    assert_eq!(r.inputs, "Hello");
    assert_eq!(r.stopping.max_new_tokens, 3);
    assert_eq!(r.stopping.stop_sequences, ["x"]);
    assert_eq!(r.parameters.temperature, 0.0, "greedy by default");
    let v = json_of(resp).await;
    assert_eq!(v["generated_text"], "abc");
    let d = &v["details"];
    assert_eq!(d["finish_reason"], "length");
    assert_eq!(d["generated_tokens"], 3);
    assert_eq!(
        d["tokens"][1],
        json!({"id": 11, "text": "b", "logprob": -0.25, "special": false})
    );
    assert_eq!(d["top_tokens"][0].as_array().unwrap().len(), 2);
    assert_eq!(d["prefill"][0]["logprob"], Value::Null);
    assert_eq!(d["prefill"].as_array().unwrap().len(), r.input_ids.len());
}

#[tokio::test]
async fn generate_without_details_and_full_text() {
    let (app, mut rx) = setup(Setup::default());
    let body = json!({"inputs": "Hi", "parameters": {"return_full_text": true, "do_sample": true, "seed": 7}});
    let (resp, entries) = run(&app, &mut rx, post("/generate", body), 1, &[" there"]).await;
    assert_eq!(entries[0].request.parameters.seed, Some(7));
    assert_eq!(entries[0].request.parameters.temperature, 1.0);
    assert_eq!(json_of(resp).await, json!({"generated_text": "Hi there"}));
}

#[tokio::test]
async fn generate_stream_events() {
    let (app, mut rx) = setup(Setup::default());
    let body = json!({"inputs": "Hello", "parameters": {"max_new_tokens": 2}});
    let (resp, entries) = run(
        &app,
        &mut rx,
        post("/generate_stream", body),
        1,
        &["a", "b"],
    )
    .await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.headers()[header::CONTENT_TYPE], "text/event-stream");
    let events: Vec<Value> = sse_data(&text(resp).await)
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert_eq!(events.len(), 2);
    assert_eq!(
        events[0],
        json!({"index": 1, "token": {"id": 10, "text": "a", "logprob": -0.25, "special": false},
               "top_tokens": [], "generated_text": null, "details": null})
    );
    assert_eq!(events[1]["index"], 2);
    assert_eq!(events[1]["generated_text"], "ab");
    assert_eq!(
        events[1]["details"],
        json!({"finish_reason": "length", "generated_tokens": 2, "seed": null,
               "input_length": entries[0].request.input_ids.len()})
    );
}

#[tokio::test]
async fn stream_error_event() {
    let (app, mut rx) = setup(Setup::default());
    let handle = tokio::spawn(
        app.clone()
            .oneshot(post("/generate_stream", json!({"inputs": "Hi"}))),
    );
    let entry = rx.recv().await.unwrap();
    entry
        .response_tx
        .send(Err(InferError::ShardFailure("CUDA error".into())))
        .unwrap();
    let resp = handle.await.unwrap().unwrap();
    let data = sse_data(&text(resp).await);
    let v: Value = serde_json::from_str(&data[0]).unwrap();
    assert_eq!(v["error_type"], "shard_failure");
}

#[tokio::test]
async fn batcher_errors_map_to_status() {
    let (app, mut rx) = setup(Setup::default());
    for (err, status) in [
        (
            InferError::ShardFailure("x".into()),
            StatusCode::INTERNAL_SERVER_ERROR,
        ),
        (InferError::Unavailable, StatusCode::SERVICE_UNAVAILABLE),
        (InferError::Overloaded, StatusCode::TOO_MANY_REQUESTS),
    ] {
        let handle = tokio::spawn(
            app.clone()
                .oneshot(post("/generate", json!({"inputs": "Hi"}))),
        );
        let entry = rx.recv().await.unwrap();
        entry.response_tx.send(Err(err)).unwrap();
        let resp = handle.await.unwrap().unwrap();
        assert_eq!(resp.status(), status);
    }
    // The batcher dropping a request without an answer is a server error too.
    let handle = tokio::spawn(
        app.clone()
            .oneshot(post("/generate", json!({"inputs": "Hi"}))),
    );
    drop(rx.recv().await.unwrap());
    let resp = handle.await.unwrap().unwrap();
    assert_eq!(resp.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(json_of(resp).await["error_type"], "incomplete_generation");
}

#[tokio::test]
async fn native_validation_errors_are_422() {
    let app = app_only();
    for (params, needle) in [
        (json!({"temperature": -1.0}), "`temperature` must be >= 0"),
        (json!({"top_p": 2.0}), "`top_p`"),
        (json!({"top_k": 0}), "`top_k`"),
        (json!({"max_new_tokens": 1000}), "must be <= 128"),
        (json!({"stop": ["a", "b", "c"]}), "`stop` must be <= 2"),
        (json!({"top_n_tokens": 6}), "`top_n_tokens`"),
        (json!({"best_of": 2}), "`best_of`"),
        (
            json!({"grammar": {"type": "json", "value": "{oops"}}),
            "`grammar`: the schema text is not JSON",
        ),
        (
            json!({"grammar": {"type": "json", "value": {"type": "string", "minLength": 3, "maxLength": 1}}}),
            "`grammar`: ",
        ),
        (
            json!({"grammar": {"type": "ebnf", "value": "x"}}),
            "`grammar`: unknown type",
        ),
        (
            json!({"grammar": {"type": "regex", "value": "("}}),
            "`grammar`: ",
        ),
        (json!({"truncate": 0}), "`truncate`"),
    ] {
        let resp = call(
            &app,
            post("/generate", json!({"inputs": "Hi", "parameters": params})),
        )
        .await;
        assert_eq!(resp.status(), StatusCode::UNPROCESSABLE_ENTITY, "{needle}");
        let v = json_of(resp).await;
        assert_eq!(v["error_type"], "validation");
        assert!(v["error"].as_str().unwrap().contains(needle), "{v}");
    }
    let resp = call(&app, post("/generate", json!({"inputs": ""}))).await;
    assert_eq!(resp.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let long = "a ".repeat(300);
    let resp = call(&app, post("/generate", json!({"inputs": long}))).await;
    let v = json_of(resp).await;
    assert!(
        v["error"].as_str().unwrap().contains("at most 100 tokens"),
        "{v}"
    );
}

#[tokio::test]
async fn malformed_requests() {
    let app = app_only();
    let bad = Request::post("/generate")
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from("{not json"))
        .unwrap();
    let resp = call(&app, bad).await;
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    assert_eq!(json_of(resp).await["error_type"], "json");

    let resp = call(&app, post("/generate", json!({"input": "typo"}))).await;
    assert_eq!(resp.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(json_of(resp).await["error_type"], "json");

    let plain = Request::post("/generate")
        .header(header::CONTENT_TYPE, "text/plain")
        .body(Body::from("{}"))
        .unwrap();
    let resp = call(&app, plain).await;
    assert_eq!(resp.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert_eq!(json_of(resp).await["error_type"], "unsupported_media_type");

    let resp = call(&app, post("/v1/completions", json!({"model": MODEL}))).await;
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    assert_eq!(
        json_of(resp).await["error"]["type"],
        "invalid_request_error"
    );
}

#[tokio::test]
async fn payload_too_large_is_413_json() {
    let app = app_only();
    let big = "x".repeat(20_000);
    let resp = call(&app, post("/generate", json!({"inputs": big}))).await;
    assert_eq!(resp.status(), StatusCode::PAYLOAD_TOO_LARGE);
    let v = json_of(resp).await;
    assert_eq!(v["error_type"], "payload_too_large");
    assert!(v["error"].as_str().unwrap().contains("10000"), "{v}");
    let big = "x".repeat(20_000);
    let resp = call(
        &app,
        post("/v1/completions", json!({"model": MODEL, "prompt": big})),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert!(json_of(resp).await["error"]["message"].is_string());
}

#[tokio::test]
async fn unknown_routes_and_methods_are_json() {
    let app = app_only();
    let resp = call(&app, get("/nope")).await;
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    assert_eq!(json_of(resp).await["error_type"], "not_found");
    let resp = call(&app, get("/v1/nope")).await;
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    assert_eq!(
        json_of(resp).await["error"]["type"],
        "invalid_request_error"
    );
    let resp = call(&app, get("/generate")).await;
    assert_eq!(resp.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(json_of(resp).await["error_type"], "method_not_allowed");
    let resp = call(&app, get("/v1/chat/completions")).await;
    assert_eq!(resp.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert!(json_of(resp).await["error"]["message"].is_string());
}

#[tokio::test]
async fn api_key_protects_generation_routes_only() {
    let (app, _rx) = setup(Setup {
        api_key: Some("sekret".into()),
        ..Setup::default()
    });
    let resp = call(&app, post("/generate", json!({"inputs": "Hi"}))).await;
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(json_of(resp).await["error_type"], "unauthorized");
    let resp = call(&app, post("/tokenize", json!({"inputs": "Hi"}))).await;
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    let resp = call(&app, get("/v1/models")).await;
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(json_of(resp).await["error"]["code"], "invalid_api_key");
    let wrong = Request::get("/v1/models")
        .header(header::AUTHORIZATION, "Bearer nope")
        .body(Body::empty())
        .unwrap();
    assert_eq!(call(&app, wrong).await.status(), StatusCode::UNAUTHORIZED);
    let right = Request::get("/v1/models")
        .header(header::AUTHORIZATION, "Bearer sekret")
        .body(Body::empty())
        .unwrap();
    assert_eq!(call(&app, right).await.status(), StatusCode::OK);
    for open in ["/health", "/metrics", "/info"] {
        assert_eq!(
            call(&app, get(open)).await.status(),
            StatusCode::OK,
            "{open}"
        );
    }
}

#[tokio::test]
async fn overload_is_429_at_once() {
    let (app, mut rx) = setup(Setup {
        max_concurrent: 1,
        ..Setup::default()
    });
    let first = tokio::spawn(
        app.clone()
            .oneshot(post("/generate", json!({"inputs": "Hi"}))),
    );
    let entry = rx.recv().await.unwrap();
    let resp = call(&app, post("/generate", json!({"inputs": "Hi"}))).await;
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(json_of(resp).await["error_type"], "overloaded");
    let resp = call(
        &app,
        post("/v1/completions", json!({"model": MODEL, "prompt": "Hi"})),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(json_of(resp).await["error"]["code"], "rate_limit_exceeded");
    answer(&entry, &["x"], FinishReason::EosToken, 0);
    assert_eq!(first.await.unwrap().unwrap().status(), StatusCode::OK);
    // The permit is back.
    let (resp, _) = run(
        &app,
        &mut rx,
        post("/generate", json!({"inputs": "Hi"})),
        1,
        &["y"],
    )
    .await;
    assert_eq!(resp.status(), StatusCode::OK);
}

#[tokio::test]
async fn disconnect_closes_the_response_channel() {
    let (app, mut rx) = setup(Setup::default());
    // Streaming: dropping the body is the client going away.
    let resp = call(&app, post("/generate_stream", json!({"inputs": "Hi"}))).await;
    let entry = rx.recv().await.unwrap();
    entry
        .response_tx
        .send(Ok(InferStreamResponse::Intermediate {
            token: token(1, "a"),
            top_tokens: vec![],
        }))
        .unwrap();
    assert!(!entry.response_tx.is_closed());
    drop(resp);
    assert!(entry.response_tx.is_closed());

    // Non-streaming: the handler future is dropped.
    let handle = tokio::spawn(
        app.clone()
            .oneshot(post("/generate", json!({"inputs": "Hi"}))),
    );
    let entry = rx.recv().await.unwrap();
    assert!(!entry.response_tx.is_closed());
    handle.abort();
    let _ = handle.await;
    assert!(entry.response_tx.is_closed());

    // OpenAI streams with n > 1: every sample is cancelled.
    let body = json!({"model": MODEL, "prompt": "Hi", "n": 2, "stream": true});
    let resp = call(&app, post("/v1/completions", body)).await;
    let a = rx.recv().await.unwrap();
    let b = rx.recv().await.unwrap();
    drop(resp);
    assert!(a.response_tx.is_closed() && b.response_tx.is_closed());
}

#[tokio::test]
async fn tokenize_info_health_metrics() {
    let healthy = Arc::new(AtomicBool::new(true));
    let (app, _rx) = setup(Setup {
        healthy: healthy.clone(),
        ..Setup::default()
    });
    let resp = call(&app, post("/tokenize", json!({"inputs": "<|im_start|>Hi"}))).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let v = json_of(resp).await;
    let toks = v.as_array().unwrap();
    assert_eq!(
        toks[0],
        json!({"id": 1, "text": "<|im_start|>", "start": 0, "stop": 12})
    );
    let joined: String = toks[1..]
        .iter()
        .map(|t| t["text"].as_str().unwrap())
        .collect();
    assert_eq!(joined, "Hi");

    let v = json_of(call(&app, get("/info")).await).await;
    assert_eq!(v["model_id"], "fixtures/tiny-llama");
    assert_eq!(v["max_total_tokens"], 128);
    assert_eq!(v["max_concurrent_requests"], 8);
    assert_eq!(v["served_model_name"], MODEL);

    assert_eq!(call(&app, get("/health")).await.status(), StatusCode::OK);
    healthy.store(false, Ordering::SeqCst);
    let resp = call(&app, get("/health")).await;
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(json_of(resp).await["error_type"], "unhealthy");

    let resp = call(&app, get("/metrics")).await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert!(
        resp.headers()[header::CONTENT_TYPE]
            .to_str()
            .unwrap()
            .starts_with("text/plain")
    );
}

// ---------------------------------------------------------------- OpenAI

#[tokio::test]
async fn models_lists_the_served_model_and_any_name_or_none_is_served() {
    let v = json_of(call(&app_only(), get("/v1/models")).await).await;
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"][0]["id"], MODEL);
    for body in [
        json!({"model": "gpt-4", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
        json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
    ] {
        let (app, mut rx) = setup(Setup::default());
        let (resp, _) = run(
            &app,
            &mut rx,
            post("/v1/chat/completions", body),
            1,
            &["a", "b"],
        )
        .await;
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(
            json_of(resp).await["model"],
            MODEL,
            "answers name the served model"
        );
    }
}

/// A template that renders no tools gets them in the system message, and the output is
/// held to a grammar of the tools' calls.
#[tokio::test]
async fn tools_reach_a_template_without_tools_through_the_system_message() {
    let (app, mut rx) = setup(Setup {
        max_input_tokens: 4000,
        ..Setup::default()
    });
    let body = json!({"model": MODEL, "max_tokens": 4,
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        "tools": [{"type": "function", "function": {"name": "get_weather",
                   "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
        "tool_choice": "required"});
    let (resp, entries) = run(&app, &mut rx, post("/v1/chat/completions", body), 1, &["a"]).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let r = &entries[0].request;
    assert!(
        r.inputs
            .starts_with("<|im_start|>system\nBe brief.\n\n# Tools"),
        "{}",
        r.inputs
    );
    assert!(
        r.inputs.contains("\"name\":\"get_weather\""),
        "{}",
        r.inputs
    );
    match &r.constraint {
        Some(tessera_router::OutputConstraint::Lark(g)) => {
            assert!(
                g.contains("<tool_call>") && g.contains("get_weather"),
                "{g}"
            );
        }
        other => panic!("expected a tool grammar, got {other:?}"),
    }
}

#[tokio::test]
async fn chat_completion_with_n_and_logprobs() {
    let (app, mut rx) = setup(Setup::default());
    let body = json!({"model": MODEL, "n": 2, "seed": 5, "max_tokens": 4, "logprobs": true,
        "top_logprobs": 2, "stop": "END",
        "messages": [{"role": "system", "content": "Be brief."},
                     {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "!"}]}]});
    let (resp, entries) = run(
        &app,
        &mut rx,
        post("/v1/chat/completions", body),
        2,
        &["Hel", "lo"],
    )
    .await;
    assert_eq!(resp.status(), StatusCode::OK);
    let r = &entries[0].request;
    assert_eq!(
        r.inputs,
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n"
    );
    assert_eq!(r.input_ids[0], 1, "no BOS added to the template's output");
    assert_eq!(r.stopping.stop_sequences, ["END"]);
    assert_eq!(r.stopping.max_new_tokens, 4);
    assert_eq!(r.parameters.temperature, 1.0);
    assert_eq!(r.parameters.top_n_tokens, 2);
    assert_eq!(r.parameters.seed, Some(5));
    assert_eq!(entries[1].request.parameters.seed, Some(6));
    let v = json_of(resp).await;
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], MODEL);
    assert!(v["created"].is_u64() && v["system_fingerprint"].is_string());
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 2);
    assert_eq!(choices[1]["index"], 1);
    assert_eq!(
        choices[0]["message"],
        json!({"role": "assistant", "content": "Hello"})
    );
    assert_eq!(choices[0]["finish_reason"], "length");
    let lp = &choices[0]["logprobs"]["content"][0];
    assert_eq!(lp["token"], "Hel");
    assert_eq!(lp["bytes"], json!([72, 101, 108]));
    assert_eq!(lp["top_logprobs"].as_array().unwrap().len(), 2);
    let prompt_tokens = r.input_ids.len() as u64;
    assert_eq!(
        v["usage"],
        json!({"prompt_tokens": prompt_tokens, "completion_tokens": 4, "total_tokens": prompt_tokens + 4})
    );
}

#[tokio::test]
async fn chat_stream_with_usage() {
    let (app, mut rx) = setup(Setup::default());
    let body = json!({"model": MODEL, "stream": true, "temperature": 0,
        "stream_options": {"include_usage": true},
        "messages": [{"role": "user", "content": "Hi"}]});
    let (resp, entries) = run(
        &app,
        &mut rx,
        post("/v1/chat/completions", body),
        1,
        &["a", "", "b"],
    )
    .await;
    assert_eq!(entries[0].request.parameters.temperature, 0.0);
    assert_eq!(entries[0].request.parameters.seed, None);
    let data = sse_data(&text(resp).await);
    assert_eq!(data.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    // role, "a", "b" (the empty piece is skipped), finish, usage
    assert_eq!(chunks.len(), 5, "{chunks:?}");
    assert!(
        chunks
            .iter()
            .all(|c| c["object"] == "chat.completion.chunk")
    );
    assert!(chunks.iter().all(|c| c["id"] == chunks[0]["id"]));
    assert_eq!(
        chunks[0]["choices"][0]["delta"],
        json!({"role": "assistant", "content": ""})
    );
    assert_eq!(chunks[0]["usage"], Value::Null);
    assert_eq!(chunks[1]["choices"][0]["delta"], json!({"content": "a"}));
    assert_eq!(chunks[2]["choices"][0]["delta"], json!({"content": "b"}));
    assert_eq!(chunks[3]["choices"][0]["delta"], json!({}));
    assert_eq!(chunks[3]["choices"][0]["finish_reason"], "length");
    assert_eq!(chunks[4]["choices"], json!([]));
    assert_eq!(chunks[4]["usage"]["completion_tokens"], 3);
}

#[tokio::test]
async fn chat_stream_without_usage_has_no_usage_field() {
    let (app, mut rx) = setup(Setup::default());
    let body =
        json!({"model": MODEL, "stream": true, "messages": [{"role": "user", "content": "Hi"}]});
    let (resp, _) = run(&app, &mut rx, post("/v1/chat/completions", body), 1, &["a"]).await;
    let data = sse_data(&text(resp).await);
    assert_eq!(data.len(), 4); // role, "a", finish, [DONE]
    let first: Value = serde_json::from_str(&data[0]).unwrap();
    assert!(first.get("usage").is_none());
}

#[tokio::test]
async fn openai_validation_errors_are_400() {
    let app = setup(Setup {
        payload_limit: 2_000_000,
        ..Setup::default()
    })
    .0;
    let msgs = json!([{"role": "user", "content": "hi"}]);
    for (extra, param) in [
        (json!({"temperature": 2.5}), "temperature"),
        (json!({"top_p": 0}), "top_p"),
        (json!({"n": 5}), "n"),
        (json!({"n": 0}), "n"),
        (
            json!({"logprobs": true, "top_logprobs": 21}),
            "top_logprobs",
        ),
        (json!({"logit_bias": {"9999": 1}}), "logit_bias"),
        (json!({"logit_bias": {"5": 150}}), "logit_bias"),
        (json!({"presence_penalty": 3}), "presence_penalty"),
        (json!({"frequency_penalty": -3}), "frequency_penalty"),
        (json!({"max_tokens": 1000}), "max_tokens"),
        (json!({"stop": ["a", "b", "c"]}), "stop"),
        (json!({"messages": []}), "messages"),
        (
            json!({"messages": [{"role": "wizard", "content": "x"}]}),
            "messages",
        ),
        (
            json!({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
            "messages",
        ),
        // Malformed or unsatisfiable constraints are refused, never answered with free text.
        (
            json!({"response_format": {"type": "json_schema"}}),
            "response_format",
        ),
        (
            json!({"response_format": {"type": "xml"}}),
            "response_format",
        ),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x",
                   "schema": {"type": "integer", "minimum": 5, "maximum": 1}}}}),
            "response_format",
        ),
        (json!({"guided_json": "{not json"}), "guided_json"),
        (json!({"guided_json": [1, 2]}), "guided_json"),
        (
            json!({"guided_grammar": "start: undefined_rule"}),
            "guided_grammar",
        ),
        (json!({"guided_grammar": ""}), "guided_grammar"),
        (
            json!({"guided_json": {"type": "object"}, "guided_regex": "a+"}),
            "guided_regex",
        ),
        (
            json!({"structured_outputs": {"json": 5}}),
            "structured_outputs",
        ),
        (json!({"guided_choice": []}), "guided_choice"),
        (json!({"guided_choice": ["a", ""]}), "guided_choice"),
        (json!({"guided_choice": "a"}), "guided_choice"),
        (
            json!({"guided_choice": ["a"], "response_format": {"type": "json_object"}}),
            "guided_choice",
        ),
        (json!({"tools": [{"type": "function"}]}), "tools"),
        (
            json!({"tools": [{"type": "retrieval", "function": {"name": "f"}}]}),
            "tools",
        ),
        (
            json!({"tools": [{"type": "function", "function": {"name": "no spaces allowed"}}]}),
            "tools",
        ),
        (
            json!({"tools": (0..1000).map(|i| json!({"type": "function", "function": {"name": format!("f{i}")}})).collect::<Vec<_>>()}),
            "tools",
        ),
        (
            json!({"tools": [{"type": "function", "function": {"name": "deep", "parameters": (0..40).fold(json!({"type": "string"}), |inner, _| json!({"type": "array", "items": inner}))}}]}),
            "tools",
        ),
        (
            json!({"tools": [{"type": "function", "function": {"name": "f"}}],
                   "tool_choice": {"type": "function", "function": {"name": "g"}}}),
            "tool_choice",
        ),
        (
            json!({"tools": [{"type": "function", "function": {"name": "f"}}],
                   "response_format": {"type": "json_object"}}),
            "response_format",
        ),
        (
            json!({"tools": [{"type": "function"}], "tool_choice": "auto"}),
            "tools",
        ),
        (json!({"tool_choice": "required"}), "tool_choice"),
        (json!({"functions": [{"name": "f g"}]}), "functions"),
        (
            json!({"messages": [{"role": "assistant", "content": null,
                                 "tool_calls": [{"id": "1", "type": "function"}]}]}),
            "messages",
        ),
        (
            json!({"messages": [{"role": "assistant", "content": null,
                                 "tool_calls": [{"id": "1", "type": "function",
                                                 "function": {"name": "f", "arguments": "{not json"}}]}]}),
            "messages",
        ),
        (
            json!({"guided_grammar": "start: ".to_string() + &"\"x\" ".repeat(100_000)}),
            "guided_grammar",
        ),
    ] {
        let mut body = json!({"model": MODEL, "messages": msgs});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        let resp = call(&app, post("/v1/chat/completions", body)).await;
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST, "{extra}");
        let v = json_of(resp).await;
        assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
        assert_eq!(v["error"]["param"], param, "{v}");
    }
    for (extra, param) in [
        (json!({"logprobs": 6}), "logprobs"),
        (json!({"guided_regex": "("}), "guided_regex"),
        (json!({"guided_regex": 7}), "guided_regex"),
        (
            json!({"guided_regex": "a+", "guided_choice": ["a"]}),
            "guided_regex",
        ),
        (
            json!({"response_format": {"type": "json_schema"}}),
            "response_format",
        ),
    ] {
        let mut body = json!({"model": MODEL, "prompt": "x"});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        let resp = call(&app, post("/v1/completions", body)).await;
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST, "{extra}");
        assert_eq!(json_of(resp).await["error"]["param"], param, "{extra}");
    }
}

#[tokio::test]
async fn constraint_fields_that_ask_for_nothing_are_accepted() {
    let (app, mut rx) = setup(Setup::default());
    let body = json!({"model": MODEL, "max_tokens": 2, "response_format": {"type": "text"},
        "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "none",
        "guided_json": null, "messages": [{"role": "user", "content": "Hi"}]});
    let (resp, entries) = run(&app, &mut rx, post("/v1/chat/completions", body), 1, &["a"]).await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(entries[0].request.constraint, None);
    let body = json!({"model": MODEL, "max_tokens": 2, "tool_choice": "auto", "tools": [],
        "messages": [{"role": "user", "content": "Hi"}]});
    let (resp, _) = run(&app, &mut rx, post("/v1/chat/completions", body), 1, &["a"]).await;
    assert_eq!(resp.status(), StatusCode::OK);
}

#[tokio::test]
async fn constraints_reach_the_shard() {
    let (app, mut rx) = setup(Setup::default());
    let body = json!({"model": MODEL, "max_tokens": 2, "response_format": {"type": "json_object"},
        "messages": [{"role": "user", "content": "Hi"}]});
    let (resp, entries) = run(
        &app,
        &mut rx,
        post("/v1/chat/completions", body),
        1,
        &["{}"],
    )
    .await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(
        entries[0].request.constraint,
        Some(OutputConstraint::JsonObject)
    );
    let body = json!({"model": MODEL, "max_tokens": 2, "prompt": "x", "n": 2,
        "response_format": {"type": "json_object"}});
    let (resp, entries) = run(&app, &mut rx, post("/v1/completions", body), 2, &["{}"]).await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert!(
        entries
            .iter()
            .all(|e| e.request.constraint == Some(OutputConstraint::JsonObject))
    );
    let body = json!({"model": MODEL, "max_tokens": 2, "guided_choice": ["yes", "no"],
        "messages": [{"role": "user", "content": "Hi"}]});
    let (resp, entries) = run(
        &app,
        &mut rx,
        post("/v1/chat/completions", body),
        1,
        &["no"],
    )
    .await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(
        entries[0].request.constraint,
        Some(OutputConstraint::OneOf(vec!["yes".into(), "no".into()]))
    );
    let body = json!({"model": MODEL, "max_tokens": 2, "prompt": "x", "guided_regex": "[a-z]+"});
    let (resp, entries) = run(&app, &mut rx, post("/v1/completions", body), 1, &["ab"]).await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(
        entries[0].request.constraint,
        Some(OutputConstraint::Pattern("[a-z]+".into()))
    );
    let body = json!({"inputs": "x", "parameters": {"max_new_tokens": 2,
        "grammar": {"type": "regex", "value": "\\d+"}}});
    let (resp, entries) = run(&app, &mut rx, post("/generate", body), 1, &["12"]).await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(
        entries[0].request.constraint,
        Some(OutputConstraint::Pattern("\\d+".into()))
    );
}

#[tokio::test]
async fn completions_several_prompts_echo_and_logprobs() {
    let (app, mut rx) = setup(Setup::default());
    let body = json!({"model": MODEL, "prompt": ["One", "Two"], "n": 2, "echo": true,
                      "logprobs": 1, "temperature": 0});
    let (resp, entries) = run(&app, &mut rx, post("/v1/completions", body), 4, &["x", "y"]).await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(
        entries[0].request.stopping.max_new_tokens, 16,
        "OpenAI default"
    );
    assert!(entries[0].request.decoder_input_details);
    assert_eq!(entries[2].request.inputs, "Two");
    let v = json_of(resp).await;
    assert_eq!(v["object"], "text_completion");
    assert!(v["id"].as_str().unwrap().starts_with("cmpl-"));
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 4);
    assert_eq!(choices[3]["index"], 3);
    assert_eq!(choices[0]["text"], "Onexy");
    assert_eq!(choices[2]["text"], "Twoxy");
    let lp = &choices[0]["logprobs"];
    let n_prompt = entries[0].request.input_ids.len();
    assert_eq!(lp["tokens"].as_array().unwrap().len(), n_prompt + 2);
    assert_eq!(lp["token_logprobs"][0], Value::Null);
    assert_eq!(lp["tokens"][n_prompt], "x");
    assert_eq!(lp["text_offset"][n_prompt], 3);
    assert_eq!(lp["top_logprobs"][n_prompt], json!({"alt0": -0.25}));
    let prompt_tokens: usize = [0, 2]
        .iter()
        .map(|&i| entries[i].request.input_ids.len())
        .sum();
    assert_eq!(v["usage"]["prompt_tokens"], prompt_tokens);
    assert_eq!(v["usage"]["completion_tokens"], 8);
}

#[tokio::test]
async fn completions_token_prompt_and_stream() {
    let (app, mut rx) = setup(Setup::default());
    let body = json!({"model": MODEL, "prompt": [1, 2, 3], "stream": true, "echo": true,
                      "max_tokens": 2, "stream_options": {"include_usage": true}});
    let (resp, entries) = run(&app, &mut rx, post("/v1/completions", body), 1, &["x", "y"]).await;
    assert_eq!(entries[0].request.input_ids, vec![1, 2, 3]);
    let echo = entries[0].request.inputs.clone();
    let data = sse_data(&text(resp).await);
    assert_eq!(data.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert_eq!(chunks.len(), 3);
    assert_eq!(chunks[0]["choices"][0]["text"], format!("{echo}x"));
    assert_eq!(chunks[0]["choices"][0]["finish_reason"], Value::Null);
    assert_eq!(chunks[1]["choices"][0]["text"], "y");
    assert_eq!(chunks[1]["choices"][0]["finish_reason"], "length");
    assert_eq!(
        chunks[2]["usage"],
        json!({"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5})
    );

    let resp = call(
        &app,
        post("/v1/completions", json!({"model": MODEL, "prompt": [9999]})),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    let resp = call(
        &app,
        post("/v1/completions", json!({"model": MODEL, "prompt": []})),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
}
