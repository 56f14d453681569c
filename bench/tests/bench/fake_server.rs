//! `tessera-bench` against a scripted fake streaming server on 127.0.0.1: every statistic's
//! arithmetic, malformed and missing chunks, HTTP errors, dropped connections, and the CLI
//! (`--json`, `--plot`, `--sweep`, `--compare`).

use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};
use tessera_bench::client::http_client;
use tessera_bench::runner::run;
use tessera_bench::{
    BenchReport, Endpoint, ErrorKind, LoadPlan, RequestRecord, RequestSpec, RunMetrics, Target,
};

/// One step of a scripted stream.
enum Step {
    /// Wait, then send these bytes.
    Send(u64, String),
    /// Break the connection.
    Drop,
}

fn data(value: Value) -> String {
    format!("data: {value}\n\n")
}

fn text(t: &str) -> String {
    data(json!({"choices": [{"index": 0, "text": t, "finish_reason": null}], "usage": null}))
}

fn finish(t: &str) -> String {
    data(json!({"choices": [{"index": 0, "text": t, "finish_reason": "length"}], "usage": null}))
}

fn usage(prompt: u64, completion: u64) -> String {
    data(
        json!({"choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
        "total_tokens": prompt + completion}}),
    )
}

const DONE: &str = "data: [DONE]\n\n";

/// The script for a prompt; `None` answers HTTP 500.
fn script(prompt: &str) -> Option<Vec<Step>> {
    use Step::Send;
    let s = |ms: u64, t: String| Send(ms, t);
    Some(match prompt {
        // TTFT 50 ms, gaps 20, 30, 10 ms, 4 tokens by usage.
        "normal" => vec![
            s(0, text("")),
            s(50, text("a")),
            s(20, text("b")),
            s(30, text("c")),
            s(10, finish("d")),
            s(0, usage(11, 4)),
            s(0, DONE.into()),
        ],
        // No usage: output tokens are the 2 text chunks.
        "no_usage" => vec![s(30, text("x")), s(20, finish("y")), s(0, DONE.into())],
        // Two chunks carrying 3 tokens each by usage.
        "multi" => vec![
            s(10, text("abc")),
            s(10, finish("def")),
            s(0, usage(5, 6)),
            s(0, DONE.into()),
        ],
        // The SSE split at awkward places, CRLF endings, comments, no space after colon.
        "split" => vec![
            s(5, ": keep-alive\r\n\r\nda".into()),
            s(5, "ta:{\"choices\":[{\"text\":\"p\"}]}\r".into()),
            s(5, "\n\r\ndata: {\"choices\":[{\"text\":\"q\",\"fin".into()),
            s(5, "ish_reason\":\"stop\"}]}\n\n".into()),
            s(0, usage(3, 2)),
            s(0, "data: [DO".into()),
            s(0, "NE]\n\n".into()),
        ],
        "malformed" => vec![
            s(5, text("a")),
            s(5, "data: {\"choices\": [{\"text\": \n\n".into()),
            s(5, finish("b")),
            s(0, DONE.into()),
        ],
        "error_event" => vec![
            s(5, text("a")),
            s(
                5,
                data(json!({"error": {"message": "shard failed", "type": "internal"}})),
            ),
        ],
        "no_done" => vec![s(5, text("a")), s(5, text("b"))],
        "drop" => vec![s(5, text("a")), s(5, text("b")), Step::Drop],
        "empty" => vec![s(5, text("")), s(0, usage(3, 0)), s(0, DONE.into())],
        _ => return None,
    })
}

type Bodies = Arc<Mutex<Vec<Value>>>;

async fn completions(State(bodies): State<Bodies>, Json(body): Json<Value>) -> Response {
    bodies.lock().expect("lock").push(body.clone());
    let prompt = body["prompt"]
        .as_str()
        .or_else(|| body["messages"][0]["content"].as_str())
        .unwrap_or("")
        .to_string();
    if prompt == "busy" {
        return (StatusCode::TOO_MANY_REQUESTS, "slow down").into_response();
    }
    let Some(steps) = script(&prompt) else {
        return (StatusCode::INTERNAL_SERVER_ERROR, "no script").into_response();
    };
    let stream = async_stream::stream! {
        for step in steps {
            match step {
                Step::Send(ms, bytes) => {
                    if ms > 0 {
                        tokio::time::sleep(Duration::from_millis(ms)).await;
                    }
                    yield Ok::<Bytes, std::io::Error>(Bytes::from(bytes));
                }
                Step::Drop => {
                    // Let the chunks before it reach the client first.
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    yield Err(std::io::Error::other("scripted drop"));
                    return;
                }
            }
        }
    };
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(stream))
        .expect("response")
}

