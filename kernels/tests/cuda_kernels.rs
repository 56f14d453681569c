//! The CUDA kernels against the CPU reference (`tessera_kernels::cpu`), in f32 (tight
//! tolerances) and bf16 (storage rounding only, f32 math).
//!
//! These need an NVIDIA GPU; without one each test prints why it is skipped and passes — the
//! only legitimate skip. `scripts/gpu-check.sh` runs them on a GPU machine.
#![cfg(feature = "cuda")]

use half::bf16;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tessera_kernels::cpu;
use tessera_kernels::cpu::attention::{
    AttentionSeq, KvLayout, NewKv, PagedAttention, PagedKv, PagedKvMut,
};
use tessera_kernels::cuda::cudarc::driver::CudaSlice;
use tessera_kernels::cuda::{
    CacheView, DecodeArgs, Gemm, GpuDevice, GpuFloat, GpuKernels, GpuQuant, PrefillArgs, PtxCache,
    RopeCacheArgs,
};

fn gpu() -> Option<(GpuDevice, GpuKernels)> {
    let device = match GpuDevice::open(0) {
        Ok(d) => d,
        Err(e) => {
            println!("SKIPPED (needs an NVIDIA GPU): {e}");
            return None;
        }
    };
    let kernels = GpuKernels::load(&device, &PtxCache::default_location()).expect("kernels load");
    Some((device, kernels))
}

fn rand_vec(rng: &mut ChaCha8Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-1.0..1.0)).collect()
}

fn up<T: GpuFloat>(d: &GpuDevice, v: &[f32]) -> CudaSlice<T> {
    let host: Vec<T> = v.iter().map(|&x| T::from_f32(x)).collect();
    d.stream().clone_htod(&host).unwrap()
}

fn up_i32(d: &GpuDevice, v: &[i32]) -> CudaSlice<i32> {
    d.stream().clone_htod(v).unwrap()
}

fn down<T: GpuFloat>(d: &GpuDevice, s: &CudaSlice<T>) -> Vec<f32> {
    d.stream().synchronize().unwrap();
    d.stream()
        .clone_dtoh(s)
        .unwrap()
        .into_iter()
        .map(T::to_f32)
        .collect()
}

/// What the GPU sees for a bf16 run: inputs rounded to the storage type.
fn round<T: GpuFloat>(v: &[f32]) -> Vec<f32> {
    v.iter().map(|&x| T::from_f32(x).to_f32()).collect()
}

#[track_caller]
fn assert_close(got: &[f32], want: &[f32], tol: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * (1.0 + w.abs()),
            "{what}[{i}]: gpu {g} vs cpu {w} (tol {tol})"
        );
    }
}

/// Relative tolerance of a dtype's final rounding (plus f32 reordering).
fn tol<T: GpuFloat>() -> f32 {
    match T::SUFFIX {
        "f32" => 2e-5,
        "f16" => 2e-3,
        _ => 1.6e-2,
    }
}

fn norms<T: GpuFloat>(d: &GpuDevice, k: &GpuKernels) {
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let (rows, hidden) = (5, 1000);
    let x = round::<T>(&rand_vec(&mut rng, rows * hidden));
    let r = round::<T>(&rand_vec(&mut rng, rows * hidden));
    let w = round::<T>(&rand_vec(&mut rng, hidden));
    let mut want = vec![0.0; rows * hidden];
    cpu::norm::rms_norm(&x, &w, 1e-6, &mut want);
    let (gx, gw) = (up::<T>(d, &x), up::<T>(d, &w));
    let mut out = d.stream().alloc_zeros::<T>(rows * hidden).unwrap();
    k.rms_norm(&gx, &gw, &mut out, rows, 1e-6).unwrap();
    assert_close(&down(d, &out), &want, tol::<T>(), "rms_norm");

    let mut res_cpu = r.clone();
    cpu::norm::add_rms_norm(&mut res_cpu, &x, &w, 1e-6, &mut want);
    let mut gr = up::<T>(d, &r);
    k.add_rms_norm(&mut gr, &gx, &gw, &mut out, rows, 1e-6)
        .unwrap();
    assert_close(&down(d, &gr), &res_cpu, tol::<T>(), "residual");
    assert_close(&down(d, &out), &want, 2.0 * tol::<T>(), "add_rms_norm");
}

