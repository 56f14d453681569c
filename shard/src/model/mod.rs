//! The Llama-family decoder (Llama, Mistral, Qwen2) over a flattened variable-length batch.
//!
//! Prefill chunks and decode tokens of different sequences share one pass: all their tokens
//! are stacked into `[T, hidden]` activations; only attention looks at sequence boundaries,
//! reading each sequence's keys and values from its own paged blocks.
//!
//! Under tensor parallelism (Megatron-style) each rank holds a slice of every projection
//! (see `weights`) and of the KV cache (its KV heads only); the residual stream stays whole
//! on every rank. Per layer there are two all-reduces (after o_proj and after down_proj),
//! one for the vocabulary-parallel embedding lookup, and the logits of this rank's
//! vocabulary slice are all-gathered at the end, so every rank samples from the same
//! logits. With one rank no collective runs and the pass is exactly the single-shard one.

mod rope;
mod weights;

use std::ops::Range;
use std::sync::Arc;

use tessera_formats::{ModelConfig, ModelFiles};
use tessera_kernels::cpu::attention::KvElem;
use tessera_kernels::cpu::{
    ActivationDtype, WeightFormat, activation, attention, linear_weights_as, norm,
    rope as rope_kernel,
};

use crate::EngineError;
use crate::comm::{Communicator, HeadSplit, LocalComm, Partition};
use crate::kv_cache::{KvCache, KvDtype, KvPages};
pub use weights::WeightLayout;
use weights::{Linear, ModelWeights};

/// Which positions of a chunk need logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogitsWanted {
    /// None (an intermediate prefill chunk).
    None,
    /// The last position only (the next token).
    Last,
    /// Every position (prompt logprobs, speculative verification).
    All,
}

/// New tokens of one sequence to run through the model in this pass.
#[derive(Debug, Clone, Copy)]
pub struct SequenceChunk<'a> {
    /// Tokens to compute: a prefill chunk, or the last sampled token when decoding.
    pub tokens: &'a [u32],
    /// Position of `tokens[0]`: how many tokens of this sequence are already in the cache.
    pub start_position: usize,
    /// Cache blocks of the sequence, covering positions `0..start_position + tokens.len()`.
    pub block_table: &'a [u32],
    /// Which of the chunk's positions need logits.
    pub logits: LogitsWanted,
}

/// Logits of one pass: a `[rows, vocab]` matrix and, per chunk, its rows.
#[derive(Debug, Clone, PartialEq)]
pub struct ForwardOutput {
    /// Row-major logits.
    pub logits: Vec<f32>,
    /// Vocabulary size (row width).
    pub vocab_size: usize,
    /// Rows of each chunk, in the order the chunks were given.
    pub rows: Vec<Range<usize>>,
}

impl ForwardOutput {
    /// The logits row `i` of chunk `chunk`.
    pub fn row(&self, chunk: usize, i: usize) -> &[f32] {
        let r = self.rows[chunk].start + i;
        &self.logits[r * self.vocab_size..(r + 1) * self.vocab_size]
    }

    /// The last logits row of chunk `chunk`, if it asked for any.
    pub fn last(&self, chunk: usize) -> Option<&[f32]> {
        let range = &self.rows[chunk];
        (!range.is_empty()).then(|| self.row(chunk, range.len() - 1))
    }
}

/// A loaded model, ready to run batches against a [`KvCache`].
pub struct Model {
    config: ModelConfig,
    weights: ModelWeights,
    inv_freq: Vec<f32>,
    comm: Arc<dyn Communicator>,
    partition: Partition,
    heads: HeadSplit,
    kv_dtype: KvDtype,
    activations: ActivationDtype,
}

impl Model {
    /// Loads the weights of an opened model (laid out as [`WeightLayout::from_env`] says).
    pub fn load(files: &ModelFiles) -> Result<Self, EngineError> {
        Self::load_sharded(files, Arc::new(LocalComm))
    }

