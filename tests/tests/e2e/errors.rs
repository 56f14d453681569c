//! Each error class through the real server, with its status code and body shape: native
//! routes answer `{"error", "error_type"}`, `/v1` routes OpenAI's
//! `{"error": {"message", "type", "param", "code"}}`. Also the API key and the concurrency
//! limit, each on its own server.

use std::time::Duration;

use serde_json::{Value, json};
use tessera_e2e::{Checks, Paused, Server, Sse, read_json, within};

const CHECK_LIMIT: Duration = Duration::from_secs(60);
const MODEL: &str = "tiny-llama";

/// A native error body: exactly `error` (a message containing `needle`) and `error_type`.
#[track_caller]
fn native_error(status: u16, body: &Value, want_status: u16, error_type: &str, needle: &str) {
    assert_eq!(status, want_status, "status of {body}");
    assert_eq!(
        body.as_object().map(|o| o.len()),
        Some(2),
        "fields of {body}"
    );
    assert_eq!(body["error_type"], error_type, "error_type of {body}");
    let message = body["error"]
        .as_str()
        .unwrap_or_else(|| panic!("error in {body}"));
    assert!(
        message.contains(needle),
        "{message:?} should mention {needle:?}"
    );
}

/// An OpenAI error body.
#[track_caller]
fn openai_error(
    status: u16,
    body: &Value,
    want_status: u16,
    kind: &str,
    param: Option<&str>,
    code: Option<&str>,
    needle: &str,
) {
    assert_eq!(status, want_status, "status of {body}");
    assert_eq!(
        body.as_object().map(|o| o.len()),
        Some(1),
        "fields of {body}"
    );
    let e = &body["error"];
    let mut keys: Vec<&str> = e
        .as_object()
        .expect("error object")
        .keys()
        .map(|k| k.as_str())
        .collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        ["code", "message", "param", "type"],
        "fields of {body}"
    );
    assert_eq!(e["type"], kind, "type of {body}");
    assert_eq!(e["param"], json!(param), "param of {body}");
    assert_eq!(e["code"], json!(code), "code of {body}");
    let message = e["message"].as_str().expect("message");
    assert!(
        message.contains(needle),
        "{message:?} should mention {needle:?}"
    );
}

async fn post_raw(
    s: &Server,
    path: &str,
    body: &'static str,
    content_type: Option<&str>,
) -> (u16, Value) {
    let mut r = s.client().post(s.url(path)).body(body);
    if let Some(ct) = content_type {
        r = r.header("content-type", ct);
    }
    read_json(r.send().await.expect("POST")).await
}

fn chat(extra: Value) -> Value {
    let mut b =
        json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4});
    for (k, v) in extra.as_object().expect("object") {
        b[k] = v.clone();
    }
    b
}

async fn malformed_json(s: &Server) {
    let (st, b) = post_raw(s, "/generate", "{\"inputs\": ", Some("application/json")).await;
    native_error(st, &b, 400, "json", "JSON");
    let (st, b) = post_raw(s, "/generate_stream", "not json", Some("application/json")).await;
    native_error(st, &b, 400, "json", "JSON");
    let (st, b) = post_raw(
        s,
        "/v1/chat/completions",
        "{\"model\": ",
        Some("application/json"),
    )
    .await;
    openai_error(st, &b, 400, "invalid_request_error", None, None, "JSON");
    // Well-formed JSON of the wrong shape.
    let (st, b) = s.post("/generate", &json!({"inputs": 5})).await;
    native_error(st, &b, 422, "json", "inputs");
    let (st, b) = s.post("/v1/completions", &json!({"model": MODEL})).await;
    openai_error(st, &b, 400, "invalid_request_error", None, None, "prompt");
    // Not declared as JSON.
    let (st, b) = post_raw(s, "/generate", "{\"inputs\": \"x\"}", None).await;
    native_error(st, &b, 415, "unsupported_media_type", "");
}

async fn empty_input(s: &Server) {
    let (st, b) = s.post("/generate", &json!({"inputs": ""})).await;
    native_error(st, &b, 422, "validation", "`inputs` cannot be empty");
    let (st, b) = s.post("/generate_stream", &json!({"inputs": ""})).await;
    native_error(st, &b, 422, "validation", "`inputs` cannot be empty");
    let (st, b) = s
        .post(
            "/v1/chat/completions",
            &json!({"model": MODEL, "messages": []}),
        )
        .await;
    openai_error(
        st,
        &b,
        400,
        "invalid_request_error",
        Some("messages"),
        None,
        "messages",
    );
    let (st, b) = s
        .post("/v1/completions", &json!({"model": MODEL, "prompt": []}))
        .await;
    openai_error(
        st,
        &b,
        400,
        "invalid_request_error",
        Some("prompt"),
        None,
        "prompt",
    );
}