#[test]
fn rms_norms_match_cpu() {
    let Some((d, k)) = gpu() else { return };
    norms::<f32>(&d, &k);
    norms::<bf16>(&d, &k);
}

#[test]
fn silu_mul_and_embedding_match_cpu() {
    let Some((d, k)) = gpu() else { return };
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    let (rows, width) = (3, 700);
    let gu = rand_vec(&mut rng, rows * 2 * width);
    let mut want = vec![0.0; rows * width];
    cpu::activation::silu_mul(&gu, width, &mut want);
    let ggu = up::<f32>(&d, &gu);
    let mut out = d.stream().alloc_zeros::<f32>(rows * width).unwrap();
    k.silu_mul(&ggu, &mut out, rows, width).unwrap();
    assert_close(&down(&d, &out), &want, 1e-6, "silu_mul");

    // A rank holding vocab rows 10..30: ids outside give zeros.
    let (hidden, start, vocab_rows) = (96, 10, 20);
    let table = rand_vec(&mut rng, vocab_rows * hidden);
    let ids = [12, 3, 29, 30, 10];
    let want: Vec<f32> = ids
        .iter()
        .flat_map(|&id| {
            let r = id as usize;
            if (start..start + vocab_rows).contains(&r) {
                table[(r - start) * hidden..(r - start + 1) * hidden].to_vec()
            } else {
                vec![0.0; hidden]
            }
        })
        .collect();
    let mut out = d.stream().alloc_zeros::<f32>(ids.len() * hidden).unwrap();
    k.embedding(
        &up_i32(&d, &ids),
        &up::<f32>(&d, &table),
        &mut out,
        hidden,
        start,
    )
    .unwrap();
    assert_eq!(down(&d, &out), want);
}

#[test]
fn rope_and_cache_matches_cpu() {
    let Some((d, k)) = gpu() else { return };
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let (heads, kv_heads, hd, bs, blocks) = (4, 2, 64, 4, 6);
    let layout = KvLayout {
        block_size: bs,
        kv_heads,
        head_dim: hd,
    };
    let stride = (heads + 2 * kv_heads) * hd;
    let (q_off, k_off, v_off) = (0, heads * hd, (heads + kv_heads) * hd);
    let positions = [0u32, 5, 6, 17];
    let slots = [3usize, 9, 10, 22];
    let inv_freq: Vec<f32> = (0..hd / 2)
        .map(|i| 1.0 / 10000f32.powf(2.0 * i as f32 / hd as f32))
        .collect();
    let qkv = rand_vec(&mut rng, positions.len() * stride);

    let mut want = qkv.clone();
    let (cos, sin) = cpu::rope::cos_sin(&inv_freq, &positions);
    cpu::rope::apply_rope(&mut want, stride, q_off, heads, hd, &cos, &sin);
    cpu::rope::apply_rope(&mut want, stride, k_off, kv_heads, hd, &cos, &sin);
    let cache_len = blocks * bs * layout.slot_width();
    let (mut ck, mut cv) = (vec![0.0; cache_len], vec![0.0; cache_len]);
    cpu::attention::write_kv(
        PagedKvMut {
            layout,
            k: &mut ck,
            v: &mut cv,
        },
        &NewKv {
            rows: &want,
            row_stride: stride,
            k_offset: k_off,
            v_offset: v_off,
            slots: &slots,
            rope: None,
        },
    );

    let mut gqkv = up::<f32>(&d, &qkv);
    let mut gk = d.stream().alloc_zeros::<f32>(cache_len).unwrap();
    let mut gv = d.stream().alloc_zeros::<f32>(cache_len).unwrap();
    let pos_i: Vec<i32> = positions.iter().map(|&p| p as i32).collect();
    let slot_i: Vec<i32> = slots.iter().map(|&s| s as i32).collect();
    let (gpos, gslots, gfreq) = (
        up_i32(&d, &pos_i),
        up_i32(&d, &slot_i),
        up::<f32>(&d, &inv_freq),
    );
    k.rope_and_cache(RopeCacheArgs {
        qkv: &mut gqkv,
        tokens: positions.len(),
        row_stride: stride,
        q_offset: q_off,
        k_offset: k_off,
        v_offset: v_off,
        num_heads: heads,
        kv_heads,
        head_dim: hd,
        rot_dim: hd,
        positions: &gpos,
        inv_freq: &gfreq,
        slot_mapping: &gslots,
        cache_k: &mut gk,
        cache_v: &mut gv,
    })
    .unwrap();
    assert_close(&down(&d, &gqkv), &want, 1e-5, "rotated qkv");
    assert_close(
        &down(&d, &gk),
        &relayout_keys(layout, &ck, false),
        1e-5,
        "k cache",
    );
    assert_close(&down(&d, &gv), &cv, 0.0, "v cache");
}

