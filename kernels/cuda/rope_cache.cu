// Rotary embedding of q and k, fused with writing k and v into the paged KV cache
// (vLLM's "reshape_and_cache").
//
// `qkv` is the fused projection output: token t's row starts at `t * row_stride`, with the q
// heads at `q_offset`, the k heads at `k_offset` and the v heads at `v_offset`. q and k are
// rotated in place (the attention kernels read q from here), and k/v land in slot
// `slot_mapping[t]` of `[num_blocks * block_size, kv_heads, head_dim]`. A slot of -1 (padding)
// skips the cache write.
//
// Rotation is the "half-split" (NeoX / Hugging Face `rotate_half`) form on the first `rot_dim`
// dims of each head: pairs (i, i + rot_dim / 2), angle = position · inv_freq[i], computed in
// f32 exactly as the CPU reference (`cpu::rope::cos_sin`) does. Fusing saves one full pass
// over k: the thread that rotates a k pair also stores it into the cache.
#include "common.cuh"

// grid.x = tokens; threads stride over (head, pair) and then over the unrotated values.
template <typename T>
__device__ void rope_and_cache(T* qkv, long long row_stride, int q_offset, int k_offset,
                               int v_offset, int num_heads, int kv_heads, int head_dim,
                               int rot_dim, const int* positions, const float* inv_freq,
                               const int* slot_mapping, T* cache_k, T* cache_v) {
    const long long t = blockIdx.x;
    T* row = qkv + t * row_stride;
    const float pos = (float)positions[t];
    const long long slot = slot_mapping[t];
    const long long cache_base = slot * kv_heads * head_dim;
    const int half = rot_dim / 2;

    // Rotated pairs of q heads then k heads.
    const int pairs = (num_heads + kv_heads) * half;
    for (int i = threadIdx.x; i < pairs; i += blockDim.x) {
        const int h = i / half, j = i % half;
        const bool is_k = h >= num_heads;
        const int head = is_k ? h - num_heads : h;
        T* x = row + (is_k ? k_offset : q_offset) + head * head_dim;
        float s, c;
        sincosf(pos * inv_freq[j], &s, &c);
        const float a = to_f32(x[j]), b = to_f32(x[j + half]);
        const T lo = from_f32<T>(a * c - b * s);
        const T hi = from_f32<T>(b * c + a * s);
        x[j] = lo;
        x[j + half] = hi;
        if (is_k && slot >= 0) {
            cache_k[cache_base + head * head_dim + j] = lo;
            cache_k[cache_base + head * head_dim + j + half] = hi;
        }
    }
    if (slot < 0) return;
    // k's unrotated tail (partial rotary) and all of v.
    const int tail = head_dim - rot_dim;
    for (int i = threadIdx.x; i < kv_heads * tail; i += blockDim.x) {
        const int head = i / tail, d = rot_dim + i % tail;
        cache_k[cache_base + head * head_dim + d] = row[k_offset + head * head_dim + d];
    }
    for (int i = threadIdx.x; i < kv_heads * head_dim; i += blockDim.x) {
        cache_v[cache_base + i] = row[v_offset + i];
    }
}

#define INSTANTIATE(T, S)                                                                      \
    extern "C" __global__ void rope_and_cache_##S(                                             \
        T* qkv, long long row_stride, int q_offset, int k_offset, int v_offset, int num_heads, \
        int kv_heads, int head_dim, int rot_dim, const int* positions, const float* inv_freq,  \
        const int* slot_mapping, T* cache_k, T* cache_v) {                                     \
        rope_and_cache<T>(qkv, row_stride, q_offset, k_offset, v_offset, num_heads, kv_heads,  \
                          head_dim, rot_dim, positions, inv_freq, slot_mapping, cache_k,       \
                          cache_v);                                                            \
    }
TESSERA_FOR_EACH_DTYPE(INSTANTIATE)
