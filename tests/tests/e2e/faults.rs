//! Fault injection: each fault has a defined outcome, and a test that shows it.
//!
//! | fault | defined outcome |
//! |---|---|
//! | a shard SIGKILLed mid-batch | every affected client gets an error (an SSE `error` event, a 5xx, or its connection closed) within 10 s; the launcher exits non-zero within 20 s; no client hangs |
//! | a shard stalled (SIGSTOP) mid-batch | requests wait, nothing is lost; `/health` answers within a bounded time (503 while the shard is stalled and there is no recent successful step; today it hangs, see `health_is_bounded_while_shard_stalled`); after SIGCONT every request completes with all its tokens and `/health` is 200 again |
//! | a shard's socket file deleted | nothing changes while the router keeps its connection (it connected at startup and does not reconnect by path): requests and `/health` keep working. A router (re)started after the deletion could not connect; the launcher only checks the sockets at startup |
//! | a model file truncated (before loading) | the shard fails at start with a message naming the file; the launcher exits non-zero within 30 s |
//! | the KV pool exhausted (tiny `--kv-cache-memory`, many long requests) | requests are preempted and resumed, and all complete with exactly the tokens they produce alone (greedy) |
//! | a client reading its stream very slowly | other clients are unaffected (their requests finish in their usual time); the slow client still gets its whole stream, and the router's RSS stays bounded |
//!
//! Every test bounds every wait; all traffic goes to 127.0.0.1.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use serde_json::{Value, json};
use tessera_e2e::{
    Paused, Server, SseItem, binary, client, fixture, read_json, rss_kib, signal, within,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn long(tokens: u32) -> Value {
    json!({"inputs": "The", "parameters": {"max_new_tokens": tokens, "ignore_eos": true, "details": true}})
}

/// SIGKILL of the shard with two streams and two plain requests in flight: each gets an
/// error within 10 s, and the launcher exits non-zero.
#[tokio::test]
async fn shard_sigkill_mid_batch() {
    within("shard_sigkill_mid_batch", Duration::from_secs(120), async {
        let mut s = Server::start("tiny-llama", &["--shutdown-grace-period", "2"]).await;
        let shard = s.child_pid("tessera-shard");
        let mut streams = Vec::new();
        for _ in 0..2 {
            let mut sse = s.stream("/generate_stream", &long(250)).await;
            assert!(matches!(
                sse.next_item(Duration::from_secs(10)).await,
                SseItem::Data(_)
            ));
            streams.push(sse);
        }
        let paused = Paused::new(shard);
        let mut plain = Vec::new();
        for _ in 0..2 {
            let r = s.client().post(s.url("/generate")).json(&long(250)).send();
            plain.push(tokio::spawn(async move {
                match r.await {
                    Ok(r) => read_json(r).await,
                    Err(e) => (0, Value::String(e.to_string())),
                }
            }));
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let killed = Instant::now();
        signal(shard, Signal::SIGKILL);
        drop(paused);

        let bound = Duration::from_secs(10);
        for mut sse in streams {
            let outcome = within("a stream's end after the shard died", bound, async {
                loop {
                    match sse.next_item(bound).await {
                        SseItem::Data(d) => {
                            let v: Value = serde_json::from_str(&d).unwrap_or(Value::String(d));
                            if v.get("error").is_some() {
                                return format!("error event {v}");
                            }
                            assert!(v["details"].is_null(), "stream finished normally: {v}");
                        }
                        SseItem::End => return "closed without an error event".to_owned(),
                        SseItem::Error(e) => return format!("transport error {e}"),
                    }
                }
            })
            .await;
            eprintln!("stream after {:?}: {outcome}", killed.elapsed());
        }
        for task in plain {
            let (status, body) = within("a plain request's answer", bound, task)
                .await
                .expect("task");
            eprintln!(
                "plain request after {:?}: {status} {body}",
                killed.elapsed()
            );
            assert!(
                status == 0 || status >= 500,
                "a request on a dead shard answered {status}: {body}"
            );
        }
        let status = s
            .wait_exit(Duration::from_secs(20))
            .await
            .expect("the launcher did not exit within 20 s of the shard's death");
        assert!(!status.success(), "the launcher exited with {status}");
        assert!(
            !s.log_tail(200).contains("panicked"),
            "a process panicked:\n{}",
            s.log_tail(60)
        );
    })
    .await;
}

/// SIGSTOP of the shard mid-batch: requests wait without losing anything; after SIGCONT
/// everything completes with all its tokens and `/health` is 200. (`/health` during the
/// stall: [`health_is_bounded_while_shard_stalled`].)
#[tokio::test]
async fn shard_sigstop_then_sigcont() {
    within(
        "shard_sigstop_then_sigcont",
        Duration::from_secs(120),
        async {
            let s = Server::start("tiny-llama", &[]).await;
            let shard = s.child_pid("tessera-shard");
            let tokens = 40u32;
            let mut sse = s.stream("/generate_stream", &long(tokens)).await;
            assert!(matches!(
                sse.next_item(Duration::from_secs(10)).await,
                SseItem::Data(_)
            ));
            let paused = Paused::new(shard);
            let mut plain = Vec::new();
            for _ in 0..3 {
                let r = s
                    .client()
                    .post(s.url("/generate"))
                    .json(&long(tokens))
                    .send();
                plain.push(tokio::spawn(async move {
                    read_json(r.await.expect("POST")).await
                }));
            }
            // Stalled for a while: the requests wait.
            tokio::time::sleep(Duration::from_secs(2)).await;
            for task in &plain {
                assert!(
                    !task.is_finished(),
                    "a request ended while the shard was stopped"
                );
            }
            paused.resume();
            // Resumed: everything completes, nothing lost.
            let mut streamed = 1;
            loop {
                match sse.next_item(Duration::from_secs(20)).await {
                    SseItem::Data(d) => {
                        let v: Value = serde_json::from_str(&d).expect("SSE JSON");
                        assert!(v.get("error").is_none(), "stream error: {v}");
                        streamed += 1;
                        if v["details"].is_object() {
                            assert_eq!(v["details"]["generated_tokens"], tokens, "{v}");
                            break;
                        }
                    }
                    other => panic!("the stream ended early after {streamed} events: {other:?}"),
                }
            }
            assert_eq!(streamed, tokens, "stream events");
            for task in plain {
                let (code, body) = task.await.expect("task");
                assert_eq!(code, 200, "{body}");
                assert_eq!(body["details"]["generated_tokens"], tokens, "{body}");
            }
            let (code, _) = s.get("/health").await;
            assert_eq!(code, 200, "/health after SIGCONT");
        },
    )
    .await;
}

/// `/health` with the shard stalled (SIGSTOP) and no successful step in the last 5 s must
/// answer 503 within a bounded time (10 s here), so that a load balancer or Kubernetes can
/// take the replica out (the router bounds its health RPC, so a shard that never answers
/// counts as unhealthy); after SIGCONT it answers 200 again.
#[tokio::test]
async fn health_is_bounded_while_shard_stalled() {
    within(
        "health_is_bounded_while_shard_stalled",
        Duration::from_secs(60),
        async {
            let s = Server::start("tiny-llama", &[]).await;
            let shard = s.child_pid("tessera-shard");
            s.generate(&long(3)).await;
            let paused = Paused::new(shard);
            // Past the health check's 5 s window of trust in the last successful step.
            tokio::time::sleep(Duration::from_secs(6)).await;
            let asked = Instant::now();
            let health = client()
                .get(s.url("/health"))
                .timeout(Duration::from_secs(10))
                .send()
                .await;
            let took = asked.elapsed();
            let status = health.as_ref().map_or(0, |r| r.status().as_u16());
            eprintln!("/health with the shard stalled: {status} after {took:?}");
            paused.resume();
            let (code, _) = within(
                "/health after SIGCONT",
                Duration::from_secs(15),
                s.get("/health"),
            )
            .await;
            assert_eq!(code, 200, "/health after SIGCONT");
            assert!(
                status == 503 && took < Duration::from_secs(10),
                "/health did not answer 503 within 10 s while the shard was stalled (status \
             {status} after {took:?}): the health RPC needs a timeout \
             (router/src/batcher/mod.rs Health::check, router/src/client.rs health)"
            );
        },
    )
    .await;
}

/// The shard's socket file deleted under a running cluster: the router's connection is
/// already open, so requests and `/health` keep working.
#[tokio::test]
async fn shard_socket_deleted() {
    within("shard_socket_deleted", Duration::from_secs(90), async {
        let s = Server::start("tiny-llama", &[]).await;
        let sockets = s.socket_files();
        assert!(!sockets.is_empty(), "no shard socket found");
        for path in &sockets {
            std::fs::remove_file(path).expect("remove the socket file");
        }
        for _ in 0..3 {
            let v = s.generate(&long(5)).await;
            assert_eq!(v["details"]["generated_tokens"], 5);
        }
        // Past the window in which /health trusts the last step, so it asks the shard.
        tokio::time::sleep(Duration::from_secs(6)).await;
        let (code, body) = within("/health", Duration::from_secs(10), s.get("/health")).await;
        assert_eq!(code, 200, "{body}");
    })
    .await;
}

/// Copies a fixture into a temporary folder.
fn copy_fixture(name: &str, to: &Path) {
    for entry in std::fs::read_dir(fixture(name)).expect("fixture") {
        let entry = entry.expect("entry");
        std::fs::copy(entry.path(), to.join(entry.file_name())).expect("copy");
    }
}

/// A model whose weights file is truncated: the shard fails at start naming the file,
/// and the launcher exits non-zero within 30 s.
#[tokio::test]
async fn truncated_model_fails_fast() {
    within(
        "truncated_model_fails_fast",
        Duration::from_secs(60),
        async {
            let dir = tempfile::tempdir().expect("tempdir");
            let model = dir.path().join("tiny-llama");
            std::fs::create_dir(&model).expect("mkdir");
            copy_fixture("tiny-llama", &model);
            let weights = model.join("model.safetensors");
            let len = std::fs::metadata(&weights).expect("weights").len();
            std::fs::OpenOptions::new()
                .write(true)
                .open(&weights)
                .expect("open")
                .set_len(len / 2)
                .expect("truncate");
            let log = dir.path().join("launcher.log");
            let out = std::fs::File::create(&log).expect("log");
            let port = tessera_e2e::free_port();
            let mut child = Command::new(binary("tessera-launcher"))
                .env_clear()
                .env("PATH", std::env::var_os("PATH").unwrap_or_default())
                .env("RUST_LOG", "info")
                .arg("--model-id")
                .arg(&model)
                .args(["--hostname", "127.0.0.1", "--port", &port.to_string()])
                .arg("--shard-uds-path")
                .arg(dir.path().join("shard"))
                .args(["--kv-cache-memory", "16M", "--shutdown-grace-period", "2"])
                .stdin(Stdio::null())
                .stdout(out.try_clone().expect("log"))
                .stderr(out)
                .spawn()
                .expect("start the launcher");
            let started = Instant::now();
            let status = loop {
                if let Some(status) = child.try_wait().expect("try_wait") {
                    break Some(status);
                }
                if started.elapsed() > Duration::from_secs(30) {
                    let _ = child.kill();
                    let _ = child.wait();
                    break None;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            };
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let status = status.unwrap_or_else(|| {
                panic!("the launcher did not exit within 30 s on a truncated model:\n{text}")
            });
            eprintln!(
                "launcher exited with {status} after {:?}",
                started.elapsed()
            );
            assert!(!status.success(), "exited with {status}:\n{text}");
            assert!(
                text.contains("model.safetensors"),
                "no message names the truncated file:\n{text}"
            );
            assert!(!text.contains("panicked"), "a process panicked:\n{text}");
        },
    )
    .await;
}

/// A KV pool larger than the machine's memory is refused at start-up, saying which flag to
/// lower (the CPU pool is taken whole when the server starts).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kv_pool_larger_than_memory_is_refused_at_start() {
    within("kv_pool_too_large", Duration::from_secs(60), async {
        let model = fixture("tiny-llama").into_os_string();
        // No backtrace: the error is the last thing the launcher prints.
        let quiet = [("RUST_BACKTRACE", "0")];
        let Err(err) = Server::try_start_with(&model, &quiet, &["--kv-cache-memory", "64T"]).await
        else {
            panic!("the launcher must not start");
        };
        assert!(
            err.contains("--kv-cache-memory asks for") && err.contains("lower --kv-cache-memory"),
            "{err}"
        );
    })
    .await;
}

/// A KV pool far smaller than the traffic (about 85 blocks of 16 tokens; twelve requests
/// of 240 tokens need about 180): requests are preempted and resumed, and each one's
/// greedy tokens equal those it gets alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kv_pool_exhausted_preempts_and_completes() {
    within("kv_pool_exhausted", Duration::from_secs(180), async {
        let s = Server::start("tiny-llama", &["--kv-cache-memory", "1M"]).await;
        let capacity = s.metric("tessera_kv_blocks_capacity").await;
        eprintln!("KV blocks: {capacity}");
        let prompts = ["The", "Once upon a time", "1, 2, 3,", "Hello"];
        let mut alone = Vec::new();
        for p in prompts {
            alone.push(s.greedy_ids(p, 240).await);
        }
        let mut tasks = Vec::new();
        for i in 0..12 {
            let url = s.url("/generate");
            let p = prompts[i % prompts.len()];
            tasks.push(tokio::spawn(async move {
                let r = client()
                    .post(url)
                    .json(&json!({"inputs": p, "parameters": {"max_new_tokens": 240, "details": true, "ignore_eos": true}}))
                    .send()
                    .await
                    .expect("POST /generate");
                read_json(r).await
            }));
        }
        let mut peak = 0.0f64;
        for (i, task) in tasks.into_iter().enumerate() {
            peak = peak.max(s.metric("tessera_kv_blocks_used").await);
            let (status, body) = task.await.expect("task");
            assert_eq!(status, 200, "request {i}: {body}");
            assert_eq!(
                tessera_e2e::detail_ids(&body),
                alone[i % prompts.len()],
                "request {i} differs from its solo run"
            );
        }
        let preemptions = s.metric("tessera_preemptions_total").await;
        eprintln!("peak KV blocks used seen: {peak} of {capacity}; {preemptions} preemptions");
        assert!(
            preemptions > 0.0,
            "no preemption: the test did not exhaust the pool"
        );
        let (used, ok) = s
            .wait_metric("tessera_kv_blocks_used", Duration::from_secs(5), |v| {
                v == 0.0
            })
            .await;
        assert!(ok, "{used} KV blocks still used when idle");
    })
    .await;
}

/// One client reads its stream a few bytes at a time with a tiny receive buffer while
/// others use the server: theirs finish in their usual time; the slow one still gets its
/// whole stream; the router's RSS does not balloon.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_reader_does_not_disturb_others() {
    within("slow_reader", Duration::from_secs(120), async {
        let s = Server::start("tiny-llama", &[]).await;
        let router = s.child_pid("tessera-router");
        // Baseline latency of a normal request.
        let t = Instant::now();
        s.generate(&long(30)).await;
        let baseline = t.elapsed();
        let rss_before = rss_kib(router).unwrap_or(0);

        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket.set_recv_buffer_size(1024).expect("SO_RCVBUF");
        let mut conn = socket
            .connect(([127, 0, 0, 1], s.port()).into())
            .await
            .expect("connect");
        let body = json!({"inputs": "The", "parameters": {"max_new_tokens": 250, "ignore_eos": true, "top_n_tokens": 5, "details": true}}).to_string();
        let request = format!(
            "POST /generate_stream HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        conn.write_all(request.as_bytes()).await.expect("write");

        // Others, while the slow client reads nothing.
        for _ in 0..10 {
            let t = Instant::now();
            let v = s.generate(&long(30)).await;
            assert_eq!(v["details"]["generated_tokens"], 30);
            assert!(
                t.elapsed() < baseline * 20 + Duration::from_secs(2),
                "a normal request took {:?} (baseline {baseline:?}) next to a slow reader",
                t.elapsed()
            );
        }
        let rss_during = rss_kib(router).unwrap_or(0);

        // Now the slow client reads everything, a few bytes at a time at first.
        let mut got = Vec::new();
        let mut buf = [0u8; 64];
        let slow_until = Instant::now() + Duration::from_secs(2);
        let mut caught_up = false;
        loop {
            let n = within("the slow stream", Duration::from_secs(30), conn.read(&mut buf))
                .await
                .expect("read");
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
            if Instant::now() < slow_until {
                tokio::time::sleep(Duration::from_millis(5)).await;
            } else if !caught_up {
                // Slow no longer: with a usual receive buffer the rest arrives at once, not a
                // kilobyte per round trip.
                socket2::SockRef::from(&conn)
                    .set_recv_buffer_size(1 << 20)
                    .expect("SO_RCVBUF");
                caught_up = true;
            }
        }
        let text = String::from_utf8_lossy(&got);
        let events = text.matches("data:").count();
        eprintln!(
            "slow stream: {} bytes, {events} events; router RSS {} -> {} KiB",
            got.len(),
            rss_before,
            rss_during
        );
        assert!(text.starts_with("HTTP/1.1 200"), "{text}");
        assert!(
            text.contains("\"generated_tokens\":250"),
            "the slow stream did not finish: {}",
            &text[text.len().saturating_sub(500)..]
        );
        assert!(
            rss_during < rss_before + 64 * 1024,
            "router RSS grew from {rss_before} to {rss_during} KiB next to a slow reader"
        );
    })
    .await;
}