/// A K cache moved between the GPU kernels' layout (slot after slot) and the CPU's (keys
/// transposed within their block, see `KvLayout::key_at`); `to_cpu` picks the direction.
fn relayout_keys(layout: KvLayout, src: &[f32], to_cpu: bool) -> Vec<f32> {
    let (w, hd, bs) = (layout.slot_width(), layout.head_dim, layout.block_size);
    let mut out = vec![0.0; src.len()];
    for slot in 0..src.len() / w {
        for h in 0..layout.kv_heads {
            let k0 = layout.key_at(slot, h);
            for d in 0..hd {
                let (gpu, cpu) = (slot * w + h * hd + d, k0 + d * bs);
                if to_cpu {
                    out[cpu] = src[gpu];
                } else {
                    out[gpu] = src[cpu];
                }
            }
        }
    }
    out
}

/// A random paged cache: sequence s's positions live in shuffled blocks.
struct Fixture {
    ck: Vec<f32>,
    cv: Vec<f32>,
    tables: Vec<Vec<u32>>,
    max_blocks: usize,
}

fn fixture(rng: &mut ChaCha8Rng, layout: KvLayout, lens: &[usize]) -> Fixture {
    let bs = layout.block_size;
    let max_blocks = lens.iter().map(|l| l.div_ceil(bs)).max().unwrap();
    let total: usize = lens.iter().map(|l| l.div_ceil(bs)).sum::<usize>() + 1;
    let mut ids: Vec<u32> = (1..total as u32 + 1).collect();
    // Fisher–Yates, so tables are non-contiguous.
    for i in (1..ids.len()).rev() {
        ids.swap(i, rng.random_range(0..=i));
    }
    let mut next = ids.into_iter();
    let tables = lens
        .iter()
        .map(|l| (0..l.div_ceil(bs)).map(|_| next.next().unwrap()).collect())
        .collect();
    let n = (total + 1) * bs * layout.slot_width();
    Fixture {
        ck: rand_vec(rng, n),
        cv: rand_vec(rng, n),
        tables,
        max_blocks,
    }
}

impl Fixture {
    fn flat_tables(&self) -> Vec<i32> {
        self.tables
            .iter()
            .flat_map(|t| {
                let mut row: Vec<i32> = t.iter().map(|&b| b as i32).collect();
                row.resize(self.max_blocks, 0);
                row
            })
            .collect()
    }
}

