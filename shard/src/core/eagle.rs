//! EAGLE-style speculation. The draft layer keeps its own K/V for every position of a
//! sequence, computed from the target's final hidden states: after each pass it catches up on
//! the positions the pass computed (`catch_up_eagle`), and before the next one it grows a
//! tree below the pending token (`propose_with_eagle`), round by round: each round runs the
//! tree so far and keeps the `width` likeliest children of its deepest nodes by the product of
//! the draft's probabilities along their paths (EAGLE-2's beam). The tree it proposes is the
//! likeliest of all the nodes it grew, as many as the sequence's blocks leave room for.

use std::collections::HashMap;

use super::Engine;
use super::draft::is_decoding;
use crate::EngineError;
use crate::kv_cache::KvCache;
use crate::model::{LogitsWanted, SequenceChunk};
use crate::speculative::{DraftVocabHead, EagleHead, Speculator, TokenTree};

/// The draft layer, its cache over the target's block ids, the trees' width, and the LM
/// head's rows for its draft vocabulary when it has one.
pub(super) struct EagleDraft {
    pub(super) head: EagleHead,
    pub(super) cache: KvCache,
    pub(super) width: usize,
    pub(super) vocab: Option<DraftVocabHead>,
}

/// Positions a sequence's draft layer has yet to see, and the target's states before them.
pub(super) struct CatchUp {
    pub(super) id: u64,
    /// The first position.
    pub(super) start: usize,
    /// Per position `j`, the target's final hidden state at `j - 1` (zeros where there is none).
    pub(super) features: Vec<f32>,
}

/// A node of a growing tree.
struct Node {
    token: u32,
    parent: usize,
    depth: usize,
    /// Log-probability of its path under the draft.
    score: f32,
    /// The draft's output at the node once a round has run it (the feature its children read).
    state: Vec<f32>,
}

/// One sequence's growing tree.
struct Growing {
    id: u64,
    /// Rounds it may run: each adds `width` nodes to the draft's slots past the pending token.
    rounds: usize,
    /// The root (the pending token) first, in breadth-first order.
    nodes: Vec<Node>,
    /// Nodes the sequence's blocks leave room for, the root included.
    capacity: usize,
}

impl Engine {
    /// Runs the draft layer over each sequence's positions that the last pass computed.
    pub(super) fn catch_up_eagle(&mut self, work: Vec<CatchUp>) -> Result<(), EngineError> {
        let Some(eagle) = self.eagle.as_mut() else {
            return Ok(());
        };
        let work: Vec<CatchUp> = work
            .into_iter()
            .filter(|c| !c.features.is_empty())
            .collect();
        if work.is_empty() {
            return Ok(());
        }
        let h = eagle.head.hidden;
        let chunks: Vec<SequenceChunk<'_>> = work
            .iter()
            .map(|c| {
                let seq = &self.sequences[&c.id];
                SequenceChunk {
                    tokens: &seq.tokens[c.start..c.start + c.features.len() / h],
                    start_position: c.start,
                    block_table: &seq.blocks,
                    logits: LogitsWanted::None,
                    tree: None,
                    prompt_len: seq.prompt_len,
                }
            })
            .collect();
        let features: Vec<f32> = work
            .iter()
            .flat_map(|c| c.features.iter().copied())
            .collect();
        eagle
            .head
            .forward(&self.model, &chunks, &features, &mut eagle.cache)?;
        for c in work {
            if let Some(seq) = self.sequences.get_mut(&c.id) {
                seq.eagle_computed = c.start + c.features.len() / h;
            }
        }
        Ok(())
    }

    /// The draft layer's tree for every decoding sequence of `work` that it has caught up on
    /// and whose blocks have room past the pending token.
    pub(super) fn propose_with_eagle(
        &mut self,
        work: &[(u64, usize)],
    ) -> Result<HashMap<u64, TokenTree>, EngineError> {
        let mut trees = HashMap::new();
        let (Some(spec), Some(eagle)) = (self.speculation, self.eagle.as_ref()) else {
            return Ok(trees);
        };
        if spec.speculator != Speculator::Eagle {
            return Ok(trees);
        }
        let (bs, width) = (self.cache.block_size(), eagle.width);
        let h = eagle.head.hidden;
        let mut growing: Vec<Growing> = work
            .iter()
            .filter_map(|&(id, _)| {
                let seq = self.sequences.get(&id)?;
                let pending = seq.tokens.len() - 1;
                let room = (seq.blocks.len() * bs).saturating_sub(seq.tokens.len());
                let ready = is_decoding(seq) && seq.eagle_computed == pending && room > 0;
                let capacity = (room + 1).min(TokenTree::MAX_NODES);
                // Round r runs the root and r levels of `width` nodes.
                let rounds = spec.depth.min((capacity - 1) / width + 1);
                (ready && seq.head_state.len() == h).then(|| Growing {
                    id,
                    rounds,
                    nodes: vec![Node {
                        token: seq.tokens[pending],
                        parent: 0,
                        depth: 0,
                        score: 0.0,
                        state: Vec::new(),
                    }],
                    capacity,
                })
            })
            .collect();
        let rounds = growing.iter().map(|g| g.rounds).max().unwrap_or(0);
        for round in 0..rounds {
            self.grow(&mut growing, round, width)?;
        }
        for g in growing {
            let root = g.nodes[0].token;
            let mut order: Vec<usize> = (1..g.nodes.len()).collect();
            order.sort_by(|&a, &b| {
                g.nodes[b]
                    .score
                    .total_cmp(&g.nodes[a].score)
                    .then(a.cmp(&b))
            });
            let paths: Vec<Vec<u32>> = order.iter().map(|&n| path(&g.nodes, n)).collect();
            trees.insert(g.id, TokenTree::from_paths(root, &paths, g.capacity));
        }
        Ok(trees)
    }

