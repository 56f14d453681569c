#!/usr/bin/env python3
"""Write fixtures/smollm2/golden.json: transformers' reference outputs for SmolLM2-135M-Instruct Q4_1.

Dev-only. Needs the GGUF (scripts/fetch_smollm2.sh) and a Python with torch, transformers, gguf and
accelerate (transformers refuses GGUF loading without accelerate):

    scripts/fetch_smollm2.sh
    HF_HUB_OFFLINE=1 /work/pyenv/bin/python scripts/make_smollm2_goldens.py [--gguf PATH]

The model is loaded by transformers straight from the GGUF in float32: the Q4_1/Q8_0 blocks are
dequantized to f32 and llama.cpp's q/k row permutation is undone. Before trusting that, this script
re-derives a few tensors itself from the raw GGUF bytes (own block decoder, own inverse permutation)
and requires bit-exact agreement, so a change in transformers' loader cannot silently shift the
goldens. The tokenizer is the one transformers builds from the GGUF metadata.
"""

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "fixtures" / "smollm2" / "golden.json"

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
N_GREEDY = 32
TOP_N = 20

PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Water boils at 100 degrees Celsius and freezes at 0 degrees Celsius. The boiling point of water "
    "in Fahrenheit is",
    "Here is a list of the planets in our solar system, in order from the Sun: Mercury, Venus, Earth,",
]

CHAT_MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]

# Tokenizer edge cases. Ids are recorded with add_special_tokens=False; note that special tokens
# written literally in the text are still matched whole (as llama.cpp does with parse_special=true).
TOKENIZER_CASES = [
    "Hello world",
    "Hello, world! How are you today?",
    " leading space",
    "   three leading spaces",
    "trailing spaces   ",
    "multiple    spaces   between",
    "tabs\tand\ttabs\t\tdouble",
    "line one\nline two\n\nline four\r\nwindows line",
    "Café, naïve, résumé, Ångström, Straße",
    "日本語のテキストと中文文本",
    "مرحبا بالعالم",
    "Emoji: 😀 👍🏽 ❤️ 🇫🇷",
    "Family ZWJ: 👨‍👩‍👧‍👦 and 🧑‍💻",
    "Numbers: 7, 42, 2024, 3.14159, 1234567890123",
    "Phone 555-0123 and ID #00042",
    "def add(a, b):\n    return a + b  # sum\n",
    "fn main() { println!(\"{}\", 1 << 10); }",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "text with <|endoftext|> in the middle",
    "don't won't it's we'll I'm they've",
    "",
]


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def default_gguf() -> Path:
    cache = Path(os.environ.get("TESSERA_CACHE", Path.home() / ".cache" / "tessera"))
    return cache / GGUF_NAME


# ---- independent check of transformers' dequantization ------------------------------------------

def decode_blocks(raw: np.ndarray, ggml_type: str) -> np.ndarray:
    """Our own reading of ggml's block layouts (rows of packed bytes -> f32 rows)."""
    rows = raw.shape[0]
    if ggml_type == "Q4_1":  # 20 bytes: f16 d, f16 m, 16 bytes of nibbles (low: 0..15, high: 16..31)
        b = raw.reshape(rows, -1, 20)
        d = b[..., 0:2].copy().view(np.float16).astype(np.float32)
        m = b[..., 2:4].copy().view(np.float16).astype(np.float32)
        qs = b[..., 4:20]
        q = np.concatenate([qs & 0xF, qs >> 4], axis=-1).astype(np.float32)
        return (d * q + m).reshape(rows, -1)
    if ggml_type == "Q8_0":  # 34 bytes: f16 d, 32 x int8
        b = raw.reshape(rows, -1, 34)
        d = b[..., 0:2].copy().view(np.float16).astype(np.float32)
        q = b[..., 2:34].copy().view(np.int8).astype(np.float32)
        return (d * q).reshape(rows, -1)
    if ggml_type == "F32":
        return raw.astype(np.float32)
    raise ValueError(ggml_type)


def unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of convert_hf_to_gguf.py's `permute` (HF rotate-half order -> llama.cpp interleaved)."""
    hd = w.shape[0] // n_head
    return w.reshape(n_head, hd // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def check_dequant_exact(model, gguf_path: Path) -> dict:
    from gguf import GGUFReader

    reader = GGUFReader(str(gguf_path))
    tensors = {t.name: t for t in reader.tensors}
    cfg = model.config
    sd = model.state_dict()
    checks = {
        "token_embd.weight": ("model.embed_tokens.weight", None),
        "output_norm.weight": ("model.norm.weight", None),
        "blk.0.attn_norm.weight": ("model.layers.0.input_layernorm.weight", None),
        "blk.0.ffn_down.weight": ("model.layers.0.mlp.down_proj.weight", None),
        "blk.0.attn_v.weight": ("model.layers.0.self_attn.v_proj.weight", None),
        "blk.0.attn_output.weight": ("model.layers.0.self_attn.o_proj.weight", None),
        "blk.0.attn_q.weight": ("model.layers.0.self_attn.q_proj.weight", cfg.num_attention_heads),
        "blk.0.attn_k.weight": ("model.layers.0.self_attn.k_proj.weight", cfg.num_key_value_heads),
        "blk.29.attn_q.weight": ("model.layers.29.self_attn.q_proj.weight", cfg.num_attention_heads),
        "blk.29.attn_k.weight": ("model.layers.29.self_attn.k_proj.weight", cfg.num_key_value_heads),
        "blk.29.ffn_gate.weight": ("model.layers.29.mlp.gate_proj.weight", None),
    }
    types = {}
    for gname, (hname, heads) in checks.items():
        t = tensors[gname]
        kind = t.tensor_type.name
        ours = decode_blocks(np.asarray(t.data), kind)
        ours = ours.reshape(sd[hname].shape)
        if heads is not None:
            ours = unpermute(ours, heads)
        theirs = sd[hname].detach().cpu().numpy()
        assert theirs.dtype == np.float32, (hname, theirs.dtype)
        if not np.array_equal(ours, theirs):
            raise SystemExit(f"transformers' f32 weights differ from the raw GGUF decode for {gname} ({kind})")
        types[gname] = kind
    # No output.weight in the file: the lm_head is the (Q8_0) token embedding, tied.
    assert "output.weight" not in tensors
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr(), "expected tied lm_head"
    return types


# ---- generation ---------------------------------------------------------------------------------

@torch.no_grad()
def greedy(model, ids: list[int], n: int, stop_id: int | None = None) -> tuple[list[int], float]:
    """Argmax with transformers' KV cache (a 135M model recomputed from scratch 32x is slow on CPU).
    Returns the new ids and the smallest top-1/top-2 logit gap along the way."""
    out = model(torch.tensor([ids]), use_cache=True)
    cache, new, min_gap = out.past_key_values, [], float("inf")
    for _ in range(n):
        logits = out.logits[0, -1].float()
        top = torch.topk(logits, 2).values
        min_gap = min(min_gap, float(top[0] - top[1]))
        nxt = int(torch.argmax(logits))
        new.append(nxt)
        if stop_id is not None and nxt == stop_id:
            break
        out = model(torch.tensor([[nxt]]), past_key_values=cache, use_cache=True)
        cache = out.past_key_values
    return new, min_gap


@torch.no_grad()
def greedy_uncached(model, ids: list[int], n: int) -> list[int]:
    seq = list(ids)
    for _ in range(n):
        seq.append(int(torch.argmax(model(torch.tensor([seq])).logits[0, -1])))
    return seq[len(ids):]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", type=Path, default=default_gguf(), help="path to " + GGUF_NAME)
    args = ap.parse_args()
    gguf_path: Path = args.gguf
    if not gguf_path.is_file():
        sys.exit(f"{gguf_path} not found; run scripts/fetch_smollm2.sh first (or pass --gguf)")
    digest = sha256_of(gguf_path)
    if digest != GGUF_SHA256:
        sys.exit(f"{gguf_path}: sha256 {digest}, expected {GGUF_SHA256}")

    torch.manual_seed(0)
    torch.set_num_threads(min(8, os.cpu_count() or 1))

    d, f = str(gguf_path.parent), gguf_path.name
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    model = AutoModelForCausalLM.from_pretrained(
        d, gguf_file=f, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    types = check_dequant_exact(model, gguf_path)
    print(f"dequantization bit-exact vs our own decoder for {sorted(set(types.values()))}")

    prompts = []
    for text in PROMPTS:
        ids = tok.encode(text, add_special_tokens=False)
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, -1].float()
        vals, idx = torch.topk(logits, TOP_N)
        gids, gap = greedy(model, ids, N_GREEDY)
        # A small gap means a near-tie that f32 summation-order noise could flip; keep prompts whose
        # greedy path is decided by more than that.
        if gap < 1e-3:
            print(f"WARNING: near-tie (gap {gap:.2e}) on the greedy path of {text!r}", file=sys.stderr)
        print(f"  {len(ids):3d} tokens, min gap {gap:.4f}: {text!r} -> {tok.decode(gids)!r}")
        prompts.append(
            {
                "text": text,
                "prompt_ids": ids,
                "greedy_ids": gids,
                "last_logits_top": [[int(i), float(v)] for i, v in zip(idx.tolist(), vals.tolist())],
            }
        )
    # The cached loop is what produced the goldens; confirm it against full recomputation once.
    first = prompts[0]
    assert greedy_uncached(model, first["prompt_ids"], N_GREEDY) == first["greedy_ids"]

    prompt_text = tok.apply_chat_template(CHAT_MESSAGES, add_generation_prompt=True, tokenize=False)
    chat_ids = tok.encode(prompt_text, add_special_tokens=False)
    chat_gen, chat_gap = greedy(model, chat_ids, N_GREEDY, stop_id=tok.eos_token_id)
    chat_text = tok.decode(chat_gen, skip_special_tokens=True)
    print(f"  chat (min gap {chat_gap:.4f}): {chat_text!r}")
    if "Paris" not in chat_text:
        print("WARNING: chat answer does not mention Paris", file=sys.stderr)

    cases = [{"text": t, "ids": tok.encode(t, add_special_tokens=False)} for t in TOKENIZER_CASES]
    for c in cases:  # byte-level BPE must round-trip any text exactly
        assert tok.decode(c["ids"]) == c["text"], c

    golden = {
        "model": GGUF_NAME,
        "sha256": GGUF_SHA256,
        "special": {
            "bos_token": tok.bos_token,
            "bos_token_id": tok.bos_token_id,
            "eos_token": tok.eos_token,
            "eos_token_id": tok.eos_token_id,
            "pad_token_id": tok.pad_token_id,
            "unk_token_id": tok.unk_token_id,
            "add_bos_token": bool(getattr(tok, "add_bos_token", False)),
            "chat_template": tok.chat_template,
        },
        "prompts": prompts,
        "chat": {
            "messages": CHAT_MESSAGES,
            "prompt_text": prompt_text,
            "prompt_ids": chat_ids,
            "greedy_ids": chat_gen,
            "greedy_text": chat_text,
        },
        "tokenizer_cases": cases,
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(golden, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
