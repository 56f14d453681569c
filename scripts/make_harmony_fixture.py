#!/usr/bin/env python3
"""Build fixtures/tiny-gpt-oss-harmony: tiny-gpt-oss (same weights, a link to its
model.safetensors) with gpt-oss's own chat template and a tokenizer that has the harmony
format's special tokens, so that the server reads it as gpt-oss: reasoning in the analysis
channel, answers in final, calls in commentary to functions.NAME, generation ending on
<|return|> or <|call|>.

The tiny vocabulary keeps its size (the model's 512 rows): <|im_start|> and <|im_end|> become
<|start|> and <|end|>, and the last five BPE merges give their ids to <|message|>,
<|channel|>, <|constrain|>, <|return|> and <|call|>. transformers loads the result and renders
a conversation to the ids the template's markers are.

Needs transformers (PyPI); run from the repository root:
    python3 scripts/make_harmony_fixture.py
"""

import json
import os
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASE = ROOT / "fixtures" / "tiny-gpt-oss"
OUT = ROOT / "fixtures" / "tiny-gpt-oss-harmony"
TEMPLATE = ROOT / "fixtures" / "chat-templates" / "gpt-oss.jinja"

RENAMED = {1: "<|start|>", 2: "<|end|>"}
CONTEXT = 2048
TAKEN = ["<|message|>", "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>"]


def harmony_tokenizer():
    tok = json.loads((BASE / "tokenizer.json").read_text())
    model = tok["model"]
    vocab = model["vocab"]
    size = len(vocab)
    freed = list(range(size - len(TAKEN), size))
    by_id = {i: t for t, i in vocab.items()}
    gone = {by_id[i] for i in freed}
    # The freed tokens are made by the last merges, and no merge uses them.
    merges = model["merges"]
    made = ["".join(m) for m in merges[-len(TAKEN):]]
    assert set(made) == gone, (made, gone)
    assert not any(a in gone or b in gone for a, b in merges[:-len(TAKEN)])
    model["merges"] = merges[:-len(TAKEN)]
    for t in gone:
        del vocab[t]
    specials = dict(RENAMED)
    specials.update(zip(freed, TAKEN))
    for i, text in specials.items():
        old = by_id[i]
        vocab.pop(old, None)
        vocab[text] = i
    added = [a for a in tok["added_tokens"] if a["id"] not in specials]
    for i, text in sorted(specials.items()):
        added.append({"id": i, "content": text, "single_word": False, "lstrip": False,
                      "rstrip": False, "normalized": False, "special": True})
    tok["added_tokens"] = sorted(added, key=lambda a: a["id"])
    return tok, {text: i for i, text in specials.items()}


def main():
    OUT.mkdir(exist_ok=True)
    tok, ids = harmony_tokenizer()
    (OUT / "tokenizer.json").write_text(json.dumps(tok, indent=2, ensure_ascii=False) + "\n")
    config = json.loads((BASE / "config.json").read_text())
    config["eos_token_id"] = ids["<|return|>"]
    # Room for the template's system message and tool definitions in a byte-sized vocabulary
    # (positions are rotary: the weights do not depend on it).
    config["max_position_embeddings"] = CONTEXT
    (OUT / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    generation = {"bos_token_id": 0, "pad_token_id": 0,
                  "eos_token_id": [ids["<|return|>"], 0, ids["<|call|>"]]}
    (OUT / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    tokenizer_config = {
        "add_bos_token": False, "add_eos_token": False, "backend": "tokenizers",
        "bos_token": "<|endoftext|>", "eos_token": "<|return|>", "pad_token": "<|endoftext|>",
        "clean_up_tokenization_spaces": False, "model_max_length": CONTEXT,
        "tokenizer_class": "TokenizersBackend", "unk_token": None,
    }
    (OUT / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n")
    shutil.copyfile(TEMPLATE, OUT / "chat_template.jinja")
    link = OUT / "model.safetensors"
    if link.is_symlink() or link.exists():
        link.unlink()
    os.symlink("../tiny-gpt-oss/model.safetensors", link)

    from transformers import AutoTokenizer

    loaded = AutoTokenizer.from_pretrained(OUT)
    messages = [{"role": "user", "content": "Weather in Oslo?"}]
    rendered = loaded.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    encoded = loaded(rendered, add_special_tokens=False)["input_ids"]
    for text, i in ids.items():
        assert loaded.convert_tokens_to_ids(text) == i, text
    for text, i in ids.items():
        assert encoded.count(i) == rendered.count(text), text
    assert loaded.decode(encoded) == rendered
    assert max(encoded) < config["vocab_size"]
    print(f"{OUT.name}: specials {ids}; a one-message prompt is {len(encoded)} tokens")


if __name__ == "__main__":
    main()
