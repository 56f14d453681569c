#!/usr/bin/env python3
"""Two side-by-side measurements against a running Tessera server (stdlib only).

  ttft: mean time to first token of 12 requests sharing a ~1100-token system prompt
        (run against --prefix-caching true and false).
  spec: single-stream decode tokens/s on a repetitive code prompt
        (run against --speculate 0 and --speculate 4).

Usage: scripts/bench_prefix_and_speculation.py PORT {ttft,spec}
"""
import json, sys, time, urllib.request
port=int(sys.argv[1]); mode=sys.argv[2]
def stream(body):
    req=urllib.request.Request(f"http://127.0.0.1:{port}/generate_stream",data=json.dumps(body).encode(),headers={"content-type":"application/json"})
    t0=time.time(); ttft=None; n=0
    with urllib.request.urlopen(req,timeout=600) as r:
        for line in r:
            if line.startswith(b"data:"):
                if ttft is None: ttft=time.time()-t0
                n+=1
    return ttft, n, time.time()-t0
if mode=="ttft":
    system=" ".join(f"Rule {i}: always answer politely, cite sources, and keep answers short and factual." for i in range(60))
    qs=[f"Question {i}: what is {i} plus {i*3}?" for i in range(12)]
    res=[stream({"inputs":system+"\n"+q,"parameters":{"max_new_tokens":4}}) for q in qs]
    t=[r[0] for r in res[1:]]
    print(f"TTFT mean over {len(t)} requests after the first: {sum(t)/len(t)*1000:.0f} ms (first {res[0][0]*1000:.0f} ms)")
else:
    code="def add_one(values):\n    result = []\n    for value in values:\n        result.append(value + 1)\n    return result\n\n"
    prompt="Here is a Python function, repeated:\n\n"+code*6
    times=[]
    for i in range(3):
        ttft,n,total=stream({"inputs":prompt,"parameters":{"max_new_tokens":128,"ignore_eos":True}})
        times.append((n-1)/(total-ttft))
    print(f"decode tokens/s (single stream, 128 tokens, after the first): {sorted(times)[1]:.1f}")
