//! What each chunk of a pass yields: plain draws for sequences that complete, verification for
//! those that carried proposals (a chain by the rejection rule, a tree by walking it), prompt
//! logprobs for those that asked; then what the proposer follows of it.

use std::collections::HashMap;

use rayon::prelude::*;

use super::chunk::{Check, Chunk};
use super::{Engine, StepOutput};
use crate::EngineError;
use crate::model::{ForwardOutput, LogitsWanted};
use crate::sampling::SampledToken;
use crate::sequence::Sequence;
use crate::speculative::{CatchUp, Settled, TokenTree, verify, verify_tree};

impl Engine {
    /// Each chunk's output from the pass's `out`, and what the proposer's layer has to catch
    /// up on.
    pub(super) fn accept(
        &mut self,
        chunks: Vec<Chunk>,
        out: &ForwardOutput,
    ) -> Result<(Vec<StepOutput>, Vec<CatchUp>), EngineError> {
        let bs = self.cache.block_size();
        let mut drawn = self.draw_plain(&chunks, out);
        let mut outputs = Vec::with_capacity(chunks.len());
        let mut catch_up = Vec::new();
        for (ci, chunk) in chunks.into_iter().enumerate() {
            let Some(seq) = self.sequences.get_mut(&chunk.id) else {
                continue;
            };
            seq.computed = chunk.start + chunk.len();
            if let Some(pool) = &mut seq.pool {
                let completes = seq.computed == seq.tokens.len();
                let head = self.model.score_head();
                let pooled = pool.take_chunk(
                    |i| out.token_hidden(ci, i),
                    (chunk.start, chunk.len(), completes),
                    out.last(ci),
                    |h| match head {
                        Some(head) => head.logits(h),
                        None => Err(EngineError::InvalidBatch(
                            "the model has no classification head".into(),
                        )),
                    },
                )?;
                outputs.push(StepOutput {
                    request_id: chunk.id,
                    prefill: None,
                    tokens: Vec::new(),
                    proposed: 0,
                    pooled,
                });
                continue;
            }
            let prefill = match chunk.logits {
                LogitsWanted::All => prompt_logprobs(seq, &chunk, out, ci),
                _ => None,
            };
            let rows = || -> Vec<&[f32]> { (0..=chunk.proposed).map(|i| out.row(ci, i)).collect() };
            // The rows of the positions the pass computed, in order.
            let (tokens, computed_rows) = match &chunk.check {
                Some(Check::Tree(tree)) => {
                    let (tokens, moves, path) = accept_tree(seq, &chunk, tree, &rows(), bs);
                    self.cache.copy_slots(&moves)?;
                    (tokens, path)
                }
                Some(Check::Chain { draft_probs, .. }) => {
                    let tokens = accept_verified(seq, &chunk, &rows(), draft_probs.as_deref());
                    let n = tokens.len();
                    (tokens, (0..n).collect())
                }
                None => {
                    let token = drawn.remove(&chunk.id);
                    if let Some(t) = &token {
                        seq.tokens.push(t.id);
                    }
                    (token.into_iter().collect(), (0..chunk.len()).collect())
                }
            };
            if let Some(s) = &self.speculation {
                // The row whose logits gave the sequence its new pending token.
                let pending_row = match chunk.check {
                    Some(_) => computed_rows.last().copied(),
                    None => out.rows[ci].len().checked_sub(1),
                };
                let settled = Settled {
                    id: chunk.id,
                    chunk: ci,
                    start: chunk.start,
                    proposed: chunk.proposed,
                    accepted: tokens.len().saturating_sub(1),
                    computed_rows: &computed_rows,
                    pending_row: pending_row.filter(|_| !tokens.is_empty()),
                };
                catch_up.extend(s.settle(seq, &settled, out));
            }
            outputs.push(StepOutput {
                request_id: chunk.id,
                prefill,
                tokens,
                proposed: chunk.proposed,
                pooled: None,
            });
        }
        Ok((outputs, catch_up))
    }