    /// Loads the weights of an opened model in `layout`.
    pub fn load_with(files: &ModelFiles, layout: WeightLayout) -> Result<Self, EngineError> {
        Self::load_sharded_with(files, Arc::new(LocalComm), layout)
    }

    /// Loads this rank's part of the weights (the rank and group size are `comm`'s); the
    /// forward pass then runs in step with the other ranks through `comm`.
    pub fn load_sharded(
        files: &ModelFiles,
        comm: Arc<dyn Communicator>,
    ) -> Result<Self, EngineError> {
        Self::load_sharded_with(files, comm, WeightLayout::from_env())
    }

    /// [`Self::load_sharded`] in `layout`.
    pub fn load_sharded_with(
        files: &ModelFiles,
        comm: Arc<dyn Communicator>,
        layout: WeightLayout,
    ) -> Result<Self, EngineError> {
        let name = files.path.display().to_string();
        let partition = Partition::new(comm.rank(), comm.world_size());
        partition
            .check(&files.config)
            .map_err(|e| EngineError::Weights {
                path: name.clone(),
                message: e.to_string(),
            })?;
        let heads = partition.heads(&files.config);
        let weights = ModelWeights::load(
            &files.config,
            files.weights.as_ref(),
            &name,
            partition,
            &heads,
            layout,
        )?;
        Ok(Self {
            inv_freq: rope::inv_freq(&files.config),
            config: files.config.clone(),
            weights,
            comm,
            partition,
            heads,
            kv_dtype: KvDtype::Float32,
            activations: ActivationDtype::Float32,
        })
    }

    /// This rank's place in the tensor-parallel group.
    pub fn partition(&self) -> Partition {
        self.partition
    }

    /// Whether the other ranks are alive and the group usable, without a collective (so it
    /// can run out of step with them, as health checks do).
    pub fn check_peers(&self) -> Result<(), EngineError> {
        Ok(self.comm.check_peers()?)
    }

    fn all_reduce(&self, data: &mut [f32]) -> Result<(), EngineError> {
        if self.partition.world_size > 1 {
            self.comm.all_reduce_f32(data)?;
        }
        Ok(())
    }

    /// The model's configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The KV layout this model needs for a block size (this rank's KV heads only).
    pub fn kv_layout(&self, block_size: usize) -> attention::KvLayout {
        attention::KvLayout {
            block_size,
            kv_heads: self.heads.kv.len(),
            head_dim: self.config.head_dim,
        }
    }

    /// Stores keys and values as `dtype` in the caches [`Model::new_cache`] makes (f32 unless
    /// set).
    pub fn with_kv_dtype(mut self, dtype: KvDtype) -> Self {
        self.kv_dtype = dtype;
        self
    }

    /// Rounds the activations of products with bf16-stored weights to bf16 (f32 unless set;
    /// see [`ActivationDtype`]).
    pub fn with_activation_dtype(mut self, dtype: ActivationDtype) -> Self {
        self.activations = dtype;
        self
    }

    /// What products round their activations to.
    pub fn activation_dtype(&self) -> ActivationDtype {
        self.activations
    }

