//! What the model lends a draft layer that shares its embedding, rotary tables and LM head (an
//! EAGLE-style layer, `speculative::eagle`): a batch flattened as the pass flattens it, with
//! its tokens embedded and their rotary tables, and the LM head's rows for a set of tokens.
//! CPU backend only.

use tessera_kernels::cpu::attention::AttentionSeq;

use super::backend::Backend;
use super::batch::FlatBatch;
use super::{Compute, HiddenStates, Model, SequenceChunk};
use crate::EngineError;

/// Chunks flattened into one batch, their tokens embedded.
pub(crate) struct EmbeddedBatch<'a> {
    flat: FlatBatch<'a>,
    /// Per token, the cosines of its rotary angles (the model's global RoPE).
    pub(crate) cos: Vec<f32>,
    /// Per token, the sines of its rotary angles.
    pub(crate) sin: Vec<f32>,
    /// `[tokens, hidden]`: every token's embedding, whole on every rank.
    pub(crate) embedded: Vec<f32>,
}

impl<'a> EmbeddedBatch<'a> {
    /// Tokens in the batch.
    pub(crate) fn tokens(&self) -> usize {
        self.flat.tokens()
    }

    /// Each token's cache slot.
    pub(crate) fn slots(&self) -> &[usize] {
        &self.flat.slots
    }

    /// Each chunk's rows and blocks, as attention reads them.
    pub(crate) fn seqs(&self) -> &[AttentionSeq<'a>] {
        &self.flat.seqs
    }

    /// Tokens per cache block.
    pub(crate) fn block_size(&self) -> usize {
        self.flat.block_size
    }
}

/// Why a draft layer cannot run on this model.
fn cpu_only() -> EngineError {
    EngineError::Device("EAGLE draft layers run on the CPU backend only".into())
}

impl Model {
    /// `chunks` flattened for blocks of `block_size`, with their tokens embedded. Every rank of
    /// a group must call it (the embedding is vocabulary-parallel).
    pub(crate) fn embed_batch<'a>(
        &self,
        chunks: &[SequenceChunk<'a>],
        block_size: usize,
    ) -> Result<EmbeddedBatch<'a>, EngineError> {
        let cpu = match &self.compute {
            Compute::Cpu(cpu) => cpu,
            #[allow(unreachable_patterns)]
            _ => return Err(cpu_only()),
        };
        let flat = FlatBatch::keeping_hidden(chunks, block_size, HiddenStates::None);
        let batch = cpu.upload(&flat)?;
        let mut embedded = vec![0f32; flat.tokens() * cpu.dims.hidden];
        cpu.embed(&batch, &mut embedded)?;
        cpu.all_reduce(&mut embedded)?;
        let (cos, sin) = (batch.cos, batch.sin);
        Ok(EmbeddedBatch {
            flat,
            cos,
            sin,
            embedded,
        })
    }

    /// `[ids, hidden]`: the LM head's rows of the tokens `ids`, in f32 (gathered from every
    /// rank under tensor parallelism: every rank must call it).
    pub(crate) fn lm_head_rows(&self, ids: &[u32]) -> Result<Vec<f32>, EngineError> {
        let (h, vocab) = (self.config.hidden_size, self.config.vocab_size);
        if let Some(&bad) = ids.iter().find(|&&t| t as usize >= vocab) {
            return Err(EngineError::InvalidBatch(format!(
                "draft vocabulary token {bad} is outside the model's {vocab}"
            )));
        }
        let w = match &self.compute {
            Compute::Cpu(cpu) => &cpu.weights,
            #[allow(unreachable_patterns)]
            _ => return Err(cpu_only()),
        };
        let head = w.lm_head.as_ref().unwrap_or(&w.embed);
        let mut rows = vec![0f32; ids.len() * h];
        for (row, &t) in rows.chunks_exact_mut(h).zip(ids) {
            if w.vocab.contains(&(t as usize)) {
                head.row_f32(t as usize - w.vocab.start, row);
            }
        }
        if self.partition.world_size > 1 {
            self.comm.all_reduce_f32(&mut rows)?;
        }
        Ok(rows)
    }
}