fn attention_case<T: GpuFloat>(d: &GpuDevice, k: &GpuKernels, hd: usize, window: Option<usize>) {
    let mut rng = ChaCha8Rng::seed_from_u64(4 + hd as u64);
    let (heads, kv_heads) = (8, 2);
    let layout = KvLayout {
        block_size: 16,
        kv_heads,
        head_dim: hd,
    };
    let scale = 1.0 / (hd as f32).sqrt();
    // Prefill: (first position, query rows); the second is a chunk after a cached prefix.
    let chunks = [(0usize, 45usize), (20, 7), (0, 1), (90, 70)];
    let lens: Vec<usize> = chunks.iter().map(|(f, r)| f + r).collect();
    let mut fx = fixture(&mut rng, layout, &lens);
    fx.ck = round::<T>(&fx.ck);
    fx.cv = round::<T>(&fx.cv);
    let rows: usize = chunks.iter().map(|c| c.1).sum();
    let q = round::<T>(&rand_vec(&mut rng, rows * heads * hd));
    let mut seqs = Vec::new();
    let mut cu = vec![0i32];
    for (i, &(first, n)) in chunks.iter().enumerate() {
        seqs.push(AttentionSeq {
            first_row: *cu.last().unwrap() as usize,
            rows: n,
            first_position: first,
            block_table: &fx.tables[i],
            tree: None,
        });
        cu.push(cu.last().unwrap() + n as i32);
    }
    let mut want = vec![0.0; rows * heads * hd];
    let cpu_keys = relayout_keys(layout, &fx.ck, true);
    let problem = PagedAttention {
        kv: PagedKv {
            layout,
            k: &cpu_keys,
            v: &fx.cv,
        },
        q: &q,
        q_stride: heads * hd,
        num_heads: heads,
        seqs: &seqs,
        scale,
        window,
        softcap: None,
        sinks: None,
    };
    cpu::attention::paged_attention(&problem, &mut want);
    let (gk, gv) = (up::<T>(d, &fx.ck), up::<T>(d, &fx.cv));
    let gtables = up_i32(d, &fx.flat_tables());
    let cache = CacheView {
        k: &gk,
        v: &gv,
        block_size: layout.block_size,
        kv_heads,
        head_dim: hd,
        block_tables: &gtables,
        max_blocks: fx.max_blocks,
    };
    let gq = up::<T>(d, &q);
    let first: Vec<i32> = chunks.iter().map(|c| c.0 as i32).collect();
    let (gcu, gfirst) = (up_i32(d, &cu), up_i32(d, &first));
    // The CUDA-core kernel, then the tensor-core one where it has an instance (it rounds p to
    // T before p·v: one more rounding of T's).
    for tensor_cores in [false, true] {
        if tensor_cores && !GpuKernels::tensor_core_prefill_supported::<T>(hd) {
            continue;
        }
        let mut out = d.stream().alloc_zeros::<T>(rows * heads * hd).unwrap();
        let args = PrefillArgs {
            out: &mut out,
            q: &gq,
            q_stride: heads * hd,
            cache,
            cu_seqlens: &gcu,
            first_pos: &gfirst,
            num_seqs: chunks.len(),
            max_rows: 70,
            num_heads: heads,
            scale,
            window,
        };
        let (result, tol, kernel) = if tensor_cores {
            (
                k.flash_attention_prefill_tc(args),
                3.0 * tol::<T>(),
                "tensor-core ",
            )
        } else {
            (k.flash_attention_prefill(args), 2.0 * tol::<T>(), "")
        };
        result.unwrap();
        let what = format!("{kernel}prefill {} hd {hd} window {window:?}", T::SUFFIX);
        assert_close(&down(d, &out), &want, tol, &what);
    }

    // Decode: one query per sequence at the end of contexts of 1, 37 and 1300 positions (the
    // last is split into partitions and reduced).
    let ctx = [1usize, 37, 1300];
    let fx = fixture(&mut rng, layout, &ctx);
    let (ck, cv) = (round::<T>(&fx.ck), round::<T>(&fx.cv));
    let q = round::<T>(&rand_vec(&mut rng, ctx.len() * heads * hd));
    let seqs: Vec<AttentionSeq<'_>> = ctx
        .iter()
        .enumerate()
        .map(|(i, &c)| AttentionSeq {
            first_row: i,
            rows: 1,
            first_position: c - 1,
            block_table: &fx.tables[i],
            tree: None,
        })
        .collect();
    let mut want = vec![0.0; ctx.len() * heads * hd];
    let cpu_keys = relayout_keys(layout, &ck, true);
    let problem = PagedAttention {
        kv: PagedKv {
            layout,
            k: &cpu_keys,
            v: &cv,
        },
        q: &q,
        q_stride: heads * hd,
        num_heads: heads,
        seqs: &seqs,
        scale,
        window,
        softcap: None,
        sinks: None,
    };
    cpu::attention::paged_attention(&problem, &mut want);
    let (gk, gv) = (up::<T>(d, &ck), up::<T>(d, &cv));
    let gtables = up_i32(d, &fx.flat_tables());
    let lens: Vec<i32> = ctx.iter().map(|&c| c as i32).collect();
    let glens = up_i32(d, &lens);
    let gq = up::<T>(d, &q);
    let mut out = d.stream().alloc_zeros::<T>(ctx.len() * heads * hd).unwrap();
    k.paged_attention_decode(DecodeArgs {
        out: &mut out,
        q: &gq,
        q_stride: heads * hd,
        cache: CacheView {
            k: &gk,
            v: &gv,
            block_size: layout.block_size,
            kv_heads,
            head_dim: hd,
            block_tables: &gtables,
            max_blocks: fx.max_blocks,
        },
        context_lens: &glens,
        max_context: 1300,
        num_seqs: ctx.len(),
        num_heads: heads,
        scale,
        window,
    })
    .unwrap();
    let what = format!("decode {} hd {hd} window {window:?}", T::SUFFIX);
    assert_close(&down(d, &out), &want, 2.0 * tol::<T>(), &what);
}

