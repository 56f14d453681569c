//! End-to-end engine throughput on SmolLM2-135M-Instruct (Q4_1 GGUF) or any GGUF, next to the
//! machine's measured limits, with the figures of the CPU performance acceptance criteria.
//!
//! Run with `cargo bench -p tessera-shard --bench engine` (the per-kernel micro-benchmarks
//! are `cargo bench -p tessera-kernels --bench kernels`). Plain `std::time` timing: one
//! warm-up, then repetitions; the median is reported. Single process, rayon's pool
//! (`RAYON_NUM_THREADS`; the machine limits are measured with as many threads).
//!
//! For each weight layout it loads the model, then times prefill of 128 and 512 tokens (one
//! sequence, logits of the last token only) and decode at batch 1, 8 and 16 after prompts of
//! 128 tokens, and reports:
//! - bytes of weights read per decoded token: every linear weight of every layer (of the
//!   routed experts, the `top_k / experts` share one token picks) plus the LM
//!   head (the tied embedding for SmolLM2) in the layout they were loaded in, plus one
//!   embedding row; the bandwidth bound (measured read bandwidth ÷ those bytes) and decode
//!   batch 1 as % of it (target ≥ 90%);
//! - prefill FLOPs: `2·params` of the layers' linear weights per token, the LM head once (only
//!   the last token's logits), and attention `4·head_dim` per query head and visible
//!   position (causal); GFLOP/s as % of the measured f32 FMA peak (target ≥ 40%), and of the
//!   bf16 dot peak for bf16 weights;
//! - batch 16 over batch 1 decode tokens/s (target ≥ 6x).
//!
//! The weight layouts (`TESSERA_BENCH_WEIGHTS`, comma-separated, default
//! `native,bf16,bf16-act`):
//! - `native`: as `Model::load` keeps the file's matrices (Q4_1 and Q8_0 for this GGUF;
//!   `TESSERA_NATIVE_WEIGHTS=0` makes that f32);
//! - `bf16`: every matrix dequantized and stored as bfloat16, through a `WeightSource` that
//!   hands the loader bf16 `NativeTensor`s (the same values rounded to bf16), with f32
//!   activations (`--dtype float32` on a bf16 model);
//! - `bf16-act`: the same bf16 matrices with bf16 activations (`--dtype bfloat16`:
//!   `vdpbf16ps` products, see `tessera_kernels::cpu::bf16_dot`); what the server runs for a
//!   model declared bf16 under the default `--dtype auto`;
//! - `f32`: every matrix dequantized to f32.
//!
//! The machine limits are measured before and after the runs (the better of each figure is
//! kept; see `kernels/benches/machine.rs`), and everything is printed at the end.
//!
//! Other environment: `TESSERA_BENCH_GGUF` (any GGUF to run instead, e.g. the real-size bench
//! models of `scripts/make_bench_models.sh`; its default layout is `native` only),
//! `TESSERA_CACHE` (folder holding `SmolLM2-135M-Instruct.Q4_1.gguf`, default
//! `~/.cache/tessera`; without the file only the machine limits are printed),
//! `TESSERA_BENCH_REPS` (repetitions, default 3).

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use half::bf16;
use tessera_kernels::cpu::{ActivationDtype, WeightFormat, WeightMatrix};
use tessera_model_files::{FormatError, HostTensor, ModelFiles, NativeTensor, WeightSource};
use tessera_shard::{KvDtype, Model, OpTimes, OpTimesSnapshot};

#[path = "../../kernels/benches/machine.rs"]
mod machine;
mod support;

use support::{argmax, decode, prefill, tokens};

const GGUF: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
const BLOCK: usize = 16;
/// Decode batches; the largest sets the cache size.
const BATCHES: [usize; 3] = [1, 8, 16];
/// Prompt length before decoding, and positions each sequence's block table covers.
const DECODE_CTX: usize = 128;
const SEQ_CAPACITY: usize = 640;

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

/// How the bench stores the model's matrices.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Layout {
    Native,
    Bf16,
    /// bf16 weights with bf16 activations (`--dtype bfloat16`).
    Bf16Act,
    F32,
}

impl Layout {
    fn parse(s: &str) -> Option<Layout> {
        match s.trim() {
            "native" => Some(Layout::Native),
            "bf16" => Some(Layout::Bf16),
            "bf16-act" => Some(Layout::Bf16Act),
            "f32" => Some(Layout::F32),
            _ => None,
        }
    }
}

