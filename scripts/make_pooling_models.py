#!/usr/bin/env python3
"""Build the tiny embedding and reranker fixtures (random weights, f32, tiny-qwen3's and
tiny-llama's shapes) and their goldens: what serving embeddings and scores must reproduce.

Dev-only, with make_test_models.py's requirements plus sentence-transformers (made with 6.3):

    HF_HUB_OFFLINE=1 /work/pyenv/bin/python scripts/make_pooling_models.py [NAME …]

  * tiny-qwen3-embedding: a sentence-transformers model laid out as Qwen/Qwen3-Embedding-0.6B is:
      [Transformer (a Qwen3Model of tiny-qwen3's shape), Pooling lasttoken (include_prompt),
      Normalize], saved by SentenceTransformer.save() and then rewritten to the files the real
      repo ships (written by sentence-transformers < 6): `modules.json` with
      `sentence_transformers.models.*` types, `1_Pooling/config.json` with the
      `pooling_mode_*` booleans, `sentence_bert_config.json` {max_seq_length, do_lower_case},
      `config_sentence_transformers.json` with the query/document prompts and cosine
      similarity, and no `2_Normalize/` (sentence-transformers < 6 leaves it empty, so a repo
      has none). `model.safetensors` holds the bare Qwen3Model keys (`embed_tokens.weight`,
      `layers.N.…`, `norm.weight`; no `model.` prefix, no lm_head) while `config.json` says
      `Qwen3ForCausalLM`, as the real one does. The tokenizer is the shared one with a
      TemplateProcessing post-processor appending `<|endoftext|>` (0) to every sequence (and
      no `add_eos_token` in tokenizer_config.json), `padding_side` left, and the shared ChatML
      chat_template.jinja, which embedding must not apply. Golden: golden_embeddings.json.
  * tiny-llama-embedding-mean: [Transformer (a LlamaModel of tiny-llama's shape, llama3 RoPE
      scaling), Pooling mean], no Normalize, left in the layout sentence-transformers 6 writes
      (`sentence_transformers.base.modules.*` / `…sentence_transformer.modules.pooling.Pooling`
      types, `1_Pooling/config.json` {embedding_dimension, pooling_mode: "mean",
      include_prompt}, a `sentence_bert_config.json` of transformer_task / modality_config
      {text} / module_output_name without max_seq_length), so that both layouts are covered.
      `config.json` says `LlamaModel`. Shared tokenizer (nothing added), padding right, no
      chat template. Golden: golden_embeddings.json.
  * tiny-qwen3-reranker-seqcls: Qwen3ForSequenceClassification, num_labels 1, pad_token_id 0
      (`model.…` and `score.weight`), shared tokenizer without a chat template (given one,
      sentence-transformers 6's CrossEncoder renders the pair through it instead of encoding
      the pair). Golden: golden_scores.json.
  * tiny-qwen3-reranker: Qwen3-Reranker's formulation: a Qwen3ForCausalLM (tiny-qwen3's
      shape, untied, max_position_embeddings 512 as the prompt alone is ~190 tokens) whose
      score is the softmax over the last position's logits of two label tokens, the prompt
      formatted as vLLM's Qwen3-Reranker example formats it. The shared tokenizer has no
      single-token "yes"/"no", so the labels are NO_WORD / YES_WORD below. Shared tokenizer
      and chat template. Golden: golden_scores.json.

Random weights put every reranker score near 0 or 1, or all on one side: the scoring rows
(score.weight; the two label rows of lm_head) are shifted along the mean final hidden state and
scaled (see spread()) so that the golden scores spread over about 0.05..0.95.

Goldens are computed from the directories reloaded from disk and cross-checked: embeddings from
SentenceTransformer.encode (batch 1, so unpadded) against a manual pooling of transformers'
last_hidden_state and against padded batches of 8 (all within 1e-5); scores from transformers'
forward of the unpadded sequence, the sequence-classification ones also against
CrossEncoder.predict (default activation: sigmoid).

golden_embeddings.json:
  {"model", "pooling": "lasttoken"|"mean", "normalize": bool,
   "inputs": [{"text", "ids": tokenizer(text)["input_ids"] (special tokens included),
               "embedding": [64 floats]}]}
golden_scores.json:
  {"model", "kind": "sequence-classification",
   "pairs": [{"query", "document", "ids": tokenizer(query, document)["input_ids"] (= the two
              encodings concatenated), "logit", "score": sigmoid(logit)}]}
  {"model", "kind": "label-tokens", "labels": [no, yes], "label_ids": [id_no, id_yes],
   "prefix", "suffix", "instruction",
   "pairs": [{"query": prefix + "<Instruct>: " + instruction + "\n<Query>: " + raw_query + "\n",
              "document": "<Document>: " + raw_document + suffix, "raw_query", "raw_document",
              "ids": tokenizer(query, document)["input_ids"], "logit": l_yes - l_no,
              "score": softmax([l_no, l_yes])[1]}]}
"""

