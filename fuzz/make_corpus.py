#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets to fuzz/corpus/<target>/ (issue 11).

Standard library only; deterministic. libFuzzer adds what it finds to the same folders
during a run; commit the interesting additions (small ones) with the seeds.
"""
import json, os, struct

ROOT = os.path.dirname(os.path.abspath(__file__))
FIX = os.path.join(ROOT, "..", "fixtures")


def put(target, name, data):
    d = os.path.join(ROOT, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


# ---- gguf: small valid files (v3 and v2) of a 1-layer llama with f32 and q8_0 tensors.
def gstr(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b

def kv(key, vtype, payload):
    return gstr(key) + struct.pack("<I", vtype) + payload

U32, F32, STR, ARR, BOOL = 4, 6, 8, 9, 7

def gguf(version=3, q8=True, with_tokenizer=True):
    kvs = [
        kv("general.architecture", STR, gstr("llama")),
        kv("general.alignment", U32, struct.pack("<I", 32)),
        kv("llama.context_length", U32, struct.pack("<I", 64)),
        kv("llama.embedding_length", U32, struct.pack("<I", 32)),
        kv("llama.block_count", U32, struct.pack("<I", 1)),
        kv("llama.feed_forward_length", U32, struct.pack("<I", 64)),
        kv("llama.attention.head_count", U32, struct.pack("<I", 4)),
        kv("llama.attention.head_count_kv", U32, struct.pack("<I", 2)),
        kv("llama.attention.layer_norm_rms_epsilon", F32, struct.pack("<f", 1e-5)),
        kv("llama.rope.freq_base", F32, struct.pack("<f", 10000.0)),
    ]
    if with_tokenizer:
        toks = ["<unk>", "<s>", "</s>", "a", "b", "ab", "\u2581a"]
        kvs += [
            kv("tokenizer.ggml.model", STR, gstr("gpt2")),
            kv("tokenizer.ggml.tokens", ARR, struct.pack("<IQ", STR, len(toks)) + b"".join(gstr(t) for t in toks)),
            kv("tokenizer.ggml.merges", ARR, struct.pack("<IQ", STR, 1) + gstr("a b")),
            kv("tokenizer.ggml.bos_token_id", U32, struct.pack("<I", 1)),
            kv("tokenizer.ggml.eos_token_id", U32, struct.pack("<I", 2)),
            kv("tokenizer.chat_template", STR, gstr("{% for m in messages %}{{ m.content }}{% endfor %}")),
        ]
    tensors = []  # (name, dims, type, bytes)
    emb = struct.pack("<" + "f" * (32 * 7), *[(i % 13) / 13.0 for i in range(32 * 7)])
    tensors.append(("token_embd.weight", [32, 7], 0, emb))
    tensors.append(("output_norm.weight", [32], 0, struct.pack("<" + "f" * 32, *([1.0] * 32))))
    if q8:
        block = struct.pack("<e", 0.5) + bytes(range(32))
        tensors.append(("blk.0.attn_q.weight", [32, 32], 8, block * 32))
    tensors.append(("blk.0.attn_norm.weight", [32], 1, struct.pack("<" + "e" * 32, *([1.0] * 32))))
    header = b"GGUF" + struct.pack("<I", version)
    if version >= 2:
        header += struct.pack("<QQ", len(tensors), len(kvs))
    body = b"".join(kvs)
    infos = b""
    offset = 0
    data = b""
    for name, dims, ty, raw in tensors:
        infos += gstr(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        infos += struct.pack("<IQ", ty, offset)
        pad = (-len(raw)) % 32
        data += raw + bytes(pad)
        offset += len(raw) + pad
    head = header + body + infos
    head += bytes((-len(head)) % 32)
    return head + data

put("gguf", "v3_llama_q8", gguf())
put("gguf", "v2_llama", gguf(version=2, q8=False))
put("gguf", "v3_no_tokenizer", gguf(with_tokenizer=False))
put("gguf", "truncated_header", gguf()[:40])
put("gguf", "v1", b"GGUF" + struct.pack("<I", 1) + bytes(16))

# ---- safetensors_config: u16 LE config length | config.json | safetensors.
def safetensors(tensors):
    header, data = {}, b""
    for name, shape, dtype, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header).encode()
    h += b" " * ((-len(h)) % 8)
    return struct.pack("<Q", len(h)) + h + data

for model in ["tiny-llama", "tiny-qwen2", "tiny-mistral"]:
    with open(os.path.join(FIX, model, "config.json"), "rb") as f:
        config = f.read()
    cfg = json.loads(config)
    hidden = cfg["hidden_size"]
    st = safetensors([
        ("model.norm.weight", [hidden], "F32", struct.pack("<" + "f" * hidden, *([1.0] * hidden))),
        ("model.embed_tokens.weight", [4, hidden], "BF16", bytes(4 * hidden * 2)),
        ("lm_head.weight", [2, hidden], "F16", bytes(2 * hidden * 2)),
    ])
    put("safetensors_config", model, struct.pack("<H", len(config)) + config + st)
put("safetensors_config", "empty_header", struct.pack("<H", 2) + b"{}" + struct.pack("<Q", 2) + b"{}")

# ---- http_bodies: route index | body (ROUTES in src/lib.rs order).
ROUTES = ["/", "/generate", "/generate_stream", "/tokenize", "/v1/chat/completions", "/v1/completions"]
bodies = {
    1: [{"inputs": "Hello", "parameters": {"max_new_tokens": 4, "details": True, "decoder_input_details": True, "top_n_tokens": 2}},
        {"inputs": "x", "parameters": {"temperature": 1e308, "top_k": -1, "stop": ["a", ""], "seed": 18446744073709551615}}],
    0: [{"inputs": "Hello", "stream": True, "parameters": {"max_new_tokens": 2}}],
    2: [{"inputs": "Hello", "parameters": {"max_new_tokens": 3, "do_sample": True, "top_p": 0.5}}],
    3: [{"inputs": "Hello \u00e9\u20ac\ud83d\ude00"}],
    4: [{"model": "tiny-llama", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "logprobs": True, "top_logprobs": 2},
        {"model": "tiny-llama", "messages": [{"role": "system", "content": [{"type": "text", "text": "x"}]}, {"role": "user", "content": "{{ 7*7 }}"}], "stream": True, "stream_options": {"include_usage": True}, "n": 2, "stop": "\n"},
        {"messages": [], "logit_bias": {"1": 100, "99999999999": -1e400}}],
    5: [{"model": "tiny-llama", "prompt": ["a", "b"], "max_tokens": 2, "echo": True, "logprobs": 1},
        {"model": "tiny-llama", "prompt": [1, 2, 3], "stream": True}],
}
for route, items in bodies.items():
    for i, b in enumerate(items):
        put("http_bodies", f"{ROUTES[route].strip('/').replace('/', '_') or 'root'}_{i}", bytes([route]) + json.dumps(b).encode())
put("http_bodies", "deep_nesting", bytes([4]) + b"[" * 5000 + b"]" * 5000)
put("http_bodies", "huge_number", bytes([1]) + b'{"inputs":"a","parameters":{"max_new_tokens":1e999999}}')
put("http_bodies", "invalid_utf8", bytes([4]) + b'{"messages":[{"role":"user","content":"\xff\xfe\x00"}]}')

# ---- chat_template: flags | role \0 content \0 ...
def conv(flags, *parts):
    return bytes([flags]) + b"\0".join(p.encode() if isinstance(p, str) else p for p in parts)
put("chat_template", "simple", conv(1, "system", "Be brief.", "user", "Hi", "assistant", "Hello", "user", "Again"))
put("chat_template", "injection", conv(1, "user", "{{ raise_exception('x') }}{% for x in range(99999999) %}", "assistant", "</s><s>[INST]"))
put("chat_template", "bad_role", conv(0, "tool\n", "\x1b[31m\x07", "user", b"\xff\xfe"))
put("chat_template", "tools", conv(1, "user", "call", '[{"type":"function","function":{"name":"f","parameters":{}}}]'))

# ---- tokenizer_roundtrip: text.
for i, t in enumerate(["Hello world", "  leading and trailing  ", "caf\u00e9 \u20ac \ud83d\ude00\u200d\ud83d\udc69", "<s>special</s> tokens", "\x00\x01\t\r\n", "a" * 300]):
    put("tokenizer_roundtrip", f"text_{i}", t.encode("utf-8", "surrogatepass").decode("utf-8", "replace") if False else t.encode("utf-16", "surrogatepass").decode("utf-16"))
put("tokenizer_roundtrip", "invalid_utf8", b"ab\xff\xc3(")

# ---- detokenizer: flags | prompt length | u16 LE ids.
def ids(flags, plen, xs):
    return bytes([flags, plen]) + b"".join(struct.pack("<H", x) for x in xs)
put("detokenizer", "plain", ids(0, 0, [100, 200, 300, 400, 5, 6]))
put("detokenizer", "prompt", ids(5, 3, [1, 2, 3, 250, 251, 252, 1, 2]))
put("detokenizer", "bytes", ids(2, 0, [240, 159, 152, 128, 65]))
put("detokenizer", "out_of_vocab", ids(0, 1, [7, 65535, 3]))