/// One matrix as the loader received it.
#[derive(Debug, Clone, Copy)]
struct MatrixInfo {
    rows: usize,
    cols: usize,
    format: WeightFormat,
    bytes: usize,
}

/// Wraps the file's weights: records every matrix the loader takes (format and bytes) and,
/// for the `bf16` and `f32` layouts, converts them.
struct Recorder {
    inner: Arc<dyn WeightSource>,
    path: PathBuf,
    layout: Layout,
    matrices: Mutex<BTreeMap<String, MatrixInfo>>,
}

impl Recorder {
    fn record(&self, name: &str, info: MatrixInfo) {
        self.matrices
            .lock()
            .unwrap()
            .entry(name.to_string())
            .or_insert(info);
    }

    /// The matrix `name` as f32, dequantized from its native format when it has one.
    fn dense(&self, name: &str) -> Result<(usize, usize, Vec<f32>), FormatError> {
        if let Some(t) = self.inner.load_native(name)? {
            let [rows, cols] = t.shape;
            let m = WeightMatrix::from_bytes(t.format, rows, cols, &t.bytes)
                .map_err(|e| FormatError::tensor(&self.path, name, e.to_string()))?;
            return Ok((rows, cols, m.to_f32()));
        }
        let t = self.inner.load_f32(name)?;
        match t.shape[..] {
            [rows, cols] => Ok((rows, cols, t.data)),
            _ => Err(FormatError::tensor(&self.path, name, "not a matrix")),
        }
    }
}

impl WeightSource for Recorder {
    fn contains(&self, name: &str) -> bool {
        self.inner.contains(name)
    }

    fn shape(&self, name: &str) -> Result<Vec<usize>, FormatError> {
        self.inner.shape(name)
    }

    fn load_f32(&self, name: &str) -> Result<HostTensor, FormatError> {
        let t = self.inner.load_f32(name)?;
        if let [rows, cols] = t.shape[..] {
            self.record(
                name,
                MatrixInfo {
                    rows,
                    cols,
                    format: WeightFormat::F32,
                    bytes: rows * cols * 4,
                },
            );
        }
        Ok(t)
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
        let t = match self.layout {
            Layout::F32 => return Ok(None),
            Layout::Native => self.inner.load_native(name)?,
            Layout::Bf16 | Layout::Bf16Act => {
                let (rows, cols, data) = self.dense(name)?;
                let bytes = data
                    .iter()
                    .flat_map(|&x| bf16::from_f32(x).to_bits().to_le_bytes())
                    .collect();
                Some(NativeTensor {
                    format: WeightFormat::Bf16,
                    shape: [rows, cols],
                    bytes,
                })
            }
        };
        if let Some(t) = &t {
            let [rows, cols] = t.shape;
            self.record(
                name,
                MatrixInfo {
                    rows,
                    cols,
                    format: t.format,
                    bytes: t.bytes.len(),
                },
            );
        }
        Ok(t)
    }
}

/// What one decoded token reads and one prefill computes, from the loaded matrices.
struct Accounting {
    /// Bytes of the layers' linear weights one token reads (of the routed experts, the share
    /// a token picks: `top_k / experts`), and their parameters.
    layer_bytes: usize,
    layer_params: usize,
    /// Bytes and parameters of the LM head (the embedding when tied).
    head_bytes: usize,
    head_params: usize,
    head_name: &'static str,
    /// One embedding row.
    embed_row_bytes: usize,
    /// `format: count, MB` of every matrix.
    formats: String,
}

impl Accounting {
    /// `active` is the share of the routed experts one token reads (1 without experts).
    fn new(matrices: &BTreeMap<String, MatrixInfo>, active: f64) -> Accounting {
        let layers = matrices
            .iter()
            .filter(|(n, _)| n.starts_with("model.layers."));
        let (layer_bytes, layer_params) = layers.fold((0.0, 0.0), |(b, p), (n, m)| {
            let share = if n.contains(".experts.") { active } else { 1.0 };
            (
                b + share * m.bytes as f64,
                p + share * (m.rows * m.cols) as f64,
            )
        });
        let (layer_bytes, layer_params) = (layer_bytes as usize, layer_params as usize);
        let embed = matrices.get("model.embed_tokens.weight");
        let (head_name, head) = match matrices.get("lm_head.weight") {
            Some(h) => ("lm_head", h),
            None => ("lm_head = tied embedding", embed.expect("an embedding")),
        };
        let mut by_format: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
        for m in matrices.values() {
            let e = by_format.entry(m.format.name()).or_default();
            e.0 += 1;
            e.1 += m.bytes;
        }
        Accounting {
            layer_bytes,
            layer_params,
            head_bytes: head.bytes,
            head_params: head.rows * head.cols,
            head_name,
            embed_row_bytes: embed.map_or(0, |e| e.bytes / e.rows.max(1)),
            formats: by_format
                .iter()
                .map(|(f, (n, b))| format!("{n} {f} ({:.1} MB)", *b as f64 / 1e6))
                .collect::<Vec<_>>()
                .join(", "),
        }
    }