#[test]
fn attention_matches_cpu_with_gqa_windows_and_prefixes() {
    let Some((d, k)) = gpu() else { return };
    for hd in [64, 80, 128] {
        for window in [None, Some(24), Some(700)] {
            attention_case::<f32>(&d, &k, hd, window);
        }
    }
    attention_case::<bf16>(&d, &k, 128, None);
    attention_case::<bf16>(&d, &k, 64, Some(24));
    // The tensor-core prefill's instances (bf16 and f16, head_dim 64 and 128).
    attention_case::<bf16>(&d, &k, 64, None);
    attention_case::<bf16>(&d, &k, 128, Some(700));
    attention_case::<half::f16>(&d, &k, 64, Some(24));
    attention_case::<half::f16>(&d, &k, 128, None);
}

#[test]
fn quantized_gemv_and_dequantization_match_the_cpu() {
    use tessera_kernels::quant::{QuantFormat, dequantize};
    let Some((d, k)) = gpu() else { return };
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let (n, kk) = (67, 256);
    for (format, quant) in [
        (QuantFormat::Q8_0, GpuQuant::Q8_0),
        (QuantFormat::Q4_0, GpuQuant::Q4_0),
        (QuantFormat::Q4_1, GpuQuant::Q4_1),
    ] {
        let block_bytes = quant.block_bytes();
        // Random blocks with sane f16 scales (Q4_1: d and m) in front of the quants.
        let scales = if quant == GpuQuant::Q4_1 { 2 } else { 1 };
        let mut bytes: Vec<u8> = (0..n * kk / 32 * block_bytes)
            .map(|_| rng.random())
            .collect();
        for b in bytes.chunks_exact_mut(block_bytes) {
            for i in 0..scales {
                let s = half::f16::from_f32(rng.random_range(0.001..0.05)).to_bits();
                b[2 * i..2 * i + 2].copy_from_slice(&s.to_le_bytes());
            }
        }
        let mut w = vec![0.0; n * kk];
        dequantize(format, &bytes, &mut w).unwrap();
        let gw = d.stream().clone_htod(&bytes).unwrap();
        // Dequantized on the device: the same f32 values.
        let mut gdense = d.stream().alloc_zeros::<f32>(n * kk).unwrap();
        k.dequantize(quant, &gw, &mut gdense, n, kk).unwrap();
        assert_close(
            &down(&d, &gdense),
            &w,
            0.0,
            &format!("{format:?} dequantized"),
        );
        for m in [1, 3, 11] {
            let x = rand_vec(&mut rng, m * kk);
            let mut want = vec![0.0; m * n];
            cpu::matmul::linear(&x, &w, None, m, kk, &mut want);
            let gx = up::<f32>(&d, &x);
            let mut y = d.stream().alloc_zeros::<f32>(m * n).unwrap();
            k.gemv(quant, &gw, &gx, &mut y, (m, n, kk)).unwrap();
            assert_close(&down(&d, &y), &want, 1e-4, &format!("{format:?} m={m}"));
        }
    }
}

#[test]
fn bias_is_added_to_every_row() {
    let Some((d, k)) = gpu() else { return };
    let (rows, n) = (5, 300);
    let y: Vec<f32> = (0..rows * n).map(|i| i as f32).collect();
    let bias: Vec<f32> = (0..n).map(|i| 0.5 * i as f32).collect();
    let mut gy = up::<f32>(&d, &y);
    k.add_bias(&mut gy, &up::<f32>(&d, &bias), rows).unwrap();
    let want: Vec<f32> = y.iter().enumerate().map(|(i, v)| v + bias[i % n]).collect();
    assert_close(&down(&d, &gy), &want, 0.0, "add_bias");
}

