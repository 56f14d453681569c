//! Hugging Face tensor names to GGUF names, and undoing llama.cpp's q/k row permutation.

/// Where a family's converter puts the norms around the MLP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Norms {
    /// `post_attention_layernorm`, the MLP's input norm, is `ffn_norm`.
    Plain,
    /// Gemma's four norms per layer: `post_attention_layernorm` is the norm of the
    /// attention's output (`post_attention_norm`), `pre_feedforward_layernorm` the MLP's
    /// input norm (`ffn_norm`) and `post_feedforward_layernorm` its output's
    /// (`post_ffw_norm`).
    Sandwich,
    /// gpt-oss's: `post_attention_layernorm`, the MLP's input norm, is `post_attention_norm`.
    GptOss,
}

/// The GGUF name of a Hugging Face decoder tensor name, if it has one; `norms` says where
/// the family's converter puts the norms around the MLP.
pub(crate) fn hf_to_gguf(name: &str, norms: Norms) -> Option<String> {
    let sandwich = norms == Norms::Sandwich;
    match name {
        "model.embed_tokens.weight" => return Some("token_embd.weight".into()),
        "model.norm.weight" => return Some("output_norm.weight".into()),
        "lm_head.weight" => return Some("output.weight".into()),
        _ => {}
    }
    let rest = name.strip_prefix("model.layers.")?;
    let (layer, rest) = rest.split_once('.')?;
    if layer.is_empty() || !layer.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if rest == "self_attn.sinks" {
        return Some(format!("blk.{layer}.attn_sinks.weight"));
    }
    let (module, suffix) = match rest.rsplit_once('.')? {
        (m, s @ ("weight" | "bias")) => (m, s),
        _ => return None,
    };
    let gguf = match (module, suffix) {
        ("input_layernorm", "weight") => "attn_norm",
        ("post_attention_layernorm", "weight") if norms == Norms::GptOss => "post_attention_norm",
        ("post_attention_layernorm", "weight") if sandwich => "post_attention_norm",
        ("post_attention_layernorm", "weight") => "ffn_norm",
        ("pre_feedforward_layernorm", "weight") if sandwich => "ffn_norm",
        ("post_feedforward_layernorm", "weight") if sandwich => "post_ffw_norm",
        ("self_attn.q_norm", "weight") => "attn_q_norm",
        ("self_attn.k_norm", "weight") => "attn_k_norm",
        ("self_attn.q_proj", _) => "attn_q",
        ("self_attn.k_proj", _) => "attn_k",
        ("self_attn.v_proj", _) => "attn_v",
        ("self_attn.o_proj", _) => "attn_output",
        // Phi-3's fused projections, which llama.cpp keeps fused.
        ("self_attn.qkv_proj", _) => "attn_qkv",
        ("mlp.gate_up_proj", "weight") => "ffn_up",
        ("mlp.gate_proj", "weight") => "ffn_gate",
        // The MoE router (gpt-oss's with a bias).
        ("mlp.gate" | "block_sparse_moe.gate", "weight") => "ffn_gate_inp",
        ("mlp.router", _) => "ffn_gate_inp",
        // Qwen2-MoE's shared expert and its gate.
        ("mlp.shared_expert.gate_proj", "weight") => "ffn_gate_shexp",
        ("mlp.shared_expert.up_proj", "weight") => "ffn_up_shexp",
        ("mlp.shared_expert.down_proj", "weight") => "ffn_down_shexp",
        ("mlp.shared_expert_gate", "weight") => "ffn_gate_inp_shexp",
        ("mlp.up_proj", "weight") => "ffn_up",
        ("mlp.down_proj", "weight") => "ffn_down",
        _ => return None,
    };
    Some(format!("blk.{layer}.{gguf}.{suffix}"))
}

/// Where one expert's matrix lies in a GGUF file.
#[derive(Debug, PartialEq)]
pub(crate) struct ExpertTensor {
    /// The 3-D tensor that stacks every expert's (`blk.N.ffn_gate_exps.weight`).
    pub(crate) stacked: String,
    /// The expert's own 2-D tensor in files converted before llama.cpp stacked them
    /// (`blk.N.ffn_gate.E.weight`).
    pub(crate) single: String,
    pub(crate) expert: usize,
}

