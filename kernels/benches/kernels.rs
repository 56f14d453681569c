//! Kernel micro-benchmarks at model shapes, next to the machine's measured limits.
//!
//! Run with `cargo bench -p tessera-kernels --bench kernels`. Plain `std::time` timing: one
//! warm-up, then at least 3 repetitions and a time budget per row; the median is reported.
//! The kernels are the dispatched ones (`TESSERA_CPU_KERNELS` picks a level) on rayon's
//! pool (`RAYON_NUM_THREADS`).
//!
//! - **GEMV** (`m = 1`, decode): `linear_weights` per weight format, as GB/s of the file's
//!   weight bytes (`WeightMatrix::storage_bytes`) and % of the measured memory read bandwidth
//!   with the pool's threads, and as GB/s of the bytes held in memory and read (`held GB/s`,
//!   `WeightMatrix::resident_bytes`: repacked int8 tiles may differ from the file). Each call
//!   reads a different copy of the matrix, cycling through copies that together exceed the
//!   last-level cache (`TESSERA_BENCH_COLD_MIB`, default 256), so the weights come from DRAM
//!   as in a real decode step; the `hot GB/s` column repeats one matrix (cache-resident: the
//!   kernel's compute limit).
//! - **GEMM** (`m = 16, 128, 512`: batched decode, prefill): GFLOP/s (`2·m·n·k`) and % of the
//!   measured f32 FMA peak with the pool's threads (the kernels widen every format to f32).
//!   `-int8` rows are the int8 dot-product kernels (count their work against the int8 peak);
//!   `BF16xBF16` rows take bf16 activations (`vdpbf16ps`; count against the bf16 dot peak).
//! - **Attention** (`paged_attention`, f32 K/V): prefill of 512 rows and decode at contexts
//!   512 and 2048, as GFLOP/s (`4·head_dim` per query head and visible position: `q·k` and
//!   `p·v`; the softmax is not counted); decode also as GB/s of K/V read.
//!
//! The machine limits are measured before and after the kernels (the better of each figure
//! is kept; see `machine.rs`) and printed above the table.
//!
//! Environment: `TESSERA_BENCH_SHAPES` (comma-separated, default `smollm2`; also
//! `tinyllama-1.1b` and `llama-3b`, the real-size bench models' shapes) picks the models whose
//! matrices and attention are timed; `TESSERA_BENCH_FILTER=text` runs only rows whose name contains `text`
//! (`gemv`, `gemm`, `Q4_1`, `attention`…); `TESSERA_BENCH_BUDGET_MS` (default 150) is the
//! time per row; `TESSERA_BENCH_BW_MIB` sizes the bandwidth buffer (see `machine.rs`).

use std::hint::black_box;
use std::time::{Duration, Instant};

use half::{bf16, f16};
use rand::{Rng, SeedableRng};
use tessera_kernels::cpu::{
    ActivationDtype, WeightFormat, WeightMatrix, attention, describe, linear_weights_as,
};
use tessera_kernels::quant::{BlockQ4_1, BlockQ8_0};

#[path = "machine.rs"]
mod machine;

/// A model's shape: the linear layers' sizes and the attention's.
struct ModelShape {
    name: &'static str,
    hidden: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    inter: usize,
    vocab: usize,
}

/// The shapes `TESSERA_BENCH_SHAPES` picks from: SmolLM2-135M's, and the real-size bench
/// models' (`scripts/make_bench_models.sh`), whose matrices do not fit in the caches.
const MODEL_SHAPES: [ModelShape; 3] = [
    ModelShape {
        name: "smollm2",
        hidden: 576,
        heads: 9,
        kv_heads: 3,
        head_dim: 64,
        inter: 1536,
        vocab: 49152,
    },
    ModelShape {
        name: "tinyllama-1.1b",
        hidden: 2048,
        heads: 32,
        kv_heads: 4,
        head_dim: 64,
        inter: 5632,
        vocab: 49152,
    },
    ModelShape {
        name: "llama-3b",
        hidden: 3072,
        heads: 24,
        kv_heads: 8,
        head_dim: 128,
        inter: 8192,
        vocab: 49152,
    },
];

