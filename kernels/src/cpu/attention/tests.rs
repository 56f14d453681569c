//! Attention against a dense f64 reference, on every level, and batch invariance.

use half::bf16;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::flash::{PARTITION, QUERY_TILE};
use super::*;
use crate::cpu::Level;

/// Query heads, KV heads and head width of a case.
#[derive(Clone, Copy)]
pub(super) struct Heads {
    pub(super) q: usize,
    pub(super) kv: usize,
    pub(super) dim: usize,
}

/// Dense reference: contiguous K/V of one sequence (`[ctx, kv_heads, hd]`), f64 softmax.
/// `q` is `[rows, heads, hd]` for `positions`.
fn reference(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    h: Heads,
    positions: std::ops::Range<usize>,
    window: Option<usize>,
) -> Vec<f32> {
    let (heads, kv_heads, hd) = (h.q, h.kv, h.dim);
    let (first_pos, rows) = (positions.start, positions.len());
    let scale = 1.0 / (hd as f64).sqrt();
    let mut out = vec![0f32; rows * heads * hd];
    let mut acc = vec![0f64; hd];
    for r in 0..rows {
        let pos = first_pos + r;
        for h in 0..heads {
            let g = h / (heads / kv_heads);
            let lo = window.map_or(0, |w| (pos + 1).saturating_sub(w));
            let qh = &q[(r * heads + h) * hd..(r * heads + h + 1) * hd];
            let s: Vec<f64> = (lo..=pos)
                .map(|p| {
                    let kh = &k[(p * kv_heads + g) * hd..(p * kv_heads + g + 1) * hd];
                    qh.iter()
                        .zip(kh)
                        .map(|(a, b)| *a as f64 * *b as f64)
                        .sum::<f64>()
                        * scale
                })
                .collect();
            let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = s.iter().map(|x| (x - m).exp()).sum();
            acc.fill(0.0);
            for (i, p) in (lo..=pos).enumerate() {
                let pr = (s[i] - m).exp() / z;
                for (d, a) in acc.iter_mut().enumerate() {
                    *a += pr * v[(p * kv_heads + g) * hd + d] as f64;
                }
            }
            for (d, a) in acc.iter().enumerate() {
                out[(r * heads + h) * hd + d] = *a as f32;
            }
        }
    }
    out
}

pub(super) fn heads_of(q: usize, kv: usize, dim: usize) -> Heads {
    Heads { q, kv, dim }
}

pub(super) fn random(rng: &mut ChaCha8Rng, n: usize, amp: f32) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-amp..amp)).collect()
}

/// Writes tokens whose rows are `[k | v]` (two slots' width) into their `slots`.
fn write_kv_rows<T: KvElem>(
    layout: KvLayout,
    k: &mut [T],
    v: &mut [T],
    rows: &[f32],
    slots: &[usize],
) {
    let w = layout.slot_width();
    let new = NewKv {
        rows,
        row_stride: 2 * w,
        k_offset: 0,
        v_offset: w,
        slots,
        rope: None,
    };
    write_kv(PagedKvMut { layout, k, v }, &new);
}

/// One sequence's K/V scattered into a paged cache of element type `T` through `write_kv`.
pub(super) struct Paged<T> {
    pub(super) layout: KvLayout,
    pub(super) table: Vec<u32>,
    pub(super) ck: Vec<T>,
    pub(super) cv: Vec<T>,
}

impl<T> Paged<T> {
    pub(super) fn pages(&self) -> PagedKv<'_, T> {
        PagedKv {
            layout: self.layout,
            k: &self.ck,
            v: &self.cv,
        }
    }
}

pub(super) fn paged<T: KvElem>(
    rng: &mut ChaCha8Rng,
    layout: KvLayout,
    k: &[f32],
    v: &[f32],
) -> Paged<T> {
    let (bs, w) = (layout.block_size, layout.slot_width());
    let ctx = k.len() / w;
    let blocks = ctx.div_ceil(bs);
    // A shuffled, non-contiguous table inside a larger cache.
    let total = 2 * blocks + 3;
    let mut ids: Vec<u32> = (0..total as u32).collect();
    for i in (1..ids.len()).rev() {
        ids.swap(i, rng.random_range(0..=i));
    }
    let table = ids[..blocks].to_vec();
    let mut ck = vec![T::default(); total * bs * w];
    let mut cv = ck.clone();
    let rows: Vec<f32> = (0..ctx)
        .flat_map(|p| k[p * w..(p + 1) * w].iter().chain(&v[p * w..(p + 1) * w]))
        .copied()
        .collect();
    let slots: Vec<usize> = (0..ctx)
        .map(|p| table[p / bs] as usize * bs + p % bs)
        .collect();
    write_kv_rows(layout, &mut ck, &mut cv, &rows, &slots);
    Paged {
        layout,
        table,
        ck,
        cv,
    }
}

