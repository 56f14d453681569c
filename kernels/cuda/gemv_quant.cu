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

template <typename T>
__device__ void gemv_q8_0(const BlockQ8_0* w, const T* x, T* y, int n, int k, int m) {
    const int row = blockIdx.x * GQ_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= n) return;
    const int nb = k / 32;
    const BlockQ8_0* wr = w + (long long)row * nb;
    float acc[GQ_MAX_M];
#pragma unroll
    for (int i = 0; i < GQ_MAX_M; ++i) acc[i] = 0.0f;
    for (int b = lane; b < nb; b += 32) {
        const BlockQ8_0& blk = wr[b];
        const float d = f16_bits(blk.d);
        float q[32];
#pragma unroll
        for (int j = 0; j < 32; ++j) q[j] = (float)blk.qs[j];
#pragma unroll
        for (int i = 0; i < GQ_MAX_M; ++i) {
            if (i >= m) break;
            const T* xb = x + (long long)i * k + b * 32;
            float s = 0.0f;
#pragma unroll
            for (int j = 0; j < 32; ++j) s += q[j] * to_f32(xb[j]);
            acc[i] += s * d;
        }
    }
#pragma unroll
    for (int i = 0; i < GQ_MAX_M; ++i) {
        if (i >= m) break;
        const float s = warp_sum(acc[i]);
        if (lane == 0) y[(long long)i * n + row] = from_f32<T>(s);
    }
}

template <typename T>
__device__ void gemv_q4_0(const BlockQ4_0* w, const T* x, T* y, int n, int k, int m) {
    const int row = blockIdx.x * GQ_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= n) return;
    const int nb = k / 32;
    const BlockQ4_0* wr = w + (long long)row * nb;
    float acc[GQ_MAX_M];
#pragma unroll
    for (int i = 0; i < GQ_MAX_M; ++i) acc[i] = 0.0f;
    for (int b = lane; b < nb; b += 32) {
        const BlockQ4_0& blk = wr[b];
        const float d = f16_bits(blk.d);
        float lo[16], hi[16];
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            const u8 v = blk.qs[j];
            lo[j] = (float)((int)(v & 0x0f) - 8);
            hi[j] = (float)((int)(v >> 4) - 8);
        }
#pragma unroll
        for (int i = 0; i < GQ_MAX_M; ++i) {
            if (i >= m) break;
            const T* xb = x + (long long)i * k + b * 32;
            float s = 0.0f;
#pragma unroll
            for (int j = 0; j < 16; ++j) s += lo[j] * to_f32(xb[j]) + hi[j] * to_f32(xb[j + 16]);
            acc[i] += s * d;
        }
    }
#pragma unroll
    for (int i = 0; i < GQ_MAX_M; ++i) {
        if (i >= m) break;
        const float s = warp_sum(acc[i]);
        if (lane == 0) y[(long long)i * n + row] = from_f32<T>(s);
    }
}

template <typename T>
__device__ void gemv_q4_1(const BlockQ4_1* w, const T* x, T* y, int n, int k, int m) {
    const int row = blockIdx.x * GQ_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= n) return;
    const int nb = k / 32;
    const BlockQ4_1* wr = w + (long long)row * nb;
    float acc[GQ_MAX_M];
#pragma unroll
    for (int i = 0; i < GQ_MAX_M; ++i) acc[i] = 0.0f;
    for (int b = lane; b < nb; b += 32) {
        const BlockQ4_1& blk = wr[b];
        const float d = f16_bits(blk.d), mn = f16_bits(blk.m);
        float lo[16], hi[16];
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            const u8 v = blk.qs[j];
            lo[j] = (float)(v & 0x0f);
            hi[j] = (float)(v >> 4);
        }
#pragma unroll
        for (int i = 0; i < GQ_MAX_M; ++i) {
            if (i >= m) break;
            const T* xb = x + (long long)i * k + b * 32;
            // Σ (q·d + m)·x = d·Σ q·x + m·Σ x.
            float s = 0.0f, sx = 0.0f;
#pragma unroll
            for (int j = 0; j < 16; ++j) {
                const float a = to_f32(xb[j]), c = to_f32(xb[j + 16]);
                s += lo[j] * a + hi[j] * c;
                sx += a + c;
            }
            acc[i] += s * d + sx * mn;
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
template <typename T>
__device__ void dequant_q8_0(const BlockQ8_0* w, T* out, long long blocks) {
    const long long b = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= blocks) return;
    const float d = f16_bits(w[b].d);
#pragma unroll
    for (int j = 0; j < 32; ++j) out[b * 32 + j] = from_f32<T>((float)w[b].qs[j] * d);
}

template <typename T>
__device__ void dequant_q4_0(const BlockQ4_0* w, T* out, long long blocks) {
    const long long b = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= blocks) return;
    const float d = f16_bits(w[b].d);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
        const u8 v = w[b].qs[j];
        out[b * 32 + j] = from_f32<T>((float)((int)(v & 0x0f) - 8) * d);
        out[b * 32 + j + 16] = from_f32<T>((float)((int)(v >> 4) - 8) * d);
    }
}

template <typename T>
__device__ void dequant_q4_1(const BlockQ4_1* w, T* out, long long blocks) {
    const long long b = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= blocks) return;
    const float d = f16_bits(w[b].d), mn = f16_bits(w[b].m);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
        const u8 v = w[b].qs[j];
        out[b * 32 + j] = from_f32<T>((float)(v & 0x0f) * d + mn);
        out[b * 32 + j + 16] = from_f32<T>((float)(v >> 4) * d + mn);
    }
}

#define INSTANTIATE(T, S)                                                                      \
    extern "C" __global__ void __launch_bounds__(GQ_WARPS * 32)                                \
        gemv_q4_1_##S(const BlockQ4_1* w, const T* x, T* y, int n, int k, int m) {             \
        gemv_q4_1<T>(w, x, y, n, k, m);                                                        \
    }                                                                                          \
    extern "C" __global__ void dequant_q8_0_##S(const BlockQ8_0* w, T* out, long long blocks) {\
        dequant_q8_0<T>(w, out, blocks);                                                       \
    }                                                                                          \
    extern "C" __global__ void dequant_q4_0_##S(const BlockQ4_0* w, T* out, long long blocks) {\
        dequant_q4_0<T>(w, out, blocks);                                                       \
    }                                                                                          \
    extern "C" __global__ void dequant_q4_1_##S(const BlockQ4_1* w, T* out, long long blocks) {\
        dequant_q4_1<T>(w, out, blocks);                                                       \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(GQ_WARPS * 32)                                \
        gemv_q8_0_##S(const BlockQ8_0* w, const T* x, T* y, int n, int k, int m) {             \
        gemv_q8_0<T>(w, x, y, n, k, m);                                                        \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(GQ_WARPS * 32)                                \
        gemv_q4_0_##S(const BlockQ4_0* w, const T* x, T* y, int n, int k, int m) {             \
        gemv_q4_0<T>(w, x, y, n, k, m);                                                        \
    }
TESSERA_FOR_EACH_DTYPE(INSTANTIATE)
