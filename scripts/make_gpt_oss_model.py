#!/usr/bin/env python3
"""Build fixtures/tiny-gpt-oss: a tiny random GptOssForCausalLM (transformers' own class), its
goldens, and the GGUF file llama.cpp's converter writes of it; and fixtures/tiny-gpt-oss-mxfp4,
the same model with its experts in MXFP4 as OpenAI ships gpt-oss (see make_mxfp4), with its GGUF
(MXFP4 experts).

Dev-only, with make_test_models.py's requirements:

    HF_HUB_OFFLINE=1 /work/pyenv/bin/python scripts/make_gpt_oss_model.py [--no-gguf]

The GGUF step runs llama.cpp's own convert_hf_to_gguf.py from LLAMA_CPP_DIR (default: the
llama.cpp vendored in the llama-cpp-python 0.3.36 sdist unpacked under /tmp/lcp), with that tree's
gguf-py where it is complete and the installed `gguf` package (0.19.0) otherwise; without the tree
the GGUF is skipped with a message. `--no-gguf` skips it.

tiny-gpt-oss: 4 layers [sliding 8, full, sliding 8, full], 4 q heads / 2 kv heads of 16, q/k/v/o
biases, one learned attention **sink** logit per head, 4 experts top 2 (router with bias, softmax
over the chosen two), experts with biases and gpt-oss's **clamped SwiGLU** (gate and up
interleaved in `gate_up_proj`; gate clamped above at `swiglu_limit` 7, up to [-7, 7],
`(up + 1) * gate * sigmoid(1.702 * gate)`), **YaRN** as gpt-oss configures it (theta 150000,
`truncate: false`, factor 8 over an original context of 32 = max_position_embeddings 256 / 8: the
39- and 115-token prompts run past it), untied lm_head, f32, plain (not MXFP4) expert weights.

Weights are random but chosen so that every gpt-oss feature moves the goldens: sinks N(0, 1),
gate_up weights std GATE_UP_STD (so that the clamp bites on the golden prompts), biases N(0, 0.1).
The script measures, and asserts, how far the golden logits move when each feature is dropped.
"""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_test_models as base  # noqa: E402
from transformers import AutoConfig, GptOssConfig, GptOssForCausalLM  # noqa: E402

NAME = "tiny-gpt-oss"
SEED = base.SEED + 30
# Std of the expert gate_up weights: with hidden 64 and normed inputs, 0.5 puts a few percent of
# the gate/up activations past the limit 7 (the other fixtures' 0.15 would almost never reach it).
GATE_UP_STD = 0.5
SINK_STD = 1.0
LIMIT = 7.0
LLAMA_CPP_DIR = Path(os.environ.get("LLAMA_CPP_DIR", "/tmp/lcp/llama_cpp_python-0.3.36/vendor/llama.cpp"))

LAYER_TYPES = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]
ROPE = {
    "rope_type": "yarn",
    "rope_theta": 150000.0,
    "factor": 8.0,
    "original_max_position_embeddings": 32,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    # As gpt-oss's own config (and GptOssConfig's default): the correction range is not rounded
    # to whole dimensions, so the blended frequency gets a fractional ramp.
    "truncate": False,
}


def config() -> GptOssConfig:
    return GptOssConfig(
        vocab_size=base.VOCAB_SIZE,
        hidden_size=64,
        intermediate_size=32,
        num_hidden_layers=len(LAYER_TYPES),
        layer_types=LAYER_TYPES,
        sliding_window=8,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_local_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        rope_parameters=dict(ROPE),
        attention_bias=True,
        attention_dropout=0.0,
        swiglu_limit=LIMIT,
        swiglu_alpha=1.702,
        tie_word_embeddings=False,
        initializer_range=base.COMMON["initializer_range"],
        bos_token_id=base.ENDOFTEXT_ID,
        eos_token_id=base.IM_END_ID,
        pad_token_id=base.ENDOFTEXT_ID,
    )