#[test]
fn sampling_helpers_match_host() {
    let Some((d, k)) = gpu() else { return };
    let mut rng = ChaCha8Rng::seed_from_u64(6);
    let (rows, vocab, top) = (3, 50_000, 40);
    let mut logits = rand_vec(&mut rng, rows * vocab);
    logits[vocab + 17] = 5.0;
    logits[vocab + 40_000] = 5.0; // a tie: the lower id wins
    let gl = up::<f32>(&d, &logits);
    let mut ids = d.stream().alloc_zeros::<i32>(rows).unwrap();
    k.argmax(&gl, &mut ids, vocab).unwrap();
    let got = d.stream().clone_dtoh(&ids).unwrap();
    for (r, &id) in got.iter().enumerate() {
        let row = &logits[r * vocab..(r + 1) * vocab];
        let want = (0..vocab).fold(0, |b, i| if row[i] > row[b] { i } else { b });
        assert_eq!(id as usize, want, "argmax row {r}");
    }

    let mut vals = d.stream().alloc_zeros::<f32>(rows * top).unwrap();
    let mut tids = d.stream().alloc_zeros::<i32>(rows * top).unwrap();
    k.topk(&gl, &mut vals, &mut tids, vocab, top).unwrap();
    let (gv, gi) = (down(&d, &vals), d.stream().clone_dtoh(&tids).unwrap());
    for r in 0..rows {
        let mut order: Vec<usize> = (0..vocab).collect();
        let row = &logits[r * vocab..(r + 1) * vocab];
        order.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
        for j in 0..top {
            assert_eq!(gi[r * top + j] as usize, order[j], "topk row {r} rank {j}");
            assert_eq!(gv[r * top + j], row[order[j]]);
        }
    }

    let mut lp = d.stream().alloc_zeros::<f32>(rows * vocab).unwrap();
    k.log_softmax(&gl, &mut lp, vocab, 0.7).unwrap();
    let lp = down(&d, &lp);
    for r in 0..rows {
        let row: Vec<f64> = logits[r * vocab..(r + 1) * vocab]
            .iter()
            .map(|&x| x as f64 / 0.7)
            .collect();
        let m = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let lse = m + row.iter().map(|x| (x - m).exp()).sum::<f64>().ln();
        for i in (0..vocab).step_by(997) {
            assert!(
                (lp[r * vocab + i] as f64 - (row[i] - lse)).abs() < 1e-4,
                "log_softmax"
            );
        }
    }
}

#[test]
fn cublaslt_linear_matches_cpu() {
    let Some((d, _k)) = gpu() else { return };
    let gemm = Gemm::new(d.stream().clone()).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let (m, n, kk) = (37, 300, 256);
    let x = round::<bf16>(&rand_vec(&mut rng, m * kk));
    let w = round::<bf16>(&rand_vec(&mut rng, n * kk));
    let bias = round::<bf16>(&rand_vec(&mut rng, n));
    let mut want = vec![0.0; m * n];
    cpu::matmul::linear(&x, &w, Some(&bias), m, kk, &mut want);
    let (gx, gw, gb) = (
        up::<bf16>(&d, &x),
        up::<bf16>(&d, &w),
        up::<bf16>(&d, &bias),
    );
    let mut out = d.stream().alloc_zeros::<bf16>(m * n).unwrap();
    gemm.linear(&gx, &gw, Some(&gb), &mut out, m, n, kk)
        .unwrap();
    // Sums of 256 products of magnitude ≤ 1 in f32, rounded once to bf16.
    assert_close(&down(&d, &out), &want, 1.6e-2, "bf16 linear");
}

#[test]
fn f32_linear_is_full_fp32_not_tf32() {
    let Some((d, _k)) = gpu() else { return };
    let gemm = Gemm::new(d.stream().clone()).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(8);
    let (m, n, kk) = (5, 300, 256);
    let x = rand_vec(&mut rng, m * kk);
    let w = rand_vec(&mut rng, n * kk);
    let bias = rand_vec(&mut rng, n);
    let mut want = vec![0.0; m * n];
    cpu::matmul::linear(&x, &w, Some(&bias), m, kk, &mut want);
    let (gx, gw, gb) = (up::<f32>(&d, &x), up::<f32>(&d, &w), up::<f32>(&d, &bias));
    let mut out = d.stream().alloc_zeros::<f32>(m * n).unwrap();
    gemm.linear(&gx, &gw, Some(&gb), &mut out, m, n, kk)
        .unwrap();
    // FP32 sums of 256 products differ only in order (about 1e-6); TF32 would be ~1e-2 off.
    assert_close(&down(&d, &out), &want, 1e-4, "f32 linear");
}
