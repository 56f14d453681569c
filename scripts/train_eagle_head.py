#!/usr/bin/env python3
"""Train an EAGLE-style draft head for SmolLM2-135M-Instruct on its own outputs (self-distillation).

Dev-only, like `train_draft_heads.py` (whose prompts, serving and answering it shares): torch and
transformers from PyPI, Tessera's release binaries, well under an hour on two cores. The head it
writes is committed with this script and its seed.

    scripts/fetch_smollm2.sh && cargo build --release --bins
    HF_HUB_OFFLINE=1 /path/to/venv/bin/python scripts/train_eagle_head.py \
        [--gguf PATH] [--out fixtures/smollm2/eagle] [--prompts 2000]

The head follows EAGLE (Li et al. 2024): one decoder layer over `fc([embed(t_j) ; f_{j-1}])`, where
`f` is the target's final hidden state (after its final norm, what its LM head reads), without an
input norm; its output is read through the target's frozen LM head and trained to be the next
feature (smooth L1) and to give the target's next-token distribution (soft cross-entropy, weight
0.1). The pair at position j is (t_j, f_{j-1}) (position 0 takes a zero feature), so the draft's
K/V at a position depend on the tokens up to it only, like the target's. Like EAGLE-3's
training-time test, steps 2 and 3 feed the layer its own earlier outputs as features, attending to
real pairs before the tree and to their own chain, as proposing deeper nodes does.

1. Answers: as `train_draft_heads.py` (Tessera serving on loopback, half greedy, half sampled), kept
   in `--answers` so that a second run skips them.
2. transformers (from the GGUF, f32) reads every prompt + answer once for the final hidden states
   (kept next to the answers, as f16, for the same reason).
3. The layer starts small (normal, std 0.02) and `fc` passes the feature straight through, so the
   first guess of the next feature is the last one and the unrolled steps start stable.
4. Written in EAGLE's layout: `config.json` (the target's Llama configuration with one layer) and
   `model.safetensors` with `fc.weight`, `fc.bias`, `layers.0.*` (f16); `draft_vocab.json`, the
   most frequent tokens of the training sequences, most frequent first (FR-Spec: the head proposes
   only these); `training.json` records the seed, sizes, losses, the vocabulary's held-out
   coverage and held-out agreement with the target's greedy token per step.
"""

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from train_draft_heads import (  # noqa: E402
    EVAL_TASKS,
    EVAL_TOPICS,
    GGUF_NAME,
    ROOT,
    TRAIN_TASKS,
    TRAIN_TOPICS,
    answers,
    chat_ids,
    compose,
    load,
    serve,
)

STEPS = 3
STEP_WEIGHTS = [1.0, 0.8, 0.64]


