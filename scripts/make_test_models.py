#!/usr/bin/env python3
"""Build the tiny random test models in fixtures/ and their golden outputs.

Dev-only. Run from anywhere:

    HF_HUB_OFFLINE=1 /work/pyenv/bin/python scripts/make_test_models.py

Produces fixtures/tiny-llama, fixtures/tiny-qwen2 and fixtures/tiny-mistral: complete Hugging Face
model directories (config, weights, tokenizer, chat template, generation config) plus golden.json,
the reference the Rust engine is checked against (logits to 1e-4 in f32, greedy tokens identical).

Every model is deliberately awkward in a different way so that one loader/forward bug cannot hide:
  * tiny-llama:   llama3 RoPE scaling (all three frequency bands hit), GQA, untied lm_head, f32,
                  one model.safetensors, transformers-5 style config.json (`dtype`, `rope_parameters`).
  * tiny-qwen2:   random q/k/v biases, tied embeddings (no lm_head.weight in the file), sharded
                  safetensors + index, config.json rewritten to the transformers-4 key style
                  (`torch_dtype`, top-level `rope_theta`, `rope_scaling: null`).
  * tiny-mistral: sliding window 8 (shorter than most prompts), bf16 weights on disk.

Goldens are always computed from the directory as written, reloaded from disk, so they describe what
is on disk (e.g. the rewritten Qwen2 config, the bf16-rounded Mistral weights) rather than the
in-memory model that produced it.
"""

