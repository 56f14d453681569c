#!/usr/bin/env python3
"""Train Medusa heads for SmolLM2-135M-Instruct on its own outputs (self-distillation).

Dev-only (torch from PyPI, a few minutes of CPU time per thousand prompts); the heads it writes are
committed with this script and its seed, so neither CI nor users need Python for them:

    scripts/fetch_smollm2.sh
    HF_HUB_OFFLINE=1 /path/to/venv/bin/python scripts/train_draft_heads.py \
        [--gguf PATH] [--out fixtures/smollm2/medusa] [--prompts 1200] [--heads 3]

1. Chat prompts are composed from the task templates and topics below (nothing is downloaded), then
   split: training prompts, and held-out ones (other templates and topics) that the benchmark reads
   as `eval-prompts.jsonl`.
2. The model (transformers, from the GGUF, f32) answers every training prompt through its chat
   template, half greedily and half sampled (temperature 0.7, top-p 0.9); the final hidden states
   of the answers (after the final norm, checked to give the model's own logits through the LM
   head) are kept.
3. Head k is Medusa's residual block x + SiLU(W x + b), read through the model's frozen LM head
   (its tied embeddings): trained with cross-entropy to predict the answer's token k + 2 places
   after each hidden state. W starts at zero, so every head starts as the model's own next-token
   guess.
4. Written in Medusa's layout (config.json, medusa_lm_head.safetensors with `{k}.0.linear.weight`
   and `.bias`, f16), with training.json: the seed, the data sizes, the loss and the held-out top-1
   accuracy of every head.
"""

import argparse
import json
import os
import random
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

TRAIN_TASKS = [
    "Explain {t} in simple terms.",
    "What are three interesting facts about {t}?",
    "Write a short paragraph about {t}.",
    "Why is {t} important?",
    "Give me some tips related to {t}.",
    "How would you describe {t} to a child?",
    "What is the history of {t}?",
    "List the main ideas behind {t}.",
    "Write a short poem about {t}.",
    "What are common misconceptions about {t}?",
    "Summarize what people should know about {t}.",
    "Can you tell me about {t}?",
    "What are the pros and cons of {t}?",
    "Write an email to a friend about {t}.",
    "How does {t} affect everyday life?",
]
EVAL_TASKS = [
    "Teach me the basics of {t}.",
    "What questions do people often ask about {t}?",
    "Describe {t} in a few sentences.",
    "Write a brief story involving {t}.",
]
TRAIN_TOPICS = [
    "photosynthesis", "the water cycle", "volcanoes", "the solar system", "gravity",
    "electricity", "the human heart", "sleep", "exercise", "healthy eating", "coffee", "tea",
    "bread baking", "gardening", "bees", "dolphins", "elephants", "rainforests", "deserts",
    "the ocean", "climate", "recycling", "renewable energy", "the internet", "computers",
    "programming", "smartphones", "social media", "reading books", "learning a language",
    "music", "painting", "photography", "chess", "football", "the Olympic Games", "travel",
    "trains", "airplanes", "bicycles", "the Roman Empire", "ancient Egypt", "the printing press",
    "democracy", "money", "saving money", "starting a business", "teamwork", "friendship",
    "time management", "public speaking", "meditation", "the moon", "stars", "dinosaurs",
    "mountains", "rivers", "cities", "libraries", "museums",
]
EVAL_TOPICS = [
    "rainbows", "honey", "owls", "bridges", "clocks", "cooking pasta", "the Great Wall of China",
    "writing a resume", "penguins", "earthquakes", "hiking", "jazz", "the microscope", "kites",
    "snow", "lighthouses", "board games", "volunteering", "maps", "the telephone",
]


def compose(tasks, topics):
    return [task.format(t=topic) for task in tasks for topic in topics]


def load(gguf: Path):
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    model.eval()
    return tok, model


def chat_ids(tok, text):
    rendered = tok.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
    )
    return tok(rendered, add_special_tokens=False).input_ids


@torch.no_grad()
def answer(tok, model, prompts, new_tokens, batch, sampled, seed):
    """(hidden states, following tokens) of every answer: hidden[i] precedes tokens[i]."""
    states, targets = [], []
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    for start in range(0, len(prompts), batch):
        ids = [chat_ids(tok, p) for p in prompts[start : start + batch]]
        width = max(len(x) for x in ids)
        input_ids = torch.tensor([[pad] * (width - len(x)) + x for x in ids])
        mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids])
        torch.manual_seed(seed + start)
        out = model.generate(
            input_ids=input_ids,
            attention_mask=mask,
            max_new_tokens=new_tokens,
            do_sample=sampled,
            temperature=0.7 if sampled else None,
            top_p=0.9 if sampled else None,
            top_k=None,
            pad_token_id=pad,
            output_hidden_states=True,
            output_logits=True,
            return_dict_in_generate=True,
        )
        gen = out.sequences[:, width:]
        # hidden_states[step][-1]: the final (normed) states of that step's inputs; the last
        # input of step s is the token before generated token s.
        hidden = torch.stack([h[-1][:, -1, :] for h in out.hidden_states], dim=1)
        check = model.lm_head(hidden[:, :1, :]).squeeze(1)
        assert torch.allclose(check, out.logits[0], atol=1e-3), "hidden states are not final"
        for b in range(gen.shape[0]):
            row = gen[b].tolist()
            n = len(row)
            if tok.eos_token_id in row:
                n = row.index(tok.eos_token_id) + 1
            states.append(hidden[b, :n].clone())
            targets.append(torch.tensor(row[:n]))
        print(f"  answered {start + len(ids)}/{len(prompts)}", flush=True)
    return states, targets


