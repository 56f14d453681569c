//! Test harness: a tiny continuous-batching driver over the real engine, and the goldens.
#![allow(dead_code, unreachable_pub)]

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;
use tessera_kernels::cpu::WeightFormat;
use tessera_model_files::{FormatError, HostTensor, ModelFiles, NativeTensor, WeightSource};
use tessera_shard::sampling::{Sampler, SamplingParams};
use tessera_shard::{
    Engine, HiddenStates, KvCache, LogitsWanted, Model, NewSequence, SequenceChunk, StepPlan,
};

/// Every tiny fixture the project generates (`scripts/make_test_models.py`,
/// `scripts/make_family_models.py`, `scripts/make_wrapped_models.py`).
pub const FIXTURES: [&str; 17] = [
    "tiny-llama",
    "tiny-qwen2",
    "tiny-mistral",
    "tiny-qwen3",
    "tiny-gemma2",
    "tiny-gemma3",
    "tiny-phi3",
    "tiny-llama-yarn",
    "tiny-llama-dynamic",
    "tiny-qwen3-moe",
    "tiny-mixtral",
    "tiny-qwen2-moe",
    "tiny-gemma3-vision",
    "tiny-mistral3",
    "tiny-smollm3",
    "tiny-gpt-oss",
    "tiny-gpt-oss-mxfp4",
];

/// The SmolLM2 GGUF's file name in `${TESSERA_CACHE:-~/.cache/tessera}`.
pub const SMOLLM2_GGUF: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// The repository: `$TESSERA_REPO_ROOT` when set (test executables built on one machine and
/// run from another checkout, as `scripts/gpu-pack.sh` does), else where this was built.
pub fn repo_root() -> PathBuf {
    if let Some(root) = std::env::var_os("TESSERA_REPO_ROOT") {
        return PathBuf::from(root);
    }
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

#[derive(Deserialize)]
pub struct Golden {
    pub prompts: Vec<GoldenPrompt>,
}

#[derive(Deserialize)]
pub struct GoldenPrompt {
    pub text: String,
    pub prompt_ids: Vec<u32>,
    #[serde(default)]
    pub last_logits: Vec<f32>,
    pub greedy_ids: Vec<u32>,
}

/// SmolLM2-135M-Instruct's GGUF (`scripts/fetch_smollm2.sh`), or `None` (after saying why) when the test should be skipped.
pub fn smollm2_gguf() -> Option<PathBuf> {
    let dir = std::env::var_os("TESSERA_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/tessera")));
    let path = dir.map(|d| d.join(SMOLLM2_GGUF));
    match path {
        Some(p) if p.is_file() => Some(p),
        other => {
            let required = std::env::var("TESSERA_REQUIRE_SMOLLM2").is_ok_and(|v| v == "1");
            let msg = format!(
                "{SMOLLM2_GGUF} not found (looked at {other:?}); fetch it with scripts/fetch_smollm2.sh"
            );
            assert!(!required, "TESSERA_REQUIRE_SMOLLM2=1: {msg}");
            eprintln!("skipping the SmolLM2 test: {msg}");
            None
        }
    }
}

/// The files of fixture `name`.
pub fn fixture_files(name: &str) -> ModelFiles {
    ModelFiles::open(&repo_root().join("fixtures").join(name)).unwrap()
}

