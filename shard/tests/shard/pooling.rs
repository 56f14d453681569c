//! Pooling sequences against sentence-transformers and transformers: embeddings (last-token
//! and mean pooling), a sequence-classification head, and label-token logits, whole and
//! chunked, alone and in a batch, mixed with generating sequences.

use serde::Deserialize;
use tessera_model_files::Pooling;
use tessera_shard::sampling::SamplingParams;
use tessera_shard::{Engine, Model, NewSequence, PoolingTask, RunningUpdate, StepPlan};

use crate::common::{fixture_files, repo_root, sequence};

#[derive(Deserialize)]
struct Embeddings {
    pooling: String,
    normalize: bool,
    inputs: Vec<EmbeddedInput>,
}

#[derive(Deserialize)]
struct EmbeddedInput {
    ids: Vec<u32>,
    embedding: Vec<f32>,
}

#[derive(Deserialize)]
struct Scores {
    #[serde(default)]
    label_ids: Vec<u32>,
    pairs: Vec<ScoredPair>,
}

#[derive(Deserialize)]
struct ScoredPair {
    ids: Vec<u32>,
    logit: f32,
}

fn read<T: serde::de::DeserializeOwned>(fixture: &str, file: &str) -> T {
    let path = repo_root().join("fixtures").join(fixture).join(file);
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Blocks of 16 tokens per sequence.
const BLOCKS_PER_SEQ: u32 = 16;

fn pooled_sequence(id: u64, ids: &[u32], task: &PoolingTask) -> NewSequence {
    let first = 1 + id as u32 * BLOCKS_PER_SEQ;
    NewSequence {
        pooling: Some(task.clone()),
        ..sequence(
            id,
            ids,
            SamplingParams::default(),
            first..first + BLOCKS_PER_SEQ,
        )
    }
}

/// Pools every prompt in one batch, each computed in chunks of at most `chunk` tokens (all of
/// it: `None`), beside a generating sequence; returns the results by prompt.
fn pool(
    model: Model,
    prompts: &[Vec<u32>],
    task: &PoolingTask,
    chunk: Option<usize>,
) -> Vec<Vec<f32>> {
    let n = prompts.len() as u64;
    let mut engine =
        Engine::new(model, 1 + (n as usize + 1) * BLOCKS_PER_SEQ as usize, 16).unwrap();
    let mut new: Vec<NewSequence> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| NewSequence {
            chunk_len: chunk,
            ..pooled_sequence(i as u64, p, task)
        })
        .collect();
    let decoder = n;
    let first = 1 + decoder as u32 * BLOCKS_PER_SEQ;
    new.push(sequence(
        decoder,
        &[5, 6, 7],
        SamplingParams::default(),
        first..first + BLOCKS_PER_SEQ,
    ));
    let mut results: Vec<Option<Vec<f32>>> = vec![None; prompts.len()];
    let mut plan = StepPlan {
        new,
        ..StepPlan::default()
    };
    for _ in 0..64 {
        let out = engine.step(plan).unwrap();
        for o in out.outputs {
            if o.request_id == decoder {
                assert!(o.pooled.is_none());
                continue;
            }
            assert!(o.tokens.is_empty(), "a pooling sequence sampled");
            if let Some(v) = o.pooled {
                results[o.request_id as usize] = Some(v);
            }
        }
        let mut running = vec![RunningUpdate::decode(decoder)];
        let mut leaving = Vec::new();
        for (i, result) in results.iter().enumerate() {
            if result.is_some() {
                leaving.push(i as u64);
            } else if let Some(c) = chunk {
                running.push(RunningUpdate {
                    id: i as u64,
                    new_blocks: Vec::new(),
                    chunk_len: c,
                });
            }
        }
        if results.iter().all(Option::is_some) {
            break;
        }
        plan = StepPlan {
            running,
            leaving,
            ..StepPlan::default()
        };
    }
    results
        .into_iter()
        .map(|r| r.expect("every prompt pooled"))
        .collect()
}

fn normalized(v: &[f32]) -> Vec<f32> {
    let norm = v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    v.iter().map(|x| (f64::from(*x) / norm) as f32).collect()
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| f64::from(*x) * f64::from(*y))
        .sum();
    let n = |v: &[f32]| v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    dot / (n(a) * n(b))
}

