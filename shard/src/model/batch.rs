//! A batch of chunks flattened into one pass (vLLM style): every token's id, position and
//! cache slot, each sequence's rows, and which rows need logits. Both backends run from it.

use std::ops::Range;

use tessera_kernels::cpu::attention::{AttentionSeq, slot};

use super::{HiddenStates, LogitsWanted, SequenceChunk};
use crate::EngineError;

pub(crate) struct FlatBatch<'a> {
    pub(crate) input_ids: Vec<u32>,
    pub(crate) positions: Vec<u32>,
    /// Per token, the sequence length whose rotary frequencies it takes (length-dependent
    /// RoPE): the prompt's length for a prompt token, else the length it is decoded at.
    pub(crate) rope_lens: Vec<usize>,
    /// Cache slot (block · block_size + offset) of each token.
    pub(crate) slots: Vec<usize>,
    pub(crate) seqs: Vec<AttentionSeq<'a>>,
    /// Rows that go through the LM head, in output order.
    pub(crate) logit_rows: Vec<usize>,
    /// Per chunk, its range of `logit_rows`.
    pub(crate) out_rows: Vec<Range<usize>>,
    pub(crate) block_size: usize,
    /// The logit rows' final hidden states come back with their logits.
    pub(crate) keep_hidden: bool,
    /// Rows without logits whose final hidden states come back too, after the logit rows'
    /// (every other row, when a draft layer reads the states of every position).
    pub(crate) hidden_only_rows: Vec<usize>,
}

impl<'a> FlatBatch<'a> {
    /// Flattens `chunks` (already checked against the cache) for blocks of `block_size`.
    #[cfg(test)]
    pub(crate) fn new(chunks: &[SequenceChunk<'a>], block_size: usize) -> Self {
        Self::keeping_hidden(chunks, block_size, HiddenStates::None)
    }

    /// [`Self::new`], keeping the final hidden states `kept` says.
    pub(crate) fn keeping_hidden(
        chunks: &[SequenceChunk<'a>],
        block_size: usize,
        kept: HiddenStates,
    ) -> Self {
        let tokens: usize = chunks.iter().map(|c| c.tokens.len()).sum();
        let mut b = FlatBatch {
            input_ids: Vec::with_capacity(tokens),
            positions: Vec::with_capacity(tokens),
            rope_lens: Vec::with_capacity(tokens),
            slots: Vec::with_capacity(tokens),
            seqs: Vec::with_capacity(chunks.len()),
            logit_rows: Vec::new(),
            out_rows: Vec::with_capacity(chunks.len()),
            block_size,
            keep_hidden: kept != HiddenStates::None,
            hidden_only_rows: Vec::new(),
        };
        for c in chunks {
            let first_row = b.input_ids.len();
            for (i, &t) in c.tokens.iter().enumerate() {
                // A tree's rows take consecutive slots but rotate at their depth.
                let p = c.start_position + i;
                let depth = c.tree.map_or(i, |tree| tree.depths[i] as usize);
                b.input_ids.push(t);
                b.positions.push((c.start_position + depth) as u32);
                b.rope_lens
                    .push(c.prompt_len.max(c.start_position + depth + 1));
                b.slots.push(slot(c.block_table, block_size, p));
            }
            b.seqs.push(AttentionSeq {
                first_row,
                rows: c.tokens.len(),
                first_position: c.start_position,
                block_table: c.block_table,
                tree: c.tree,
            });
            let before = b.logit_rows.len();
            match c.logits {
                LogitsWanted::None => {}
                LogitsWanted::Last if !c.tokens.is_empty() => {
                    b.logit_rows.push(first_row + c.tokens.len() - 1)
                }
                LogitsWanted::Last => {}
                LogitsWanted::All => b.logit_rows.extend(first_row..first_row + c.tokens.len()),
            }
            b.out_rows.push(before..b.logit_rows.len());
        }
        if kept == HiddenStates::All {
            let mut has_logits = vec![false; tokens];
            b.logit_rows.iter().for_each(|&r| has_logits[r] = true);
            b.hidden_only_rows = (0..tokens).filter(|&r| !has_logits[r]).collect();
        }
        b
    }

    /// Rows whose final hidden states the pass computes: the logit rows, then the others kept.
    pub(crate) fn hidden_rows(&self) -> impl Iterator<Item = usize> + '_ {
        self.logit_rows
            .iter()
            .chain(&self.hidden_only_rows)
            .copied()
    }

    /// Tokens in the pass.
    pub(crate) fn tokens(&self) -> usize {
        self.input_ids.len()
    }
}

/// A batch's index arrays as the GPU kernels take them (i32, block tables as one matrix).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
#[derive(Debug, PartialEq)]
pub(crate) struct KernelIndex {
    pub(crate) ids: Vec<i32>,
    pub(crate) positions: Vec<i32>,
    pub(crate) slots: Vec<i32>,
    /// `[seqs, max_blocks]`, unused entries 0.
    pub(crate) block_tables: Vec<i32>,
    pub(crate) max_blocks: usize,
    /// Every sequence has exactly one new row: the paged decode kernel runs.
    pub(crate) decode: bool,
    /// Each sequence's context length, its new rows included.
    pub(crate) context_lens: Vec<i32>,
    pub(crate) max_context: usize,
    /// First row of each sequence, then the total.
    pub(crate) cu_seqlens: Vec<i32>,
    /// Position of each sequence's first new row.
    pub(crate) first_pos: Vec<i32>,
    pub(crate) max_rows: usize,
    /// Rows that go through the LM head, as runs `(first row, rows)`.
    pub(crate) logit_runs: Vec<(usize, usize)>,
}

fn index_i32(v: usize, what: &str) -> Result<i32, EngineError> {
    i32::try_from(v)
        .map_err(|_| EngineError::InvalidBatch(format!("{what} {v} does not fit in 32 bits")))
}

#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
impl FlatBatch<'_> {
    /// The index arrays of the GPU kernels.
    pub(crate) fn kernel_index(&self) -> Result<KernelIndex, EngineError> {
        let all =
            |v: &mut dyn Iterator<Item = usize>, what: &str| -> Result<Vec<i32>, EngineError> {
                v.map(|x| index_i32(x, what)).collect()
            };
        let max_blocks = self
            .seqs
            .iter()
            .map(|q| q.block_table.len())
            .max()
            .unwrap_or(0)
            .max(1);
        let mut block_tables = vec![0i32; self.seqs.len() * max_blocks];
        for (row, q) in block_tables.chunks_exact_mut(max_blocks).zip(&self.seqs) {
            for (t, &blk) in row.iter_mut().zip(q.block_table) {
                *t = index_i32(blk as usize, "block id")?;
            }
        }
        let mut cu_seqlens = all(&mut self.seqs.iter().map(|q| q.first_row), "row")?;
        cu_seqlens.push(index_i32(self.tokens(), "rows")?);
        Ok(KernelIndex {
            ids: all(&mut self.input_ids.iter().map(|&t| t as usize), "token id")?,
            positions: all(&mut self.positions.iter().map(|&p| p as usize), "position")?,
            slots: all(&mut self.slots.iter().copied(), "cache slot")?,
            block_tables,
            max_blocks,
            decode: !self.seqs.is_empty() && self.seqs.iter().all(|q| q.rows == 1),
            context_lens: all(
                &mut self.seqs.iter().map(|q| q.first_position + q.rows),
                "context length",
            )?,
            max_context: self
                .seqs
                .iter()
                .map(|q| q.first_position + q.rows)
                .max()
                .unwrap_or(0),
            cu_seqlens,
            first_pos: all(&mut self.seqs.iter().map(|q| q.first_position), "position")?,
            max_rows: self.seqs.iter().map(|q| q.rows).max().unwrap_or(0),
            logit_runs: runs(&self.logit_rows),
        })
    }
}