impl ModelShape {
    /// The model's linear layers as (label, k = in, n = out); q/k/v and gate/up are fused as
    /// `shard` loads them.
    fn linears(&self) -> [(String, usize, usize); 5] {
        let qkv = (self.heads + 2 * self.kv_heads) * self.head_dim;
        let attn = self.heads * self.head_dim;
        let layer =
            |label: &str, k: usize, n: usize| (format!("{} {label} {k}→{n}", self.name), k, n);
        [
            layer("qkv", self.hidden, qkv),
            layer("o", attn, self.hidden),
            layer("gate_up", self.hidden, 2 * self.inter),
            layer("down", self.inter, self.hidden),
            layer("lm_head", self.hidden, self.vocab),
        ]
    }
}

const BLOCK: usize = 16;

/// Every storage format of `WeightMatrix` (add new ones here; `random_matrix` fills any
/// format it does not know with small finite values).
const FORMATS: [WeightFormat; 14] = [
    WeightFormat::F32,
    WeightFormat::Bf16,
    WeightFormat::Q8_0,
    WeightFormat::Q4_0,
    WeightFormat::Q4_1,
    WeightFormat::Q5_0,
    WeightFormat::Q4K,
    WeightFormat::Q5K,
    WeightFormat::Q6K,
    WeightFormat::IQ4NL,
    WeightFormat::IQ4XS,
    WeightFormat::Q2K,
    WeightFormat::Q3K,
    WeightFormat::MXFP4,
];

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Warm up, then at least 3 repetitions and at least `budget`; the median seconds.
fn time_kernel(budget: Duration, mut f: impl FnMut()) -> f64 {
    f();
    let start = Instant::now();
    let mut times = Vec::new();
    while times.len() < 3 || start.elapsed() < budget {
        let t = Instant::now();
        f();
        times.push(t.elapsed().as_secs_f64());
    }
    median(times)
}

fn random(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    (0..n).map(|_| rng.random_range(-1.0..1.0)).collect()
}

/// A random `n × k` matrix of `format` with realistic scales.
fn random_matrix(format: WeightFormat, n: usize, k: usize, seed: u64) -> WeightMatrix {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let blocks = n * k / format.block_elements();
    #[allow(unreachable_patterns)]
    let bytes: Vec<u8> = match format {
        WeightFormat::F32 => bytemuck::cast_slice(&random(n * k, seed)).to_vec(),
        WeightFormat::Bf16 => {
            let v: Vec<bf16> = (0..n * k)
                .map(|_| bf16::from_f32(rng.random_range(-1.0..1.0)))
                .collect();
            bytemuck::cast_slice(&v).to_vec()
        }
        WeightFormat::Q8_0 => {
            let v: Vec<BlockQ8_0> = (0..blocks)
                .map(|_| BlockQ8_0 {
                    d: f16::from_f32(rng.random_range(-0.02..0.02)),
                    qs: std::array::from_fn(|_| rng.random()),
                })
                .collect();
            bytemuck::cast_slice(&v).to_vec()
        }
        WeightFormat::Q4_1 => {
            let v: Vec<BlockQ4_1> = (0..blocks)
                .map(|_| BlockQ4_1 {
                    d: f16::from_f32(rng.random_range(0.0..0.01)),
                    m: f16::from_f32(rng.random_range(-0.08..0.0)),
                    qs: std::array::from_fn(|_| rng.random()),
                })
                .collect();
            bytemuck::cast_slice(&v).to_vec()
        }
        // A format this file does not know: bytes in 0x10..0x3b keep every f16/bf16/f32
        // field finite, normal and below 1, whatever the block layout.
        _ => (0..blocks * format.block_bytes())
            .map(|_| rng.random_range(0x10..0x3b))
            .collect(),
    };
    WeightMatrix::from_bytes(format, n, k, &bytes).expect("a whole number of blocks")
}