    fn bytes_per_token(&self) -> usize {
        self.layer_bytes + self.head_bytes + self.embed_row_bytes
    }

    /// FLOPs of a prefill of `len` tokens that wants the last token's logits.
    fn prefill_flops(&self, model: &Model, len: usize) -> f64 {
        let c = model.config();
        let visible: usize = (1..=len).sum();
        let attention = c.num_layers * c.num_heads * 4 * c.head_dim * visible;
        2.0 * (len * self.layer_params + self.head_params) as f64 + attention as f64
    }
}

struct Measured {
    /// (prompt length, seconds)
    prefill: Vec<(usize, f64)>,
    /// (batch, steps, seconds)
    decode: Vec<(usize, usize, f64)>,
    /// The last logits of the 128-token prompt (to compare layouts).
    logits: Vec<f32>,
    /// (batch, operation times of profiled decode steps after the timed ones)
    breakdown: Vec<(usize, OpTimesSnapshot)>,
}

fn run_engine(model: &mut Model, reps: usize) -> Measured {
    let vocab = model.config().vocab_size;
    let max_batch = *BATCHES.iter().max().unwrap();
    let blocks_per_seq = SEQ_CAPACITY / BLOCK;
    let mut cache = model
        .new_cache(max_batch * blocks_per_seq, BLOCK)
        .expect("a host cache");
    let tables: Vec<Vec<u32>> = (0..max_batch)
        .map(|b| {
            (0..blocks_per_seq)
                .map(|i| (b * blocks_per_seq + i) as u32)
                .collect()
        })
        .collect();
    let logits = prefill(model, &mut cache, &[tokens(128, 0, vocab)], &tables[..1])
        .last(0)
        .expect("logits")
        .to_vec();
    let prefill_times = [128, 512]
        .into_iter()
        .map(|len| {
            let prompt = [tokens(len, 0, vocab)];
            (
                len,
                time_reps(reps, || {
                    prefill(model, &mut cache, &prompt, &tables[..1]);
                }),
            )
        })
        .collect();
    for (b, t) in tables.iter().enumerate() {
        prefill(
            model,
            &mut cache,
            &[tokens(DECODE_CTX, b, vocab)],
            std::slice::from_ref(t),
        );
    }
    let decode_times = BATCHES
        .into_iter()
        .map(|batch| {
            let steps = if batch == 1 { 64 } else { 32 };
            let s = time_reps(reps, || {
                decode(model, &mut cache, DECODE_CTX, steps, &tables[..batch]);
            });
            (batch, steps, s)
        })
        .collect();
    // Where the steps go, in runs of their own (the clock reads would tint the timed ones).
    let times = Arc::new(OpTimes::new());
    model.set_op_times(Some(times.clone()));
    let breakdown = [1, max_batch]
        .into_iter()
        .map(|batch| {
            times.reset();
            decode(model, &mut cache, DECODE_CTX, 32, &tables[..batch]);
            (batch, times.snapshot())
        })
        .collect();
    model.set_op_times(None);
    Measured {
        prefill: prefill_times,
        decode: decode_times,
        logits,
        breakdown,
    }
}