def randomize(model: torch.nn.Module, seed: int) -> None:
    """base.randomize's scheme (sorted names, one generator) with gpt-oss's own parameters: the
    sinks N(0, SINK_STD), gate_up weights N(0, GATE_UP_STD), every bias (`*.bias`,
    `*_proj_bias`) N(0, 0.1), other matrices N(0, 0.15)."""
    gen = torch.Generator().manual_seed(seed)
    std = base.COMMON["initializer_range"]
    with torch.no_grad():
        for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            if name == "model.norm.weight":
                p.copy_(torch.rand(p.shape, generator=gen) * 2.0 + 2.0)
            elif "norm" in name:
                p.copy_(torch.rand(p.shape, generator=gen) + 0.5)
            elif name.endswith("sinks"):
                p.copy_(torch.randn(p.shape, generator=gen) * SINK_STD)
            elif name.endswith((".bias", "_bias")):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
            elif name.endswith("gate_up_proj"):
                p.copy_(torch.randn(p.shape, generator=gen) * GATE_UP_STD)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * std)


def reload(out: Path, cfg=None, experts="eager") -> torch.nn.Module:
    """The fixture as transformers loads it, eager attention and eager experts (the reference);
    `cfg` replaces config.json's values (for the sensitivity checks)."""
    kwargs = {"config": cfg} if cfg is not None else {}
    model = GptOssForCausalLM.from_pretrained(out, dtype=torch.float32, attn_implementation="eager",
                                              experts_implementation=experts, **kwargs)
    return model.float().eval()


def write_golden(name: str, out: Path, tok, loader) -> None:
    """base.write_golden (f32) with the model loaded by `loader` instead of base.reload."""
    saved = base.reload
    base.reload = loader
    try:
        base.write_golden(name, out, tok, "float32")
    finally:
        base.reload = saved


def prompt_ids(tok) -> list[list[int]]:
    return [tok.encode(t, add_special_tokens=False).ids for t in base.PROMPTS]


@torch.no_grad()
def last_logits(model, prompts) -> list[torch.Tensor]:
    return [model(torch.tensor([ids])).logits[0, -1] for ids in prompts]


@torch.no_grad()
def clamp_hits(out: Path, prompts) -> dict:
    """How many of the routed experts' gate/up activations the clamp changes on the prompts."""
    model = reload(out)
    counts = {"values": 0, "gate>limit": 0, "up>limit": 0, "up<-limit": 0}
    experts = type(model.model.layers[0].mlp.experts)
    original = experts._apply_gate

    def counting(self, gate_up):
        gate, up = gate_up[..., ::2], gate_up[..., 1::2]
        counts["values"] += gate.numel()
        counts["gate>limit"] += int((gate > self.limit).sum())
        counts["up>limit"] += int((up > self.limit).sum())
        counts["up<-limit"] += int((up < -self.limit).sum())
        return original(self, gate_up)

    experts._apply_gate = counting
    try:
        last_logits(model, prompts)
    finally:
        experts._apply_gate = original
    return counts


@torch.no_grad()
def sensitivities(out: Path, prompts) -> dict:
    """max |dlogit| over the golden prompts' last logits when one gpt-oss feature is changed."""
    want = last_logits(reload(out), prompts)

    def moved(model) -> float:
        got = last_logits(model, prompts)
        return max(float((w - g).abs().max()) for w, g in zip(want, got))

    def with_config(**changes):
        cfg = AutoConfig.from_pretrained(out)
        for k, v in changes.items():
            setattr(cfg, k, v)
        return reload(out, cfg)

    def with_rope(**changes):
        return with_config(rope_parameters=dict(ROPE, **changes))

    res = {}
    res["no swiglu clamp"] = moved(with_config(swiglu_limit=float("inf")))
    model = reload(out)
    for layer in model.model.layers:
        layer.self_attn.sinks.fill_(-float("inf"))
    res["no sinks"] = moved(model)
    res["no sliding window"] = moved(with_config(layer_types=["full_attention"] * len(LAYER_TYPES)))
    res["window 7"] = moved(with_config(sliding_window=7))
    res["window 9"] = moved(with_config(sliding_window=9))
    res["default rope (no yarn)"] = moved(with_rope(rope_type="default"))
    # YaRN's frequencies without its attention factor (0.1 ln 8 + 1 on cos and sin).
    model = reload(out)
    model.model.rotary_emb.attention_scaling = 1.0
    res["yarn without attention factor"] = moved(model)
    # What llama.cpp's ggml YaRN computes (it always rounds the correction range).
    res["yarn truncate=true"] = moved(with_rope(truncate=True))
    # A loader that splits gate_up_proj in halves instead of de-interleaving it.
    model = reload(out)
    experts = type(model.model.layers[0].mlp.experts)
    original = experts._apply_gate

    def halves(self, gate_up):
        gate, up = gate_up.chunk(2, dim=-1)
        return original(self, torch.stack((gate, up), dim=-1).flatten(-2))

    experts._apply_gate = halves
    try:
        res["gate/up as halves"] = moved(model)
    finally:
        experts._apply_gate = original
    return res