@torch.no_grad()
def sequences(tok, model, prompts, replies, batch):
    """Per sequence (token ids, final hidden states as f16, index where the answer starts)."""
    seqs = []
    for prompt, (text, ended) in zip(prompts, replies):
        p = chat_ids(tok, prompt)
        a = tok(text, add_special_tokens=False).input_ids + ([tok.eos_token_id] if ended else [])
        if a:
            seqs.append((p + a, len(p)))
    out = []
    for start in range(0, len(seqs), batch):
        part = seqs[start : start + batch]
        width = max(len(ids) for ids, _ in part)
        ids = torch.zeros(len(part), width, dtype=torch.long)
        mask = torch.zeros(len(part), width, dtype=torch.long)
        for b, (s, _) in enumerate(part):
            ids[b, : len(s)] = torch.tensor(s)
            mask[b, : len(s)] = 1
        hidden = model.model(input_ids=ids, attention_mask=mask).last_hidden_state
        for b, (s, answer) in enumerate(part):
            out.append((torch.tensor(s), hidden[b, : len(s)].to(torch.float16), answer))
        if (start // batch) % 20 == 0:
            print(f"  read {start + len(part)}/{len(seqs)}", flush=True)
    return out


def rope_tables(cfg, positions):
    hd = cfg.head_dim if getattr(cfg, "head_dim", None) else cfg.hidden_size // cfg.num_attention_heads
    inv = 1.0 / (cfg.rope_parameters["rope_theta"] ** (torch.arange(0, hd, 2).float() / hd))
    freqs = positions.float()[:, None] * inv[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def rotate(x, cos, sin):
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class EagleLayer(torch.nn.Module):
    def __init__(self, cfg):
        super().__init__()
        h = cfg.hidden_size
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.hd = h // self.heads
        self.eps = cfg.rms_norm_eps
        self.fc = torch.nn.Linear(2 * h, h, bias=True)
        with torch.no_grad():
            # The feature passes straight through at first: the next feature starts as the last.
            self.fc.weight[:, h:] = torch.eye(h)
            self.fc.weight[:, :h].normal_(0.0, 0.02)
            self.fc.bias.zero_()
        inter = cfg.intermediate_size
        normal = lambda *shape: torch.nn.Parameter(torch.randn(*shape) * 0.02)  # noqa: E731
        self.q = normal(self.heads * self.hd, h)
        self.k = normal(self.kv_heads * self.hd, h)
        self.v = normal(self.kv_heads * self.hd, h)
        self.o = normal(h, self.heads * self.hd)
        self.norm = torch.nn.Parameter(torch.ones(h))
        self.gate, self.up, self.down = normal(inter, h), normal(inter, h), normal(h, inter)

    def project(self, emb, feat, cos, sin):
        """The pair's input state and its rotated q, k and v, `[batch, heads, time, hd]`."""
        x = self.fc(torch.cat([emb, feat], dim=-1))
        b, t, _ = x.shape
        q = (x @ self.q.T).view(b, t, self.heads, self.hd).transpose(1, 2)
        k = (x @ self.k.T).view(b, t, self.kv_heads, self.hd).transpose(1, 2)
        v = (x @ self.v.T).view(b, t, self.kv_heads, self.hd).transpose(1, 2)
        rep = self.heads // self.kv_heads
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        return x, rotate(q, cos, sin), rotate(k, cos, sin), v

    def finish(self, x, attended):
        b, _, t, _ = attended.shape
        x = x + attended.transpose(1, 2).reshape(b, t, -1) @ self.o.T
        n = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.norm
        return x + (F.silu(n @ self.gate.T) * (n @ self.up.T)) @ self.down.T


def shifted(x, by):
    """`x` moved `by` places later along time (zeros enter first)."""
    if by == 0:
        return x
    pad = torch.zeros_like(x[:, :by])
    return torch.cat([pad, x[:, :-by]], dim=1)


def unrolled(layer, emb, feat, lengths, cos, sin, steps):
    """The layer's outputs at every position for steps 1..`steps`: step 1 reads the target's
    features; step s reads step s-1's outputs one place earlier and attends to real pairs up to
    `s - 1` places back and to its own chain (one key of each earlier step) after them."""
    b, t, _ = emb.shape
    scale = layer.hd ** -0.5
    pos = torch.arange(t)
    valid = pos[None, :] < lengths[:, None]  # [b, t] keys that exist
    outs, chain = [], []
    x, q, k1, v1 = layer.project(emb, feat, cos, sin)
    real_k, real_v = k1, v1
    for s in range(1, steps + 1):
        if s > 1:
            x, q, k, v = layer.project(emb, shifted(outs[-1], 1), cos, sin)
            chain.append((k, v))
        # Real keys at positions <= j - s + 1.
        allowed = (pos[None, :] <= pos[:, None] - (s - 1))[None, None] & valid[:, None, None, :]
        scores = (q @ real_k.transpose(-1, -2)) * scale
        scores = scores.masked_fill(~allowed, float("-inf"))
        parts_s, parts_v = [scores], [None]
        # Chain key of step s' (2..s) sits s - s' places back.
        for i, (ck, cv) in enumerate(chain):
            back = len(chain) - 1 - i
            ck, cv = shifted_heads(ck, back), shifted_heads(cv, back)
            parts_s.append(((q * ck).sum(-1, keepdim=True)) * scale)
            parts_v.append(cv)
        probs = torch.softmax(torch.cat(parts_s, dim=-1), dim=-1).nan_to_num(0.0)
        attended = probs[..., :t] @ real_v
        for i, cv in enumerate(parts_v[1:]):
            attended = attended + probs[..., t + i : t + i + 1] * cv
        outs.append(layer.finish(x, attended))
    return outs


def shifted_heads(x, by):
    if by == 0:
        return x
    pad = torch.zeros_like(x[:, :, :by])
    return torch.cat([pad, x[:, :, :-by]], dim=2)


def batches(data, size, gen=None):
    order = torch.randperm(len(data), generator=gen).tolist() if gen is not None else range(len(data))
    order = list(order)
    for i in range(0, len(order), size):
        yield [data[j] for j in order[i : i + size]]


def collate(part, embed, noise, gen):
    t = max(len(ids) for ids, _, _ in part)
    h = part[0][1].shape[1]
    ids = torch.zeros(len(part), t, dtype=torch.long)
    feats = torch.zeros(len(part), t, h)
    answer = torch.zeros(len(part), t, dtype=torch.bool)
    lengths = torch.tensor([len(s) for s, _, _ in part])
    for b, (s, f, a) in enumerate(part):
        ids[b, : len(s)] = s
        feats[b, : len(s)] = f.float()
        answer[b, a - 1 : len(s)] = True
    emb = embed(ids)
    inputs = shifted(feats, 1)
    if noise > 0:
        scale = inputs.pow(2).mean(-1, keepdim=True).sqrt()
        inputs = inputs + (torch.rand(inputs.shape, generator=gen) * 2 - 1) * noise * scale
    return emb, inputs, feats, answer, lengths


def losses(layer, lm_head, part, embed, cfg, noise, gen):
    emb, inputs, feats, answer, lengths = collate(part, embed, noise, gen)
    t = emb.shape[1]
    cos, sin = rope_tables(cfg, torch.arange(t))
    outs = unrolled(layer, emb, inputs, lengths, cos, sin, STEPS)
    pos = torch.arange(t)
    present = pos[None, :] < lengths[:, None]
    with torch.no_grad():
        target_logp = torch.log_softmax(lm_head(feats[answer]), dim=-1)
        target_p = target_logp.exp()
        greedy = target_logp.argmax(-1)
    total, per_step = 0.0, []
    for s, out in enumerate(outs, start=1):
        usable = present & (pos[None, :] >= s - 1)
        reg = F.smooth_l1_loss(out[usable], feats[usable])
        pick = usable[answer]
        logp = torch.log_softmax(lm_head(out[answer][pick]), dim=-1)
        cls = -(target_p[pick] * logp).sum(-1).mean()
        hits = (logp.argmax(-1) == greedy[pick]).float().sum().item()
        total = total + STEP_WEIGHTS[s - 1] * (reg + 0.1 * cls)
        per_step.append((reg.item(), cls.item(), hits, int(pick.sum().item())))
    return total, per_step


def load_layer(cfg, path):
    from safetensors.torch import load_file

    tensors = {k: v.float() for k, v in load_file(path).items()}
    layer = EagleLayer(cfg)
    with torch.no_grad():
        layer.fc.weight.copy_(tensors["fc.weight"])
        layer.fc.bias.copy_(tensors["fc.bias"])
        for mine, theirs in [
            ("q", "self_attn.q_proj"), ("k", "self_attn.k_proj"), ("v", "self_attn.v_proj"),
            ("o", "self_attn.o_proj"), ("norm", "post_attention_layernorm"),
            ("gate", "mlp.gate_proj"), ("up", "mlp.up_proj"), ("down", "mlp.down_proj"),
        ]:
            getattr(layer, mine).copy_(tensors[f"layers.0.{theirs}.weight"])
    return layer


@torch.no_grad()
def write_parity(out_dir, layer, embed, cfg, seq, positions=24):
    """Inputs and step-1 outputs of the saved (f16) layer over one held-out sequence, for the
    engine's test that its pass matches this script's."""
    ids, feats, _ = seq
    ids, feats = ids[:positions], feats[:positions].float()
    inputs = shifted(feats[None], 1)
    cos, sin = rope_tables(cfg, torch.arange(len(ids)))
    out = unrolled(layer, embed(ids[None]), inputs, torch.tensor([len(ids)]), cos, sin, 1)[0][0]
    parity = {
        "tokens": ids.tolist(),
        "features": [[round(x, 6) for x in row] for row in inputs[0].tolist()],
        "outputs": [[round(x, 6) for x in row] for row in out.tolist()],
    }
    (out_dir / "parity.json").write_text(json.dumps(parity) + "\n")


def main():
    ap = argparse.ArgumentParser()
    cache = Path(os.environ.get("TESSERA_CACHE", Path.home() / ".cache" / "tessera"))
    ap.add_argument("--gguf", type=Path, default=cache / GGUF_NAME)
    ap.add_argument("--out", type=Path, default=ROOT / "fixtures" / "smollm2" / "eagle")
    ap.add_argument("--answers", type=Path, default=cache / "draft-head-answers.json")
    ap.add_argument("--prompts", type=int, default=2000)
    ap.add_argument("--eval-prompts", type=int, default=120)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--noise", type=float, default=0.05)
    ap.add_argument("--draft-vocab", type=int, default=8192)
    ap.add_argument("--read-batch", type=int, default=16)
    ap.add_argument("--launcher", type=Path, default=ROOT / "target" / "release" / "tessera-launcher")
    ap.add_argument("--port", type=int, default=3918)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument(
        "--parity-only", action="store_true",
        help="only rewrite parity.json for the head already in --out",
    )
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    started = time.time()
    rng = random.Random(args.seed)
    train_prompts = compose(TRAIN_TASKS, TRAIN_TOPICS)
    rng.shuffle(train_prompts)
    train_prompts = train_prompts[: args.prompts]
    eval_prompts = compose(EVAL_TASKS, EVAL_TOPICS)
    rng.shuffle(eval_prompts)
    eval_prompts = eval_prompts[: args.eval_prompts]
    prompts = train_prompts + eval_prompts

    key = {"prompts": prompts, "new_tokens": args.new_tokens, "seed": args.seed}
    replies = None
    if args.answers.exists():
        saved = json.loads(args.answers.read_text())
        if saved.get("key") == key:
            replies = [tuple(r) for r in saved["replies"]]
            print(f"answers from {args.answers}", flush=True)
    if replies is None:
        proc = serve(args.launcher, args.gguf, args.port)
        try:
            print(f"answering {len(prompts)} prompts", flush=True)
            replies = answers(args.port, prompts, args.new_tokens, args.seed)
        finally:
            proc.terminate()
            proc.wait(timeout=60)
        args.answers.parent.mkdir(parents=True, exist_ok=True)
        args.answers.write_text(json.dumps({"key": key, "replies": replies}))
    answered = time.time()

    tok, model = load(args.gguf)
    for p in model.parameters():
        p.requires_grad_(False)
    cfg = model.config
    n = len(train_prompts)
    if args.parity_only:
        eval_data = sequences(tok, model, eval_prompts[:1], replies[n : n + 1], 1)
        layer = load_layer(cfg, args.out / "model.safetensors")
        write_parity(args.out, layer, model.model.embed_tokens, cfg, eval_data[0])
        return
    states = args.answers.with_suffix(".states.pt")
    saved = torch.load(states) if states.exists() else None
    if saved is not None and saved.get("key") == key:
        train_data, eval_data = saved["train"], saved["eval"]
        print(f"hidden states from {states}", flush=True)
    else:
        train_data = sequences(tok, model, train_prompts, replies[:n], args.read_batch)
        eval_data = sequences(tok, model, eval_prompts, replies[n:], args.read_batch)
        torch.save({"key": key, "train": train_data, "eval": eval_data}, states)
    read = time.time()
    embed, lm_head = model.model.embed_tokens, model.lm_head
    layer = EagleLayer(cfg)
    opt = torch.optim.AdamW(layer.parameters(), lr=args.lr, weight_decay=0.0)
    steps = args.epochs * ((len(train_data) + args.batch - 1) // args.batch)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=args.lr, total_steps=steps)
    gen = torch.Generator().manual_seed(args.seed)
    tokens = sum(len(s) for s, _, _ in train_data)
    print(f"training on {len(train_data)} sequences, {tokens} tokens, {steps} steps", flush=True)
    done = 0
    for epoch in range(args.epochs):
        for part in batches(train_data, args.batch, gen):
            loss, per_step = losses(layer, lm_head, part, embed, cfg, args.noise, gen)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            done += 1
            if done % 10 == 0 or done == steps:
                acc = [round(h / max(c, 1), 3) for _, _, h, c in per_step]
                print(f"  step {done}/{steps}: loss {loss.item():.3f} agreement {acc}", flush=True)

    with torch.no_grad():
        sums = [[0.0, 0.0, 0, 0] for _ in range(STEPS)]
        for part in batches(eval_data, args.batch):
            _, per_step = losses(layer, lm_head, part, embed, cfg, 0.0, None)
            for s, (reg, cls, hits, count) in enumerate(per_step):
                sums[s][0] += reg * count
                sums[s][1] += cls * count
                sums[s][2] += hits
                sums[s][3] += count
    agreement = [round(s[2] / max(s[3], 1), 4) for s in sums]
    print(f"held-out agreement with the target's greedy token per step: {agreement}", flush=True)

    # FR-Spec's frequency-ranked draft vocabulary: the head proposes only the tokens the
    # model's answers use most, so each of its rounds reads that many rows of the LM head.
    counts = torch.bincount(torch.cat([s for s, _, _ in train_data]), minlength=cfg.vocab_size)
    draft_vocab = torch.argsort(counts, descending=True, stable=True)[: args.draft_vocab]
    inside = torch.zeros(cfg.vocab_size, dtype=torch.bool)
    inside[draft_vocab] = True
    held_out = torch.cat([s[a:] for s, _, a in eval_data])
    coverage = inside[held_out].float().mean().item()
    print(f"draft vocabulary of {args.draft_vocab} covers {coverage:.4f} of held-out answers")

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "draft_vocab.json").write_text(json.dumps(draft_vocab.tolist()) + "\n")
    half = lambda w: w.detach().to(torch.float16).contiguous()  # noqa: E731
    tensors = {
        "fc.weight": half(layer.fc.weight),
        "fc.bias": half(layer.fc.bias),
        "layers.0.self_attn.q_proj.weight": half(layer.q),
        "layers.0.self_attn.k_proj.weight": half(layer.k),
        "layers.0.self_attn.v_proj.weight": half(layer.v),
        "layers.0.self_attn.o_proj.weight": half(layer.o),
        "layers.0.post_attention_layernorm.weight": half(layer.norm),
        "layers.0.mlp.gate_proj.weight": half(layer.gate),
        "layers.0.mlp.up_proj.weight": half(layer.up),
        "layers.0.mlp.down_proj.weight": half(layer.down),
    }
    save_file(tensors, args.out / "model.safetensors")
    with torch.no_grad():
        for name, param in layer.named_parameters():
            param.copy_(param.to(torch.float16).float())
    write_parity(args.out, layer, embed, cfg, eval_data[0])
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "num_hidden_layers": 1,
        "rms_norm_eps": cfg.rms_norm_eps,
        "vocab_size": cfg.vocab_size,
        "hidden_act": "silu",
        "bias": True,
        "base_model_name_or_path": "HuggingFaceTB/SmolLM2-135M-Instruct",
    }
    (args.out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    report = {
        "script": "scripts/train_eagle_head.py",
        "seed": args.seed,
        "train_sequences": len(train_data),
        "train_tokens": tokens,
        "epochs": args.epochs,
        "batch": args.batch,
        "lr": args.lr,
        "noise": args.noise,
        "held_out_agreement_per_step": agreement,
        "draft_vocab": args.draft_vocab,
        "draft_vocab_held_out_coverage": round(coverage, 4),
        "held_out_smooth_l1_per_step": [round(s[0] / max(s[3], 1), 4) for s in sums],
        "seconds_answering": round(answered - started),
        "seconds_reading": round(read - answered),
        "seconds": round(time.time() - started),
    }
    (args.out / "training.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