struct Row {
    name: String,
    ms: f64,
    /// Weight (or K/V) bytes per second, and as a fraction of the bandwidth.
    gbs: Option<f64>,
    /// Weight bytes as held in memory per second.
    held_gbs: Option<f64>,
    hot_gbs: Option<f64>,
    flops: f64,
}

fn print_table(limits: &machine::Limits, rows: &[Row]) {
    let (bw, peak) = (limits.bandwidth.all, limits.f32_peak());
    println!(
        "\nKernels ({}, {} threads; median). %BW: of the {}-thread \
         read bandwidth {:.1} GB/s; %peak: of the {}-thread f32 FMA peak {:.1} GFLOP/s",
        describe(),
        limits.threads,
        limits.threads,
        bw / 1e9,
        limits.threads,
        peak / 1e9,
    );
    println!(
        "{:<40} {:>9} {:>9} {:>6} {:>9} {:>9} {:>9} {:>6}",
        "kernel", "ms", "GB/s", "%BW", "held GB/s", "hot GB/s", "GFLOP/s", "%peak"
    );
    println!("{}", "-".repeat(104));
    let opt = |v: Option<f64>, w: usize, p: usize| {
        v.map_or_else(|| format!("{:>w$}", "-"), |v| format!("{v:>w$.p$}"))
    };
    for r in rows {
        println!(
            "{:<40} {:>9.4} {} {} {} {} {:>9.1} {:>6.1}",
            r.name,
            r.ms,
            opt(r.gbs.map(|g| g / 1e9), 9, 1),
            opt(r.gbs.map(|g| 100.0 * g / bw), 6, 1),
            opt(r.held_gbs.map(|g| g / 1e9), 9, 1),
            opt(r.hot_gbs.map(|g| g / 1e9), 9, 1),
            r.flops / 1e9,
            100.0 * r.flops / peak,
        );
    }
}

/// How a format's products are computed.
#[derive(Clone, Copy, PartialEq)]
enum Variant {
    /// As stored, f32 activations.
    Exact,
    /// Repacked for int8 dot products.
    Int8,
    /// bf16 activations.
    Bf16Activations,
}

