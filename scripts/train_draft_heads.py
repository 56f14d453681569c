#!/usr/bin/env python3
"""Train Medusa heads for SmolLM2-135M-Instruct on its own outputs (self-distillation).

Dev-only (torch and transformers from PyPI, Tessera's release binaries; well under an hour on two
cores); the heads it writes are committed with this script and its seed, so neither CI nor users
need Python for them:

    scripts/fetch_smollm2.sh && cargo build --release --bins
    HF_HUB_OFFLINE=1 /path/to/venv/bin/python scripts/train_draft_heads.py \
        [--gguf PATH] [--out fixtures/smollm2/medusa] [--prompts 2000] [--heads 3]

1. Chat prompts are composed from the task templates and topics below (nothing is downloaded), then
   split: training prompts, and held-out ones (other templates and topics) that the benchmark reads
   as `eval-prompts.jsonl`.
2. The model answers every prompt through its chat template, half greedily and half sampled
   (temperature 0.7, top-p 0.9), served by Tessera itself (`tessera-launcher` on loopback, which
   batches the answers far faster than transformers' generate loop on a CPU). Then transformers
   (from the GGUF, f32) reads each prompt and answer once and keeps the final hidden states of the
   answer (after the final norm, checked to give the model's own logits through the LM head).
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
import subprocess
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
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
    "Write a tweet about {t}.",
    "What would a beginner need to learn first about {t}?",
    "Compare {t} with something similar.",
    "Tell me a fun fact about {t}.",
    "What is the future of {t}?",
    "Write a haiku about {t}.",
    "Explain {t} step by step.",
    "What do experts say about {t}?",
    "Give a one-sentence definition of {t}.",
    "Why do people enjoy {t}?",
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
    "mountains", "rivers", "cities", "libraries", "museums", "vaccines", "the immune system",
    "bacteria", "atoms", "magnets", "light", "sound", "weather forecasts", "hurricanes",
    "glaciers", "coral reefs", "forests", "cats", "dogs", "horses", "birds", "butterflies",
    "spiders", "whales", "sharks", "chocolate", "pizza", "rice", "vegetables", "fruit",
    "cheese", "soup", "birthday parties", "weddings", "holidays", "camping", "swimming",
    "running", "yoga", "basketball",
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


def serve(launcher: Path, gguf: Path, port: int):
    """Starts Tessera on loopback; returns the process once it answers."""
    proc = subprocess.Popen(
        [str(launcher), "--model-id", str(gguf), "--hostname", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 300
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                if r.status == 200:
                    return proc
        except OSError:
            time.sleep(1)
    proc.kill()
    raise SystemExit("tessera-launcher did not become healthy in 300 s")


def ask(port, prompt, new_tokens, sampled, seed):
    body = {
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": new_tokens,
        "temperature": 0.7 if sampled else 0.0,
        "top_p": 0.9 if sampled else 1.0,
        "seed": seed,
    }
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=600) as r:
        choice = json.load(r)["choices"][0]
    return choice["message"]["content"], choice["finish_reason"] == "stop"


def answers(port, prompts, new_tokens, seed):
    """Every prompt's answer text and whether it ended: even ones greedy, odd ones sampled."""
    with ThreadPoolExecutor(max_workers=32) as pool:
        futures = [
            pool.submit(ask, port, p, new_tokens, i % 2 == 1, seed + i)
            for i, p in enumerate(prompts)
        ]
        done = []
        for i, f in enumerate(futures):
            done.append(f.result())
            if (i + 1) % 200 == 0:
                print(f"  answered {i + 1}/{len(prompts)}", flush=True)
    return done


@torch.no_grad()
def hidden_states(tok, model, prompts, replies, batch):
    """(hidden states, following tokens) of every answer: hidden[i] precedes tokens[i]."""
    states, targets = [], []
    seqs = []
    for prompt, (text, ended) in zip(prompts, replies):
        p = chat_ids(tok, prompt)
        a = tok(text, add_special_tokens=False).input_ids + ([tok.eos_token_id] if ended else [])
        if a:
            seqs.append((p, a))
    checked = False
    for start in range(0, len(seqs), batch):
        part = seqs[start : start + batch]
        width = max(len(p) + len(a) for p, a in part)
        ids = torch.zeros(len(part), width, dtype=torch.long)
        mask = torch.zeros(len(part), width, dtype=torch.long)
        for b, (p, a) in enumerate(part):
            ids[b, : len(p) + len(a)] = torch.tensor(p + a)
            mask[b, : len(p) + len(a)] = 1
        hidden = model.model(input_ids=ids, attention_mask=mask).last_hidden_state
        if not checked:
            p, a = part[0]
            full = model(input_ids=ids[:1, : len(p) + len(a)]).logits[0, len(p) - 1]
            assert torch.allclose(model.lm_head(hidden[0, len(p) - 1]), full, atol=1e-3), (
                "hidden states are not the final ones"
            )
            checked = True
        for b, (p, a) in enumerate(part):
            states.append(hidden[b, len(p) - 1 : len(p) - 1 + len(a)].clone())
            targets.append(torch.tensor(a))
        print(f"  read {start + len(part)}/{len(seqs)}", flush=True)
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
    ap.add_argument("--prompts", type=int, default=2000)
    ap.add_argument("--eval-prompts", type=int, default=120)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--heads", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--read-batch", type=int, default=16)
    ap.add_argument("--launcher", type=Path, default=ROOT / "target" / "release" / "tessera-launcher")
    ap.add_argument("--port", type=int, default=3917)
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

    proc = serve(args.launcher, args.gguf, args.port)
    try:
        print(f"answering {len(train_prompts)} + {len(eval_prompts)} prompts", flush=True)
        replies = answers(args.port, train_prompts + eval_prompts, args.new_tokens, args.seed)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    answered = time.time()
    tok, model = load(args.gguf)
    lm_head = model.lm_head
    for p in model.parameters():
        p.requires_grad_(False)
    hidden = model.config.hidden_size
    n = len(train_prompts)
    states, targets = hidden_states(tok, model, train_prompts, replies[:n], args.read_batch)
    es, et = hidden_states(tok, model, eval_prompts, replies[n:], args.read_batch)
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
        "seconds_answering": round(answered - started),
        "seconds": round(time.time() - started),
    }
    (args.out / "training.json").write_text(json.dumps(report, indent=2) + "\n")
    with open(args.out / "eval-prompts.jsonl", "w") as f:
        for p in eval_prompts:
            f.write(json.dumps({"messages": [{"role": "user", "content": p}]}) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