/// For one expert's matrix (`model.layers.N.mlp.experts.E.gate_proj.weight`, or Mixtral's
/// `block_sparse_moe.experts.E.w1.weight`) or bias (gpt-oss's `…gate_proj.bias`), its GGUF
/// tensors.
pub(crate) fn hf_expert_to_gguf(name: &str) -> Option<ExpertTensor> {
    let rest = name.strip_prefix("model.layers.")?;
    let (layer, rest) = rest.split_once('.')?;
    let rest = rest
        .strip_prefix("mlp.experts.")
        .or_else(|| rest.strip_prefix("block_sparse_moe.experts."))?;
    let (expert, matrix) = rest.split_once('.')?;
    let all_digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !all_digits(layer) || !all_digits(expert) {
        return None;
    }
    let (kind, suffix) = match matrix {
        "gate_proj.weight" | "w1.weight" => ("ffn_gate", "weight"),
        "up_proj.weight" | "w3.weight" => ("ffn_up", "weight"),
        "down_proj.weight" | "w2.weight" => ("ffn_down", "weight"),
        "gate_proj.bias" => ("ffn_gate", "bias"),
        "up_proj.bias" => ("ffn_up", "bias"),
        "down_proj.bias" => ("ffn_down", "bias"),
        _ => return None,
    };
    Some(ExpertTensor {
        stacked: format!("blk.{layer}.{kind}_exps.{suffix}"),
        single: format!("blk.{layer}.{kind}.{expert}.{suffix}"),
        expert: expert.parse().ok()?,
    })
}

/// Whether this GGUF tensor is a q or k projection (weight or bias), and which head count
/// llama.cpp's `LlamaModel.permute` used for it: `Some(true)` for q (`head_count`),
/// `Some(false)` for k (`head_count_kv`).
pub(crate) fn permuted_projection(gguf_name: &str) -> Option<bool> {
    let rest = gguf_name.strip_prefix("blk.")?;
    let (_, rest) = rest.split_once('.')?;
    match rest {
        "attn_q.weight" | "attn_q.bias" => Some(true),
        "attn_k.weight" | "attn_k.bias" => Some(false),
        _ => None,
    }
}

