//! The shard's execution state: the model, its KV cache, and the sequences of the cached
//! batches between `Prefill` and `Decode` calls. Scheduling and block allocation belong to
//! the router; this only executes what it is told and checks that it is possible.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use rayon::prelude::*;

use crate::model::{LogitsWanted, Model, SequenceChunk};
use crate::sampling::{Choices, Pattern, SampledToken, Sampler, SamplingParams, TokenVocab};
use crate::speculative::{SpeculationConfig, Speculator, propose_ngram, verify};
use crate::{EngineError, KvCache};

/// A request as the router sends it with a prefill.
#[derive(Debug, Clone)]
pub struct NewSequence {
    /// Router-wide request id.
    pub id: u64,
    /// Prompt tokens (followed by previously generated ones when resuming).
    pub input_ids: Vec<u32>,
    /// Sampling parameters, already validated by the router (checked again here).
    pub params: SamplingParams,
    /// Report the logprob of every prompt token.
    pub prefill_logprobs: bool,
    /// KV blocks covering at least the tokens computed in this pass.
    pub blocks: Vec<u32>,
    /// Leading tokens whose K/V are already in `blocks`.
    pub cache_len: usize,
    /// Tokens to compute in this pass (`None`: all the rest).
    pub chunk_len: Option<usize>,
    /// Trailing tokens of `input_ids` generated before a preemption.
    pub generated_len: usize,
    /// Constrain the output to one JSON object (needs [`Engine::with_vocabulary`]).
    pub json_object: bool,
    /// Constrain the output to one of these strings (empty: no constraint; needs
    /// [`Engine::with_vocabulary`]).
    pub one_of: Vec<String>,
    /// Constrain the output to a string this regular expression matches (empty: no
    /// constraint; needs [`Engine::with_vocabulary`]).
    pub pattern: String,
}

/// What one sequence produced in one pass.
#[derive(Debug, Clone, PartialEq)]
pub struct StepOutput {
    /// Router-wide request id.
    pub request_id: u64,
    /// `(token, logprob)` of every prompt token (the first one's logprob is NaN).
    pub prefill: Option<Vec<(u32, f32)>>,
    /// The new tokens (empty while a chunked prefill is unfinished; with speculation, the
    /// accepted proposals followed by the model's own token).
    pub tokens: Vec<SampledToken>,
    /// Proposals the speculator made for this step.
    pub proposed: usize,
}

/// Time spent in one call.
#[derive(Debug, Clone, Copy, Default)]
pub struct StepTimings {
    /// In the model's forward pass.
    pub forward_ns: u64,
    /// In sampling.
    pub decode_ns: u64,
    /// The whole call.
    pub total_ns: u64,
}

struct Sequence {
    tokens: Vec<u32>,
    /// Tokens whose K/V are in the cache.
    computed: usize,
    blocks: Vec<u32>,
    sampler: Sampler,
    /// Prompt logprobs gathered so far, while the client wants them and the prompt is not
    /// fully computed.
    prefill: Option<Vec<(u32, f32)>>,
    /// Tokens of `tokens` that belong to the prompt (prompt logprobs stop there).
    prompt_len: usize,
    /// Tokens whose K/V are in the draft model's cache (draft speculation).
    draft_computed: usize,
}

/// A draft model for speculation, with its own cache over the same block ids.
struct Draft {
    model: Model,
    cache: KvCache,
}

/// What the draft proposed for one sequence: the tokens and the distributions they were
/// drawn from (`None` when greedy).
type DraftProposal = (Vec<u32>, Option<Vec<Vec<f32>>>);

/// Compiled output patterns an engine keeps.
const CACHED_PATTERNS: usize = 16;