/// Milliseconds per decode step by operation, one column per batch.
fn print_breakdown(breakdown: &[(usize, OpTimesSnapshot)]) {
    let Some((_, first)) = breakdown.first() else {
        return;
    };
    let per_step =
        |s: &OpTimesSnapshot, d: Duration| d.as_secs_f64() * 1e3 / s.passes.max(1) as f64;
    print!(
        "\n{:<48}",
        format!("decode step by operation, ctx {DECODE_CTX} (ms/step)")
    );
    for (batch, _) in breakdown {
        print!(" {:>12}", format!("batch {batch}"));
    }
    println!();
    println!("{}", "-".repeat(48 + 13 * breakdown.len()));
    // One row per operation, then the rest of the pass and the whole of it.
    let column = |at: &dyn Fn(&OpTimesSnapshot) -> Duration| -> Vec<f64> {
        breakdown.iter().map(|(_, s)| per_step(s, at(s))).collect()
    };
    let mut rows: Vec<(&str, Vec<f64>)> = (0..first.ops.len())
        .map(|i| (first.ops[i].0.name(), column(&|s| s.ops[i].1)))
        .collect();
    rows.push((
        "other (buffers, pass setup)",
        column(&OpTimesSnapshot::other),
    ));
    rows.push(("whole step", column(&|s| s.total)));
    for (name, values) in rows {
        print!("{name:<48}");
        for v in values {
            print!(" {v:>12.3}");
        }
        println!();
    }
}

fn verdict(value: f64, target: f64) -> &'static str {
    if value >= target { "PASS" } else { "FAIL" }
}

fn report(
    title: &str,
    model: &Model,
    acc: &Accounting,
    limits: &machine::Limits,
    m: &Measured,
    reps: usize,
) {
    println!("\n{title}: median of {reps} after 1 warm-up");
    println!("{:<48} {:>12} {:>14}", "benchmark", "ms", "tokens/s");
    println!("{}", "-".repeat(76));
    for &(len, s) in &m.prefill {
        println!(
            "{:<48} {:>12.1} {:>14.1}",
            format!("prefill {len} tokens, 1 sequence"),
            s * 1e3,
            len as f64 / s
        );
    }
    for &(batch, steps, s) in &m.decode {
        println!(
            "{:<48} {:>12.2} {:>14.1}",
            format!("decode batch {batch}, ctx {DECODE_CTX}, {steps} steps (ms/step)"),
            s * 1e3 / steps as f64,
            (batch * steps) as f64 / s
        );
    }

    print_breakdown(&m.breakdown);

    let tok_s = |batch: usize| {
        m.decode
            .iter()
            .find(|d| d.0 == batch)
            .map(|&(b, steps, s)| (b * steps) as f64 / s)
    };
    let mb = |b: usize| b as f64 / 1e6;
    let bpt = acc.bytes_per_token();
    let bound = limits.bandwidth.all / bpt as f64;
    let n = limits.threads;
    println!("\nAcceptance figures ({n} threads):");
    println!("  matrices loaded: {}", acc.formats);
    println!(
        "  weights read per decoded token: {:.2} MB = layers {:.2} MB + {} {:.2} MB + \
         1 embedding row {} B",
        mb(bpt),
        mb(acc.layer_bytes),
        acc.head_name,
        mb(acc.head_bytes),
        acc.embed_row_bytes
    );
    println!(
        "  bandwidth bound: {:.1} GB/s ÷ {:.2} MB = {:.1} tokens/s",
        limits.bandwidth.all / 1e9,
        mb(bpt),
        bound
    );
    let c = model.config();
    let kv_dtype = model.kv_dtype();
    let kv = c.num_layers * DECODE_CTX * c.num_kv_heads * c.head_dim * 2 * kv_dtype.size();
    println!(
        "  (not counted: {:.2} MB of {} K/V read per token at context {DECODE_CTX})",
        mb(kv),
        kv_dtype.name()
    );
    if let Some(t1) = tok_s(1) {
        let pct = 100.0 * t1 / bound;
        println!(
            "  decode batch 1: {t1:.1} tokens/s = {pct:.1}% of the bound (≥ 90%: {}); \
             effective {:.1} GB/s of weights",
            verdict(pct, 90.0),
            t1 * bpt as f64 / 1e9
        );
    }
    if let Some(&(len, s)) = m.prefill.iter().find(|p| p.0 == 512) {
        let flops = acc.prefill_flops(model, len);
        let rate = flops / s;
        let pct = 100.0 * rate / limits.f32_peak();
        println!(
            "  prefill {len}: {:.2} GFLOP ({:.3} GFLOP/token: linear 2·{:.1}M params, \
             LM head once, causal attention) in {:.1} ms = {:.1} GFLOP/s",
            flops / 1e9,
            flops / 1e9 / len as f64,
            acc.layer_params as f64 / 1e6,
            s * 1e3,
            rate / 1e9
        );
        println!(
            "    = {pct:.1}% of the f32 FMA peak {:.1} GFLOP/s (≥ 40%: {})",
            limits.f32_peak() / 1e9,
            verdict(pct, 40.0)
        );
        if acc.formats.contains("BF16")
            && let Some(bf) = limits.bf16_peak()
        {
            let pct = 100.0 * rate / bf;
            println!(
                "    = {pct:.1}% of the bf16 dot peak {:.1} GFLOP/s (≥ 40%: {})",
                bf / 1e9,
                verdict(pct, 40.0)
            );
        }
    }
    if let (Some(t1), Some(t16)) = (tok_s(1), tok_s(16)) {
        let ratio = t16 / t1;
        println!(
            "  decode batch 16 / batch 1: {t16:.1} / {t1:.1} tokens/s = {ratio:.2}x (≥ 6x: {})",
            verdict(ratio, 6.0)
        );
    }
}

