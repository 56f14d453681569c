//! Token-tree rows (speculative verification): each sees the cache before the root and its own
//! path only, on every level, and a chain is exactly the causal case.

use half::bf16;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::flash::PARTITION;
use super::tests::{Heads, Paged, attend_tree, heads_of, max_abs_diff, paged, random};
use super::*;
use crate::cpu::Level;

/// A random tree of `rows` rows in breadth-first order: `(visible masks, depths)`.
fn random_tree(rng: &mut ChaCha8Rng, rows: usize) -> (Vec<u64>, Vec<u32>) {
    let parents: Vec<usize> = (0..rows)
        .map(|i| if i == 0 { 0 } else { rng.random_range(0..i) })
        .collect();
    let mut depth = vec![0u32; rows];
    for i in 1..rows {
        depth[i] = depth[parents[i]] + 1;
    }
    // Breadth-first relabelling: by depth, ties in creation order (parents stay earlier).
    let mut order: Vec<usize> = (0..rows).collect();
    order.sort_by_key(|&i| (depth[i], i));
    let mut label = vec![0usize; rows];
    for (new, &old) in order.iter().enumerate() {
        label[old] = new;
    }
    let mut visible = vec![0u64; rows];
    let mut depths = vec![0u32; rows];
    for &old in &order {
        let new = label[old];
        depths[new] = depth[old];
        visible[new] = 1 << new;
        if old != 0 {
            visible[new] |= visible[label[parents[old]]];
        }
    }
    (visible, depths)
}

/// Tree rows against an f64 softmax over exactly the keys each row sees: the cache before
/// the root (within the window, counted from the row's depth), and its own path.
fn tree_reference(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    h: Heads,
    root: usize,
    tree: &TreeMask<'_>,
    window: Option<usize>,
) -> Vec<f32> {
    let (heads, kv_heads, hd) = (h.q, h.kv, h.dim);
    let rows = tree.depths.len();
    let scale = 1.0 / (hd as f64).sqrt();
    let mut out = vec![0f32; rows * heads * hd];
    for r in 0..rows {
        let at = root + tree.depths[r] as usize;
        let lo = window.map_or(0, |w| (at + 1).saturating_sub(w));
        let keys: Vec<usize> = (lo..=root)
            .chain((1..rows).filter(|&i| tree.sees(r, i)).map(|i| root + i))
            .collect();
        for hh in 0..heads {
            let g = hh / (heads / kv_heads);
            let qh = &q[(r * heads + hh) * hd..][..hd];
            let s: Vec<f64> = keys
                .iter()
                .map(|&p| {
                    let kh = &k[(p * kv_heads + g) * hd..][..hd];
                    qh.iter()
                        .zip(kh)
                        .map(|(a, b)| *a as f64 * *b as f64)
                        .sum::<f64>()
                        * scale
                })
                .collect();
            let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = s.iter().map(|x| (x - m).exp()).sum();
            for d in 0..hd {
                let a: f64 = keys
                    .iter()
                    .zip(&s)
                    .map(|(&p, &sc)| (sc - m).exp() / z * v[(p * kv_heads + g) * hd + d] as f64)
                    .sum();
                out[(r * heads + hh) * hd + d] = a as f32;
            }
        }
    }
    out
}

#[test]
fn tree_rows_see_the_prefix_and_their_own_path() {
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    // (head_dim, kv_heads, group, block_size, root position, rows, window): trees inside
    // one tile, across tiles and blocks, starting right at a partition boundary, windowed.
    let cases = [
        (8, 1, 2, 4, 3, 5, None),
        (16, 2, 2, 16, 40, 17, None),
        (64, 3, 3, 16, PARTITION - 1, 33, None),
        (64, 1, 4, 16, PARTITION + 7, 64, None),
        (20, 2, 3, 5, 90, 12, Some(30)),
        (64, 1, 3, 16, 300, 40, Some(64)),
    ];
    for (ci, &(hd, kv_heads, group, bs, root, rows, window)) in cases.iter().enumerate() {
        let heads = kv_heads * group;
        let layout = KvLayout {
            block_size: bs,
            kv_heads,
            head_dim: hd,
        };
        let ctx = root + rows;
        let k = random(&mut rng, ctx * kv_heads * hd, 2.0);
        let v = random(&mut rng, ctx * kv_heads * hd, 1.0);
        let q = random(&mut rng, rows * heads * hd, 2.0);
        let (visible, depths) = random_tree(&mut rng, rows);
        let tree = TreeMask {
            visible: &visible,
            depths: &depths,
        };
        let want = tree_reference(
            &q,
            &k,
            &v,
            heads_of(heads, kv_heads, hd),
            root,
            &tree,
            window,
        );
        let c32: Paged<f32> = paged(&mut rng, layout, &k, &v);
        for level in Level::available() {
            let kern = Kernels::for_level(level).unwrap();
            let got = attend_tree(kern, &c32, &q, heads, root, Some(tree), window);
            let d = max_abs_diff(&got, &want);
            assert!(d < 2e-5, "case {ci} {level:?}: max |diff| {d}");
            let mut naive = vec![0f32; got.len()];
            let seq = AttentionSeq {
                first_row: 0,
                rows,
                first_position: root,
                block_table: &c32.table,
                tree: Some(tree),
            };
            let p = PagedAttention {
                kv: c32.pages(),
                q: &q,
                q_stride: heads * hd,
                num_heads: heads,
                seqs: &[seq],
                scale: 1.0 / (hd as f32).sqrt(),
                window,
                softcap: None,
                sinks: None,
            };
            paged_attention_naive(kern, &p, &mut naive);
            let d = max_abs_diff(&naive, &want);
            assert!(d < 2e-5, "case {ci} {level:?} naive: max |diff| {d}");
        }
    }
}

/// A tree that is a chain is the causal case: the same bits as rows without a tree.
#[test]
fn a_chain_tree_is_bit_identical_to_causal_rows() {
    let mut rng = ChaCha8Rng::seed_from_u64(12);
    let (hd, kv_heads, heads, bs, root, rows) = (64, 3, 9, 16, 200, 20);
    let layout = KvLayout {
        block_size: bs,
        kv_heads,
        head_dim: hd,
    };
    let ctx = root + rows;
    let k = random(&mut rng, ctx * kv_heads * hd, 2.0);
    let v = random(&mut rng, ctx * kv_heads * hd, 1.0);
    let q = random(&mut rng, rows * heads * hd, 2.0);
    let visible: Vec<u64> = (0..rows).map(|r| (1u64 << (r + 1)) - 1).collect();
    let depths: Vec<u32> = (0..rows as u32).collect();
    let tree = TreeMask {
        visible: &visible,
        depths: &depths,
    };
    let cb: Paged<bf16> = paged(&mut rng, layout, &k, &v);
    for level in Level::available() {
        let kern = Kernels::for_level(level).unwrap();
        let chain = attend_tree(kern, &cb, &q, heads, root, Some(tree), Some(100));
        let causal = attend_tree(kern, &cb, &q, heads, root, None, Some(100));
        assert_eq!(
            chain.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            causal.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            "{level:?}"
        );
    }
}
