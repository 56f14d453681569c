//! Draft-head speculation: before the pass, the heads read each decoding sequence's final
//! hidden state (kept from the pass that produced its pending token) and propose a tree of
//! candidates below the pending token.

use std::collections::HashMap;

use super::Engine;
use super::draft::is_decoding;
use crate::EngineError;
use crate::speculative::{MedusaHeads, Speculator, TokenTree, likeliest_paths};

/// Medusa heads and the shape of the trees they propose.
pub(super) struct DraftHeads {
    pub(super) heads: MedusaHeads,
    /// Candidate paths per tree.
    pub(super) width: usize,
}

impl Engine {
    /// The heads' tree for every decoding sequence of `work` that has a hidden state and
    /// room in its blocks, through one product for all of them.
    pub(super) fn propose_with_heads(
        &self,
        work: &[(u64, usize)],
    ) -> Result<HashMap<u64, TokenTree>, EngineError> {
        let mut trees = HashMap::new();
        let (Some(spec), Some(draft)) = (self.speculation, self.heads.as_ref()) else {
            return Ok(trees);
        };
        if spec.speculator != Speculator::Medusa {
            return Ok(trees);
        }
        let bs = self.cache.block_size();
        let hidden = self.model.config().hidden_size;
        let vocab = self.model.config().vocab_size;
        // (id, nodes the tree may hold below its root).
        let eligible: Vec<(u64, usize)> = work
            .iter()
            .filter_map(|(id, _)| {
                let seq = self.sequences.get(id)?;
                let room = (seq.blocks.len() * bs).saturating_sub(seq.tokens.len());
                (is_decoding(seq) && room > 0 && seq.head_state.len() == hidden)
                    .then_some((*id, room))
            })
            .collect();
        if eligible.is_empty() {
            return Ok(trees);
        }
        let states: Vec<f32> = eligible
            .iter()
            .flat_map(|(id, _)| self.sequences[id].head_state.iter().copied())
            .collect();
        let depth = spec.depth.min(draft.heads.num_heads());
        let logits = draft.heads.logits(&self.model, &states, depth)?;
        for (i, &(id, room)) in eligible.iter().enumerate() {
            let seq = &self.sequences[&id];
            let root = seq.tokens[seq.computed];
            let rows = &logits[i * depth * vocab..(i + 1) * depth * vocab];
            let paths = likeliest_paths(rows, vocab, depth, draft.width);
            trees.insert(id, TokenTree::from_paths(root, &paths, room + 1));
        }
        Ok(trees)
    }
}