import json
import math
import shutil
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_family_models as fam  # noqa: E402
import make_test_models as base  # noqa: E402
from tokenizers import Tokenizer, processors  # noqa: E402
from transformers import (  # noqa: E402
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    LlamaConfig,
    LlamaModel,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3ForSequenceClassification,
    Qwen3Model,
)

import sentence_transformers  # noqa: E402
from sentence_transformers import CrossEncoder, SentenceTransformer  # noqa: E402
from sentence_transformers.base.modules import Normalize, Transformer  # noqa: E402
from sentence_transformers.sentence_transformer.modules import Pooling  # noqa: E402

TOL = 1e-5
TEXT_ONLY = {"text": {"method": "forward", "method_output_name": "last_hidden_state"}}

QUERY_PROMPT = "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery:"

# Embedding inputs: one word up to ~120 tokens, a few with the query prompt written into the text
# (as a client that formats its own queries sends them), non-ASCII, code, digits, whitespace.
EMBED_TEXTS = [
    "The",
    "hello",
    "Paris",
    "matrix",
    "What is the capital of France?",
    "The capital of France is Paris.",
    "How many legs does a spider have?",
    "A spider has eight legs.",
    "Who wrote the play about the prince of Denmark?",
    "William Shakespeare wrote it.",
    QUERY_PROMPT + "What is the capital of France?",
    QUERY_PROMPT + "how many legs does a spider have",
    QUERY_PROMPT + "rotary position embeddings",
    QUERY_PROMPT + " weather tomorrow in the town by the sea",
    "The weather today is sunny with a light breeze from the west.",
    "Tomorrow it will rain in the morning and clear up in the afternoon.",
    "Grüße aus München! Ça va très bien, merci.",
    "Москва — столица России.",
    "東京は日本の首都です。",
    "naïve café, résumé, coöperate",
    "emoji: 🙂🚀 and symbols ± × ÷ → ∞",
    "def add(a, b):\n    return a + b",
    "for i in range(10):\n    print(i, add(i, i))",
    "Numbers: 0, 1, 2, 3, 42, 100, 256, 1024 and 2048.",
    "  leading and trailing spaces  ",
    "line one\nline two\n\nline four",
    "UPPERCASE WORDS AND lowercase words",
    "She sells sea shells by the sea shore.",
    "How much wood would a woodchuck chuck if a woodchuck could chuck wood?",
    "Language models predict the next token given all the tokens before it.",
    "A sliding window limits how far back a token may look, which saves memory for very long texts.",
    "Two matrices can be multiplied when the number of columns of the first equals the number of "
    "rows of the second.",
    "Once upon a time there was a little town by the sea. The people of the town were fishermen, "
    "bakers, teachers and sailors. Every morning the bakers made fresh bread.",
    "A serving system takes requests from many users at once, groups them into batches, and runs "
    "one forward pass of the model for the whole batch. Each request keeps its own cache of keys and "
    "values, stored in fixed-size blocks so that memory can be shared and reused without copying.",
    "In a little town by the sea, the people were fishermen, bakers, teachers and sailors. Every "
    "evening the sailors came home with stories about the weather, the waves and the stars. The "
    "children listened and dreamed of faraway places where the mountains touched the clouds and "
    "the rivers ran silver under the moon.",
    "Attention lets every position look at earlier positions; rotary position embeddings rotate "
    "queries and keys by an angle that grows with the position, so the dot product depends on the "
    "distance between two tokens. Peter Piper picked a peck of pickled peppers, and nobody minded.",
]