import json
import os
import shutil
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402
from transformers import (  # noqa: E402
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"

SEED = 1234
VOCAB_SIZE = 512
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2
ENDOFTEXT_ID, IM_START_ID, IM_END_ID = 0, 1, 2
N_GREEDY = 20
# Smallest allowed top-1/top-2 logit gap along every golden greedy path; the Rust side matches
# logits to 1e-4, so a gap well above that keeps greedy comparisons about correctness, not rounding.
MIN_GREEDY_GAP = 5e-3

# ChatML, as Qwen2/SmolLM2 use it, minus any default system prompt so rendering is easy to predict.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Training text for the BPE. Embedded (not read from disk) so a fresh machine produces a byte-identical
# tokenizer. It only has to be varied enough to yield VOCAB_SIZE tokens.
CORPUS = """\
The quick brown fox jumps over the lazy dog. A serving system takes requests from many users at once,
groups them into batches, and runs one forward pass of the model for the whole batch. Each request
keeps its own cache of keys and values, stored in fixed-size blocks so that memory can be shared and
reused without copying. When a request finishes, its blocks are returned to the pool.

Once upon a time there was a little town by the sea. The people of the town were fishermen, bakers,
teachers and sailors. Every morning the bakers made fresh bread, and every evening the sailors came
home with stories about the weather, the waves and the stars. The children listened and dreamed of
faraway places where the mountains touched the clouds and the rivers ran silver under the moon.

In mathematics, a matrix is a rectangular array of numbers arranged in rows and columns. Two
matrices can be multiplied when the number of columns of the first equals the number of rows of the
second. The product of a 3 by 4 matrix and a 4 by 2 matrix is a 3 by 2 matrix. Numbers such as 0, 1,
2, 3, 4, 5, 6, 7, 8, 9, 10, 42, 100, 256, 1024 and 2048 appear often in computer science.

The weather today is sunny with a light breeze from the west. Tomorrow it will rain in the morning
and clear up in the afternoon. Temperatures will stay between twelve and eighteen degrees. Please
remember to bring an umbrella if you plan to walk to the station, and do not forget your ticket.

def add(a, b):
    return a + b

for i in range(10):
    print(i, add(i, i))

Question: What is the capital of France? Answer: The capital of France is Paris.
Question: How many legs does a spider have? Answer: A spider has eight legs.
Question: Who wrote the play about the prince of Denmark? Answer: William Shakespeare wrote it.

Language models predict the next token given all the tokens before it. Attention lets every position
look at earlier positions; rotary position embeddings rotate queries and keys by an angle that grows
with the position, so the dot product depends on the distance between two tokens. A sliding window
limits how far back a token may look, which saves memory for very long texts.

She sells sea shells by the sea shore. Peter Piper picked a peck of pickled peppers. How much wood
would a woodchuck chuck if a woodchuck could chuck wood? These sentences are hard to say quickly,
which is why children love them and teachers use them to practice pronunciation in the classroom.
"""

# Golden prompts: one token, a few tokens, ~20, ~40 and ~100 tokens (the last much longer than
# tiny-mistral's window of 8). Token counts are asserted in main() so edits cannot silently shrink them.
PROMPTS = [
    "The",
    "Once upon a time",
    "The capital of France is Paris. Every morning the",
    "Attention lets every position look at earlier positions, and rotary embeddings rotate queries "
    "and keys",
    "In a little town by the sea, the people were fishermen, bakers, teachers and sailors. Every "
    "evening the sailors came home with stories about the weather, the waves and the stars. A serving "
    "system takes requests from many users at once, groups them into batches, and runs one forward pass.",
]
MIN_PROMPT_TOKENS = [1, 3, 15, 30, 90]
MAX_PROMPT_TOKENS = [1, 10, 25, 45, 120]

# Shapes shared by all three models: 4 query heads over 2 KV heads (GQA), head_dim 16.
COMMON = dict(
    vocab_size=VOCAB_SIZE,
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
    hidden_act="silu",
    # Large init: with the default 0.02 every logit is ~0 and a RoPE or mask bug barely moves them.
    initializer_range=0.15,
    bos_token_id=ENDOFTEXT_ID,
    eos_token_id=IM_END_ID,
    pad_token_id=ENDOFTEXT_ID,
    attention_dropout=0.0,
)


def build_tokenizer() -> Tokenizer:
    """GPT-2 style byte-level BPE: regex split + byte mapping, byte decoder, no post-processing
    (so encode() never adds BOS/EOS)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=1,
        special_tokens=SPECIAL_TOKENS,
        # Full byte alphabet, so any UTF-8 input is encodable without an unknown token.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS.splitlines(keepends=True), trainer=trainer)
    assert tok.get_vocab_size() == VOCAB_SIZE, tok.get_vocab_size()
    for i, t in enumerate(SPECIAL_TOKENS):
        assert tok.token_to_id(t) == i, (t, tok.token_to_id(t))
    return tok


def save_tokenizer(tok: Tokenizer, out: Path) -> None:
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|endoftext|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
        add_bos_token=False,
        add_eos_token=False,
        model_max_length=COMMON["max_position_embeddings"],
        clean_up_tokenization_spaces=False,
        chat_template=CHAT_TEMPLATE,
    )
    fast.save_pretrained(out)
    # transformers re-serializes tokenizer.json with an empty TemplateProcessing post-processor; write
    # the trained tokenizer itself instead, so the file has no post-processor at all.
    tok.save(str(out / "tokenizer.json"), pretty=True)
    # Depending on the transformers version the template lands in chat_template.jinja or inside
    # tokenizer_config.json; pin it to the standalone file, which is what newer HF repos ship.
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.pop("chat_template", None)
    # Spell out that nothing is added around encoded text (transformers 5 drops these when False).
    cfg["add_bos_token"] = False
    cfg["add_eos_token"] = False
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def randomize(model: torch.nn.Module, std: float, seed: int) -> None:
    """Overwrite every parameter from our own generator, in sorted name order, so the weights do not
    depend on transformers' init order or on which tensors it considers tied. Norm weights and biases
    are non-trivial on purpose: ones/zeros would hide a missing norm scale or bias."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        seen = set()
        for name, p in sorted(model.named_parameters(remove_duplicate=False), key=lambda kv: kv[0]):
            if id(p) in seen:  # tied lm_head: keep the embedding's values
                continue
            seen.add(id(p))
            if name == "model.norm.weight":
                # uniform 2..4: sharpens the output distribution (logit std ~3 instead of ~1), so
                # greedy paths have clear winners instead of near-ties.
                p.copy_(torch.rand(p.shape, generator=gen) * 2.0 + 2.0)
            elif "norm" in name:
                p.copy_(torch.rand(p.shape, generator=gen) + 0.5)  # uniform 0.5..1.5
            elif name.endswith(".bias"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * std)


def reload(out: Path) -> torch.nn.Module:
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, attn_implementation="eager")
    return model.float().eval()


