//! EAGLE-style speculation. The draft layer (`head`, its pass `layer`) keeps its own K/V for
//! every position of a sequence, computed from the target's final hidden states: after each
//! pass it catches up on the positions the pass computed ([`EagleDraft::catch_up`]), and
//! before the next one it grows a tree below the pending token (`grow`). A draft vocabulary
//! (`vocab`) narrows the tokens it scores.

mod grow;
mod head;
mod layer;
mod vocab;

use std::collections::HashMap;

pub use head::EagleHead;

use crate::EngineError;
use crate::kv_cache::KvCache;
use crate::model::{ForwardOutput, LogitsWanted, Model, SequenceChunk};
use crate::sequence::Sequence;
use crate::speculative::proposal::{CatchUp, Settled};
use crate::speculative::state::ProposerState;
use crate::speculative::tree::TokenTree;
use vocab::DraftVocabHead;

/// The draft layer, its cache over the target's block ids, the trees' width, and the LM
/// head's rows for its draft vocabulary when it has one.
pub struct EagleDraft {
    head: EagleHead,
    cache: KvCache,
    /// Nodes kept per level of a tree.
    width: usize,
    vocab: Option<DraftVocabHead>,
}

impl EagleDraft {
    /// `head` growing trees `width` nodes (at least 1) a level for `target`, for which it must
    /// be made (checked when loaded). CPU backend only. Its cache is sized with the engine's.
    pub fn new(head: EagleHead, width: usize, target: &Model) -> Result<Self, EngineError> {
        if width == 0 {
            return Err(EngineError::InvalidBatch(
                "a draft-head tree needs a width of at least 1".into(),
            ));
        }
        if target.on_gpu() {
            return Err(EngineError::Device(
                "EAGLE draft layers run on the CPU backend only".into(),
            ));
        }
        let vocab = match &head.draft_vocab {
            Some(ids) => Some(DraftVocabHead::new(target, ids)?),
            None => None,
        };
        let cache = head.new_cache(0, 1);
        Ok(Self {
            head,
            cache,
            width,
            vocab,
        })
    }

    /// Replaces the cache with one of `num_blocks` blocks of `block_size` tokens.
    pub(crate) fn resize_cache(&mut self, num_blocks: usize, block_size: usize) {
        // Free the old pages before allocating the new ones.
        self.cache = self.head.new_cache(0, block_size);
        self.cache = self.head.new_cache(num_blocks, block_size);
    }

    /// Bytes one block of the cache takes.
    pub(crate) fn block_bytes(&self, block_size: usize) -> usize {
        self.head.block_bytes(block_size)
    }

    /// Nodes below the root of a tree `depth` levels deep.
    pub(crate) fn lookahead(&self, depth: usize) -> usize {
        (self.width * depth).min(TokenTree::MAX_NODES - 1)
    }

    /// What the layer has yet to see of `seq` after the pass (`out`) settled it: every
    /// position from the last one it saw, each with the target's state one place earlier
    /// (zeros where the pass and the last one did not compute it). The sequence's state
    /// becomes the last computed position's.
    pub(crate) fn settle(
        &self,
        seq: &mut Sequence,
        settled: &Settled<'_>,
        out: &ForwardOutput,
    ) -> Option<CatchUp> {
        let (h, ci, first) = (self.head.hidden, settled.chunk, settled.start);
        let rows = settled.computed_rows;
        let ProposerState::Eagle { computed, hidden } = &mut seq.proposer else {
            return None;
        };
        let start = *computed;
        let mut features = Vec::with_capacity(seq.computed.saturating_sub(start) * h);
        for j in start..seq.computed {
            let state = match j.checked_sub(1) {
                Some(p) if p >= first => out.token_hidden(ci, rows[p - first]),
                Some(p) if p + 1 == first && hidden.len() == h => Some(&hidden[..]),
                _ => None,
            };
            match state {
                Some(s) => features.extend_from_slice(s),
                None => features.resize(features.len() + h, 0.0),
            }
        }
        if let Some(last) = rows.last().and_then(|&r| out.token_hidden(ci, r)) {
            hidden.clear();
            hidden.extend_from_slice(last);
        }
        Some(CatchUp {
            id: settled.id,
            start,
            features,
        })
    }

    /// Runs the layer over each sequence's positions that the last pass computed.
    pub(crate) fn catch_up(
        &mut self,
        target: &Model,
        sequences: &mut HashMap<u64, Sequence>,
        work: Vec<CatchUp>,
    ) -> Result<(), EngineError> {
        let work: Vec<CatchUp> = work
            .into_iter()
            .filter(|c| !c.features.is_empty())
            .collect();
        if work.is_empty() {
            return Ok(());
        }
        let h = self.head.hidden;
        let chunks: Vec<SequenceChunk<'_>> = work
            .iter()
            .map(|c| {
                let seq = &sequences[&c.id];
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
        self.head
            .forward(target, &chunks, &features, &mut self.cache)?;
        for c in work {
            if let Some(seq) = sequences.get_mut(&c.id)
                && let ProposerState::Eagle { computed, .. } = &mut seq.proposer
            {
                *computed = c.start + c.features.len() / h;
            }
        }
        Ok(())
    }
}
