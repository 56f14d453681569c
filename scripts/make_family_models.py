#!/usr/bin/env python3
"""Build the tiny random models of the newer families in fixtures/, their goldens, and a GGUF
file of each written the way llama.cpp's converter writes that family.

Dev-only. Run from anywhere (after scripts/make_test_models.py's requirements are installed):

    HF_HUB_OFFLINE=1 /work/pyenv-families/bin/python scripts/make_family_models.py

Shares the tokenizer, prompts, weight randomization and golden writer of make_test_models.py, so
the goldens mean the same thing (last-position logits, 20 greedy tokens, uncached reference).

  * tiny-qwen3:  per-head q/k RMSNorm before RoPE, no qkv bias, untied lm_head.
  * tiny-gemma2: (1 + w) RMSNorm, norms before and after attention and MLP, GeGLU (tanh),
                 embeddings scaled by sqrt(hidden), query_pre_attn_scalar 24 (not head_dim),
                 attention soft-capping 5 and final soft-capping 8 (small, so that they bite),
                 sliding window 8 on even layers.
  * tiny-gemma3: Gemma3ForCausalLM (gemma3_text): Gemma 2's layer without soft-capping plus
                 q/k norms, layers [sliding, full, sliding] (window 8) with the local RoPE base
                 10000 and a linearly scaled (factor 2) global RoPE of base 1e6.

  * tiny-phi3:   Phi3ForCausalLM: fused qkv_proj and gate_up_proj, partial rotary (8 of 16),
                 LongRoPE (original context 64, short and long factors, attention factor).
  * tiny-llama-yarn:    Llama with YaRN (factor 4, original context 32).
  * tiny-llama-dynamic: Llama with dynamic NTK (factor 2, max_position_embeddings 64); no GGUF.
  * tiny-qwen3-moe: Qwen3-MoE, 4 experts top 2 (renormalised), layer 1 dense (mlp_only_layers).
  * tiny-mixtral:   Mixtral, 4 experts top 2; GGUF `llama` with ffn_*_exps and ffn_gate_inp, and
                    model-per-expert.gguf with each expert's own ffn_{gate,up,down}.E tensors.
  * tiny-qwen2-moe: Qwen2-MoE, 4 experts top 2 (not renormalised) beside a gated shared expert,
                    q/k/v biases, layer 2 dense (decoder_sparse_step 2 with mlp_only_layers).

Arguments name the fixtures to rebuild (default: all of them), e.g. `tiny-qwen2-moe`.

Each directory but tiny-llama-dynamic also holds `model.gguf` (f32 tensors): llama.cpp's architecture name and tensor
names, Gemma's norms stored as 1 + w (as the converter does), q/k rows permuted for `llama`
only (the others are converted without it), Phi-3's projections kept fused and its LongRoPE
factors as rope_factors_short/long tensors, and the BPE tokenizer as a `gpt2` vocabulary.
"""

import sys
from pathlib import Path

import numpy as np
import safetensors.torch
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_test_models as base  # noqa: E402
from transformers import (  # noqa: E402
    LlamaConfig,
    LlamaForCausalLM,
    MixtralConfig,
    MixtralForCausalLM,
    Qwen2MoeConfig,
    Qwen2MoeForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
    Gemma2Config,
    Gemma2ForCausalLM,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    Qwen3Config,
    Qwen3ForCausalLM,
)

import gguf  # noqa: E402

COMMON = {k: v for k, v in base.COMMON.items() if k != "hidden_act"}


def gguf_name(hf: str) -> str | None:
    """llama.cpp's tensor name for a Hugging Face one (the families written here)."""
    fixed = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    if hf in fixed:
        return fixed[hf]
    parts = hf.split(".")
    if parts[:2] != ["model", "layers"]:
        return None
    layer, module, suffix = parts[2], ".".join(parts[3:-1]), parts[-1]
    names = {
        "input_layernorm": "attn_norm",
        "post_attention_layernorm": "ffn_norm",
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "self_attn.q_norm": "attn_q_norm",
        "self_attn.k_norm": "attn_k_norm",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
        "self_attn.qkv_proj": "attn_qkv",
        "mlp.gate_up_proj": "ffn_up",
        "mlp.gate": "ffn_gate_inp",
        "block_sparse_moe.gate": "ffn_gate_inp",
        "mlp.shared_expert.gate_proj": "ffn_gate_shexp",
        "mlp.shared_expert.up_proj": "ffn_up_shexp",
        "mlp.shared_expert.down_proj": "ffn_down_shexp",
        "mlp.shared_expert_gate": "ffn_gate_inp_shexp",
    }
    if module in names:
        return f"blk.{layer}.{names[module]}.{suffix}"
    return None


