//! Tiled ("flash") attention over the paged cache, batch-invariant by construction.
//!
//! Keys are cut at absolute positions: tiles of `KEY_TILE` positions, grouped into partitions
//! of [`PARTITION`] positions. For one query row and head, each partition's keys are folded
//! into a fresh online-softmax state (running max `m`, sum `l`, accumulator) tile by tile,
//! in position order; the partitions' states are then merged left to right. None of this
//! depends on which other rows or heads share the work, so a row computes the same bits in a
//! 1-row decode, a 7-row chunk or a 512-row prefill, and on any number of threads.
//!
//! Work items are (sequence, KV heads, tile of query rows): the query heads of one GQA group
//! and up to [`QUERY_TILE`] rows share each K/V tile, loaded (and widened) once. Keys are
//! cached transposed within their block (see `KvLayout::key_at`), so a key tile is one
//! contiguous `[head_dim][KEY_TILE]` stretch of a block, as the score kernels read it: in
//! place where every row of the item sees four tiles (a decode step; a chunk off the diagonal),
//! widened once into a staging tile where rows see a tile in part (the diagonal). A
//! sequence whose rows fit in one query tile (decode) is further split by partition, so one
//! long context spreads over threads; its partition states are merged in
//! the same order the single-item path merges them. When there are enough such items to keep
//! every thread busy, one item takes all KV heads of its sequence: a tile's slots are then
//! read whole, one contiguous stream instead of a head's slice of every slot.

use std::ops::Range;

use super::kv::KvElem;
use super::tile::{KEY_TILE, Rows, TileOps};
use super::{AttentionSeq, KvLayout, PagedAttention, TreeMask, prefetch_rows};
use crate::cpu::dispatch::Kernels;

/// Key positions per partition: the unit of decode parallelism (a multiple of `KEY_TILE`).
pub(crate) const PARTITION: usize = 256;
/// Query rows per work item.
pub(crate) const QUERY_TILE: usize = 32;
/// Key tiles whose scores an item computes together (see `attend_partition`).
const DECODE_TILES: usize = 4;

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
    /// The soft-cap of the scores, if any.
    softcap: Option<f32>,
    /// Per query head, its sink logit in the log2 domain, if the layer has sinks.
    sinks: Option<Vec<f32>>,
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
#[derive(Debug, Clone)]
struct Task {
    seq: usize,
    kv_heads: Range<usize>,
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

    /// `acc / l`: the attention output of every vector; with `sinks` (log2-domain logits of
    /// the vectors' heads, cycling: one per query head of a GQA group), each sink's weight
    /// `2^(sink - m)` joins `l`, and no value joins `acc`.
    fn finish(&self, hd: usize, sinks: Option<&[f32]>, out: &mut [f32]) {
        for (i, ((o, acc), &l)) in out
            .chunks_exact_mut(hd)
            .zip(self.acc.chunks_exact(hd))
            .zip(&self.l)
            .enumerate()
        {
            let l = sinks.map_or(l, |s| l + (s[i % s.len()] - self.m[i]).exp2());
            for (x, &a) in o.iter_mut().zip(acc) {
                *x = a / l;
            }
        }
    }
}

/// Per-item buffers: the scaled queries, the group's key tiles, one V tile, the scores.
/// Kept per thread between items (zeroing fresh ones cost more than a short item's work); a
/// tile's lanes outside its span keep stale values, which the masks never let through.
#[derive(Default)]
struct Scratch {
    q: Vec<f32>,
    kt: Vec<f32>,
    vt: Vec<f32>,
    scores: Vec<f32>,
    corr: Vec<f32>,
}

/// See the module documentation.
pub(crate) fn flash_attention<T: KvElem>(
    kernels: &Kernels,
    p: &PagedAttention<'_, T>,
    out: &mut [f32],
) {
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
        cache_k: kv.k,
        cache_v: kv.v,
        q,
        q_stride,
        group,
        // Capped scores are `cap · tanh(s / cap)` of the natural-log-domain score `s`: the
        // query is scaled by `scale` alone then, and `log2(e)` applied after the cap.
        q_scale: match softcap {
            Some(_) => scale,
            None => scale * std::f32::consts::LOG2_E,
        },
        window,
        softcap,
        sinks: sinks.map(|s| {
            assert_eq!(s.len(), num_heads, "one attention sink per query head");
            s.iter().map(|&x| x * std::f32::consts::LOG2_E).collect()
        }),
    };
    let tasks = plan(&ctx, seqs);
    // Even a short decode (one sequence, a short context) is split over the team, which keeps
    // its threads awake for the o_proj product that follows. The results are the same bits
    // whoever runs an item.
    let results: Vec<Vec<State>> =
        crate::cpu::team::map(tasks.len(), |i| run(&ctx, &seqs[tasks[i].seq], &tasks[i]));
    scatter(&ctx, &tasks, &results, seqs, out);
}

