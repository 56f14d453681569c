// Flash-attention prefill over the paged KV cache, FlashAttention-2 style.
//
// The batch is flattened (vLLM varlen): sequence s owns query rows
// `cu_seqlens[s] .. cu_seqlens[s + 1]` at positions `first_pos[s] + r`, and its keys/values
// (this chunk's and any cached prefix) are already in the paged cache, written by
// `rope_and_cache`. Reading K/V from the pages lets chunked prefill and prefix caching use the
// same kernel: a chunk just has `first_pos > 0`.
//
// Grid = (query tiles, num_heads, num_seqs): parallel over heads and query blocks, as in
// FlashAttention-2. A block owns FA_BM query rows of one head; it streams the key/value tiles
// (FA_BN positions each) it needs through shared memory and keeps, per query row, the running
// max m, the running sum l and the unnormalised output in registers (online softmax), so the
// scores never touch global memory. Only the tiles that intersect the causal (and sliding
// window: `p - window < j <= p`) band of the tile's rows are visited.
//
// Work split: 4 warps, each owns FA_BM / 4 query rows; for a key tile, lane j scores key j of
// the tile (q·k from shared memory, K rows padded by one float against bank conflicts), the
// warp reduces max/sum with shuffles, and then each lane accumulates head-dim columns
// `lane, lane + 32, …` of p·V, broadcasting p_j with a shuffle. f32 throughout; the storage
// type only matters for loads and the final store. (A tensor-core mma variant is a later
// optimisation; this one is the reference the engine relies on first.)
#include "common.cuh"

#define FA_BM 32
#define FA_BN 32
#define FA_THREADS 128
#define FA_ROWS_PER_WARP (FA_BM / (FA_THREADS / 32))