    /// Plain next-token draws (no proposals to verify), each a few passes over the
    /// vocabulary with the sequence's own sampler: on rayon's threads, one sequence each.
    fn draw_plain(&mut self, chunks: &[Chunk], out: &ForwardOutput) -> HashMap<u64, SampledToken> {
        let plain: HashMap<u64, usize> = chunks
            .iter()
            .enumerate()
            .filter(|(ci, c)| {
                c.proposed == 0
                    && out.last(*ci).is_some()
                    && self.sequences.get(&c.id).is_some_and(|seq| {
                        seq.pool.is_none() && c.start + c.input.len() == seq.tokens.len()
                    })
            })
            .map(|(ci, c)| (c.id, ci))
            .collect();
        self.sequences
            .par_iter_mut()
            .filter_map(|(id, seq)| {
                let ci = *plain.get(id)?;
                Some((*id, seq.sampler.sample(out.last(ci)?)))
            })
            .collect()
    }
}

/// Gathers the logprobs of the prompt tokens this chunk's logits score (the token at
/// position `p` is scored by the logits at `p - 1`); returns them all once the prompt is
/// computed.
fn prompt_logprobs(
    seq: &mut Sequence,
    chunk: &Chunk,
    out: &ForwardOutput,
    ci: usize,
) -> Option<Vec<(u32, f32)>> {
    let prefill = seq.prefill.as_mut()?;
    if chunk.start == 0 {
        prefill.push((seq.tokens[0], f32::NAN));
    }
    for i in 0..chunk.len() {
        let p = chunk.start + i + 1;
        if p < seq.prompt_len {
            let t = seq.tokens[p];
            prefill.push((t, seq.sampler.report(out.row(ci, i), t).logprob));
        }
    }
    if seq.computed >= seq.prompt_len {
        seq.prefill.take()
    } else {
        None
    }
}

/// Walks the chunk's tree with the sequence's sampler (`rows[i]`: the logits after node
/// `i`); returns the tokens the step produced, the slot copies that put the accepted path's
/// K/V at the positions it stands at, and the rows of the positions the pass computed (the
/// root's, then the accepted path's).
fn accept_tree(
    seq: &mut Sequence,
    chunk: &Chunk,
    tree: &TokenTree,
    rows: &[&[f32]],
    block_size: usize,
) -> (Vec<SampledToken>, Vec<(usize, usize)>, Vec<usize>) {
    let verdict = verify_tree(&mut seq.sampler, tree, rows);
    let slot = |p: usize| tessera_kernels::cpu::attention::slot(&seq.blocks, block_size, p);
    // Node `n` sits at `start + n` and stands at `start + depth`; nodes never sit before the
    // place they move to, so copying in path order overwrites nothing still needed.
    let moves: Vec<(usize, usize)> = verdict
        .path
        .iter()
        .enumerate()
        .filter(|&(i, &node)| node != i + 1)
        .map(|(i, &node)| (slot(chunk.start + node), slot(chunk.start + i + 1)))
        .collect();
    seq.computed += verdict.path.len();
    seq.tokens.extend(verdict.tokens.iter().map(|t| t.id));
    let rows = std::iter::once(0).chain(verdict.path).collect();
    (verdict.tokens, moves, rows)
}

/// Verifies the chunk's proposals against their logits rows, keeps the accepted ones'
/// K/V, and returns the tokens the step produced.
fn accept_verified(
    seq: &mut Sequence,
    chunk: &Chunk,
    rows: &[&[f32]],
    draft_probs: Option<&[Vec<f32>]>,
) -> Vec<SampledToken> {
    let verdict = verify(&mut seq.sampler, rows, &chunk.input[1..], draft_probs);
    // K/V of accepted proposals are valid; those after them are overwritten later.
    seq.computed += verdict.accepted;
    seq.tokens.extend(verdict.tokens.iter().map(|t| t.id));
    verdict.tokens
}