/// The transformers goldens of fixture `name`.
pub fn golden(name: &str) -> Golden {
    let path = repo_root().join("fixtures").join(name).join("golden.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

pub fn load_fixture(name: &str) -> (Model, Golden) {
    (Model::load(&fixture_files(name)).unwrap(), golden(name))
}

/// Fixture `name` with its matrices handed to the loader in `format`: `encode(values, cols)`
/// turns a row-major f32 matrix into that format's bytes (`None` leaves it f32).
pub fn converted_fixture(
    name: &str,
    format: WeightFormat,
    encode: fn(&[f32], usize) -> Option<Vec<u8>>,
) -> ModelFiles {
    let mut files = fixture_files(name);
    files.weights = Arc::new(Converted {
        inner: files.weights.clone(),
        format,
        encode,
    });
    files
}

/// A weight source whose matrices come out in another storage format (see
/// [`converted_fixture`]).
pub struct Converted {
    pub inner: Arc<dyn WeightSource>,
    pub format: WeightFormat,
    pub encode: fn(&[f32], usize) -> Option<Vec<u8>>,
}

impl WeightSource for Converted {
    fn contains(&self, name: &str) -> bool {
        self.inner.contains(name)
    }

    fn shape(&self, name: &str) -> Result<Vec<usize>, FormatError> {
        self.inner.shape(name)
    }

    fn load_f32(&self, name: &str) -> Result<HostTensor, FormatError> {
        self.inner.load_f32(name)
    }

    fn load_f32_slice(
        &self,
        name: &str,
        dim: usize,
        range: Range<usize>,
    ) -> Result<HostTensor, FormatError> {
        self.inner.load_f32_slice(name, dim, range)
    }

    fn load_native(&self, name: &str) -> Result<Option<NativeTensor>, FormatError> {
        let t = self.inner.load_f32(name)?;
        let [rows, cols] = t.shape[..] else {
            return Ok(None);
        };
        Ok((self.encode)(&t.data, cols).map(|bytes| NativeTensor {
            format: self.format,
            shape: [rows, cols],
            bytes,
        }))
    }
}

impl Golden {
    /// The prompts' token ids.
    pub fn prompt_ids(&self) -> Vec<Vec<u32>> {
        self.prompts.iter().map(|p| p.prompt_ids.clone()).collect()
    }
}

/// Asserts that every `(schedule, chunk)` gives exactly the outcomes of running each prompt
/// alone, unchunked (`steps` greedy tokens each).
pub fn assert_same_under_schedules(
    name: &str,
    model: &Model,
    prompts: &[Vec<u32>],
    steps: usize,
    schedules: &[(Schedule, usize)],
) {
    let alone = run(model, prompts, steps, usize::MAX, Schedule::OneAtATime);
    for &(schedule, chunk) in schedules {
        let other = run(model, prompts, steps, chunk, schedule);
        for (i, (a, b)) in alone.iter().zip(&other).enumerate() {
            assert_eq!(
                a, b,
                "{name} prompt {i} {schedule:?} chunk {chunk}: results differ"
            );
        }
    }
}

/// Asserts that each golden prompt's last logits are within `tol` of transformers' and that
/// its 20 greedy tokens are transformers' (printing each prompt's largest difference).
pub fn assert_goldens(name: &str, model: &Model, golden: &Golden, tol: f32) {
    let outcomes = run(
        model,
        &golden.prompt_ids(),
        20,
        usize::MAX,
        Schedule::OneAtATime,
    );
    for (p, o) in golden.prompts.iter().zip(&outcomes) {
        let diff = max_abs_diff(&o.prompt_logits, &p.last_logits);
        println!("{name} {:?}: max |logit - golden| = {diff:.2e}", p.text);
        assert!(
            diff <= tol,
            "{name} {:?}: max |logit - golden| = {diff}",
            p.text
        );
        assert_eq!(
            o.tokens, p.greedy_ids,
            "{name} {:?}: greedy tokens differ",
            p.text
        );
    }
}

/// Asserts that every `(schedule, chunk)` gives prompt logits within `tol` of running each
/// prompt alone, unchunked (bit for bit when `tol` is 0), and the same 20 greedy tokens.
pub fn assert_close_under_schedules(
    name: &str,
    model: &Model,
    prompts: &[Vec<u32>],
    schedules: &[(Schedule, usize)],
    tol: f32,
) {
    let alone = run(model, prompts, 20, usize::MAX, Schedule::OneAtATime);
    for &(schedule, chunk) in schedules {
        let other = run(model, prompts, 20, chunk, schedule);
        for (i, (a, b)) in alone.iter().zip(&other).enumerate() {
            let diff = max_abs_diff(&a.prompt_logits, &b.prompt_logits);
            let bits = |o: &Outcome| {
                o.prompt_logits
                    .iter()
                    .map(|x| x.to_bits())
                    .collect::<Vec<_>>()
            };
            assert!(
                if tol == 0.0 {
                    bits(a) == bits(b)
                } else {
                    diff <= tol
                },
                "{name} prompt {i} {schedule:?} chunk {chunk}: logits differ by {diff}"
            );
            assert_eq!(
                a.tokens, b.tokens,
                "{name} prompt {i} {schedule:?} chunk {chunk}"
            );
        }
    }
}

/// How the driver groups work into forward passes.
#[derive(Clone, Copy, Debug)]
pub enum Schedule {
    /// Each sequence runs to completion alone.
    OneAtATime,
    /// All sequences share every pass.
    Together,
    /// Sequences join one step apart, so prefill chunks and decodes mix in one pass.
    Staggered,
}

/// What a sequence produced: the logits after its full prompt, and its greedy tokens.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub prompt_logits: Vec<f32>,
    pub tokens: Vec<u32>,
}

struct Seq {
    tokens: Vec<u32>,
    prompt_len: usize,
    computed: usize,
    blocks: Vec<u32>,
    sampler: Sampler,
    outcome: Outcome,
    start_step: usize,
}

/// Greedy-decodes `steps` tokens for every prompt with prefill split into chunks of at most
/// `chunk` tokens, blocks allocated as sequences grow (deliberately interleaved between
/// sequences so that block tables are not contiguous).
pub fn run(
    model: &Model,
    prompts: &[Vec<u32>],
    steps: usize,
    chunk: usize,
    schedule: Schedule,
) -> Vec<Outcome> {
    let block_size = 4;
    let mut cache: KvCache = model.new_cache(1024, block_size).unwrap();
    let mut next_block = 1u32; // block 0 stays unused, like the router's null block
    let mut seqs: Vec<Seq> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| Seq {
            tokens: p.clone(),
            prompt_len: p.len(),
            computed: 0,
            blocks: Vec::new(),
            sampler: Sampler::new(SamplingParams::default(), p),
            outcome: Outcome {
                prompt_logits: Vec::new(),
                tokens: Vec::new(),
            },
            start_step: match schedule {
                Schedule::Staggered => i,
                _ => 0,
            },
        })
        .collect();
    let done = |s: &Seq| s.outcome.tokens.len() >= steps;
    let mut step = 0;
    loop {
        let active: Vec<usize> = match schedule {
            Schedule::OneAtATime => seqs.iter().position(|s| !done(s)).into_iter().collect(),
            _ => (0..seqs.len())
                .filter(|&i| !done(&seqs[i]) && seqs[i].start_step <= step)
                .collect(),
        };
        if active.is_empty() {
            if seqs.iter().all(done) {
                break;
            }
            step += 1;
            continue;
        }
        // Plan the pass.
        let mut plan = Vec::new();
        for &i in &active {
            let s = &mut seqs[i];
            let (start, len) = if s.computed < s.prompt_len {
                (s.computed, chunk.min(s.prompt_len - s.computed))
            } else {
                (s.computed, 1)
            };
            while s.blocks.len() * block_size < start + len {
                s.blocks.push(next_block);
                next_block += 1;
            }
            plan.push((i, start, len));
        }
        let chunks: Vec<SequenceChunk<'_>> = plan
            .iter()
            .map(|&(i, start, len)| {
                let s = &seqs[i];
                SequenceChunk {
                    tokens: &s.tokens[start..start + len],
                    start_position: start,
                    block_table: &s.blocks,
                    logits: if start + len >= s.prompt_len {
                        LogitsWanted::Last
                    } else {
                        LogitsWanted::None
                    },
                    tree: None,
                    prompt_len: s.prompt_len,
                }
            })
            .collect();
        let out = model
            .forward(&chunks, &mut cache, HiddenStates::None)
            .unwrap();
        for (ci, &(i, start, len)) in plan.iter().enumerate() {
            let s = &mut seqs[i];
            s.computed = start + len;
            if let Some(logits) = out.last(ci) {
                if s.outcome.prompt_logits.is_empty() {
                    s.outcome.prompt_logits = logits.to_vec();
                }
                let t = s.sampler.sample(logits);
                s.tokens.push(t.id);
                s.outcome.tokens.push(t.id);
            }
        }
        step += 1;
    }
    seqs.into_iter().map(|s| s.outcome).collect()
}

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

