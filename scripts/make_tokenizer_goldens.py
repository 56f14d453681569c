#!/usr/bin/env python3
"""Writes the tokenizer goldens the tessera-text and tessera-model-files tests compare against.

    HF_HUB_OFFLINE=1 python scripts/make_tokenizer_goldens.py [--cache DIR]

1. model-files/tests/data/smollm2_tokenizer_cases.json: ids and decodes from transformers'
   GGUF tokenizer (AutoTokenizer.from_pretrained(dir, gguf_file=...)) for
   SmolLM2-135M-Instruct.Q4_1.gguf on many strings (unicode, CJK, Arabic, emoji with ZWJ,
   numbers, whitespace runs, code, special tokens).
2. text/tests/data/hf_fixture_tokenizer_cases.json: ids, decodes and chat renderings from
   AutoTokenizer on the fixtures/tiny-* model directories (ModelTokenizer::from_hf_dir).
3. text/tests/data/tiny_spm_tokenizer.json: a tiny hand-built SentencePiece-style
   ("llama") GGUF tokenizer, its metadata and transformers' ids/decodes for it.
4. text/tests/data/tiny_family_tokenizers.json: GGUF tokenizers as llama.cpp writes two
   families' vocabularies, and transformers' ids/decodes for them: Gemma's SentencePiece
   vocabulary (`llama` model, no space prefix, `gemma2` architecture) and Qwen's byte-level
   BPE with the `qwen2` pre-tokenizer (digits split one by one).

Needs transformers (5.x), tokenizers and gguf.
"""

import argparse
import json
import os
import tempfile
from pathlib import Path

import gguf
from transformers import AutoTokenizer

ROOT = Path(__file__).resolve().parent.parent
# The GGUF file's cases test the GGUF reader too, so they sit with the model-file crate.
MODEL_FILES_DATA = ROOT / "model-files" / "tests" / "data"
TEXT_DATA = ROOT / "text" / "tests" / "data"

SMOLLM2 = "SmolLM2-135M-Instruct.Q4_1.gguf"

TEXTS = [
    "Hello world",
    "hello world",
    " Hello world",
    "  two leading spaces",
    "trailing spaces   ",
    "multiple    internal     spaces",
    "tabs\tand\ttabs\t\t",
    "new\nlines\n\n\nand\r\nCRLF",
    "\n\n\n",
    "   \n\t  \n",
    "",
    " ",
    "The quick brown fox jumps over the lazy dog.",
    "I'm sure they'll say it's fine, we've done what you'd've done.",
    "DON'T SHOUT! Isn't it?",
    "1234567890",
    "3.14159265358979 and 2,718,281 and 1e-10 and -42",
    "Year 2024: 12345678901234567890 grains",
    "naïve café résumé façade Ångström",
    "Straße, Übergröße, Œuvre, ǅ",
    "日本語のテキストです。東京は日本の首都です。",
    "中文测试：你好，世界！",
    "한국어 문장입니다.",
    "العربية: مرحبا بالعالم",
    "עברית: שלום עולם",
    "Русский текст: Привет, мир!",
    "Ελληνικά: Γειά σου Κόσμε",
    "हिन्दी में पाठ",
    "ภาษาไทย สวัสดี",
    "emoji 😀😃😄 and 🎉",
    "family 👨‍👩‍👧‍👦 and flags 🇫🇷🇯🇵 and skin 👍🏽",
    "🏳️‍🌈 ❤️‍🔥 🧑🏻‍💻",
    "math ∑∫√∞ ≤ ≥ ≠ ± × ÷",
    "zero\u200bwidth\u200djoiner\u2060word",
    "combining e\u0301 a\u0308 n\u0303",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "fn main() {\n\tprintln!(\"{}\", 1 + 2);\n}",
    "<html><body class=\"x\">&amp; &lt;tag&gt;</body></html>",
    "SELECT * FROM users WHERE id = 42;",
    "https://example.com/path?query=1&other=two#frag",
    "user@example.com (555) 123-4567",
    "<|im_start|>user\nhi<|im_end|>",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "text<|endoftext|>more text",
    "<|im_start|><|im_end|><|im_start|>",
    "not special: <|im_start |> <im_start> < |im_end| >",
    "<repo_name>tessera<file_sep>src/lib.rs<gh_stars>100",
    "{{ template }} {% block %} {# comment #}",
    "a" * 300,
    "ab " * 100,
    "Mixed 中文 and English with 123 numbers and émojis 🎉!",
    "\u00a0non-breaking\u00a0spaces\u3000ideographic",
    "control\x01\x02\x7f chars",
    "\ufeffBOM at start",
    "surrogate-free 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝟙𝟚𝟛",
]


