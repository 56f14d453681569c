//! The pass of an EAGLE-style draft layer ([`EagleHead`]) over its own one-layer paged cache,
//! with the target's embedding and rotary tables: every token's output state, which the
//! target's LM head ([`Model::vocab_logits`]) turns into logits.

use tessera_kernels::cpu::attention::NewKv;
use tessera_kernels::cpu::{ActivationDtype, activation, linear_weights_as, norm, rope};

use super::backend::Backend;
use super::batch::{FlatBatch, KeptHidden};
use super::cpu::{AttentionStep, CpuBackend};
use super::{Compute, Model, SequenceChunk};
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
        let flat = FlatBatch::keeping_hidden(chunks, bs, KeptHidden::None);
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