@torch.no_grad()
def greedy(model, ids: list[int], n: int) -> tuple[list[int], float]:
    """Argmax decoding by full recomputation each step: no KV cache, so the reference cannot inherit
    a cache bug (e.g. sliding-window cache eviction). EOS is ignored on purpose.

    Also returns the smallest top-1/top-2 logit gap seen: a near-tie would make "greedy tokens
    identical" depend on float summation order rather than on correctness."""
    seq, min_gap = list(ids), float("inf")
    for _ in range(n):
        logits = model(torch.tensor([seq])).logits[0, -1]
        top = torch.topk(logits, 2).values
        min_gap = min(min_gap, float(top[0] - top[1]))
        seq.append(int(torch.argmax(logits)))
    return seq[len(ids):], min_gap


@torch.no_grad()
def greedy_cached(model, ids: list[int], n: int) -> list[int]:
    """The same with transformers' KV cache; only used to cross-check greedy()."""
    out = model(torch.tensor([ids]), use_cache=True)
    past, new = out.past_key_values, []
    nxt = int(torch.argmax(out.logits[0, -1]))
    for _ in range(n):
        new.append(nxt)
        out = model(torch.tensor([[nxt]]), past_key_values=past, use_cache=True)
        past = out.past_key_values
        nxt = int(torch.argmax(out.logits[0, -1]))
    return new


@torch.no_grad()
def write_golden(name: str, out: Path, tok: Tokenizer, dtype_label: str) -> None:
    model = reload(out)
    prompts = []
    for text in PROMPTS:
        ids = tok.encode(text, add_special_tokens=False).ids
        logits = model(torch.tensor([ids])).logits[0, -1].float()
        probs = torch.softmax(logits, -1)
        # Near-uniform logits would make the goldens useless for catching RoPE/mask bugs.
        assert float(logits.std()) > 0.5 and float(probs.max()) > 3.0 / VOCAB_SIZE, (name, float(logits.std()))
        gids, gap = greedy(model, ids, N_GREEDY)
        assert gap > MIN_GREEDY_GAP, (name, text[:30], gap)
        cached = greedy_cached(model, ids, N_GREEDY)
        if cached != gids:
            print(f"WARNING {name}: cached greedy differs from uncached for {text[:30]!r}", file=sys.stderr)
        prompts.append(
            {
                "text": text,
                "prompt_ids": ids,
                "last_logits": [float(x) for x in logits.tolist()],
                "greedy_ids": gids,
            }
        )
        print(
            f"  {name}: {len(ids):3d} prompt tokens, logit std {float(logits.std()):.2f}, "
            f"max p {float(probs.max()):.3f}, min top1-top2 gap {gap:.4f}"
        )
    golden = {"model": name, "dtype": dtype_label, "prompts": prompts}
    (out / "golden.json").write_text(json.dumps(golden) + "\n")


def save_generation_config(out: Path, eos) -> None:
    GenerationConfig(bos_token_id=ENDOFTEXT_ID, eos_token_id=eos, pad_token_id=ENDOFTEXT_ID).save_pretrained(out)


def fresh_dir(name: str) -> Path:
    out = FIXTURES / name
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    return out


def make_llama(tok: Tokenizer) -> None:
    out = fresh_dir("tiny-llama")
    cfg = LlamaConfig(
        **COMMON,
        num_hidden_layers=3,
        head_dim=16,
        tie_word_embeddings=False,
        # With head_dim 16 and theta 1e4 the wavelengths are 6.3, 19.9, 62.8, ... positions. Against an
        # original context of 32 (high-freq cutoff 32/4=8, low-freq cutoff 32/1=32) that puts one pair
        # in each llama3 band: kept, smoothly interpolated, and divided by `factor`.
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 10000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        },
        attention_bias=False,
        mlp_bias=False,
    )
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(cfg)
    randomize(model, COMMON["initializer_range"], SEED + 1)
    model.save_pretrained(out, safe_serialization=True)
    save_tokenizer(tok, out)
    save_generation_config(out, IM_END_ID)
    write_golden("tiny-llama", out, tok, "float32")


