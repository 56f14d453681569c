//! How an EAGLE layer grows its tree below a decoding sequence's pending token, round by
//! round: each round runs the tree so far and keeps the `width` likeliest children of its
//! deepest nodes by the product of the draft's probabilities along their paths (EAGLE-2's
//! beam). The tree it proposes is the likeliest of all the nodes it grew, as many as the
//! sequence's blocks leave room for.

use std::collections::HashMap;

use super::EagleDraft;
use crate::EngineError;
use crate::model::{LogitsWanted, Model, SequenceChunk};
use crate::sequence::Sequence;
use crate::speculative::proposal::Proposal;
use crate::speculative::state::ProposerState;
use crate::speculative::top_tokens::top_log_probs;
use crate::speculative::tree::TokenTree;

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

impl EagleDraft {
    /// The layer's tree for every decoding sequence of `work` that it has caught up on and
    /// whose blocks (of `block_size` tokens) have room past the pending token, `depth` levels
    /// deep at most.
    pub(crate) fn propose(
        &mut self,
        target: &Model,
        sequences: &HashMap<u64, Sequence>,
        work: &[(u64, usize)],
        depth: usize,
        block_size: usize,
    ) -> Result<HashMap<u64, Proposal>, EngineError> {
        let (h, width) = (self.head.hidden, self.width);
        let mut growing: Vec<Growing> = work
            .iter()
            .filter_map(|&(id, _)| {
                let seq = sequences.get(&id)?;
                let pending = seq.tokens.len() - 1;
                let room = seq.room(block_size);
                let ProposerState::Eagle { computed, hidden } = &seq.proposer else {
                    return None;
                };
                let ready = seq.is_decoding() && *computed == pending && room > 0;
                let capacity = (room + 1).min(TokenTree::MAX_NODES);
                // Round r runs the root and r levels of `width` nodes.
                let rounds = depth.min((capacity - 1) / width + 1);
                (ready && hidden.len() == h).then(|| Growing {
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
            self.grow(target, sequences, &mut growing, round)?;
        }
        let mut trees = HashMap::with_capacity(growing.len());
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
            let tree = TokenTree::from_paths(root, &paths, g.capacity);
            trees.insert(g.id, Proposal::Tree(tree));
        }
        Ok(trees)
    }

    /// One round: runs every growing tree's nodes through the layer (each reading its
    /// parent's output, the root the target's state), then gives the deepest nodes their
    /// likeliest children.
    fn grow(
        &mut self,
        target: &Model,
        sequences: &HashMap<u64, Sequence>,
        growing: &mut [Growing],
        round: usize,
    ) -> Result<(), EngineError> {
        let h = self.head.hidden;
        let active: Vec<usize> = (0..growing.len())
            .filter(|&i| growing[i].rounds > round)
            .collect();
        let mut trees = Vec::with_capacity(active.len());
        let mut features = Vec::new();
        for &i in &active {
            let g = &growing[i];
            let nodes: Vec<(usize, u32)> =
                g.nodes[1..].iter().map(|n| (n.parent, n.token)).collect();
            let tree = TokenTree::with_nodes(g.nodes[0].token, &nodes).ok_or_else(|| {
                EngineError::InvalidBatch("a draft tree outgrew its layout".into())
            })?;
            if let ProposerState::Eagle { hidden, .. } = &sequences[&g.id].proposer {
                features.extend_from_slice(hidden);
            }
            for n in &g.nodes[1..] {
                features.extend_from_slice(&g.nodes[n.parent].state);
            }
            trees.push(tree);
        }
        let chunks: Vec<SequenceChunk<'_>> = active
            .iter()
            .zip(&trees)
            .map(|(&i, tree)| {
                let seq = &sequences[&growing[i].id];
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
        let out = self
            .head
            .forward(target, &chunks, &features, &mut self.cache)?;
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
        let (logits, vocab) = match &self.vocab {
            Some(head) => (head.logits(&states, frontier.len()), head.len()),
            None => (
                target.vocab_logits(&states, frontier.len())?,
                target.config().vocab_size,
            ),
        };
        let to_model = |t: u32| self.vocab.as_ref().map_or(t, |v| v.token(t as usize));
        let width = self.width;
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
        for (token, lp) in top_log_probs(row, width) {
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