/// The work items of `seqs` (see the module documentation), in the order their results are
/// merged.
fn plan<T>(ctx: &Ctx<'_, T>, seqs: &[AttentionSeq<'_>]) -> Vec<Task> {
    let kv_heads = ctx.layout.kv_heads;
    let partitions = |s: &AttentionSeq<'_>| {
        let first_key = ctx.first_key(s.first_position);
        let last_key = s.first_position + s.rows - 1;
        (first_key / PARTITION, last_key / PARTITION)
    };
    // Decode items take all KV heads of their sequence (each tile's slots read whole, in one
    // stream) when there are enough of them to keep every thread busy; else one KV head each.
    let decode_items: usize = seqs
        .iter()
        .filter(|s| s.rows > 0 && s.rows <= QUERY_TILE)
        .map(|s| {
            let (pa, pb) = partitions(s);
            pb - pa + 1
        })
        .sum();
    let whole_slots = decode_items >= 4 * rayon::current_num_threads();
    let mut tasks = Vec::new();
    for (si, s) in seqs.iter().enumerate() {
        if s.rows == 0 {
            continue;
        }
        let (pa, pb) = partitions(s);
        let whole = whole_slots && s.rows <= QUERY_TILE;
        let groups = if whole { 1 } else { kv_heads };
        for g in 0..groups {
            let heads = if whole { 0..kv_heads } else { g..g + 1 };
            if s.rows <= QUERY_TILE && pb > pa {
                tasks.extend((pa..=pb).map(|part| Task {
                    seq: si,
                    kv_heads: heads.clone(),
                    r0: 0,
                    r1: s.rows,
                    part: Some(part),
                }));
            } else {
                tasks.extend((0..s.rows).step_by(QUERY_TILE).map(|r0| Task {
                    seq: si,
                    kv_heads: heads.clone(),
                    r0,
                    r1: (r0 + QUERY_TILE).min(s.rows),
                    part: None,
                }));
            }
        }
    }
    tasks
}