    /// The storage format of most of this rank's weight bytes, as `/info` reports it:
    /// `float32`, `bfloat16`, `float16`, or the GGUF block type (`Q4_1`, `Q4_K`…).
    pub fn weights_dtype(&self) -> &'static str {
        let w = &self.weights;
        let matrices = w
            .layers
            .iter()
            .flat_map(|l| {
                [
                    &l.qkv.weight,
                    &l.o.weight,
                    &l.gate_up.weight,
                    &l.down.weight,
                ]
            })
            .chain(std::iter::once(&w.embed))
            .chain(w.lm_head.as_ref());
        let mut bytes: Vec<(WeightFormat, usize)> = Vec::new();
        for m in matrices {
            match bytes.iter_mut().find(|(f, _)| *f == m.format()) {
                Some((_, b)) => *b += m.storage_bytes(),
                None => bytes.push((m.format(), m.storage_bytes())),
            }
        }
        match bytes.iter().max_by_key(|(_, b)| *b).map(|(f, _)| *f) {
            Some(WeightFormat::F32) | None => "float32",
            Some(WeightFormat::Bf16) => "bfloat16",
            Some(WeightFormat::F16) => "float16",
            Some(f) => f.name(),
        }
    }

    /// Element type of the caches [`Model::new_cache`] makes.
    pub fn kv_dtype(&self) -> KvDtype {
        self.kv_dtype
    }

    /// A cache of `num_blocks` blocks of `block_size` tokens for this model.
    pub fn new_cache(&self, num_blocks: usize, block_size: usize) -> KvCache {
        KvCache::with_dtype(
            self.config.num_layers,
            num_blocks,
            self.kv_layout(block_size),
            self.kv_dtype,
        )
    }

    fn check(&self, chunks: &[SequenceChunk<'_>], cache: &KvCache) -> Result<(), EngineError> {
        if cache.layout != self.kv_layout(cache.layout.block_size)
            || cache.num_layers() != self.config.num_layers
        {
            return Err(EngineError::InvalidBatch(
                "the KV cache was made for another model".into(),
            ));
        }
        let bs = cache.layout.block_size;
        for (i, c) in chunks.iter().enumerate() {
            if let Some(&t) = c
                .tokens
                .iter()
                .find(|&&t| t as usize >= self.config.vocab_size)
            {
                return Err(EngineError::InvalidBatch(format!(
                    "sequence {i}: token id {t} is outside the vocabulary (size {})",
                    self.config.vocab_size
                )));
            }
            let end = c.start_position + c.tokens.len();
            if c.block_table.len() * bs < end {
                return Err(EngineError::InvalidBatch(format!(
                    "sequence {i}: {} blocks of {bs} cannot hold {end} positions",
                    c.block_table.len()
                )));
            }
            if let Some(&b) = c
                .block_table
                .iter()
                .find(|&&b| b as usize >= cache.num_blocks)
            {
                return Err(EngineError::InvalidBatch(format!(
                    "sequence {i}: block {b} does not exist (the cache has {})",
                    cache.num_blocks
                )));
            }
        }
        Ok(())
    }

    /// Runs one pass over all chunks, writing their K/V into `cache` and returning the logits
    /// they asked for. Each sequence's results do not depend on the other chunks.
    pub fn forward(
        &self,
        chunks: &[SequenceChunk<'_>],
        cache: &mut KvCache,
    ) -> Result<ForwardOutput, EngineError> {
        // On one of rayon's threads: a pass makes a hundred or more parallel calls, and each
        // one from outside the pool would hand its work over and sleep until it is done
        // (measured: 6.2 → 4.7 ms per SmolLM2 decode step). Not under tensor parallelism:
        // ranks that share a process (and so a pool) would each hold a pool thread while
        // waiting in the all-reduce for a rank that cannot get one.
        if self.partition.world_size == 1 {
            rayon::scope(|_| self.forward_on_pool(chunks, cache))
        } else {
            self.forward_on_pool(chunks, cache)
        }
    }

    fn forward_on_pool(
        &self,
        chunks: &[SequenceChunk<'_>],
        cache: &mut KvCache,
    ) -> Result<ForwardOutput, EngineError> {
        self.check(chunks, cache)?;
        let cfg = &self.config;
        let (h, hd) = (cfg.hidden_size, cfg.head_dim);
        // This rank's heads and intermediate width (all of them with one rank).
        let (nh, nkv) = (self.heads.q.len(), self.heads.kv.len());
        let inter = self
            .weights
            .layers
            .first()
            .map_or(0, |l| l.down.in_features());
        let bs = cache.layout.block_size;

        // Flatten the batch.
        let mut input_ids = Vec::new();
        let mut positions = Vec::new();
        let mut slots = Vec::new();
        let mut seqs = Vec::with_capacity(chunks.len());
        let mut logit_rows = Vec::new();
        let mut out_rows = Vec::with_capacity(chunks.len());
        for c in chunks {
            let first_row = input_ids.len();
            for (i, &t) in c.tokens.iter().enumerate() {
                let p = c.start_position + i;
                input_ids.push(t);
                positions.push(p as u32);
                slots.push(c.block_table[p / bs] as usize * bs + p % bs);
            }
            seqs.push(attention::AttentionSeq {
                first_row,
                rows: c.tokens.len(),
                first_position: c.start_position,
                block_table: c.block_table,
            });
            let before = logit_rows.len();
            match c.logits {
                LogitsWanted::None => {}
                LogitsWanted::Last if !c.tokens.is_empty() => {
                    logit_rows.push(first_row + c.tokens.len() - 1)
                }
                LogitsWanted::Last => {}
                LogitsWanted::All => logit_rows.extend(first_row..first_row + c.tokens.len()),
            }
            out_rows.push(before..logit_rows.len());
        }
        let t = input_ids.len();

        // Vocabulary-parallel lookup: rows of other ranks' tokens stay zero here, and the
        // all-reduce adds exact zeros, so every rank ends with the exact embedding rows.
        let vocab = &self.weights.vocab;
        let mut residual = vec![0f32; t * h];
        for (row, &id) in residual.chunks_exact_mut(h).zip(&input_ids) {
            if vocab.contains(&(id as usize)) {
                let local = id as usize - vocab.start;
                self.weights.embed.row_f32(local, row);
            }
        }
        self.all_reduce(&mut residual)?;
        let (cos, sin) = rope_kernel::cos_sin(&self.inv_freq, &positions);
        let qkv_width = (nh + 2 * nkv) * hd;
        let mut normed = vec![0f32; t * h];
        let mut qkv = vec![0f32; t * qkv_width];
        let mut attn = vec![0f32; t * nh * hd];
        let mut proj = vec![0f32; t * h];
        let mut gate_up = vec![0f32; t * 2 * inter];
        let mut act = vec![0f32; t * inter];
        let scale = 1.0 / (hd as f32).sqrt();

        for (li, layer) in self.weights.layers.iter().enumerate() {
            if li == 0 {
                norm::rms_norm(&residual, &layer.input_norm, cfg.rms_norm_eps, &mut normed);
            } else {
                norm::add_rms_norm(
                    &mut residual,
                    &proj,
                    &layer.input_norm,
                    cfg.rms_norm_eps,
                    &mut normed,
                );
            }
            self.linear(&normed, &layer.qkv, t, &mut qkv);
            // Queries rotate in place; keys rotate as they are written into the cache.
            rope_kernel::apply_rope(&mut qkv, qkv_width, 0, nh, hd, &cos, &sin);
            let step = AttentionStep {
                layout: cache.layout,
                qkv: &qkv,
                qkv_width,
                heads: nh,
                kv_heads: nkv,
                slots: &slots,
                seqs: &seqs,
                scale,
                window: cfg.sliding_window,
                rope: (&cos, &sin),
            };
            match &mut cache.pages {
                KvPages::F32(layers) => step.run(&mut layers[li], &mut attn),
                KvPages::Bf16(layers) => step.run(&mut layers[li], &mut attn),
            }
            self.linear(&attn, &layer.o, t, &mut proj);
            self.all_reduce(&mut proj)?;
            norm::add_rms_norm(
                &mut residual,
                &proj,
                &layer.post_attention_norm,
                cfg.rms_norm_eps,
                &mut normed,
            );
            self.linear(&normed, &layer.gate_up, t, &mut gate_up);
            activation::silu_mul(&gate_up, inter, &mut act);
            self.linear(&act, &layer.down, t, &mut proj);
            self.all_reduce(&mut proj)?;
        }

        // Only the rows that need logits go through the final norm and the LM head.
        let rows = logit_rows.len();
        let mut last = Vec::with_capacity(rows * h);
        for &r in &logit_rows {
            let res = &residual[r * h..(r + 1) * h];
            last.extend(
                res.iter()
                    .zip(&proj[r * h..(r + 1) * h])
                    .map(|(a, b)| a + b),
            );
        }
        let mut last_normed = vec![0f32; rows * h];
        norm::rms_norm(
            &last,
            &self.weights.final_norm,
            cfg.rms_norm_eps,
            &mut last_normed,
        );
        let head = self.weights.lm_head.as_ref().unwrap_or(&self.weights.embed);
        let local_vocab = vocab.len();
        let mut logits = vec![0f32; rows * local_vocab];
        debug_assert_eq!(head.cols(), h);
        linear_weights_as(
            &last_normed,
            head,
            None,
            rows,
            &mut logits,
            self.activations,
        );
        if self.partition.world_size > 1 {
            logits = self.gather_logits(&logits, rows)?;
        }
        Ok(ForwardOutput {
            logits,
            vocab_size: cfg.vocab_size,
            rows: out_rows,
        })
    }
}

impl Model {
    /// Every rank's `[rows, its vocabulary slice]` logits, joined into `[rows, vocab]`.
    fn gather_logits(&self, local: &[f32], rows: usize) -> Result<Vec<f32>, EngineError> {
        let vocab = self.config.vocab_size;
        let slices = self.partition.counts(vocab);
        let counts: Vec<usize> = slices.iter().map(|n| n * rows).collect();
        let mut gathered = vec![0f32; rows * vocab];
        self.comm.all_gather_f32(local, &counts, &mut gathered)?;
        // `gathered` is rank-major: [rank][row][its slice]; reorder to [row][vocab].
        let mut logits = vec![0f32; rows * vocab];
        let (mut from, mut column) = (0, 0);
        for n in slices {
            for r in 0..rows {
                logits[r * vocab + column..r * vocab + column + n]
                    .copy_from_slice(&gathered[from + r * n..from + (r + 1) * n]);
            }
            from += rows * n;
            column += n;
        }
        Ok(logits)
    }
}

/// One layer's cache write and attention, for either cache element type.
struct AttentionStep<'a> {
    layout: attention::KvLayout,
    qkv: &'a [f32],
    qkv_width: usize,
    heads: usize,
    kv_heads: usize,
    slots: &'a [usize],
    seqs: &'a [attention::AttentionSeq<'a>],
    scale: f32,
    window: Option<usize>,
    /// The tokens' rotary cosines and sines, applied to the keys as they are written.
    rope: (&'a [f32], &'a [f32]),
}

impl AttentionStep<'_> {
    /// Writes the new tokens' K/V (keys rotated, converted to `T`) and attends over the cache.
    fn run<T: KvElem>(&self, (ck, cv): &mut (Vec<T>, Vec<T>), out: &mut [f32]) {
        let hd = self.layout.head_dim;
        attention::write_kv(
            self.layout,
            ck,
            cv,
            self.qkv,
            self.qkv_width,
            self.heads * hd,
            (self.heads + self.kv_heads) * hd,
            self.slots,
            Some(self.rope),
        );
        attention::paged_attention(
            self.layout,
            ck,
            cv,
            self.qkv,
            self.qkv_width,
            self.heads,
            self.seqs,
            self.scale,
            self.window,
            out,
        );
    }
}

impl Model {
    fn linear(&self, x: &[f32], layer: &Linear, rows: usize, out: &mut [f32]) {
        debug_assert_eq!(out.len(), rows * layer.out_features());
        linear_weights_as(
            x,
            &layer.weight,
            layer.bias.as_deref(),
            rows,
            out,
            self.activations,
        );
    }
}
