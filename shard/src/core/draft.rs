//! Draft-model speculation: the draft runs ahead of every decoding sequence before the
//! target's pass, which then verifies its proposals.

use std::collections::HashMap;

use super::{Engine, Sequence};
use crate::EngineError;
use crate::model::{HiddenStates, LogitsWanted, SequenceChunk};
use crate::speculative::Speculator;

/// What the draft proposed for one sequence: the tokens and the distributions they were
/// drawn from (`None` when greedy).
pub(super) type DraftProposal = (Vec<u32>, Option<Vec<Vec<f32>>>);

/// Whether `seq` decodes in this step (one pending token after its prompt).
pub(super) fn is_decoding(seq: &Sequence) -> bool {
    seq.tokens.len() - seq.computed == 1 && seq.computed >= seq.prompt_len
}

impl Engine {
    /// Runs the draft model ahead of every decoding sequence of `work`: first it catches up
    /// on the tokens it has not seen, then it proposes one token per pass, up to the depth the
    /// sequence's blocks leave room for.
    pub(super) fn propose_with_draft(
        &mut self,
        work: &[(u64, usize)],
    ) -> Result<HashMap<u64, DraftProposal>, EngineError> {
        let mut proposals: HashMap<u64, DraftProposal> = HashMap::new();
        let Some(spec) = (self.speculation)
            .filter(|s| s.speculator == Speculator::Draft && self.draft.is_some())
        else {
            return Ok(proposals);
        };
        let bs = self.cache.block_size();
        // (id, depth) of the sequences that decode this step.
        let eligible: Vec<(u64, usize)> = work
            .iter()
            .filter_map(|(id, _)| {
                let seq = self.sequences.get(id)?;
                let room = (seq.blocks.len() * bs).saturating_sub(seq.tokens.len());
                let depth = spec.depth.min(room);
                (is_decoding(seq) && depth > 0).then_some((*id, depth))
            })
            .collect();
        let rounds = eligible.iter().map(|&(_, d)| d).max().unwrap_or(0);
        for round in 0..rounds {
            let active: Vec<u64> = eligible
                .iter()
                .filter(|&&(_, d)| d > round)
                .map(|&(id, _)| id)
                .collect();
            self.draft_round(round, &active, &mut proposals)?;
        }
        Ok(proposals)
    }

    /// One draft pass over `active`: the first catches each sequence up, later ones feed
    /// back the last proposal.
    fn draft_round(
        &mut self,
        round: usize,
        active: &[u64],
        proposals: &mut HashMap<u64, DraftProposal>,
    ) -> Result<(), EngineError> {
        let Some(draft) = self.draft.as_mut() else {
            return Ok(());
        };
        let inputs: Vec<(u64, usize, Vec<u32>)> = active
            .iter()
            .map(|&id| {
                let seq = &self.sequences[&id];
                let len = seq.tokens.len();
                match proposals.get(&id).and_then(|(p, _)| p.last()) {
                    None => (
                        id,
                        seq.draft_computed,
                        seq.tokens[seq.draft_computed..].to_vec(),
                    ),
                    Some(&last) => (id, len + round - 1, vec![last]),
                }
            })
            .collect();
        let chunks: Vec<SequenceChunk<'_>> = inputs
            .iter()
            .map(|(id, start, tokens)| SequenceChunk {
                tokens,
                start_position: *start,
                block_table: &self.sequences[id].blocks,
                logits: LogitsWanted::Last,
                tree: None,
                prompt_len: self.sequences[id].prompt_len,
            })
            .collect();
        let out = draft
            .model
            .forward(&chunks, &mut draft.cache, HiddenStates::None)?;
        for (ci, (id, _, _)) in inputs.iter().enumerate() {
            let Some(seq) = self.sequences.get_mut(id) else {
                continue;
            };
            if round == 0 {
                seq.draft_computed = seq.tokens.len();
            }
            let Some(row) = out.last(ci) else { continue };
            let entry = proposals.entry(*id).or_insert_with(|| (Vec::new(), None));
            if seq.sampler.is_greedy() {
                entry.0.push(seq.sampler.choose(row));
            } else {
                let q = seq.sampler.processed_probs(row);
                let d = seq.sampler.draw_weighted(&q).unwrap_or(0);
                entry.0.push(d);
                entry.1.get_or_insert_with(Vec::new).push(q);
            }
        }
        Ok(())
    }
}