/// Merges split items' states in partition order, and writes every item's output rows into
/// `out`.
fn scatter<T>(
    ctx: &Ctx<'_, T>,
    tasks: &[Task],
    results: &[Vec<State>],
    seqs: &[AttentionSeq<'_>],
    out: &mut [f32],
) {
    let (hd, group) = (ctx.layout.head_dim, ctx.group);
    let num_heads = ctx.layout.kv_heads * group;
    let mut i = 0;
    let mut o = Vec::new();
    while i < tasks.len() {
        let t = &tasks[i];
        let n = (t.r1 - t.r0) * group;
        let mut j = i + 1;
        while j < tasks.len()
            && t.part.is_some()
            && tasks[j].part.is_some()
            && (tasks[j].seq, &tasks[j].kv_heads, tasks[j].r0) == (t.seq, &t.kv_heads, t.r0)
        {
            j += 1;
        }
        for (h, kv_head) in t.kv_heads.clone().enumerate() {
            let state = if t.part.is_some() {
                let mut merged = State::new(n, hd);
                for part in &results[i..j] {
                    merged.fold(&part[h], hd);
                }
                std::borrow::Cow::Owned(merged)
            } else {
                std::borrow::Cow::Borrowed(&results[i][h])
            };
            o.resize(n * hd, 0.0);
            let sinks = (ctx.sinks.as_deref()).map(|s| &s[kv_head * group..(kv_head + 1) * group]);
            state.finish(hd, sinks, &mut o);
            let s = &seqs[t.seq];
            for r in t.r0..t.r1 {
                let row = s.first_row + r;
                let dst = &mut out[row * num_heads * hd + kv_head * group * hd..][..group * hd];
                dst.copy_from_slice(&o[(r - t.r0) * group * hd..(r - t.r0 + 1) * group * hd]);
            }
        }
        i = j;
    }
}

thread_local! {
    static SCRATCH: std::cell::Cell<Scratch> = std::cell::Cell::default();
}

/// Runs one work item: per KV head, the merged state of all its partitions, or one
/// partition's state.
fn run<T: KvElem>(ctx: &Ctx<'_, T>, s: &AttentionSeq<'_>, t: &Task) -> Vec<State> {
    let (hd, g) = (ctx.layout.head_dim, ctx.group);
    let n = (t.r1 - t.r0) * g;
    let mut scratch = SCRATCH.take();
    scratch.q.clear();
    scratch.kt.resize(DECODE_TILES * hd * KEY_TILE, 0.0);
    scratch.vt.resize(KEY_TILE * hd, 0.0);
    scratch.scores.resize(DECODE_TILES * n * KEY_TILE, 0.0);
    scratch.corr.resize(n, 0.0);
    for kv_head in t.kv_heads.clone() {
        for r in t.r0..t.r1 {
            let start = (s.first_row + r) * ctx.q_stride + kv_head * g * hd;
            scratch.q.extend(
                ctx.q[start..start + g * hd]
                    .iter()
                    .map(|&x| x * ctx.q_scale),
            );
        }
    }
    let mut cur = vec![State::new(n, hd); t.kv_heads.len()];
    if let Some(part) = t.part {
        attend_partition(ctx, s, t, part, &mut cur, &mut scratch);
        SCRATCH.set(scratch);
        return cur;
    }
    let first_key = ctx.first_key(s.token_position(t.r0));
    let last_key = s.first_position + t.r1 - 1;
    let mut merged = cur.clone();
    for part in first_key / PARTITION..=last_key / PARTITION {
        cur.iter_mut().for_each(State::reset);
        attend_partition(ctx, s, t, part, &mut cur, &mut scratch);
        for (m, c) in merged.iter_mut().zip(&cur) {
            m.fold(c, hd);
        }
    }
    SCRATCH.set(scratch);
    merged
}

/// Folds the keys of partition `part` into `states` (one per KV head of the item), key tile by
/// key tile, for the item's rows.
///
/// The scores of [`DECODE_TILES`] tiles are computed at once where every row of the item sees
/// all of them (each score's arithmetic unchanged), then the softmax and `p · V` run tile by
/// tile in order. A one-row item (a decode step) has only its query heads to share each tile,
/// too few independent chains of fused multiply-adds to fill the pipeline otherwise; a prefill
/// item's query vectors then share each broadcast of a query element among four tiles.
fn attend_partition<T: KvElem>(
    ctx: &Ctx<'_, T>,
    s: &AttentionSeq<'_>,
    t: &Task,
    part: usize,
    states: &mut [State],
    sc: &mut Scratch,
) {
    let (hd, g) = (ctx.layout.head_dim, ctx.group);
    let (bs, w) = (ctx.layout.block_size, ctx.layout.slot_width());
    let pos = |r: usize| s.first_position + r;
    let key_lo = ctx.first_key(s.token_position(t.r0)).max(part * PARTITION);
    let key_hi = pos(t.r1 - 1).min((part + 1) * PARTITION - 1);
    if key_lo > key_hi {
        return;
    }
    let n = (t.r1 - t.r0) * g;
    let mut tile = key_lo / KEY_TILE * KEY_TILE;
    let mut prefetched = tile;
    // Decoding streams every sequence's K/V from memory once per step. The first group's rows
    // are asked for at once; after that, each tile's softmax and `p · V` start by asking for
    // the rows of the tile one group ahead, so requests go out spread over the work rather
    // than in bursts (a burst fills the core's queue of misses and stalls it). Prefetching
    // needs tiles inside one block each.
    let stream = bs.is_multiple_of(KEY_TILE);
    let width = t.kv_heads.len() * hd;
    let prefetch = |p: usize| {
        let slot = ctx.layout.slot(s.block_table, p);
        let keys = ctx.layout.key_at(slot, t.kv_heads.start);
        prefetch_rows::<false, _>(ctx.cache_k, keys, bs, KEY_TILE, width);
        let values = slot * w + t.kv_heads.start * hd;
        prefetch_rows::<false, _>(ctx.cache_v, values, w, width, KEY_TILE);
    };
    while tile <= key_hi {
        let tiles = ((key_hi - tile) / KEY_TILE + 1).min(DECODE_TILES);
        if stream && prefetched == tile {
            while prefetched < (tile + tiles * KEY_TILE).min(key_hi + 1) {
                prefetch(prefetched);
                prefetched += KEY_TILE;
            }
        }
        let mut spans = [TileSpan::default(); DECODE_TILES];
        for (i, span) in spans[..tiles].iter_mut().enumerate() {
            *span = TileSpan::new(ctx, s, t, tile + i * KEY_TILE, key_lo, key_hi);
        }
        let spans = &spans[..tiles];
        for (h, kv_head) in t.kv_heads.clone().enumerate() {
            let q = &sc.q[h * n * hd..(h + 1) * n * hd];
            if spans.iter().all(|sp| (sp.ra, sp.rb) == (t.r0, t.r1)) {
                // Every row sees every tile: the group's tiles' scores in one pass.
                decode_scores(ctx, s, spans, kv_head, q, &mut sc.kt, &mut sc.scores);
            } else {
                for (i, span) in spans.iter().enumerate() {
                    if span.ra < span.rb {
                        let kt = &mut sc.kt[i * hd * KEY_TILE..(i + 1) * hd * KEY_TILE];
                        load_keys(ctx, s, span, kv_head, kt);
                        let (qa, qb) = ((span.ra - t.r0) * g, (span.rb - t.r0) * g);
                        let out = &mut sc.scores[i * n * KEY_TILE..][..(qb - qa) * KEY_TILE];
                        (ctx.ops.scores)(&q[qa * hd..qb * hd], kt, hd, out);
                    }
                }
            }
            for (i, span) in spans.iter().enumerate() {
                let ahead = tile + (tiles + i) * KEY_TILE;
                if stream && h == 0 && ahead <= key_hi && ahead >= prefetched {
                    prefetch(ahead);
                    prefetched = ahead + KEY_TILE;
                }
                if span.ra >= span.rb {
                    continue;
                }
                let vrows = value_rows(ctx, s, span, kv_head, &mut sc.vt);
                let qa = (span.ra - t.r0) * g;
                let scores = &mut sc.scores[i * n * KEY_TILE..(i + 1) * n * KEY_TILE];
                if let Some(cap) = ctx.softcap {
                    // Per score, so a row's bits do not depend on its neighbours; lanes the
                    // masks drop are transformed too, and dropped all the same.
                    let live = (span.rb - span.ra) * g * KEY_TILE;
                    for x in &mut scores[..live] {
                        *x = super::softcap(*x, cap) * std::f32::consts::LOG2_E;
                    }
                }
                if let Some(tree) = s.tree {
                    hide_other_branches(&tree, s.first_position, span, g, scores);
                }
                let bounds = |r: usize| {
                    (
                        ctx.first_key(s.token_position(r)).max(span.tile) - span.tile,
                        pos(r).min(span.tile + KEY_TILE - 1) - span.tile,
                    )
                };
                // Rows that see the same keys of the tile (all of them, off the diagonal) take
                // one softmax call: their heads' reduction chains overlap, and their corrections
                // share `exp2` calls (each head's arithmetic unchanged).
                let mut r = span.ra;
                while r < span.rb {
                    let (lo, hi) = bounds(r);
                    let mut end = r + 1;
                    while end < span.rb && bounds(end) == (lo, hi) {
                        end += 1;
                    }
                    let (v0, v1) = ((r - t.r0) * g, (end - t.r0) * g);
                    let sr = &mut scores[(v0 - qa) * KEY_TILE..(v1 - qa) * KEY_TILE];
                    let corr = &mut sc.corr[..v1 - v0];
                    (ctx.ops.softmax)(
                        sr,
                        lo,
                        hi,
                        &mut states[h].m[v0..v1],
                        &mut states[h].l[v0..v1],
                        corr,
                    );
                    // `p · V` of all their heads at once too (heads are independent).
                    let acc = &mut states[h].acc[v0 * hd..v1 * hd];
                    match vrows {
                        Values::F32(v) => (ctx.ops.pv)(sr, corr, v, lo, hi, acc),
                        Values::Bf16(v) => (ctx.ops.pv_bf16)(sr, corr, v, lo, hi, acc),
                    }
                    r = end;
                }
            }
        }
        tile += tiles * KEY_TILE;
    }
}

/// Stands for a key a tree row does not see: finite, so that a tile (or partition) whose keys
/// a row sees none of leaves a finite running max, and its `exp2` weights are multiplied by
/// exactly 0 once any seen key is folded in (every row sees the keys before the root).
const HIDDEN: f32 = f32::MIN;

/// Replaces the scores of one tile's keys that lie in the tree but off a row's path to the
/// root by [`HIDDEN`], for the span's rows (`scores`: `[rows][group heads][KEY_TILE]` from
/// the span's first row, in the log2 domain).
fn hide_other_branches(
    tree: &TreeMask<'_>,
    root: usize,
    span: &TileSpan,
    group: usize,
    scores: &mut [f32],
) {
    if span.tile + KEY_TILE <= root + 1 {
        return;
    }
    for r in span.ra..span.rb {
        for j in 0..KEY_TILE {
            let key = span.tile + j;
            if key <= root || key >= root + r {
                continue;
            }
            if !tree.sees(r, key - root) {
                for g in 0..group {
                    scores[((r - span.ra) * group + g) * KEY_TILE + j] = HIDDEN;
                }
            }
        }
    }
}

/// An item's scores against the group's key tiles (`spans`, all seen by every row) in one
/// pass: `[tiles][query heads][KEY_TILE]` into `out`. Keys are read where they lie in the
/// cache when blocks hold whole tiles (a tile's keys of one head are `hd` rows, a block
/// apart), otherwise staged in `kt` as `load_keys` gives them.
fn decode_scores<T: KvElem>(
    ctx: &Ctx<'_, T>,
    s: &AttentionSeq<'_>,
    spans: &[TileSpan],
    kv_head: usize,
    q: &[f32],
    kt: &mut [f32],
    out: &mut [f32],
) {
    let (layout, hd, bs) = (ctx.layout, ctx.layout.head_dim, ctx.layout.block_size);
    let last = spans.len() - 1;
    let tiles = spans.len();
    let in_block = |i: usize| {
        let k0 = layout.key_at(layout.slot(s.block_table, spans[i.min(last)].tile), kv_head);
        k0..k0 + (hd - 1) * bs + KEY_TILE
    };
    if bs.is_multiple_of(KEY_TILE) {
        if let Some(c) = T::as_bf16(ctx.cache_k) {
            let keys = tile_views(c, in_block, bs);
            return (ctx.ops.scores_tiles_bf16)(q, hd, &keys[..tiles], out);
        }
        if let Some(c) = T::as_f32(ctx.cache_k) {
            let keys = tile_views(c, in_block, bs);
            return (ctx.ops.scores_tiles)(q, hd, &keys[..tiles], out);
        }
    }
    let staged = |i: usize| i.min(last) * hd * KEY_TILE..(i.min(last) + 1) * hd * KEY_TILE;
    for (i, span) in spans.iter().enumerate() {
        load_keys(ctx, s, span, kv_head, &mut kt[staged(i)]);
    }
    let keys = tile_views(kt, staged, KEY_TILE);
    (ctx.ops.scores_tiles)(q, hd, &keys[..tiles], out)
}

/// Views of [`DECODE_TILES`] key tiles: tile `i` is `data[at(i)]`, rows `stride` apart.
fn tile_views<E>(
    data: &[E],
    at: impl Fn(usize) -> Range<usize>,
    stride: usize,
) -> [Rows<'_, E>; DECODE_TILES] {
    std::array::from_fn(|i| Rows {
        data: &data[at(i)],
        stride,
        width: KEY_TILE,
    })
}

/// One key tile of an item: its positions and the item's rows that see any of them.
#[derive(Clone, Copy, Default)]
struct TileSpan {
    /// First position of the (aligned) tile.
    tile: usize,
    /// The tile's keys inside the partition and the window: `ks..=ke`.
    ks: usize,
    ke: usize,
    /// Rows (relative to the sequence) that see at least one key of the tile.
    ra: usize,
    rb: usize,
}

impl TileSpan {
    fn new<T>(
        ctx: &Ctx<'_, T>,
        s: &AttentionSeq<'_>,
        t: &Task,
        tile: usize,
        key_lo: usize,
        key_hi: usize,
    ) -> Self {
        let tile_end = tile + KEY_TILE - 1;
        // Rows that see at least one key of this tile: positions >= tile, window start <= end.
        let ra = t.r0.max(tile.saturating_sub(s.first_position));
        let mut rb = ra;
        while rb < t.r1 && ctx.first_key(s.token_position(rb)) <= tile_end {
            rb += 1;
        }
        Self {
            tile,
            ks: tile.max(key_lo),
            ke: tile_end.min(key_hi),
            ra,
            rb,
        }
    }
}

/// The V rows of one KV head for a tile, as `p · V` reads them.
#[derive(Clone, Copy)]
enum Values<'a> {
    F32(Rows<'a>),
    /// Straight from a bf16 cache (widened in registers).
    Bf16(Rows<'a, half::bf16>),
}

/// The V rows of one KV head for a tile: in place from a bf16 cache when the tile is inside one
/// block, otherwise as [`load_tile`] gives them.
fn value_rows<'a, T: KvElem>(
    ctx: &Ctx<'a, T>,
    s: &AttentionSeq<'_>,
    span: &TileSpan,
    kv_head: usize,
    staging: &'a mut [f32],
) -> Values<'a> {
    match T::as_bf16(ctx.cache_v) {
        Some(cv) if ctx.layout.block_size.is_multiple_of(KEY_TILE) => {
            Values::Bf16(in_place(ctx.layout, cv, s, span, kv_head))
        }
        _ => Values::F32(load_values(ctx, s, span, kv_head, staging)),
    }
}