pub(super) fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Runs `rows` query rows at `first` (with `q` `[rows, heads, hd]`) as one sequence.
fn attend<T: KvElem>(
    kernels: &Kernels,
    c: &Paged<T>,
    q: &[f32],
    heads: usize,
    first: usize,
    rows: usize,
    window: Option<usize>,
) -> Vec<f32> {
    assert_eq!(q.len(), rows * heads * c.layout.head_dim);
    attend_tree(kernels, c, q, heads, first, None, window)
}

/// Runs the rows of `q` (`[rows, heads, hd]`) from `first` as one sequence, as `tree` lays
/// them out (`None`: consecutive positions).
pub(super) fn attend_tree<T: KvElem>(
    kernels: &Kernels,
    c: &Paged<T>,
    q: &[f32],
    heads: usize,
    root: usize,
    tree: Option<TreeMask<'_>>,
    window: Option<usize>,
) -> Vec<f32> {
    let hd = c.layout.head_dim;
    let rows = q.len() / (heads * hd);
    let mut out = vec![f32::NAN; rows * heads * hd];
    let seq = AttentionSeq {
        first_row: 0,
        rows,
        first_position: root,
        block_table: &c.table,
        tree,
    };
    let p = PagedAttention {
        kv: c.pages(),
        q,
        q_stride: heads * hd,
        num_heads: heads,
        seqs: &[seq],
        scale: 1.0 / (hd as f32).sqrt(),
        window,
        softcap: None,
        sinks: None,
    };
    paged_attention_with(kernels, &p, &mut out);
    out
}

#[test]
fn tiled_matches_f64_reference_on_random_shapes() {
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let mut worst = vec![0f32; Level::ALL.len()];
    // (head_dim, kv_heads, group, block_size, context, rows, window)
    let cases = [
        (8, 2, 1, 4, 11, 5, None),
        (8, 1, 4, 1, 37, 37, Some(5)),
        (20, 2, 3, 3, 50, 17, None),
        (20, 1, 3, 16, 300, 1, Some(40)),
        (64, 3, 3, 16, 530, 1, None),
        (64, 3, 3, 16, 600, 77, None),
        (64, 2, 4, 32, 270, 270, Some(100)),
        (80, 1, 1, 7, 129, 40, None),
        (80, 2, 4, 5, 777, 3, Some(513)),
        (64, 1, 3, 16, 17, 17, Some(1)),
    ];
    for (ci, &(hd, kv_heads, group, bs, ctx, rows, window)) in cases.iter().enumerate() {
        let heads = kv_heads * group;
        let layout = KvLayout {
            block_size: bs,
            kv_heads,
            head_dim: hd,
        };
        // Larger scores than uniform noise, so the softmax is far from flat.
        let k = random(&mut rng, ctx * kv_heads * hd, 2.0);
        let v = random(&mut rng, ctx * kv_heads * hd, 1.0);
        let q = random(&mut rng, rows * heads * hd, 2.0);
        let c: Paged<f32> = paged(&mut rng, layout, &k, &v);
        let first = ctx - rows;
        let want = reference(
            &q,
            &k,
            &v,
            heads_of(heads, kv_heads, hd),
            first..ctx,
            window,
        );
        for level in Level::available() {
            let kern = Kernels::for_level(level).unwrap();
            let got = attend(kern, &c, &q, heads, first, rows, window);
            let d = max_abs_diff(&got, &want);
            worst[level as usize] = worst[level as usize].max(d);
            assert!(d < 2e-5, "case {ci} {level:?}: max |diff| {d}");
        }
    }
    for level in Level::available() {
        eprintln!(
            "tiled vs f64 reference, {level:?}: max |diff| {:e}",
            worst[level as usize]
        );
    }
}

