//! Embedding and scoring servers against sentence-transformers and transformers: the fixtures'
//! vectors through `/v1/embeddings` (texts and token ids, in one batch and alone, float and
//! base64, cut to fewer dimensions), their scores through `/v1/rerank` and `/v1/score`, and the
//! refusals of a server asked for another task.

use std::time::Duration;

use base64::Engine;
use serde_json::{Value, json};
use tessera_e2e::{Checks, Server, fixture_json, u64s};

const TEST_LIMIT: Duration = Duration::from_secs(120);

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap_or_else(|| panic!("not a list of numbers: {v}"))
        .iter()
        .map(|x| x.as_f64().expect("a number") as f32)
        .collect()
}

fn normalized(v: &[f32]) -> Vec<f32> {
    let norm = v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    v.iter().map(|x| (f64::from(*x) / norm) as f32).collect()
}

/// The largest difference between `got` and `want`, and their cosine similarity.
fn compare(got: &[f32], want: &[f32]) -> (f32, f64) {
    assert_eq!(got.len(), want.len(), "dimensions");
    let diff = got
        .iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max);
    let dot: f64 = got
        .iter()
        .zip(want)
        .map(|(a, b)| f64::from(*a) * f64::from(*b))
        .sum();
    let n = |v: &[f32]| v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    (diff, dot / (n(got) * n(want)))
}

fn assert_close(got: &[f32], want: &[f32], what: &str) {
    let (diff, cos) = compare(got, want);
    assert!(
        diff < 1e-4 && cos >= 0.99999,
        "{what}: max diff {diff}, cosine {cos}"
    );
}

/// The vectors of an embeddings answer, in input order.
fn vectors(body: &Value) -> Vec<Vec<f32>> {
    let data = body["data"]
        .as_array()
        .unwrap_or_else(|| panic!("no data in {body}"));
    for (i, d) in data.iter().enumerate() {
        assert_eq!(d["index"], i, "{body}");
        assert_eq!(d["object"], "embedding");
    }
    data.iter().map(|d| floats(&d["embedding"])).collect()
}