async fn input_too_long(s: &Server) {
    let inputs = "The capital of France is Paris. Every morning the bakers open early";
    let n = s.tokenize(inputs).await.len();
    assert!(n > 16, "the prompt has {n} tokens");
    let (st, b) = s
        .post(
            "/generate",
            &json!({"inputs": inputs, "parameters": {"max_new_tokens": 2}}),
        )
        .await;
    native_error(
        st,
        &b,
        422,
        "validation",
        &format!("must have at most 16 tokens. Given: {n}"),
    );
    let (st, b) = s
        .post(
            "/v1/completions",
            &json!({"model": MODEL, "prompt": inputs, "max_tokens": 2}),
        )
        .await;
    assert_eq!(st, 400, "{b}");
    assert_eq!(b["error"]["type"], "invalid_request_error");
    assert!(
        b["error"]["message"]
            .as_str()
            .unwrap()
            .contains("at most 16 tokens"),
        "{b}"
    );
}

async fn over_total(s: &Server) {
    let (st, b) = s
        .post(
            "/generate",
            &json!({"inputs": "The", "parameters": {"max_new_tokens": 64}}),
        )
        .await;
    native_error(
        st,
        &b,
        422,
        "validation",
        "must be <= 64. Given: 1 `inputs` tokens and 64 `max_new_tokens`",
    );
    let (st, b) = s
        .post("/v1/chat/completions", &chat(json!({"max_tokens": 1000})))
        .await;
    openai_error(
        st,
        &b,
        400,
        "invalid_request_error",
        Some("max_tokens"),
        None,
        "must be <= 64",
    );
    let (st, b) = s
        .post(
            "/generate",
            &json!({"inputs": "The", "parameters": {"max_new_tokens": 0}}),
        )
        .await;
    native_error(st, &b, 422, "validation", "max_new_tokens");
}

async fn bad_sampling(s: &Server) {
    let bad = [
        (json!({"temperature": -0.5}), "temperature"),
        (json!({"top_p": 0.0}), "top_p"),
        (json!({"top_p": 1.5}), "top_p"),
        (json!({"top_k": 0}), "top_k"),
        (json!({"repetition_penalty": 0.0}), "repetition_penalty"),
        (json!({"top_n_tokens": 6}), "top_n_tokens"),
    ];
    for (params, param) in bad {
        let (st, b) = s
            .post("/generate", &json!({"inputs": "The", "parameters": params}))
            .await;
        native_error(st, &b, 422, "validation", &format!("`{param}`"));
        let (st, b) = s
            .post(
                "/generate_stream",
                &json!({"inputs": "The", "parameters": params}),
            )
            .await;
        native_error(st, &b, 422, "validation", &format!("`{param}`"));
    }
    for (extra, param) in [
        (json!({"temperature": 2.5}), "temperature"),
        (json!({"temperature": -1}), "temperature"),
        (json!({"top_p": 1.5}), "top_p"),
        (json!({"presence_penalty": 3}), "presence_penalty"),
        (
            json!({"logprobs": true, "top_logprobs": 21}),
            "top_logprobs",
        ),
        (json!({"n": 0}), "n"),
    ] {
        let (st, b) = s.post("/v1/chat/completions", &chat(extra.clone())).await;
        openai_error(
            st,
            &b,
            400,
            "invalid_request_error",
            Some(param),
            None,
            param,
        );
    }
}

async fn too_many_stops(s: &Server) {
    let stops = ["a", "b", "c"];
    let (st, b) = s
        .post(
            "/generate",
            &json!({"inputs": "The", "parameters": {"max_new_tokens": 2, "stop": stops}}),
        )
        .await;
    native_error(st, &b, 422, "validation", "`stop` must be <= 2. Given: 3");
    let (st, b) = s
        .post("/v1/chat/completions", &chat(json!({"stop": stops})))
        .await;
    openai_error(
        st,
        &b,
        400,
        "invalid_request_error",
        Some("stop"),
        None,
        "`stop` must be <= 2",
    );
    let (st, b) = s
        .post(
            "/generate",
            &json!({"inputs": "The", "parameters": {"max_new_tokens": 2, "stop": [""]}}),
        )
        .await;
    native_error(st, &b, 422, "validation", "empty");
}

