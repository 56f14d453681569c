//! Medusa heads (Cai et al. 2024): extra heads over the model's final hidden state, head `k`
//! guessing the token `k + 2` places after the one the state was computed at (the model's own
//! LM head gives the `+1` token, which is the pending token when the heads run).
//!
//! A head is `L` residual blocks `x + SiLU(W x + b)` and a vocabulary projection: its own, as
//! Medusa's published heads carry one, or the model's LM head when the file has none (heads
//! trained against a frozen LM head are a few MB). The layout is Medusa's and TGI's:
//! `config.json` with `medusa_num_heads` and `medusa_num_layers`, and tensors
//! `{head}.{block}.linear.weight|bias` and `{head}.{L}.weight` (optionally under
//! `medusa_head.`) in `medusa_lm_head.safetensors`.

use std::path::Path;

use serde::Deserialize;
use tessera_kernels::cpu::matmul::linear;
use tessera_model_files::{FormatError, open_safetensors};

use crate::EngineError;
use crate::model::Model;
use crate::speculative::tree::TokenTree;
use crate::speculative::weights_file::heads_file;

#[derive(Deserialize)]
struct MedusaConfig {
    medusa_num_heads: usize,
    #[serde(default = "one")]
    medusa_num_layers: usize,
}

fn one() -> usize {
    1
}

/// One residual block's `[hidden, hidden]` weight and bias.
struct ResBlock {
    weight: Vec<f32>,
    bias: Vec<f32>,
}

struct Head {
    blocks: Vec<ResBlock>,
    /// `[vocab, hidden]`; `None`: the model's LM head.
    lm_head: Option<Vec<f32>>,
}

/// Loaded Medusa heads for one model.
pub struct MedusaHeads {
    heads: Vec<Head>,
    hidden: usize,
    vocab: usize,
}

impl MedusaHeads {
    /// Loads the heads in `dir` for a model of `hidden` wide states and `vocab` tokens.
    pub fn load(dir: &Path, hidden: usize, vocab: usize) -> Result<Self, EngineError> {
        let bad = |message: String| EngineError::Weights {
            path: dir.display().to_string(),
            message,
        };
        let config_path = dir.join("config.json");
        let text =
            std::fs::read_to_string(&config_path).map_err(|e| FormatError::io(&config_path, e))?;
        let config: MedusaConfig = serde_json::from_str(&text)
            .map_err(|e| bad(format!("config.json is not a Medusa configuration: {e}")))?;
        if config.medusa_num_heads == 0 || config.medusa_num_heads > TokenTree::MAX_NODES - 1 {
            return Err(bad(format!(
                "medusa_num_heads {} is outside 1..={}",
                config.medusa_num_heads,
                TokenTree::MAX_NODES - 1
            )));
        }
        let file = heads_file(dir, "medusa_lm_head.safetensors")?;
        let weights = open_safetensors(&file)?;
        let prefix = if weights.contains("medusa_head.0.0.linear.weight") {
            "medusa_head."
        } else {
            ""
        };
        let tensor = |name: &str, shape: &[usize]| -> Result<Vec<f32>, EngineError> {
            let full = format!("{prefix}{name}");
            let t = weights.load_f32(&full)?;
            if t.shape != shape {
                return Err(bad(format!(
                    "{full} is shaped {:?}; this model needs {shape:?}",
                    t.shape
                )));
            }
            Ok(t.data)
        };
        let layers = config.medusa_num_layers;
        let heads = (0..config.medusa_num_heads)
            .map(|k| {
                let blocks = (0..layers)
                    .map(|j| {
                        Ok(ResBlock {
                            weight: tensor(&format!("{k}.{j}.linear.weight"), &[hidden, hidden])?,
                            bias: tensor(&format!("{k}.{j}.linear.bias"), &[hidden])?,
                        })
                    })
                    .collect::<Result<Vec<_>, EngineError>>()?;
                let own = format!("{k}.{layers}.weight");
                let lm_head = if weights.contains(&format!("{prefix}{own}")) {
                    Some(tensor(&own, &[vocab, hidden])?)
                } else {
                    None
                };
                Ok(Head { blocks, lm_head })
            })
            .collect::<Result<Vec<_>, EngineError>>()?;
        Ok(Self {
            heads,
            hidden,
            vocab,
        })
    }

    /// Heads in the file.
    pub fn num_heads(&self) -> usize {
        self.heads.len()
    }

    /// The logits of the first `depth` heads for each of `states.len() / hidden` final
    /// hidden states: `[state][head][vocab]`. Heads without their own projection share one
    /// product through `model`'s LM head (a collective under tensor parallelism: every rank
    /// calls this in step).
    pub fn logits(
        &self,
        model: &Model,
        states: &[f32],
        depth: usize,
    ) -> Result<Vec<f32>, EngineError> {
        let (h, v) = (self.hidden, self.vocab);
        let rows = states.len() / h;
        let depth = depth.min(self.heads.len());
        // Every head's state of every row, `[row][head][hidden]`.
        let mut x = vec![0f32; rows * depth * h];
        let mut z = vec![0f32; rows * h];
        for (k, head) in self.heads[..depth].iter().enumerate() {
            let mut cur = states.to_vec();
            for block in &head.blocks {
                linear(&cur, &block.weight, Some(&block.bias), rows, h, &mut z);
                for (c, &zi) in cur.iter_mut().zip(&z) {
                    *c += zi / (1.0 + (-zi).exp());
                }
            }
            for r in 0..rows {
                x[(r * depth + k) * h..][..h].copy_from_slice(&cur[r * h..(r + 1) * h]);
            }
        }
        let shared: Vec<usize> = (0..rows * depth)
            .filter(|i| self.heads[i % depth].lm_head.is_none())
            .collect();
        let mut out = vec![0f32; rows * depth * v];
        if !shared.is_empty() {
            let gathered: Vec<f32> = shared
                .iter()
                .flat_map(|&i| x[i * h..(i + 1) * h].iter().copied())
                .collect();
            let logits = model.vocab_logits(&gathered, shared.len())?;
            for (n, &i) in shared.iter().enumerate() {
                out[i * v..(i + 1) * v].copy_from_slice(&logits[n * v..(n + 1) * v]);
            }
        }
        for i in 0..rows * depth {
            if let Some(w) = &self.heads[i % depth].lm_head {
                linear(
                    &x[i * h..(i + 1) * h],
                    w,
                    None,
                    1,
                    h,
                    &mut out[i * v..(i + 1) * v],
                );
            }
        }
        Ok(out)
    }
}