# The mean-pooled model: no prompts (it has none), the rest of the variety.
MEAN_TEXTS = [t for t in EMBED_TEXTS if not t.startswith(QUERY_PROMPT)][::2] + [
    "A", "sea", "Once upon a time", "日本語", "Ünïcödé", "x = [1, 2, 3]",
]

# Reranker pairs: queries with several documents each, relevant and not, of varied lengths.
RERANK_QUERIES = {
    "What is the capital of France?": [
        "The capital of France is Paris.",
        "Paris",
        "A spider has eight legs.",
        "Every morning the bakers made fresh bread, and every evening the sailors came home with "
        "stories about the weather, the waves and the stars.",
        "Paris est la capitale de la France.",
    ],
    "how many legs does a spider have": [
        "A spider has eight legs.",
        "Spiders are arachnids.",
        "The weather today is sunny with a light breeze from the west.",
        "eight",
    ],
    "rotary position embeddings": [
        "Rotary position embeddings rotate queries and keys by an angle that grows with the "
        "position.",
        "She sells sea shells by the sea shore.",
        "def add(a, b):\n    return a + b",
        "位置エンコーディング",
    ],
}

# Qwen3-Reranker's prompt, as vLLM's example (examples/offline_inference/qwen3_reranker.py) builds it.
RERANK_PREFIX = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and "
    'the Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n'
    "<|im_start|>user\n"
)
RERANK_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
RERANK_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
# "yes" and "no" are two tokens each in the shared 512-token vocabulary; these are one each.
NO_WORD, YES_WORD = "on", "is"
# Qwen3-Reranker's prompt is ~190 tokens in a 512-token vocabulary: more room than tiny-qwen3's 256.
RERANK_MAX_POSITIONS = 512
# The sigmoid scores of the goldens should spread over about 0.05..0.95: |logit| at most this.
MAX_ABS_LOGIT = 2.9


def qwen3_config(**kw) -> Qwen3Config:
    """tiny-qwen3's config (make_family_models.make_qwen3)."""
    return Qwen3Config(**dict(fam.COMMON, **kw), num_hidden_layers=2, head_dim=16,
                       tie_word_embeddings=False, attention_bias=False, hidden_act="silu")


def llama_config() -> LlamaConfig:
    """tiny-llama's config (make_test_models.make_llama), read back from its config.json."""
    want = json.loads((base.FIXTURES / "tiny-llama" / "config.json").read_text())
    cfg = LlamaConfig(
        **base.COMMON,
        num_hidden_layers=want["num_hidden_layers"],
        head_dim=want["head_dim"],
        tie_word_embeddings=False,
        rope_parameters=want["rope_parameters"],
        attention_bias=False,
        mlp_bias=False,
    )
    for k in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
              "vocab_size", "rms_norm_eps", "max_position_embeddings"):
        assert getattr(cfg, k) == want[k], k
    assert want["rope_parameters"]["rope_type"] == "llama3", want["rope_parameters"]
    return cfg


def write_json(path: Path, value, indent=2) -> None:
    path.write_text(json.dumps(value, indent=indent, ensure_ascii=False) + "\n")


def edit_json(path: Path, fn) -> None:
    value = json.loads(path.read_text())
    fn(value)
    write_json(path, value)


def floats(t: torch.Tensor) -> list[float]:
    return [float(x) for x in t.float().tolist()]


def tidy(out: Path) -> None:
    """Files sentence-transformers writes that are not part of the fixture, and its 0600 modes."""
    for junk in ("README.md",):
        (out / junk).unlink(missing_ok=True)
    for p in out.rglob("*"):
        p.chmod(0o755 if p.is_dir() else 0o644)


# ---------------------------------------------------------------------------------------------
# embeddings


def embedding_tokenizer(tok: Tokenizer, eos: bool) -> Tokenizer:
    """The shared tokenizer, with (eos) Qwen3-Embedding's post-processor appending <|endoftext|>."""
    tok = Tokenizer.from_str(tok.to_str())
    if eos:
        tok.post_processor = processors.TemplateProcessing(
            single="$A:0 <|endoftext|>:0",
            pair="$A:0 <|endoftext|>:0 $B:1 <|endoftext|>:1",
            special_tokens=[("<|endoftext|>", base.ENDOFTEXT_ID)],
        )
    return tok


