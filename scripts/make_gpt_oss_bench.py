#!/usr/bin/env python3
"""Random-weight GGUF of gpt-oss-20b's shape, laid out as ggml-org's gpt-oss-20b MXFP4 file:
experts MXFP4, other matrices Q8_0, norms, biases, sinks and the router F32. For CPU benchmarks
against llama.cpp on the same file (scripts/make_bench_models.sh calls it); keep the output outside
the repository (about 12 GB).

    python scripts/make_gpt_oss_bench.py SmolLM2-135M-Instruct.Q4_1.gguf OUT.gguf [--layers N]

The blocks are written directly (no F16 source to quantize): MXFP4 blocks with random nibbles and
scales 2^-9..2^-6, Q8_0 blocks with random quants and f16 scales of 0.02/127, so the weights look
like a trained model's magnitudes. The tokenizer (every tokenizer.* key) is SmolLM2's, its token
list padded with unused tokens to gpt-oss's 201088 rows, so the embedding and LM head read as many
bytes per token as the real model's. Needs numpy and gguf from PyPI.
"""
import argparse
import time

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader, GGUFValueType, GGUFWriter

HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM = 2880, 24, 64, 8, 64
EXPERTS, TOP_K, INTER, VOCAB = 32, 4, 2880, 201088
CONTEXT, SLIDING, THETA = 131072, 128, 150000.0
YARN_FACTOR, YARN_ORIGINAL = 32.0, 4096
UNUSED = 5  # llama.cpp's LLAMA_TOKEN_TYPE_UNUSED


def plan(layers: int):
    """(name, GGUF type, element shape in numpy order) of every tensor, in file order."""
    mats = [("token_embd.weight", Q.Q8_0, (VOCAB, HIDDEN))]
    for i in range(layers):
        b = f"blk.{i}."
        mats += [
            (b + "attn_norm.weight", Q.F32, (HIDDEN,)),
            (b + "post_attention_norm.weight", Q.F32, (HIDDEN,)),
            (b + "attn_sinks.weight", Q.F32, (HEADS,)),
            (b + "attn_q.weight", Q.Q8_0, (HEADS * HEAD_DIM, HIDDEN)),
            (b + "attn_q.bias", Q.F32, (HEADS * HEAD_DIM,)),
            (b + "attn_k.weight", Q.Q8_0, (KV_HEADS * HEAD_DIM, HIDDEN)),
            (b + "attn_k.bias", Q.F32, (KV_HEADS * HEAD_DIM,)),
            (b + "attn_v.weight", Q.Q8_0, (KV_HEADS * HEAD_DIM, HIDDEN)),
            (b + "attn_v.bias", Q.F32, (KV_HEADS * HEAD_DIM,)),
            (b + "attn_output.weight", Q.Q8_0, (HIDDEN, HEADS * HEAD_DIM)),
            (b + "attn_output.bias", Q.F32, (HIDDEN,)),
            (b + "ffn_gate_inp.weight", Q.F32, (EXPERTS, HIDDEN)),
            (b + "ffn_gate_inp.bias", Q.F32, (EXPERTS,)),
            (b + "ffn_gate_exps.weight", Q.MXFP4, (EXPERTS, INTER, HIDDEN)),
            (b + "ffn_gate_exps.bias", Q.F32, (EXPERTS, INTER)),
            (b + "ffn_up_exps.weight", Q.MXFP4, (EXPERTS, INTER, HIDDEN)),
            (b + "ffn_up_exps.bias", Q.F32, (EXPERTS, INTER)),
            (b + "ffn_down_exps.weight", Q.MXFP4, (EXPERTS, HIDDEN, INTER)),
            (b + "ffn_down_exps.bias", Q.F32, (EXPERTS, HIDDEN)),
        ]
    mats += [("output_norm.weight", Q.F32, (HIDDEN,)), ("output.weight", Q.Q8_0, (VOCAB, HIDDEN))]
    return mats


