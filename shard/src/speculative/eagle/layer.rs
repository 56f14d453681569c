//! The pass of an EAGLE-style draft layer ([`EagleHead`]) over its own one-layer paged cache,
//! with the target's embedding and rotary tables: every token's output state, which the
//! target's LM head ([`Model::vocab_logits`]), or its rows for a draft vocabulary
//! (`DraftVocabHead`), turns into logits.

use tessera_kernels::cpu::attention::NewKv;
use tessera_kernels::cpu::{ActivationDtype, activation, linear_weights_as, norm, rope};

use super::head::EagleHead;
use crate::EngineError;
use crate::kv_cache::{CachePages, HostPages, KvCache};
use crate::model::{AttentionStep, EmbeddedBatch, Model, SequenceChunk};

impl EagleHead {
    /// The head's output state for every token of `chunks` (`[tokens, hidden]`, in order),
    /// each token paired with its row of `features` (the target's final hidden state of the
    /// position before it), over `model`'s embedding and rotary tables. Writes the tokens' K/V
    /// into `cache`, the head's own. Every rank of a group must call it (the embedding is
    /// vocabulary-parallel).
    pub fn forward(
        &self,
        model: &Model,
        chunks: &[SequenceChunk<'_>],
        features: &[f32],
        cache: &mut KvCache,
    ) -> Result<Vec<f32>, EngineError> {
        let bs = cache.layout.block_size;
        let tokens: usize = chunks.iter().map(|c| c.tokens.len()).sum();
        if cache.layout != self.kv_layout(bs) || cache.num_layers() != 1 {
            return Err(EngineError::InvalidBatch(
                "the draft layer's cache was made for another layer".into(),
            ));
        }
        if features.len() != tokens * self.hidden {
            return Err(EngineError::InvalidBatch(format!(
                "{} feature values are not {tokens} states of {}",
                features.len(),
                self.hidden
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
        let pages = match &mut cache.pages {
            CachePages::Host(pages) => pages,
            #[allow(unreachable_patterns)]
            _ => {
                return Err(EngineError::Device(
                    "EAGLE draft layers run on the CPU backend only".into(),
                ));
            }
        };
        let mut run = || -> Result<Vec<f32>, EngineError> {
            let batch = model.embed_batch(chunks, bs)?;
            Ok(self.layer(&batch, features, pages))
        };
        // On one of rayon's threads, as the model's own pass runs (not under tensor
        // parallelism, whose ranks would each hold a pool thread in the all-reduce).
        if model.partition().world_size == 1 {
            rayon::scope(|_| run())
        } else {
            run()
        }
    }

    /// The layer over an embedded batch: `fc` over `[embedding ; feature]`, attention over
    /// the cache (written first), the MLP, each with its residual.
    fn layer(
        &self,
        batch: &EmbeddedBatch<'_>,
        features: &[f32],
        pages: &mut HostPages,
    ) -> Vec<f32> {
        let (t, h, hd) = (batch.tokens(), self.hidden, self.head_dim);
        let f32s = ActivationDtype::Float32;
        let pairs: Vec<f32> = batch
            .embedded
            .chunks_exact(h)
            .zip(features.chunks_exact(h))
            .flat_map(|(e, f)| e.iter().chain(f).copied())
            .collect();
        let mut x = vec![0f32; t * h];
        linear_weights_as(&pairs, &self.fc, self.fc_bias.as_deref(), t, &mut x, f32s);
        let mut normed = match &self.input_norm {
            Some(w) => {
                let mut n = vec![0f32; t * h];
                norm::rms_norm(&x, w, self.eps, &mut n);
                n
            }
            None => x.clone(),
        };
        let qkv_width = (self.heads + 2 * self.kv_heads) * hd;
        let mut qkv = vec![0f32; t * qkv_width];
        linear_weights_as(&normed, &self.qkv, None, t, &mut qkv, f32s);
        rope::apply_rope(
            &mut qkv, qkv_width, 0, self.heads, hd, &batch.cos, &batch.sin,
        );
        let mut attended = vec![0f32; t * self.heads * hd];
        let step = AttentionStep {
            layout: self.kv_layout(batch.block_size()),
            new: NewKv {
                rows: &qkv,
                row_stride: qkv_width,
                k_offset: self.heads * hd,
                v_offset: (self.heads + self.kv_heads) * hd,
                slots: batch.slots(),
                rope: Some((&batch.cos, &batch.sin)),
            },
            heads: self.heads,
            seqs: batch.seqs(),
            scale: (hd as f32).powf(-0.5),
            window: None,
            softcap: None,
            sinks: None,
        };
        match pages {
            HostPages::F32(layers) => step.run(&mut layers[0], &mut attended),
            HostPages::Bf16(layers) => step.run(&mut layers[0], &mut attended),
        }
        let mut out = vec![0f32; t * h];
        linear_weights_as(&attended, &self.o, None, t, &mut out, f32s);
        norm::add_rms_norm(
            &mut x,
            &out,
            &self.post_attention_norm,
            self.eps,
            &mut normed,
        );
        let inter = self.intermediate;
        let mut gate_up = vec![0f32; t * 2 * inter];
        linear_weights_as(&normed, &self.gate_up, None, t, &mut gate_up, f32s);
        let mut act = vec![0f32; t * inter];
        activation::silu_mul(&gate_up, inter, &mut act);
        linear_weights_as(&act, &self.down, None, t, &mut out, f32s);
        x.iter_mut().zip(&out).for_each(|(a, b)| *a += b);
        x
    }
}