def gemma_norm_names(hf: str) -> str | None:
    """Gemma's four norms: llama.cpp calls the pre-MLP one ffn_norm."""
    parts = hf.split(".")
    if parts[:2] != ["model", "layers"]:
        return None
    names = {
        "post_attention_layernorm": "post_attention_norm",
        "pre_feedforward_layernorm": "ffn_norm",
        "post_feedforward_layernorm": "post_ffw_norm",
    }
    module = ".".join(parts[3:-1])
    return f"blk.{parts[2]}.{names[module]}.{parts[-1]}" if module in names else None


EXPERT_MATRICES = {"gate_proj": "ffn_gate_exps", "w1": "ffn_gate_exps", "up_proj": "ffn_up_exps",
                   "w3": "ffn_up_exps", "down_proj": "ffn_down_exps", "w2": "ffn_down_exps"}


def stack_experts(state) -> dict:
    """Every layer's expert matrices as llama.cpp's 3-D `ffn_*_exps` tensors ([E, rows, cols])."""
    groups: dict = {}
    for name, p in state.items():
        parts = name.split(".")
        if ".experts." not in name:
            continue
        layer, expert, matrix = parts[2], int(parts[5]), parts[6]
        groups.setdefault(f"blk.{layer}.{EXPERT_MATRICES[matrix]}.weight", {})[expert] = p.float()
    return {k: torch.stack([v[e] for e in sorted(v)]) for k, v in groups.items()}


# The architectures llama.cpp converts through its `LlamaModel`, which permutes q/k rows.
PERMUTED_QK = ("llama", "mistral3", "smollm3")


