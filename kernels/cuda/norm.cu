// RMSNorm, plain and fused with the residual add that precedes it in every decoder layer.
//
// One thread block per row: a row (hidden size ≤ 16k) is read twice from L1/L2, once for the
// sum of squares and once to scale, which costs less than staging it in shared memory.
// The fused variant writes `residual += x` back in the storage type and normalises the rounded
// value, so `out` is exactly the norm of what the next layer's residual holds.
#include "common.cuh"

template <typename T>
__device__ void rms_norm_row(const T* x, const T* weight, T* out, int d, float eps) {
    __shared__ float scratch[32];
    float ss = 0.0f;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        const float v = to_f32(x[i]);
        ss += v * v;
    }
    ss = block_sum(ss, scratch);
    const float inv = rsqrtf(ss / (float)d + eps);
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        out[i] = from_f32<T>(to_f32(weight[i]) * (to_f32(x[i]) * inv));
    }
}

// out[r, :] = weight * x[r, :] / rms(x[r, :]); grid.x = rows.
template <typename T>
__device__ void rms_norm(const T* x, const T* weight, T* out, int d, float eps) {
    const long long r = blockIdx.x;
    rms_norm_row(x + r * d, weight, out + r * d, d, eps);
}

// residual[r, :] += x[r, :]; out[r, :] = rms_norm(residual[r, :]); grid.x = rows.
template <typename T>
__device__ void add_rms_norm(T* residual, const T* x, const T* weight, T* out, int d, float eps) {
    const long long r = blockIdx.x;
    T* res = residual + r * d;
    const T* xr = x + r * d;
    // Each thread re-reads only the elements it wrote, so no barrier is needed between passes.
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        res[i] = from_f32<T>(to_f32(res[i]) + to_f32(xr[i]));
    }
    rms_norm_row<T>(res, weight, out + r * d, d, eps);
}

#define INSTANTIATE(T, S)                                                                     \
    extern "C" __global__ void rms_norm_##S(const T* x, const T* w, T* out, int d, float eps) { \
        rms_norm<T>(x, w, out, d, eps);                                                       \
    }                                                                                         \
    extern "C" __global__ void add_rms_norm_##S(T* residual, const T* x, const T* w, T* out,  \
                                                int d, float eps) {                           \
        add_rms_norm<T>(residual, x, w, out, d, eps);                                         \
    }
TESSERA_FOR_EACH_DTYPE(INSTANTIATE)