/// One KV head's rows of a whole tile, where they are in `cache` (the tile must be inside
/// one block: blocks of whole tiles).
fn in_place<'a, E>(
    layout: super::KvLayout,
    cache: &'a [E],
    s: &AttentionSeq<'_>,
    span: &TileSpan,
    kv_head: usize,
) -> Rows<'a, E> {
    let (hd, w) = (layout.head_dim, layout.slot_width());
    let slot = layout.slot(s.block_table, span.tile);
    let base = slot * w + kv_head * hd;
    Rows {
        data: &cache[base..base + (KEY_TILE - 1) * w + hd],
        stride: w,
        width: hd,
    }
}

/// One KV head's keys of a tile as `[hd][KEY_TILE]`, the layout the score kernels read. Within
/// a block the cache holds keys that way already (`block_size` apart), so a tile inside one
/// block is widened (or copied) row by row; a tile that straddles blocks is gathered key by key.
/// Lanes of positions outside the span keep whatever they held: their scores are masked.
fn load_keys<T: KvElem>(
    ctx: &Ctx<'_, T>,
    s: &AttentionSeq<'_>,
    span: &TileSpan,
    kv_head: usize,
    kt: &mut [f32],
) {
    let (layout, hd, bs) = (ctx.layout, ctx.layout.head_dim, ctx.layout.block_size);
    // Aligned tiles never straddle blocks when blocks are whole tiles.
    if bs.is_multiple_of(KEY_TILE) {
        let k0 = layout.key_at(layout.slot(s.block_table, span.tile), kv_head);
        let keys = &ctx.cache_k[k0..k0 + (hd - 1) * bs + KEY_TILE];
        T::load_rows(ctx.kernels, keys, bs, KEY_TILE, hd, kt);
        return;
    }
    for p in span.ks..=span.ke {
        let k0 = layout.key_at(layout.slot(s.block_table, p), kv_head);
        let j = p - span.tile;
        for d in 0..hd {
            kt[d * KEY_TILE + j] = ctx.cache_k[k0 + d * bs].widen();
        }
    }
}

