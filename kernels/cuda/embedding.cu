// Embedding gather: out[t, :] = table[ids[t] - vocab_start, :].
//
// With a vocab-parallel embedding each rank holds rows `vocab_start .. vocab_start + rows`;
// ids outside that range produce zeros, so an all-reduce (sum) over ranks assembles the rows.
#include "common.cuh"

// grid.x = tokens; threads stride over the hidden size.
template <typename T>
__device__ void embedding(const int* ids, const T* table, T* out, int hidden, int vocab_start,
                          int vocab_rows) {
    const long long t = blockIdx.x;
    const int row = ids[t] - vocab_start;
    const bool here = row >= 0 && row < vocab_rows;
    T* o = out + t * hidden;
    const T* src = table + (long long)(here ? row : 0) * hidden;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        o[i] = here ? src[i] : from_f32<T>(0.0f);
    }
}

#define INSTANTIATE(T, S)                                                                  \
    extern "C" __global__ void embedding_##S(const int* ids, const T* table, T* out,       \
                                             int hidden, int vocab_start, int vocab_rows) { \
        embedding<T>(ids, table, out, hidden, vocab_start, vocab_rows);                    \
    }
TESSERA_FOR_EACH_DTYPE(INSTANTIATE)
