#!/usr/bin/env python3
"""Soak run (not in CI): a long, mixed load against one real server, reporting what was lost.

Starts the launcher (release binaries by default) on a model, then for --minutes keeps
2 x --max-concurrent-requests clients busy: 10% of requests are cancelled (the client closes
the connection after the first streamed event), 10% are invalid (out-of-range parameters,
malformed JSON, unknown model), the rest are /generate, /generate_stream and
/v1/chat/completions (streamed and not), with a few requests carrying a short
X-Request-Timeout. It reports:

- requests lost: any that did not end in a success (a 200 with a complete body or stream)
  or a typed error (a JSON error naming its kind: `error_type`, or `error.code`/`error.type`
  under /v1), including transport errors and streams that stop without their last event;
- panics in the server's log;
- RSS of the router and of each shard, and the router's live heap (`tessera_router_heap_bytes`),
  sampled every --sample-seconds: each process's growth from the end of the warm-up
  (--warmup-minutes) to the end of the run, idle; the samples as soak.csv and, when matplotlib
  is installed, a plot of them as soak.png, beside the report soak.txt (in --out);
- and at the end, with no traffic, that no KV block is still in use.

The shard reserves its whole KV pool at start-up, so KV blocks used for the first time late in
a run do not show as growth. Stdlib only (matplotlib for the plot). Exit status 1 when anything
was lost, anything panicked, or a process's RSS grew --max-growth percent (1) or more.

    scripts/soak.py --model ~/.cache/tessera/SmolLM2-135M-Instruct.Q4_1.gguf --minutes 30 \
        --max-concurrent-requests 32 --out soak-smollm2
"""

