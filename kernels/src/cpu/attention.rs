//! Causal attention that reads keys and values from paged KV blocks.
//!
//! A layer's cache is `[num_blocks, block_size, kv_heads, head_dim]` for K and for V; a
//! sequence's token at position `p` lives in slot `block_table[p / block_size] * block_size +
//! p % block_size`. Query heads share KV heads in groups (GQA) without copying K/V.

use rayon::prelude::*;

use super::dispatch::{Kernels, kernels};

/// Shape of one layer's paged cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvLayout {
    /// Tokens per block.
    pub block_size: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
}

impl KvLayout {
    /// Values in one slot (one token's K, or V).
    pub fn slot_width(&self) -> usize {
        self.kv_heads * self.head_dim
    }
}

/// The queries of one sequence in a flattened batch.
#[derive(Debug, Clone, Copy)]
pub struct AttentionSeq<'a> {
    /// Index of the sequence's first query row in the batch.
    pub first_row: usize,
    /// Number of query rows (a prefill chunk, or 1 when decoding).
    pub rows: usize,
    /// Position of the first query row; rows are consecutive positions.
    pub first_position: usize,
    /// Block ids covering positions `0..first_position + rows`.
    pub block_table: &'a [u32],
}

/// Copies each token's K and V rows into its cache slot. `k_src`/`v_src` rows are read at
/// `row_stride` intervals from `offset_k`/`offset_v` (they can live inside a fused qkv buffer).
#[allow(clippy::too_many_arguments)]
pub fn write_kv(
    layout: KvLayout,
    cache_k: &mut [f32],
    cache_v: &mut [f32],
    src: &[f32],
    row_stride: usize,
    offset_k: usize,
    offset_v: usize,
    slot_mapping: &[usize],
) {
    let w = layout.slot_width();
    for (t, &slot) in slot_mapping.iter().enumerate() {
        let row = &src[t * row_stride..(t + 1) * row_stride];
        cache_k[slot * w..(slot + 1) * w].copy_from_slice(&row[offset_k..offset_k + w]);
        cache_v[slot * w..(slot + 1) * w].copy_from_slice(&row[offset_v..offset_v + w]);
    }
}