def save_embedding_tokenizer(tok: Tokenizer, out: Path, padding_side: str, eos: bool,
                             chat_template: bool) -> None:
    base.save_tokenizer(tok, out)
    if not chat_template:
        (out / "chat_template.jinja").unlink()
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["padding_side"] = padding_side
    if eos:
        # The post-processor does add <|endoftext|>: do not claim otherwise (Qwen3-Embedding's
        # tokenizer_config.json has no add_eos_token either).
        del cfg["add_eos_token"]
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def classic_layout(out: Path, st: SentenceTransformer, prompts: dict) -> None:
    """Rewrite sentence-transformers 6's metadata files to what Qwen/Qwen3-Embedding-0.6B ships
    (sentence-transformers < 6)."""
    modules = json.loads((out / "modules.json").read_text())
    for m in modules:
        kind = m["type"].rsplit(".", 1)[1]
        assert kind in ("Transformer", "Pooling", "Normalize"), m
        m["type"] = "sentence_transformers.models." + kind
    write_json(out / "modules.json", modules)
    pooling = json.loads((out / "1_Pooling" / "config.json").read_text())
    modes = {"cls": "pooling_mode_cls_token", "mean": "pooling_mode_mean_tokens",
             "max": "pooling_mode_max_tokens", "mean_sqrt_len_tokens": "pooling_mode_mean_sqrt_len_tokens",
             "weightedmean": "pooling_mode_weightedmean_tokens", "lasttoken": "pooling_mode_lasttoken"}
    classic = {"word_embedding_dimension": pooling["embedding_dimension"]}
    classic.update({key: pooling["pooling_mode"] == mode for mode, key in modes.items()})
    classic["include_prompt"] = pooling["include_prompt"]
    write_json(out / "1_Pooling" / "config.json", classic, indent=4)
    write_json(out / "sentence_bert_config.json",
               {"max_seq_length": st.max_seq_length, "do_lower_case": False}, indent=4)
    write_json(out / "config_sentence_transformers.json",
               {"prompts": prompts, "default_prompt_name": None, "similarity_fn_name": "cosine"})
    # sentence-transformers 6 turns the cache off in the config it writes; the real repo has it on.
    edit_json(out / "config.json", lambda c: c.update(use_cache=True))
    # sentence-transformers < 6 writes nothing for Normalize: its directory is empty, so not in a repo.
    shutil.rmtree(out / "2_Normalize")


