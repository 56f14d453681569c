//! Element types of the KV cache, and writing new tokens' K/V into their slots.

use half::bf16;

use super::{PagedKvMut, prefetch_rows};
use crate::cpu::dispatch::Kernels;

/// A KV-cache element type: `f32`, or `bf16` (half the memory; keys and values are rounded to
/// nearest-even when written and widened back to f32 in the attention kernels).
pub trait KvElem: Copy + Default + Send + Sync + 'static + private::Sealed {
    /// Converts one row of activations into cache elements.
    fn store(src: &[f32], dst: &mut [Self]);
    /// One element as f32 (exact).
    fn widen(self) -> f32;
    /// Widens cache elements to f32 with `kernels`' level.
    fn load(kernels: &Kernels, src: &[Self], dst: &mut [f32]);
    /// The elements as f32, when they are (then kernels read the cache in place).
    fn as_f32(src: &[Self]) -> Option<&[f32]>;
    /// The elements as bf16, when they are (then `p · V` reads values in place).
    fn as_bf16(src: &[Self]) -> Option<&[bf16]>;
    /// Widens `rows` rows of `width` elements, `stride` apart, into consecutive rows of `dst`.
    fn load_rows(
        kernels: &Kernels,
        src: &[Self],
        stride: usize,
        width: usize,
        rows: usize,
        dst: &mut [f32],
    ) {
        for j in 0..rows {
            Self::load(
                kernels,
                &src[j * stride..j * stride + width],
                &mut dst[j * width..(j + 1) * width],
            );
        }
    }
}

impl KvElem for f32 {
    #[inline]
    fn store(src: &[f32], dst: &mut [f32]) {
        dst.copy_from_slice(src);
    }

    #[inline]
    fn widen(self) -> f32 {
        self
    }

    #[inline]
    fn load(_: &Kernels, src: &[f32], dst: &mut [f32]) {
        dst.copy_from_slice(src);
    }

    #[inline]
    fn as_f32(src: &[f32]) -> Option<&[f32]> {
        Some(src)
    }

    #[inline]
    fn as_bf16(_: &[f32]) -> Option<&[bf16]> {
        None
    }
}

impl KvElem for bf16 {
    #[inline]
    fn store(src: &[f32], dst: &mut [bf16]) {
        assert_eq!(src.len(), dst.len());
        crate::cpu::bf16_dot::round_to_bf16(src, dst);
    }

    #[inline]
    fn widen(self) -> f32 {
        self.to_f32()
    }

    #[inline]
    fn load(kernels: &Kernels, src: &[bf16], dst: &mut [f32]) {
        (kernels.dequant.bf16)(src, dst);
    }

    #[inline]
    fn as_f32(_: &[bf16]) -> Option<&[f32]> {
        None
    }

    #[inline]
    fn as_bf16(src: &[bf16]) -> Option<&[bf16]> {
        Some(src)
    }

    #[inline]
    fn load_rows(
        kernels: &Kernels,
        src: &[bf16],
        stride: usize,
        width: usize,
        rows: usize,
        dst: &mut [f32],
    ) {
        // One call per tile rather than per row.
        (kernels.attention.widen_bf16)(src, stride, width, rows, dst);
    }
}

mod private {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::bf16 {}
}

/// New tokens' keys and values where the pass computed them: token `t`'s row is
/// `rows[t * row_stride..]`, its K at `k_offset` and its V at `v_offset` (they can live inside
/// a fused qkv buffer).
#[derive(Debug, Clone, Copy)]
pub struct NewKv<'a> {
    /// The tokens' rows.
    pub rows: &'a [f32],
    /// Values from one token's row to the next.
    pub row_stride: usize,
    /// Where a row's keys start.
    pub k_offset: usize,
    /// Where a row's values start.
    pub v_offset: usize,
    /// The cache slot of each token.
    pub slots: &'a [usize],
    /// The tokens' rotary cosines and sines (from `rope::cos_sin`), to rotate the keys by on
    /// their way in; `None` stores them as they are.
    pub rope: Option<(&'a [f32], &'a [f32])>,
}

/// Copies each token's K and V rows into its cache slot (keys transposed within their block,
/// see [`super::KvLayout::key_at`]), converting them to the cache's element type.
///
/// With `new.rope`, the keys get their rotary embeddings on the way in (one pass over them
/// instead of rotating in place, then copying): token `t`'s heads are rotated by row `t` of
/// `cos` and `sin`, exactly as `rope::apply_rope` would.
pub fn write_kv<T: KvElem>(cache: PagedKvMut<'_, T>, new: &NewKv<'_>) {
    let PagedKvMut {
        layout,
        k: cache_k,
        v: cache_v,
    } = cache;
    let NewKv {
        rows,
        row_stride,
        k_offset,
        v_offset,
        slots,
        rope,
    } = *new;
    let w = layout.slot_width();
    // The tables' columns: `head_dim / 2`, or fewer under partial rotary.
    let half = match rope {
        Some((cos, _)) => cos.len().checked_div(slots.len()).unwrap_or(0),
        None => 0,
    };
    let (hd, bs) = (layout.head_dim, layout.block_size);
    let mut rotated = Vec::new();
    let mut key = vec![T::default(); w];
    // A new token's keys are spread over its block (one element per `block_size`), lines that
    // are rarely in cache: ask for all of them first, so the misses overlap instead of taking
    // turns.
    for &slot in slots {
        for h in 0..layout.kv_heads {
            let k0 = layout.key_at(slot, h);
            prefetch_rows::<true, _>(cache_k, k0, bs, 1, hd);
        }
        prefetch_rows::<true, _>(cache_v, slot * w, w, w, 1);
    }
    for (t, &slot) in slots.iter().enumerate() {
        let row = &rows[t * row_stride..(t + 1) * row_stride];
        let keys = &row[k_offset..k_offset + w];
        let keys = match rope {
            Some((cos, sin)) => {
                let (c, s) = (
                    &cos[t * half..(t + 1) * half],
                    &sin[t * half..(t + 1) * half],
                );
                rotated.clear();
                rotated.extend_from_slice(keys);
                for head in rotated.chunks_exact_mut(layout.head_dim) {
                    crate::cpu::rope::rotate_head(&mut head[..2 * half], c, s);
                }
                &rotated[..]
            }
            None => keys,
        };
        T::store(keys, &mut key);
        for (h, head) in key.chunks_exact(hd).enumerate() {
            let k0 = layout.key_at(slot, h);
            for (d, &x) in head.iter().enumerate() {
                cache_k[k0 + d * bs] = x;
            }
        }
        T::store(
            &row[v_offset..v_offset + w],
            &mut cache_v[slot * w..(slot + 1) * w],
        );
    }
}