/// Consecutive rows joined into runs, so that gathering them takes one copy per run.
fn runs(rows: &[usize]) -> Vec<(usize, usize)> {
    let mut out: Vec<(usize, usize)> = Vec::new();
    for &r in rows {
        match out.last_mut() {
            Some((start, n)) if *start + *n == r => *n += 1,
            _ => out.push((r, 1)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logit_rows_join_into_runs() {
        assert_eq!(runs(&[]), vec![]);
        assert_eq!(runs(&[3]), vec![(3, 1)]);
        assert_eq!(runs(&[0, 1, 2, 5, 7, 8]), vec![(0, 3), (5, 1), (7, 2)]);
    }

    #[test]
    fn a_mixed_batch_flattens_into_the_kernels_index() {
        // A 3-token chunk at position 4 of an 8-token prompt (blocks 7, 2 of 4 slots) and a
        // decode at 9 after a 6-token prompt.
        let chunks = [
            SequenceChunk {
                tokens: &[10, 11, 12],
                start_position: 4,
                block_table: &[7, 2],
                logits: LogitsWanted::All,
                tree: None,
                prompt_len: 8,
            },
            SequenceChunk {
                tokens: &[13],
                start_position: 9,
                block_table: &[1, 3, 5],
                logits: LogitsWanted::Last,
                tree: None,
                prompt_len: 6,
            },
        ];
        let b = FlatBatch::new(&chunks, 4);
        assert_eq!(b.slots, vec![8, 9, 10, 21]);
        assert_eq!(b.rope_lens, vec![8, 8, 8, 10]);
        let k = b.kernel_index().unwrap();
        assert_eq!(
            k,
            KernelIndex {
                ids: vec![10, 11, 12, 13],
                positions: vec![4, 5, 6, 9],
                slots: vec![8, 9, 10, 21],
                block_tables: vec![7, 2, 0, 1, 3, 5],
                max_blocks: 3,
                decode: false,
                context_lens: vec![7, 10],
                max_context: 10,
                cu_seqlens: vec![0, 3, 4],
                first_pos: vec![4, 9],
                max_rows: 3,
                logit_runs: vec![(0, 4)],
            }
        );
        let decode = FlatBatch::new(&chunks[1..], 4).kernel_index().unwrap();
        assert!(decode.decode);
        assert_eq!(decode.context_lens, vec![10]);
    }
}