async fn models() -> Json<Value> {
    Json(json!({"object": "list", "data": [{"id": "fake-model", "object": "model"}]}))
}

/// Starts the fake server on 127.0.0.1; returns its base URL and the bodies it receives.
async fn fake_server() -> (String, Bodies) {
    let bodies = Bodies::default();
    let app = axum::Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(completions))
        .route("/v1/models", get(models))
        .with_state(bodies.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}"), bodies)
}

fn spec(prompt: &str) -> RequestSpec {
    RequestSpec {
        prompt: prompt.into(),
        prompt_tokens: Some(7),
        output_len: 4,
    }
}

fn target(url: &str, endpoint: Endpoint) -> Target {
    Target {
        base_url: url.into(),
        endpoint,
        model: "fake-model".into(),
        api_key: Some("k".into()),
        ignore_eos: true,
        temperature: 0.0,
        extra_body: serde_json::Map::new(),
    }
}

fn between(value: f64, lo: f64, hi: f64, what: &str) {
    assert!(
        (lo..=hi).contains(&value),
        "{what} = {value} not in [{lo}, {hi}]"
    );
}

fn kind(r: &RequestRecord) -> Option<ErrorKind> {
    r.error.as_ref().map(|e| e.kind)
}

#[tokio::test]
async fn every_script_is_measured_and_classified() {
    let (url, bodies) = fake_server().await;
    let client = http_client(Duration::from_secs(20), 16).expect("client");
    let prompts = [
        "normal",
        "no_usage",
        "multi",
        "split",
        "malformed",
        "error_event",
        "no_done",
        "drop",
        "empty",
        "http500",
        "busy",
    ];
    let specs: Vec<RequestSpec> = prompts.iter().map(|p| spec(p)).collect();
    let plan = LoadPlan {
        concurrency: Some(4),
        request_rate: None,
        burstiness: 1.0,
        seed: 0,
    };
    let progress = indicatif::ProgressBar::hidden();
    let out = tokio::time::timeout(
        Duration::from_secs(30),
        run(
            &client,
            &target(&url, Endpoint::Completions),
            &specs,
            &plan,
            &progress,
        ),
    )
    .await
    .expect("the run finishes");
    let r = &out.records;
    assert_eq!(r.len(), prompts.len());
    assert!(r.iter().enumerate().all(|(i, rec)| rec.index == i));

    // normal: TTFT ~50 ms, gaps ~20/30/10 ms, usage wins over the 4 text chunks.
    let n = &r[0];
    assert!(n.ok(), "{:?}", n.error);
    between(n.ttft_s.unwrap(), 0.049, 0.150, "normal ttft");
    assert_eq!(n.itl_s.len(), 3);
    for (gap, want) in n.itl_s.iter().zip([0.020, 0.030, 0.010]) {
        between(*gap, want - 0.008, want + 0.080, "normal itl");
    }
    assert_eq!((n.content_chunks, n.empty_chunks), (4, 2));
    assert_eq!((n.output_tokens(), n.prompt_tokens()), (4, 11));
    assert!(n.latency_s >= n.ttft_s.unwrap() + n.itl_s.iter().sum::<f64>() - 1e-9);
    assert_eq!(n.tpot_s().unwrap(), (n.latency_s - n.ttft_s.unwrap()) / 3.0);
    assert_eq!(n.finish_reason.as_deref(), Some("length"));

    // no_usage: counted from chunks; prompt tokens from the benchmark's own count.
    assert!(r[1].ok());
    assert_eq!(
        (r[1].usage, r[1].output_tokens(), r[1].prompt_tokens()),
        (None, 2, 7)
    );
    // multi: usage 6 over 2 chunks.
    assert!(r[2].ok());
    assert_eq!((r[2].content_chunks, r[2].output_tokens()), (2, 6));
    assert_eq!(
        r[2].tpot_s().unwrap(),
        (r[2].latency_s - r[2].ttft_s.unwrap()) / 5.0
    );
    // split: parsed despite the odd framing.
    assert!(r[3].ok(), "{:?}", r[3].error);
    assert_eq!((r[3].content_chunks, r[3].output_tokens()), (2, 2));

    assert_eq!(kind(&r[4]), Some(ErrorKind::MalformedChunk));
    assert_eq!(
        r[4].content_chunks, 2,
        "reading continues after a malformed chunk"
    );
    assert_eq!(kind(&r[5]), Some(ErrorKind::ServerError));
    assert_eq!(r[5].error.as_ref().unwrap().message, "shard failed");
    assert_eq!(kind(&r[6]), Some(ErrorKind::IncompleteStream));
    assert_eq!(kind(&r[7]), Some(ErrorKind::StreamDropped));
    assert_eq!(r[7].content_chunks, 2);
    assert_eq!(kind(&r[8]), Some(ErrorKind::NoContent));
    assert_eq!(r[9].error.as_ref().unwrap().key(), "http_500");
    assert_eq!(r[10].error.as_ref().unwrap().key(), "http_429");
    assert_eq!(r[10].error.as_ref().unwrap().message, "slow down");

    // The summary is exactly the arithmetic over the successful records.
    let m = RunMetrics::compute(r, out.duration_s);
    assert_eq!((m.completed, m.failed), (4, 7));
    let errors: Vec<(&str, usize)> = m.errors.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    assert_eq!(
        errors,
        [
            ("http_429", 1),
            ("http_500", 1),
            ("incomplete_stream", 1),
            ("malformed_chunk", 1),
            ("no_content", 1),
            ("server_error", 1),
            ("stream_dropped", 1)
        ]
    );
    let ok: Vec<&RequestRecord> = r.iter().filter(|x| x.ok()).collect();
    assert_eq!(m.total_output_tokens, 4 + 2 + 6 + 2);
    assert_eq!(m.total_input_tokens, 11 + 7 + 5 + 3);
    assert_eq!(m.usage_missing, 1);
    assert_eq!(m.output_throughput, 14.0 / out.duration_s);
    assert_eq!(m.request_throughput, 4.0 / out.duration_s);
    assert_eq!(m.total_token_throughput, 40.0 / out.duration_s);
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * b.abs().max(1.0);
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64 * 1000.0;
    let ttft: Vec<f64> = ok.iter().map(|x| x.ttft_s.unwrap()).collect();
    let tpot: Vec<f64> = ok.iter().map(|x| x.tpot_s().unwrap()).collect();
    let itl: Vec<f64> = ok.iter().flat_map(|x| x.itl_s.clone()).collect();
    let e2e: Vec<f64> = ok.iter().map(|x| x.latency_s).collect();
    for (name, summary, samples) in [
        ("ttft", m.ttft_ms, &ttft),
        ("tpot", m.tpot_ms, &tpot),
        ("itl", m.itl_ms, &itl),
        ("e2e", m.e2e_ms, &e2e),
    ] {
        let s = summary.unwrap_or_else(|| panic!("{name} summary"));
        assert_eq!(s.count, samples.len(), "{name}");
        assert!(close(s.mean, mean(samples)), "{name} mean");
        let mut sorted: Vec<f64> = samples.iter().map(|x| x * 1000.0).collect();
        sorted.sort_by(f64::total_cmp);
        let pct = |p: f64| {
            let rank = p / 100.0 * (sorted.len() - 1) as f64;
            let (lo, hi) = (rank.floor() as usize, rank.ceil() as usize);
            sorted[lo] + (rank - lo as f64) * (sorted[hi] - sorted[lo])
        };
        assert!(close(s.median, pct(50.0)), "{name} median");
        assert!(close(s.p90, pct(90.0)), "{name} p90");
        assert!(close(s.p99, pct(99.0)), "{name} p99");
        assert_eq!(
            (s.min, s.max),
            (sorted[0], sorted[sorted.len() - 1]),
            "{name}"
        );
    }
    assert_eq!(itl.len(), 3 + 1 + 1 + 1);

    // What the server received.
    let bodies = bodies.lock().expect("lock");
    assert_eq!(bodies.len(), prompts.len());
    let b = &bodies[0];
    assert_eq!(b["stream"], true);
    assert_eq!(b["stream_options"]["include_usage"], true);
    assert_eq!(b["ignore_eos"], true);
    assert_eq!(b["max_tokens"], 4);
    assert_eq!(b["model"], "fake-model");
}