fn check_embeddings(fixture: &str, pooling: Pooling) {
    let golden: Embeddings = read(fixture, "golden_embeddings.json");
    let files = fixture_files(fixture);
    let pooler = files
        .pooler()
        .unwrap()
        .expect("the fixture declares its pooling");
    assert_eq!(pooler.pooling, pooling);
    assert_eq!(
        pooler.pooling.name(),
        golden.pooling.replace("lasttoken", "last")
    );
    assert_eq!(pooler.normalize, golden.normalize);
    let prompts: Vec<Vec<u32>> = golden.inputs.iter().map(|i| i.ids.clone()).collect();
    let task = PoolingTask::Embed(pooling);
    let whole = pool(Model::load(&files).unwrap(), &prompts, &task, None);
    let chunked = pool(Model::load(&files).unwrap(), &prompts, &task, Some(7));
    for (i, input) in golden.inputs.iter().enumerate() {
        for (how, got) in [("whole", &whole[i]), ("chunked", &chunked[i])] {
            let got = if golden.normalize {
                normalized(got)
            } else {
                got.clone()
            };
            let diff = crate::common::max_abs_diff(&got, &input.embedding);
            assert!(diff < 1e-4, "{fixture} input {i} ({how}): max diff {diff}");
            assert!(
                cosine(&got, &input.embedding) > 0.99999,
                "{fixture} input {i} ({how})"
            );
        }
    }
    // One prompt alone gives what it gives in the batch.
    let alone = pool(Model::load(&files).unwrap(), &prompts[..1], &task, None);
    assert_eq!(alone[0], whole[0]);
}

#[test]
fn last_token_embeddings_match_sentence_transformers() {
    check_embeddings("tiny-qwen3-embedding", Pooling::LastToken);
}

#[test]
fn mean_embeddings_match_sentence_transformers() {
    check_embeddings("tiny-llama-embedding-mean", Pooling::Mean);
}

fn check_scores(fixture: &str, label_tokens: bool) {
    let golden: Scores = read(fixture, "golden_scores.json");
    let files = fixture_files(fixture);
    assert_eq!(files.config.score_labels.is_some(), !label_tokens);
    let prompts: Vec<Vec<u32>> = golden.pairs.iter().map(|p| p.ids.clone()).collect();
    let task = PoolingTask::Classify {
        label_tokens: golden.label_ids.clone(),
    };
    let got = pool(Model::load(&files).unwrap(), &prompts, &task, Some(9));
    for (i, (pair, logits)) in golden.pairs.iter().zip(&got).enumerate() {
        let logit = match logits.as_slice() {
            [x] => *x,
            [no, yes] => yes - no,
            other => panic!("{fixture} pair {i}: {} logits", other.len()),
        };
        assert!(
            (logit - pair.logit).abs() < 1e-4,
            "{fixture} pair {i}: {logit} against {}",
            pair.logit
        );
    }
}

#[test]
fn classification_head_matches_transformers() {
    check_scores("tiny-qwen3-reranker-seqcls", false);
}

#[test]
fn label_token_logits_match_transformers() {
    check_scores("tiny-qwen3-reranker", true);
}

#[test]
fn pooling_requests_the_model_cannot_serve_are_refused() {
    let files = fixture_files("tiny-qwen3-embedding");
    let mut engine = Engine::new(Model::load(&files).unwrap(), 64, 16).unwrap();
    let head = PoolingTask::Classify {
        label_tokens: Vec::new(),
    };
    let err = engine
        .step(StepPlan {
            new: vec![pooled_sequence(0, &[1, 2, 3], &head)],
            ..StepPlan::default()
        })
        .unwrap_err();
    assert!(err.to_string().contains("no classification head"), "{err}");
    let mean = PoolingTask::Embed(Pooling::Mean);
    let err = engine
        .step(StepPlan {
            new: vec![NewSequence {
                cache_len: 1,
                ..pooled_sequence(0, &[1, 2, 3], &mean)
            }],
            ..StepPlan::default()
        })
        .unwrap_err();
    assert!(err.to_string().contains("whole prompt"), "{err}");
}