async fn payload_too_large(s: &Server) {
    let big = "x".repeat(5000);
    let (st, b) = s.post("/generate", &json!({"inputs": big})).await;
    native_error(st, &b, 413, "payload_too_large", "4096");
    let (st, b) = s
        .post(
            "/v1/completions",
            &json!({"model": MODEL, "prompt": big, "max_tokens": 2}),
        )
        .await;
    assert_eq!(st, 413, "{b}");
    assert!(
        b["error"]["message"]
            .as_str()
            .expect("OpenAI shape")
            .contains("4096"),
        "{b}"
    );
    // Just under the limit passes the size check (and fails on length instead).
    let (st, b) = s
        .post("/generate", &json!({"inputs": "x".repeat(3000)}))
        .await;
    native_error(st, &b, 422, "validation", "at most 16 tokens");
}

async fn unknown_route_and_method(s: &Server) {
    let (st, b) = s.post("/nope", &json!({})).await;
    native_error(st, &b, 404, "not_found", "/nope");
    let (st, b) = s.get("/v1/nope").await;
    openai_error(st, &b, 404, "invalid_request_error", None, None, "/v1/nope");
    let (st, b) = s.get("/generate").await;
    native_error(st, &b, 405, "method_not_allowed", "");
}

/// After all the errors the server is fine: healthy, serves, holds no KV blocks, and no
/// rejected request was counted as queued.
async fn undisturbed(s: &Server) {
    let (st, _) = s.get("/health").await;
    assert_eq!(st, 200);
    let v = s
        .generate(&json!({"inputs": "The", "parameters": {"max_new_tokens": 3}}))
        .await;
    assert!(v["generated_text"].is_string());
    assert_eq!(s.metric("tessera_kv_blocks_used").await, 0.0);
    // Requests refused before queueing count as requests and as failures.
    let text = s.metrics_text().await;
    let failures: f64 = text
        .lines()
        .filter(|l| l.starts_with("tessera_request_failure_total{"))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum();
    assert_eq!(
        s.metric("tessera_requests_total").await,
        s.metric("tessera_request_success_total").await + failures
    );
}

#[tokio::test]
async fn error_classes() {
    within("error_classes", Duration::from_secs(300), async {
        let server = Server::start(
            MODEL,
            &[
                "--max-input-tokens",
                "16",
                "--max-total-tokens",
                "64",
                "--payload-limit",
                "4096",
                "--max-stop-sequences",
                "2",
            ],
        )
        .await;
        let s = &server;
        let mut checks = Checks::new();
        checks
            .run("malformed JSON", CHECK_LIMIT, malformed_json(s))
            .await;
        checks.run("empty input", CHECK_LIMIT, empty_input(s)).await;
        checks
            .run("input too long", CHECK_LIMIT, input_too_long(s))
            .await;
        checks
            .run("max_new_tokens over the total", CHECK_LIMIT, over_total(s))
            .await;
        checks
            .run("bad sampling parameters", CHECK_LIMIT, bad_sampling(s))
            .await;
        checks
            .run("too many stop sequences", CHECK_LIMIT, too_many_stops(s))
            .await;
        checks
            .run("payload too large", CHECK_LIMIT, payload_too_large(s))
            .await;
        checks
            .run(
                "unknown route and method",
                CHECK_LIMIT,
                unknown_route_and_method(s),
            )
            .await;
        checks
            .run("server undisturbed", CHECK_LIMIT, undisturbed(s))
            .await;
        checks.finish();
    })
    .await;
}

