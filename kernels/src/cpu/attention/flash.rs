//! Tiled ("flash") attention over the paged cache, batch-invariant by construction.
//!
//! Keys are cut at absolute positions: tiles of `KEY_TILE` positions, grouped into partitions
//! of [`PARTITION`] positions. For one query row and head, each partition's keys are folded
//! into a fresh online-softmax state (running max `m`, sum `l`, accumulator) tile by tile,
//! in position order; the partitions' states are then merged left to right. None of this
//! depends on which other rows or heads share the work, so a row computes the same bits in a
//! 1-row decode, a 7-row chunk or a 512-row prefill, and on any number of threads.
//!
//! Work items are (sequence, KV head, tile of query rows): the query heads of one GQA group
//! and up to [`QUERY_TILE`] rows share each K/V tile, loaded (and widened, and the keys
//! transposed) once. A sequence whose rows fit in one query tile (decode) is further split by
//! partition, so one long context spreads over threads; its partition states are merged in
//! the same order the single-item path merges them.

use rayon::prelude::*;

use super::kv::KvElem;
use super::tile::{KEY_TILE, Rows, TileOps};
use super::{AttentionSeq, KvLayout};
use crate::cpu::dispatch::Kernels;

/// Key positions per partition: the unit of decode parallelism (a multiple of `KEY_TILE`).
pub(crate) const PARTITION: usize = 256;
/// Query rows per work item.
pub(crate) const QUERY_TILE: usize = 32;

const _: () = assert!(PARTITION.is_multiple_of(KEY_TILE));

/// Everything a work item reads.
struct Ctx<'a, T> {
    kernels: &'a Kernels,
    ops: TileOps,
    layout: KvLayout,
    cache_k: &'a [T],
    cache_v: &'a [T],
    q: &'a [f32],
    q_stride: usize,
    /// Query heads per KV head.
    group: usize,
    /// `scale · log2(e)`: scores come out in the log2 domain.
    q_scale: f32,
    window: Option<usize>,
}

impl<T> Ctx<'_, T> {
    /// First position a query at `pos` attends to.
    fn first_key(&self, pos: usize) -> usize {
        self.window
            .map_or(0, |w| (pos + 1).saturating_sub(w.max(1)))
    }
}

/// One work item: rows `r0..r1` (relative to the sequence) of one KV head's query heads,
/// over all their keys, or over one partition of them.
#[derive(Debug, Clone, Copy)]
struct Task {
    seq: usize,
    kv_head: usize,
    r0: usize,
    r1: usize,
    part: Option<usize>,
}

/// Online-softmax state of `n` query vectors (row-major over rows, then heads).
#[derive(Clone)]
struct State {
    m: Vec<f32>,
    l: Vec<f32>,
    acc: Vec<f32>,
}

impl State {
    fn new(n: usize, hd: usize) -> Self {
        Self {
            m: vec![f32::NEG_INFINITY; n],
            l: vec![0.0; n],
            acc: vec![0.0; n * hd],
        }
    }

    fn reset(&mut self) {
        self.m.fill(f32::NEG_INFINITY);
        self.l.fill(0.0);
        self.acc.fill(0.0);
    }

    /// Folds a partition's state into this running one. Vectors the partition did not touch
    /// (`m = -inf`) are skipped, so skipping a partition and folding an empty one agree.
    fn fold(&mut self, part: &State, hd: usize) {
        for i in 0..self.m.len() {
            let mp = part.m[i];
            if mp == f32::NEG_INFINITY {
                continue;
            }
            let (acc, pacc) = (
                &mut self.acc[i * hd..(i + 1) * hd],
                &part.acc[i * hd..(i + 1) * hd],
            );
            if self.m[i] == f32::NEG_INFINITY {
                self.m[i] = mp;
                self.l[i] = part.l[i];
                acc.copy_from_slice(pacc);
                continue;
            }
            let m = self.m[i].max(mp);
            let (a, b) = ((self.m[i] - m).exp2(), (mp - m).exp2());
            self.m[i] = m;
            self.l[i] = self.l[i] * a + part.l[i] * b;
            for (x, &y) in acc.iter_mut().zip(pacc) {
                *x = *x * a + y * b;
            }
        }
    }