/// The model, its cache, and every live sequence.
pub struct Engine {
    model: Model,
    cache: KvCache,
    sequences: HashMap<u64, Sequence>,
    batches: HashMap<u64, Vec<u64>>,
    speculation: Option<SpeculationConfig>,
    draft: Option<Draft>,
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
            batches: HashMap::new(),
            speculation: None,
            draft: None,
            vocab: None,
            patterns: HashMap::new(),
        })
    }

    /// The model's token bytes, for sequences in JSON mode (without them such sequences are
    /// refused).
    pub fn with_vocabulary(mut self, vocab: Arc<TokenVocab>) -> Self {
        self.vocab = Some(vocab);
        self
    }

    /// Uses `draft` to propose tokens (`Speculator::Draft`). It must share the tokenizer:
    /// a different vocabulary is refused.
    pub fn with_draft(mut self, draft: Model) -> Result<Self, EngineError> {
        let (ours, theirs) = (self.model.config().vocab_size, draft.config().vocab_size);
        if ours != theirs {
            return Err(EngineError::InvalidBatch(format!(
                "the draft model has a vocabulary of {theirs} tokens, the model {ours}: a draft \
                 must share the model's tokenizer"
            )));
        }
        let cache = draft.new_cache(self.num_blocks(), self.block_size())?;
        self.draft = Some(Draft {
            model: draft,
            cache,
        });
        Ok(self)
    }

    /// Turns speculative decoding on for every decoding sequence.
    pub fn with_speculation(mut self, config: SpeculationConfig) -> Self {
        self.speculation = (config.depth > 0).then_some(config);
        self
    }

    /// Tokens proposed per step (0 without speculation).
    pub fn speculation_depth(&self) -> usize {
        self.speculation.map_or(0, |s| s.depth)
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

    /// Adds `new` as batch `batch_id`, merges `cached` into it, and runs one pass: the new
    /// sequences' prompt chunks and one decode step of the cached ones. Returns the outputs
    /// and the request ids of the merged batch (now cached as `batch_id`).
    pub fn prefill(
        &mut self,
        batch_id: u64,
        new: Vec<NewSequence>,
        cached: Option<u64>,
        block_updates: Vec<(u64, Vec<u32>)>,
        chunk_limits: Vec<(u64, usize)>,
    ) -> Result<(Vec<StepOutput>, Vec<u64>, StepTimings), EngineError> {
        let mut ids = match cached {
            Some(c) => self.take_batch(c)?,
            None => Vec::new(),
        };
        let mut limits: HashMap<u64, usize> = chunk_limits.into_iter().collect();
        let result = self.admit(new, &mut ids, &mut limits).and_then(|()| {
            self.apply_block_updates(block_updates)?;
            self.step(&ids, &limits)
        });
        self.finish_call(batch_id, ids, result)
    }

    /// One decode step for the given cached batches, merged into the first one.
    pub fn decode(
        &mut self,
        batch_ids: &[u64],
        block_updates: Vec<(u64, Vec<u32>)>,
        chunk_limits: Vec<(u64, usize)>,
    ) -> Result<(Vec<StepOutput>, Vec<u64>, StepTimings), EngineError> {
        let Some(&first) = batch_ids.first() else {
            return Err(EngineError::InvalidBatch(
                "decode needs at least one batch".into(),
            ));
        };
        let mut ids = Vec::new();
        for &b in batch_ids {
            ids.extend(self.take_batch(b)?);
        }
        let result = self
            .apply_block_updates(block_updates)
            .and_then(|()| self.step(&ids, &chunk_limits.into_iter().collect()));
        self.finish_call(first, ids, result)
    }

    /// Replaces the cache with one of `num_blocks` blocks, dropping every sequence.
    pub fn resize_cache(&mut self, num_blocks: usize) -> Result<(), EngineError> {
        self.clear(None);
        // Free the old pages before allocating the new ones.
        let bs = self.block_size();
        self.cache = self.model.new_cache(0, bs)?;
        self.cache = self.model.new_cache(num_blocks, bs)?;
        if let Some(d) = self.draft.as_mut() {
            d.cache = d.model.new_cache(0, bs)?;
            d.cache = d.model.new_cache(num_blocks, bs)?;
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

    /// Bytes one KV block takes, for the model and its draft together.
    pub fn block_bytes(&self) -> usize {
        let bs = self.block_size();
        let one =
            |m: &Model| KvCache::block_bytes(m.config().num_layers, m.kv_layout(bs), m.kv_dtype());
        one(&self.model) + self.draft.as_ref().map_or(0, |d| one(&d.model))
    }

    /// Keeps only `keep` in the batch and frees every other sequence of it.
    pub fn filter(&mut self, batch_id: u64, keep: &[u64]) -> Result<Vec<u64>, EngineError> {
        let ids = self.take_batch(batch_id)?;
        let (kept, dropped): (Vec<u64>, Vec<u64>) =
            ids.into_iter().partition(|id| keep.contains(id));
        for id in dropped {
            self.sequences.remove(&id);
        }
        self.batches.insert(batch_id, kept.clone());
        Ok(kept)
    }

    /// Drops one batch, or all of them.
    pub fn clear(&mut self, batch_id: Option<u64>) {
        match batch_id {
            Some(b) => {
                for id in self.batches.remove(&b).unwrap_or_default() {
                    self.sequences.remove(&id);
                }
            }
            None => {
                self.batches.clear();
                self.sequences.clear();
            }
        }
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
        };
        let out = self.model.forward(&[chunk], &mut self.cache)?;
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
        };
        self.model.forward(&[chunk], &mut self.cache)?;
        Ok(())
    }

    /// `sampler` held to the output constraint `seq` asks for, if any, or why it cannot be.
    fn constrained(&mut self, sampler: Sampler, seq: &NewSequence) -> Result<Sampler, String> {
        let asked = [
            seq.json_object,
            !seq.one_of.is_empty(),
            !seq.pattern.is_empty(),
        ];
        match asked.iter().filter(|&&a| a).count() {
            0 => return Ok(sampler),
            1 => {}
            _ => return Err("JSON mode, a choice and a pattern exclude each other".into()),
        }
        let vocab = self.vocab.clone().ok_or(
            "constrained output needs the model's tokenizer, which this shard has not loaded",
        )?;
        Ok(if seq.json_object {
            sampler.with_json(vocab)
        } else if !seq.one_of.is_empty() {
            sampler.with_choices(vocab, Arc::new(Choices::new(&seq.one_of)?))
        } else {
            sampler.with_pattern(vocab, self.pattern(&seq.pattern)?)
        })
    }

    /// `text` compiled, from the engine's recent patterns when it is one of them.
    fn pattern(&mut self, text: &str) -> Result<Arc<Pattern>, String> {
        if let Some(p) = self.patterns.get(text) {
            return Ok(p.clone());
        }
        let p = Arc::new(Pattern::new(text)?);
        if self.patterns.len() >= CACHED_PATTERNS {
            self.patterns.clear();
        }
        self.patterns.insert(text.to_owned(), p.clone());
        Ok(p)
    }

    fn admit(
        &mut self,
        new: Vec<NewSequence>,
        ids: &mut Vec<u64>,
        limits: &mut HashMap<u64, usize>,
    ) -> Result<(), EngineError> {
        for mut seq in new {
            seq.params
                .validate_for_vocab(self.model.config().vocab_size)
                .map_err(|e| EngineError::InvalidBatch(format!("request {}: {e}", seq.id)))?;
            if seq.cache_len >= seq.input_ids.len() {
                return Err(EngineError::InvalidBatch(format!(
                    "request {}: needs at least one token beyond the {} cached ones",
                    seq.id, seq.cache_len
                )));
            }
            if self.sequences.contains_key(&seq.id) || ids.contains(&seq.id) {
                return Err(EngineError::InvalidBatch(format!(
                    "request {} already exists",
                    seq.id
                )));
            }
            let prompt_len = seq.input_ids.len() - seq.generated_len.min(seq.input_ids.len());
            let params = std::mem::take(&mut seq.params);
            let mut sampler = self
                .constrained(Sampler::new(params, &seq.input_ids[..prompt_len]), &seq)
                .map_err(|what| EngineError::InvalidBatch(format!("request {}: {what}", seq.id)))?;
            for &t in &seq.input_ids[prompt_len..] {
                sampler.record(t);
            }
            if let Some(chunk) = seq.chunk_len {
                limits.insert(seq.id, chunk.max(1));
            }
            if seq.prefill_logprobs && seq.cache_len > 0 {
                return Err(EngineError::InvalidBatch(format!(
                    "request {}: prompt logprobs need the whole prompt computed (cache_len must be 0)",
                    seq.id
                )));
            }
            ids.push(seq.id);
            self.sequences.insert(
                seq.id,
                Sequence {
                    tokens: seq.input_ids,
                    computed: seq.cache_len,
                    blocks: seq.blocks,
                    sampler,
                    prefill: seq.prefill_logprobs.then(Vec::new),
                    prompt_len,
                    draft_computed: 0,
                },
            );
        }
        Ok(())
    }

    /// Caches the batch after a call; on failure its sequences are dropped, since their
    /// state may be half-updated.
    fn finish_call(
        &mut self,
        batch_id: u64,
        ids: Vec<u64>,
        result: Result<(Vec<StepOutput>, StepTimings), EngineError>,
    ) -> Result<(Vec<StepOutput>, Vec<u64>, StepTimings), EngineError> {
        match result {
            Ok((outputs, timings)) => {
                self.batches.insert(batch_id, ids.clone());
                Ok((outputs, ids, timings))
            }
            Err(e) => {
                for id in ids {
                    self.sequences.remove(&id);
                }
                Err(e)
            }
        }
    }

    fn take_batch(&mut self, batch_id: u64) -> Result<Vec<u64>, EngineError> {
        self.batches
            .remove(&batch_id)
            .ok_or_else(|| EngineError::InvalidBatch(format!("batch {batch_id} is not cached")))
    }

    fn apply_block_updates(&mut self, updates: Vec<(u64, Vec<u32>)>) -> Result<(), EngineError> {
        for (id, blocks) in updates {
            let seq = self.sequences.get_mut(&id).ok_or_else(|| {
                EngineError::InvalidBatch(format!("block update for unknown request {id}"))
            })?;
            seq.blocks = blocks;
        }
        Ok(())
    }

    /// Runs the draft model ahead of every decoding sequence: first it catches up on the
    /// tokens it has not seen, then it proposes one token per pass, up to the depth the
    /// sequence's blocks leave room for.
    fn propose_with_draft(
        &mut self,
        ids: &[u64],
        limits: &HashMap<u64, usize>,
    ) -> Result<HashMap<u64, DraftProposal>, EngineError> {
        let mut proposals: HashMap<u64, DraftProposal> = HashMap::new();
        let (Some(spec), Some(draft)) = (self.speculation, self.draft.as_mut()) else {
            return Ok(proposals);
        };
        if spec.speculator != Speculator::Draft {
            return Ok(proposals);
        }
        let bs = self.cache.block_size();
        // (id, depth) of the sequences that decode this step.
        let eligible: Vec<(u64, usize)> = ids
            .iter()
            .filter(|id| limits.get(id).is_none_or(|&l| l > 0))
            .filter_map(|id| {
                let seq = self.sequences.get(id)?;
                let decoding =
                    seq.tokens.len() - seq.computed == 1 && seq.computed >= seq.prompt_len;
                let room = (seq.blocks.len() * bs).saturating_sub(seq.tokens.len());
                let depth = spec.depth.min(room);
                (decoding && depth > 0).then_some((*id, depth))
            })
            .collect();
        let rounds = eligible.iter().map(|&(_, d)| d).max().unwrap_or(0);
        for round in 0..rounds {
            let active: Vec<(u64, usize)> = eligible
                .iter()
                .copied()
                .filter(|&(_, d)| d > round)
                .collect();
            let inputs: Vec<(u64, usize, Vec<u32>)> = active
                .iter()
                .map(|&(id, _)| {
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
                })
                .collect();
            let out = draft.model.forward(&chunks, &mut draft.cache)?;
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
        }
        Ok(proposals)
    }

    /// One forward pass over the pending tokens of `ids`, then sampling. Decoding sequences
    /// also carry the speculator's proposals, verified against the same pass's logits.
    fn step(
        &mut self,
        ids: &[u64],
        limits: &HashMap<u64, usize>,
    ) -> Result<(Vec<StepOutput>, StepTimings), EngineError> {
        let start = Instant::now();
        let bs = self.cache.block_size();
        let mut drafted = self.propose_with_draft(ids, limits)?;
        // (id, first position, input tokens, how many of them are proposals)
        let mut plan: Vec<(u64, usize, Vec<u32>, usize)> = Vec::with_capacity(ids.len());
        for id in ids {
            let seq = self
                .sequences
                .get(id)
                .ok_or_else(|| EngineError::InvalidBatch(format!("request {id} is not cached")))?;
            let pending = seq.tokens.len() - seq.computed;
            let len = limits.get(id).map_or(pending, |&l| l.min(pending));
            if len == 0 {
                continue;
            }
            let mut input = seq.tokens[seq.computed..seq.computed + len].to_vec();
            let mut proposed = 0;
            if let Some(spec) = self.speculation
                && pending == 1
                && seq.computed >= seq.prompt_len
            {
                // Proposals only where the router gave blocks for them.
                let room = (seq.blocks.len() * bs).saturating_sub(seq.tokens.len());
                let proposals = match spec.speculator {
                    Speculator::Ngram => propose_ngram(&seq.tokens, spec.depth.min(room)),
                    Speculator::Draft => {
                        drafted.get(id).map(|(p, _)| p.clone()).unwrap_or_default()
                    }
                };
                proposed = proposals.len();
                input.extend(proposals);
            }
            plan.push((*id, seq.computed, input, proposed));
        }
        let chunks: Vec<SequenceChunk<'_>> = plan
            .iter()
            .map(|(id, start, input, proposed)| {
                let seq = &self.sequences[id];
                let completes = start + input.len() - proposed == seq.tokens.len();
                SequenceChunk {
                    tokens: input,
                    start_position: *start,
                    block_table: &seq.blocks,
                    logits: match (completes, seq.prefill.is_some() || *proposed > 0) {
                        (_, true) => LogitsWanted::All,
                        (true, false) => LogitsWanted::Last,
                        (false, false) => LogitsWanted::None,
                    },
                }
            })
            .collect();
        let out = self.model.forward(&chunks, &mut self.cache)?;
        let wanted: Vec<LogitsWanted> = chunks.iter().map(|c| c.logits).collect();
        let forward_done = Instant::now();
        // Plain next-token draws (no proposals to verify), each a few passes over the
        // vocabulary with the sequence's own sampler: on rayon's threads, one sequence each.
        let plain: HashMap<u64, usize> = plan
            .iter()
            .enumerate()
            .filter(|(ci, (id, start, input, proposed))| {
                *proposed == 0
                    && out.last(*ci).is_some()
                    && self
                        .sequences
                        .get(id)
                        .is_some_and(|seq| start + input.len() == seq.tokens.len())
            })
            .map(|(ci, (id, ..))| (*id, ci))
            .collect();
        let mut drawn: HashMap<u64, SampledToken> = self
            .sequences
            .par_iter_mut()
            .filter_map(|(id, seq)| {
                let ci = *plain.get(id)?;
                Some((*id, seq.sampler.sample(out.last(ci)?)))
            })
            .collect();
        let mut outputs = Vec::with_capacity(plan.len());
        for (ci, (id, start, input, proposed)) in plan.into_iter().enumerate() {
            let Some(seq) = self.sequences.get_mut(&id) else {
                continue;
            };
            let len = input.len() - proposed;
            seq.computed = start + len;
            let mut output = StepOutput {
                request_id: id,
                prefill: None,
                tokens: Vec::new(),
                proposed,
            };
            if wanted[ci] == LogitsWanted::All
                && let Some(prefill) = seq.prefill.as_mut()
            {
                // The logprob of the token at position p is read from the logits at p - 1.
                if start == 0 {
                    prefill.push((seq.tokens[0], f32::NAN));
                }
                for i in 0..len {
                    let p = start + i + 1;
                    if p < seq.prompt_len {
                        let t = seq.tokens[p];
                        prefill.push((t, seq.sampler.report(out.row(ci, i), t).logprob));
                    }
                }
                if seq.computed >= seq.prompt_len {
                    output.prefill = seq.prefill.take();
                }
            }
            if proposed > 0 {
                let rows: Vec<&[f32]> = (0..=proposed).map(|i| out.row(ci, i)).collect();
                let draft_probs = drafted.remove(&id).and_then(|(_, q)| q);
                let verdict = verify(&mut seq.sampler, &rows, &input[1..], draft_probs.as_deref());
                // The draft's K/V are valid up to the accepted proposals it wrote.
                let depth = input.len() - 1;
                seq.draft_computed = seq
                    .draft_computed
                    .min(start + 1 + verdict.accepted.min(depth - 1));
                // K/V of accepted proposals are valid; those after them are overwritten later.
                seq.computed += verdict.accepted;
                seq.tokens.extend(verdict.tokens.iter().map(|t| t.id));
                output.tokens = verdict.tokens;
            } else if let Some(token) = drawn.remove(&id) {
                seq.tokens.push(token.id);
                output.tokens.push(token);
            }
            outputs.push(output);
        }
        let end = Instant::now();
        Ok((
            outputs,
            StepTimings {
                forward_ns: (forward_done - start).as_nanos() as u64,
                decode_ns: (end - forward_done).as_nanos() as u64,
                total_ns: (end - start).as_nanos() as u64,
            },
        ))
    }
}