def smollm2_cases(cache: Path) -> dict:
    tok = AutoTokenizer.from_pretrained(str(cache), gguf_file=SMOLLM2)
    cases = []
    for text in TEXTS:
        ids = tok.encode(text, add_special_tokens=True)
        cases.append(
            {
                "text": text,
                "ids": ids,
                "decoded": tok.decode(ids, skip_special_tokens=False),
                "decoded_skip_special": tok.decode(ids, skip_special_tokens=True),
            }
        )
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    conversation = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi {{ not a template }}"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "日本語で？ 🎉"},
    ]
    chats = []
    for msgs in (messages, conversation):
        for gen in (True, False):
            chats.append(
                {
                    "messages": msgs,
                    "add_generation_prompt": gen,
                    "text": tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen),
                }
            )
    return {"model": SMOLLM2, "cases": cases, "chats": chats}


SPM_TEXTS = [
    "hello world",
    "  hello\nworld é 日",
    "the<|user|>and",
    "<s>hello",
    "hello</s>",
    "",
    " ",
    "theandthe world",
    "hello  world  ",
    "emoji 🎉",
]


def tiny_spm(tmp: Path) -> dict:
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    scores = [0.0] * len(tokens)
    pieces = ["▁", "h", "e", "l", "o", "w", "r", "d", "a", "n", "t", "▁h", "ll", "▁he", "llo",
              "▁hello", "▁w", "or", "▁wor", "ld", "▁world", "an", "▁an", "▁and", "at", "▁t",
              "▁th", "▁the", "<|user|>"]
    for i, piece in enumerate(pieces):
        tokens.append(piece)
        types.append(4 if piece.startswith("<|") else 1)
        scores.append(-float(i))
    spec = {
        "model": "llama",
        "tokens": tokens,
        "token_types": types,
        "scores": scores,
        "bos_id": 1,
        "eos_id": 2,
        "unk_id": 0,
        "add_bos": True,
        "add_space_prefix": True,
    }
    return gguf_cases(tmp, "llama", spec, SPM_TEXTS)