def llama_permute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """llama.cpp's `LlamaModel.permute`: rotate-half rows to interleaved pairs."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(out: Path, model, arch: str, tok, extra, gemma: bool, tensors=None,
               per_expert=False, file="model.gguf", language_model=None,
               split_max_tensors=0) -> None:
    """`model`'s weights as f32 tensors in `out/file`, with the metadata llama.cpp reads; with
    `per_expert`, each expert's matrices as their own tensors (`blk.N.ffn_gate.E.weight`), as
    llama.cpp wrote MoE files before it stacked them. For a wrapped checkpoint,
    `language_model` maps a stored tensor name to its decoder name (None: another tower's),
    as the converter keeps only the language model. With `split_max_tensors`, the file is
    split into parts of that many tensors (`…-00001-of-0000N.gguf`), as `llama-gguf-split`
    and the converter's `--split-max-tensors` write them."""
    cfg = model.config.get_text_config()
    tensors = tensors or {}
    w = gguf.GGUFWriter(str(out / file), arch, split_max_tensors=split_max_tensors)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_file_type(0)
    extra(w)
    vocab = tok.get_vocab()
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in base.SPECIAL_TOKENS else 1 for t in tokens])
    merges = json_merges(tok)
    w.add_token_merges(merges)
    w.add_bos_token_id(base.ENDOFTEXT_ID)
    w.add_eos_token_id(base.IM_END_ID)
    w.add_add_bos_token(False)
    w.add_chat_template(base.CHAT_TEMPLATE)
    seen = set()
    # The tensors as written on disk (transformers fuses experts in memory, not on disk).
    state = {k: v.float() for k, v in safetensors.torch.load_file(str(out / "model.safetensors")).items()}
    if language_model is not None:
        state = {language_model(k): v for k, v in state.items() if language_model(k) is not None}
    if "lm_head.weight" not in state and not cfg.tie_word_embeddings:
        raise ValueError("untied model without lm_head.weight")
    for name, stacked in stack_experts(state).items():
        data = stacked.numpy().astype(np.float32)
        if per_expert:
            for e in range(data.shape[0]):
                w.add_tensor(name.replace("_exps.weight", f".{e}.weight"), data[e])
        else:
            w.add_tensor(name, data)
    for name, p in state.items():
        if ".experts." in name:
            continue
        target = (gemma_norm_names(name) if gemma else None) or gguf_name(name)
        if target is None or target in seen:
            assert target is not None or name == "lm_head.weight", name
            continue
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        seen.add(target)
        data = p.detach().float()
        if gemma and name.endswith("norm.weight"):
            data = data + 1.0
        if arch in PERMUTED_QK and name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = cfg.num_attention_heads if "q_proj" in name else cfg.num_key_value_heads
            data = llama_permute(data, heads)
        w.add_tensor(target, data.numpy().astype(np.float32))
    for t, values in tensors.items():
        w.add_tensor(t, np.asarray(values, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def json_merges(tok) -> list[str]:
    import json

    model = json.loads(tok.to_str())["model"]
    return [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]


def build(name, config, cls, seed, tok, arch, extra, gemma=False, check=None, gguf_tensors=None):
    out = base.fresh_dir(name)
    torch.manual_seed(base.SEED)
    model = cls(config)
    base.randomize(model, base.COMMON["initializer_range"], seed)
    if gemma:
        # Gemma norms multiply by (1 + w): centre the random w on 0 as trained ones are.
        with torch.no_grad():
            for n, p in model.named_parameters():
                if "norm" in n:
                    p.sub_(1.0)
    model.save_pretrained(out, safe_serialization=True)
    base.save_tokenizer(tok, out)
    base.save_generation_config(out, base.IM_END_ID)
    base.write_golden(name, out, tok, "float32")
    if arch is not None:
        write_gguf(out, base.reload(out), arch, tok, extra, gemma, gguf_tensors)
    if check:
        check(out, tok)


@torch.no_grad()
def sensitivity(out: Path, tok, **changes) -> float:
    """How far the longest prompt's last logits move when the config is changed so: a golden
    that a feature does not move cannot test it."""
    model = base.reload(out)
    ids = torch.tensor([tok.encode(base.PROMPTS[-1], add_special_tokens=False).ids])
    want = model(ids).logits[0, -1]
    for k, v in changes.items():
        setattr(model.config, k, v)
        for layer in model.model.layers:
            attn = layer.self_attn
            if hasattr(attn, k):
                setattr(attn, k, v)
    got = model(ids).logits[0, -1]
    return float((want - got).abs().max())


def make_qwen3(tok) -> None:
    cfg = Qwen3Config(**COMMON, num_hidden_layers=2, head_dim=16, tie_word_embeddings=False,
                      attention_bias=False, hidden_act="silu")
    build("tiny-qwen3", cfg, Qwen3ForCausalLM, base.SEED + 4, tok, "qwen3",
          lambda w: w.add_rope_freq_base(cfg.rope_parameters["rope_theta"]))


def gemma_common():
    return dict(COMMON, head_dim=16, hidden_activation="gelu_pytorch_tanh", sliding_window=8,
                query_pre_attn_scalar=24, tie_word_embeddings=True)


def make_gemma2(tok) -> None:
    cfg = Gemma2Config(**gemma_common(), num_hidden_layers=3, attn_logit_softcapping=5.0,
                       final_logit_softcapping=8.0)

    def extra(w):
        w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
        w.add_sliding_window(cfg.sliding_window)
        w.add_float32("gemma2.attn_logit_softcapping", cfg.attn_logit_softcapping)
        w.add_float32("gemma2.final_logit_softcapping", cfg.final_logit_softcapping)
        w.add_float32("gemma2.attention.scale", cfg.query_pre_attn_scalar ** -0.5)

    def check(out, tok):
        for k in ("attn_logit_softcapping", "final_logit_softcapping"):
            print(f"  tiny-gemma2 without {k}: max |dlogit| {sensitivity(out, tok, **{k: None}):.3f}")

    build("tiny-gemma2", cfg, Gemma2ForCausalLM, base.SEED + 7, tok, "gemma2", extra, True, check)


def gemma3_text():
    """tiny-gemma3's language model config, and its GGUF keys (`extra`) as the converter
    writes them."""
    pattern = 2  # llama.cpp's swa pattern: layer i slides unless (i + 1) % pattern == 0
    layers = 3
    cfg = Gemma3TextConfig(
        **gemma_common(),
        num_hidden_layers=layers,
        layer_types=["full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
                     for i in range(layers)],
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
        },
        attn_logit_softcapping=None,
        final_logit_softcapping=None,
    )

    def extra(w):
        w.add_rope_freq_base(1e6)
        w.add_float32("gemma3.rope.freq_base_swa", 10000.0)
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(2.0)
        w.add_sliding_window(cfg.sliding_window)
        w.add_sliding_window_pattern(pattern)
        w.add_float32("gemma3.attention.scale", cfg.query_pre_attn_scalar ** -0.5)

    return cfg, extra


def make_gemma3(tok) -> None:
    cfg, extra = gemma3_text()
    build("tiny-gemma3", cfg, Gemma3ForCausalLM, base.SEED + 6, tok, "gemma3", extra, True)


def make_phi3(tok) -> None:
    # Rotary dims 16 * 0.5 = 8: four frequencies, four factors each. The original context 64
    # puts the longest prompt (115 tokens) past it and every other prompt (with its 20 greedy
    # tokens) inside it, so no golden path crosses from short to long factors.
    short, long_ = [1.0, 1.3, 2.1, 3.0], [1.2, 2.5, 6.0, 11.0]
    cfg = Phi3Config(**COMMON, num_hidden_layers=2, hidden_act="silu", tie_word_embeddings=False,
                     original_max_position_embeddings=64,
                     rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                                      "partial_rotary_factor": 0.5, "short_factor": short,
                                      "long_factor": long_})
    factor = 256 / 64
    attn = (1 + np.log(factor) / np.log(64)) ** 0.5

    def extra(w):
        w.add_rope_freq_base(10000.0)
        w.add_rope_dimension_count(8)
        w.add_float32("phi3.rope.scaling.attn_factor", float(attn))
        w.add_uint32("phi3.rope.scaling.original_context_length", 64)

    build("tiny-phi3", cfg, Phi3ForCausalLM, base.SEED + 8, tok, "phi3", extra,
          gguf_tensors={"rope_factors_short.weight": short, "rope_factors_long.weight": long_})


