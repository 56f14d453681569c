// Shared helpers for every Tessera kernel: storage types, conversions, warp/block reductions.
//
// Why no <cuda_fp16.h> / <cuda_bf16.h>: the kernels are compiled at start-up by NVRTC, and a
// machine with only the driver and libnvrtc (no toolkit) has no headers. Half types are stored
// as raw 16-bit words and converted with one PTX instruction (f16) or a shift (bf16), which is
// exactly what the headers do. All arithmetic happens in f32.
//
// The Rust side inlines this file in place of `#include "common.cuh"` before handing a source to
// NVRTC; nvcc finds it with `-I kernels/cuda`.
#pragma once

typedef unsigned short tessera_f16;   // IEEE binary16 bits
typedef unsigned short tessera_bf16;  // bfloat16 bits
typedef unsigned char u8;
typedef signed char i8;
typedef unsigned int u32;

// No <math.h> under NVRTC without headers: spell the infinities out.
#define TESSERA_NEG_INF __int_as_float(0xff800000)

// Storage type -> f32 and back. One overload set so templates read `to_f32(x[i])`.
struct F16 { tessera_f16 bits; };
struct BF16 { tessera_bf16 bits; };

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(F16 x) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x.bits));
    return f;
}
__device__ __forceinline__ float to_f32(BF16 x) {
    return __uint_as_float(((u32)x.bits) << 16);
}

template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ F16 from_f32<F16>(float x) {
    F16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.bits) : "f"(x));
    return h;
}
template <> __device__ __forceinline__ BF16 from_f32<BF16>(float x) {
    // Round to nearest even, as `half::bf16::from_f32` and `__float2bfloat16_rn` do; NaN stays
    // a (quiet) NaN instead of rounding into infinity.
    u32 u = __float_as_uint(x);
    BF16 b;
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        b.bits = (tessera_bf16)((u >> 16) | 0x40u);
    } else {
        b.bits = (tessera_bf16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
    return b;
}

// Kernels are templates over the storage type; each file instantiates them under C names with
// these suffixes (`rms_norm_bf16`, …), which the Rust launchers build from the dtype.
#define TESSERA_FOR_EACH_DTYPE(X) X(float, f32) X(F16, f16) X(BF16, bf16)

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over the whole thread block (blockDim.x a multiple of 32, at most 1024). `scratch` holds
// 32 floats of shared memory; every thread gets the result.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_sum(v);
    __syncthreads();  // scratch may still be read by a previous reduction
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    const int warps = blockDim.x >> 5;
    v = lane < warps ? scratch[lane] : 0.0f;
    return warp_sum(v);
}

__device__ __forceinline__ float block_max(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    const int warps = blockDim.x >> 5;
    v = lane < warps ? scratch[lane] : TESSERA_NEG_INF;
    return warp_max(v);
}
