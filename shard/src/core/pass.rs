//! One step's pass over the scheduled chunks: the proposer proposes for the decoding
//! sequences, the model runs every chunk with its proposals, each chunk's tokens are accepted
//! (`accept`), and the proposer catches up on what the pass settled.

use std::collections::HashMap;
use std::time::Instant;

use super::chunk::{Check, Chunk};
use super::{Engine, StepResult, StepTimings, nanos};
use crate::EngineError;
use crate::model::{ForwardOutput, HiddenStates, SequenceChunk};

impl Engine {
    /// Runs the pass over `work` (`(id, tokens)` to compute, in order).
    pub(super) fn run_pass(&mut self, work: &[(u64, usize)]) -> Result<StepResult, EngineError> {
        if work.is_empty() {
            return Ok(StepResult::default());
        }
        let start = Instant::now();
        let bs = self.cache.block_size();
        let mut proposals = match &mut self.speculation {
            Some(s) => s.propose(&self.model, &mut self.sequences, work, bs)?,
            None => HashMap::new(),
        };
        let chunks = self.chunks(work, &mut proposals)?;
        let out = self.forward(&chunks)?;
        let forward_done = Instant::now();
        let (outputs, catch_up) = self.accept(chunks, &out)?;
        if let Some(s) = &mut self.speculation {
            s.catch_up(&self.model, &mut self.sequences, catch_up)?;
        }
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

    /// The model's pass over `chunks`, keeping the hidden states the proposer reads.
    fn forward(&mut self, chunks: &[Chunk]) -> Result<ForwardOutput, EngineError> {
        let views: Vec<SequenceChunk<'_>> = chunks
            .iter()
            .map(|c| {
                let seq = &self.sequences[&c.id];
                SequenceChunk {
                    tokens: &c.input,
                    start_position: c.start,
                    block_table: &seq.blocks,
                    logits: c.logits,
                    tree: c.check.as_ref().map(Check::mask),
                    prompt_len: seq.prompt_len,
                }
            })
            .collect();
        let pooled = chunks.iter().any(|c| {
            self.sequences[&c.id]
                .pool
                .as_ref()
                .is_some_and(|p| p.needs_hidden())
        });
        let hidden = match &self.speculation {
            _ if pooled => HiddenStates::All,
            Some(s) => s.hidden_states(),
            None => HiddenStates::None,
        };
        self.model.forward(&views, &mut self.cache, hidden)
    }
}
