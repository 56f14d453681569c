//! The pass of an EAGLE-style draft layer ([`EagleHead`]) over its own one-layer paged cache,
//! with the target's embedding and rotary tables: every token's output state, which the
//! target's LM head ([`Model::vocab_logits`]), or its rows for a draft vocabulary
//! ([`DraftVocabHead`]), turns into logits.

use tessera_kernels::cpu::attention::{NewKv, softcap};
use tessera_kernels::cpu::{
    ActivationDtype, WeightFormat, WeightMatrix, activation, linear_weights_as, norm, rope,
};

use super::backend::Backend;
use super::batch::FlatBatch;
use super::cpu::{AttentionStep, CpuBackend};
use super::{Compute, HiddenStates, Model, SequenceChunk};
use crate::EngineError;
use crate::kv_cache::{CachePages, HostPages, KvCache};
use crate::speculative::EagleHead;

impl Model {
    /// The head's output state for every token of `chunks` (`[tokens, hidden]`, in order),
    /// each token paired with its row of `features` (the target's final hidden state of the
    /// position before it). Writes the tokens' K/V into `cache`, the head's own. Every rank of
    /// a group must call it (the embedding is vocabulary-parallel).
    pub fn draft_layer_pass(
        &self,
        head: &EagleHead,
        chunks: &[SequenceChunk<'_>],
        features: &[f32],
        cache: &mut KvCache,
    ) -> Result<Vec<f32>, EngineError> {
        let bs = cache.layout.block_size;
        let tokens: usize = chunks.iter().map(|c| c.tokens.len()).sum();
        if cache.layout != head.kv_layout(bs) || cache.num_layers() != 1 {
            return Err(EngineError::InvalidBatch(
                "the draft layer's cache was made for another layer".into(),
            ));
        }
        if features.len() != tokens * head.hidden {
            return Err(EngineError::InvalidBatch(format!(
                "{} feature values are not {tokens} states of {}",
                features.len(),
                head.hidden
            )));
        }
        for (i, c) in chunks.iter().enumerate() {
            let end = c.start_position + c.tokens.len();
            let blocks_exist = c
                .block_table
                .iter()
                .all(|&b| (b as usize) < cache.num_blocks);
            if c.block_table.len() * bs < end || !blocks_exist {
                return Err(EngineError::InvalidBatch(format!(
                    "draft sequence {i}: its blocks do not hold {end} positions in this cache"
                )));
            }
        }
        let flat = FlatBatch::keeping_hidden(chunks, bs, HiddenStates::None);
        match (&self.compute, &mut cache.pages) {
            (Compute::Cpu(cpu), CachePages::Host(pages)) if self.partition.world_size == 1 => {
                rayon::scope(|_| cpu.draft_layer(head, &flat, features, pages))
            }
            (Compute::Cpu(cpu), CachePages::Host(pages)) => {
                cpu.draft_layer(head, &flat, features, pages)
            }
            #[allow(unreachable_patterns)]
            _ => Err(EngineError::Device(
                "EAGLE draft layers run on the CPU backend only".into(),
            )),
        }
    }
}

impl CpuBackend {
    fn draft_layer(
        &self,
        head: &EagleHead,
        flat: &FlatBatch<'_>,
        features: &[f32],
        pages: &mut HostPages,
    ) -> Result<Vec<f32>, EngineError> {
        let batch = self.upload(flat)?;
        let (t, h, hd) = (flat.tokens(), head.hidden, head.head_dim);
        let f32s = ActivationDtype::Float32;
        let mut embedded = vec![0f32; t * h];
        self.embed(&batch, &mut embedded)?;
        self.all_reduce(&mut embedded)?;
        let pairs: Vec<f32> = embedded
            .chunks_exact(h)
            .zip(features.chunks_exact(h))
            .flat_map(|(e, f)| e.iter().chain(f).copied())
            .collect();
        let mut x = vec![0f32; t * h];
        linear_weights_as(&pairs, &head.fc, head.fc_bias.as_deref(), t, &mut x, f32s);
        let mut normed = match &head.input_norm {
            Some(w) => {
                let mut n = vec![0f32; t * h];
                norm::rms_norm(&x, w, head.eps, &mut n);
                n
            }
            None => x.clone(),
        };
        let qkv_width = (head.heads + 2 * head.kv_heads) * hd;
        let mut qkv = vec![0f32; t * qkv_width];
        linear_weights_as(&normed, &head.qkv, None, t, &mut qkv, f32s);
        rope::apply_rope(
            &mut qkv, qkv_width, 0, head.heads, hd, &batch.cos, &batch.sin,
        );
        let mut attended = vec![0f32; t * head.heads * hd];
        let step = AttentionStep {
            layout: head.kv_layout(flat.block_size),
            new: NewKv {
                rows: &qkv,
                row_stride: qkv_width,
                k_offset: head.heads * hd,
                v_offset: (head.heads + head.kv_heads) * hd,
                slots: &flat.slots,
                rope: Some((&batch.cos, &batch.sin)),
            },
            heads: head.heads,
            seqs: &flat.seqs,
            scale: (hd as f32).powf(-0.5),
            window: None,
            softcap: None,
        };
        match pages {
            HostPages::F32(layers) => step.run(&mut layers[0], &mut attended),
            HostPages::Bf16(layers) => step.run(&mut layers[0], &mut attended),
        }
        let mut out = vec![0f32; t * h];
        linear_weights_as(&attended, &head.o, None, t, &mut out, f32s);
        norm::add_rms_norm(
            &mut x,
            &out,
            &head.post_attention_norm,
            head.eps,
            &mut normed,
        );
        let inter = head.intermediate;
        let mut gate_up = vec![0f32; t * 2 * inter];
        linear_weights_as(&normed, &head.gate_up, None, t, &mut gate_up, f32s);
        let mut act = vec![0f32; t * inter];
        activation::silu_mul(&gate_up, inter, &mut act);
        linear_weights_as(&act, &head.down, None, t, &mut out, f32s);
        x.iter_mut().zip(&out).for_each(|(a, b)| *a += b);
        Ok(x)
    }
}

/// The rows of the model's LM head for a draft vocabulary (FR-Spec): a draft that proposes
/// only these tokens scores its states against these rows alone, on every rank whole.
pub(crate) struct DraftVocabHead {
    /// The model's token id of each row.
    ids: Vec<u32>,
    /// `[ids, hidden]`, in bf16.
    weight: WeightMatrix,
    softcap: Option<f32>,
}

impl DraftVocabHead {
    /// Rows of the draft vocabulary.
    pub(crate) fn len(&self) -> usize {
        self.ids.len()
    }