def check_experts_implementations(out: Path, prompts) -> float:
    """transformers' default experts path (grouped_mm where available) agrees with eager."""
    a = last_logits(reload(out), prompts)
    b = last_logits(reload(out, experts=None), prompts)
    return max(float((x - y).abs().max()) for x, y in zip(a, b))


def write_gguf(out: Path) -> str:
    """Runs llama.cpp's converter on the fixture (f32), in a subprocess. Two shims, neither of
    which changes what it writes: its BPE pre-tokenizer check only knows published tokenizers, so
    ours is reported as `gpt-2` (as make_family_models.py's writer names it); and where the tree's
    gguf-py is incomplete (the llama-cpp-python sdist keeps only its constants.py) the installed
    gguf package is used, which may predate `gguf.LazyChunkedTensor` (only tested with
    isinstance, and no tensor here is one)."""
    script = LLAMA_CPP_DIR / "convert_hf_to_gguf.py"
    if not script.is_file():
        return f"skipped: {script} not found"
    local_gguf = LLAMA_CPP_DIR / "gguf-py"
    path = [str(LLAMA_CPP_DIR)]
    if (local_gguf / "gguf" / "__init__.py").is_file():
        path.insert(0, str(local_gguf))
    wrapper = (
        "import sys, runpy\n"
        f"sys.path[:0] = {path!r}\n"
        "import gguf\n"
        "if not hasattr(gguf, 'LazyChunkedTensor'):\n"
        "    gguf.LazyChunkedTensor = type('LazyChunkedTensor', (), {})\n"
        "import conversion.base as cb\n"
        "cb.TextModel.get_vocab_base_pre = lambda self, tokenizer: 'gpt-2'\n"
        f"sys.argv = ['convert_hf_to_gguf.py', {str(out)!r}, '--outtype', 'f32',\n"
        f"            '--outfile', {str(out / 'model.gguf')!r}]\n"
        f"runpy.run_path({str(script)!r}, run_name='__main__')\n"
    )
    env = dict(os.environ, HF_HUB_OFFLINE="1", NO_LOCAL_GGUF="1")
    proc = subprocess.run([sys.executable, "-c", wrapper], env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        (out / "model.gguf").unlink(missing_ok=True)
        return "failed:\n" + proc.stderr[-3000:]
    return "written"


def check_gguf(out: Path) -> None:
    """The converter's tensors are the checkpoint's, renamed and re-laid-out as llama.cpp reads
    gpt-oss: experts split into gate (even columns of gate_up_proj) and up (odd columns), both
    transposed to [E, inter, hidden], down_proj transposed to [E, hidden, inter], the sinks as
    `attn_sinks.weight`, q/k not permuted (gpt-oss is a NeoX-RoPE architecture)."""
    import gguf
    import safetensors.torch

    st = safetensors.torch.load_file(str(out / "model.safetensors"))
    got = {t.name: torch.from_numpy(t.data.copy()) for t in gguf.GGUFReader(str(out / "model.gguf")).tensors}
    want = {"token_embd.weight": st["model.embed_tokens.weight"],
            "output_norm.weight": st["model.norm.weight"], "output.weight": st["lm_head.weight"]}
    for i in range(len(LAYER_TYPES)):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        gate_up, gate_up_bias = st[p + "mlp.experts.gate_up_proj"], st[p + "mlp.experts.gate_up_proj_bias"]
        want.update({
            b + "attn_norm.weight": st[p + "input_layernorm.weight"],
            b + "post_attention_norm.weight": st[p + "post_attention_layernorm.weight"],
            b + "attn_sinks.weight": st[p + "self_attn.sinks"],
            b + "ffn_gate_inp.weight": st[p + "mlp.router.weight"],
            b + "ffn_gate_inp.bias": st[p + "mlp.router.bias"],
            b + "ffn_gate_exps.weight": gate_up[..., ::2].transpose(1, 2),
            b + "ffn_up_exps.weight": gate_up[..., 1::2].transpose(1, 2),
            b + "ffn_gate_exps.bias": gate_up_bias[..., ::2],
            b + "ffn_up_exps.bias": gate_up_bias[..., 1::2],
            b + "ffn_down_exps.weight": st[p + "mlp.experts.down_proj"].transpose(1, 2),
            b + "ffn_down_exps.bias": st[p + "mlp.experts.down_proj_bias"],
        })
        for hf, g in (("q_proj", "attn_q"), ("k_proj", "attn_k"), ("v_proj", "attn_v"), ("o_proj", "attn_output")):
            for kind in ("weight", "bias"):
                want[f"{b}{g}.{kind}"] = st[f"{p}self_attn.{hf}.{kind}"]
    assert sorted(got) == sorted(want), sorted(set(got) ^ set(want))
    for name, w in want.items():
        assert got[name].shape == w.shape and torch.equal(got[name], w.float()), name


# E2M1's values (the MX spec's FP4), index = sign · 8 + magnitude code.
FP4_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def mxfp4_quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`w` ([..., rows, cols], cols a multiple of 32) as transformers' MXFP4 tensors: `blocks`
    [..., rows, cols / 32, 16] (value 2j in byte j's low nibble, 2j + 1 in its high one) and
    `scales` [..., rows, cols / 32] (E8M0: 2^(s - 127)), each block's scale putting its largest
    magnitude at or below 6, every value rounded to the nearest E2M1 value; and the values they
    stand for, in f32."""
    *outer, cols = w.shape
    groups = w.reshape(*outer, cols // 32, 32).double()
    amax = groups.abs().amax(-1, keepdim=True)
    exp = torch.where(amax > 0, torch.ceil(torch.log2(amax / 6.0)), torch.zeros_like(amax))
    table = torch.tensor(FP4_VALUES, dtype=torch.float64)
    scaled = groups / torch.exp2(exp)
    idx = (scaled.unsqueeze(-1) - table).abs().argmin(-1).to(torch.uint8)
    blocks = idx[..., 0::2] | (idx[..., 1::2] << 4)
    scales = (exp.squeeze(-1) + 127).to(torch.uint8)
    values = (table[idx.long()] * torch.exp2(exp)).float().reshape(*outer, cols)
    return blocks, scales, values


def check_gguf_mxfp4(out: Path, model) -> None:
    """The converter kept the experts in MXFP4 (GGUF type 39), with the checkpoint's values."""
    import gguf
    from gguf.quants import dequantize

    tensors = {t.name: t for t in gguf.GGUFReader(str(out / "model.gguf")).tensors}
    sd = model.state_dict()
    for i in range(len(LAYER_TYPES)):
        p, b = f"model.layers.{i}.mlp.experts.", f"blk.{i}."
        gate_up, down = sd[p + "gate_up_proj"], sd[p + "down_proj"]
        want = {"ffn_gate_exps.weight": gate_up[..., ::2].transpose(1, 2),
                "ffn_up_exps.weight": gate_up[..., 1::2].transpose(1, 2),
                "ffn_down_exps.weight": down.transpose(1, 2)}
        for name, w in want.items():
            t = tensors[b + name]
            assert t.tensor_type == gguf.GGMLQuantizationType.MXFP4, (name, t.tensor_type)
            got = torch.from_numpy(dequantize(t.data, t.tensor_type).copy()).reshape(w.shape)
            assert torch.equal(got, w.float()), name


def make_mxfp4(out_f32: Path, tok, prompts, gguf: bool) -> None:
    """tiny-gpt-oss-mxfp4: tiny-gpt-oss with its experts in MXFP4 as gpt-oss ships them
    (`quantization_config: mxfp4`, `*_blocks`/`*_scales` uint8 tensors, the rest f32). Its
    goldens are transformers' on that checkpoint (dequantized, f32), which must equal the f32
    model holding the same values: a check of the layout written here."""
    import safetensors.torch
    from transformers import Mxfp4Config

    name = NAME + "-mxfp4"
    out = base.fresh_dir(name)
    model = reload(out_f32)
    tensors = {}
    for k, v in model.state_dict().items():
        if k.endswith(("mlp.experts.gate_up_proj", "mlp.experts.down_proj")):
            # Stored [experts, in, out]; quantized along `in`, per output row.
            blocks, scales, values = mxfp4_quantize(v.transpose(1, 2).contiguous())
            tensors[k + "_blocks"], tensors[k + "_scales"] = blocks, scales
            with torch.no_grad():
                dict(model.named_parameters())[k].copy_(values.transpose(1, 2))
        else:
            tensors[k] = v.contiguous()
    safetensors.torch.save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((out_f32 / "config.json").read_text())
    cfg["quantization_config"] = {
        "quant_method": "mxfp4",
        "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                   "model.embed_tokens", "lm_head"],
    }
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    base.save_tokenizer(tok, out)
    base.save_generation_config(out, base.IM_END_ID)

    def reload_mxfp4(path: Path) -> torch.nn.Module:
        m = GptOssForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager",
                                              quantization_config=Mxfp4Config(dequantize=True))
        return m.float().eval()

    write_golden(name, out, tok, reload_mxfp4)
    a = last_logits(reload_mxfp4(out), prompts)
    b = last_logits(model, prompts)
    diff = max(float((x - y).abs().max()) for x, y in zip(a, b))
    print(f"  {name}: transformers on the MXFP4 checkpoint vs f32 with its values: max |dlogit| {diff:.2e}")
    assert diff < 1e-5, diff
    moved = max(float((x - y).abs().max()) for x, y in zip(a, last_logits(reload(out_f32), prompts)))
    print(f"  {name}: vs the unquantized tiny-gpt-oss: max |dlogit| {moved:.3f}")
    assert moved > 0.01, moved
    if gguf:
        status = write_gguf(out)
        if status == "written":
            check_gguf_mxfp4(out, model)
        print(f"  {name}: model.gguf {status}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--no-gguf", action="store_true")
    args = parser.parse_args()

    torch.manual_seed(base.SEED)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    tok = base.build_tokenizer()
    prompts = prompt_ids(tok)

    out = base.fresh_dir(NAME)
    torch.manual_seed(base.SEED)
    model = GptOssForCausalLM(config())
    randomize(model, SEED)
    model.save_pretrained(out, safe_serialization=True)
    base.save_tokenizer(tok, out)
    base.save_generation_config(out, base.IM_END_ID)

    write_golden(NAME, out, tok, reload)

    # The long prompts run past YaRN's original context.
    assert max(map(len, prompts)) > ROPE["original_max_position_embeddings"]

    hits = clamp_hits(out, prompts)
    print(f"  {NAME}: clamp hits on the golden prompts: {hits}")
    assert hits["gate>limit"] > 0 and hits["up>limit"] > 0 and hits["up<-limit"] > 0, hits

    diff = check_experts_implementations(out, prompts)
    print(f"  {NAME}: default experts implementation vs eager: max |dlogit| {diff:.2e}")
    assert diff < 1e-4, diff

    sens = sensitivities(out, prompts)
    for k, v in sens.items():
        print(f"  {NAME}: {k}: max |dlogit| {v:.3f}")
    for k in ("no swiglu clamp", "no sinks", "no sliding window", "window 7", "window 9",
              "default rope (no yarn)", "yarn without attention factor", "gate/up as halves"):
        assert sens[k] > 0.1, (k, sens[k])

    if not args.no_gguf:
        status = write_gguf(out)
        if status == "written":
            check_gguf(out)
        print(f"  {NAME}: model.gguf {status}")
    make_mxfp4(out, tok, prompts, not args.no_gguf)
    print("done")


if __name__ == "__main__":
    main()
