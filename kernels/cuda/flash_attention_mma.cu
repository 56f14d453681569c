// Flash-attention prefill on tensor cores (sm_80+): `flash_attention.cu`'s algorithm and
// arguments, with q·kᵀ and p·v as bf16/f16 `mma.sync.m16n8k16` products accumulated in f32.
//
// Grid = (query tiles of MMA_BM rows, num_heads, num_seqs); 4 warps, each owning 16 query rows.
// A warp keeps its rows' q as mma A fragments in registers (read once from global memory), the
// running max m and sum l of its two rows per thread, and the output as f32 C fragments.
// Per key tile (MMA_BN positions of the paged cache, staged in shared memory by all warps):
//   S = q·kᵀ   (k's rows are the B operand as they lie: key j, dims d..d+1 in one 32-bit word),
//   online softmax on S's fragments (a row's 8 · MMA_BN / 8 values are spread over the 4
//   threads of a quad: reductions use two shuffles),
//   O += P·V   (P's C fragments become A fragments in registers — the FlashAttention-2
//   layout trick; V's B fragments are gathered as two 16-bit reads per register).
// P is rounded to the storage type before its product, as FlashAttention does; everything
// else is f32. Only bf16/f16 and head_dim 64 and 128 are instantiated; the launcher uses this
// kernel when asked to and falls back to `flash_attention.cu` otherwise.
#include "common.cuh"

#define MMA_BM 64
#define MMA_BN 64
#define MMA_THREADS 128

