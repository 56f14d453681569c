//! The decoder (Llama, Mistral, Qwen2/3, Gemma 2/3: one pass, their differences as the
//! config's `Family`) over a flattened variable-length batch.
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

mod backend;
mod batch;
mod cpu;
#[cfg(feature = "cuda")]
mod cuda;
mod draft_support;
mod forward;
mod moe;
mod op_times;
mod rope;
mod weights;

use std::ops::Range;
use std::sync::Arc;

pub use tessera_kernels::cpu::attention::TreeMask;
use tessera_kernels::cpu::{ActivationDtype, attention};
use tessera_model_files::{ModelConfig, ModelFiles};

use crate::EngineError;
use crate::comm::{Communicator, HeadSplit, LocalComm, Partition};
use crate::kv_cache::{CachePages, KvCache, KvDtype};
use backend::{Backend, Dims};
use batch::FlatBatch;
pub(crate) use cpu::AttentionStep;
use cpu::CpuBackend;
#[cfg(feature = "cuda")]
pub(crate) use cuda::CudaKv;
#[cfg(feature = "cuda")]
pub use cuda::CudaOptions;
pub(crate) use draft_support::EmbeddedBatch;
pub use op_times::{Op, OpTimes, OpTimesSnapshot};
use weights::ModelWeights;

use crate::pooling::ScoreHead;
pub use weights::WeightLayout;

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

/// Which final hidden states (after the final norm) a pass brings back beside its logits: what
/// a speculator's draft reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HiddenStates {
    /// None.
    None,
    /// Those of the rows that have logits (what Medusa heads read).
    LogitRows,
    /// Every row's (what an EAGLE-style draft layer reads).
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
    /// The chunk verifies a speculator's proposals below `tokens[0]`, laid out as a tree (a
    /// chain for one line of proposals): token `i` stands at `start_position + depth`, its K/V
    /// go to the slot of `start_position + i` until the accepted path is kept, and under
    /// length-dependent RoPE it rotates as it would decoded alone. `None`: consecutive
    /// positions computed together (a prompt chunk, a decoded token).
    pub tree: Option<TreeMask<'a>>,
    /// Tokens of the sequence's prompt. Under length-dependent RoPE the prompt's tokens rotate
    /// by the prompt's length and each later token by the length it is decoded at, as
    /// transformers generates, however the prompt is chunked or the sequence recomputed.
    pub prompt_len: usize,
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
    /// The same rows' final hidden states (after the final norm), `[rows, hidden]`, when the
    /// pass was asked for them ([`HiddenStates::LogitRows`] or [`HiddenStates::All`]); empty
    /// otherwise.
    pub hidden: Vec<f32>,
    /// Width of a hidden state.
    pub hidden_size: usize,
    /// When every row's state was kept ([`HiddenStates::All`]): per chunk, per token, its row of
    /// `hidden`; empty otherwise.
    pub token_hidden_rows: Vec<Vec<usize>>,
}

impl ForwardOutput {
    /// The final hidden state of token `i` of chunk `chunk`, if the pass kept every row's.
    pub fn token_hidden(&self, chunk: usize, i: usize) -> Option<&[f32]> {
        let r = *self.token_hidden_rows.get(chunk)?.get(i)?;
        self.hidden
            .get(r * self.hidden_size..(r + 1) * self.hidden_size)
    }

    /// The final hidden state behind logits row `i` of chunk `chunk`, if the pass kept them.
    pub fn hidden_row(&self, chunk: usize, i: usize) -> Option<&[f32]> {
        let r = self.rows[chunk].start + i;
        let w = self.hidden_size;
        self.hidden
            .get(r * w..(r + 1) * w)
            .filter(|_| r < self.rows[chunk].end)
    }

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
    comm: Arc<dyn Communicator>,
    partition: Partition,
    heads: HeadSplit,
    kv_dtype: KvDtype,
    /// The storage format of most weight bytes, as loaded from the files.
    weights_dtype: &'static str,
    compute: Compute,
    /// A sequence-classification head, when the model has one instead of its LM head.
    score_head: Option<ScoreHead>,
}