/// Causal (optionally sliding-window) attention for every query row of every sequence.
///
/// `q` rows are `q_stride` apart with the `num_heads` query heads at the start of each row;
/// `out` is `[rows, num_heads * head_dim]`. A query at position `p` sees the cached positions
/// `p - window + 1 ..= p` (all of `0..=p` without a window), as transformers' masks do.
#[allow(clippy::too_many_arguments)]
pub fn paged_attention(
    layout: KvLayout,
    cache_k: &[f32],
    cache_v: &[f32],
    q: &[f32],
    q_stride: usize,
    num_heads: usize,
    seqs: &[AttentionSeq<'_>],
    scale: f32,
    window: Option<usize>,
    out: &mut [f32],
) {
    paged_attention_with(
        kernels(),
        layout,
        cache_k,
        cache_v,
        q,
        q_stride,
        num_heads,
        seqs,
        scale,
        window,
        out,
    )
}

/// [`paged_attention`] with an explicit level's kernels.
#[allow(clippy::too_many_arguments)]
pub fn paged_attention_with(
    kernels: &Kernels,
    layout: KvLayout,
    cache_k: &[f32],
    cache_v: &[f32],
    q: &[f32],
    q_stride: usize,
    num_heads: usize,
    seqs: &[AttentionSeq<'_>],
    scale: f32,
    window: Option<usize>,
    out: &mut [f32],
) {
    let hd = layout.head_dim;
    let group = num_heads / layout.kv_heads;
    let rows: usize = seqs.iter().map(|s| s.rows).sum();
    assert_eq!(out.len(), rows * num_heads * hd);
    // (sequence, position) of every row, so that (row, head) tasks can run in any order.
    let mut row_owner = vec![(0usize, 0usize); rows];
    for (si, s) in seqs.iter().enumerate() {
        for r in 0..s.rows {
            row_owner[s.first_row + r] = (si, s.first_position + r);
        }
    }
    let attend = kernels.attend;
    let w = layout.slot_width();
    // Small tasks are grouped so that scheduling does not dominate short contexts.
    let min_len = (64 / hd.max(1)).max(1);
    out.par_chunks_mut(hd)
        .enumerate()
        .with_min_len(min_len)
        // One score buffer per rayon split, reused by its tasks.
        .for_each_init(Vec::new, |scores: &mut Vec<f32>, (task, o)| {
            let (row, head) = (task / num_heads, task % num_heads);
            let (si, pos) = row_owner[row];
            let seq = &seqs[si];
            let query = HeadQuery {
                q: &q[row * q_stride + head * hd..row * q_stride + (head + 1) * hd],
                block_table: seq.block_table,
                block_size: layout.block_size,
                slot_width: w,
                kv_offset: (head / group) * hd,
                first: window.map_or(0, |w| (pos + 1).saturating_sub(w)),
                last: pos,
                scale,
            };
            attend(&query, cache_k, cache_v, scores, o);
        });
}

/// One query head of one row, and where its keys and values are.
pub(crate) struct HeadQuery<'a> {
    pub(crate) q: &'a [f32],
    pub(crate) block_table: &'a [u32],
    pub(crate) block_size: usize,
    pub(crate) slot_width: usize,
    /// Offset of the KV head inside a slot.
    pub(crate) kv_offset: usize,
    /// Positions `first..=last` are attended to.
    pub(crate) first: usize,
    pub(crate) last: usize,
    pub(crate) scale: f32,
}

/// Softmax attention of one query head, with a level's `dot` and `axpy` inlined: scores,
/// max-subtracted `exp` (libm's), then `out = Σ (e_p / Σe) · v_p` in position order.
#[inline(always)]
pub(crate) fn attend_head(
    hq: &HeadQuery<'_>,
    cache_k: &[f32],
    cache_v: &[f32],
    scores: &mut Vec<f32>,
    out: &mut [f32],
    dot: impl Fn(&[f32], &[f32]) -> f32,
    axpy: impl Fn(f32, &[f32], &mut [f32]),
) {
    let hd = hq.q.len();
    let base = |p: usize| {
        (hq.block_table[p / hq.block_size] as usize * hq.block_size + p % hq.block_size)
            * hq.slot_width
            + hq.kv_offset
    };
    scores.clear();
    scores.extend((hq.first..=hq.last).map(|p| {
        let b = base(p);
        dot(hq.q, &cache_k[b..b + hd]) * hq.scale
    }));
    let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f32;
    for s in scores.iter_mut() {
        *s = (*s - max).exp();
        sum += *s;
    }
    out.fill(0.0);
    for (p, s) in (hq.first..=hq.last).zip(scores.iter()) {
        let b = base(p);
        axpy(s / sum, &cache_v[b..b + hd], out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// Dense reference: contiguous K/V per sequence, f64 softmax.
    #[allow(clippy::too_many_arguments)]
    fn reference(
        q: &[f32],
        k: &[f32],
        v: &[f32],
        heads: usize,
        kv_heads: usize,
        hd: usize,
        first_pos: usize,
        rows: usize,
        window: Option<usize>,
    ) -> Vec<f32> {
        let scale = 1.0 / (hd as f64).sqrt();
        let mut out = vec![0f32; rows * heads * hd];
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
                for (i, p) in (lo..=pos).enumerate() {
                    let pr = (s[i] - m).exp() / z;
                    for d in 0..hd {
                        out[(r * heads + h) * hd + d] +=
                            (pr * v[(p * kv_heads + g) * hd + d] as f64) as f32;
                    }
                }
            }
        }
        out
    }

    #[test]
    fn paged_matches_dense_with_gqa_and_window() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        // head_dim below, above and at a multiple of the 16 lanes.
        for hd in [8usize, 20, 64] {
            let (heads, kv_heads, bs) = (4, 2, 4);
            let layout = KvLayout {
                block_size: bs,
                kv_heads,
                head_dim: hd,
            };
            let ctx = 11;
            let k: Vec<f32> = (0..ctx * kv_heads * hd)
                .map(|_| rng.random_range(-1.0..1.0))
                .collect();
            let v: Vec<f32> = (0..ctx * kv_heads * hd)
                .map(|_| rng.random_range(-1.0..1.0))
                .collect();
            // Scatter into non-contiguous blocks.
            let block_table = [5u32, 2, 7];
            let mut ck = vec![0f32; 8 * bs * layout.slot_width()];
            let mut cv = ck.clone();
            let kv_rows: Vec<f32> = (0..ctx)
                .flat_map(|p| {
                    let w = layout.slot_width();
                    k[p * w..(p + 1) * w]
                        .iter()
                        .chain(&v[p * w..(p + 1) * w])
                        .copied()
                        .collect::<Vec<_>>()
                })
                .collect();
            let slots: Vec<usize> = (0..ctx)
                .map(|p| block_table[p / bs] as usize * bs + p % bs)
                .collect();
            write_kv(
                layout,
                &mut ck,
                &mut cv,
                &kv_rows,
                2 * layout.slot_width(),
                0,
                layout.slot_width(),
                &slots,
            );
            for window in [None, Some(3)] {
                let (first, rows) = (6, 5);
                let q: Vec<f32> = (0..rows * heads * hd)
                    .map(|_| rng.random_range(-1.0..1.0))
                    .collect();
                let seq = AttentionSeq {
                    first_row: 0,
                    rows,
                    first_position: first,
                    block_table: &block_table,
                };
                let want = reference(&q, &k, &v, heads, kv_heads, hd, first, rows, window);
                for level in crate::cpu::Level::available() {
                    let kernels = Kernels::for_level(level).unwrap();
                    let mut out = vec![0f32; rows * heads * hd];
                    let scale = 1.0 / (hd as f32).sqrt();
                    paged_attention_with(
                        kernels,
                        layout,
                        &ck,
                        &cv,
                        &q,
                        heads * hd,
                        heads,
                        &[seq],
                        scale,
                        window,
                        &mut out,
                    );
                    for (a, b) in out.iter().zip(&want) {
                        assert!(
                            (a - b).abs() < 1e-5,
                            "{level:?} hd {hd} {window:?}: {a} vs {b}"
                        );
                    }
                }
            }
        }
    }
}