#[test]
fn naive_kernel_still_matches_the_reference() {
    let mut rng = ChaCha8Rng::seed_from_u64(4);
    let (hd, kv_heads, heads, ctx, rows) = (20, 2, 6, 45, 9);
    let layout = KvLayout {
        block_size: 4,
        kv_heads,
        head_dim: hd,
    };
    let k = random(&mut rng, ctx * kv_heads * hd, 1.0);
    let v = random(&mut rng, ctx * kv_heads * hd, 1.0);
    let q = random(&mut rng, rows * heads * hd, 1.0);
    let c: Paged<f32> = paged(&mut rng, layout, &k, &v);
    let want = reference(
        &q,
        &k,
        &v,
        heads_of(heads, kv_heads, hd),
        ctx - rows..ctx,
        Some(7),
    );
    for level in Level::available() {
        let kern = Kernels::for_level(level).unwrap();
        let mut out = vec![0f32; rows * heads * hd];
        let seq = AttentionSeq {
            first_row: 0,
            rows,
            first_position: ctx - rows,
            block_table: &c.table,
            tree: None,
        };
        let p = PagedAttention {
            kv: c.pages(),
            q: &q,
            q_stride: heads * hd,
            num_heads: heads,
            seqs: &[seq],
            scale: 1.0 / (hd as f32).sqrt(),
            window: Some(7),
            softcap: None,
            sinks: None,
        };
        paged_attention_naive(kern, &p, &mut out);
        let d = max_abs_diff(&out, &want);
        assert!(d < 1e-5, "{level:?}: {d}");
    }
}

/// A row's output is the same bits whether it is computed alone (decode, split over
/// partitions), inside chunks of any size at any offset of a batch, or in one prefill.
fn check_chunking_invariance<T: KvElem>() {
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    // Long enough for several partitions and query tiles; a context not a multiple of tiles.
    let (hd, kv_heads, group, bs) = (64, 3, 3, 16);
    let ctx = 2 * PARTITION + 3 * QUERY_TILE + 5;
    let heads = kv_heads * group;
    let layout = KvLayout {
        block_size: bs,
        kv_heads,
        head_dim: hd,
    };
    let k = random(&mut rng, ctx * kv_heads * hd, 2.0);
    let v = random(&mut rng, ctx * kv_heads * hd, 1.0);
    let q = random(&mut rng, ctx * heads * hd, 2.0);
    let c: Paged<T> = paged(&mut rng, layout, &k, &v);
    let w = heads * hd;
    for window in [None, Some(300)] {
        for level in Level::available() {
            let kern = Kernels::for_level(level).unwrap();
            let whole = attend(kern, &c, &q, heads, 0, ctx, window);
            // One row at a time, and chunks of 7 and 64 batched behind another sequence.
            for chunk in [1usize, 7, 64] {
                let mut start = 0;
                while start < ctx {
                    let rows = chunk.min(ctx - start);
                    let lead = 3;
                    let mut qb = random(&mut rng, lead * w, 1.0);
                    qb.extend_from_slice(&q[start * w..(start + rows) * w]);
                    // Another chunk of the same sequence leads the batch.
                    let seqs = [
                        AttentionSeq {
                            first_row: 0,
                            rows: lead,
                            first_position: 50,
                            block_table: &c.table,
                            tree: None,
                        },
                        AttentionSeq {
                            first_row: lead,
                            rows,
                            first_position: start,
                            block_table: &c.table,
                            tree: None,
                        },
                    ];
                    let mut out = vec![f32::NAN; (lead + rows) * w];
                    let p = PagedAttention {
                        kv: c.pages(),
                        q: &qb,
                        q_stride: w,
                        num_heads: heads,
                        seqs: &seqs,
                        scale: 1.0 / (hd as f32).sqrt(),
                        window,
                        softcap: None,
                        sinks: None,
                    };
                    paged_attention_with(kern, &p, &mut out);
                    let got = &out[lead * w..];
                    let want = &whole[start * w..(start + rows) * w];
                    assert!(
                        got.iter()
                            .zip(want)
                            .all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{level:?} chunk {chunk} at {start} {window:?}: differs by {}",
                        max_abs_diff(got, want)
                    );
                    start += rows;
                    // Sample the decode-like chunks sparsely: the whole range is slow.
                    if chunk == 1 && start % 97 == 5 {
                        start += 41;
                    }
                }
            }
        }
    }
}

#[test]
fn rows_are_bit_identical_under_any_chunking_f32() {
    check_chunking_invariance::<f32>();
}

