// Weight-only quantized GEMV for decode: y[i, n] = Σ_k x[i, k] · W[n, k], with W stored in
// ggml blocks exactly as in the GGUF file (`quant::BlockQ8_0`, `quant::BlockQ4_0`,
// `quant::BlockQ4_1`), row n being k / 32 consecutive blocks. Decode is bound by weight
// bandwidth, so the weights are read once and dequantized in registers; the few activation
// rows (m ≤ GQ_MAX_M) reuse each loaded block. Larger m (prefill) dequantizes the matrix
// (`dequant_*`, one thread per block) and goes through cuBLASLt instead.
//
// One warp per weight row, 4 rows per block. Lane b takes blocks b, b + 32, …: a warp reads
// 32 consecutive blocks (1088 bytes for Q8_0) per step, which coalesces into full cache lines.
// Block layouts (34 / 18 bytes) keep the f16 scale 2-byte aligned, so it is read as one u16.
#include "common.cuh"

#define GQ_WARPS 4
#define GQ_MAX_M 8

struct BlockQ8_0 { tessera_f16 d; i8 qs[32]; };        // 34 bytes
struct BlockQ4_0 { tessera_f16 d; u8 qs[16]; };        // 18 bytes: lo nibble j, hi nibble j+16
struct BlockQ4_1 { tessera_f16 d; tessera_f16 m; u8 qs[16]; };  // 20 bytes: value = q · d + m

__device__ __forceinline__ float f16_bits(tessera_f16 bits) {
    F16 h;
    h.bits = bits;
    return to_f32(h);
}

// Each format's block, dequantized into registers: w[j] = value j of the block.
__device__ __forceinline__ void load_block(const BlockQ8_0& b, float w[32]) {
    const float d = f16_bits(b.d);
#pragma unroll
    for (int j = 0; j < 32; ++j) w[j] = (float)b.qs[j] * d;
}

__device__ __forceinline__ void load_block(const BlockQ4_0& b, float w[32]) {
    const float d = f16_bits(b.d);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
        w[j] = (float)((int)(b.qs[j] & 0x0f) - 8) * d;
        w[j + 16] = (float)((int)(b.qs[j] >> 4) - 8) * d;
    }
}

__device__ __forceinline__ void load_block(const BlockQ4_1& b, float w[32]) {
    const float d = f16_bits(b.d), m = f16_bits(b.m);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
        w[j] = (float)(b.qs[j] & 0x0f) * d + m;
        w[j + 16] = (float)(b.qs[j] >> 4) * d + m;
    }
}

template <typename Block, typename T>
__device__ void gemv(const Block* w, const T* x, T* y, int n, int k, int m) {
    const int row = blockIdx.x * GQ_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= n) return;
    const int nb = k / 32;
    const Block* wr = w + (long long)row * nb;
    float acc[GQ_MAX_M];
#pragma unroll
    for (int i = 0; i < GQ_MAX_M; ++i) acc[i] = 0.0f;
    for (int b = lane; b < nb; b += 32) {
        float wv[32];
        load_block(wr[b], wv);
#pragma unroll
        for (int i = 0; i < GQ_MAX_M; ++i) {
            if (i >= m) break;
            const T* xb = x + (long long)i * k + b * 32;
            float s = 0.0f;
#pragma unroll
            for (int j = 0; j < 32; ++j) s += wv[j] * to_f32(xb[j]);
            acc[i] += s;
        }
    }
#pragma unroll
    for (int i = 0; i < GQ_MAX_M; ++i) {
        if (i >= m) break;
        const float s = warp_sum(acc[i]);
        if (lane == 0) y[(long long)i * n + row] = from_f32<T>(s);
    }
}

// Dequantization of a whole matrix (`blocks` blocks of 32 values) into the storage type: one
// thread per block, for products with many activation rows.
template <typename Block, typename T>
__device__ void dequant(const Block* w, T* out, long long blocks) {
    const long long b = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= blocks) return;
    float wv[32];
    load_block(w[b], wv);
#pragma unroll
    for (int j = 0; j < 32; ++j) out[b * 32 + j] = from_f32<T>(wv[j]);
}

#define INSTANTIATE_FORMAT(T, S, F)                                                            \
    extern "C" __global__ void __launch_bounds__(GQ_WARPS * 32)                                \
        gemv_##F##_##S(const Block##F* w, const T* x, T* y, int n, int k, int m) {             \
        gemv<Block##F, T>(w, x, y, n, k, m);                                                   \
    }                                                                                          \
    extern "C" __global__ void dequant_##F##_##S(const Block##F* w, T* out, long long blocks) {  \
        dequant<Block##F, T>(w, out, blocks);                                                  \
    }
// ggml's block names are upper case (BlockQ8_0); the kernels' are lower case (gemv_q8_0_bf16).
typedef BlockQ8_0 Blockq8_0;
typedef BlockQ4_0 Blockq4_0;
typedef BlockQ4_1 Blockq4_1;
#define INSTANTIATE(T, S)                                                                      \
    INSTANTIATE_FORMAT(T, S, q8_0)                                                             \
    INSTANTIATE_FORMAT(T, S, q4_0)                                                             \
    INSTANTIATE_FORMAT(T, S, q4_1)
TESSERA_FOR_EACH_DTYPE(INSTANTIATE)