#[tokio::test]
async fn api_key() {
    within("api_key", Duration::from_secs(120), async {
        const KEY: &str = "e2e-secret-key-4821";
        let s = Server::start(MODEL, &["--api-key", KEY]).await;
        let c = s.client();
        let gen_body = json!({"inputs": "The", "parameters": {"max_new_tokens": 2}});
        let chat_body = chat(json!({}));
        for auth in [None, Some("Bearer wrong-key"), Some(KEY), Some("Basic e2e")] {
            let with = |r: reqwest::RequestBuilder| match auth {
                Some(a) => r.header("authorization", a),
                None => r,
            };
            let (st, b) = read_json(
                with(c.post(s.url("/generate")).json(&gen_body))
                    .send()
                    .await
                    .unwrap(),
            )
            .await;
            native_error(st, &b, 401, "unauthorized", "API key");
            let (st, b) = read_json(
                with(c.post(s.url("/tokenize")).json(&gen_body))
                    .send()
                    .await
                    .unwrap(),
            )
            .await;
            native_error(st, &b, 401, "unauthorized", "API key");
            let (st, b) = read_json(
                with(c.post(s.url("/v1/chat/completions")).json(&chat_body))
                    .send()
                    .await
                    .unwrap(),
            )
            .await;
            openai_error(
                st,
                &b,
                401,
                "invalid_request_error",
                None,
                Some("invalid_api_key"),
                "API key",
            );
            let (st, b) = read_json(with(c.get(s.url("/v1/models"))).send().await.unwrap()).await;
            openai_error(
                st,
                &b,
                401,
                "invalid_request_error",
                None,
                Some("invalid_api_key"),
                "API key",
            );
        }
        let bearer = format!("Bearer {KEY}");
        let ok = |r: reqwest::RequestBuilder| r.header("authorization", bearer.as_str());
        let r = ok(c.post(s.url("/generate")).json(&gen_body))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let r = ok(c.post(s.url("/generate_stream")).json(&gen_body))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let (events, _) = Sse::new(r).collect_json().await;
        assert_eq!(events.len(), 2);
        let r = ok(c.post(s.url("/v1/chat/completions")).json(&chat_body))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let r = ok(c.get(s.url("/v1/models"))).send().await.unwrap();
        assert_eq!(r.status(), 200);
        // Open without a key.
        for path in ["/health", "/metrics", "/info"] {
            let r = c.get(s.url(path)).send().await.unwrap();
            assert_eq!(r.status(), 200, "GET {path} without a key");
        }
        // The key is on no process's command line.
        for pid in std::iter::once(s.pid()).chain(s.children().into_iter().map(|(p, _)| p)) {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if pid != s.pid() {
                assert!(
                    !cmdline.contains(KEY),
                    "API key on the command line of {pid}: {cmdline}"
                );
            }
        }
    })
    .await;
}

/// `--max-concurrent-requests 2`: with two streams in flight (the shard paused so they
/// cannot finish), the next request is refused at once with 429; once they finish,
/// requests are accepted again.
#[tokio::test]
async fn concurrency_limit() {
    within("concurrency_limit", Duration::from_secs(120), async {
        let s = Server::start(MODEL, &["--max-concurrent-requests", "2"]).await;
        let shard = s.child_pid("tessera-shard");
        let body =
            json!({"inputs": "The", "parameters": {"max_new_tokens": 50, "ignore_eos": true}});
        let paused = Paused::new(shard);
        // Response headers mean the request holds its permit.
        let first = s.stream("/generate_stream", &body).await;
        let second = s.stream("/generate_stream", &body).await;
        let quick = Duration::from_secs(3);
        let (st, b) = within("429 on /generate", quick, s.post("/generate", &body)).await;
        native_error(st, &b, 429, "overloaded", "overloaded");
        let (st, b) = within(
            "429 on /generate_stream",
            quick,
            s.post("/generate_stream", &body),
        )
        .await;
        native_error(st, &b, 429, "overloaded", "overloaded");
        let (st, b) = within(
            "429 on chat",
            quick,
            s.post("/v1/chat/completions", &chat(json!({}))),
        )
        .await;
        openai_error(
            st,
            &b,
            429,
            "requests",
            None,
            Some("rate_limit_exceeded"),
            "overloaded",
        );
        paused.resume();
        for (name, stream) in [("first", first), ("second", second)] {
            let (events, _) = stream.collect_json().await;
            assert_eq!(events.len(), 50, "{name} stream completes after the 429s");
            assert_eq!(events.last().unwrap()["details"]["finish_reason"], "length");
        }
        // Permits are back: two at once are accepted again.
        let (a, b) = tokio::join!(s.post("/generate", &body), s.post("/generate", &body));
        assert_eq!((a.0, b.0), (200, 200), "{a:?} {b:?}");
        let (st, b) = s
            .post(
                "/v1/completions",
                &json!({"model": MODEL, "prompt": "The", "n": 3, "max_tokens": 2}),
            )
            .await;
        openai_error(
            st,
            &b,
            429,
            "requests",
            None,
            Some("rate_limit_exceeded"),
            "overloaded",
        );
        assert_eq!(s.metric("tessera_kv_blocks_used").await, 0.0);
    })
    .await;
}