/// Every golden input's vector: all texts in one request, up to 32 as token ids in another,
/// two alone; base64 and `dimensions` on one of them.
async fn embeddings(server: &Server, model: &str) {
    let golden = fixture_json(model, "golden_embeddings.json");
    let inputs = golden["inputs"].as_array().expect("inputs");
    let texts: Vec<&str> = inputs
        .iter()
        .map(|i| i["text"].as_str().expect("text"))
        .collect();
    let want: Vec<Vec<f32>> = inputs.iter().map(|i| floats(&i["embedding"])).collect();
    let ids: Vec<Vec<u64>> = inputs.iter().map(|i| u64s(&i["ids"])).collect();

    let (status, body) = server
        .post("/v1/embeddings", &json!({"model": "any", "input": texts}))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["object"], "list");
    let tokens: usize = ids.iter().map(Vec::len).sum();
    assert_eq!(body["usage"]["prompt_tokens"], tokens, "{}", body["usage"]);
    assert_eq!(body["usage"]["total_tokens"], tokens);
    let batch = vectors(&body);
    assert_eq!(batch.len(), want.len());
    for (i, (got, want)) in batch.iter().zip(&want).enumerate() {
        assert_close(
            got,
            want,
            &format!("{model} input {i} in a batch of {}", texts.len()),
        );
    }

    let (status, body) = server
        .post(
            "/v1/embeddings",
            &json!({"input": ids[..ids.len().min(32)]}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    for (i, got) in vectors(&body).iter().enumerate() {
        assert_close(got, &want[i], &format!("{model} input {i} as token ids"));
    }

    for i in [0, texts.len() - 1] {
        let (status, body) = server
            .post("/v1/embeddings", &json!({"input": texts[i]}))
            .await;
        assert_eq!(status, 200, "{body}");
        let alone = vectors(&body);
        assert_eq!(alone.len(), 1);
        assert_close(&alone[0], &want[i], &format!("{model} input {i} alone"));
        assert_eq!(
            alone[0], batch[i],
            "{model} input {i}: alone and in a batch differ"
        );
    }

    let (status, body) = server
        .post(
            "/v1/embeddings",
            &json!({"input": [texts[1]], "encoding_format": "base64"}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let encoded = body["data"][0]["embedding"]
        .as_str()
        .expect("a base64 string");
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .expect("valid base64");
    let decoded: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    assert_eq!(decoded, batch[1], "base64 and float vectors differ");

    let (status, body) = server
        .post(
            "/v1/embeddings",
            &json!({"input": texts[2], "dimensions": 16}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let cut = &vectors(&body)[0];
    let expected = if golden["normalize"] == true {
        normalized(&want[2][..16])
    } else {
        want[2][..16].to_vec()
    };
    assert_close(
        cut,
        &expected,
        &format!("{model} input 2 cut to 16 dimensions"),
    );
}

/// Requests an embedding server refuses, each with a 400 that says what to fix.
async fn embedding_refusals(server: &Server) {
    for (body, says) in [
        (json!({"input": "x", "dimensions": 0}), "dimensions"),
        (json!({"input": "x", "dimensions": 65}), "dimensions"),
        (json!({"input": []}), "input"),
        (
            json!({"input": "x", "encoding_format": "int8"}),
            "encoding_format",
        ),
        (json!({"input": [[1, 2, 100000]]}), "vocabulary"),
    ] {
        let (status, answer) = server.post("/v1/embeddings", &body).await;
        assert_eq!(status, 400, "{body}: {answer}");
        let message = answer["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(says), "{body}: {answer}");
    }
    let (status, answer) = server
        .post("/v1/rerank", &json!({"query": "q", "documents": ["d"]}))
        .await;
    assert_eq!(status, 400, "{answer}");
    let message = answer["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("--task score"), "{answer}");
    let chat = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
    let (status, answer) = server.post("/v1/chat/completions", &chat).await;
    assert_eq!(status, 400, "{answer}");
    let message = answer["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("--task generate"), "{answer}");
}

#[tokio::test(flavor = "multi_thread")]
async fn embeddings_match_sentence_transformers() {
    let mut checks = Checks::new();
    let server = Server::start("tiny-qwen3-embedding", &[]).await;
    let before = server.metric("tessera_request_success_total").await;
    checks
        .run(
            "last-token pooling, normalised",
            TEST_LIMIT,
            embeddings(&server, "tiny-qwen3-embedding"),
        )
        .await;
    let after = server.metric("tessera_request_success_total").await;
    let inputs = fixture_json("tiny-qwen3-embedding", "golden_embeddings.json")["inputs"]
        .as_array()
        .map_or(0, Vec::len);
    assert!(
        after - before >= (inputs + 32 + 4) as f64,
        "{before} → {after}"
    );
    checks
        .run("refusals", TEST_LIMIT, embedding_refusals(&server))
        .await;
    drop(server);
    // Mean pooling without normalisation, over two shards.
    let server = Server::start("tiny-llama-embedding-mean", &["--num-shard", "2"]).await;
    checks
        .run(
            "mean pooling, two shards",
            TEST_LIMIT,
            embeddings(&server, "tiny-llama-embedding-mean"),
        )
        .await;
    checks.finish();
}

/// `/v1/rerank` orders the golden documents of each query as transformers' scores do, with
/// those scores; `/v1/score` gives them pair by pair.
async fn scores(server: &Server, model: &str) {
    let golden = fixture_json(model, "golden_scores.json");
    let pairs = golden["pairs"].as_array().expect("pairs");
    let mut queries: Vec<&str> = pairs
        .iter()
        .map(|p| p["query"].as_str().expect("query"))
        .collect();
    queries.dedup();
    for query in queries {
        let docs: Vec<(&str, f32)> = pairs
            .iter()
            .filter(|p| p["query"] == query)
            .map(|p| {
                (
                    p["document"].as_str().expect("document"),
                    p["score"].as_f64().expect("score") as f32,
                )
            })
            .collect();
        let documents: Vec<&str> = docs.iter().map(|d| d.0).collect();
        let (status, body) = server
            .post(
                "/v1/rerank",
                &json!({"model": "m", "query": query, "documents": documents}),
            )
            .await;
        assert_eq!(status, 200, "{body}");
        let results = body["results"].as_array().expect("results");
        assert_eq!(results.len(), docs.len());
        let mut order: Vec<usize> = (0..docs.len()).collect();
        order.sort_by(|&a, &b| docs[b].1.total_cmp(&docs[a].1));
        let got: Vec<usize> = results
            .iter()
            .map(|r| r["index"].as_u64().expect("index") as usize)
            .collect();
        assert_eq!(got, order, "{model}: rerank order for {query:?}");
        for r in results {
            let i = r["index"].as_u64().expect("index") as usize;
            let score = r["relevance_score"].as_f64().expect("score") as f32;
            assert!(
                (score - docs[i].1).abs() < 1e-4,
                "{model}: {score} against {}",
                docs[i].1
            );
            assert_eq!(r["document"]["text"], docs[i].0);
        }
        let (status, body) = server
            .post(
                "/v1/rerank",
                &json!({"query": query, "documents": documents, "top_n": 2, "return_documents": false}),
            )
            .await;
        assert_eq!(status, 200, "{body}");
        let top = body["results"].as_array().expect("results");
        assert_eq!(top.len(), 2.min(docs.len()));
        assert_eq!(top[0]["index"], order[0]);
        assert!(top[0].get("document").is_none(), "{body}");

        let (status, body) = server
            .post("/v1/score", &json!({"text_1": query, "text_2": documents}))
            .await;
        assert_eq!(status, 200, "{body}");
        for (i, d) in body["data"].as_array().expect("data").iter().enumerate() {
            assert_eq!(d["index"], i);
            let score = d["score"].as_f64().expect("score") as f32;
            assert!(
                (score - docs[i].1).abs() < 1e-4,
                "{model}: /v1/score {score} against {}",
                docs[i].1
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn rerankers_order_as_transformers_scores() {
    let mut checks = Checks::new();
    let server = Server::start("tiny-qwen3-reranker-seqcls", &[]).await;
    checks
        .run(
            "classification head",
            TEST_LIMIT,
            scores(&server, "tiny-qwen3-reranker-seqcls"),
        )
        .await;
    let (status, answer) = server.post("/v1/embeddings", &json!({"input": "x"})).await;
    assert_eq!(status, 400, "{answer}");
    drop(server);
    let golden = fixture_json("tiny-qwen3-reranker", "golden_scores.json");
    let labels: Vec<&str> = golden["labels"]
        .as_array()
        .expect("labels")
        .iter()
        .map(|l| l.as_str().expect("a label"))
        .collect();
    let labels = labels.join(",");
    let server = Server::start(
        "tiny-qwen3-reranker",
        &["--task", "score", "--score-labels", &labels],
    )
    .await;
    checks
        .run(
            "label tokens of a causal LM",
            TEST_LIMIT,
            scores(&server, "tiny-qwen3-reranker"),
        )
        .await;
    checks.finish();
}
