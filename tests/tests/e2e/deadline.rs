//! Request deadlines through the real launcher: a request past its deadline (the server's
//! `--request-timeout`, or a shorter `X-Request-Timeout` header) ends with its typed error
//! (504, `deadline_exceeded`), is counted under that class, and gives its KV blocks back.
//!
//! The shard is paused (SIGSTOP) while the deadline passes, so the outcome depends only on
//! the deadline: the tiny model would otherwise finish the request first.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tessera_e2e::{Paused, Server, SseItem, read_json, within};

const DEADLINE_EXCEEDED: &str = "tessera_request_failure_total{err=\"deadline_exceeded\"}";
/// The server's `--request-timeout`, in seconds.
const SERVER_TIMEOUT: f64 = 3.0;

fn long() -> Value {
    json!({"inputs": "The", "parameters": {"max_new_tokens": 250, "ignore_eos": true}})
}

/// Waits until the KV blocks are back in the pool and the failure was counted `n` times.
async fn assert_freed_and_counted(s: &Server, n: f64) {
    let (used, ok) = s
        .wait_metric("tessera_kv_blocks_used", Duration::from_secs(5), |v| {
            v == 0.0
        })
        .await;
    assert!(
        ok,
        "tessera_kv_blocks_used is still {used} after the deadline"
    );
    let (count, ok) = s
        .wait_metric(DEADLINE_EXCEEDED, Duration::from_secs(2), |v| v == n)
        .await;
    assert!(ok, "{DEADLINE_EXCEEDED} is {count}, expected {n}");
    assert_eq!(s.metric("tessera_request_success_total").await, 0.0);
    let cancelled = s
        .metric("tessera_request_failure_total{err=\"cancelled\"}")
        .await;
    assert_eq!(cancelled, 0.0, "a deadline is not a cancellation");
}

/// A stream whose header asks for 0.5 s: an error event, then the end of the stream.
async fn stream_past_its_header_deadline(s: &Server, shard: i32) {
    let r = s
        .client()
        .post(s.url("/generate_stream"))
        .header(tessera_router::REQUEST_TIMEOUT_HEADER, "0.5")
        .json(&long())
        .send()
        .await
        .expect("POST /generate_stream");
    assert_eq!(r.status(), 200);
    let mut sse = tessera_e2e::Sse::new(r);
    assert!(matches!(
        sse.next_item(Duration::from_secs(10)).await,
        SseItem::Data(_)
    ));
    let paused = Paused::new(shard);
    let started = Instant::now();
    let mut last = Value::Null;
    while let Some(e) = sse.next_json().await {
        last = e;
    }
    let after = started.elapsed();
    eprintln!("stream ended {after:?} after the shard paused: {last}");
    assert_eq!(last["error_type"], "deadline_exceeded", "{last}");
    assert!(
        after < Duration::from_secs(2),
        "the stream ended after {after:?}"
    );
    paused.resume();
    assert_freed_and_counted(s, 1.0).await;
}

/// A plain request with no header ends at the server's deadline with a 504.
async fn plain_past_the_server_deadline(s: &Server, shard: i32) {
    let paused = Paused::new(shard);
    let started = Instant::now();
    let r = s.client().post(s.url("/generate")).json(&long()).send();
    let (status, body) = read_json(r.await.expect("POST /generate")).await;
    let after = started.elapsed();
    eprintln!("/generate answered {status} after {after:?}: {body}");
    assert_eq!(status, 504, "{body}");
    assert_eq!(body["error_type"], "deadline_exceeded", "{body}");
    assert!(
        body["error"]
            .as_str()
            .is_some_and(|m| m.contains("X-Request-Timeout")),
        "the message says what to change: {body}"
    );
    let bound = Duration::from_secs_f64(SERVER_TIMEOUT);
    assert!(after >= bound && after < bound * 2, "504 after {after:?}");
    paused.resume();
    assert_freed_and_counted(s, 2.0).await;
}

/// The OpenAI shape of the same error, and a header that is not a number.
async fn openai_shape_and_bad_header(s: &Server, shard: i32) {
    let paused = Paused::new(shard);
    let r = s
        .client()
        .post(s.url("/v1/completions"))
        .header(tessera_router::REQUEST_TIMEOUT_HEADER, "0.3")
        .json(&json!({"model": "tiny-llama", "prompt": "The", "max_tokens": 200}))
        .send();
    let (status, body) = read_json(r.await.expect("POST /v1/completions")).await;
    paused.resume();
    assert_eq!(status, 504, "{body}");
    assert_eq!(body["error"]["code"], "deadline_exceeded", "{body}");
    assert_freed_and_counted(s, 3.0).await;

    let r = s
        .client()
        .post(s.url("/generate"))
        .header(tessera_router::REQUEST_TIMEOUT_HEADER, "soon")
        .json(&long())
        .send();
    let (status, body) = read_json(r.await.expect("POST /generate")).await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"]
            .as_str()
            .is_some_and(|m| m.contains("seconds")),
        "{body}"
    );
}

#[tokio::test]
async fn requests_past_their_deadline_end_with_their_error_and_free_their_blocks() {
    within("deadlines", Duration::from_secs(120), async {
        let timeout = SERVER_TIMEOUT.to_string();
        let s = Server::start("tiny-llama", &["--request-timeout", &timeout]).await;
        let shard = s.child_pid("tessera-shard");
        stream_past_its_header_deadline(&s, shard).await;
        plain_past_the_server_deadline(&s, shard).await;
        openai_shape_and_bad_header(&s, shard).await;
    })
    .await;
}
