//! One forward pass over the scheduled chunks, then sampling: plain draws for sequences that
//! complete, verification for those that carried a speculator's proposals (a chain, or a
//! tree), prompt logprobs for those that asked.

use std::collections::HashMap;
use std::time::Instant;

use rayon::prelude::*;

use super::draft::{DraftProposal, is_decoding};
use super::eagle::CatchUp;
use super::{Engine, Sequence, StepOutput, StepResult, StepTimings, nanos};
use crate::EngineError;
use crate::model::{ForwardOutput, HiddenStates, LogitsWanted, SequenceChunk};
use crate::sampling::SampledToken;
use crate::speculative::{Speculator, TokenTree, propose_ngram, verify, verify_tree};

/// One sequence's input to the pass.
struct Chunk {
    id: u64,
    /// Position of the first input token.
    start: usize,
    /// Pending tokens of the chunk, followed by the speculator's proposals.
    input: Vec<u32>,
    /// How many of `input` are proposals.
    proposed: usize,
    /// The proposals as a tree below the pending token (`input` is its nodes; a chain for
    /// one line of proposals).
    tree: Option<TokenTree>,
}

impl Chunk {
    /// Tokens of the sequence itself (without proposals).
    fn len(&self) -> usize {
        self.input.len() - self.proposed
    }
}

impl Engine {
    /// Runs the pass over `work` (`(id, tokens)` to compute, in order).
    pub(super) fn run_pass(&mut self, work: &[(u64, usize)]) -> Result<StepResult, EngineError> {
        if work.is_empty() {
            return Ok(StepResult::default());
        }
        let start = Instant::now();
        let bs = self.cache.block_size();
        let mut drafted = self.propose_with_draft(work)?;
        let mut trees = self.propose_with_heads(work)?;
        trees.extend(self.propose_with_eagle(work)?);
        let chunks = self.chunks(work, &drafted, &mut trees)?;
        let views: Vec<SequenceChunk<'_>> = chunks
            .iter()
            .map(|c| {
                let seq = &self.sequences[&c.id];
                let completes = c.start + c.len() == seq.tokens.len();
                SequenceChunk {
                    tokens: &c.input,
                    start_position: c.start,
                    block_table: &seq.blocks,
                    logits: match (completes, seq.prefill.is_some() || c.proposed > 0) {
                        (_, true) => LogitsWanted::All,
                        (true, false) => LogitsWanted::Last,
                        (false, false) => LogitsWanted::None,
                    },
                    tree: c.tree.as_ref().map(TokenTree::mask),
                    prompt_len: seq.prompt_len,
                }
            })
            .collect();
        let hidden = self.hidden_states();
        let out = self.model.forward(&views, &mut self.cache, hidden)?;
        let wanted: Vec<LogitsWanted> = views.iter().map(|c| c.logits).collect();
        let forward_done = Instant::now();
        let mut drawn = self.draw_plain(&chunks, &out);
        let mut outputs = Vec::with_capacity(chunks.len());
        let mut catch_up = Vec::new();
        let hidden = self.model.config().hidden_size;
        for (ci, chunk) in chunks.into_iter().enumerate() {
            let Some(seq) = self.sequences.get_mut(&chunk.id) else {
                continue;
            };
            let mut output = StepOutput {
                request_id: chunk.id,
                prefill: None,
                tokens: Vec::new(),
                proposed: chunk.proposed,
            };
            seq.computed = chunk.start + chunk.len();
            if wanted[ci] == LogitsWanted::All {
                output.prefill = prompt_logprobs(seq, &chunk, &out, ci);
            }
            let rows = || -> Vec<&[f32]> { (0..=chunk.proposed).map(|i| out.row(ci, i)).collect() };
            // The row whose logits gave the sequence its new pending token.
            let mut last_row = out.rows[ci].len().checked_sub(1);
            // The rows of the positions the pass computed, in order.
            let mut computed_rows: Vec<usize> = (0..chunk.len()).collect();
            let walk = (self.heads.is_some() || self.eagle.is_some()) && chunk.proposed > 0;
            if let (Some(tree), true) = (&chunk.tree, walk) {
                let (tokens, moves, path) = accept_tree(seq, &chunk, tree, &rows(), bs);
                output.tokens = tokens;
                last_row = path.last().copied();
                computed_rows = path;
                self.cache.copy_slots(&moves)?;
            } else if chunk.proposed > 0 {
                let draft_probs = drafted.remove(&chunk.id).and_then(|(_, q)| q);
                output.tokens = accept_verified(seq, &chunk, &rows(), draft_probs.as_deref());
                last_row = Some(output.tokens.len() - 1);
                computed_rows = (0..output.tokens.len()).collect();
            } else if let Some(token) = drawn.remove(&chunk.id) {
                seq.tokens.push(token.id);
                output.tokens.push(token);
            }
            if self.eagle.is_some() {
                catch_up.push(eagle_catch_up(
                    seq,
                    &chunk,
                    &computed_rows,
                    &out,
                    ci,
                    hidden,
                ));
            } else if let Some(row) = last_row.filter(|_| !output.tokens.is_empty()) {
                seq.head_state.clear();
                seq.head_state
                    .extend_from_slice(out.hidden_row(ci, row).unwrap_or_default());
            }
            outputs.push(output);
        }
        self.catch_up_eagle(catch_up)?;
        let end = Instant::now();
        Ok(StepResult {
            outputs,
            timings: StepTimings {
                forward_ns: nanos(start, forward_done),
                sampling_ns: nanos(forward_done, end),
                total_ns: nanos(start, end),
            },
        })
    }