#[tokio::test]
async fn connection_refused_and_timeouts_are_errors() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    let client = http_client(Duration::from_millis(300), 1).expect("client");
    let t = target(&format!("http://127.0.0.1:{port}"), Endpoint::Chat);
    let rec =
        tessera_bench::client::send(&client, &t, &spec("normal"), std::time::Instant::now()).await;
    assert_eq!(kind(&rec), Some(ErrorKind::Connect), "{:?}", rec.error);

    // The fake's "normal" stream takes over 100 ms; a 60 ms limit cuts it.
    let (url, _) = fake_server().await;
    let client = http_client(Duration::from_millis(60), 1).expect("client");
    let rec = tessera_bench::client::send(
        &client,
        &target(&url, Endpoint::Chat),
        &spec("normal"),
        std::time::Instant::now(),
    )
    .await;
    assert_eq!(kind(&rec), Some(ErrorKind::Timeout), "{:?}", rec.error);
}

async fn bench(args: &[&str]) -> std::process::Output {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_tessera-bench"))
            .args(&args)
            .output()
            .expect("run tessera-bench")
    })
    .await
    .expect("join")
}

#[tokio::test]
async fn cli_sweep_json_plot_and_compare() {
    let (url, bodies) = fake_server().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let dataset = dir.path().join("prompts.jsonl");
    std::fs::write(
        &dataset,
        "{\"prompt\": \"normal\"}\n{\"conversations\": [{\"from\": \"human\", \"value\": \"no_usage\"}]}\n{\"prompt\": \"http500\"}\n",
    )
    .expect("dataset");
    let path = |name: &str| dir.path().join(name).to_str().expect("utf-8").to_string();
    let (a, b, svg) = (path("a.json"), path("b.json"), path("p.svg"));
    let ds = path("prompts.jsonl");
    let out = bench(&[
        "--url",
        &url,
        "--dataset",
        &ds,
        "-n",
        "6",
        "--sweep",
        "1,3",
        "--warmup",
        "2",
        "--endpoint",
        "chat",
        "--no-progress",
        "--json",
        &a,
        "--plot",
        &svg,
    ])
    .await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("http_500: 2"), "{stdout}");
    assert!(
        stdout.contains("TPOT") && stdout.contains("c=3"),
        "{stdout}"
    );
    assert!(
        stderr.contains("first http_500 error: no script"),
        "{stderr}"
    );
    // 2 warm-up + 2 levels x 6 requests, model discovered from /v1/models.
    {
        let bodies = bodies.lock().expect("lock");
        assert_eq!(bodies.len(), 14);
        assert!(
            bodies
                .iter()
                .all(|b| b["model"] == "fake-model" && b["messages"].is_array())
        );
    }
    let report = BenchReport::load(a.as_ref()).expect("report");
    assert_eq!(report.runs.len(), 2);
    assert_eq!(report.runs[1].plan.concurrency, Some(3));
    for run in &report.runs {
        assert_eq!(run.requests.len(), 6);
        assert_eq!((run.metrics.completed, run.metrics.failed), (4, 2));
        // Recomputed from the stored records (JSON floats round-trip to within an ulp).
        let again = RunMetrics::compute(&run.requests, run.metrics.duration_s);
        assert_eq!(again.errors, run.metrics.errors);
        assert_eq!(again.total_output_tokens, run.metrics.total_output_tokens);
        let (x, y) = (again.tpot_ms.unwrap(), run.metrics.tpot_ms.unwrap());
        assert!((x.p99 - y.p99).abs() < 1e-9 && (x.mean - y.mean).abs() < 1e-9);
    }
    let svg = std::fs::read_to_string(&svg).expect("svg");
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    assert!(svg.contains("TTFT CDF") && svg.contains("throughput vs median TPOT"));

    let out = bench(&[
        "--url",
        &url,
        "--model",
        "fake-model",
        "--dataset",
        &ds,
        "-n",
        "3",
        "--concurrency",
        "2",
        "--no-progress",
        "--json",
        &b,
    ])
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = bench(&["--compare", &a, &b]).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("B/A") && stdout.contains("TTFT median (ms)"),
        "{stdout}"
    );
    assert!(stdout.contains("A has 2 run(s), B has 1"), "{stdout}");

    // A server that fails everything makes the command fail.
    std::fs::write(&dataset, "{\"prompt\": \"http500\"}\n").expect("dataset");
    let out = bench(&[
        "--url",
        &url,
        "--model",
        "m",
        "--dataset",
        &ds,
        "-n",
        "2",
        "--no-progress",
    ])
    .await;
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no request succeeded"));
}