// c += a · b for one 16×8×16 tile, `PTX` naming the input type (bf16 or f16).
#define MMA_M16N8K16(PTX)                                                                      \
    static __device__ __forceinline__ void mma(float c[4], const u32 a[4], u32 b0, u32 b1) {   \
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." PTX "." PTX ".f32 "              \
                     "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"       \
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])                          \
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));          \
    }
template <typename T> struct MmaType;
template <> struct MmaType<BF16> { MMA_M16N8K16("bf16") };
template <> struct MmaType<F16> { MMA_M16N8K16("f16") };

// Two 16-bit values in one register, the first in the low half (mma's element order).
__device__ __forceinline__ u32 pack2(unsigned short lo, unsigned short hi) {
    return (u32)lo | ((u32)hi << 16);
}

template <typename T, int HD>
__device__ void flash_attention_mma(T* out, const T* q, long long q_stride, const T* cache_k,
                                    const T* cache_v, const int* cu_seqlens, const int* first_pos,
                                    const int* block_tables, int max_blocks, float scale,
                                    int window, int num_heads, int kv_heads, int block_size) {
    constexpr int KSTEPS = HD / 16;  // k-steps of q·kᵀ
    constexpr int DTILES = HD / 8;   // n-tiles of the output
    constexpr int NTILES = MMA_BN / 8;  // n-tiles of S
    constexpr int STRIDE = HD + 8;      // padded smem row (16-byte aligned, fewer conflicts)
    extern __shared__ unsigned short kv_smem[];
    unsigned short* k_s = kv_smem;                    // [MMA_BN][STRIDE]
    unsigned short* v_s = kv_smem + MMA_BN * STRIDE;  // [MMA_BN][STRIDE]

    const int tile = blockIdx.x, head = blockIdx.y, seq = blockIdx.z;
    const int row0 = cu_seqlens[seq], rows = cu_seqlens[seq + 1] - row0;
    const int r_begin = tile * MMA_BM;
    if (r_begin >= rows) return;
    const int r_count = min(MMA_BM, rows - r_begin);
    const int pos0 = first_pos[seq] + r_begin;
    const int pos_last = pos0 + r_count - 1;
    const int kv_lo = window > 0 ? max(0, pos0 - window + 1) : 0;
    const int kv_head = head / (num_heads / kv_heads);
    const int* table = block_tables + (long long)seq * max_blocks;
    const long long slot_w = (long long)kv_heads * HD;

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int group = lane >> 2, quad = lane & 3;
    // This thread's two rows (of the warp's 16), as tile rows and positions.
    const int wr0 = warp * 16 + group, wr1 = wr0 + 8;
    const int p_row0 = pos0 + wr0, p_row1 = pos0 + wr1;

    // q as A fragments: a[0] (row g, cols 2t..2t+1), a[1] (row g+8), a[2]/a[3] (cols + 8).
    u32 qa[KSTEPS][4];
    {
        const unsigned short* q16 = reinterpret_cast<const unsigned short*>(q);
        const long long base0 = (long long)(row0 + r_begin + wr0) * q_stride + head * HD;
        const long long base1 = base0 + 8 * q_stride;
        const bool ok0 = wr0 < r_count, ok1 = wr1 < r_count;
#pragma unroll
        for (int ks = 0; ks < KSTEPS; ++ks) {
            const int c = ks * 16 + quad * 2;
            qa[ks][0] = ok0 ? pack2(q16[base0 + c], q16[base0 + c + 1]) : 0u;
            qa[ks][1] = ok1 ? pack2(q16[base1 + c], q16[base1 + c + 1]) : 0u;
            qa[ks][2] = ok0 ? pack2(q16[base0 + c + 8], q16[base0 + c + 9]) : 0u;
            qa[ks][3] = ok1 ? pack2(q16[base1 + c + 8], q16[base1 + c + 9]) : 0u;
        }
    }

    float o[DTILES][4];
#pragma unroll
    for (int dt = 0; dt < DTILES; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;
    float m0 = TESSERA_NEG_INF, m1 = TESSERA_NEG_INF;  // running max of rows wr0, wr1
    float l0 = 0.0f, l1 = 0.0f;  // this thread's share of the running sums

    const unsigned short* k16 = reinterpret_cast<const unsigned short*>(cache_k);
    const unsigned short* v16 = reinterpret_cast<const unsigned short*>(cache_v);
    for (int kv0 = kv_lo - kv_lo % MMA_BN; kv0 <= pos_last; kv0 += MMA_BN) {
        __syncthreads();  // the previous tile is no longer read
        // Stage K and V: 16-byte chunks (8 values) of each key's head.
        constexpr int CHUNKS = HD / 8;
        for (int i = threadIdx.x; i < MMA_BN * CHUNKS; i += blockDim.x) {
            const int j = i / CHUNKS, c = (i % CHUNKS) * 8, p = kv0 + j;
            uint4 kc = make_uint4(0, 0, 0, 0), vc = make_uint4(0, 0, 0, 0);
            if (p <= pos_last) {
                const long long slot =
                    (long long)table[p / block_size] * block_size + p % block_size;
                const long long off = slot * slot_w + (long long)kv_head * HD + c;
                kc = *reinterpret_cast<const uint4*>(k16 + off);
                vc = *reinterpret_cast<const uint4*>(v16 + off);
            }
            *reinterpret_cast<uint4*>(k_s + j * STRIDE + c) = kc;
            *reinterpret_cast<uint4*>(v_s + j * STRIDE + c) = vc;
        }
        __syncthreads();

        // S = q·kᵀ: n-tile nt covers keys nt·8 .. nt·8 + 7; B (k = dim, n = key) is key n's
        // dims 2t, 2t + 1 (b0) and 2t + 8, 2t + 9 (b1).
        float s[NTILES][4];
#pragma unroll
        for (int nt = 0; nt < NTILES; ++nt) {
            s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
            const unsigned short* kr = k_s + (nt * 8 + group) * STRIDE + quad * 2;
#pragma unroll
            for (int ks = 0; ks < KSTEPS; ++ks) {
                const u32 b0 = *reinterpret_cast<const u32*>(kr + ks * 16);
                const u32 b1 = *reinterpret_cast<const u32*>(kr + ks * 16 + 8);
                MmaType<T>::mma(s[nt], qa[ks], b0, b1);
            }
        }

        // Scale and mask: s[nt][0..1] are row wr0's keys nt·8 + 2t + {0, 1}, s[nt][2..3] row
        // wr1's.
        float tmax0 = TESSERA_NEG_INF, tmax1 = TESSERA_NEG_INF;
#pragma unroll
        for (int nt = 0; nt < NTILES; ++nt) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int kp = kv0 + nt * 8 + quad * 2 + (e & 1);
                const int p = e < 2 ? p_row0 : p_row1;
                const bool visible = kp <= p && (window <= 0 || kp > p - window);
                s[nt][e] = visible ? s[nt][e] * scale : TESSERA_NEG_INF;
            }
            tmax0 = fmaxf(tmax0, fmaxf(s[nt][0], s[nt][1]));
            tmax1 = fmaxf(tmax1, fmaxf(s[nt][2], s[nt][3]));
        }
        // A row's values live in the 4 threads of a quad.
#pragma unroll
        for (int o_ = 1; o_ < 4; o_ <<= 1) {
            tmax0 = fmaxf(tmax0, __shfl_xor_sync(0xffffffffu, tmax0, o_));
            tmax1 = fmaxf(tmax1, __shfl_xor_sync(0xffffffffu, tmax1, o_));
        }
        const float new0 = fmaxf(m0, tmax0), new1 = fmaxf(m1, tmax1);
        // A row with nothing visible yet keeps max -inf: use 0 as the reference, so that
        // exp(-inf - 0) = 0 and no -inf - -inf appears.
        const float ref0 = new0 == TESSERA_NEG_INF ? 0.0f : new0;
        const float ref1 = new1 == TESSERA_NEG_INF ? 0.0f : new1;
        const float alpha0 = expf(m0 - ref0), alpha1 = expf(m1 - ref1);
        m0 = new0;
        m1 = new1;
        l0 *= alpha0;
        l1 *= alpha1;
#pragma unroll
        for (int dt = 0; dt < DTILES; ++dt) {
            o[dt][0] *= alpha0;
            o[dt][1] *= alpha0;
            o[dt][2] *= alpha1;
            o[dt][3] *= alpha1;
        }
        // P, rounded to the storage type, as A fragments of 16 keys each: n-tiles 2j and
        // 2j + 1 give a[0..1] and a[2..3].
        u32 pa[NTILES / 2][4];
#pragma unroll
        for (int nt = 0; nt < NTILES; ++nt) {
            const T p00 = from_f32<T>(expf(s[nt][0] - ref0));
            const T p01 = from_f32<T>(expf(s[nt][1] - ref0));
            const T p10 = from_f32<T>(expf(s[nt][2] - ref1));
            const T p11 = from_f32<T>(expf(s[nt][3] - ref1));
            // The sums use the rounded values, so that P·V is normalised by what it summed.
            l0 += to_f32(p00) + to_f32(p01);
            l1 += to_f32(p10) + to_f32(p11);
            const int half = nt & 1;
            pa[nt / 2][2 * half] = pack2(p00.bits, p01.bits);
            pa[nt / 2][2 * half + 1] = pack2(p10.bits, p11.bits);
        }

        // O += P·V: B (k = key, n = dim) is dims dt·8 + g of keys 2t, 2t + 1 (b0) and
        // 2t + 8, 2t + 9 (b1), read as single values from V's rows.
#pragma unroll
        for (int j = 0; j < NTILES / 2; ++j) {
            const unsigned short* vr = v_s + (j * 16 + quad * 2) * STRIDE + group;
#pragma unroll
            for (int dt = 0; dt < DTILES; ++dt) {
                const unsigned short* c = vr + dt * 8;
                const u32 b0 = pack2(c[0], c[STRIDE]);
                const u32 b1 = pack2(c[8 * STRIDE], c[9 * STRIDE]);
                MmaType<T>::mma(o[dt], pa[j], b0, b1);
            }
        }
    }

    // Each row's sum over its quad, then the normalised output: o[dt][0..1] are row wr0's
    // dims dt·8 + 2t + {0, 1}, o[dt][2..3] row wr1's.
#pragma unroll
    for (int o_ = 1; o_ < 4; o_ <<= 1) {
        l0 += __shfl_xor_sync(0xffffffffu, l0, o_);
        l1 += __shfl_xor_sync(0xffffffffu, l1, o_);
    }
    const float inv0 = l0 > 0.0f ? 1.0f / l0 : 0.0f;
    const float inv1 = l1 > 0.0f ? 1.0f / l1 : 0.0f;
    T* out0 = out + ((long long)(row0 + r_begin + wr0) * num_heads + head) * HD;
    T* out1 = out0 + 8LL * num_heads * HD;
#pragma unroll
    for (int dt = 0; dt < DTILES; ++dt) {
        const int d = dt * 8 + quad * 2;
        if (wr0 < r_count) {
            out0[d] = from_f32<T>(o[dt][0] * inv0);
            out0[d + 1] = from_f32<T>(o[dt][1] * inv0);
        }
        if (wr1 < r_count) {
            out1[d] = from_f32<T>(o[dt][2] * inv1);
            out1[d + 1] = from_f32<T>(o[dt][3] * inv1);
        }
    }
}

// Named `flash_attention_prefill_mma_<dtype>_hd<head_dim>`.
#define INSTANTIATE_MMA(T, S, HD)                                                              \
    extern "C" __global__ void __launch_bounds__(MMA_THREADS)                                  \
        flash_attention_prefill_mma_##S##_hd##HD(                                              \
            T* out, const T* q, long long q_stride, const T* cache_k, const T* cache_v,        \
            const int* cu_seqlens, const int* first_pos, const int* block_tables,              \
            int max_blocks, float scale, int window, int num_heads, int kv_heads,              \
            int block_size) {                                                                  \
        flash_attention_mma<T, HD>(out, q, q_stride, cache_k, cache_v, cu_seqlens, first_pos,  \
                                   block_tables, max_blocks, scale, window, num_heads,         \
                                   kv_heads, block_size);                                      \
    }
INSTANTIATE_MMA(BF16, bf16, 64)
INSTANTIATE_MMA(BF16, bf16, 128)
INSTANTIATE_MMA(F16, f16, 64)
INSTANTIATE_MMA(F16, f16, 128)