def make_llama_yarn(tok) -> None:
    # Original context 32, factor 4: with head_dim 16 and base 1e4 YaRN's blend runs over
    # frequencies 0..2, so one is kept, one blended and six interpolated.
    rope = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
            "original_max_position_embeddings": 32, "beta_fast": 32.0, "beta_slow": 1.0}
    cfg = LlamaConfig(**dict(COMMON, hidden_act="silu"), num_hidden_layers=2, head_dim=16,
                      tie_word_embeddings=False, rope_parameters=rope)
    mscale = 0.1 * np.log(4.0) + 1.0

    def extra(w):
        w.add_rope_freq_base(10000.0)
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(4.0)
        w.add_rope_scaling_orig_ctx_len(32)
        w.add_float32("llama.rope.scaling.attn_factor", float(mscale))

    build("tiny-llama-yarn", cfg, LlamaForCausalLM, base.SEED + 9, tok, "llama", extra)


@torch.no_grad()
def greedy_with_cache(model, ids, n):
    """Greedy decoding with transformers' KV cache, and the smallest top-1/top-2 gap: the
    reference for dynamic NTK, whose frequencies change with the length, so that a cache
    (theirs, Tessera's) keeps each key's rotation while a full recomputation would not.
    (transformers' dynamic RoPE also remembers the longest length it has seen, so the
    cross-check that runs after this on the same model warns for the longest prompt.)"""
    out = model(torch.tensor([ids]), use_cache=True)
    past, new, gap = out.past_key_values, [], float("inf")
    for _ in range(n):
        logits = out.logits[0, -1]
        top = torch.topk(logits, 2).values
        gap = min(gap, float(top[0] - top[1]))
        new.append(int(torch.argmax(logits)))
        out = model(torch.tensor([[new[-1]]]), past_key_values=past, use_cache=True)
        past = out.past_key_values
    return new, gap


def make_llama_dynamic(tok) -> None:
    # Dynamic NTK past max_position_embeddings 64: the longest prompt (115 tokens) grows the
    # base, the others stay within it. Greedy goldens are the cached path (see
    # greedy_with_cache); no GGUF (llama.cpp has no dynamic NTK).
    rope = {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}
    cfg = LlamaConfig(**dict(COMMON, hidden_act="silu", max_position_embeddings=64), num_hidden_layers=2, head_dim=16, tie_word_embeddings=False,
                      rope_parameters=rope)
    uncached = base.greedy
    base.greedy = greedy_with_cache
    try:
        # The first seeds' weights give near-ties on a greedy path; the next one is clear.
        build("tiny-llama-dynamic", cfg, LlamaForCausalLM, base.SEED + 16, tok, None, None)
    finally:
        base.greedy = uncached