template <typename T, int HD>
__device__ void flash_attention(T* out, const T* q, long long q_stride, const T* cache_k,
                                const T* cache_v, const int* cu_seqlens, const int* first_pos,
                                const int* block_tables, int max_blocks, float scale, int window,
                                int num_heads, int kv_heads, int block_size) {
    constexpr int DPL = (HD + 31) / 32;  // head-dim columns per lane
    constexpr int KS = HD + 1;           // padded K row stride in shared memory
    extern __shared__ float smem[];
    float* q_s = smem;                   // [FA_BM][HD], pre-scaled
    float* k_s = q_s + FA_BM * HD;       // [FA_BN][KS]
    float* v_s = k_s + FA_BN * KS;       // [FA_BN][HD]

    const int tile = blockIdx.x, head = blockIdx.y, seq = blockIdx.z;
    const int row0 = cu_seqlens[seq], rows = cu_seqlens[seq + 1] - row0;
    const int r_begin = tile * FA_BM;
    if (r_begin >= rows) return;  // this sequence has fewer query tiles than the longest
    const int r_count = min(FA_BM, rows - r_begin);
    const int pos0 = first_pos[seq] + r_begin;  // position of the tile's first row
    const int pos_last = pos0 + r_count - 1;
    const int kv_lo = window > 0 ? max(0, pos0 - window + 1) : 0;
    const int kv_head = head / (num_heads / kv_heads);
    const int* table = block_tables + (long long)seq * max_blocks;
    const long long slot_w = (long long)kv_heads * HD;

    for (int i = threadIdx.x; i < FA_BM * HD; i += blockDim.x) {
        const int r = i / HD, d = i % HD;
        q_s[i] = r < r_count
                     ? to_f32(q[(long long)(row0 + r_begin + r) * q_stride + head * HD + d]) * scale
                     : 0.0f;
    }

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float m[FA_ROWS_PER_WARP], l[FA_ROWS_PER_WARP], acc[FA_ROWS_PER_WARP][DPL];
#pragma unroll
    for (int r = 0; r < FA_ROWS_PER_WARP; ++r) {
        m[r] = TESSERA_NEG_INF;
        l[r] = 0.0f;
#pragma unroll
        for (int c = 0; c < DPL; ++c) acc[r][c] = 0.0f;
    }

    for (int kv0 = kv_lo - kv_lo % FA_BN; kv0 <= pos_last; kv0 += FA_BN) {
        __syncthreads();  // the previous tile is no longer read (and q_s is complete)
        for (int i = threadIdx.x; i < FA_BN * HD; i += blockDim.x) {
            const int j = i / HD, d = i % HD, p = kv0 + j;
            float kv = 0.0f, vv = 0.0f;
            if (p <= pos_last) {
                const long long slot =
                    (long long)table[p / block_size] * block_size + p % block_size;
                const long long off = slot * slot_w + (long long)kv_head * HD + d;
                kv = to_f32(cache_k[off]);
                vv = to_f32(cache_v[off]);
            }
            k_s[j * KS + d] = kv;
            v_s[j * HD + d] = vv;
        }
        __syncthreads();

#pragma unroll
        for (int rr = 0; rr < FA_ROWS_PER_WARP; ++rr) {
            const int r = warp * FA_ROWS_PER_WARP + rr;
            if (r >= r_count) break;  // warp-uniform
            const int p = pos0 + r, kp = kv0 + lane;
            const bool valid = kp <= p && (window <= 0 || kp > p - window);
            float s = 0.0f;
            const float* qr = q_s + r * HD;
            const float* kr = k_s + lane * KS;
#pragma unroll 4
            for (int d = 0; d < HD; ++d) s += qr[d] * kr[d];
            s = valid ? s : TESSERA_NEG_INF;
            const float m_new = fmaxf(m[rr], warp_max(s));
            if (m_new == TESSERA_NEG_INF) continue;  // nothing visible yet for this row
            const float alpha = expf(m[rr] - m_new);  // 0 when m was -inf
            const float pj = valid ? expf(s - m_new) : 0.0f;
            l[rr] = l[rr] * alpha + warp_sum(pj);
            m[rr] = m_new;
#pragma unroll
            for (int c = 0; c < DPL; ++c) acc[rr][c] *= alpha;
#pragma unroll 4
            for (int j = 0; j < FA_BN; ++j) {
                const float pb = __shfl_sync(0xffffffffu, pj, j);
#pragma unroll
                for (int c = 0; c < DPL; ++c) {
                    const int d = lane + 32 * c;
                    if (d < HD) acc[rr][c] += pb * v_s[j * HD + d];
                }
            }
        }
    }

#pragma unroll
    for (int rr = 0; rr < FA_ROWS_PER_WARP; ++rr) {
        const int r = warp * FA_ROWS_PER_WARP + rr;
        if (r >= r_count) break;
        const float inv = 1.0f / l[rr];  // l > 0: every row sees at least its own position
        T* o = out + ((long long)(row0 + r_begin + r) * num_heads + head) * HD;
#pragma unroll
        for (int c = 0; c < DPL; ++c) {
            const int d = lane + 32 * c;
            if (d < HD) o[d] = from_f32<T>(acc[rr][c] * inv);
        }
    }
}

// Named `flash_attention_prefill_<dtype>_hd<head_dim>`; the launcher picks the instance.
#define INSTANTIATE_HD(T, S, HD)                                                               \
    extern "C" __global__ void __launch_bounds__(FA_THREADS)                                   \
        flash_attention_prefill_##S##_hd##HD(                                                  \
            T* out, const T* q, long long q_stride, const T* cache_k, const T* cache_v,        \
            const int* cu_seqlens, const int* first_pos, const int* block_tables,              \
            int max_blocks, float scale, int window, int num_heads, int kv_heads,              \
            int block_size) {                                                                  \
        flash_attention<T, HD>(out, q, q_stride, cache_k, cache_v, cu_seqlens, first_pos,      \
                               block_tables, max_blocks, scale, window, num_heads, kv_heads,   \
                               block_size);                                                    \
    }
#define INSTANTIATE(T, S)                                                                      \
    INSTANTIATE_HD(T, S, 16)                                                                   \
    INSTANTIATE_HD(T, S, 32)                                                                   \
    INSTANTIATE_HD(T, S, 64)                                                                   \
    INSTANTIATE_HD(T, S, 80)                                                                   \
    INSTANTIATE_HD(T, S, 96)                                                                   \
    INSTANTIATE_HD(T, S, 128)                                                                  \
    INSTANTIATE_HD(T, S, 256)
TESSERA_FOR_EACH_DTYPE(INSTANTIATE)
