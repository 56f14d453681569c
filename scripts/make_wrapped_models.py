#!/usr/bin/env python3
"""Build the tiny fixtures of checkpoints that wrap a language model, and of SmolLM3: random
weights, goldens from transformers (f32), and the GGUF file llama.cpp's converter writes of each.

Dev-only, with make_test_models.py's requirements:

    HF_HUB_OFFLINE=1 /work/pyenv/bin/python scripts/make_wrapped_models.py [NAME …]

  * tiny-gemma3-vision: Gemma3ForConditionalGeneration (a tiny SigLIP tower and projector beside
      tiny-gemma3's language model), saved as transformers 5 saves it (`model.language_model.…`,
      `model.vision_tower.…`), its `text_config` written as a diff against Gemma3TextConfig's
      defaults. GGUF `gemma3` of the language model alone.
  * tiny-mistral3: Mistral3ForConditionalGeneration (a tiny Pixtral tower), its tensors renamed
      to the layout transformers used before 4.52 (`language_model.model.…`,
      `language_model.lm_head.…`, `vision_tower.…`), which transformers still loads. GGUF
      `mistral3` (q/k rows permuted, as llama.cpp's `LlamaModel` converts it).
  * tiny-smollm3: SmolLM3ForCausalLM, four layers, the fourth without RoPE (the default
      `no_rope_layer_interval` 4, which llama.cpp's `smollm3` assumes). GGUF `smollm3`.
  * tiny-qwen3-split: tiny-qwen3's GGUF split into parts of 8 tensors, in tiny-qwen3/split/
      (`model-0000N-of-00004.gguf`, as gguf-py's writer splits).

The goldens are the wrapper's own forward on text input (no image), which is what serving its
language model must reproduce.
"""

import json
import sys
from pathlib import Path

import safetensors.torch
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_family_models as fam  # noqa: E402
import make_test_models as base  # noqa: E402
from transformers import (  # noqa: E402
    Gemma3Config,
    Gemma3ForConditionalGeneration,
    Gemma3TextConfig,
    Mistral3Config,
    Mistral3ForConditionalGeneration,
    MistralConfig,
    PixtralVisionConfig,
    SiglipVisionConfig,
    SmolLM3Config,
    SmolLM3ForCausalLM,
)


def decoder_name(name: str) -> str | None:
    """The *ForCausalLM name of a wrapped checkpoint's tensor (None: another tower's)."""
    for prefix, to in (("language_model.model.", "model."), ("model.language_model.", "model."),
                       ("language_model.lm_head.", "lm_head.")):
        if name.startswith(prefix):
            return to + name[len(prefix):]
    return name if name.startswith("lm_head.") else None


def save_wrapped(name: str, model, tok, old_layout: bool) -> Path:
    out = base.fresh_dir(name)
    model.save_pretrained(out, safe_serialization=True)
    if old_layout:
        path = out / "model.safetensors"
        state = safetensors.torch.load_file(str(path))
        renamed = {}
        for k, v in state.items():
            for new, old in (("model.language_model.", "language_model.model."),
                             ("lm_head.", "language_model.lm_head."),
                             ("model.vision_tower.", "vision_tower."),
                             ("model.multi_modal_projector.", "multi_modal_projector.")):
                if k.startswith(new):
                    k = old + k[len(new):]
                    break
            renamed[k] = v.contiguous()
        safetensors.torch.save_file(renamed, str(path), metadata={"format": "pt"})
    base.save_tokenizer(tok, out)
    base.save_generation_config(out, base.IM_END_ID)
    return out


def reload_wrapped(cls):
    def reload(out: Path):
        model = cls.from_pretrained(out, dtype=torch.float32, attn_implementation="eager")
        return model.float().eval()
    return reload


@torch.no_grad()
def check_same_logits(out: Path, model) -> None:
    """The saved (and renamed) files reload to the model the goldens came from."""
    golden = json.loads((out / "golden.json").read_text())
    ids = torch.tensor([golden["prompts"][-1]["prompt_ids"]])
    got = model(ids).logits[0, -1]
    want = torch.tensor(golden["prompts"][-1]["last_logits"])
    assert float((got - want).abs().max()) < 1e-5, out