#[test]
fn rows_are_bit_identical_under_any_chunking_bf16() {
    check_chunking_invariance::<bf16>();
}

/// Batched sequences sharing one cache, at different `first_row`s and orders.
#[test]
fn batch_composition_does_not_change_a_row() {
    let mut rng = ChaCha8Rng::seed_from_u64(6);
    let (hd, kv_heads, group, bs) = (20, 2, 3, 8);
    let heads = kv_heads * group;
    let w = heads * hd;
    let layout = KvLayout {
        block_size: bs,
        kv_heads,
        head_dim: hd,
    };
    let ctxs = [400usize, 9, 300];
    let blocks: Vec<usize> = ctxs.iter().map(|c| c.div_ceil(bs)).collect();
    let total: usize = blocks.iter().sum();
    let mut ck = vec![0f32; total * bs * layout.slot_width()];
    let mut cv = ck.clone();
    let mut tables = Vec::new();
    let mut next = 0u32;
    for (&ctx, &nb) in ctxs.iter().zip(&blocks) {
        let table: Vec<u32> = (next..next + nb as u32).rev().collect();
        next += nb as u32;
        let rows = random(&mut rng, ctx * 2 * layout.slot_width(), 1.5);
        let slots: Vec<usize> = (0..ctx)
            .map(|p| table[p / bs] as usize * bs + p % bs)
            .collect();
        write_kv_rows(layout, &mut ck, &mut cv, &rows, &slots);
        tables.push(table);
    }
    // Each sequence's last `rows[i]` positions as queries.
    let qrows = [40usize, 1, 1];
    let qs: Vec<Vec<f32>> = qrows
        .iter()
        .map(|&r| random(&mut rng, r * w, 2.0))
        .collect();
    let kv = PagedKv {
        layout,
        k: &ck,
        v: &cv,
    };
    let run = |kern: &Kernels, order: &[usize]| -> Vec<Vec<f32>> {
        let mut q = Vec::new();
        let mut seqs = Vec::new();
        for &i in order {
            seqs.push(AttentionSeq {
                first_row: q.len() / w,
                rows: qrows[i],
                first_position: ctxs[i] - qrows[i],
                block_table: &tables[i],
                tree: None,
            });
            q.extend_from_slice(&qs[i]);
        }
        let mut out = vec![f32::NAN; q.len()];
        let p = PagedAttention {
            kv,
            q: &q,
            q_stride: w,
            num_heads: heads,
            seqs: &seqs,
            scale: 0.3,
            window: None,
            softcap: None,
            sinks: None,
        };
        paged_attention_with(kern, &p, &mut out);
        let mut per = vec![Vec::new(); ctxs.len()];
        for (s, &i) in seqs.iter().zip(order) {
            per[i] = out[s.first_row * w..(s.first_row + s.rows) * w].to_vec();
        }
        per
    };
    for level in Level::available() {
        let kern = Kernels::for_level(level).unwrap();
        let together = run(kern, &[0, 1, 2]);
        for order in [[2, 0, 1], [1, 2, 0]] {
            let other = run(kern, &order);
            for i in 0..ctxs.len() {
                assert!(
                    together[i]
                        .iter()
                        .zip(&other[i])
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{level:?} seq {i} order {order:?}"
                );
            }
        }
        for i in 0..ctxs.len() {
            let alone = run(kern, &[i]);
            assert!(
                together[i]
                    .iter()
                    .zip(&alone[i])
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{level:?} seq {i} alone"
            );
        }
    }
}

/// bf16 K/V: the kernel equals the f64 reference on the rounded keys and values.
#[test]
fn bf16_cache_matches_reference_on_rounded_kv() {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let round = |x: &[f32]| -> Vec<f32> { x.iter().map(|&a| bf16::from_f32(a).to_f32()).collect() };
    let mut worst = 0f32;
    let mut vs_f32 = 0f32;
    for &(hd, kv_heads, group, bs, ctx, rows) in &[
        (64usize, 3usize, 3usize, 16usize, 530usize, 1usize),
        (20, 2, 4, 3, 90, 31),
        (80, 1, 1, 32, 300, 70),
    ] {
        let heads = kv_heads * group;
        let layout = KvLayout {
            block_size: bs,
            kv_heads,
            head_dim: hd,
        };
        let k = random(&mut rng, ctx * kv_heads * hd, 2.0);
        let v = random(&mut rng, ctx * kv_heads * hd, 1.0);
        let q = random(&mut rng, rows * heads * hd, 2.0);
        let c: Paged<bf16> = paged(&mut rng, layout, &k, &v);
        let first = ctx - rows;
        let shape = heads_of(heads, kv_heads, hd);
        let want = reference(&q, &round(&k), &round(&v), shape, first..ctx, None);
        let exact = reference(&q, &k, &v, shape, first..ctx, None);
        for level in Level::available() {
            let kern = Kernels::for_level(level).unwrap();
            let got = attend(kern, &c, &q, heads, first, rows, None);
            let d = max_abs_diff(&got, &want);
            worst = worst.max(d);
            vs_f32 = vs_f32.max(max_abs_diff(&got, &exact));
            assert!(d < 2e-5, "{level:?} hd {hd}: {d}");
        }
    }
    eprintln!("bf16 cache: max |diff| {worst:e} vs rounded reference, {vs_f32:e} vs f32 K/V");
}