def build_embedding(name: str, model: torch.nn.Module, tok: Tokenizer, pooling: str,
                    normalize: bool, eos: bool, padding_side: str, chat_template: bool,
                    classic: bool, architectures: list[str], prompts: dict,
                    texts: list[str]) -> None:
    out = base.fresh_dir(name)
    etok = embedding_tokenizer(tok, eos)
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        save_embedding_tokenizer(etok, Path(tmp), padding_side, eos, chat_template)
        # Text in, last_hidden_state out. Left to infer it, sentence-transformers 6 sees the chat
        # template and would render every plain text through it (its "message" modality).
        transformer = Transformer(tmp, modality_config=TEXT_ONLY, module_output_name="token_embeddings")
        assert transformer.modality_config == TEXT_ONLY, transformer.modality_config
        modules = [transformer, Pooling(transformer.get_embedding_dimension(), pooling_mode=pooling,
                                        include_prompt=True)]
        if normalize:
            modules.append(Normalize())
        st = SentenceTransformer(modules=modules, prompts=prompts, similarity_fn_name="cosine")
        st.eval()
        before = st.encode(texts[-3:], batch_size=1, convert_to_tensor=True)
        st.save(str(out), create_model_card=False)
    # The tokenizer as written by save_tokenizer (sentence-transformers re-serialises tokenizer.json).
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json"):
        (out / f).unlink(missing_ok=True)
    save_embedding_tokenizer(etok, out, padding_side, eos, chat_template)
    edit_json(out / "config.json", lambda c: c.update(architectures=architectures))
    if classic:
        classic_layout(out, st, prompts)
    tidy(out)
    del st

    # ---- goldens, from the directory as written
    st = SentenceTransformer(str(out), device="cpu")
    st.eval()
    assert type(st[0].auto_model) is type(model), type(st[0].auto_model)
    assert [type(m).__name__ for m in st] == ["Transformer", "Pooling"] + (["Normalize"] if normalize else [])
    assert st[1].pooling_mode == pooling, st[1].pooling_mode
    assert st[0].modality_config == TEXT_ONLY, st[0].modality_config
    got = st.encode(texts[-3:], batch_size=1, convert_to_tensor=True)
    assert float((got - before).abs().max()) < TOL, "reloaded model differs from the saved one"

    hf_tok = AutoTokenizer.from_pretrained(out)
    assert hf_tok.padding_side == padding_side, hf_tok.padding_side
    embs = st.encode(texts, batch_size=1, convert_to_numpy=True)
    assert embs.dtype.name == "float32", embs.dtype
    batched = st.encode(texts, batch_size=8, convert_to_numpy=True)
    diff = float(abs(embs - batched).max())
    assert diff < TOL, f"{name}: padded batch of 8 differs by {diff}"

    hf = AutoModel.from_pretrained(out, dtype=torch.float32, attn_implementation="eager").float().eval()
    def pool(ids, mode):
        with torch.no_grad():
            h = hf(torch.tensor([ids])).last_hidden_state[0]
        e = h[-1] if mode == "lasttoken" else h.mean(0)
        return e / e.norm() if normalize else e

    other = "mean" if pooling == "lasttoken" else "lasttoken"
    inputs, max_manual, moved = [], 0.0, {f"{other} pooling": [], "no appended <|endoftext|>": []}
    for text, emb in zip(texts, embs):
        ids = hf_tok(text)["input_ids"]
        want = etok.encode(text).ids
        assert ids == want, (text, ids, want)
        assert (ids[-1] == base.ENDOFTEXT_ID) == eos, (text, ids)
        emb = torch.from_numpy(emb)
        max_manual = max(max_manual, float((pool(ids, pooling) - emb).abs().max()))
        if len(ids) > 1:  # (one token: all poolings agree)
            moved[f"{other} pooling"].append(float((pool(ids, other) - emb).abs().max()))
        if eos and len(ids) > 1:
            moved["no appended <|endoftext|>"].append(float((pool(ids[:-1], pooling) - emb).abs().max()))
        inputs.append({"text": text, "ids": ids, "embedding": floats(emb)})
    assert max_manual < TOL, f"{name}: manual pooling differs by {max_manual}"
    # What the goldens catch: the smallest max |difference| over the inputs, per mistake.
    for what, diffs in moved.items():
        if diffs:
            print(f"  {name}: {what} moves every embedding by at least {min(diffs):.3f}")
            assert min(diffs) > 0.01, (what, min(diffs))
    lengths = [len(i["ids"]) for i in inputs]
    norms = [float(torch.tensor(i["embedding"]).norm()) for i in inputs]
    print(f"  {name}: {len(inputs)} texts of {min(lengths)}..{max(lengths)} tokens, |e| "
          f"{min(norms):.3f}..{max(norms):.3f}, batch-8 diff {diff:.1e}, manual diff {max_manual:.1e}")
    golden = {"model": name, "pooling": pooling, "normalize": normalize, "inputs": inputs}
    (out / "golden_embeddings.json").write_text(json.dumps(golden) + "\n")


def make_qwen3_embedding(tok) -> None:
    torch.manual_seed(base.SEED)
    model = Qwen3Model(qwen3_config())
    base.randomize(model, base.COMMON["initializer_range"], base.SEED + 30)
    build_embedding("tiny-qwen3-embedding", model, tok, pooling="lasttoken", normalize=True,
                    eos=True, padding_side="left", chat_template=True, classic=True,
                    architectures=["Qwen3ForCausalLM"],
                    prompts={"query": QUERY_PROMPT, "document": ""}, texts=EMBED_TEXTS)
    lengths = [len(tok.encode(t).ids) for t in EMBED_TEXTS]
    assert len(EMBED_TEXTS) >= 34 and min(lengths) == 1 and 100 <= max(lengths) <= 130, lengths