    /// One round: runs every growing tree's nodes through the draft layer (each reading its
    /// parent's output, the root the target's state), then gives the deepest nodes their
    /// likeliest children.
    fn grow(
        &mut self,
        growing: &mut [Growing],
        round: usize,
        width: usize,
    ) -> Result<(), EngineError> {
        let Some(eagle) = self.eagle.as_mut() else {
            return Ok(());
        };
        let h = eagle.head.hidden;
        let active: Vec<usize> = (0..growing.len())
            .filter(|&i| growing[i].rounds > round)
            .collect();
        let mut trees = Vec::with_capacity(active.len());
        let mut features = Vec::new();
        for &i in &active {
            let g = &growing[i];
            let seq = &self.sequences[&g.id];
            let nodes: Vec<(usize, u32)> =
                g.nodes[1..].iter().map(|n| (n.parent, n.token)).collect();
            let tree = TokenTree::with_nodes(g.nodes[0].token, &nodes).ok_or_else(|| {
                EngineError::InvalidBatch("a draft tree outgrew its layout".into())
            })?;
            features.extend_from_slice(&seq.head_state);
            for n in &g.nodes[1..] {
                features.extend_from_slice(&g.nodes[n.parent].state);
            }
            trees.push(tree);
        }
        let chunks: Vec<SequenceChunk<'_>> = active
            .iter()
            .zip(&trees)
            .map(|(&i, tree)| {
                let seq = &self.sequences[&growing[i].id];
                SequenceChunk {
                    tokens: tree.tokens(),
                    start_position: seq.tokens.len() - 1,
                    block_table: &seq.blocks,
                    logits: LogitsWanted::None,
                    tree: Some(tree.mask()),
                    prompt_len: seq.prompt_len,
                }
            })
            .collect();
        let out = eagle
            .head
            .forward(&self.model, &chunks, &features, &mut eagle.cache)?;
        // The deepest nodes' outputs, through the target's LM head in one product.
        let mut frontier: Vec<(usize, usize)> = Vec::new();
        let mut row = 0;
        for &i in &active {
            let g = &mut growing[i];
            for (n, node) in g.nodes.iter_mut().enumerate() {
                if node.depth == round {
                    node.state = out[(row + n) * h..(row + n + 1) * h].to_vec();
                    frontier.push((i, n));
                }
            }
            row += g.nodes.len();
        }
        let states: Vec<f32> = frontier
            .iter()
            .flat_map(|&(i, n)| growing[i].nodes[n].state.iter().copied())
            .collect();
        let (logits, vocab) = match &eagle.vocab {
            Some(head) => (head.logits(&states, frontier.len()), head.len()),
            None => (
                self.model.vocab_logits(&states, frontier.len())?,
                self.model.config().vocab_size,
            ),
        };
        let to_model = |t: u32| eagle.vocab.as_ref().map_or(t, |v| v.token(t as usize));
        add_children(growing, &frontier, &logits, vocab, width, round, to_model);
        Ok(())
    }
}

/// Gives each tree the `width` likeliest children of its `frontier` nodes (by the score of
/// their paths), from the frontier's rows of `logits` (`vocab` wide, in draft token ids that
/// `to_model` turns into the model's).
fn add_children(
    growing: &mut [Growing],
    frontier: &[(usize, usize)],
    logits: &[f32],
    vocab: usize,
    width: usize,
    round: usize,
    to_model: impl Fn(u32) -> u32,
) {
    let mut children: HashMap<usize, Vec<(f32, usize, u32)>> = HashMap::new();
    for (k, &(i, n)) in frontier.iter().enumerate() {
        let parent = &growing[i].nodes[n];
        let row = &logits[k * vocab..(k + 1) * vocab];
        for (token, lp) in crate::speculative::top_log_probs(row, width) {
            children
                .entry(i)
                .or_default()
                .push((parent.score + lp, n, to_model(token)));
        }
    }
    for (i, mut kids) in children {
        kids.sort_by(|a, b| b.0.total_cmp(&a.0).then((a.1, a.2).cmp(&(b.1, b.2))));
        kids.truncate(width);
        let g = &mut growing[i];
        for (score, parent, token) in kids {
            g.nodes.push(Node {
                token,
                parent,
                depth: round + 1,
                score,
                state: Vec::new(),
            });
        }
    }
}

/// The tokens from the root's child down to node `n`.
fn path(nodes: &[Node], mut n: usize) -> Vec<u32> {
    let mut tokens = Vec::with_capacity(nodes[n].depth);
    while n != 0 {
        tokens.push(nodes[n].token);
        n = nodes[n].parent;
    }
    tokens.reverse();
    tokens
}