    /// `acc / l`: the attention output of every vector.
    fn finish(&self, hd: usize, out: &mut [f32]) {
        for ((o, acc), &l) in out
            .chunks_exact_mut(hd)
            .zip(self.acc.chunks_exact(hd))
            .zip(&self.l)
        {
            for (x, &a) in o.iter_mut().zip(acc) {
                *x = a / l;
            }
        }
    }
}

/// Per-item buffers: the scaled queries, one K tile (and transposed), one V tile, the scores.
struct Scratch {
    q: Vec<f32>,
    /// Keys as loaded (`[KEY_TILE][hd]`), then transposed into `kt`.
    ks: Vec<f32>,
    kt: Vec<f32>,
    vt: Vec<f32>,
    scores: Vec<f32>,
    corr: Vec<f32>,
}

/// See the module documentation; the arguments are `paged_attention`'s.
#[allow(clippy::too_many_arguments)]
pub(crate) fn flash_attention<T: KvElem>(
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
    let hd = layout.head_dim;
    assert!(
        layout.kv_heads > 0 && num_heads.is_multiple_of(layout.kv_heads),
        "{num_heads} query heads cannot share {} KV heads",
        layout.kv_heads
    );
    let group = num_heads / layout.kv_heads;
    let ctx = Ctx {
        kernels,
        ops: kernels.attention,
        layout,
        cache_k,
        cache_v,
        q,
        q_stride,
        group,
        q_scale: scale * std::f32::consts::LOG2_E,
        window,
    };
    let mut tasks = Vec::new();
    for (si, s) in seqs.iter().enumerate() {
        if s.rows == 0 {
            continue;
        }
        let first_key = ctx.first_key(s.first_position);
        let last_key = s.first_position + s.rows - 1;
        let (pa, pb) = (first_key / PARTITION, last_key / PARTITION);
        for kv_head in 0..layout.kv_heads {
            if s.rows <= QUERY_TILE && pb > pa {
                tasks.extend((pa..=pb).map(|part| Task {
                    seq: si,
                    kv_head,
                    r0: 0,
                    r1: s.rows,
                    part: Some(part),
                }));
            } else {
                tasks.extend((0..s.rows).step_by(QUERY_TILE).map(|r0| Task {
                    seq: si,
                    kv_head,
                    r0,
                    r1: (r0 + QUERY_TILE).min(s.rows),
                    part: None,
                }));
            }
        }
    }
    let results: Vec<State> = tasks
        .par_iter()
        .with_max_len(1)
        .map(|t| run(&ctx, &seqs[t.seq], t))
        .collect();

    // Merge split items in partition order, and scatter every result into `out`.
    let mut i = 0;
    let mut o = Vec::new();
    while i < tasks.len() {
        let t = tasks[i];
        let n = (t.r1 - t.r0) * group;
        let mut j = i + 1;
        let state = if t.part.is_some() {
            let mut merged = State::new(n, hd);
            merged.fold(&results[i], hd);
            while j < tasks.len()
                && tasks[j].part.is_some()
                && (tasks[j].seq, tasks[j].kv_head, tasks[j].r0) == (t.seq, t.kv_head, t.r0)
            {
                merged.fold(&results[j], hd);
                j += 1;
            }
            std::borrow::Cow::Owned(merged)
        } else {
            std::borrow::Cow::Borrowed(&results[i])
        };
        o.resize(n * hd, 0.0);
        state.finish(hd, &mut o);
        let s = &seqs[t.seq];
        for r in t.r0..t.r1 {
            let row = s.first_row + r;
            let dst = &mut out[row * num_heads * hd + t.kv_head * group * hd..][..group * hd];
            dst.copy_from_slice(&o[(r - t.r0) * group * hd..(r - t.r0 + 1) * group * hd]);
        }
        i = j;
    }
}

