//! Engine and kernel throughput on SmolLM2-135M-Instruct (Q4_1 GGUF; weights stay Q4_1/Q8_0
//! in memory unless `TESSERA_NATIVE_WEIGHTS=0` loads them as f32).
//!
//! Run with `cargo bench -p tessera-shard --bench engine`. Plain `std::time` timing: one
//! warm-up, then repetitions; the median is reported. Environment:
//! - `TESSERA_CACHE`: folder holding `SmolLM2-135M-Instruct.Q4_1.gguf` (default
//!   `~/.cache/tessera`); without the file only the kernel benchmarks run.
//! - `TESSERA_BENCH_REPS`: repetitions of the engine benchmarks (default 3).
//! - `TESSERA_BENCH_ONLY=kernels|engine`: run one half.

use std::hint::black_box;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use tessera_formats::ModelFiles;
use tessera_kernels::cpu::{attention, matmul};
use tessera_shard::{KvCache, LogitsWanted, Model, SequenceChunk};

const GGUF: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
const BLOCK: usize = 16;

// SmolLM2-135M shapes.
const HIDDEN: usize = 576;
const HEADS: usize = 9;
const KV_HEADS: usize = 3;
const HEAD_DIM: usize = 64;
const INTER: usize = 1536;
const VOCAB: usize = 49152;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Runs `f` once to warm up, then `reps` times; returns the median seconds.
fn time_reps(reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    let times = (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .collect();
    median(times)
}

/// Kernel timing: warm up, then at least 5 repetitions and at least `budget` of runtime.
fn time_kernel(budget: Duration, mut f: impl FnMut()) -> f64 {
    f();
    let start = Instant::now();
    let mut times = Vec::new();
    while times.len() < 5 || start.elapsed() < budget {
        let t = Instant::now();
        f();
        times.push(t.elapsed().as_secs_f64());
    }
    median(times)
}

struct Row {
    name: String,
    median_ms: f64,
    rate: String,
}

fn print_table(title: &str, rows: &[Row]) {
    println!("\n{title}");
    println!(
        "{:<44} {:>12} {:>26}",
        "benchmark", "median ms", "throughput"
    );
    println!("{}", "-".repeat(84));
    for r in rows {
        println!("{:<44} {:>12.3} {:>26}", r.name, r.median_ms, r.rate);
    }
}

fn random(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    (0..n).map(|_| rng.random_range(-1.0..1.0)).collect()
}

fn kernel_benches() -> Vec<Row> {
    let budget = Duration::from_millis(400);
    let mut rows = Vec::new();
    for (label, k, n) in [
        ("qkv 576→960", HIDDEN, (HEADS + 2 * KV_HEADS) * HEAD_DIM),
        ("o 576→576", HIDDEN, HIDDEN),
        ("gate_up 576→3072", HIDDEN, 2 * INTER),
        ("down 1536→576", INTER, HIDDEN),
        ("lm_head 576→49152", HIDDEN, VOCAB),
    ] {
        let w = random(n * k, 1);
        for m in [1usize, 8, 128] {
            if m == 128 && n == VOCAB {
                continue; // prefill only needs the last row's logits
            }
            let x = random(m * k, 2);
            let mut out = vec![0f32; m * n];
            let s = time_kernel(budget, || {
                matmul::linear(black_box(&x), black_box(&w), None, m, k, &mut out);
                black_box(&out);
            });
            let flops = 2.0 * (m * n * k) as f64;
            let bytes = (n * k * 4) as f64;
            rows.push(Row {
                name: format!("linear {label} m={m}"),
                median_ms: s * 1e3,
                rate: format!(
                    "{:6.1} GFLOP/s {:5.1} GB/s",
                    flops / s / 1e9,
                    bytes / s / 1e9
                ),
            });
        }
    }
    // Attention, decode-shaped: `batch` sequences of one query row at context `ctx`.
    let layout = attention::KvLayout {
        block_size: BLOCK,
        kv_heads: KV_HEADS,
        head_dim: HEAD_DIM,
    };
    for (batch, ctx, rows_per_seq) in [(1usize, 512usize, 1usize), (8, 512, 1), (1, 512, 512)] {
        let blocks_per_seq = ctx.div_ceil(BLOCK);
        let cache_len = batch * blocks_per_seq * BLOCK * layout.slot_width();
        let ck = random(cache_len, 3);
        let cv = random(cache_len, 4);
        let tables: Vec<Vec<u32>> = (0..batch)
            .map(|b| {
                (0..blocks_per_seq)
                    .map(|i| (b * blocks_per_seq + i) as u32)
                    .collect()
            })
            .collect();
        let seqs: Vec<attention::AttentionSeq<'_>> = tables
            .iter()
            .enumerate()
            .map(|(b, t)| attention::AttentionSeq {
                first_row: b * rows_per_seq,
                rows: rows_per_seq,
                first_position: ctx - rows_per_seq,
                block_table: t,
            })
            .collect();
        let total_rows = batch * rows_per_seq;
        let q = random(total_rows * HEADS * HEAD_DIM, 5);
        let mut out = vec![0f32; total_rows * HEADS * HEAD_DIM];
        let scale = 1.0 / (HEAD_DIM as f32).sqrt();
        let s = time_kernel(budget, || {
            attention::paged_attention(
                layout,
                &ck,
                &cv,
                black_box(&q),
                HEADS * HEAD_DIM,
                HEADS,
                &seqs,
                scale,
                None,
                &mut out,
            );
            black_box(&out);
        });
        let kind = if rows_per_seq == 1 {
            format!("decode batch={batch} ctx={ctx}")
        } else {
            format!("prefill rows={rows_per_seq}")
        };
        // Keys and values each read once per query row and head group.
        let kv_bytes = (batch * ctx * layout.slot_width() * 2 * 4) as f64;
        rows.push(Row {
            name: format!("attention {kind}"),
            median_ms: s * 1e3,
            rate: if rows_per_seq == 1 {
                format!("{:5.1} GB/s of K/V", kv_bytes / s / 1e9)
            } else {
                format!("{:8.0} rows/s", total_rows as f64 / s)
            },
        });
    }
    rows
}

fn tokens(n: usize, seed: usize) -> Vec<u32> {
    (0..n)
        .map(|i| ((i * 7919 + seed * 104_729 + 17) % (VOCAB - 1)) as u32 + 1)
        .collect()
}

fn prefill(model: &Model, cache: &mut KvCache, prompt: &[u32], table: &[u32]) {
    let chunk = SequenceChunk {
        tokens: prompt,
        start_position: 0,
        block_table: table,
        logits: LogitsWanted::Last,
    };
    black_box(model.forward(&[chunk], cache).unwrap());
}

/// `steps` decode passes for `batch` sequences whose prompts of `ctx` tokens are cached.
fn decode(model: &Model, cache: &mut KvCache, ctx: usize, steps: usize, tables: &[Vec<u32>]) {
    let mut last: Vec<u32> = (0..tables.len()).map(|b| 1 + b as u32).collect();
    for s in 0..steps {
        let chunks: Vec<SequenceChunk<'_>> = tables
            .iter()
            .zip(&last)
            .map(|(t, tok)| SequenceChunk {
                tokens: std::slice::from_ref(tok),
                start_position: ctx + s,
                block_table: t,
                logits: LogitsWanted::Last,
            })
            .collect();
        let out = model.forward(&chunks, cache).unwrap();
        for (b, l) in last.iter_mut().enumerate() {
            let row = out.last(b).unwrap();
            *l = row
                .iter()
                .enumerate()
                .fold((0, f32::NEG_INFINITY), |best, (i, &v)| {
                    if v > best.1 { (i, v) } else { best }
                })
                .0 as u32;
        }
    }
}

fn engine_benches(model: &Model, reps: usize) -> Vec<Row> {
    let mut rows = Vec::new();
    let blocks_per_seq = 1024 / BLOCK;
    let mut cache = model.new_cache(8 * blocks_per_seq, BLOCK);
    let tables: Vec<Vec<u32>> = (0..8)
        .map(|b| {
            (0..blocks_per_seq)
                .map(|i| (b * blocks_per_seq + i) as u32)
                .collect()
        })
        .collect();

    for len in [128, 512] {
        let prompt = tokens(len, 0);
        let s = time_reps(reps, || prefill(model, &mut cache, &prompt, &tables[0]));
        rows.push(Row {
            name: format!("prefill {len} tokens, 1 sequence"),
            median_ms: s * 1e3,
            rate: format!("{:8.1} tokens/s", len as f64 / s),
        });
    }

    let (ctx, steps) = (128, 128);
    for (batch, steps) in [(1usize, steps), (8, steps / 2)] {
        for (b, t) in tables.iter().take(batch).enumerate() {
            prefill(model, &mut cache, &tokens(ctx, b), t);
        }
        let s = time_reps(reps, || {
            decode(model, &mut cache, ctx, steps, &tables[..batch]);
        });
        rows.push(Row {
            name: format!("decode {steps} steps, batch {batch}, ctx {ctx}"),
            median_ms: s * 1e3 / steps as f64,
            rate: format!("{:8.1} tokens/s", (batch * steps) as f64 / s),
        });
    }
    rows
}

/// Which weight layout `Model::load` used (see `TESSERA_NATIVE_WEIGHTS`).
fn weights_kind() -> &'static str {
    match std::env::var("TESSERA_NATIVE_WEIGHTS") {
        Ok(v) if v.trim() == "0" => "f32",
        _ => "native Q4_1/Q8_0",
    }
}