import argparse
import asyncio
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def http(port, method, path, body=None, headers=None, raw=None, cancel_after_event=False):
    """One HTTP/1.1 request on its own connection. Returns (status, headers, body bytes,
    complete) where `complete` says the body arrived whole (Content-Length or chunked end)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else b"")
        head = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", "Connection: close",
                f"Content-Length: {len(data)}", "Content-Type: application/json"]
        head += [f"{k}: {v}" for k, v in (headers or {}).items()]
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + data)
        await writer.drain()
        status_line = await reader.readline()
        status = int(status_line.split()[1])
        hdrs = {}
        while True:
            line = await reader.readline()
            if line in (b"\r\n", b""):
                break
            k, _, v = line.decode().partition(":")
            hdrs[k.strip().lower()] = v.strip()
        out = b""
        complete = False
        if hdrs.get("transfer-encoding") == "chunked":
            while True:
                size_line = await reader.readline()
                if not size_line:
                    break
                size = int(size_line.strip() or b"0", 16)
                if size == 0:
                    await reader.readline()
                    complete = True
                    break
                out += await reader.readexactly(size)
                await reader.readexactly(2)
                if cancel_after_event and b"\n\n" in out:
                    return status, hdrs, out, False
        elif "content-length" in hdrs:
            out = await reader.readexactly(int(hdrs["content-length"]))
            complete = True
        else:
            out = await reader.read()
            complete = True
        return status, hdrs, out, complete
    finally:
        writer.close()


def typed_error(status, body, v1):
    """Whether a non-200 answer is a typed JSON error."""
    try:
        value = json.loads(body)
    except ValueError:
        return None
    if v1:
        err = value.get("error") if isinstance(value, dict) else None
        return isinstance(err, dict) and (err.get("code") or err.get("type")) or None
    return value.get("error_type") if isinstance(value, dict) else None


def sse_events(body):
    return [json.loads(line[5:]) for line in body.decode().splitlines()
            if line.startswith("data:") and line[5:].strip() not in ("", "[DONE]")]


def stream_outcome(body, v1):
    """`ok`, an error class, or None (lost) for a streamed body."""
    events = sse_events(body)
    if not events:
        return None
    last = events[-1]
    if "error" in last:
        return typed_error(200, json.dumps(last), v1)
    if v1:
        done = "[DONE]" in body.decode()
        return "ok" if done else None
    return "ok" if last.get("details") else None


class Load:
    def __init__(self, port, model_name, seed):
        self.port = port
        self.model = model_name
        self.rng = random.Random(seed)
        self.outcomes = Counter()
        self.lost = []
        self.refused_last = False

    def record(self, kind, outcome, detail):
        self.refused_last = outcome in ("overloaded", "rate_limit_exceeded")
        self.outcomes[(kind, outcome or "LOST")] += 1
        if outcome is None:
            self.lost.append(f"{kind}: {detail}")

    async def one(self):
        r = self.rng.random()
        max_new = self.rng.choice([8, 32, 64, 128])
        prompt = self.rng.choice(["Write a short poem about the sea.", "What is 2 + 2?",
                                  "List three colours.", "Tell me a story about a robot."])
        headers = {"X-Request-Timeout": "0.05"} if self.rng.random() < 0.02 else None
        try:
            if r < 0.10:
                await self.cancelled(prompt)
            elif r < 0.20:
                await self.invalid()
            elif r < 0.45:
                await self.native(prompt, max_new, stream=False, headers=headers)
            elif r < 0.70:
                await self.native(prompt, max_new, stream=True, headers=headers)
            else:
                await self.chat(prompt, max_new, stream=self.rng.random() < 0.5, headers=headers)
        except (OSError, asyncio.IncompleteReadError, ValueError, IndexError) as e:
            self.record("transport", None, repr(e))

    async def cancelled(self, prompt):
        body = {"inputs": prompt, "parameters": {"max_new_tokens": 200, "ignore_eos": True}}
        status, _, out, _ = await http(self.port, "POST", "/generate_stream", body,
                                       cancel_after_event=True)
        if status == 200:
            self.record("cancelled", "cancelled", "")
        else:
            self.record("cancelled", typed_error(status, out, False), f"{status} {out[:200]!r}")

    async def invalid(self):
        choice = self.rng.randrange(3)
        if choice == 0:
            status, _, out, _ = await http(self.port, "POST", "/generate",
                                           {"inputs": "hi", "parameters": {"temperature": -1}})
            v1 = False
        elif choice == 1:
            status, _, out, _ = await http(self.port, "POST", "/generate", raw=b"{not json")
            v1 = False
        else:
            status, _, out, _ = await http(self.port, "POST", "/v1/chat/completions",
                                           {"model": "no-such-model", "messages": []})
            v1 = True
        ok = 400 <= status < 500 and typed_error(status, out, v1)
        self.record("invalid", ok or None, f"{status} {out[:200]!r}")

    async def native(self, prompt, max_new, stream, headers):
        body = {"inputs": prompt, "parameters": {"max_new_tokens": max_new}}
        path = "/generate_stream" if stream else "/generate"
        status, _, out, complete = await http(self.port, "POST", path, body, headers)
        kind = "generate_stream" if stream else "generate"
        if status == 200 and stream:
            self.record(kind, stream_outcome(out, False), out[-300:])
        elif status == 200:
            ok = complete and "generated_text" in json.loads(out)
            self.record(kind, "ok" if ok else None, out[:200])
        else:
            self.record(kind, typed_error(status, out, False), f"{status} {out[:200]!r}")

    async def chat(self, prompt, max_new, stream, headers):
        body = {"model": self.model, "messages": [{"role": "user", "content": prompt}],
                "max_tokens": max_new, "stream": stream}
        status, _, out, complete = await http(self.port, "POST", "/v1/chat/completions", body,
                                              headers)
        kind = "chat_stream" if stream else "chat"
        if status == 200 and stream:
            self.record(kind, stream_outcome(out, True), out[-300:])
        elif status == 200:
            ok = complete and json.loads(out)["choices"][0]["finish_reason"] in ("stop", "length")
            self.record(kind, "ok" if ok else None, out[:200])
        else:
            self.record(kind, typed_error(status, out, True), f"{status} {out[:200]!r}")

    async def worker(self, until):
        while time.monotonic() < until:
            await self.one()
            if self.refused_last:
                # A client refused with 429 backs off a little, as a real one would.
                await asyncio.sleep(self.rng.uniform(0.01, 0.04))


RSS_FIELDS = {"VmRSS": "", "RssAnon": ".anon", "RssFile": ".file"}


def rss_kib(pid):
    """RSS in KiB, whole (VmRSS) and its anonymous and file-backed parts, by suffix."""
    found = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in RSS_FIELDS:
                found[RSS_FIELDS[key]] = int(value.split()[0])
    except OSError:
        pass
    return found


def server_children(launcher_pid):
    """The launcher's children (router and shards), by pid, named router, shard-0, shard-1…"""
    out = subprocess.run(["ps", "-o", "pid=,comm=", "--ppid", str(launcher_pid)],
                         capture_output=True, text=True, check=False).stdout
    pids = {int(p): c.strip() for p, c in (l.split(None, 1) for l in out.splitlines() if l.strip())}
    names, shards = {}, 0
    for pid, comm in sorted(pids.items()):
        if "router" in comm:
            names[pid] = "router"
        else:
            names[pid] = f"shard-{shards}"
            shards += 1
    return names


