//! Causal attention that reads keys and values from paged KV blocks.
//!
//! A layer's V cache is `[num_blocks, block_size, kv_heads, head_dim]` and its K cache
//! `[num_blocks, kv_heads, head_dim, block_size]`: keys are stored transposed within a block, so
//! a tile of consecutive positions is already the `[head_dim][positions]` layout the score
//! kernels multiply (see [`KvLayout::key_at`]). A sequence's token at position `p` lives in slot
//! `block_table[p / block_size] * block_size + p % block_size`. Query heads share KV heads in
//! groups (GQA) without copying K/V.
//!
//! [`paged_attention`] is the tiled kernel of `flash` (its inner loops per level in `tile`
//! and the `arch` modules); the cache elements are `f32` or `bf16` (`kv`).

mod flash;
mod kv;
pub(crate) mod tile;

use rayon::prelude::*;

use super::dispatch::{Kernels, kernels};
pub use kv::{KvElem, write_kv};

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

    /// The cache slot of `position` in a sequence with `block_table`.
    pub fn slot(&self, block_table: &[u32], position: usize) -> usize {
        slot(block_table, self.block_size, position)
    }

    /// Where `slot`'s key for `kv_head` starts in the K cache: its element `d` is at
    /// `key_at(slot, kv_head) + d * block_size`.
    pub fn key_at(&self, slot: usize, kv_head: usize) -> usize {
        let (block, offset) = (slot / self.block_size, slot % self.block_size);
        (block * self.kv_heads + kv_head) * self.head_dim * self.block_size + offset
    }
}

/// The cache slot of `position` in a sequence with `block_table`, for blocks of `block_size`.
pub fn slot(block_table: &[u32], block_size: usize, position: usize) -> usize {
    block_table[position / block_size] as usize * block_size + position % block_size
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

/// Causal (optionally sliding-window) attention for every query row of every sequence.
///
/// `q` rows are `q_stride` apart with the `num_heads` query heads at the start of each row;
/// `out` is `[rows, num_heads * head_dim]`. A query at position `p` sees the cached positions
/// `p - window + 1 ..= p` (all of `0..=p` without a window), as transformers' masks do. The
/// cache holds `f32` or `bf16` elements (see [`KvElem`]).
#[allow(clippy::too_many_arguments)]
pub fn paged_attention<T: KvElem>(
    layout: KvLayout,
    cache_k: &[T],
    cache_v: &[T],
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
pub fn paged_attention_with<T: KvElem>(
    kernels: &Kernels,
    layout: KvLayout,
    cache_k: &[T],
    cache_v: &[T],
    q: &[f32],
    q_stride: usize,
    num_heads: usize,
    seqs: &[AttentionSeq<'_>],
    scale: f32,
    window: Option<usize>,
    out: &mut [f32],
) {
    let rows: usize = seqs.iter().map(|s| s.rows).sum();
    assert_eq!(out.len(), rows * num_heads * layout.head_dim);
    flash::flash_attention(
        kernels, layout, cache_k, cache_v, q, q_stride, num_heads, seqs, scale, window, out,
    )
}

/// The previous kernel, one task per (row, head) with a score buffer and libm's `exp`: kept
/// as the baseline benchmarks compare against, and as a second opinion in tests. f32 only.
#[allow(clippy::too_many_arguments)]
pub fn paged_attention_naive(
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
                layout,
                kv_head: head / group,
                first: window.map_or(0, |w| (pos + 1).saturating_sub(w)),
                last: pos,
                scale,
            };
            attend(&query, cache_k, cache_v, scores, o);
        });
}

/// Prefetches `rows` rows of `width` values, `stride` apart from `base` (each cache line once,
/// when rows share lines): into L1 for reading, or with `WRITE` in a state to be written.
#[inline]
pub(crate) fn prefetch_rows<const WRITE: bool, T>(
    data: &[T],
    base: usize,
    stride: usize,
    width: usize,
    rows: usize,
) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_MM_HINT_ET0, _MM_HINT_T0, _mm_prefetch};
        let p = data.as_ptr().cast::<i8>();
        let mut next = 0;
        for j in 0..rows {
            let start = (base + j * stride) * size_of::<T>();
            let end = start + width * size_of::<T>();
            let mut line = (start / 64 * 64).max(next);
            while line < end {
                let at = p.wrapping_add(line);
                // SAFETY: a prefetch never faults, whatever the address; `wrapping_add` keeps
                // the pointer arithmetic defined past the slice's end.
                #[allow(unsafe_code)]
                unsafe {
                    if WRITE {
                        _mm_prefetch::<_MM_HINT_ET0>(at)
                    } else {
                        _mm_prefetch::<_MM_HINT_T0>(at)
                    }
                };
                line += 64;
            }
            next = line;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (data, base, stride, width, rows);
}

/// One query head of one row, and where its keys and values are.
pub(crate) struct HeadQuery<'a> {
    pub(crate) q: &'a [f32],
    pub(crate) block_table: &'a [u32],
    pub(crate) layout: KvLayout,
    pub(crate) kv_head: usize,
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
    let (hd, bs) = (hq.q.len(), hq.layout.block_size);
    let slot = |p: usize| hq.layout.slot(hq.block_table, p);
    let base = |p: usize| slot(p) * hq.layout.slot_width() + hq.kv_head * hd;
    let mut key = vec![0f32; hd];
    scores.clear();
    scores.extend((hq.first..=hq.last).map(|p| {
        let k0 = hq.layout.key_at(slot(p), hq.kv_head);
        for (d, x) in key.iter_mut().enumerate() {
            *x = cache_k[k0 + d * bs];
        }
        dot(hq.q, &key) * hq.scale
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
mod perf;
#[cfg(test)]
mod tests;