pub fn sequence(
    id: u64,
    prompt: &[u32],
    params: SamplingParams,
    blocks: std::ops::Range<u32>,
) -> NewSequence {
    NewSequence {
        id,
        input_ids: prompt.to_vec(),
        params,
        prefill_logprobs: false,
        blocks: blocks.collect(),
        cache_len: 0,
        chunk_len: None,
        generated_len: 0,
        pooling: None,
        constraint: None,
    }
}

/// The most sequences a speculation test batches: its prompts over and over.
const FULL_BATCH: usize = 32;

/// A speculation test's full batch: `prompts` over and over, [`FULL_BATCH`] sequences.
pub fn full_batch(prompts: &[Vec<u32>]) -> Vec<Vec<u32>> {
    prompts.iter().cycle().take(FULL_BATCH).cloned().collect()
}

/// How many of a speculation test's [`FULL_BATCH`] sequences (`prompts` distinct ones, over
/// and over) one tree width runs: every prompt once and the first twice, so that equal prompts
/// share a batch, except the `full` head kind at the default width 4, which runs them all. More
/// repeats at every width would only prove the same thing again, and the widest trees are most
/// of the test's time.
pub fn batch_size(full: bool, width: usize, prompts: usize) -> usize {
    if full && width == 4 {
        FULL_BATCH
    } else {
        (prompts + 1).min(FULL_BATCH)
    }
}