async def metrics(port, series):
    """The values of unlabelled `series` on /metrics, by name (None where absent)."""
    _, _, out, _ = await http(port, "GET", "/metrics")
    found = dict.fromkeys(series)
    for line in out.decode().splitlines():
        name, _, value = line.partition(" ")
        if name in found:
            found[name] = float(value.split()[0])
    return found


HEAP = "tessera_router_heap_bytes"
BLOCKS = "tessera_kv_blocks_used"


class Samples:
    """RSS per process and the router's live heap, over time (seconds since the load began)."""

    def __init__(self, children):
        self.children = children
        self.rows = []

    async def take(self, port, t):
        row = {"t": t}
        for pid, name in self.children.items():
            for suffix in RSS_FIELDS.values():
                row[name + suffix] = None
            for suffix, kib in rss_kib(pid).items():
                row[name + suffix] = kib
        row.update(await metrics(port, [HEAP, BLOCKS]))
        self.rows.append(row)
        return row

    def columns(self):
        parts = [n + s for n in sorted(self.children.values()) for s in RSS_FIELDS.values()]
        return ["t", *parts, HEAP, BLOCKS]

    def write_csv(self, path):
        cols = self.columns()
        with open(path, "w") as f:
            f.write(",".join(cols) + "\n")
            for r in self.rows:
                f.write(",".join("" if r.get(c) is None else f"{r[c]:g}" for c in cols) + "\n")

    def write_png(self, path, warm_s, title):
        """RSS per process and the router's heap over time; False without matplotlib."""
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            return False
        names = sorted(self.children.values())
        fig, axes = plt.subplots(len(names) + 1, 1, figsize=(9, 2.2 * (len(names) + 1)),
                                 sharex=True)
        minutes = [r["t"] / 60 for r in self.rows]
        series = [(f"{n} RSS", n, 1024) for n in names] + [("router live heap", HEAP, 2**20)]
        for ax, (label, key, unit) in zip(axes, series):
            ax.plot(minutes, [(r[key] or 0) / unit for r in self.rows], label=label)
            if key != HEAP:
                ax.plot(minutes, [(r.get(key + ".anon") or 0) / unit for r in self.rows],
                        label=f"{key} anonymous", linestyle="--")
            ax.set_ylabel("MiB")
            ax.legend(loc="lower right")
            ax.axvline(warm_s / 60, color="grey", linestyle=":", linewidth=1)
            ax.grid(alpha=0.3)
        axes[-1].set_xlabel("minutes of load (dotted: end of warm-up)")
        axes[0].set_title(title, fontsize=9)
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        return True


async def soak(args, port, launcher):
    load = Load(port, args.served_model_name, args.seed)
    start = time.monotonic()
    warm_until = start + args.warmup_minutes * 60
    end = start + args.minutes * 60
    workers = [asyncio.create_task(load.worker(end)) for _ in range(2 * args.max_concurrent_requests)]
    samples = Samples(server_children(launcher.pid))
    warm = None
    while time.monotonic() < end:
        now = time.monotonic()
        row = await samples.take(port, now - start)
        if warm is None and now >= warm_until:
            warm = row
        await asyncio.sleep(min(args.sample_seconds, max(0.0, end - time.monotonic())))
    await asyncio.gather(*workers)
    await asyncio.sleep(2)
    last = await samples.take(port, time.monotonic() - start)
    return load, samples, warm or samples.rows[0], last


