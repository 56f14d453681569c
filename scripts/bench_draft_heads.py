#!/usr/bin/env python3
"""Served decode with and without speculation on ordinary chat prompts (stdlib only).

Against a running Tessera server on loopback: the held-out chat prompts the heads never saw
(`fixtures/smollm2/medusa/eval-prompts.jsonl`), greedy, 64 new tokens, at each concurrency.
Prints output tokens/s (all completion tokens over the wall time of the batch) and, when the
server speculates, the mean tokens accepted per
speculative step (from the `tessera_speculative_accepted_tokens_total` counter: every step after
a request's first token yields its accepted candidates plus one token).

Usage: scripts/bench_draft_heads.py PORT [CONCURRENCY ...]   (default: 1 8)
Run it against servers started alternately with --speculate 0, the n-gram speculator,
--speculator medusa and --speculator eagle, on the same machine, and compare.
"""

import json
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = ROOT / "fixtures" / "smollm2" / "medusa" / "eval-prompts.jsonl"
NEW_TOKENS = 64


def post(port, path, body):
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.load(r)


def accepted_total(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
        text = r.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith("tessera_speculative_accepted_tokens_total"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def one(port, messages):
    body = {"messages": messages, "max_tokens": NEW_TOKENS, "temperature": 0.0}
    return post(port, "/v1/chat/completions", body)["usage"]["completion_tokens"]


def run(port, prompts, concurrency):
    before = accepted_total(port)
    start = time.time()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        tokens = list(pool.map(lambda m: one(port, m), prompts))
    wall = time.time() - start
    accepted = accepted_total(port) - before
    # Tokens after each request's first, each speculative step giving accepted + 1 of them.
    later = sum(tokens) - len(tokens)
    steps = later - accepted
    per_step = accepted / steps if steps > 0 else 0.0
    print(
        f"concurrency {concurrency}: {len(prompts)} requests, {sum(tokens)} tokens in {wall:.1f} s "
        f"= {sum(tokens) / wall:.1f} output tok/s; accepted per step {per_step:.2f} "
        f"(tokens per step {1 + per_step:.2f})",
        flush=True,
    )


def main():
    port = int(sys.argv[1])
    levels = [int(c) for c in sys.argv[2:]] or [1, 8]
    prompts = [json.loads(line)["messages"] for line in PROMPTS.read_text().splitlines()]
    one(port, prompts[0])  # warm up
    for c in levels:
        run(port, prompts[: 16 if c == 1 else 48], c)


if __name__ == "__main__":
    main()