def data(rng, name: str, qtype, shape) -> np.ndarray:
    """Random values of the tensor as bytes (block types) or f32."""
    if qtype == Q.F32:
        if name.endswith("norm.weight"):
            return np.ones(shape, dtype=np.float32)
        return (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float32)
    *outer, cols = shape
    blocks = int(np.prod(outer)) * cols // 32
    if qtype == Q.MXFP4:
        raw = np.frombuffer(rng.bytes(blocks * 17), dtype=np.uint8).reshape(blocks, 17).copy()
        raw[:, 0] = rng.integers(118, 122, size=blocks, dtype=np.uint8)
    else:
        raw = np.frombuffer(rng.bytes(blocks * 34), dtype=np.uint8).reshape(blocks, 34).copy()
        raw[:, 0:2] = np.frombuffer(np.float16(0.02 / 127).tobytes(), dtype=np.uint8)
    return raw.reshape(*outer, -1)


def copy_tokenizer(src: GGUFReader, w: GGUFWriter) -> int:
    """Every tokenizer.* key of `src`, its token list padded to VOCAB; the source's count."""
    n = len(src.fields["tokenizer.ggml.tokens"].data)
    for key, f in src.fields.items():
        if not key.startswith("tokenizer."):
            continue
        kind = f.types[0]
        if kind == GGUFValueType.ARRAY:
            sub = f.types[-1]
            if sub == GGUFValueType.STRING:
                val = [bytes(f.parts[i]) for i in f.data]
            else:
                val = list(f.contents())
            if key == "tokenizer.ggml.tokens":
                val += [f"<|unused_{i}|>".encode() for i in range(VOCAB - n)]
            elif key == "tokenizer.ggml.token_type":
                val += [UNUSED] * (VOCAB - n)
            elif key == "tokenizer.ggml.scores":
                val += [0.0] * (VOCAB - n)
            w.add_key_value(key, val, GGUFValueType.ARRAY, sub_type=sub)
        elif kind == GGUFValueType.STRING:
            w.add_key_value(key, bytes(f.parts[f.data[0]]), GGUFValueType.STRING)
        else:
            w.add_key_value(key, f.contents(), kind)
    return n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("source", help="a GGUF whose tokenizer to copy (SmolLM2's)")
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=LAYERS)
    ap.add_argument("--seed", type=int, default=20)
    args = ap.parse_args()
    t0 = time.time()
    w = GGUFWriter(args.out, "gpt-oss")
    w.add_type("model")
    w.add_name("gpt-oss-20b shape, random weights (MXFP4 experts, Q8_0 matrices)")
    w.add_file_type(38)  # MOSTLY_MXFP4_MOE
    w.add_block_count(args.layers)
    w.add_context_length(CONTEXT)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(INTER)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_rope_freq_base(THETA)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_expert_count(EXPERTS)
    w.add_expert_used_count(TOP_K)
    w.add_expert_feed_forward_length(INTER)
    w.add_sliding_window(SLIDING)
    w.add_string("gpt-oss.rope.scaling.type", "yarn")
    w.add_float32("gpt-oss.rope.scaling.factor", YARN_FACTOR)
    w.add_uint32("gpt-oss.rope.scaling.original_context_length", YARN_ORIGINAL)
    src = GGUFReader(args.source)
    n = copy_tokenizer(src, w)
    del src
    tensors = plan(args.layers)
    for name, qtype, shape in tensors:
        if qtype == Q.F32:
            w.add_tensor_info(name, shape, np.dtype(np.float32), int(np.prod(shape)) * 4)
        else:
            per = 17 if qtype == Q.MXFP4 else 34
            *outer, cols = shape
            byte_shape = (*outer, cols // 32 * per)
            w.add_tensor_info(name, byte_shape, np.dtype(np.uint8), int(np.prod(byte_shape)),
                              raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(args.seed)
    for j, (name, qtype, shape) in enumerate(tensors):
        w.write_tensor_data(data(rng, name, qtype, shape))
        if j % 40 == 0 or j == len(tensors) - 1:
            print(f"  [{j + 1}/{len(tensors)}] {name} t={time.time() - t0:.0f}s", flush=True)
    w.close()
    print(f"wrote {args.out} ({n} tokens padded to {VOCAB}) in {time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()
