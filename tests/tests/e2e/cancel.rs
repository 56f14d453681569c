//! A client that goes away cancels its request: the batcher drops it and its KV blocks
//! return to the pool (`tessera_kv_blocks_used` back to 0 within 5 s), and it is counted as
//! cancelled, not as a success.
//!
//! The tiny model makes a token in about a millisecond, so a 250-token request would finish
//! on its own in a fraction of a second. To make the outcome depend only on cancellation,
//! the shard is paused (SIGSTOP) while the client goes away and resumed afterwards: a
//! request that is not cancelled then runs to the end and counts as a success.

use std::time::Duration;

use serde_json::json;
use tessera_e2e::{Paused, Server, client, within};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const CANCELLED: &str = "tessera_request_failure_total{err=\"cancelled\"}";
const DECODE_STEPS: &str = "tessera_batch_inference_total{method=\"decode\"}";
const LONG: u32 = 250;

/// Counters read before the client goes away (decode steps: from when the shard is paused).
struct Before {
    cancelled: f64,
    success: f64,
    decode_steps: f64,
}

async fn before(s: &Server) -> Before {
    Before {
        cancelled: s.metric(CANCELLED).await,
        success: s.metric("tessera_request_success_total").await,
        decode_steps: s.metric(DECODE_STEPS).await,
    }
}

async fn assert_cancelled(s: &Server, before: Before) {
    let (used, ok) = s
        .wait_metric("tessera_kv_blocks_used", Duration::from_secs(5), |v| {
            v == 0.0
        })
        .await;
    assert!(
        ok,
        "tessera_kv_blocks_used is still {used} 5 s after the client went away"
    );
    let success = s.metric("tessera_request_success_total").await;
    let steps = s.metric(DECODE_STEPS).await - before.decode_steps;
    eprintln!("{steps} decode steps after the client went away");
    assert!(
        success == before.success && steps <= 10.0,
        "the request was not cancelled: tessera_request_success_total {} -> {success}, {steps} \
         decode steps after the client went away (max_new_tokens {LONG})",
        before.success
    );
    let (cancelled, ok) = s
        .wait_metric(CANCELLED, Duration::from_secs(2), |v| v > before.cancelled)
        .await;
    assert!(
        ok,
        "the request was cancelled but not counted: {CANCELLED} {} -> {cancelled}",
        before.cancelled
    );
    // The batcher is not stuck.
    let v = s
        .generate(&json!({"inputs": "The", "parameters": {"max_new_tokens": 3}}))
        .await;
    assert!(v["generated_text"].is_string());
}

/// Sends a JSON POST over a fresh TCP connection and returns the connection.
async fn raw_post(s: &Server, path: &str, body: &serde_json::Value) -> TcpStream {
    let mut conn = TcpStream::connect(("127.0.0.1", s.port()))
        .await
        .expect("connect");
    let body = body.to_string();
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(request.as_bytes()).await.expect("write");
    conn
}

#[tokio::test]
async fn dropped_stream_cancels() {
    within("dropped_stream_cancels", Duration::from_secs(120), async {
        let s = Server::start("tiny-llama", &[]).await;
        let shard = s.child_pid("tessera-shard");
        let body =
            json!({"inputs": "The", "parameters": {"max_new_tokens": LONG, "ignore_eos": true}});
        let before = before(&s).await;
        // A raw connection, so dropping it closes the socket at once (an HTTP client
        // library may keep a dropped response's connection open for a while).
        let mut conn = raw_post(&s, "/generate_stream", &body).await;
        let mut seen = Vec::new();
        within("two SSE events", Duration::from_secs(10), async {
            while seen.windows(6).filter(|w| w == b"data: ").count() < 2 {
                let mut buf = [0u8; 4096];
                let n = conn.read(&mut buf).await.expect("read");
                assert!(
                    n > 0,
                    "connection closed early: {}",
                    String::from_utf8_lossy(&seen)
                );
                seen.extend_from_slice(&buf[..n]);
            }
        })
        .await;
        assert!(
            seen.starts_with(b"HTTP/1.1 200"),
            "{}",
            String::from_utf8_lossy(&seen)
        );
        let paused = Paused::new(shard);
        // Count decode steps from the pause: how many ran while the client was reading its
        // first events depends only on how busy the machine is.
        let before = Before {
            decode_steps: s.metric(DECODE_STEPS).await,
            ..before
        };
        assert!(
            s.metric("tessera_kv_blocks_used").await > 0.0,
            "blocks held mid-stream"
        );
        drop(conn);
        tokio::time::sleep(Duration::from_millis(300)).await;
        paused.resume();
        assert_cancelled(&s, before).await;
    })
    .await;
}

#[tokio::test]
async fn aborted_generate_cancels() {
    within("aborted_generate_cancels", Duration::from_secs(120), async {
        let s = Server::start("tiny-llama", &[]).await;
        let shard = s.child_pid("tessera-shard");
        let body = json!({"inputs": "The", "parameters": {"max_new_tokens": LONG, "ignore_eos": true}});
        let before = before(&s).await;
        let paused = Paused::new(shard);
        // Its own client, so the aborted connection is not reused.
        let aborted = client()
            .post(s.url("/generate"))
            .json(&body)
            .timeout(Duration::from_millis(500))
            .send()
            .await;
        let err = aborted.expect_err("the request cannot finish while the shard is paused");
        assert!(err.is_timeout(), "client-side abort: {err}");
        let (queued, ok) = s
            .wait_metric("tessera_requests_total", Duration::from_secs(2), |v| v >= 1.0)
            .await;
        assert!(ok, "the request reached the batcher (tessera_requests_total {queued})");
        tokio::time::sleep(Duration::from_millis(300)).await;
        paused.resume();
        assert_cancelled(&s, before).await;
    })
    .await;
}