#[test]
fn write_kv_rounds_to_nearest_even() {
    let layout = KvLayout {
        block_size: 1,
        kv_heads: 1,
        head_dim: 2,
    };
    // 1 + 2^-8 is halfway between two bf16 values: ties go to the even one (1.0).
    let src = [1.0 + 1.0 / 256.0, 1.0 + 3.0 / 256.0, -2.5, 7.0];
    let mut ck = vec![bf16::ZERO; 2];
    let mut cv = ck.clone();
    write_kv(
        PagedKvMut {
            layout,
            k: &mut ck,
            v: &mut cv,
        },
        &NewKv {
            rows: &src,
            row_stride: 4,
            k_offset: 0,
            v_offset: 2,
            slots: &[0],
            rope: None,
        },
    );
    assert_eq!(ck[0].to_f32(), 1.0);
    assert_eq!(ck[1].to_f32(), 1.0 + 4.0 / 256.0);
    assert_eq!(cv[0].to_f32(), -2.5);
    assert_eq!(cv[1].to_f32(), 7.0);
}

/// The rayon pool's size changes how work is spread, never a result.
#[test]
fn results_do_not_depend_on_thread_count() {
    let mut rng = ChaCha8Rng::seed_from_u64(8);
    let (hd, kv_heads, group, ctx) = (64, 3, 3, 3 * PARTITION + 10);
    let heads = kv_heads * group;
    let layout = KvLayout {
        block_size: 16,
        kv_heads,
        head_dim: hd,
    };
    let k = random(&mut rng, ctx * kv_heads * hd, 2.0);
    let v = random(&mut rng, ctx * kv_heads * hd, 1.0);
    let q = random(&mut rng, 100 * heads * hd, 2.0);
    let c: Paged<bf16> = paged(&mut rng, layout, &k, &v);
    for level in Level::available() {
        let kern = Kernels::for_level(level).unwrap();
        let on = |threads: usize, rows: usize| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap()
                .install(|| {
                    attend(
                        kern,
                        &c,
                        &q[..rows * heads * hd],
                        heads,
                        ctx - rows,
                        rows,
                        None,
                    )
                })
        };
        for rows in [1, 100] {
            let one = on(1, rows);
            for threads in [2, 5] {
                let many = on(threads, rows);
                assert!(
                    one.iter()
                        .zip(&many)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{level:?} {rows} rows on {threads} threads"
                );
            }
        }
    }
}