def growth(before, after):
    return 100.0 * (after - before) / before if before else float("nan")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--served-model-name", default="soak")
    p.add_argument("--bin-dir", default=str(ROOT / "target/release"))
    p.add_argument("--minutes", type=float, default=10)
    p.add_argument("--warmup-minutes", type=float, default=2)
    p.add_argument("--max-concurrent-requests", type=int, default=16)
    p.add_argument("--sample-seconds", type=float, default=5)
    p.add_argument("--max-growth", type=float, default=1.0,
                   help="percent of RSS growth after warm-up allowed per process")
    p.add_argument("--out", help="folder for soak.txt, soak.csv and soak.png (default: the "
                   "run's temporary folder)")
    p.add_argument("--seed", type=int, default=27)
    p.add_argument("--extra-args", default="", help="more launcher flags, space-separated")
    args = p.parse_args()

    work = Path(tempfile.mkdtemp(prefix="tessera-soak-"))
    out = Path(args.out) if args.out else work
    out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log = open(work / "server.log", "w")
    command = [f"{args.bin_dir}/tessera-launcher", "--model-id", args.model,
               "--served-model-name", args.served_model_name, "--hostname", "127.0.0.1",
               "--port", str(port), "--shard-uds-path", str(work / "shard"),
               "--max-concurrent-requests", str(args.max_concurrent_requests)]
    command += args.extra_args.split()
    launcher = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        for _ in range(1200):
            try:
                status = asyncio.run(http(port, "GET", "/health"))[0]
                if status == 200:
                    break
            except OSError:
                pass
            if launcher.poll() is not None:
                sys.exit(f"the server exited: see {work / 'server.log'}")
            time.sleep(0.25)
        began = time.time()
        load, samples, warm, last = asyncio.run(soak(args, port, launcher))
        elapsed = time.time() - began
    finally:
        launcher.send_signal(signal.SIGTERM)
        launcher.wait(timeout=60)
        log.close()
    text = (work / "server.log").read_text(errors="replace")
    panics = len(re.findall(r"panicked at", text))
    total = sum(load.outcomes.values())
    names = sorted(samples.children.values())
    lines = [f"soak: {elapsed / 60:.1f} min, {total} requests, "
             f"{2 * args.max_concurrent_requests} clients (--max-concurrent-requests "
             f"{args.max_concurrent_requests}), model {args.model} {args.extra_args}".rstrip()]
    for (kind, outcome), n in sorted(load.outcomes.items()):
        lines.append(f"  {kind:16} {outcome:22} {n}")
    lines.append(f"lost: {len(load.lost)}")
    lines += [f"  {line}" for line in load.lost[:20]]
    lines.append(f"panics: {panics}")
    over = []
    lines.append(f"RSS after {warm['t'] / 60:.1f} min of load (warm) and at the end, idle:")
    for name in names:
        peak = max(r[name] or 0 for r in samples.rows)
        g = growth(warm[name], last[name]) if warm[name] and last[name] else float("nan")
        if not g < args.max_growth:
            over.append(name)
        lines.append(f"  {name:8} warm {warm[name] / 1024:8.1f} MiB, peak {peak / 1024:8.1f} MiB, "
                     f"end {last[name] / 1024:8.1f} MiB, growth {g:+.2f}% (bar < {args.max_growth}%)")
        parts = []
        for suffix, what in ((".anon", "anonymous"), (".file", "file-backed")):
            a, b = warm.get(name + suffix), last.get(name + suffix)
            if a is not None and b is not None:
                parts.append(f"{what} {a / 1024:.1f} -> {b / 1024:.1f} MiB ({(b - a) / 1024:+.2f})")
        if parts:
            lines.append(f"  {'':8} of which " + ", ".join(parts))
    if warm.get(HEAP) is not None and last.get(HEAP) is not None:
        lines.append(f"router live heap: warm {warm[HEAP] / 2**20:.2f} MiB, end (idle) "
                     f"{last[HEAP] / 2**20:.2f} MiB, growth {growth(warm[HEAP], last[HEAP]):+.2f}%")
    blocks = last.get(BLOCKS)
    lines.append(f"KV blocks in use when idle: {blocks}; server exit status {launcher.returncode}; "
                 f"log {work / 'server.log'}")
    samples.write_csv(out / "soak.csv")
    title = (f"{Path(args.model).name} {args.extra_args}: {total} requests in {elapsed / 60:.1f} "
             f"min, {2 * args.max_concurrent_requests} clients")
    plotted = samples.write_png(out / "soak.png", warm["t"], title)
    lines.append(f"samples: {out / 'soak.csv'}; plot: "
                 + (str(out / "soak.png") if plotted else "none (pip install matplotlib for it)"))
    report = "\n".join(lines)
    print(report)
    (out / "soak.txt").write_text(report + "\n")
    failed = load.lost or panics or over or blocks != 0.0
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