fn linear_rows(
    shape: &ModelShape,
    budget: Duration,
    cold_bytes: usize,
    wanted: &dyn Fn(&str) -> bool,
) -> Vec<Row> {
    let mut rows = Vec::new();
    // The block formats twice (Q5_1 shares Q5_0's kernels; Q2_K is not repacked): multiplied
    // exactly in f32, and repacked for int8 dot products (K-quants and IQ4_XS only where rows
    // are whole super-blocks of 256: the down shape); BF16 twice: with f32 activations, and
    // with bf16 ones (`vdpbf16ps`, `--dtype bfloat16`).
    let variants = FORMATS
        .into_iter()
        .map(|f| (f, Variant::Exact))
        .chain(
            FORMATS
                .into_iter()
                .filter(|f| {
                    matches!(
                        f,
                        WeightFormat::Q8_0
                            | WeightFormat::Q4_0
                            | WeightFormat::Q4_1
                            | WeightFormat::Q5_0
                            | WeightFormat::Q4K
                            | WeightFormat::Q5K
                            | WeightFormat::Q6K
                            | WeightFormat::IQ4NL
                            | WeightFormat::IQ4XS
                            | WeightFormat::Q3K
                            | WeightFormat::MXFP4
                    )
                })
                .map(|f| (f, Variant::Int8)),
        )
        .chain([(WeightFormat::Bf16, Variant::Bf16Activations)]);
    for (format, variant) in variants {
        let fname = match variant {
            Variant::Exact => format.name().to_string(),
            Variant::Int8 => format!("{}-int8", format.name()),
            Variant::Bf16Activations => format!("{}xBF16", format.name()),
        };
        let dtype = match variant {
            Variant::Bf16Activations => ActivationDtype::Bfloat16,
            _ => ActivationDtype::Float32,
        };
        let int8 = variant == Variant::Int8;
        for (si, (label, k, n)) in shape.linears().into_iter().enumerate() {
            if !k.is_multiple_of(format.block_elements()) {
                continue;
            }
            let names: Vec<(usize, String)> = [1usize, 16, 128, 512]
                .into_iter()
                // Prefill only needs the last row's logits.
                .filter(|&m| m <= 16 || n != shape.vocab)
                .map(|m| {
                    let kind = if m == 1 { "gemv" } else { "gemm" };
                    (m, format!("{kind} {fname} {label} m={m}"))
                })
                .filter(|(_, name)| wanted(name))
                .collect();
            if names.is_empty() {
                continue;
            }
            let w = random_matrix(format, n, k, 10 + si as u64);
            let w = if int8 { w.into_int8() } else { w };
            let (bytes, held) = (w.storage_bytes(), w.resident_bytes());
            for (m, name) in names {
                let x = random(m * k, 2);
                let mut out = vec![0f32; m * n];
                let flop = 2.0 * (m * n * k) as f64;
                let hot = time_kernel(budget, || {
                    linear_weights_as(black_box(&x), black_box(&w), None, m, &mut out, dtype);
                    black_box(&out);
                });
                if m > 1 {
                    rows.push(Row {
                        name,
                        ms: hot * 1e3,
                        gbs: None,
                        held_gbs: None,
                        hot_gbs: None,
                        flops: flop / hot,
                    });
                    continue;
                }
                // Decode: cycle through copies that do not fit in the caches.
                let copies: Vec<WeightMatrix> = (0..cold_bytes.div_ceil(held).max(2))
                    .map(|_| w.clone())
                    .collect();
                let sweep = time_kernel(budget, || {
                    for c in &copies {
                        linear_weights_as(black_box(&x), black_box(c), None, 1, &mut out, dtype);
                        black_box(&out);
                    }
                });
                let s = sweep / copies.len() as f64;
                rows.push(Row {
                    name,
                    ms: s * 1e3,
                    gbs: Some(bytes as f64 / s),
                    held_gbs: Some(held as f64 / s),
                    hot_gbs: Some(bytes as f64 / hot),
                    flops: flop / s,
                });
            }
        }
    }
    rows
}

fn attention_rows(shape: &ModelShape, budget: Duration, wanted: &dyn Fn(&str) -> bool) -> Vec<Row> {
    let (heads, head_dim) = (shape.heads, shape.head_dim);
    let layout = attention::KvLayout {
        block_size: BLOCK,
        kv_heads: shape.kv_heads,
        head_dim,
    };
    let mut rows = Vec::new();
    // (sequences, context, query rows per sequence)
    for (batch, ctx, rows_per_seq) in [
        (1usize, 512usize, 512usize),
        (1, 512, 1),
        (1, 2048, 1),
        (16, 512, 1),
    ] {
        let name = if rows_per_seq == 1 {
            format!("{} attention decode batch={batch} ctx={ctx}", shape.name)
        } else {
            format!("{} attention prefill rows={rows_per_seq}", shape.name)
        };
        if !wanted(&name) {
            continue;
        }
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
                tree: None,
            })
            .collect();
        let total_rows = batch * rows_per_seq;
        let q = random(total_rows * heads * head_dim, 5);
        let mut out = vec![0f32; total_rows * heads * head_dim];
        let scale = 1.0 / (head_dim as f32).sqrt();
        let s = time_kernel(budget, || {
            let problem = attention::PagedAttention {
                kv: attention::PagedKv {
                    layout,
                    k: &ck,
                    v: &cv,
                },
                q: black_box(&q),
                q_stride: heads * head_dim,
                num_heads: heads,
                seqs: &seqs,
                scale,
                window: None,
                softcap: None,
                sinks: None,
            };
            attention::paged_attention(&problem, &mut out);
            black_box(&out);
        });
        // Visible positions summed over the query rows of one sequence.
        let visible: usize = (ctx - rows_per_seq + 1..=ctx).sum();
        let flop = (batch * visible * heads * 4 * head_dim) as f64;
        let kv_bytes = (batch * ctx * layout.slot_width() * 2 * 4) as f64;
        rows.push(Row {
            name,
            ms: s * 1e3,
            gbs: (rows_per_seq == 1).then_some(kv_bytes / s),
            held_gbs: None,
            hot_gbs: None,
            flops: flop / s,
        });
    }
    rows
}