/// Inverts `w.reshape(n_head, 2, rows/n_head/2, cols).swapaxes(1, 2).reshape(w.shape)` on
/// row-major `data` of `rows` rows (callers check `rows % (2 * n_head) == 0`).
///
/// Within a head, the converter moved Hugging Face row `s * half + j` (rotate-half layout)
/// to row `2 * j + s` (interleaved pairs); this moves it back.
pub(crate) fn unpermute_rows<T: Copy + Default>(data: &[T], rows: usize, n_head: usize) -> Vec<T> {
    let cols = data.len().checked_div(rows).unwrap_or(0);
    let head_rows = rows.checked_div(n_head).unwrap_or(0);
    let half = head_rows / 2;
    let mut out = vec![T::default(); data.len()];
    for h in 0..n_head {
        for s in 0..2 {
            for j in 0..half {
                let src = h * head_rows + 2 * j + s;
                let dst = h * head_rows + s * half + j;
                out[dst * cols..(dst + 1) * cols]
                    .copy_from_slice(&data[src * cols..(src + 1) * cols]);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_every_llama_tensor() {
        let cases = [
            ("model.embed_tokens.weight", "token_embd.weight"),
            ("model.norm.weight", "output_norm.weight"),
            ("lm_head.weight", "output.weight"),
            (
                "model.layers.0.input_layernorm.weight",
                "blk.0.attn_norm.weight",
            ),
            (
                "model.layers.12.post_attention_layernorm.weight",
                "blk.12.ffn_norm.weight",
            ),
            (
                "model.layers.3.self_attn.q_proj.weight",
                "blk.3.attn_q.weight",
            ),
            ("model.layers.3.self_attn.k_proj.bias", "blk.3.attn_k.bias"),
            ("model.layers.3.self_attn.v_proj.bias", "blk.3.attn_v.bias"),
            (
                "model.layers.3.self_attn.o_proj.weight",
                "blk.3.attn_output.weight",
            ),
            (
                "model.layers.3.mlp.gate_proj.weight",
                "blk.3.ffn_gate.weight",
            ),
            ("model.layers.3.mlp.up_proj.weight", "blk.3.ffn_up.weight"),
            (
                "model.layers.3.mlp.down_proj.weight",
                "blk.3.ffn_down.weight",
            ),
        ];
        for (hf, gguf) in cases {
            assert_eq!(hf_to_gguf(hf, Norms::Plain).as_deref(), Some(gguf), "{hf}");
        }
        for bad in [
            "model.layers.x.mlp.up_proj.weight",
            "model.layers.1.mlp.up_proj.scale",
            "model.layers..mlp.up_proj.weight",
            "token_embd.weight",
            "model.layers.1.mlp.up_proj.bias.weight",
        ] {
            assert_eq!(hf_to_gguf(bad, Norms::Plain), None, "{bad}");
        }
        for (hf, gguf) in [
            ("post_attention_layernorm", "post_attention_norm"),
            ("pre_feedforward_layernorm", "ffn_norm"),
            ("post_feedforward_layernorm", "post_ffw_norm"),
            ("self_attn.q_norm", "attn_q_norm"),
        ] {
            let name = format!("model.layers.2.{hf}.weight");
            let want = format!("blk.2.{gguf}.weight");
            assert_eq!(hf_to_gguf(&name, Norms::Sandwich), Some(want), "{hf}");
        }
        for (hf, gguf) in [
            ("shared_expert.gate_proj", "ffn_gate_shexp"),
            ("shared_expert.up_proj", "ffn_up_shexp"),
            ("shared_expert.down_proj", "ffn_down_shexp"),
            ("shared_expert_gate", "ffn_gate_inp_shexp"),
        ] {
            let name = format!("model.layers.4.mlp.{hf}.weight");
            let want = format!("blk.4.{gguf}.weight");
            assert_eq!(hf_to_gguf(&name, Norms::Plain), Some(want), "{hf}");
        }
    }

    #[test]
    fn expert_matrices_are_slices_of_the_stacked_tensors() {
        assert_eq!(
            hf_expert_to_gguf("model.layers.3.mlp.experts.7.up_proj.weight"),
            Some(ExpertTensor {
                stacked: "blk.3.ffn_up_exps.weight".into(),
                single: "blk.3.ffn_up.7.weight".into(),
                expert: 7
            })
        );
        assert_eq!(
            hf_expert_to_gguf("model.layers.0.block_sparse_moe.experts.12.w2.weight"),
            Some(ExpertTensor {
                stacked: "blk.0.ffn_down_exps.weight".into(),
                single: "blk.0.ffn_down.12.weight".into(),
                expert: 12
            })
        );
        assert_eq!(
            hf_expert_to_gguf("model.layers.0.mlp.experts.x.w2.weight"),
            None
        );
        assert_eq!(
            hf_to_gguf("model.layers.1.block_sparse_moe.gate.weight", Norms::Plain).as_deref(),
            Some("blk.1.ffn_gate_inp.weight")
        );
    }

    #[test]
    fn unpermute_inverts_the_converters_permutation() {
        // Two heads of four rows, two columns; row r holds [r, r].
        let n_head = 2;
        let rows = 8;
        let hf: Vec<f32> = (0..rows).flat_map(|r| [r as f32, r as f32]).collect();
        // llama.cpp's permute: within a head, gguf row 2*j+s = hf row s*half+j.
        let mut gguf = vec![0.0; hf.len()];
        for h in 0..n_head {
            for s in 0..2 {
                for j in 0..2 {
                    let (g, f) = (h * 4 + 2 * j + s, h * 4 + s * 2 + j);
                    gguf[2 * g..2 * g + 2].copy_from_slice(&hf[2 * f..2 * f + 2]);
                }
            }
        }
        assert_eq!(gguf[..8], [0.0, 0.0, 2.0, 2.0, 1.0, 1.0, 3.0, 3.0]);
        assert_eq!(unpermute_rows(&gguf, rows, n_head), hf);
    }
}