def make_qwen3_moe(tok) -> None:
    # 3 layers: sparse, dense (mlp_only_layers), sparse; 4 experts of width 32, top 2,
    # renormalised.
    cfg = Qwen3MoeConfig(**dict(COMMON, hidden_act="silu"), num_hidden_layers=3, head_dim=16,
                         num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                         norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[1],
                         tie_word_embeddings=False)

    def extra(w):
        w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
        w.add_expert_count(4)
        w.add_expert_used_count(2)
        w.add_expert_feed_forward_length(32)

    build("tiny-qwen3-moe", cfg, Qwen3MoeForCausalLM, base.SEED + 20, tok, "qwen3moe", extra)


def make_mixtral(tok) -> None:
    # 2 layers of 4 experts (width 64), top 2; GGUF as llama.cpp writes Mixtral: `llama` with
    # expert tensors, q/k permuted.
    cfg = MixtralConfig(**dict(COMMON, hidden_act="silu", intermediate_size=64),
                        num_hidden_layers=2, head_dim=16, num_local_experts=4,
                        num_experts_per_tok=2, sliding_window=None, tie_word_embeddings=False)

    def extra(w):
        w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
        w.add_expert_count(4)
        w.add_expert_used_count(2)

    build("tiny-mixtral", cfg, MixtralForCausalLM, base.SEED + 21, tok, "llama", extra)
    write_mixtral_per_expert(tok, extra)


def write_mixtral_per_expert(tok, extra) -> None:
    """tiny-mixtral as the Mixtral GGUF files made before llama.cpp stacked experts."""
    out = base.FIXTURES / "tiny-mixtral"
    write_gguf(out, base.reload(out), "llama", tok, extra, False, per_expert=True,
               file="model-per-expert.gguf")


def make_qwen2_moe(tok) -> None:
    # 3 layers: sparse, sparse, dense (decoder_sparse_step 1 with mlp_only_layers [2]); 4 experts
    # of width 32, top 2, not renormalised (Qwen2-MoE's default); a shared expert of width 48
    # whose sigmoid gate scales it per token; q/k/v biases.
    cfg = Qwen2MoeConfig(**dict(COMMON, hidden_act="silu"), num_hidden_layers=3,
                         num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                         shared_expert_intermediate_size=48, norm_topk_prob=False,
                         decoder_sparse_step=1, mlp_only_layers=[2], qkv_bias=True,
                         use_sliding_window=False, tie_word_embeddings=False)

    def extra(w):
        w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
        w.add_expert_count(4)
        w.add_expert_used_count(2)
        w.add_expert_feed_forward_length(32)
        w.add_expert_shared_feed_forward_length(48)

    def check(out, tok):
        # Without the shared expert the goldens must move, or they would not test it.
        model = base.reload(out)
        ids = torch.tensor([tok.encode(base.PROMPTS[-1], add_special_tokens=False).ids])
        with torch.no_grad():
            want = model(ids).logits[0, -1]
            for layer in model.model.layers[:2]:
                layer.mlp.shared_expert_gate.weight.fill_(-1e4)
            got = model(ids).logits[0, -1]
        moved = float((want - got).abs().max())
        print(f"tiny-qwen2-moe: dropping the shared expert moves the logits by {moved:.2f}")
        assert moved > 0.5, moved

    build("tiny-qwen2-moe", cfg, Qwen2MoeForCausalLM, base.SEED + 22, tok, "qwen2moe", extra,
          check=check)


FIXTURES = {
    "tiny-qwen3": make_qwen3,
    "tiny-gemma2": make_gemma2,
    "tiny-gemma3": make_gemma3,
    "tiny-phi3": make_phi3,
    "tiny-llama-yarn": make_llama_yarn,
    "tiny-llama-dynamic": make_llama_dynamic,
    "tiny-qwen3-moe": make_qwen3_moe,
    "tiny-mixtral": make_mixtral,
    "tiny-qwen2-moe": make_qwen2_moe,
}


def run(fixtures: dict) -> None:
    """Builds the fixtures the command line names (default: all of `fixtures`), seeded and
    single-threaded so that a rerun writes the same bytes."""
    torch.manual_seed(base.SEED)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    tok = base.build_tokenizer()
    wanted = sys.argv[1:] or list(fixtures)
    unknown = [n for n in wanted if n not in fixtures]
    if unknown:
        raise SystemExit(f"unknown fixtures {unknown}; known: {', '.join(fixtures)}")
    for name in wanted:
        fixtures[name](tok)
    print("done")


def main() -> None:
    run(FIXTURES)


if __name__ == "__main__":
    main()
