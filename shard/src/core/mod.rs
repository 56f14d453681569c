//! The shard's execution state: the model, its KV cache, and one table of live sequences.
//! Scheduling and block allocation belong to the router; each [`Engine::step`] applies the
//! router's plan to the table (who leaves, who joins, who grows), checks that it is possible,
//! and runs one forward pass and the sampling that follows.

mod accept;
mod admit;
mod chunk;
mod pass;
mod plan;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use crate::model::{HiddenStates, LogitsWanted, Model, SequenceChunk};
use crate::sampling::{Pattern, TokenVocab};
use crate::sequence::Sequence;
use crate::speculative::{Speculation, Speculator};
use crate::{EngineError, KvCache};
pub use plan::{NewSequence, RunningUpdate, StepOutput, StepPlan, StepResult, StepTimings};

/// The model, its cache, and every live sequence.
pub struct Engine {
    model: Model,
    cache: KvCache,
    sequences: HashMap<u64, Sequence>,
    speculation: Option<Speculation>,
    vocab: Option<Arc<TokenVocab>>,
    /// Recently compiled output patterns, by text: the `n` samples of a request, and requests
    /// that repeat a pattern, compile it (and walk its sets) once.
    patterns: HashMap<String, Arc<Pattern>>,
}

impl Engine {
    /// An engine over `model` with a cache of `num_blocks` blocks.
    pub fn new(model: Model, num_blocks: usize, block_size: usize) -> Result<Self, EngineError> {
        let cache = model.new_cache(num_blocks, block_size)?;
        Ok(Self {
            model,
            cache,
            sequences: HashMap::new(),
            speculation: None,
            vocab: None,
            patterns: HashMap::new(),
        })
    }

    /// The model's token bytes, for sequences with an output constraint (without them such
    /// sequences are refused).
    pub fn with_vocabulary(mut self, vocab: Arc<TokenVocab>) -> Self {
        self.vocab = Some(vocab);
        self
    }

    /// Speculates as `speculation` says for every decoding sequence (a depth of 0: not at
    /// all), its proposer's cache sized with the engine's.
    pub fn with_speculation(mut self, mut speculation: Speculation) -> Result<Self, EngineError> {
        if speculation.depth() == 0 {
            self.speculation = None;
            return Ok(self);
        }
        speculation.resize_cache(self.num_blocks(), self.block_size())?;
        self.speculation = Some(speculation);
        Ok(self)
    }

    /// Tokens proposed per step (0 without speculation).
    pub fn speculation_depth(&self) -> usize {
        self.speculation.as_ref().map_or(0, Speculation::depth)
    }

    /// The proposer, when speculating.
    pub fn speculator(&self) -> Option<Speculator> {
        self.speculation.as_ref().map(Speculation::speculator)
    }

    /// Slots past its tokens a decoding sequence's blocks should have for the proposals of
    /// one step: the depth of a chain, the nodes of a tree.
    pub fn lookahead(&self) -> usize {
        self.speculation.as_ref().map_or(0, Speculation::lookahead)
    }

    /// The model.
    pub fn model(&self) -> &Model {
        &self.model
    }

    /// Blocks in the cache.
    pub fn num_blocks(&self) -> usize {
        self.cache.num_blocks()
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.cache.block_size()
    }

    /// Live sequences (for tests and metrics).
    pub fn num_sequences(&self) -> usize {
        self.sequences.len()
    }

    /// Runs one scheduler step: `plan.leaving` leave the table, `plan.running` get their new
    /// blocks, `plan.new` join it, then one forward pass computes every scheduled chunk
    /// (running requests first, in the plan's order) and the sequences it completes sample.
    ///
    /// A plan that is not possible (an unknown running id, a duplicate, blocks that do not
    /// cover the tokens) is refused with [`EngineError::InvalidBatch`]. After any error the
    /// table is empty: the router abandons every request and starts over.
    pub fn step(&mut self, plan: StepPlan) -> Result<StepResult, EngineError> {
        for id in &plan.leaving {
            self.sequences.remove(id);
        }
        let result = self.scheduled(plan).and_then(|work| self.run_pass(&work));
        if result.is_err() {
            self.sequences.clear();
        }
        result
    }