/// Runs one work item: the merged state of all its partitions, or one partition's state.
fn run<T: KvElem>(ctx: &Ctx<'_, T>, s: &AttentionSeq<'_>, t: &Task) -> State {
    let (hd, g) = (ctx.layout.head_dim, ctx.group);
    let n = (t.r1 - t.r0) * g;
    let mut scratch = Scratch {
        q: Vec::with_capacity(n * hd),
        ks: vec![0.0; KEY_TILE * hd],
        kt: vec![0.0; hd * KEY_TILE],
        vt: vec![0.0; KEY_TILE * hd],
        scores: vec![0.0; n * KEY_TILE],
        corr: vec![0.0; g],
    };
    for r in t.r0..t.r1 {
        let start = (s.first_row + r) * ctx.q_stride + t.kv_head * g * hd;
        scratch.q.extend(
            ctx.q[start..start + g * hd]
                .iter()
                .map(|&x| x * ctx.q_scale),
        );
    }
    let mut cur = State::new(n, hd);
    if let Some(part) = t.part {
        attend_partition(ctx, s, t, part, &mut cur, &mut scratch);
        return cur;
    }
    let first_key = ctx.first_key(s.first_position + t.r0);
    let last_key = s.first_position + t.r1 - 1;
    let mut merged = State::new(n, hd);
    for part in first_key / PARTITION..=last_key / PARTITION {
        cur.reset();
        attend_partition(ctx, s, t, part, &mut cur, &mut scratch);
        merged.fold(&cur, hd);
    }
    merged
}

