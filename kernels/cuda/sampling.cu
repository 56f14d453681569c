// Sampling helpers over the vocabulary, so that only a few numbers per row leave the device.
//
// - `argmax_<dtype>`: greedy decoding; ties go to the lowest id, as on the CPU.
// - `log_softmax_<dtype>`: f32 log-probabilities of logits / temperature (for logprobs and
//   for sampling when no top-k applies).
// - `topk_<dtype>`: the k best (logit, id) pairs of each row, best first, ties by lowest id.
//   Top-p is then applied on the host to these k candidates (after softmax over the full row's
//   normaliser, which `log_softmax` provides), so no full-vocabulary sort is needed on the device.
//   k is small (≤ 256): each of the k rounds is one block-wide max over the elements that
//   rank below the previous pick, which is cheap next to a sort of the whole vocabulary.
//
// One thread block (1024 threads) per row; rows are logits `[rows, vocab]`.
#include "common.cuh"

// (value, id) ordered by value descending, then id ascending.
__device__ __forceinline__ bool ranks_before(float va, int ia, float vb, int ib) {
    return va > vb || (va == vb && ia < ib);
}

// Block-wide best (value, id); every thread gets it. `sv`/`si` hold 32 entries.
__device__ __forceinline__ void block_best(float& v, int& id, float* sv, int* si) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, v, o);
        const int oi = __shfl_xor_sync(0xffffffffu, id, o);
        if (ranks_before(ov, oi, v, id)) { v = ov; id = oi; }
    }
    __syncthreads();
    if (lane == 0) { sv[warp] = v; si[warp] = id; }
    __syncthreads();
    const int warps = blockDim.x >> 5;
    v = lane < warps ? sv[lane] : TESSERA_NEG_INF;
    id = lane < warps ? si[lane] : 0x7fffffff;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, v, o);
        const int oi = __shfl_xor_sync(0xffffffffu, id, o);
        if (ranks_before(ov, oi, v, id)) { v = ov; id = oi; }
    }
}

template <typename T>
__device__ void argmax(const T* logits, int* ids, int vocab) {
    __shared__ float sv[32];
    __shared__ int si[32];
    const T* row = logits + (long long)blockIdx.x * vocab;
    float v = TESSERA_NEG_INF;
    int id = 0x7fffffff;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        const float x = to_f32(row[i]);
        if (ranks_before(x, i, v, id)) { v = x; id = i; }
    }
    block_best(v, id, sv, si);
    if (threadIdx.x == 0) ids[blockIdx.x] = id;
}

template <typename T>
__device__ void log_softmax(const T* logits, float* out, int vocab, float temperature) {
    __shared__ float scratch[32];
    const T* row = logits + (long long)blockIdx.x * vocab;
    float* o = out + (long long)blockIdx.x * vocab;
    const float inv_t = 1.0f / temperature;
    float m = TESSERA_NEG_INF;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) m = fmaxf(m, to_f32(row[i]) * inv_t);
    m = block_max(m, scratch);
    float s = 0.0f;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) s += expf(to_f32(row[i]) * inv_t - m);
    s = block_sum(s, scratch);
    const float lse = m + logf(s);
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) o[i] = to_f32(row[i]) * inv_t - lse;
}

template <typename T>
__device__ void topk(const T* logits, float* top_vals, int* top_ids, int vocab, int k) {
    __shared__ float sv[32];
    __shared__ int si[32];
    const T* row = logits + (long long)blockIdx.x * vocab;
    float prev_v = __int_as_float(0x7f800000);  // +inf: everything ranks below it
    int prev_i = -1;
    for (int r = 0; r < k; ++r) {
        float v = TESSERA_NEG_INF;
        int id = 0x7fffffff;
        for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
            const float x = to_f32(row[i]);
            if (ranks_before(prev_v, prev_i, x, i) && ranks_before(x, i, v, id)) { v = x; id = i; }
        }
        block_best(v, id, sv, si);
        if (threadIdx.x == 0) {
            top_vals[(long long)blockIdx.x * k + r] = v;
            top_ids[(long long)blockIdx.x * k + r] = id;
        }
        prev_v = v;
        prev_i = id;
    }
}

#define INSTANTIATE(T, S)                                                                      \
    extern "C" __global__ void argmax_##S(const T* logits, int* ids, int vocab) {              \
        argmax<T>(logits, ids, vocab);                                                         \
    }                                                                                          \
    extern "C" __global__ void log_softmax_##S(const T* logits, float* out, int vocab,         \
                                               float temperature) {                            \
        log_softmax<T>(logits, out, vocab, temperature);                                       \
    }                                                                                          \
    extern "C" __global__ void topk_##S(const T* logits, float* top_vals, int* top_ids,        \
                                        int vocab, int k) {                                    \
        topk<T>(logits, top_vals, top_ids, vocab, k);                                          \
    }
TESSERA_FOR_EACH_DTYPE(INSTANTIATE)
