//! Medusa speculation: before the pass, the heads (`heads`) read each decoding sequence's final
//! hidden state, kept from the pass that produced its pending token, and propose a tree of the
//! likeliest paths (`paths`) below the pending token.

mod heads;
mod paths;

use std::collections::HashMap;

pub use heads::MedusaHeads;
pub use paths::likeliest_paths;

use crate::EngineError;
use crate::model::{ForwardOutput, Model};
use crate::sequence::Sequence;
use crate::speculative::proposal::{Proposal, Settled};
use crate::speculative::state::ProposerState;
use crate::speculative::tree::TokenTree;

/// Medusa heads and the shape of the trees they propose.
pub struct MedusaDraft {
    heads: MedusaHeads,
    /// Candidate paths per tree.
    width: usize,
}

impl MedusaDraft {
    /// `heads` proposing trees of `width` candidate paths (at least 1); they must be made for
    /// the model's hidden size and vocabulary (checked when loaded).
    pub fn new(heads: MedusaHeads, width: usize) -> Result<Self, EngineError> {
        if width == 0 {
            return Err(EngineError::InvalidBatch(
                "a draft-head tree needs a width of at least 1".into(),
            ));
        }
        Ok(Self { heads, width })
    }

    /// Nodes below the root of a tree `depth` heads deep.
    pub(crate) fn lookahead(&self, depth: usize) -> usize {
        let depth = depth.min(self.heads.num_heads());
        (self.width * depth).min(TokenTree::MAX_NODES - 1)
    }

    /// The heads' tree for every decoding sequence of `work` that has a hidden state and room
    /// in its blocks (of `block_size` tokens), through one product for all of them.
    pub(crate) fn propose(
        &self,
        target: &Model,
        sequences: &HashMap<u64, Sequence>,
        work: &[(u64, usize)],
        depth: usize,
        block_size: usize,
    ) -> Result<HashMap<u64, Proposal>, EngineError> {
        let mut trees = HashMap::new();
        let hidden = target.config().hidden_size;
        let vocab = target.config().vocab_size;
        // (id, nodes the tree may hold below its root).
        let eligible: Vec<(u64, usize)> = work
            .iter()
            .filter_map(|(id, _)| {
                let seq = sequences.get(id)?;
                let room = seq.room(block_size);
                let has_state = state(seq).is_some_and(|s| s.len() == hidden);
                (seq.is_decoding() && room > 0 && has_state).then_some((*id, room))
            })
            .collect();
        if eligible.is_empty() {
            return Ok(trees);
        }
        let states: Vec<f32> = eligible
            .iter()
            .flat_map(|(id, _)| state(&sequences[id]).unwrap_or_default().iter().copied())
            .collect();
        let depth = depth.min(self.heads.num_heads());
        let logits = self.heads.logits(target, &states, depth)?;
        for (i, &(id, room)) in eligible.iter().enumerate() {
            let seq = &sequences[&id];
            let root = seq.tokens[seq.computed];
            let rows = &logits[i * depth * vocab..(i + 1) * depth * vocab];
            let paths = likeliest_paths(rows, vocab, depth, self.width);
            let tree = TokenTree::from_paths(root, &paths, room + 1);
            trees.insert(id, Proposal::Tree(tree));
        }
        Ok(trees)
    }

    /// After the pass: `seq` keeps the final hidden state behind its new pending token.
    pub(crate) fn settle(seq: &mut Sequence, settled: &Settled<'_>, out: &ForwardOutput) {
        let Some(row) = settled.pending_row else {
            return;
        };
        if let ProposerState::Medusa { hidden } = &mut seq.proposer {
            hidden.clear();
            hidden.extend_from_slice(out.hidden_row(settled.chunk, row).unwrap_or_default());
        }
    }
}

/// The hidden state `seq` keeps for the heads.
fn state(seq: &Sequence) -> Option<&[f32]> {
    match &seq.proposer {
        ProposerState::Medusa { hidden } => Some(hidden),
        _ => None,
    }
}