def make_llama_embedding_mean(tok) -> None:
    torch.manual_seed(base.SEED)
    model = LlamaModel(llama_config())
    base.randomize(model, base.COMMON["initializer_range"], base.SEED + 31)
    build_embedding("tiny-llama-embedding-mean", model, tok, pooling="mean", normalize=False,
                    eos=False, padding_side="right", chat_template=False, classic=False,
                    architectures=["LlamaModel"],
                    prompts={}, texts=MEAN_TEXTS)
    assert len(MEAN_TEXTS) >= 20, len(MEAN_TEXTS)


# ---------------------------------------------------------------------------------------------
# rerankers


def rerank_pairs() -> list[tuple[str, str]]:
    return [(q, d) for q, docs in RERANK_QUERIES.items() for d in docs]


def pair_ids(hf_tok, tok: Tokenizer, q: str, d: str) -> list[int]:
    """The pair encoding, which for this tokenizer (no post-processor) is the concatenation."""
    ids = hf_tok(q, d)["input_ids"]
    assert ids == tok.encode(q, add_special_tokens=False).ids + tok.encode(d, add_special_tokens=False).ids
    return ids


@torch.no_grad()
def spread(hidden: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, float]:
    """Random weights put every score near 0 or 1, or all on one side. With `hidden` the final
    hidden states the pairs are scored from ([pairs, hidden]) and `v` the scoring row (a logit is
    `hidden @ v`), returns `m` and `c` such that `c * (v - m)` centres the logits on about 0
    (`m` is along the mean hidden state) and brings the largest |logit| to MAX_ABS_LOGIT."""
    mean = hidden.mean(0)
    m = mean * float((hidden @ v).mean() / (mean @ mean))
    return m, MAX_ABS_LOGIT / float((hidden @ (v - m)).abs().max())


def check_spread(name: str, scores: list[float]) -> None:
    print(f"  {name}: {len(scores)} pairs, scores " + " ".join(f"{s:.3f}" for s in scores))
    assert 0.03 < min(scores) < 0.25 and 0.75 < max(scores) < 0.97, scores
    assert sum(1 for s in scores if 0.1 < s < 0.9) >= len(scores) // 2, scores


def make_qwen3_reranker_seqcls(tok) -> None:
    name = "tiny-qwen3-reranker-seqcls"
    out = base.fresh_dir(name)
    torch.manual_seed(base.SEED)
    model = Qwen3ForSequenceClassification(qwen3_config(num_labels=1))
    base.randomize(model, base.COMMON["initializer_range"], base.SEED + 32)
    model.eval()
    with torch.no_grad():
        hidden = torch.stack([model.model(torch.tensor([tok.encode(q).ids + tok.encode(d).ids]))
                              .last_hidden_state[0, -1] for q, d in rerank_pairs()])
        m, c = spread(hidden, model.score.weight[0].clone())
        model.score.weight[0] = c * (model.score.weight[0] - m)
    assert model.config.pad_token_id == base.ENDOFTEXT_ID and model.config.num_labels == 1
    model.save_pretrained(out, safe_serialization=True)
    base.save_tokenizer(tok, out)
    # Given a chat template, sentence-transformers 6's CrossEncoder renders each (query, document)
    # through it (its "message" modality) instead of encoding the pair: no template, so that it
    # and every older version score the plain pair encoding.
    (out / "chat_template.jinja").unlink()

    model = AutoModelForSequenceClassification.from_pretrained(
        out, dtype=torch.float32, attn_implementation="eager").float().eval()
    assert type(model) is Qwen3ForSequenceClassification
    hf_tok = AutoTokenizer.from_pretrained(out)
    pairs = []
    for q, d in rerank_pairs():
        ids = pair_ids(hf_tok, tok, q, d)
        with torch.no_grad():
            logit = float(model(torch.tensor([ids])).logits[0, 0])
        pairs.append({"query": q, "document": d, "ids": ids, "logit": logit,
                      "score": 1.0 / (1.0 + math.exp(-logit))})
    scores = [p["score"] for p in pairs]
    check_spread(name, scores)

    ce = CrossEncoder(str(out), device="cpu")
    assert list(ce[0].modality_config) == ["text"], ce[0].modality_config
    assert isinstance(ce.activation_fn, torch.nn.Sigmoid), ce.activation_fn
    got = ce.predict([(p["query"], p["document"]) for p in pairs], batch_size=8)
    diff = max(abs(float(g) - s) for g, s in zip(got, scores))
    print(f"  {name}: CrossEncoder.predict (batches of 8, padded) vs sigmoid(logit): {diff:.1e}")
    assert diff < TOL, diff
    golden = {"model": name, "kind": "sequence-classification", "pairs": pairs}
    (out / "golden_scores.json").write_text(json.dumps(golden) + "\n")