def write_gguf_tokenizer(path: Path, arch: str, spec: dict) -> None:
    """A GGUF file holding only `spec`'s tokenizer metadata (and the keys a config needs)."""
    w = gguf.GGUFWriter(str(path), arch)
    w.add_context_length(64)
    w.add_embedding_length(8)
    w.add_block_count(1)
    w.add_feed_forward_length(16)
    w.add_head_count(1)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_tokenizer_model(spec["model"])
    if spec.get("pre"):
        w.add_tokenizer_pre(spec["pre"])
    w.add_token_list(spec["tokens"])
    w.add_token_types(spec["token_types"])
    if spec.get("scores"):
        w.add_token_scores(spec["scores"])
    if spec.get("merges"):
        w.add_token_merges(spec["merges"])
    w.add_bos_token_id(spec["bos_id"])
    w.add_eos_token_id(spec["eos_id"])
    if spec.get("unk_id") is not None:
        w.add_unk_token_id(spec["unk_id"])
    w.add_add_bos_token(spec["add_bos"])
    if spec.get("add_space_prefix") is not None:
        w.add_add_space_prefix(spec["add_space_prefix"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def gguf_cases(tmp: Path, arch: str, spec: dict, texts: list[str]) -> dict:
    path = tmp / f"tiny-{arch}.gguf"
    write_gguf_tokenizer(path, arch, spec)
    tok = AutoTokenizer.from_pretrained(str(tmp), gguf_file=path.name)
    cases = []
    for text in texts:
        ids = tok.encode(text, add_special_tokens=True)
        cases.append(
            {
                "text": text,
                "ids": ids,
                "ids_no_special": tok.encode(text, add_special_tokens=False),
                "decoded": tok.decode(ids, skip_special_tokens=False),
                "decoded_skip_special": tok.decode(ids, skip_special_tokens=True),
            }
        )
    return {"arch": arch, "spec": spec, "cases": cases}


def tiny_gemma(tmp: Path) -> dict:
    """Gemma's vocabulary as llama.cpp converts it: `llama` pieces with byte fallback and
    scores, `<pad>`/`<eos>`/`<bos>`/`<unk>` first, no space prefix, bos added."""
    tokens = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
    types = [3, 3, 3, 2, 4, 4]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [6] * 256
    scores = [0.0] * len(tokens)
    pieces = ["▁", "h", "e", "l", "o", "w", "r", "d", "a", "n", "t", "\n", "▁h", "ll", "▁he",
              "llo", "▁hello", "he", "hello", "▁w", "or", "▁wor", "ld", "▁world", "wor",
              "world", "an", "▁an", "▁and", "at", "▁t", "▁th", "▁the", "▁▁", "▁▁▁▁"]
    for i, piece in enumerate(pieces):
        tokens.append(piece)
        types.append(1)
        scores.append(-float(i))
    spec = {"model": "llama", "tokens": tokens, "token_types": types, "scores": scores,
            "bos_id": 2, "eos_id": 1, "unk_id": 3, "add_bos": True, "add_space_prefix": False}
    texts = SPM_TEXTS + ["<start_of_turn>user\nhello world<end_of_turn>\n",
                         "hello  world    and\tthe", "world hello"]
    return gguf_cases(tmp, "gemma2", spec, texts)


def tiny_qwen2(tmp: Path) -> dict:
    """A byte-level BPE vocabulary (the tiny fixtures') written as llama.cpp writes Qwen's:
    `gpt2` model, `qwen2` pre-tokenizer, `<|endoftext|>` bos not added."""
    fixture = json.loads((ROOT / "fixtures" / "tiny-qwen2" / "tokenizer.json").read_text())
    vocab = fixture["model"]["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    special = {a["content"] for a in fixture["added_tokens"]}
    merges = [m if isinstance(m, str) else " ".join(m) for m in fixture["model"]["merges"]]
    spec = {"model": "gpt2", "pre": "qwen2", "tokens": tokens,
            "token_types": [3 if t in special else 1 for t in tokens], "merges": merges,
            "bos_id": 0, "eos_id": 2, "add_bos": False}
    texts = TEXTS[:60] + ["12345 67 8", "x=1234567890;y=42", "I'M HERE, YOU'RE THERE"]
    return gguf_cases(tmp, "qwen2", spec, texts)


FIXTURES = ["tiny-llama", "tiny-mistral", "tiny-qwen2"]


def hf_fixture_cases() -> dict:
    out = {}
    conversation = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi {{ not a template }}"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "日本語で？ 🎉"},
    ]
    for name in FIXTURES:
        tok = AutoTokenizer.from_pretrained(str(ROOT / "fixtures" / name))
        cases = []
        for text in TEXTS[::3] + [TEXTS[41], TEXTS[42]]:
            ids = tok.encode(text, add_special_tokens=True)
            cases.append(
                {
                    "text": text,
                    "ids": ids,
                    "decoded_skip_special": tok.decode(ids, skip_special_tokens=True),
                }
            )
        chats = []
        for gen in (True, False):
            try:
                text = tok.apply_chat_template(conversation, tokenize=False, add_generation_prompt=gen)
            except Exception as e:  # a template that rejects system messages, etc.
                text = None
            chats.append({"messages": conversation, "add_generation_prompt": gen, "text": text})
        out[name] = {"cases": cases, "chats": chats}
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    default_cache = os.environ.get("TESSERA_CACHE", str(Path.home() / ".cache" / "tessera"))
    parser.add_argument("--cache", default=default_cache, help="folder holding " + SMOLLM2)
    args = parser.parse_args()
    MODEL_FILES_DATA.mkdir(parents=True, exist_ok=True)
    TEXT_DATA.mkdir(parents=True, exist_ok=True)
    out = MODEL_FILES_DATA / "smollm2_tokenizer_cases.json"
    out.write_text(json.dumps(smollm2_cases(Path(args.cache)), ensure_ascii=False, indent=1) + "\n")
    print("wrote", out)
    out = TEXT_DATA / "hf_fixture_tokenizer_cases.json"
    out.write_text(json.dumps(hf_fixture_cases(), ensure_ascii=False, indent=1) + "\n")
    print("wrote", out)
    with tempfile.TemporaryDirectory() as tmp:
        out = TEXT_DATA / "tiny_spm_tokenizer.json"
        out.write_text(json.dumps(tiny_spm(Path(tmp)), ensure_ascii=False, indent=1) + "\n")
        print("wrote", out)
    with tempfile.TemporaryDirectory() as tmp:
        families = [tiny_gemma(Path(tmp)), tiny_qwen2(Path(tmp))]
        out = TEXT_DATA / "tiny_family_tokenizers.json"
        out.write_text(json.dumps(families, ensure_ascii=False, indent=1) + "\n")
        print("wrote", out)


if __name__ == "__main__":
    main()