/// The process's resident memory from `/proc/self/status` (Linux).
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
    format!("RSS {} (anonymous {})", field("VmRSS:"), field("RssAnon:"))
}

/// The model to run: `TESSERA_BENCH_GGUF`, else SmolLM2 from the cache.
fn gguf_path() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("TESSERA_BENCH_GGUF") {
        return Some(PathBuf::from(path));
    }
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
    // Another model: its own layout only, unless asked (the others multiply its size).
    let default_layouts = if std::env::var_os("TESSERA_BENCH_GGUF").is_some() {
        "native"
    } else {
        "native,bf16,bf16-act"
    };
    let layouts: Vec<Layout> = std::env::var("TESSERA_BENCH_WEIGHTS")
        .unwrap_or_else(|_| default_layouts.into())
        .split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| {
            Layout::parse(s)
                .unwrap_or_else(|| panic!("TESSERA_BENCH_WEIGHTS: unknown layout {s:?}"))
        })
        .collect();
    let start = Instant::now();
    println!(
        "tessera engine bench: {} rayon threads, {}",
        rayon::current_num_threads(),
        tessera_kernels::cpu::describe()
    );
    let before = machine::Limits::measure();
    let Some(path) = gguf_path() else {
        before.print();
        println!(
            "\n{GGUF} not found in $TESSERA_CACHE or ~/.cache/tessera \
             (scripts/fetch_smollm2.sh fetches it): skipping the engine benchmarks"
        );
        return;
    };
    let mut results = Vec::new();
    for layout in layouts {
        let t = Instant::now();
        let mut files = ModelFiles::open(&path)
            .unwrap_or_else(|e| panic!("cannot open {}: {e}", path.display()));
        let recorder = Arc::new(Recorder {
            inner: files.weights.clone(),
            path: path.clone(),
            layout,
            matrices: Mutex::new(BTreeMap::new()),
        });
        files.weights = recorder.clone();
        // The KV cache the server picks for this model (`--dtype auto`).
        let activations = match layout {
            Layout::Bf16Act => ActivationDtype::Bfloat16,
            _ => ActivationDtype::Float32,
        };
        let mut model = Model::load(&files)
            .unwrap()
            .with_kv_dtype(KvDtype::auto(&files))
            .with_activation_dtype(activations);
        let active = model
            .config()
            .family
            .moe
            .as_ref()
            .map_or(1.0, |m| m.top_k as f64 / m.experts as f64);
        let acc = Accounting::new(&recorder.matrices.lock().unwrap(), active);
        println!(
            "\nloaded {} as {layout:?} in {:.2} s; {}",
            path.display(),
            t.elapsed().as_secs_f64(),
            memory()
        );
        let measured = run_engine(&mut model, reps);
        results.push((layout, model, acc, measured));
    }
    // Limits before and after, the better of each: a busy moment does not lower them.
    let limits = before.max(&machine::Limits::measure());
    limits.print();
    let reference = results.first().map(|r| (r.0, r.3.logits.clone()));
    let name = path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    for (layout, model, acc, measured) in &results {
        if let Some((first, logits)) = &reference
            && first != layout
        {
            let diff = logits
                .iter()
                .zip(&measured.logits)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            println!(
                "\n{layout:?} vs {first:?} weights, last logits of a 128-token prompt: max |Δ| \
                 {diff:.3}, top-1 {} vs {}",
                argmax(&measured.logits),
                argmax(logits)
            );
        }
        report(
            &format!("{name} engine, {layout:?} weights ({})", acc.formats),
            model,
            acc,
            &limits,
            measured,
            reps,
        );
    }
    println!("\n(total {:.1} s)", start.elapsed().as_secs_f64());
}
