//! A batch of chunks flattened into one pass (vLLM style): every token's id, position and
//! cache slot, each sequence's rows, and which rows need logits. Both backends run from it.

use std::ops::Range;

use tessera_kernels::cpu::attention::AttentionSeq;

use super::{LogitsWanted, SequenceChunk};

pub(crate) struct FlatBatch<'a> {
    pub(crate) input_ids: Vec<u32>,
    pub(crate) positions: Vec<u32>,
    /// Cache slot (block · block_size + offset) of each token.
    pub(crate) slots: Vec<usize>,
    pub(crate) seqs: Vec<AttentionSeq<'a>>,
    /// Rows that go through the LM head, in output order.
    pub(crate) logit_rows: Vec<usize>,
    /// Per chunk, its range of `logit_rows`.
    pub(crate) out_rows: Vec<Range<usize>>,
    pub(crate) block_size: usize,
}

impl<'a> FlatBatch<'a> {
    /// Flattens `chunks` (already checked against the cache) for blocks of `block_size`.
    pub(crate) fn new(chunks: &[SequenceChunk<'a>], block_size: usize) -> Self {
        let bs = block_size;
        let tokens: usize = chunks.iter().map(|c| c.tokens.len()).sum();
        let mut b = FlatBatch {
            input_ids: Vec::with_capacity(tokens),
            positions: Vec::with_capacity(tokens),
            slots: Vec::with_capacity(tokens),
            seqs: Vec::with_capacity(chunks.len()),
            logit_rows: Vec::new(),
            out_rows: Vec::with_capacity(chunks.len()),
            block_size,
        };
        for c in chunks {
            let first_row = b.input_ids.len();
            for (i, &t) in c.tokens.iter().enumerate() {
                let p = c.start_position + i;
                b.input_ids.push(t);
                b.positions.push(p as u32);
                b.slots.push(c.block_table[p / bs] as usize * bs + p % bs);
            }
            b.seqs.push(AttentionSeq {
                first_row,
                rows: c.tokens.len(),
                first_position: c.start_position,
                block_table: c.block_table,
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
        b
    }

    /// Tokens in the pass.
    pub(crate) fn tokens(&self) -> usize {
        self.input_ids.len()
    }
}