    /// Applies the running deltas and admits the new sequences; returns `(id, tokens)` of
    /// every chunk to compute, in order.
    fn scheduled(&mut self, plan: StepPlan) -> Result<Vec<(u64, usize)>, EngineError> {
        let mut work = Vec::with_capacity(plan.running.len() + plan.new.len());
        for update in plan.running {
            let seq = self.sequences.get_mut(&update.id).ok_or_else(|| {
                EngineError::InvalidBatch(format!("request {} is not running", update.id))
            })?;
            if update.chunk_len == 0 {
                return Err(EngineError::InvalidBatch(format!(
                    "request {}: a running request is listed to compute no token",
                    update.id
                )));
            }
            seq.blocks.extend(update.new_blocks);
            work.push((update.id, update.chunk_len));
        }
        for seq in plan.new {
            let (id, chunk) = (seq.id, seq.chunk_len);
            if work.iter().any(|&(w, _)| w == id) {
                return Err(EngineError::InvalidBatch(format!(
                    "request {id} is both new and running"
                )));
            }
            let pending = seq.input_ids.len() - seq.cache_len.min(seq.input_ids.len());
            self.admit(seq)?;
            work.push((id, chunk.map_or(pending, |c| c.max(1))));
        }
        Ok(work)
    }

    /// Replaces the cache with one of `num_blocks` blocks, dropping every sequence.
    pub fn resize_cache(&mut self, num_blocks: usize) -> Result<(), EngineError> {
        self.sequences.clear();
        // Free the old pages before allocating the new ones.
        let bs = self.block_size();
        self.cache = self.model.new_cache(0, bs)?;
        self.cache = self.model.new_cache(num_blocks, bs)?;
        if let Some(s) = self.speculation.as_mut() {
            s.resize_cache(num_blocks, bs)?;
        }
        Ok(())
    }

    /// On a GPU, the bytes of KV cache (model and draft) that fit in `fraction` of the free
    /// device memory once a pass of `max_tokens` has its activations; `None` on the CPU.
    /// Shrinks the cache to one block first, so that the old cache does not count as used.
    pub fn device_kv_budget(
        &mut self,
        fraction: f32,
        max_tokens: usize,
    ) -> Result<Option<u64>, EngineError> {
        if !self.model.on_gpu() {
            return Ok(None);
        }
        self.resize_cache(1)?;
        self.model.device_kv_budget(fraction, max_tokens)
    }

    /// Bytes one KV block takes, for the model and its draft (model or layer) together.
    pub fn block_bytes(&self) -> usize {
        let bs = self.block_size();
        let m = &self.model;
        KvCache::block_bytes(m.config().num_layers, m.kv_layout(bs), m.kv_dtype())
            + self.speculation.as_ref().map_or(0, |s| s.block_bytes(bs))
    }

    /// A one-token pass on block 0, which the router never hands out. With several
    /// tensor-parallel ranks, only a check that the group is intact: health checks reach the
    /// ranks independently of the steps, and a forward pass here could pair its collectives
    /// with another rank's step.
    pub fn health_check(&mut self) -> Result<(), EngineError> {
        if self.model.partition().world_size > 1 {
            return self.model.check_peers();
        }
        let chunk = SequenceChunk {
            tokens: &[0],
            start_position: 0,
            block_table: &[0],
            logits: LogitsWanted::Last,
            tree: None,
            prompt_len: 1,
        };
        let out = self
            .model
            .forward(&[chunk], &mut self.cache, HiddenStates::None)?;
        match out.last(0) {
            Some(l) if l.iter().all(|v| v.is_finite()) => Ok(()),
            _ => Err(EngineError::InvalidBatch(
                "health check produced non-finite logits".into(),
            )),
        }
    }

    /// Runs a prefill of `tokens` tokens spread over the cache's blocks (then forgets it), so
    /// that the first real request does not pay for page faults and thread-pool start-up.
    pub fn warmup(&mut self, tokens: usize) -> Result<(), EngineError> {
        let bs = self.block_size();
        let tokens = tokens.clamp(1, (self.num_blocks() - 1) * bs);
        let ids: Vec<u32> = (0..tokens)
            .map(|i| (i % self.model.config().vocab_size) as u32)
            .collect();
        let blocks: Vec<u32> = (1..=tokens.div_ceil(bs) as u32).collect();
        let chunk = SequenceChunk {
            tokens: &ids,
            start_position: 0,
            block_table: &blocks,
            logits: LogitsWanted::Last,
            tree: None,
            prompt_len: tokens,
        };
        self.model
            .forward(&[chunk], &mut self.cache, HiddenStates::None)?;
        Ok(())
    }
}

/// Nanoseconds from `a` to `b`.
fn nanos(a: Instant, b: Instant) -> u64 {
    (b - a).as_nanos() as u64
}