def make_qwen3_reranker(tok) -> None:
    name = "tiny-qwen3-reranker"
    for word in ("yes", "no"):
        assert len(tok.encode(word).ids) > 1, word
    label_ids = []
    for word in (NO_WORD, YES_WORD):
        ids = tok.encode(word).ids
        assert len(ids) == 1, (word, ids)
        label_ids += ids
    id_no, id_yes = label_ids

    def formatted(q, d):
        return (RERANK_PREFIX + "<Instruct>: " + RERANK_INSTRUCTION + "\n<Query>: " + q + "\n",
                "<Document>: " + d + RERANK_SUFFIX)

    out = base.fresh_dir(name)
    torch.manual_seed(base.SEED)
    model = Qwen3ForCausalLM(qwen3_config(max_position_embeddings=RERANK_MAX_POSITIONS))
    base.randomize(model, base.COMMON["initializer_range"], base.SEED + 33)
    model.eval()
    with torch.no_grad():
        hidden = torch.stack([model.model(torch.tensor([tok.encode(qt).ids + tok.encode(dt).ids]))
                              .last_hidden_state[0, -1] for qt, dt in (formatted(q, d) for q, d in rerank_pairs())])
        w = model.lm_head.weight
        m, c = spread(hidden, w[id_yes] - w[id_no])
        w[id_yes], w[id_no] = c * (w[id_yes] - m / 2), c * (w[id_no] + m / 2)
    model.save_pretrained(out, safe_serialization=True)
    base.save_tokenizer(tok, out)
    edit_json(out / "tokenizer_config.json", lambda c: c.update(model_max_length=RERANK_MAX_POSITIONS))
    base.save_generation_config(out, base.IM_END_ID)

    model = AutoModelForCausalLM.from_pretrained(
        out, dtype=torch.float32, attn_implementation="eager").float().eval()
    assert type(model) is Qwen3ForCausalLM
    hf_tok = AutoTokenizer.from_pretrained(out)
    pairs = []
    for q, d in rerank_pairs():
        qt, dt = formatted(q, d)
        ids = pair_ids(hf_tok, tok, qt, dt)
        assert len(ids) <= RERANK_MAX_POSITIONS // 2, len(ids)
        with torch.no_grad():
            last = model(torch.tensor([ids])).logits[0, -1]
        l_no, l_yes = float(last[id_no]), float(last[id_yes])
        score = float(torch.softmax(torch.tensor([l_no, l_yes]), -1)[1])
        assert abs(score - 1.0 / (1.0 + math.exp(-(l_yes - l_no)))) < 1e-6
        pairs.append({"query": qt, "document": dt, "raw_query": q, "raw_document": d, "ids": ids,
                      "logit": l_yes - l_no, "score": score})
    check_spread(name, [p["score"] for p in pairs])
    lengths = [len(p["ids"]) for p in pairs]
    print(f"  {name}: labels {NO_WORD!r}={id_no} {YES_WORD!r}={id_yes}, {min(lengths)}..{max(lengths)} tokens")
    golden = {"model": name, "kind": "label-tokens", "labels": [NO_WORD, YES_WORD],
              "label_ids": [id_no, id_yes], "prefix": RERANK_PREFIX, "suffix": RERANK_SUFFIX,
              "instruction": RERANK_INSTRUCTION, "pairs": pairs}
    (out / "golden_scores.json").write_text(json.dumps(golden) + "\n")


FIXTURES = {
    "tiny-qwen3-embedding": make_qwen3_embedding,
    "tiny-llama-embedding-mean": make_llama_embedding_mean,
    "tiny-qwen3-reranker-seqcls": make_qwen3_reranker_seqcls,
    "tiny-qwen3-reranker": make_qwen3_reranker,
}


def main() -> None:
    print(f"sentence-transformers {sentence_transformers.__version__}")
    fam.run(FIXTURES)


if __name__ == "__main__":
    main()