/// Generates `steps` tokens for each prompt, all in one batch; returns the tokens and how many
/// proposals were made and accepted.
pub fn generate(
    engine: &mut Engine,
    prompts: &[Vec<u32>],
    params: &[SamplingParams],
    steps: usize,
) -> (Vec<Vec<u32>>, (usize, usize)) {
    let per_seq = 16u32; // 256 positions per sequence
    let seqs = prompts
        .iter()
        .zip(params)
        .enumerate()
        .map(|(i, (p, params))| {
            let first = 1 + i as u32 * per_seq;
            sequence(i as u64, p, params.clone(), first..first + per_seq)
        })
        .collect();
    let mut out = vec![Vec::new(); prompts.len()];
    let (mut proposed, mut accepted) = (0, 0);
    let ids = 0..prompts.len() as u64;
    let new = StepPlan {
        new: seqs,
        ..StepPlan::default()
    };
    for g in engine.step(new).unwrap().outputs {
        out[g.request_id as usize].extend(g.tokens.iter().map(|t| t.id));
    }
    while out.iter().any(|o| o.len() < steps) {
        let step = engine.step(StepPlan::decode(ids.clone())).unwrap();
        for g in step.outputs {
            proposed += g.proposed;
            accepted += g.tokens.len() - 1;
            out[g.request_id as usize].extend(g.tokens.iter().map(|t| t.id));
        }
    }
    for o in &mut out {
        o.truncate(steps);
    }
    let leaving = StepPlan {
        leaving: ids.collect(),
        ..StepPlan::default()
    };
    engine.step(leaving).unwrap();
    (out, (proposed, accepted))
}