    /// Each scheduled sequence's input: its pending tokens up to the chunk's length, and for
    /// a decoding sequence the speculator's proposals where the router gave blocks for them.
    fn chunks(
        &self,
        work: &[(u64, usize)],
        drafted: &HashMap<u64, DraftProposal>,
        trees: &mut HashMap<u64, TokenTree>,
    ) -> Result<Vec<Chunk>, EngineError> {
        let bs = self.cache.block_size();
        let mut chunks = Vec::with_capacity(work.len());
        for &(id, n) in work {
            let seq = self
                .sequences
                .get(&id)
                .ok_or_else(|| EngineError::InvalidBatch(format!("request {id} is not running")))?;
            let pending = seq.tokens.len() - seq.computed;
            let len = n.min(pending);
            if len == 0 {
                continue;
            }
            let mut input = seq.tokens[seq.computed..seq.computed + len].to_vec();
            let mut proposed = 0;
            let mut tree = None;
            if let Some(spec) = self.speculation
                && is_decoding(seq)
            {
                let room = (seq.blocks.len() * bs).saturating_sub(seq.tokens.len());
                let proposals = match spec.speculator {
                    Speculator::Ngram => propose_ngram(&seq.tokens, spec.depth.min(room)),
                    Speculator::Draft => {
                        drafted.get(&id).map(|(p, _)| p.clone()).unwrap_or_default()
                    }
                    Speculator::Medusa | Speculator::Eagle => {
                        tree = trees.remove(&id).filter(|t| !t.is_empty());
                        tree.as_ref()
                            .map(|t| t.tokens()[1..].to_vec())
                            .unwrap_or_default()
                    }
                };
                proposed = proposals.len();
                if tree.is_none() && proposed > 0 {
                    tree = Some(TokenTree::from_paths(
                        input[0],
                        std::slice::from_ref(&proposals),
                        proposed + 1,
                    ));
                }
                input.extend(proposals);
            }
            chunks.push(Chunk {
                id,
                start: seq.computed,
                input,
                proposed,
                tree,
            });
        }
        Ok(chunks)
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
                    && self
                        .sequences
                        .get(&c.id)
                        .is_some_and(|seq| c.start + c.input.len() == seq.tokens.len())
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

impl Engine {
    /// The hidden states the draft heads read: every row's for an EAGLE layer, the logit
    /// rows' for Medusa heads.
    fn hidden_states(&self) -> HiddenStates {
        match (&self.eagle, &self.heads) {
            (Some(_), _) => HiddenStates::All,
            (None, Some(_)) => HiddenStates::LogitRows,
            (None, None) => HiddenStates::None,
        }
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

/// What the EAGLE draft layer has yet to see of `seq` after this pass computed the chunk's
/// positions (their rows: `computed_rows`): every position from the last one it saw, each
/// with the target's state one place earlier (zeros where the pass and the last one did not
/// compute it). The sequence's head state becomes the last computed position's.
fn eagle_catch_up(
    seq: &mut Sequence,
    chunk: &Chunk,
    computed_rows: &[usize],
    out: &ForwardOutput,
    ci: usize,
    hidden: usize,
) -> CatchUp {
    let start = seq.eagle_computed;
    let mut features = Vec::with_capacity(seq.computed.saturating_sub(start) * hidden);
    for j in start..seq.computed {
        let state = match j.checked_sub(1) {
            Some(p) if p >= chunk.start => out.token_hidden(ci, computed_rows[p - chunk.start]),
            Some(p) if p + 1 == chunk.start && seq.head_state.len() == hidden => {
                Some(&seq.head_state[..])
            }
            _ => None,
        };
        match state {
            Some(s) => features.extend_from_slice(s),
            None => features.resize(features.len() + hidden, 0.0),
        }
    }
    if let Some(last) = computed_rows.last().and_then(|&r| out.token_hidden(ci, r)) {
        seq.head_state.clear();
        seq.head_state.extend_from_slice(last);
    }
    CatchUp {
        id: chunk.id,
        start,
        features,
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
    // The draft's K/V are valid up to the accepted proposals it wrote.
    let depth = chunk.input.len() - 1;
    seq.draft_computed = seq
        .draft_computed
        .min(chunk.start + 1 + verdict.accepted.min(depth - 1));
    // K/V of accepted proposals are valid; those after them are overwritten later.
    seq.computed += verdict.accepted;
    seq.tokens.extend(verdict.tokens.iter().map(|t| t.id));
    verdict.tokens
}