/// Repacking for int8 products at load: one 4096 × 4096 matrix (a 7B model's attention
/// projection) of each block format that is repacked, from its file bytes. GB/s: of the
/// file's bytes.
fn packing_rows(wanted: &dyn Fn(&str) -> bool) -> Vec<Row> {
    let (n, k) = (4096, 4096);
    let mut rows = Vec::new();
    let repacked = |f: &WeightFormat| f.block_elements() > 1 && *f != WeightFormat::Q2K;
    for format in FORMATS.into_iter().filter(repacked) {
        let name = format!("pack {} {n}x{k} for int8", format.name());
        if !wanted(&name) {
            continue;
        }
        let w = random_matrix(format, n, k, 11);
        // Repacking consumes the matrix: each run takes a fresh copy (not timed).
        let mut best = f64::INFINITY;
        for _ in 0..3 {
            let copy = w.clone();
            let t = Instant::now();
            let packed = copy.into_int8();
            best = best.min(t.elapsed().as_secs_f64());
            assert!(packed.is_int8(), "{name}: not repacked");
        }
        rows.push(Row {
            name: format!("{name} ({:.2} ns/value)", best * 1e9 / (n * k) as f64),
            ms: best * 1e3,
            gbs: Some(w.storage_bytes() as f64 / best),
            held_gbs: None,
            hot_gbs: None,
            flops: 0.0,
        });
    }
    rows
}

fn main() {
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
    let filter = env("TESSERA_BENCH_FILTER");
    let wanted = |name: &str| filter.as_deref().is_none_or(|f| name.contains(f));
    let budget = Duration::from_millis(
        env("TESSERA_BENCH_BUDGET_MS")
            .and_then(|v| v.parse().ok())
            .unwrap_or(150),
    );
    let cold_bytes = env("TESSERA_BENCH_COLD_MIB")
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(256)
        << 20;
    let shapes: Vec<&ModelShape> = env("TESSERA_BENCH_SHAPES")
        .unwrap_or_else(|| "smollm2".into())
        .split(',')
        .map(|name| {
            let name = name.trim();
            MODEL_SHAPES
                .iter()
                .find(|s| s.name == name)
                .unwrap_or_else(|| {
                    let known: Vec<&str> = MODEL_SHAPES.iter().map(|s| s.name).collect();
                    panic!("TESSERA_BENCH_SHAPES: unknown shape {name:?} (known: {known:?})")
                })
        })
        .collect();
    let start = Instant::now();
    println!(
        "tessera kernel bench: {}, {} rayon threads",
        describe(),
        rayon::current_num_threads()
    );
    let before = machine::Limits::measure();
    // On one of rayon's threads, as the engine runs its forward pass: calls from outside the
    // pool would also time handing the work over and waking up.
    let rows = rayon::scope(|_| {
        let mut rows = Vec::new();
        for shape in &shapes {
            rows.extend(linear_rows(shape, budget, cold_bytes, &wanted));
            rows.extend(attention_rows(shape, budget, &wanted));
        }
        rows.extend(packing_rows(&wanted));
        rows
    });
    let limits = before.max(&machine::Limits::measure());
    limits.print();
    print_table(&limits, &rows);
    println!("\n(total {:.1} s)", start.elapsed().as_secs_f64());
}
