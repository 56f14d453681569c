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
pub use kv::{KvElem, NewKv, write_kv};

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
    /// The rows form a token tree (speculative verification) instead of a chain.
    pub tree: Option<TreeMask<'a>>,
}

impl AttentionSeq<'_> {
    /// The position row `r` stands at in its sequence: what a sliding window counts from.
    /// Row `r`'s K/V live in the slot of `first_position + r` whatever the tree.
    pub fn token_position(&self, r: usize) -> usize {
        self.first_position + self.tree.map_or(r, |t| t.depths[r] as usize)
    }
}

/// A sequence's query rows laid out as a tree of candidate tokens, root first and in
/// breadth-first order. A row sees every cached position before the root, and of the rows
/// only itself and its ancestors; its K/V are written to the slot of `first_position + r`.
#[derive(Debug, Clone, Copy)]
pub struct TreeMask<'a> {
    /// Per row, bit `i` set where row `i` is the row itself or one of its ancestors (bit 0,
    /// the root, always). At most [`TreeMask::MAX_ROWS`] rows.
    pub visible: &'a [u64],
    /// Per row, its depth below the root (the root 0), non-decreasing.
    pub depths: &'a [u32],
}

impl TreeMask<'_> {
    /// Rows a tree can have.
    pub const MAX_ROWS: usize = 64;

    /// Whether every row sees all rows before it: consecutive positions, the causal case.
    pub fn is_chain(&self) -> bool {
        self.visible
            .iter()
            .enumerate()
            .all(|(r, &v)| r < Self::MAX_ROWS && v == u64::MAX >> (63 - r))
    }

    /// Whether row `r` sees row `i`.
    pub fn sees(&self, r: usize, i: usize) -> bool {
        i < Self::MAX_ROWS && (self.visible[r] >> i) & 1 == 1
    }
}

/// One layer's paged K and V caches, laid out as [`KvLayout`] describes, in `f32` or `bf16`
/// elements (see [`KvElem`]).
#[derive(Debug, Clone, Copy)]
pub struct PagedKv<'a, T> {
    /// Shape of the caches.
    pub layout: KvLayout,
    /// The K cache, `[num_blocks, kv_heads, head_dim, block_size]`.
    pub k: &'a [T],
    /// The V cache, `[num_blocks, block_size, kv_heads, head_dim]`.
    pub v: &'a [T],
}

/// [`PagedKv`], writable: where [`write_kv`] stores new tokens.
#[derive(Debug)]
pub struct PagedKvMut<'a, T> {
    /// Shape of the caches.
    pub layout: KvLayout,
    /// The K cache, `[num_blocks, kv_heads, head_dim, block_size]`.
    pub k: &'a mut [T],
    /// The V cache, `[num_blocks, block_size, kv_heads, head_dim]`.
    pub v: &'a mut [T],
}

/// Causal (optionally sliding-window) attention of a flattened batch's query rows over a
/// layer's paged cache.
///
/// `q` rows are `q_stride` apart with the `num_heads` query heads at the start of each row;
/// the output is `[rows, num_heads * head_dim]` ([`Self::out_len`] values). A query at
/// position `p` sees the cached positions `p - window + 1 ..= p` (all of `0..=p` without a
/// window), as transformers' masks do.
#[derive(Debug, Clone, Copy)]
pub struct PagedAttention<'a, T> {
    /// The layer's cache, the batch's new keys and values already written.
    pub kv: PagedKv<'a, T>,
    /// The query rows.
    pub q: &'a [f32],
    /// Values from one query row to the next.
    pub q_stride: usize,
    /// Query heads per row (a multiple of the cache's KV heads: GQA groups).
    pub num_heads: usize,
    /// The sequences whose rows make up the batch.
    pub seqs: &'a [AttentionSeq<'a>],
    /// Factor of every score (`1 / √head_dim` for the usual softmax attention).
    pub scale: f32,
    /// How many positions back a query sees, itself included; `None`: all of them.
    pub window: Option<usize>,
    /// Soft-capping of the scaled scores, `cap · tanh(score / cap)` before the softmax
    /// (Gemma 2); `None`: scores as they are.
    pub softcap: Option<f32>,
    /// Per query head, a learned logit that joins each softmax's denominator and no value
    /// (gpt-oss's attention sinks): the weights of the keys then sum to less than 1. `None`:
    /// none.
    pub sinks: Option<&'a [f32]>,
}