def golden_with(out: Path, name: str, tok, reload) -> None:
    saved = base.reload
    base.reload = reload
    try:
        base.write_golden(name, out, tok, "float32")
    finally:
        base.reload = saved
    check_same_logits(out, reload(out))


def make_gemma3_vision(tok) -> None:
    text, extra = fam.gemma3_text()
    vision = SiglipVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                num_attention_heads=2, image_size=28, patch_size=14)
    cfg = Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4,
                       boi_token_index=3, eoi_token_index=4, image_token_index=5)
    torch.manual_seed(base.SEED)
    model = Gemma3ForConditionalGeneration(cfg)
    base.randomize(model, base.COMMON["initializer_range"], base.SEED + 11)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "language_model" in n and "norm" in n:
                p.sub_(1.0)
    out = save_wrapped("tiny-gemma3-vision", model, tok, old_layout=False)
    reload = reload_wrapped(Gemma3ForConditionalGeneration)
    golden_with(out, "tiny-gemma3-vision", tok, reload)

    fam.write_gguf(out, reload(out), "gemma3", tok, extra, True, language_model=decoder_name)


def make_mistral3(tok) -> None:
    text = MistralConfig(**base.COMMON, num_hidden_layers=2, head_dim=16, sliding_window=None,
                         tie_word_embeddings=False)
    vision = PixtralVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                 num_attention_heads=2, head_dim=8, image_size=28, patch_size=14)
    cfg = Mistral3Config(text_config=text, vision_config=vision, image_token_index=5,
                         spatial_merge_size=2, projector_hidden_act="gelu",
                         tie_word_embeddings=False)
    torch.manual_seed(base.SEED)
    model = Mistral3ForConditionalGeneration(cfg)
    base.randomize(model, base.COMMON["initializer_range"], base.SEED + 17)
    out = save_wrapped("tiny-mistral3", model, tok, old_layout=True)
    reload = reload_wrapped(Mistral3ForConditionalGeneration)
    golden_with(out, "tiny-mistral3", tok, reload)

    def extra(w):
        w.add_rope_freq_base(text.rope_parameters["rope_theta"])

    fam.write_gguf(out, reload(out), "mistral3", tok, extra, False, language_model=decoder_name)


def make_smollm3(tok) -> None:
    cfg = SmolLM3Config(**base.COMMON, num_hidden_layers=4, tie_word_embeddings=False,
                        rope_parameters={"rope_type": "default", "rope_theta": 50000.0})
    assert cfg.no_rope_layers == [1, 1, 1, 0], cfg.no_rope_layers

    def extra(w):
        w.add_rope_freq_base(50000.0)

    def check(out, tok):
        model = base.reload(out)
        ids = torch.tensor([tok.encode(base.PROMPTS[-1], add_special_tokens=False).ids])
        want = model(ids).logits[0, -1]
        model.model.layers[3].self_attn.use_rope = 1
        moved = float((model(ids).logits[0, -1] - want).abs().max())
        print(f"  tiny-smollm3 with RoPE in its fourth layer: max |dlogit| {moved:.3f}")
        assert moved > 0.1

    fam.build("tiny-smollm3", cfg, SmolLM3ForCausalLM, base.SEED + 13, tok, "smollm3", extra,
              check=check)


def make_qwen3_split(tok) -> None:
    """tiny-qwen3's GGUF again, split into parts of 8 tensors (tiny-qwen3/split/)."""
    out = base.FIXTURES / "tiny-qwen3"
    (out / "split").mkdir(exist_ok=True)
    for old in (out / "split").glob("*.gguf"):
        old.unlink()
    cfg = json.loads((out / "config.json").read_text())
    theta = cfg["rope_parameters"]["rope_theta"]
    fam.write_gguf(out, base.reload(out), "qwen3", tok, lambda w: w.add_rope_freq_base(theta),
                   False, file="split/model.gguf", split_max_tensors=8)


FIXTURES = {
    "tiny-gemma3-vision": make_gemma3_vision,
    "tiny-mistral3": make_mistral3,
    "tiny-smollm3": make_smollm3,
    "tiny-qwen3-split": make_qwen3_split,
}


def main() -> None:
    fam.run(FIXTURES)


if __name__ == "__main__":
    main()