def make_qwen2(tok: Tokenizer) -> None:
    out = fresh_dir("tiny-qwen2")
    cfg = Qwen2Config(**COMMON, num_hidden_layers=2, tie_word_embeddings=True, use_sliding_window=False)
    torch.manual_seed(SEED)
    model = Qwen2ForCausalLM(cfg)
    randomize(model, COMMON["initializer_range"], SEED + 2)
    # ~430 KB of f32 weights; 150KB shards gives several files, one holding just the embedding.
    model.save_pretrained(out, safe_serialization=True, max_shard_size="150KB")
    rewrite_config_v4(out)
    save_tokenizer(tok, out)
    # A list here (as in real Qwen2.5 repos) exercises the int-or-list form of eos_token_id.
    save_generation_config(out, [IM_END_ID, ENDOFTEXT_ID])
    write_golden("tiny-qwen2", out, tok, "float32")


def rewrite_config_v4(out: Path) -> None:
    """Rewrite config.json to the key layout transformers 4.x wrote (as in Qwen2.5's published
    configs), so the Rust loader is tested on both `rope_parameters`/`dtype` and
    `rope_theta`/`rope_scaling`/`torch_dtype`."""
    path = out / "config.json"
    cfg = json.loads(path.read_text())
    rope = cfg.pop("rope_parameters", None) or {}
    assert rope.get("rope_type", "default") == "default", rope
    v4 = {
        "architectures": cfg["architectures"],
        "attention_dropout": cfg.get("attention_dropout", 0.0),
        "bos_token_id": cfg["bos_token_id"],
        "eos_token_id": cfg["eos_token_id"],
        "hidden_act": cfg["hidden_act"],
        "hidden_size": cfg["hidden_size"],
        "initializer_range": cfg["initializer_range"],
        "intermediate_size": cfg["intermediate_size"],
        "max_position_embeddings": cfg["max_position_embeddings"],
        "max_window_layers": cfg["num_hidden_layers"],
        "model_type": cfg["model_type"],
        "num_attention_heads": cfg["num_attention_heads"],
        "num_hidden_layers": cfg["num_hidden_layers"],
        "num_key_value_heads": cfg["num_key_value_heads"],
        "rms_norm_eps": cfg["rms_norm_eps"],
        "rope_scaling": None,
        "rope_theta": rope.get("rope_theta", 10000.0),
        # As in real Qwen2.5 configs: a window is named but switched off by use_sliding_window=false.
        # A loader that honours sliding_window without checking the flag will fail the goldens.
        "sliding_window": 32,
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
        "transformers_version": "4.43.1",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": cfg["vocab_size"],
    }
    path.write_text(json.dumps(v4, indent=2) + "\n")


def make_mistral(tok: Tokenizer) -> None:
    out = fresh_dir("tiny-mistral")
    cfg = MistralConfig(
        **COMMON, num_hidden_layers=2, head_dim=16, sliding_window=8, tie_word_embeddings=False
    )
    torch.manual_seed(SEED)
    model = MistralForCausalLM(cfg)
    randomize(model, COMMON["initializer_range"], SEED + 3)
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    save_tokenizer(tok, out)
    save_generation_config(out, IM_END_ID)
    # reload() upcasts the bf16 tensors to f32, so the goldens are the f32 forward of the bf16 weights.
    write_golden("tiny-mistral", out, tok, "float32")


def main() -> None:
    torch.manual_seed(SEED)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)  # fixed reduction order, so reruns give bit-identical goldens

    tok = build_tokenizer()
    for text, lo, hi in zip(PROMPTS, MIN_PROMPT_TOKENS, MAX_PROMPT_TOKENS):
        n = len(tok.encode(text, add_special_tokens=False).ids)
        assert lo <= n <= hi, (text[:40], n, lo, hi)

    make_llama(tok)
    make_qwen2(tok)
    make_mistral(tok)

    # The tokenizer transformers reads back must agree with the one we trained.
    for name in ("tiny-llama", "tiny-qwen2", "tiny-mistral"):
        hf = AutoTokenizer.from_pretrained(FIXTURES / name)
        for text in PROMPTS:
            assert hf.encode(text, add_special_tokens=False) == tok.encode(text, add_special_tokens=False).ids
    print("done")


if __name__ == "__main__":
    main()