/// Many decode rows at once take whole slots per item (all KV heads, see `flash`); each row
/// must still be the bits it is alone, where items take one KV head.
fn check_many_decode_rows<T: KvElem>() {
    let mut rng = ChaCha8Rng::seed_from_u64(8);
    let (hd, kv_heads, group, bs) = (64, 3, 3, 16);
    let ctx = 600;
    let heads = kv_heads * group;
    let w = heads * hd;
    let layout = KvLayout {
        block_size: bs,
        kv_heads,
        head_dim: hd,
    };
    let k = random(&mut rng, ctx * kv_heads * hd, 2.0);
    let v = random(&mut rng, ctx * kv_heads * hd, 1.0);
    let c: Paged<T> = paged(&mut rng, layout, &k, &v);
    let positions = [
        5usize, 17, 255, 256, 300, 599, 40, 128, 511, 512, 77, 33, 16, 271,
    ];
    let q = random(&mut rng, positions.len() * w, 2.0);
    for window in [None, Some(100)] {
        for level in Level::available() {
            let kern = Kernels::for_level(level).unwrap();
            let seqs: Vec<AttentionSeq<'_>> = positions
                .iter()
                .enumerate()
                .map(|(i, &p)| AttentionSeq {
                    first_row: i,
                    rows: 1,
                    first_position: p,
                    block_table: &c.table,
                    tree: None,
                })
                .collect();
            let mut batched = vec![f32::NAN; positions.len() * w];
            let p = PagedAttention {
                kv: c.pages(),
                q: &q,
                q_stride: w,
                num_heads: heads,
                seqs: &seqs,
                scale: 1.0 / (hd as f32).sqrt(),
                window,
                softcap: None,
                sinks: None,
            };
            paged_attention_with(kern, &p, &mut batched);
            for (i, &p) in positions.iter().enumerate() {
                let alone = attend(kern, &c, &q[i * w..(i + 1) * w], heads, p, 1, window);
                assert!(
                    alone
                        .iter()
                        .zip(&batched[i * w..(i + 1) * w])
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{level:?} window {window:?}: the row at position {p} changed in a batch"
                );
            }
        }
    }
}

#[test]
fn decode_rows_are_bit_identical_in_large_batches_f32() {
    check_many_decode_rows::<f32>();
}

#[test]
fn decode_rows_are_bit_identical_in_large_batches_bf16() {
    check_many_decode_rows::<half::bf16>();
}

/// Rotating keys on their way into the cache stores the bits of rotating them in place first.
fn check_rotated_write<T: KvElem + PartialEq + std::fmt::Debug>() {
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    let layout = KvLayout {
        block_size: 4,
        kv_heads: 2,
        head_dim: 8,
    };
    let (heads, w) = (4, layout.slot_width());
    let stride = (heads * layout.head_dim) + 2 * w + 3;
    let (ko, vo) = (heads * layout.head_dim, heads * layout.head_dim + w);
    let tokens = 5;
    let src = random(&mut rng, tokens * stride, 3.0);
    let slots = [7usize, 2, 9, 0, 4];
    let inv_freq = [1.0f32, 0.3, 0.05, 0.001];
    let (cos, sin) = crate::cpu::rope::cos_sin(&inv_freq, &[3, 17, 100, 2000, 5]);
    let cache = || vec![T::default(); 12 * w];
    let (mut k1, mut v1, mut k2, mut v2) = (cache(), cache(), cache(), cache());
    let mut rotated = src.clone();
    crate::cpu::rope::apply_rope(&mut rotated, stride, ko, layout.kv_heads, 8, &cos, &sin);
    let new = |rows, rope| NewKv {
        rows,
        row_stride: stride,
        k_offset: ko,
        v_offset: vo,
        slots: &slots,
        rope,
    };
    let (k, v) = (&mut k1, &mut v1);
    write_kv(PagedKvMut { layout, k, v }, &new(&rotated, None));
    let (k, v) = (&mut k2, &mut v2);
    write_kv(PagedKvMut { layout, k, v }, &new(&src, Some((&cos, &sin))));
    assert_eq!(k1, k2);
    assert_eq!(v1, v2);
}

#[test]
fn keys_rotated_while_written_equal_rotated_then_written() {
    check_rotated_write::<f32>();
    check_rotated_write::<half::bf16>();
}

/// A random single-sequence problem of the tests that compare a scoring option against the
/// naive kernel: `rows` query rows at the end of a `ctx`-token context.
struct OptionCase {
    c: Paged<f32>,
    q: Vec<f32>,
    heads: usize,
    hd: usize,
    rows: usize,
    first: usize,
    window: Option<usize>,
}

impl OptionCase {
    fn new(
        rng: &mut ChaCha8Rng,
        (hd, kv_heads, group, bs, ctx, rows, window): (
            usize,
            usize,
            usize,
            usize,
            usize,
            usize,
            Option<usize>,
        ),
    ) -> Self {
        let heads = kv_heads * group;
        let layout = KvLayout {
            block_size: bs,
            kv_heads,
            head_dim: hd,
        };
        let k = random(rng, ctx * kv_heads * hd, 3.0);
        let v = random(rng, ctx * kv_heads * hd, 1.0);
        let q = random(rng, rows * heads * hd, 3.0);
        let c = paged(rng, layout, &k, &v);
        Self {
            c,
            q,
            heads,
            hd,
            rows,
            first: ctx - rows,
            window,
        }
    }

