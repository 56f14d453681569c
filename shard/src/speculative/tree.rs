//! Token trees: several candidate continuations verified in one pass (SpecInfer, Medusa).
//!
//! The root is the sequence's pending token; every other node a candidate for the position
//! its depth says. One forward pass over the nodes (each seeing only its own path, see
//! [`TreeMask`]) gives the logits after every node. Verification walks from the root: at each
//! node the sequence's own sampler draws the next token from that node's logits, exactly as
//! decoding without speculation would, and the walk goes on while the drawn token is one of
//! the node's children. Candidates are a deterministic function of the context, so each
//! emitted token has the target's distribution (greedy: its argmax), whichever tree was
//! proposed; the tree only decides how many tokens one pass yields.

use crate::model::TreeMask;
use crate::sampling::{SampledToken, Sampler};

/// Candidate tokens below a root, in breadth-first order (a node's parent comes first, and
/// depths never decrease), as [`TreeMask`] wants them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenTree {
    tokens: Vec<u32>,
    parents: Vec<usize>,
    depths: Vec<u32>,
    /// Per node, the nodes on its path (bit `i`: node `i`).
    visible: Vec<u64>,
}

impl TokenTree {
    /// Nodes a tree can hold, its root included.
    pub const MAX_NODES: usize = TreeMask::MAX_ROWS;

    /// A tree of only `root`.
    pub fn new(root: u32) -> Self {
        Self {
            tokens: vec![root],
            parents: vec![0],
            depths: vec![0],
            visible: vec![1],
        }
    }

    /// Merges candidate paths below `root` into a tree (shared prefixes once), in the order
    /// given, until it holds `capacity` nodes (at most [`Self::MAX_NODES`], the root
    /// included); nodes are then laid out breadth first.
    pub fn from_paths(root: u32, paths: &[Vec<u32>], capacity: usize) -> Self {
        let capacity = capacity.clamp(1, Self::MAX_NODES);
        // Build as a trie in insertion order, then relabel breadth first.
        let mut tokens = vec![root];
        let mut parents = vec![0usize];
        let mut depths = vec![0u32];
        'paths: for path in paths {
            let mut node = 0;
            for &t in path {
                let existing = (1..tokens.len()).find(|&c| parents[c] == node && tokens[c] == t);
                node = match existing {
                    Some(c) => c,
                    None if tokens.len() == capacity => break 'paths,
                    None => {
                        tokens.push(t);
                        parents.push(node);
                        depths.push(depths[node] + 1);
                        tokens.len() - 1
                    }
                };
            }
        }
        let mut order: Vec<usize> = (0..tokens.len()).collect();
        order.sort_by_key(|&i| (depths[i], i));
        let mut label = vec![0; tokens.len()];
        for (new, &old) in order.iter().enumerate() {
            label[old] = new;
        }
        let mut tree = Self::new(root);
        for &old in &order[1..] {
            tree.push(label[parents[old]], tokens[old]);
        }
        tree
    }

    /// A tree of `root` and `nodes` (`(parent, token)`, a node's parent before it, depths never
    /// decreasing), laid out as given; `None` when they are not such a tree or too many.
    pub fn with_nodes(root: u32, nodes: &[(usize, u32)]) -> Option<Self> {
        if nodes.len() >= Self::MAX_NODES {
            return None;
        }
        let mut tree = Self::new(root);
        for (i, &(parent, token)) in nodes.iter().enumerate() {
            let depth = tree.depths.get(parent).map(|d| d + 1)?;
            if parent > i || tree.depths.last().is_some_and(|&d| d > depth) {
                return None;
            }
            tree.push(parent, token);
        }
        Some(tree)
    }

    /// Appends `token` below node `parent`; the caller keeps breadth-first order.
    fn push(&mut self, parent: usize, token: u32) {
        let i = self.tokens.len();
        debug_assert!(i < Self::MAX_NODES && parent < i);
        let depth = self.depths[parent] + 1;
        debug_assert!(self.depths.last().is_none_or(|&d| d <= depth));
        self.tokens.push(token);
        self.parents.push(parent);
        self.depths.push(depth);
        self.visible.push(self.visible[parent] | 1 << i);
    }

    /// Nodes, the root included.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Whether the tree is only its root.
    pub fn is_empty(&self) -> bool {
        self.tokens.len() == 1
    }

    /// The nodes' tokens, root first: the pass's input.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Whether every node has at most one child (consecutive positions: no mask needed).
    pub fn is_chain(&self) -> bool {
        self.parents
            .iter()
            .enumerate()
            .skip(1)
            .all(|(i, &p)| p == i - 1)
    }

    /// The attention mask of the pass over [`Self::tokens`].
    pub fn mask(&self) -> TreeMask<'_> {
        TreeMask {
            visible: &self.visible,
            depths: &self.depths,
        }
    }

    fn child_with(&self, node: usize, token: u32) -> Option<usize> {
        (node + 1..self.len()).find(|&c| self.parents[c] == node && self.tokens[c] == token)
    }
}

/// What verifying one sequence's tree produced.
#[derive(Debug, Clone, PartialEq)]
pub struct TreeVerdict {
    /// The accepted candidates, then the token drawn after the last of them.
    pub tokens: Vec<SampledToken>,
    /// Nodes of the accepted path below the root, in order (their K/V are to be kept).
    pub path: Vec<usize>,
}