/// `cap · tanh(score / cap)`, as transformers computes it (divide, tanh, multiply).
#[inline]
pub fn softcap(score: f32, cap: f32) -> f32 {
    (score / cap).tanh() * cap
}

impl<T> PagedAttention<'_, T> {
    /// Query rows of all sequences.
    pub fn rows(&self) -> usize {
        self.seqs.iter().map(|s| s.rows).sum()
    }

    /// Values of the output: `[rows, num_heads * head_dim]`.
    pub fn out_len(&self) -> usize {
        self.rows() * self.num_heads * self.kv.layout.head_dim
    }
}

/// Attention of every query row of every sequence of `p` into `out` (see [`PagedAttention`]).
pub fn paged_attention<T: KvElem>(p: &PagedAttention<'_, T>, out: &mut [f32]) {
    paged_attention_with(kernels(), p, out)
}

/// [`paged_attention`] with an explicit level's kernels.
pub fn paged_attention_with<T: KvElem>(
    kernels: &Kernels,
    p: &PagedAttention<'_, T>,
    out: &mut [f32],
) {
    assert_eq!(out.len(), p.out_len());
    flash::flash_attention(kernels, p, out)
}

/// A simpler kernel, one task per (row, head) with a score buffer and libm's `exp`: the
/// baseline benchmarks compare against, and a second opinion in tests. f32 only.
pub fn paged_attention_naive(kernels: &Kernels, p: &PagedAttention<'_, f32>, out: &mut [f32]) {
    let PagedAttention {
        kv,
        q,
        q_stride,
        num_heads,
        seqs,
        scale,
        window,
        softcap,
        sinks,
    } = *p;
    let layout = kv.layout;
    let hd = layout.head_dim;
    let group = num_heads / layout.kv_heads;
    let rows = p.rows();
    assert_eq!(out.len(), p.out_len());
    // (sequence, position) of every row, so that (row, head) tasks can run in any order.
    let mut row_owner = vec![(0usize, 0usize); rows];
    for (si, s) in seqs.iter().enumerate() {
        for r in 0..s.rows {
            row_owner[s.first_row + r] = (si, r);
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
            let (si, r) = row_owner[row];
            let seq = &seqs[si];
            let pos = seq.first_position + r;
            let query = HeadQuery {
                q: &q[row * q_stride + head * hd..row * q_stride + (head + 1) * hd],
                block_table: seq.block_table,
                layout,
                kv_head: head / group,
                first: window.map_or(0, |w| (seq.token_position(r) + 1).saturating_sub(w)),
                last: pos,
                tree: seq.tree.map(|t| (seq.first_position, t.visible[r])),
                scale,
                softcap,
                sink: sinks.map(|s| s[head]),
            };
            attend(&query, kv.k, kv.v, scores, o);
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
    /// In a token tree: the root's position and which rows from it on are seen (bit `i`:
    /// position `root + i`).
    pub(crate) tree: Option<(usize, u64)>,
    pub(crate) scale: f32,
    pub(crate) softcap: Option<f32>,
    /// The head's attention sink logit, if any.
    pub(crate) sink: Option<f32>,
}

/// Softmax attention of one query head, with a level's `dot` and `axpy` inlined: scores,
/// max-subtracted `exp` (libm's; a sink's logit in the max and the sum), then
/// `out = Σ (e_p / Σe) · v_p` in position order.
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
        let score = dot(hq.q, &key) * hq.scale;
        let hidden = hq.tree.is_some_and(|(root, visible)| {
            p > root && (p - root >= TreeMask::MAX_ROWS || (visible >> (p - root)) & 1 == 0)
        });
        if hidden {
            f32::NEG_INFINITY
        } else {
            hq.softcap.map_or(score, |cap| softcap(score, cap))
        }
    }));
    let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let max = hq.sink.map_or(max, |s| max.max(s));
    let mut sum = hq.sink.map_or(0.0, |s| (s - max).exp());
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
#[cfg(test)]
mod tree_tests;