/// Where the forward pass runs.
#[allow(clippy::large_enum_variant)] // one per model, never moved on a hot path
enum Compute {
    Cpu(CpuBackend),
    #[cfg(feature = "cuda")]
    Cuda(cuda::CudaModel),
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
        let cfg = &files.config;
        let score_head = cfg
            .score_labels
            .map(|labels| ScoreHead::load(files.weights.as_ref(), labels, cfg.hidden_size, &name))
            .transpose()?;
        let dims = Dims {
            sandwich_norms: cfg.family.sandwich_norms,
            activation: cfg.family.activation,
            hidden: cfg.hidden_size,
            head_dim: cfg.head_dim,
            heads: heads.q.len(),
            kv_heads: heads.kv.len(),
            intermediate: weights
                .layers
                .iter()
                .find_map(|l| l.mlp.dense())
                .map_or(0, |(_, down)| down.in_features()),
        };
        Ok(Self {
            config: cfg.clone(),
            weights_dtype: weights.storage_dtype(),
            compute: Compute::Cpu(CpuBackend {
                weights,
                dims,
                rope: rope::Rope::new(cfg),
                local_rope: rope::Rope::local(cfg),
                eps: cfg.rms_norm_eps,
                family: cfg.family.clone(),
                activations: ActivationDtype::Float32,
                comm: comm.clone(),
                world_size: partition.world_size,
                op_times: None,
            }),
            comm,
            partition,
            heads,
            kv_dtype: KvDtype::Float32,
            score_head,
        })
    }

    /// Moves the weights to GPU `options.device` (this rank's), where every later pass runs,
    /// in the element type of [`Self::kv_dtype`] (bf16 or f32) for weights, activations and
    /// the KV cache alike. Set the KV dtype first.
    #[cfg(feature = "cuda")]
    pub fn into_cuda(self, options: &CudaOptions) -> Result<Self, EngineError> {
        let cpu = match self.compute {
            Compute::Cpu(cpu) => cpu,
            Compute::Cuda(_) => {
                return Err(EngineError::Device("the model is already on a GPU".into()));
            }
        };
        let gpu = cuda::CudaModel::upload(cpu, self.kv_dtype, options)?;
        Ok(Self {
            compute: Compute::Cuda(gpu),
            ..self
        })
    }

    /// Decode steps replayed from CUDA graphs so far (0 on the CPU).
    pub fn cuda_graph_replays(&self) -> u64 {
        match &self.compute {
            Compute::Cpu(_) => 0,
            #[cfg(feature = "cuda")]
            Compute::Cuda(gpu) => gpu.graph_replays(),
        }
    }

    /// Where the pass runs, as `/info` names it: `"cpu"` or `"cuda"`.
    pub fn device_type(&self) -> &'static str {
        match &self.compute {
            Compute::Cpu(_) => "cpu",
            #[cfg(feature = "cuda")]
            Compute::Cuda(_) => "cuda",
        }
    }

    /// Whether the pass runs on a GPU.
    pub fn on_gpu(&self) -> bool {
        !matches!(self.compute, Compute::Cpu(_))
    }

    /// `"cpu"`, or the GPU's name.
    pub fn device(&self) -> String {
        match &self.compute {
            Compute::Cpu(_) => "cpu".into(),
            #[cfg(feature = "cuda")]
            Compute::Cuda(gpu) => gpu.device_name(),
        }
    }

    /// Bytes of KV cache that fit in `fraction` of the GPU's free memory, less what a pass
    /// of `max_tokens` tokens allocates (`None` on the CPU, whose budget is a byte count).
    /// Call with the smallest cache allocated: what is free is what the weights leave.
    pub fn device_kv_budget(
        &self,
        fraction: f32,
        max_tokens: usize,
    ) -> Result<Option<u64>, EngineError> {
        match &self.compute {
            Compute::Cpu(_) => {
                let _ = (fraction, max_tokens);
                Ok(None)
            }
            #[cfg(feature = "cuda")]
            Compute::Cuda(gpu) => gpu.kv_budget(fraction, max_tokens).map(Some),
        }
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
    /// see [`ActivationDtype`]). CPU only: on a GPU the element type is the KV dtype's.
    #[allow(irrefutable_let_patterns)] // refutable with `cuda`
    pub fn with_activation_dtype(mut self, dtype: ActivationDtype) -> Self {
        if let Compute::Cpu(cpu) = &mut self.compute {
            cpu.activations = dtype;
        }
        self
    }

    /// What products round their activations to.
    pub fn activation_dtype(&self) -> ActivationDtype {
        match &self.compute {
            Compute::Cpu(cpu) => cpu.activations,
            #[cfg(feature = "cuda")]
            Compute::Cuda(_) => match self.kv_dtype {
                KvDtype::Float32 => ActivationDtype::Float32,
                KvDtype::Bfloat16 => ActivationDtype::Bfloat16,
            },
        }
    }

    /// The storage format of most of this rank's weight bytes in the model's files, as
    /// `/info` reports it: `float32`, `bfloat16`, `float16`, or the GGUF block type (`Q4_1`,
    /// `Q4_K`…).
    pub fn weights_dtype(&self) -> &'static str {
        self.weights_dtype
    }

    /// Element type of the caches [`Model::new_cache`] makes.
    pub fn kv_dtype(&self) -> KvDtype {
        self.kv_dtype
    }

    /// A cache of `num_blocks` blocks of `block_size` tokens for this model, in the memory
    /// its pass runs in (host or GPU).
    pub fn new_cache(&self, num_blocks: usize, block_size: usize) -> Result<KvCache, EngineError> {
        let layout = self.kv_layout(block_size);
        match &self.compute {
            Compute::Cpu(_) => Ok(KvCache::with_dtype(
                self.config.num_layers,
                num_blocks,
                layout,
                self.kv_dtype,
            )),
            #[cfg(feature = "cuda")]
            Compute::Cuda(gpu) => gpu.new_cache(self.config.num_layers, num_blocks, layout),
        }
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
            if let Some(tree) = &c.tree {
                check_tree(tree, c.tokens.len())
                    .map_err(|e| EngineError::InvalidBatch(format!("sequence {i}: {e}")))?;
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

    /// Counts the time of every later CPU pass, operation by operation, into `times` (`None`
    /// stops counting). A model on a GPU ignores it: its launches return before the work is
    /// done.
    pub fn set_op_times(&mut self, times: Option<Arc<OpTimes>>) {
        match &mut self.compute {
            Compute::Cpu(cpu) => cpu.op_times = times,
            #[cfg(feature = "cuda")]
            Compute::Cuda(_) => {}
        }
    }

    /// What counts this model's passes, if anything does.
    fn op_times(&self) -> Option<&OpTimes> {
        match &self.compute {
            Compute::Cpu(cpu) => cpu.op_times.as_deref(),
            #[cfg(feature = "cuda")]
            Compute::Cuda(_) => None,
        }
    }

    /// The logits of the model's sequence-classification head for one final hidden state
    /// (`None`: the model has no such head).
    pub(crate) fn score_head(&self) -> Option<&ScoreHead> {
        self.score_head.as_ref()
    }

    /// Runs one pass over all chunks, writing their K/V into `cache` and returning the logits
    /// they asked for, and the final hidden states `hidden` names. Each sequence's results do
    /// not depend on the other chunks.
    pub fn forward(
        &self,
        chunks: &[SequenceChunk<'_>],
        cache: &mut KvCache,
        hidden: HiddenStates,
    ) -> Result<ForwardOutput, EngineError> {
        self.check(chunks, cache)?;
        let timing = self
            .op_times()
            .map(|times| (times, std::time::Instant::now()));
        let batch = FlatBatch::keeping_hidden(chunks, cache.layout.block_size, hidden);
        let layers = self.config.num_layers;
        let vocab = self.partition.counts(self.config.vocab_size)[self.partition.rank];
        let out = match (&self.compute, &mut cache.pages) {
            // On one of rayon's threads: a pass makes a hundred or more parallel calls, and
            // each one from outside the pool would hand its work over and sleep until it is
            // done; the products and attention run on the decode team, awake for the pass.
            // Not under tensor parallelism: ranks that share a process (and so a pool) would
            // each hold a pool thread while waiting in the all-reduce for a rank that cannot
            // get one.
            (Compute::Cpu(cpu), CachePages::Host(pages)) if self.partition.world_size == 1 => {
                let _awake = tessera_kernels::cpu::team::awake();
                rayon::scope(|_| forward::forward(cpu, cpu.dims, layers, &batch, pages, vocab))?
            }
            (Compute::Cpu(cpu), CachePages::Host(pages)) => {
                forward::forward(cpu, cpu.dims, layers, &batch, pages, vocab)?
            }
            #[cfg(feature = "cuda")]
            (Compute::Cuda(gpu), CachePages::Cuda(kv)) => gpu.forward(layers, &batch, kv)?,
            #[cfg(feature = "cuda")]
            (Compute::Cpu(_), CachePages::Cuda(_)) => {
                return Err(EngineError::InvalidBatch(
                    "a CPU model was given a KV cache in GPU memory".into(),
                ));
            }
            #[cfg(feature = "cuda")]
            (Compute::Cuda(_), CachePages::Host(_)) => {
                return Err(EngineError::InvalidBatch(
                    "a GPU model was given a KV cache in host memory".into(),
                ));
            }
        };
        if let Some((times, start)) = timing {
            times.pass(start);
        }
        let rows = batch.logit_rows.len();
        let token_hidden_rows = match hidden {
            HiddenStates::All => token_hidden_rows(&batch),
            _ => Vec::new(),
        };
        let logits = if self.partition.world_size > 1 {
            self.gather_logits(&out.logits, rows)?
        } else {
            out.logits
        };
        Ok(ForwardOutput {
            logits,
            vocab_size: self.config.vocab_size,
            rows: batch.out_rows,
            hidden: out.hidden,
            hidden_size: self.config.hidden_size,
            token_hidden_rows,
        })
    }

    /// The whole vocabulary's logits of `rows` final hidden states (`[rows, hidden]`, as
    /// [`ForwardOutput::hidden`] holds them) through the model's LM head: how draft heads that
    /// share the target's head score their states. Every rank of a group must call it.
    pub fn vocab_logits(&self, hidden: &[f32], rows: usize) -> Result<Vec<f32>, EngineError> {
        if hidden.len() != rows * self.config.hidden_size {
            return Err(EngineError::InvalidBatch(format!(
                "{} values are not {rows} hidden states of {}",
                hidden.len(),
                self.config.hidden_size
            )));
        }
        let local_vocab = self.partition.counts(self.config.vocab_size)[self.partition.rank];
        let local = match &self.compute {
            Compute::Cpu(cpu) => {
                let x = cpu.upload_values(hidden)?;
                let logits = cpu.lm_head(&x, rows)?;
                cpu.to_host(logits, rows * local_vocab)?
            }
            #[cfg(feature = "cuda")]
            Compute::Cuda(gpu) => gpu.vocab_logits(hidden, rows)?,
        };
        if self.partition.world_size > 1 {
            self.gather_logits(&local, rows)
        } else {
            Ok(local)
        }
    }
}

/// Per chunk of `batch`, per token, the row of the pass's kept hidden states that holds its.
fn token_hidden_rows(batch: &FlatBatch<'_>) -> Vec<Vec<usize>> {
    let mut at = vec![0; batch.tokens()];
    for (i, r) in batch.hidden_rows().enumerate() {
        at[r] = i;
    }
    batch
        .seqs
        .iter()
        .map(|s| at[s.first_row..s.first_row + s.rows].to_vec())
        .collect()
}

/// Whether `tree` lays out `rows` rows as a tree in breadth-first order: row 0 the root, each
/// row seeing the root, itself and earlier rows only, at the depth its path says.
fn check_tree(tree: &TreeMask<'_>, rows: usize) -> Result<(), String> {
    if rows > TreeMask::MAX_ROWS || tree.visible.len() != rows || tree.depths.len() != rows {
        return Err(format!(
            "a token tree of {rows} rows needs a mask and a depth per row (at most {})",
            TreeMask::MAX_ROWS
        ));
    }
    for r in 0..rows {
        let v = tree.visible[r];
        let path = v.count_ones() as usize;
        // Bit `r` set and none above it (`own << 1` would overflow for the last row).
        if v & 1 == 0 || v >> r != 1 || tree.depths[r] as usize + 1 != path {
            return Err(format!("token tree row {r} is not a path from the root"));
        }
        if r > 0 && tree.depths[r] < tree.depths[r - 1] {
            return Err("token tree rows are not in breadth-first order".into());
        }
    }
    Ok(())
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
