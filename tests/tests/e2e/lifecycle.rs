//! Process lifecycle through the real launcher: SIGTERM shuts everything down cleanly; a
//! shard killed mid-request fails the request promptly and takes the cluster down.

use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use serde_json::{Value, json};
use tessera_e2e::{Paused, Server, SseItem, read_json, signal, wait_all_dead, within};

const GRACE: u64 = 5;

#[tokio::test]
async fn sigterm_exits_cleanly() {
    within("sigterm_exits_cleanly", Duration::from_secs(120), async {
        let grace = GRACE.to_string();
        let mut s = Server::start("tiny-llama", &["--shutdown-grace-period", &grace]).await;
        let shard = s.child_pid("tessera-shard");
        let router = s.child_pid("tessera-router");
        assert_eq!(
            s.socket_files(),
            [s.uds_prefix().with_file_name("shard-0")],
            "shard socket"
        );
        s.generate(&json!({"inputs": "The", "parameters": {"max_new_tokens": 4}}))
            .await;

        let sent = Instant::now();
        s.signal(Signal::SIGTERM);
        let status = s
            .wait_exit(Duration::from_secs(GRACE))
            .await
            .unwrap_or_else(|| {
                panic!("the launcher did not exit within the {GRACE} s grace period")
            });
        eprintln!("launcher exited after {:?} with {status}", sent.elapsed());
        assert_eq!(
            status.code(),
            Some(0),
            "exit status after SIGTERM ({status})"
        );
        wait_all_dead(&[shard, router], Duration::from_secs(2)).await;
        assert_eq!(
            s.socket_files(),
            Vec::<std::path::PathBuf>::new(),
            "sockets removed"
        );
        let refused = tessera_e2e::client().get(s.url("/health")).send().await;
        assert!(refused.is_err(), "nothing listens on the port any more");
    })
    .await;
}