/// Walks `tree` with `sampler` (see the module documentation): `rows[i]` are the logits
/// after node `i`. Every token returned is recorded in `sampler`.
pub fn verify_tree(sampler: &mut Sampler, tree: &TokenTree, rows: &[&[f32]]) -> TreeVerdict {
    debug_assert_eq!(rows.len(), tree.len());
    let mut tokens = Vec::new();
    let mut path = Vec::new();
    let mut node = 0;
    loop {
        let token = sampler.sample(rows[node]);
        let next = tree.child_with(node, token.id);
        tokens.push(token);
        match next {
            Some(child) => {
                path.push(child);
                node = child;
            }
            None => break,
        }
    }
    TreeVerdict { tokens, path }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::SamplingParams;

    #[test]
    fn paths_merge_into_a_breadth_first_tree() {
        let tree = TokenTree::from_paths(9, &[vec![1, 2, 3], vec![1, 4], vec![5, 2]], 64);
        // Root 9; depth 1: 1, 5; depth 2: 2 (under 1), 4 (under 1), 2 (under 5); depth 3: 3.
        assert_eq!(tree.tokens(), &[9, 1, 5, 2, 4, 2, 3]);
        assert_eq!(tree.parents, vec![0, 0, 0, 1, 1, 2, 3]);
        assert_eq!(tree.depths, vec![0, 1, 1, 2, 2, 2, 3]);
        assert_eq!(tree.visible[6], 0b100_1011);
        assert!(!tree.is_chain());
        assert!(TokenTree::from_paths(9, &[vec![1, 2], vec![1]], 64).is_chain());
    }

    #[test]
    fn a_tree_stops_growing_at_its_capacity() {
        let paths: Vec<Vec<u32>> = (0..40).map(|i| vec![i, 100 + i]).collect();
        let tree = TokenTree::from_paths(0, &paths, 64);
        assert_eq!(tree.len(), TokenTree::MAX_NODES);
        assert!(tree.depths.windows(2).all(|w| w[0] <= w[1]));
    }

    fn one_hot(vocab: usize, at: u32) -> Vec<f32> {
        let mut row = vec![0f32; vocab];
        row[at as usize] = 10.0;
        row
    }

    #[test]
    fn greedy_walk_follows_the_argmax_through_the_tree() {
        // Root 0 with children 1 and 2; 2 has child 3.
        let tree = TokenTree::from_paths(0, &[vec![1], vec![2, 3]], 64);
        assert_eq!(tree.tokens(), &[0, 1, 2, 3]);
        // After the root the model says 2, after 2 it says 3, after 3 it says 4.
        let rows = [one_hot(5, 2), one_hot(5, 0), one_hot(5, 3), one_hot(5, 4)];
        let refs: Vec<&[f32]> = rows.iter().map(Vec::as_slice).collect();
        let mut s = Sampler::new(SamplingParams::default(), &[]);
        let v = verify_tree(&mut s, &tree, &refs);
        assert_eq!(
            v.tokens.iter().map(|t| t.id).collect::<Vec<_>>(),
            vec![2, 3, 4]
        );
        assert_eq!(v.path, vec![2, 3]);
        assert_eq!(s.num_generated(), 3);
        // The model disagrees at the root: one token, nothing kept.
        let rows = [one_hot(5, 4), one_hot(5, 0), one_hot(5, 3), one_hot(5, 4)];
        let refs: Vec<&[f32]> = rows.iter().map(Vec::as_slice).collect();
        let v = verify_tree(
            &mut Sampler::new(SamplingParams::default(), &[]),
            &tree,
            &refs,
        );
        assert_eq!(v.tokens.iter().map(|t| t.id).collect::<Vec<_>>(), vec![4]);
        assert!(v.path.is_empty());
    }

    /// Whatever the tree, the first two tokens' joint distribution is the model's: chi-square
    /// over many seeds, for trees that cover likely, unlikely and no continuations.
    #[test]
    fn sampling_through_a_tree_keeps_the_target_distribution() {
        let root_row = [1.0f32, 0.5, -0.3, 0.9];
        let child_row = [0.2f32, -1.0, 0.7, 0.1];
        let softmax = |r: &[f32]| -> Vec<f64> {
            let z: f32 = r.iter().map(|x| x.exp()).sum();
            r.iter().map(|x| (x.exp() / z) as f64).collect()
        };
        // Every node's row after the root is `child_row`: the second token's law.
        let (p1, p2) = (softmax(&root_row), softmax(&child_row));
        let n = 20_000;
        for paths in [vec![vec![0, 2], vec![3]], vec![vec![1], vec![2, 2]], vec![]] {
            let tree = TokenTree::from_paths(7, &paths, 64);
            let mut rows: Vec<&[f32]> = vec![&root_row];
            rows.extend(std::iter::repeat_n(&child_row[..], tree.len() - 1));
            let mut counts = [[0usize; 4]; 4];
            for seed in 0..n {
                let params = SamplingParams {
                    temperature: 1.0,
                    seed: Some(seed),
                    ..Default::default()
                };
                let mut s = Sampler::new(params, &[]);
                let v = verify_tree(&mut s, &tree, &rows);
                // Tokens after a rejection are drawn from the node's row as decoding would.
                let first = v.tokens[0].id as usize;
                let second = match v.tokens.get(1) {
                    Some(t) => t.id as usize,
                    None => s.sample(&child_row).id as usize,
                };
                counts[first][second] += 1;
            }
            let mut chi2 = 0.0;
            for a in 0..4 {
                for b in 0..4 {
                    let e = p1[a] * p2[b] * n as f64;
                    chi2 += (counts[a][b] as f64 - e).powi(2) / e;
                }
            }
            // 15 degrees of freedom: P(chi2 > 37.7) = 0.001.
            assert!(
                chi2 < 37.7,
                "paths {paths:?}: chi2 {chi2}, counts {counts:?}"
            );
        }
    }
}
