#!/usr/bin/env python3
"""Write model-files/src/config/class_defaults.json: the defaults of transformers' config classes
for the model types Tessera reads, which transformers assumes for every key a config.json leaves
out (and leaves out of the `text_config` it nests in Gemma3ForConditionalGeneration,
Mistral3ForConditionalGeneration and LLaVA-style checkpoints, which it writes as a diff against
those defaults). Only the keys the loader reads are kept, and
none that transformers derives from others at construction (`layer_types`, `head_dim` where it
is computed); the RoPE base only where the loader's own default differs.

Dev-only:
    /work/pyenv/bin/python scripts/make_class_defaults.py
"""

import json
from pathlib import Path

from transformers import CONFIG_MAPPING

TYPES = ["gemma3_text", "gemma2", "mistral", "llama", "qwen2", "qwen3", "phi3", "mixtral",
         "qwen2_moe", "qwen3_moe", "smollm3"]
KEYS = ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
        "num_attention_heads", "num_key_value_heads", "rms_norm_eps", "max_position_embeddings",
        "tie_word_embeddings", "sliding_window", "use_sliding_window", "attention_bias",
        "hidden_act", "hidden_activation", "query_pre_attn_scalar", "attn_logit_softcapping",
        "final_logit_softcapping", "bos_token_id", "eos_token_id", "partial_rotary_factor",
        "num_experts", "num_local_experts", "num_experts_per_tok", "moe_intermediate_size",
        "shared_expert_intermediate_size", "norm_topk_prob", "decoder_sparse_step",
        "mlp_only_layers", "no_rope_layer_interval"]
PERTURBED = {"hidden_size": 4, "num_attention_heads": 2, "num_hidden_layers": 3}
# The RoPE bases the loader assumes when a config gives none (model-files/src/config.rs).
LOADER_THETA = {"gemma3_text": 1_000_000.0}


def rope_theta(config) -> float:
    theta = getattr(config, "rope_theta", None)
    params = getattr(config, "rope_parameters", None) or {}
    if theta is None:
        theta = params.get("full_attention", params).get("rope_theta")
    return float(theta)


def main() -> None:
    out = {}
    for model_type in TYPES:
        cls = CONFIG_MAPPING[model_type]
        config = cls()
        d = config.to_dict()
        # A value the class derives from others (num_key_value_heads = num_attention_heads,
        # head_dim = hidden_size / heads) moves when they do: not a default.
        moved = cls(**{k: f * d[k] for k, f in PERTURBED.items()}).to_dict()
        out[model_type] = {
            k: d[k] for k in KEYS + ["head_dim"]
            if k in d and (k in PERTURBED or moved.get(k) == d[k])
        }
        if rope_theta(config) != LOADER_THETA.get(model_type, 10_000.0):
            out[model_type]["rope_theta"] = rope_theta(config)
    path = Path(__file__).resolve().parent.parent / "model-files/src/config/class_defaults.json"
    path.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