/// The process's resident memory from `/proc/self/status` (Linux): total, anonymous (the
/// loaded weights) and file-backed (the memory-mapped GGUF pages read while loading).
fn memory() -> String {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |key: &str| {
        status
            .lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<f64>().ok())
            .map_or_else(|| "?".to_string(), |kb| format!("{:.0} MB", kb / 1024.0))
    };
    format!(
        "RSS {} (anonymous {}, file {})",
        field("VmRSS:"),
        field("RssAnon:"),
        field("RssFile:")
    )
}

fn gguf_path() -> Option<PathBuf> {
    std::env::var_os("TESSERA_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/tessera")))
        .map(|d| d.join(GGUF))
        .filter(|p| p.is_file())
}

fn main() {
    // `cargo bench` passes `--bench`; nothing else is parsed.
    let reps: usize = std::env::var("TESSERA_BENCH_REPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let only = std::env::var("TESSERA_BENCH_ONLY").unwrap_or_default();
    println!(
        "tessera engine bench: {} rayon threads, {}",
        rayon::current_num_threads(),
        tessera_kernels::cpu::describe()
    );

    if only != "kernels" {
        match gguf_path() {
            None => println!(
                "\n{GGUF} not found in $TESSERA_CACHE or ~/.cache/tessera \
                 (scripts/fetch_smollm2.sh fetches it): skipping the engine benchmarks"
            ),
            Some(path) => {
                let t = Instant::now();
                let files = ModelFiles::open(&path).unwrap();
                let model = Model::load(&files).unwrap();
                println!(
                    "loaded {} in {:.2} s; {}",
                    path.display(),
                    t.elapsed().as_secs_f64(),
                    memory()
                );
                let rows = engine_benches(&model, reps);
                print_table(
                    &format!(
                        "SmolLM2-135M engine ({} weights, median of {reps} after 1 warm-up; decode ms are per step)",
                        weights_kind()
                    ),
                    &rows,
                );
            }
        }
    }
    if only != "engine" {
        print_table(
            "Kernels at SmolLM2 shapes (median; GB/s counts f32 weight or K/V bytes once)",
            &kernel_benches(),
        );
    }
}
