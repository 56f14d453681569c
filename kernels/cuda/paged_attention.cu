// Paged-attention decode: one query row per sequence against its cached context.
//
// Layout (same as the CPU's `cpu::attention`): a layer's K and V caches are
// `[num_blocks, block_size, kv_heads, head_dim]`; position p of sequence s lives in slot
// `block_tables[s][p / block_size] * block_size + p % block_size`. Query head h reads KV head
// `h / (num_heads / kv_heads)` (GQA) without any copy of K/V. The query sits at position
// `context_lens[s] - 1` and attends to `lo ..= pos` with `lo = pos - window + 1` under a
// sliding window (0 = no window), else 0.
//
// Long contexts are split (FlashDecoding / vLLM v2): grid = (num_heads, num_seqs, partitions);
// each block handles `partition_size` positions of one (sequence, head). With one partition the
// block writes the output directly; otherwise it writes its max logit, its exp-sum and its
// normalised partial output, and `paged_attention_reduce` merges them with the usual
// log-sum-exp rescaling. Splitting keeps all SMs busy when the batch is small and the context
// long, which is exactly the decode regime.
//
// Inside a block (128 threads): each warp takes keys in turn and computes q·k with its lanes
// striding over head_dim (coalesced loads), keeping scores in shared memory; then a block-wide
// max/sum; then each thread owns head_dim / 128 output dims and accumulates p · v over the
// partition (v rows are read coalesced across the block).
#include "common.cuh"

#define PA_THREADS 128

template <typename T>
__device__ void paged_attention(T* out, float* part_out, float* part_max, float* part_sum,
                                const T* q, long long q_stride, const T* cache_k,
                                const T* cache_v, const int* block_tables, int max_blocks,
                                const int* context_lens, float scale, int window, int num_heads,
                                int kv_heads, int head_dim, int block_size, int partition_size) {
    extern __shared__ float smem[];
    float* q_s = smem;                  // [head_dim]
    float* logits = smem + head_dim;    // [partition_size]
    __shared__ float scratch[32];

    const int head = blockIdx.x, seq = blockIdx.y, part = blockIdx.z, parts = gridDim.z;
    const int kv_head = head / (num_heads / kv_heads);
    const int pos = context_lens[seq] - 1;
    const int lo = window > 0 ? max(0, pos - window + 1) : 0;
    const int start = lo + part * partition_size;
    const int end = min(pos + 1, start + partition_size);  // exclusive
    const long long part_idx = ((long long)seq * num_heads + head) * parts + part;
    if (start >= end) {
        // This sequence's span is shorter than the longest one: an empty partition.
        if (threadIdx.x == 0) {
            part_max[part_idx] = TESSERA_NEG_INF;
            part_sum[part_idx] = 0.0f;
        }
        return;
    }
    const int* table = block_tables + (long long)seq * max_blocks;
    const long long slot_w = (long long)kv_heads * head_dim;
    const T* qh = q + seq * q_stride + (long long)head * head_dim;
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) q_s[d] = to_f32(qh[d]) * scale;
    __syncthreads();

    // Scores: one key per warp at a time.
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    for (int p = start + warp; p < end; p += warps) {
        const long long slot = (long long)table[p / block_size] * block_size + p % block_size;
        const T* k = cache_k + slot * slot_w + (long long)kv_head * head_dim;
        float s = 0.0f;
        for (int d = lane; d < head_dim; d += 32) s += q_s[d] * to_f32(k[d]);
        s = warp_sum(s);
        if (lane == 0) logits[p - start] = s;
    }
    __syncthreads();

    const int n = end - start;
    float m = TESSERA_NEG_INF;
    for (int i = threadIdx.x; i < n; i += blockDim.x) m = fmaxf(m, logits[i]);
    m = block_max(m, scratch);
    float sum = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float e = expf(logits[i] - m);
        logits[i] = e;
        sum += e;
    }
    sum = block_sum(sum, scratch);  // its barriers also publish the exps written above
    const float inv = 1.0f / sum;

    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float acc = 0.0f;
        for (int i = 0; i < n; ++i) {
            const int p = start + i;
            const long long slot = (long long)table[p / block_size] * block_size + p % block_size;
            acc += logits[i] * to_f32(cache_v[slot * slot_w + (long long)kv_head * head_dim + d]);
        }
        acc *= inv;
        if (parts == 1) {
            out[((long long)seq * num_heads + head) * head_dim + d] = from_f32<T>(acc);
        } else {
            part_out[part_idx * head_dim + d] = acc;
        }
    }
    if (parts > 1 && threadIdx.x == 0) {
        part_max[part_idx] = m;
        part_sum[part_idx] = sum;
    }
}

// Merges the partitions of one (head, sequence): grid = (num_heads, num_seqs).
template <typename T>
__device__ void paged_attention_reduce(T* out, const float* part_out, const float* part_max,
                                       const float* part_sum, int num_heads, int head_dim,
                                       int parts) {
    const int head = blockIdx.x, seq = blockIdx.y;
    const long long base = ((long long)seq * num_heads + head) * parts;
    float m = TESSERA_NEG_INF;
    for (int p = 0; p < parts; ++p) m = fmaxf(m, part_max[base + p]);
    float total = 0.0f;
    for (int p = 0; p < parts; ++p) {
        if (part_sum[base + p] > 0.0f) total += part_sum[base + p] * expf(part_max[base + p] - m);
    }
    const float inv = 1.0f / total;
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float acc = 0.0f;
        for (int p = 0; p < parts; ++p) {
            if (part_sum[base + p] > 0.0f) {
                const float w = part_sum[base + p] * expf(part_max[base + p] - m);
                acc += w * part_out[(base + p) * head_dim + d];
            }
        }
        out[((long long)seq * num_heads + head) * head_dim + d] = from_f32<T>(acc * inv);
    }
}

#define INSTANTIATE(T, S)                                                                      \
    extern "C" __global__ void __launch_bounds__(PA_THREADS) paged_attention_decode_##S(       \
        T* out, float* part_out, float* part_max, float* part_sum, const T* q,                 \
        long long q_stride, const T* cache_k, const T* cache_v, const int* block_tables,       \
        int max_blocks, const int* context_lens, float scale, int window, int num_heads,       \
        int kv_heads, int head_dim, int block_size, int partition_size) {                      \
        paged_attention<T>(out, part_out, part_max, part_sum, q, q_stride, cache_k, cache_v,   \
                           block_tables, max_blocks, context_lens, scale, window, num_heads,   \
                           kv_heads, head_dim, block_size, partition_size);                    \
    }                                                                                          \
    extern "C" __global__ void paged_attention_reduce_##S(                                     \
        T* out, const float* part_out, const float* part_max, const float* part_sum,           \
        int num_heads, int head_dim, int parts) {                                              \
        paged_attention_reduce<T>(out, part_out, part_max, part_sum, num_heads, head_dim,      \
                                  parts);                                                      \
    }
TESSERA_FOR_EACH_DTYPE(INSTANTIATE)
