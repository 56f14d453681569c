//! Throughput of the CUDA attention kernels on the GPU (feature `cuda`), against the GPU's
//! bf16 tensor-core peak: `cargo bench -p tessera-kernels --features cuda --bench cuda_attention`.
//!
//! Shapes are Llama-3-8B's attention (32 query heads, 8 KV heads, head_dim 128) in bf16 over
//! a paged cache of 16-token blocks:
//! - flash prefill: 4 sequences of 2048 new tokens (causal), and 1 of 8192, with the CUDA-core
//!   kernel and the tensor-core one (`flash_attention_prefill_tc`);
//! - paged decode: 64 sequences at context 2048, and 8 at context 16384 (split over the context).
//!
//! FLOPs count `4 · head_dim` per query head and visible position (q·k and p·v); decode is
//! also reported as K/V bytes read per second against the memory bandwidth. The peak is
//! `TESSERA_GPU_BF16_PEAK_TFLOPS` (default 989, an H100/H200 SXM's dense bf16 tensor-core
//! rate); the bandwidth `TESSERA_GPU_BANDWIDTH_GBS` (default 4800, an H200's HBM3e).
//! Without a GPU it says why and exits 0, unless `TESSERA_REQUIRE_GPU=1`.

use std::time::Instant;

use half::bf16;
use tessera_kernels::cuda::cudarc::driver::CudaSlice;
use tessera_kernels::cuda::{CacheView, DecodeArgs, GpuDevice, GpuKernels, PrefillArgs, PtxCache};

const HEADS: usize = 32;
const KV_HEADS: usize = 8;
const HD: usize = 128;
const BLOCK: usize = 16;

fn env_f64(name: &str, default: f64) -> f64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A cache holding `seqs` sequences of `ctx` positions each, blocks laid out in order.
struct Paged {
    k: CudaSlice<bf16>,
    v: CudaSlice<bf16>,
    tables: CudaSlice<i32>,
    max_blocks: usize,
}

fn paged(d: &GpuDevice, seqs: usize, ctx: usize) -> Paged {
    let max_blocks = ctx.div_ceil(BLOCK);
    let len = seqs * max_blocks * BLOCK * KV_HEADS * HD;
    // Small varied values: the kernels' speed does not depend on them, only on the shape.
    let host: Vec<bf16> = (0..len)
        .map(|i| bf16::from_f32(((i * 7919 % 1000) as f32 - 500.0) * 1e-3))
        .collect();
    let tables: Vec<i32> = (0..(seqs * max_blocks) as i32).collect();
    let s = d.stream();
    Paged {
        k: s.clone_htod(&host).unwrap(),
        v: s.clone_htod(&host).unwrap(),
        tables: s.clone_htod(&tables).unwrap(),
        max_blocks,
    }
}

fn view(p: &Paged) -> CacheView<'_, bf16> {
    CacheView {
        k: &p.k,
        v: &p.v,
        block_size: BLOCK,
        kv_heads: KV_HEADS,
        head_dim: HD,
        block_tables: &p.tables,
        max_blocks: p.max_blocks,
    }
}

/// Median seconds of `reps` synchronised runs of `f`, after one warm-up.
fn time(d: &GpuDevice, reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    d.stream().synchronize().unwrap();
    let mut v: Vec<f64> = (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            d.stream().synchronize().unwrap();
            t.elapsed().as_secs_f64()
        })
        .collect();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn prefill(d: &GpuDevice, k: &GpuKernels, seqs: usize, rows: usize, peak: f64, tc: bool) {
    let cache = paged(d, seqs, rows);
    let s = d.stream();
    let q = s.alloc_zeros::<bf16>(seqs * rows * HEADS * HD).unwrap();
    let mut out = s.alloc_zeros::<bf16>(seqs * rows * HEADS * HD).unwrap();
    let cu: Vec<i32> = (0..=seqs).map(|i| (i * rows) as i32).collect();
    let cu = s.clone_htod(&cu).unwrap();
    let first = s.clone_htod(&vec![0i32; seqs]).unwrap();
    let secs = time(d, 10, || {
        let args = PrefillArgs {
            out: &mut out,
            q: &q,
            q_stride: HEADS * HD,
            cache: view(&cache),
            cu_seqlens: &cu,
            first_pos: &first,
            num_seqs: seqs,
            max_rows: rows,
            num_heads: HEADS,
            scale: 1.0 / (HD as f32).sqrt(),
            window: None,
        };
        if tc {
            k.flash_attention_prefill_tc(args).unwrap();
        } else {
            k.flash_attention_prefill(args).unwrap();
        }
    });
    let visible = (seqs * rows * (rows + 1) / 2) as f64;
    let tflops = 4.0 * HD as f64 * HEADS as f64 * visible / secs / 1e12;
    println!(
        "flash prefill {:<13} {seqs} x {rows:>5}  {:>9.3} ms {:>8.1} TFLOP/s = {:>5.1}% of {peak} bf16 peak",
        if tc { "tensor cores" } else { "CUDA cores" },
        secs * 1e3,
        tflops,
        100.0 * tflops / peak
    );
}

fn decode(d: &GpuDevice, k: &GpuKernels, seqs: usize, ctx: usize, bandwidth: f64) {
    let cache = paged(d, seqs, ctx);
    let s = d.stream();
    let q = s.alloc_zeros::<bf16>(seqs * HEADS * HD).unwrap();
    let mut out = s.alloc_zeros::<bf16>(seqs * HEADS * HD).unwrap();
    let lens = s.clone_htod(&vec![ctx as i32; seqs]).unwrap();
    let secs = time(d, 20, || {
        k.paged_attention_decode(DecodeArgs {
            out: &mut out,
            q: &q,
            q_stride: HEADS * HD,
            cache: view(&cache),
            context_lens: &lens,
            max_context: ctx,
            num_seqs: seqs,
            num_heads: HEADS,
            scale: 1.0 / (HD as f32).sqrt(),
            window: None,
        })
        .unwrap();
    });
    let bytes = (2 * seqs * ctx * KV_HEADS * HD * 2) as f64;
    let gbs = bytes / secs / 1e9;
    println!(
        "paged decode {seqs:>3} seqs x ctx {ctx:>5}    {:>9.3} ms {:>8.0} GB/s of K/V = {:>5.1}% of {bandwidth} GB/s",
        secs * 1e3,
        gbs,
        100.0 * gbs / bandwidth
    );
}

fn main() {
    let device = match GpuDevice::open(0) {
        Ok(d) => d,
        Err(e) => {
            let required = std::env::var("TESSERA_REQUIRE_GPU").is_ok_and(|v| v == "1");
            eprintln!("no GPU, skipping the CUDA attention benchmark: {e}");
            std::process::exit(if required { 1 } else { 0 });
        }
    };
    let kernels = GpuKernels::load(&device, &PtxCache::default_location()).expect("kernels load");
    let peak = env_f64("TESSERA_GPU_BF16_PEAK_TFLOPS", 989.0);
    let bandwidth = env_f64("TESSERA_GPU_BANDWIDTH_GBS", 4800.0);
    println!(
        "CUDA attention on {} (sm_{}{}), bf16, {HEADS} heads / {KV_HEADS} KV heads of {HD}",
        device.name(),
        device.compute_capability().0,
        device.compute_capability().1
    );
    for tc in [false, true] {
        prefill(&device, &kernels, 4, 2048, peak, tc);
        prefill(&device, &kernels, 1, 8192, peak, tc);
    }
    decode(&device, &kernels, 64, 2048, bandwidth);
    decode(&device, &kernels, 8, 16384, bandwidth);
}