    /// The model's token id of row `i`.
    pub(crate) fn token(&self, i: usize) -> u32 {
        self.ids[i]
    }

    /// `[rows, len]` logits of `rows` states (`[rows, hidden]`), soft-capped as the model caps
    /// its own.
    pub(crate) fn logits(&self, states: &[f32], rows: usize) -> Vec<f32> {
        let mut out = vec![0f32; rows * self.ids.len()];
        linear_weights_as(
            states,
            &self.weight,
            None,
            rows,
            &mut out,
            ActivationDtype::Float32,
        );
        if let Some(cap) = self.softcap {
            out.iter_mut().for_each(|x| *x = softcap(*x, cap));
        }
        out
    }
}

impl Model {
    /// The LM head's rows for the tokens `ids` (gathered from every rank under tensor
    /// parallelism: every rank must call it).
    pub(crate) fn draft_vocab_head(&self, ids: &[u32]) -> Result<DraftVocabHead, EngineError> {
        let (h, vocab) = (self.config.hidden_size, self.config.vocab_size);
        if let Some(&bad) = ids.iter().find(|&&t| t as usize >= vocab) {
            return Err(EngineError::InvalidBatch(format!(
                "draft vocabulary token {bad} is outside the model's {vocab}"
            )));
        }
        let w = match &self.compute {
            Compute::Cpu(cpu) => &cpu.weights,
            #[allow(unreachable_patterns)]
            _ => {
                return Err(EngineError::Device(
                    "EAGLE draft layers run on the CPU backend only".into(),
                ));
            }
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
        let bytes: Vec<u8> = rows
            .iter()
            .flat_map(|&x| half::bf16::from_f32(x).to_le_bytes())
            .collect();
        let weight = WeightMatrix::from_bytes(WeightFormat::Bf16, ids.len(), h, &bytes)
            .map_err(|e| EngineError::InvalidBatch(format!("draft vocabulary head: {e}")))?;
        Ok(DraftVocabHead {
            ids: ids.to_vec(),
            weight,
            softcap: self.config.family.final_softcap,
        })
    }
}
