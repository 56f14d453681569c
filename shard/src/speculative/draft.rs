//! Draft-model speculation: a smaller model sharing the tokenizer runs ahead of every decoding
//! sequence before the target's pass, on its own paged cache over the target's block ids;
//! the target then verifies its chain of proposals by the rejection rule, against the
//! distributions the draft drew them from.

use std::collections::HashMap;

use crate::model::{HiddenStates, LogitsWanted, Model, SequenceChunk};
use crate::sequence::Sequence;
use crate::speculative::proposal::{Proposal, Settled};
use crate::speculative::state::ProposerState;
use crate::{EngineError, KvCache};

/// A draft model and its cache.
pub struct DraftModel {
    model: Model,
    cache: KvCache,
}

impl DraftModel {
    /// `draft`, to propose for `target`, whose tokenizer it must share: a different
    /// vocabulary is refused. Its cache is sized with the engine's.
    pub fn new(draft: Model, target: &Model) -> Result<Self, EngineError> {
        let (ours, theirs) = (target.config().vocab_size, draft.config().vocab_size);
        if ours != theirs {
            return Err(EngineError::InvalidBatch(format!(
                "the draft model has a vocabulary of {theirs} tokens, the model {ours}: a draft \
                 must share the model's tokenizer"
            )));
        }
        let cache = draft.new_cache(0, 1)?;
        Ok(Self {
            model: draft,
            cache,
        })
    }

    /// Replaces the cache with one of `num_blocks` blocks of `block_size` tokens.
    pub(crate) fn resize_cache(
        &mut self,
        num_blocks: usize,
        block_size: usize,
    ) -> Result<(), EngineError> {
        // Free the old pages before allocating the new ones.
        self.cache = self.model.new_cache(0, block_size)?;
        self.cache = self.model.new_cache(num_blocks, block_size)?;
        Ok(())
    }

    /// Bytes one block of the cache takes.
    pub(crate) fn block_bytes(&self, block_size: usize) -> usize {
        let m = &self.model;
        KvCache::block_bytes(m.config().num_layers, m.kv_layout(block_size), m.kv_dtype())
    }

    /// Runs ahead of every decoding sequence of `work`: first it catches up on the tokens it
    /// has not seen, then it proposes one token per pass, up to `depth` or the room the
    /// sequence's blocks (of `block_size` tokens) leave.
    pub(crate) fn propose(
        &mut self,
        sequences: &mut HashMap<u64, Sequence>,
        work: &[(u64, usize)],
        depth: usize,
        block_size: usize,
    ) -> Result<HashMap<u64, Proposal>, EngineError> {
        let mut proposals = HashMap::new();
        // (id, depth) of the sequences that decode this step.
        let eligible: Vec<(u64, usize)> = work
            .iter()
            .filter_map(|(id, _)| {
                let seq = sequences.get(id)?;
                let depth = depth.min(seq.room(block_size));
                (seq.is_decoding() && depth > 0).then_some((*id, depth))
            })
            .collect();
        let rounds = eligible.iter().map(|&(_, d)| d).max().unwrap_or(0);
        for round in 0..rounds {
            let active: Vec<u64> = eligible
                .iter()
                .filter(|&&(_, d)| d > round)
                .map(|&(id, _)| id)
                .collect();
            self.round(sequences, round, &active, &mut proposals)?;
        }
        Ok(proposals)
    }

    /// One draft pass over `active`: the first catches each sequence up, later ones feed
    /// back the last proposal.
    fn round(
        &mut self,
        sequences: &mut HashMap<u64, Sequence>,
        round: usize,
        active: &[u64],
        proposals: &mut HashMap<u64, Proposal>,
    ) -> Result<(), EngineError> {
        let inputs: Vec<(u64, usize, Vec<u32>)> = active
            .iter()
            .map(|&id| {
                let seq = &sequences[&id];
                let len = seq.tokens.len();
                match proposals.get(&id).and_then(last_proposed) {
                    None => {
                        let from = draft_computed(seq);
                        (id, from, seq.tokens[from..].to_vec())
                    }
                    Some(last) => (id, len + round - 1, vec![last]),
                }
            })
            .collect();
        let chunks: Vec<SequenceChunk<'_>> = inputs
            .iter()
            .map(|(id, start, tokens)| SequenceChunk {
                tokens,
                start_position: *start,
                block_table: &sequences[id].blocks,
                logits: LogitsWanted::Last,
                tree: None,
                prompt_len: sequences[id].prompt_len,
            })
            .collect();
        let out = self
            .model
            .forward(&chunks, &mut self.cache, HiddenStates::None)?;
        for (ci, (id, _, _)) in inputs.iter().enumerate() {
            let Some(seq) = sequences.get_mut(id) else {
                continue;
            };
            if round == 0 {
                let len = seq.tokens.len();
                if let ProposerState::Draft { computed } = &mut seq.proposer {
                    *computed = len;
                }
            }
            let Some(row) = out.last(ci) else { continue };
            let proposal = proposals.entry(*id).or_insert_with(|| Proposal::Chain {
                tokens: Vec::new(),
                draft_probs: None,
            });
            let Proposal::Chain {
                tokens,
                draft_probs,
            } = proposal
            else {
                continue;
            };
            if seq.sampler.is_greedy() {
                tokens.push(seq.sampler.choose(row));
            } else {
                let q = seq.sampler.processed_probs(row);
                let d = seq.sampler.draw_weighted(&q).unwrap_or(0);
                tokens.push(d);
                draft_probs.get_or_insert_with(Vec::new).push(q);
            }
        }
        Ok(())
    }

    /// After the target verified `seq`'s proposals: the draft's K/V stay valid up to the
    /// accepted proposals it wrote.
    pub(crate) fn settle(seq: &mut Sequence, settled: &Settled<'_>) {
        if settled.proposed == 0 {
            return;
        }
        if let ProposerState::Draft { computed } = &mut seq.proposer {
            let kept = settled.start + 1 + settled.accepted.min(settled.proposed - 1);
            *computed = (*computed).min(kept);
        }
    }
}

/// The last token a chain proposal holds.
fn last_proposed(proposal: &Proposal) -> Option<u32> {
    match proposal {
        Proposal::Chain { tokens, .. } => tokens.last().copied(),
        Proposal::Tree(_) => None,
    }
}

/// Tokens of `seq` whose K/V are in the draft's cache.
fn draft_computed(seq: &Sequence) -> usize {
    match seq.proposer {
        ProposerState::Draft { computed } => computed,
        _ => 0,
    }
}