/// Folds the keys of partition `part` into `state`, key tile by key tile, for the item's rows.
fn attend_partition<T: KvElem>(
    ctx: &Ctx<'_, T>,
    s: &AttentionSeq<'_>,
    t: &Task,
    part: usize,
    state: &mut State,
    sc: &mut Scratch,
) {
    let (hd, g) = (ctx.layout.head_dim, ctx.group);
    let (bs, w) = (ctx.layout.block_size, ctx.layout.slot_width());
    let pos = |r: usize| s.first_position + r;
    let key_lo = ctx.first_key(pos(t.r0)).max(part * PARTITION);
    let key_hi = pos(t.r1 - 1).min((part + 1) * PARTITION - 1);
    if key_lo > key_hi {
        return;
    }
    // Aligned tiles never straddle blocks when blocks are whole tiles.
    let in_place = T::as_f32(ctx.cache_k)
        .zip(T::as_f32(ctx.cache_v))
        .filter(|_| bs.is_multiple_of(KEY_TILE));
    let mut tile = key_lo / KEY_TILE * KEY_TILE;
    while tile <= key_hi {
        let tile_end = tile + KEY_TILE - 1;
        // Decoding streams every sequence's K/V from memory once per step: ask for the next
        // tile's rows now, so their latency overlaps this tile's arithmetic.
        let next = tile + KEY_TILE;
        if next <= key_hi && bs.is_multiple_of(KEY_TILE) {
            let slot = s.block_table[next / bs] as usize * bs + next % bs;
            let base = slot * w + t.kv_head * hd;
            prefetch_rows(ctx.cache_k, base, w, hd);
            prefetch_rows(ctx.cache_v, base, w, hd);
        }
        let (ks, ke) = (tile.max(key_lo), tile_end.min(key_hi));
        // Rows that see at least one key of this tile: positions >= tile, window start <= end.
        let ra = t.r0.max(tile.saturating_sub(s.first_position));
        let mut rb = ra;
        while rb < t.r1 && ctx.first_key(pos(rb)) <= tile_end {
            rb += 1;
        }
        if ra < rb {
            let (krows, vrows) = match in_place {
                // f32 pages, and the tile inside one block: read K/V where they are.
                Some((ck, cv)) => {
                    let slot = s.block_table[tile / bs] as usize * bs + tile % bs;
                    let base = slot * w + t.kv_head * hd;
                    let len = (KEY_TILE - 1) * w + hd;
                    let rows = |data| Rows {
                        data,
                        stride: w,
                        width: hd,
                    };
                    (rows(&ck[base..base + len]), rows(&cv[base..base + len]))
                }
                // Otherwise gather (and widen) the tile's keys into the staging buffers.
                None if bs.is_multiple_of(KEY_TILE) => {
                    // The tile's keys are one block's slots, one slot apart.
                    let slot = s.block_table[ks / bs] as usize * bs + ks % bs;
                    let base = slot * w + t.kv_head * hd;
                    let (n, j0) = (ke - ks + 1, ks - tile);
                    let len = (n - 1) * w + hd;
                    let (ck, cv) = (ctx.cache_k, ctx.cache_v);
                    T::load_rows(
                        ctx.kernels,
                        &ck[base..base + len],
                        w,
                        hd,
                        n,
                        &mut sc.ks[j0 * hd..],
                    );
                    T::load_rows(
                        ctx.kernels,
                        &cv[base..base + len],
                        w,
                        hd,
                        n,
                        &mut sc.vt[j0 * hd..],
                    );
                    let rows = |data| Rows {
                        data,
                        stride: hd,
                        width: hd,
                    };
                    (rows(&sc.ks[..]), rows(&sc.vt[..]))
                }
                None => {
                    for p in ks..=ke {
                        let slot = s.block_table[p / bs] as usize * bs + p % bs;
                        let off = slot * w + t.kv_head * hd;
                        let j = p - tile;
                        T::load(
                            ctx.kernels,
                            &ctx.cache_k[off..off + hd],
                            &mut sc.ks[j * hd..(j + 1) * hd],
                        );
                        T::load(
                            ctx.kernels,
                            &ctx.cache_v[off..off + hd],
                            &mut sc.vt[j * hd..(j + 1) * hd],
                        );
                    }
                    let rows = |data| Rows {
                        data,
                        stride: hd,
                        width: hd,
                    };
                    (rows(&sc.ks[..]), rows(&sc.vt[..]))
                }
            };
            (ctx.ops.transpose)(krows, &mut sc.kt);
            let (qa, qb) = ((ra - t.r0) * g, (rb - t.r0) * g);
            let scores = &mut sc.scores[..(qb - qa) * KEY_TILE];
            (ctx.ops.scores)(&sc.q[qa * hd..qb * hd], &sc.kt, hd, scores);
            for r in ra..rb {
                let (lo, hi) = (
                    ctx.first_key(pos(r)).max(tile) - tile,
                    pos(r).min(tile_end) - tile,
                );
                let v0 = (r - t.r0) * g;
                let sr = &mut scores[(v0 - qa) * KEY_TILE..(v0 - qa + g) * KEY_TILE];
                (ctx.ops.softmax)(
                    sr,
                    lo,
                    hi,
                    &mut state.m[v0..v0 + g],
                    &mut state.l[v0..v0 + g],
                    &mut sc.corr,
                );
                (ctx.ops.pv)(
                    sr,
                    &sc.corr,
                    vrows,
                    lo,
                    hi,
                    &mut state.acc[v0 * hd..(v0 + g) * hd],
                );
            }
        }
        tile += KEY_TILE;
    }
}

/// Prefetches `KEY_TILE` rows of `width` values, `stride` apart from `base`, into L1.
#[inline]
fn prefetch_rows<T>(data: &[T], base: usize, stride: usize, width: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        let bytes = width * size_of::<T>();
        let p = data.as_ptr().cast::<i8>();
        for j in 0..KEY_TILE {
            let row = (base + j * stride) * size_of::<T>();
            for off in (0..bytes).step_by(64) {
                // SAFETY: a prefetch never faults, whatever the address; `wrapping_add` keeps
                // the pointer arithmetic defined past the slice's end.
                #[allow(unsafe_code)]
                unsafe {
                    _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(row + off))
                };
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (data, base, stride, width);
}