/// `model` moved to GPU 0, or `None` (after saying why) when this machine has no GPU;
/// `TESSERA_REQUIRE_GPU=1` (what `scripts/gpu-check.sh` sets) turns the skip into a failure.
/// With a GPU present, any failure to move the model is a failure.
#[cfg(feature = "cuda")]
pub fn on_gpu(model: Model) -> Option<Model> {
    on_gpu_with(model, tessera_shard::CudaOptions::default())
}

/// [`on_gpu`] with `options`.
#[cfg(feature = "cuda")]
pub fn on_gpu_with(model: Model, options: tessera_shard::CudaOptions) -> Option<Model> {
    if let Err(e) = tessera_kernels::cuda::GpuDevice::open(0) {
        let required = std::env::var("TESSERA_REQUIRE_GPU").is_ok_and(|v| v == "1");
        assert!(!required, "TESSERA_REQUIRE_GPU=1 but there is no GPU: {e}");
        println!("SKIPPED (needs an NVIDIA GPU): {e}");
        return None;
    }
    Some(
        model
            .into_cuda(&options)
            .expect("moving the model to GPU 0"),
    )
}

/// Two-sample chi-square statistic of equal-size histograms (rare cells pooled), with the
/// 0.999 quantile of its distribution (Wilson–Hilferty) and the number of cells.
pub fn two_sample_chi2<K: Ord + Copy + std::hash::Hash>(
    a: &std::collections::HashMap<K, f64>,
    b: &std::collections::HashMap<K, f64>,
) -> (f64, f64, usize) {
    let mut keys: Vec<K> = a.keys().chain(b.keys()).copied().collect();
    keys.sort_unstable();
    keys.dedup();
    let (mut chi2, mut cells, mut rare) = (0.0, 0, [0.0f64; 2]);
    for k in keys {
        let (x, y) = (
            a.get(&k).copied().unwrap_or(0.0),
            b.get(&k).copied().unwrap_or(0.0),
        );
        if x + y < 20.0 {
            rare[0] += x;
            rare[1] += y;
            continue;
        }
        chi2 += (x - y).powi(2) / (x + y);
        cells += 1;
    }
    if rare[0] + rare[1] > 0.0 {
        chi2 += (rare[0] - rare[1]).powi(2) / (rare[0] + rare[1]);
        cells += 1;
    }
    let df = (cells.max(2) - 1) as f64;
    let z = 3.09;
    let limit = df * (1.0 - 2.0 / (9.0 * df) + z * (2.0 / (9.0 * df)).sqrt()).powi(3);
    (chi2, limit, cells)
}

/// The second and third tokens of `seeds` sampled continuations (temperature 0.8, one seed
/// each) of `prompt` by `speculating` against the same without speculation, as a two-sample
/// chi-square: panics unless some candidate was accepted and the two laws agree.
pub fn assert_sampling_keeps_the_distribution(
    plain: Engine,
    speculating: Engine,
    prompt: &[u32],
    seeds: u64,
) {
    let mut hist = [
        std::collections::HashMap::<(u32, u32), f64>::new(),
        Default::default(),
    ];
    let mut accepted_total = 0;
    for (mut e, h) in [plain, speculating].into_iter().zip(hist.iter_mut()) {
        for chunk in (0..seeds).collect::<Vec<_>>().chunks(50) {
            let prompts = vec![prompt.to_vec(); chunk.len()];
            let params: Vec<SamplingParams> = chunk
                .iter()
                .map(|&seed| SamplingParams {
                    temperature: 0.8,
                    seed: Some(seed),
                    ..Default::default()
                })
                .collect();
            let (out, (_, accepted)) = generate(&mut e, &prompts, &params, 3);
            accepted_total += accepted;
            for o in out {
                *h.entry((o[1], o[2])).or_default() += 1.0;
            }
        }
    }
    assert!(
        accepted_total > 0,
        "no candidate was accepted: trees were not exercised"
    );
    let (chi2, limit, cells) = two_sample_chi2(&hist[0], &hist[1]);
    assert!(
        chi2 < limit,
        "chi2 {chi2:.1} over {cells} cells exceeds {limit:.1}"
    );
}