    /// The output of rows `from..` (all of them, or the last alone), by the tiled or the
    /// naive kernel.
    fn run(
        &self,
        from: usize,
        softcap: Option<f32>,
        sinks: Option<&[f32]>,
        naive: bool,
    ) -> Vec<f32> {
        let w = self.heads * self.hd;
        let seqs = [AttentionSeq {
            first_row: 0,
            rows: self.rows - from,
            first_position: self.first + from,
            block_table: &self.c.table,
            tree: None,
        }];
        let p = PagedAttention {
            kv: self.c.pages(),
            q: &self.q[from * w..],
            q_stride: w,
            num_heads: self.heads,
            seqs: &seqs,
            scale: 1.0 / (self.hd as f32).sqrt(),
            window: self.window,
            softcap,
            sinks,
        };
        let mut out = vec![f32::NAN; p.out_len()];
        match naive {
            true => paged_attention_naive(kernels(), &p, &mut out),
            false => paged_attention(&p, &mut out),
        }
        out
    }
}

/// Soft-capped scores: the tiled kernel agrees with the naive one (which caps each score as it
/// computes it), capping moves the result, and a row's bits are the same alone and in a chunk.
#[test]
fn soft_capped_attention_matches_the_naive_kernel_and_stays_row_invariant() {
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    for shape in [
        (16usize, 2usize, 2usize, 16usize, 300usize, 40usize, None),
        (8, 1, 3, 5, 70, 70, Some(9)),
        (20, 2, 1, 16, 40, 1, None),
    ] {
        let case = OptionCase::new(&mut rng, shape);
        let (hd, w, last) = (case.hd, case.heads * case.hd, case.rows - 1);
        let capped = case.run(0, Some(2.0), None, false);
        let naive = case.run(0, Some(2.0), None, true);
        let d = max_abs_diff(&capped, &naive);
        assert!(d < 2e-5, "hd {hd}: tiled vs naive {d}");
        let uncapped = case.run(0, None, None, false);
        assert!(
            max_abs_diff(&capped, &uncapped) > 1e-2,
            "the cap changed nothing"
        );
        let one = case.run(last, Some(2.0), None, false);
        assert_eq!(
            one,
            capped[last * w..],
            "hd {hd}: the last row alone differs"
        );
    }
}

/// Attention sinks: the tiled kernel agrees with the naive one (which puts the sink in its max
/// and sum), every head's output is its sink-free output scaled by one factor in (0, 1], and a
/// row's bits are the same alone and in a chunk.
#[test]
fn sinks_join_the_denominator_alone_and_in_a_batch() {
    let mut rng = ChaCha8Rng::seed_from_u64(29);
    for shape in [
        (16usize, 2usize, 2usize, 16usize, 300usize, 40usize, Some(8)),
        (8, 1, 3, 5, 70, 70, None),
        (20, 2, 1, 16, 600, 1, None),
    ] {
        let case = OptionCase::new(&mut rng, shape);
        let (hd, heads, w, last) = (case.hd, case.heads, case.heads * case.hd, case.rows - 1);
        // From far below the scores to far above them.
        let sinks: Vec<f32> = (0..heads).map(|h| h as f32 * 15.0 - 6.0).collect();
        let sunk = case.run(0, None, Some(&sinks), false);
        let naive = case.run(0, None, Some(&sinks), true);
        let d = max_abs_diff(&sunk, &naive);
        assert!(d < 2e-5, "hd {hd}: tiled vs naive {d}");
        let plain = case.run(0, None, None, false);
        assert!(
            max_abs_diff(&sunk, &plain) > 1e-2,
            "the sinks changed nothing"
        );
        for (i, (s, p)) in sunk
            .chunks_exact(hd)
            .zip(plain.chunks_exact(hd))
            .enumerate()
        {
            let ratio = s
                .iter()
                .zip(p)
                .find(|(_, p)| p.abs() > 1e-3)
                .map(|(s, p)| s / p)
                .expect("a nonzero output value");
            assert!((0.0..=1.0 + 1e-5).contains(&ratio), "vector {i}: {ratio}");
            for (s, p) in s.iter().zip(p) {
                assert!((s - p * ratio).abs() < 1e-4, "vector {i}: one scale");
            }
        }
        let one = case.run(last, None, Some(&sinks), false);
        assert_eq!(one, sunk[last * w..], "hd {hd}: the last row alone differs");
    }
}