def head_examples(states, targets, heads):
    """Per head k, (state rows, target tokens) with target k + 2 places after the state."""
    out = []
    for k in range(heads):
        xs, ys = [], []
        for h, t in zip(states, targets):
            # State i precedes token i; head k predicts token i + k + 1.
            n = len(t) - (k + 1)
            if n > 0:
                xs.append(h[:n])
                ys.append(t[k + 1 : k + 1 + n])
        out.append((torch.cat(xs), torch.cat(ys)))
    return out


def head_logits(w, b, x, lm_head):
    return lm_head(x + torch.nn.functional.silu(x @ w.T + b))


def train(examples, lm_head, hidden, epochs, batch, lr, seed):
    gen = torch.Generator().manual_seed(seed)
    params = []
    losses = []
    for k, (x, y) in enumerate(examples):
        w = torch.zeros(hidden, hidden, requires_grad=True)
        b = torch.zeros(hidden, requires_grad=True)
        opt = torch.optim.AdamW([w, b], lr=lr, weight_decay=0.0)
        steps = epochs * ((len(y) + batch - 1) // batch)
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps)
        step = 0
        for epoch in range(epochs):
            order = torch.randperm(len(y), generator=gen)
            total = 0.0
            for i in range(0, len(y), batch):
                idx = order[i : i + batch]
                loss = torch.nn.functional.cross_entropy(
                    head_logits(w, b, x[idx], lm_head), y[idx]
                )
                opt.zero_grad()
                loss.backward()
                opt.step()
                sched.step()
                step += 1
                total += loss.item() * len(idx)
            print(f"  head {k} epoch {epoch}: loss {total / len(y):.3f}", flush=True)
        losses.append(total / len(y))
        params.append((w.detach(), b.detach()))
    return params, losses


@torch.no_grad()
def top1(params, examples, lm_head):
    acc = []
    for (w, b), (x, y) in zip(params, examples):
        hits = 0
        for i in range(0, len(y), 512):
            pred = head_logits(w, b, x[i : i + 512], lm_head).argmax(-1)
            hits += (pred == y[i : i + 512]).sum().item()
        acc.append(hits / len(y))
    return acc


def main():
    ap = argparse.ArgumentParser()
    cache = Path(os.environ.get("TESSERA_CACHE", Path.home() / ".cache" / "tessera"))
    ap.add_argument("--gguf", type=Path, default=cache / GGUF_NAME)
    ap.add_argument("--out", type=Path, default=ROOT / "fixtures" / "smollm2" / "medusa")
    ap.add_argument("--prompts", type=int, default=1200)
    ap.add_argument("--eval-prompts", type=int, default=120)
    ap.add_argument("--new-tokens", type=int, default=96)
    ap.add_argument("--heads", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--gen-batch", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    started = time.time()
    rng = random.Random(args.seed)
    train_prompts = compose(TRAIN_TASKS, TRAIN_TOPICS)
    rng.shuffle(train_prompts)
    train_prompts = train_prompts[: args.prompts]
    eval_prompts = compose(EVAL_TASKS, EVAL_TOPICS)
    rng.shuffle(eval_prompts)
    eval_prompts = eval_prompts[: args.eval_prompts]

    tok, model = load(args.gguf)
    lm_head = model.lm_head
    for p in model.parameters():
        p.requires_grad_(False)
    hidden = model.config.hidden_size
    half = len(train_prompts) // 2
    print(f"answering {len(train_prompts)} prompts", flush=True)
    states, targets = answer(
        tok, model, train_prompts[:half], args.new_tokens, args.gen_batch, False, args.seed
    )
    s2, t2 = answer(
        tok, model, train_prompts[half:], args.new_tokens, args.gen_batch, True, args.seed
    )
    states += s2
    targets += t2
    print(f"answering {len(eval_prompts)} held-out prompts", flush=True)
    es, et = answer(tok, model, eval_prompts, args.new_tokens, args.gen_batch, False, args.seed)
    examples = head_examples(states, targets, args.heads)
    held_out = head_examples(es, et, args.heads)
    tokens = sum(len(t) for t in targets)
    print(f"training {args.heads} heads on {tokens} answer tokens", flush=True)
    params, losses = train(
        examples, lm_head, hidden, args.epochs, args.batch, args.lr, args.seed
    )
    accuracy = top1(params, held_out, lm_head)
    baseline = top1(
        [(torch.zeros(hidden, hidden), torch.zeros(hidden))] * args.heads, held_out, lm_head
    )
    print(f"held-out top-1 per head: {accuracy} (untrained: {baseline})", flush=True)

    args.out.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for k, (w, b) in enumerate(params):
        tensors[f"{k}.0.linear.weight"] = w.to(torch.float16).contiguous()
        tensors[f"{k}.0.linear.bias"] = b.to(torch.float16).contiguous()
    save_file(tensors, args.out / "medusa_lm_head.safetensors")
    config = {
        "medusa_num_heads": args.heads,
        "medusa_num_layers": 1,
        "base_model_name_or_path": "HuggingFaceTB/SmolLM2-135M-Instruct",
    }
    (args.out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    report = {
        "script": "scripts/train_draft_heads.py",
        "seed": args.seed,
        "train_prompts": len(train_prompts),
        "answer_tokens": tokens,
        "new_tokens": args.new_tokens,
        "epochs": args.epochs,
        "batch": args.batch,
        "lr": args.lr,
        "final_loss": [round(x, 4) for x in losses],
        "held_out_top1": [round(x, 4) for x in accuracy],
        "held_out_top1_untrained": [round(x, 4) for x in baseline],
        "seconds": round(time.time() - started),
    }
    (args.out / "training.json").write_text(json.dumps(report, indent=2) + "\n")
    with open(args.out / "eval-prompts.jsonl", "w") as f:
        for p in eval_prompts:
            f.write(json.dumps({"messages": [{"role": "user", "content": p}]}) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
