//! Timings of the tiled kernel against the naive one, side by side (ignored by default):
//! `cargo test --release -p tessera-kernels --lib attention::perf -- --ignored --nocapture`.
//! SmolLM2-135M shapes: 9 query heads, 3 KV heads, head_dim 64, blocks of 16. The "cold" row
//! reads 96 MiB of other memory before each run, so K/V come from DRAM as in a decode step
//! (whose weights pass through the caches in between).

use std::time::Instant;

use half::bf16;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;

use super::*;

const HEADS: usize = 9;
const KV_HEADS: usize = 3;
const HD: usize = 64;
const BLOCK: usize = 16;

/// Fastest and median seconds of `reps` runs after one warm-up (on a shared machine the
/// fastest is the least disturbed).
fn time(reps: usize, mut f: impl FnMut()) -> (f64, f64) {
    f();
    let mut t: Vec<f64> = (0..reps)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64()
        })
        .collect();
    t.sort_by(f64::total_cmp);
    (t[0], t[reps / 2])
}

/// K and V pages of one element type.
#[derive(Clone, Copy)]
enum Pages<'a> {
    F32(PagedKv<'a, f32>),
    Bf16(PagedKv<'a, bf16>),
}

/// The case's queries over `kv`.
fn problem<'a, T>(
    kv: PagedKv<'a, T>,
    q: &'a [f32],
    seqs: &'a [AttentionSeq<'a>],
) -> PagedAttention<'a, T> {
    PagedAttention {
        kv,
        q,
        q_stride: HEADS * HD,
        num_heads: HEADS,
        seqs,
        scale: 1.0 / (HD as f32).sqrt(),
        window: None,
        softcap: None,
        sinks: None,
    }
}

struct Case {
    layout: KvLayout,
    ck: Vec<f32>,
    cv: Vec<f32>,
    ck16: Vec<bf16>,
    cv16: Vec<bf16>,
    tables: Vec<Vec<u32>>,
}

impl Case {
    fn f32_pages(&self) -> PagedKv<'_, f32> {
        PagedKv {
            layout: self.layout,
            k: &self.ck,
            v: &self.cv,
        }
    }
}

fn case(batch: usize, ctx: usize) -> Case {
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    let layout = KvLayout {
        block_size: BLOCK,
        kv_heads: KV_HEADS,
        head_dim: HD,
    };
    let per = ctx.div_ceil(BLOCK);
    let len = batch * per * BLOCK * layout.slot_width();
    let ck: Vec<f32> = (0..len).map(|_| rng.random_range(-1.0..1.0)).collect();
    let cv: Vec<f32> = (0..len).map(|_| rng.random_range(-1.0..1.0)).collect();
    let tables = (0..batch)
        .map(|b| ((b * per) as u32..((b + 1) * per) as u32).collect())
        .collect();
    Case {
        layout,
        ck16: ck.iter().map(|&x| bf16::from_f32(x)).collect(),
        cv16: cv.iter().map(|&x| bf16::from_f32(x)).collect(),
        ck,
        cv,
        tables,
    }
}

/// `batch` sequences of `rows` query rows ending at position `ctx - 1`.
fn run(c: &Case, ctx: usize, rows: usize, label: &str, flops: f64, bytes: f64) {
    let mut rng = ChaCha8Rng::seed_from_u64(10);
    let seqs: Vec<AttentionSeq<'_>> = c
        .tables
        .iter()
        .enumerate()
        .map(|(b, t)| AttentionSeq {
            first_row: b * rows,
            rows,
            first_position: ctx - rows,
            block_table: t,
            tree: None,
        })
        .collect();
    let total = seqs.len() * rows;
    let q: Vec<f32> = (0..total * HEADS * HD)
        .map(|_| rng.random_range(-1.0..1.0))
        .collect();
    let mut out = vec![0f32; total * HEADS * HD];
    let reps = 31;
    let k = kernels();
    let mut line = format!("{label:<24}");
    let mut report = |name: &str, (s, median): (f64, f64), bytes: f64| {
        line += &format!(
            " | {name} {:7.3} ms (median {:7.3}) {:6.2} GFLOP/s {:6.2} GB/s",
            s * 1e3,
            median * 1e3,
            flops / s / 1e9,
            bytes / s / 1e9
        );
    };
    let naive = time(reps, || {
        paged_attention_naive(k, &problem(c.f32_pages(), &q, &seqs), &mut out)
    });
    report("naive", naive, bytes);
    // The tiled kernel over one pair of pages.
    let attend = |out: &mut [f32], cache: Pages<'_>| match cache {
        Pages::F32(kv) => paged_attention_with(k, &problem(kv, &q, &seqs), out),
        Pages::Bf16(kv) => paged_attention_with(k, &problem(kv, &q, &seqs), out),
    };
    let f32_pages = Pages::F32(c.f32_pages());
    let bf16_pages = Pages::Bf16(PagedKv {
        layout: c.layout,
        k: &c.ck16,
        v: &c.cv16,
    });
    report(
        "tiled f32",
        time(reps, || attend(&mut out, f32_pages)),
        bytes,
    );
    report(
        "tiled bf16",
        time(reps, || attend(&mut out, bf16_pages)),
        bytes / 2.0,
    );
    // Cold: 96 MiB of other memory read (on the pool's threads, as a decode step's weights
    // are) before each run.
    let junk: Vec<u64> = (0..(96u64 << 17)).collect();
    let mut cold: Vec<f64> = (0..reps)
        .map(|_| {
            let sum: u64 = junk
                .par_chunks(1 << 16)
                .map(|c| c.iter().step_by(8).sum::<u64>())
                .sum();
            std::hint::black_box(sum);
            let s = Instant::now();
            attend(&mut out, bf16_pages);
            s.elapsed().as_secs_f64()
        })
        .collect();
    cold.sort_by(f64::total_cmp);
    report("cold bf16", (cold[0], cold[reps / 2]), bytes / 2.0);
    eprintln!("{line}");
}

#[test]
#[ignore = "timing; run with --release --ignored --nocapture"]
fn attention_timings() {
    eprintln!(
        "{} kernels, {} rayon threads",
        kernels().level.name(),
        rayon::current_num_threads()
    );
    // Prefill: one sequence, 512 causal rows. FLOPs: QKᵀ and PV, 2·hd each per visible key.
    let ctx = 512;
    let c = case(1, ctx);
    let visible = (ctx * (ctx + 1) / 2) as f64;
    let flops = 4.0 * HD as f64 * visible * HEADS as f64;
    let kv_bytes = (ctx * c.layout.slot_width() * 2 * 4) as f64;
    run(&c, ctx, ctx, "prefill 512", flops, kv_bytes);
    // Decode: one row per sequence; the K/V bytes (f32) dominate.
    for (batch, ctx) in [
        (1usize, 256usize),
        (16, 256),
        (1, 4096usize),
        (1, 16384),
        (8, 2048),
    ] {
        let c = case(batch, ctx);
        let flops = 4.0 * HD as f64 * ctx as f64 * HEADS as f64 * batch as f64;
        let kv_bytes = (batch * ctx * c.layout.slot_width() * 2 * 4) as f64;
        run(
            &c,
            ctx,
            1,
            &format!("decode batch={batch} ctx={ctx}"),
            flops,
            kv_bytes,
        );
    }
}