/// The V rows of one KV head for a tile: in place for f32 pages when the tile is inside one
/// block, otherwise gathered (and widened) into `staging`.
fn load_values<'a, T: KvElem>(
    ctx: &Ctx<'a, T>,
    s: &AttentionSeq<'_>,
    span: &TileSpan,
    kv_head: usize,
    staging: &'a mut [f32],
) -> Rows<'a> {
    let (hd, bs, w) = (
        ctx.layout.head_dim,
        ctx.layout.block_size,
        ctx.layout.slot_width(),
    );
    let cache = ctx.cache_v;
    let staged = |data| Rows {
        data,
        stride: hd,
        width: hd,
    };
    // Aligned tiles never straddle blocks when blocks are whole tiles.
    if bs.is_multiple_of(KEY_TILE) {
        if let Some(c) = T::as_f32(cache) {
            return in_place(ctx.layout, c, s, span, kv_head);
        }
        // The tile's values are one block's slots, one slot apart.
        let slot = ctx.layout.slot(s.block_table, span.ks);
        let base = slot * w + kv_head * hd;
        let (n, j0) = (span.ke - span.ks + 1, span.ks - span.tile);
        let len = (n - 1) * w + hd;
        T::load_rows(
            ctx.kernels,
            &cache[base..base + len],
            w,
            hd,
            n,
            &mut staging[j0 * hd..],
        );
        return staged(&staging[..KEY_TILE * hd]);
    }
    for p in span.ks..=span.ke {
        let off = ctx.layout.slot(s.block_table, p) * w + kv_head * hd;
        let j = p - span.tile;
        T::load(
            ctx.kernels,
            &cache[off..off + hd],
            &mut staging[j * hd..(j + 1) * hd],
        );
    }
    staged(&staging[..KEY_TILE * hd])
}