/// While draining: readiness (`/health`) fails within 100 ms of the signal, liveness
/// (`/live`) holds, and a new request is refused with its typed error.
async fn check_draining(s: &Server, signalled: Instant) {
    let health = loop {
        let r = s.client().get(s.url("/health")).send().await;
        let r = r.expect("the router still listens while draining");
        if r.status() == 503 {
            break read_json(r).await.1;
        }
        assert!(
            signalled.elapsed() < Duration::from_secs(5),
            "/health still answers {} after SIGTERM",
            r.status()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let after = signalled.elapsed();
    eprintln!("/health answered 503 {after:?} after SIGTERM: {health}");
    assert!(
        after < Duration::from_millis(100),
        "/health 503 after {after:?}"
    );
    assert_eq!(health["error_type"], "draining", "{health}");
    let (status, live) = s.get("/live").await;
    assert_eq!(status, 200, "liveness while draining: {live}");
    let body = json!({"inputs": "The", "parameters": {"max_new_tokens": 2}});
    let (status, refused) = s.post("/generate", &body).await;
    assert_eq!(status, 503, "a new request while draining: {refused}");
    assert_eq!(refused["error_type"], "draining", "{refused}");
}

/// SIGTERM while a stream is in flight: `/health` answers 503 at once, the router takes no
/// new requests but finishes the stream, then everything exits 0.
#[tokio::test]
async fn sigterm_finishes_in_flight_stream() {
    within(
        "sigterm_finishes_in_flight_stream",
        Duration::from_secs(120),
        async {
            let grace = GRACE.to_string();
            let mut s = Server::start("tiny-llama", &["--shutdown-grace-period", &grace]).await;
            let shard = s.child_pid("tessera-shard");
            let router = s.child_pid("tessera-router");
            let body =
                json!({"inputs": "The", "parameters": {"max_new_tokens": 100, "ignore_eos": true}});
            // The shard is paused first, so the stream cannot finish before the signal (a tiny
            // model writes 100 tokens in milliseconds).
            let paused = Paused::new(shard);
            let mut sse = s.stream("/generate_stream", &body).await;
            s.signal(Signal::SIGTERM);
            let signalled = Instant::now();
            check_draining(&s, signalled).await;
            paused.resume();
            let mut events: Vec<Value> = Vec::new();
            while let Some(e) = sse.next_json().await {
                events.push(e);
            }
            let last = events.last().expect("the stream's events after SIGTERM");
            assert_eq!(
                last["details"]["finish_reason"], "length",
                "last event {last}"
            );
            assert_eq!(last["details"]["generated_tokens"], 100);
            let status = s
                .wait_exit(Duration::from_secs(2 * GRACE))
                .await
                .expect("the launcher exits once the stream is done");
            assert_eq!(status.code(), Some(0), "{status}");
            wait_all_dead(&[shard, router], Duration::from_secs(2)).await;
        },
    )
    .await;
}

/// A shard SIGKILLed while a stream and a plain request are in flight: the stream gets an
/// error event, the plain request a 5xx, both promptly; the launcher exits non-zero and
/// nothing it started keeps running.
#[tokio::test]
async fn shard_killed_mid_request() {
    within(
        "shard_killed_mid_request",
        Duration::from_secs(120),
        async {
            let grace = GRACE.to_string();
            let mut s = Server::start("tiny-llama", &["--shutdown-grace-period", &grace]).await;
            let shard = s.child_pid("tessera-shard");
            let router = s.child_pid("tessera-router");
            let body =
                json!({"inputs": "The", "parameters": {"max_new_tokens": 250, "ignore_eos": true}});
            let mut sse = s.stream("/generate_stream", &body).await;
            assert!(matches!(
                sse.next_item(Duration::from_secs(10)).await,
                SseItem::Data(_)
            ));
            // Freeze the shard so both requests are surely in flight when it dies.
            let paused = Paused::new(shard);
            let plain = {
                let r = s.client().post(s.url("/generate")).json(&body).send();
                tokio::spawn(async move { read_json(r.await.expect("POST /generate")).await })
            };
            let (n, ok) = s
                .wait_metric("tessera_requests_total", Duration::from_secs(5), |v| {
                    v >= 2.0
                })
                .await;
            assert!(ok, "both requests queued (tessera_requests_total {n})");
            let killed = Instant::now();
            signal(shard, Signal::SIGKILL);
            drop(paused);

            // The stream: an error event (after any tokens already made), promptly.
            let bound = Duration::from_secs(10);
            let outcome = within("the stream's outcome after the shard died", bound, async {
                loop {
                    match sse.next_item(bound).await {
                        SseItem::Data(d) => {
                            let v: Value = serde_json::from_str(&d).unwrap_or(Value::String(d));
                            if v.get("error").is_some() {
                                return Ok(v);
                            }
                            assert!(v["details"].is_null(), "the stream finished normally: {v}");
                        }
                        other => return Err(other),
                    }
                }
            })
            .await;
            match outcome {
                Ok(e) => {
                    eprintln!("stream error event after {:?}: {e}", killed.elapsed());
                    assert!(e["error"].is_string() && e["error_type"].is_string(), "{e}");
                }
                Err(other) => panic!("the stream ended without an error event: {other:?}"),
            }
            let (status, answer) = within("the plain request's answer", bound, plain)
                .await
                .expect("task");
            eprintln!(
                "plain request after {:?}: {status} {answer}",
                killed.elapsed()
            );
            assert!(
                (500..600).contains(&status),
                "plain request: {status} {answer}"
            );
            assert!(
                answer["error"].is_string() && answer["error_type"].is_string(),
                "{answer}"
            );

            let status = s
                .wait_exit(Duration::from_secs(3 * GRACE))
                .await
                .expect("the launcher exits after a shard died");
            eprintln!("launcher exited after {:?} with {status}", killed.elapsed());
            assert!(
                !status.success(),
                "the launcher must fail when a shard dies ({status})"
            );
            wait_all_dead(&[shard, router], Duration::from_secs(2)).await;
            assert_eq!(
                s.socket_files(),
                Vec::<std::path::PathBuf>::new(),
                "sockets removed"
            );
        },
    )
    .await;
}
