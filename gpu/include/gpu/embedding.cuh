// Token + position embedding, forward and backward. Shapes: tokens (B,T) int32, wte (V,C),
// wpe (>= T,C), out/dout (B,T,C); N = B*T rows.
//
// Forward, embedding_forward_kernel: out[n,:] = wte[tokens[n],:] + wpe[n % T,:]. 1-D grid-stride
//   over N * C/kVec packs (kVec = 16 B of T; 1 when C or a pointer does not allow packs),
//   kEmbeddingThreads per block. A negative token id (the host backend throws; a kernel cannot)
//   writes a NaN row, so the loss turns NaN instead of memory being read out of bounds. Ids >= V
//   are not detectable here (V is not passed) and are the data loader's to reject.
//
// Backward is deterministic without float atomics; every sum runs in the host reference's order
// (row order n = 0..N-1), so fp32 results equal the host backend bit for bit:
//   - embedding_dwpe_kernel: one thread per (t, pack of channels) adds dout[b,t,:] over
//     b = 0..B-1 in fp32, starting from dwpe's current value, and rounds to T once.
//     Grid-stride, grid = min(ceil(T * C/kVec / kEmbeddingThreads), one full GPU).
//   - dwte: the launcher stable-sorts (token, row) pairs by token (cub::DeviceRadixSort, itself
//     deterministic), so each token's rows become one run in ascending row order. Then
//     embedding_dwte_kernel runs one thread per (sorted index i, pack of channels); the thread at
//     the first index of a run walks the run in order, adds the dout rows in fp32 starting from
//     dwte's current value and rounds once; all other threads move on at once. Grid-stride,
//     grid = min(ceil(N * C/kVec / kEmbeddingThreads), one full GPU). Work is proportional to N*C,
//     not V*C, and the repeated-token case (the reason a per-channel walk over all N rows would be
//     slow) costs one sequential walk per distinct token and channel pack. A very frequent token
//     (padding, EOT) makes its run the critical path: C/kVec threads walking count(token) rows
//     each.
//   Negative token ids are skipped in backward (their runs sort first).
#pragma once

#include <cstddef>
#include <cstdint>

#include "gpu/cast.cuh"

namespace zo::gpu {

constexpr int kEmbeddingThreads = 256;

namespace embedding_detail {

// acc = the kVec elements at src (one aligned pack), widened to fp32.
template <typename T, int kVec>
__device__ __forceinline__ void load_pack(float (&acc)[kVec], const T* src) {
  const Pack<T, kVec> p = *reinterpret_cast<const Pack<T, kVec>*>(src);
#pragma unroll
  for (int k = 0; k < kVec; ++k)
    acc[k] = to_float(p.v[k]);
}

// acc += the kVec elements at src (one aligned pack), in fp32.
template <typename T, int kVec>
__device__ __forceinline__ void add_pack(float (&acc)[kVec], const T* src) {
  const Pack<T, kVec> p = *reinterpret_cast<const Pack<T, kVec>*>(src);
#pragma unroll
  for (int k = 0; k < kVec; ++k)
    acc[k] += to_float(p.v[k]);
}

// The kVec elements at dst (one aligned pack) = acc, rounded to T.
template <typename T, int kVec>
__device__ __forceinline__ void store_pack(T* dst, const float (&acc)[kVec]) {
  Pack<T, kVec> p;
#pragma unroll
  for (int k = 0; k < kVec; ++k)
    p.v[k] = from_float<T>(acc[k]);
  *reinterpret_cast<Pack<T, kVec>*>(dst) = p;
}

}  // namespace embedding_detail

// out (N, C) written. seq_len = T.
template <typename T, int kVec>
__global__ void __launch_bounds__(kEmbeddingThreads)
    embedding_forward_kernel(T* __restrict__ out, const std::int32_t* __restrict__ tokens,
                             const T* __restrict__ wte, const T* __restrict__ wpe, std::size_t N,
                             int seq_len, int C) {
  const std::size_t row_packs = static_cast<std::size_t>(C / kVec);
  const std::size_t total = N * row_packs;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t p = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < total;
       p += stride) {
    const std::size_t n = p / row_packs;
    const std::size_t c = (p - n * row_packs) * kVec;
    const std::int32_t tok = tokens[n];
    Pack<T, kVec> o;
    if (tok < 0) {
#pragma unroll
      for (int k = 0; k < kVec; ++k)
        o.v[k] = from_float<T>(__int_as_float(0x7fc00000));  // quiet NaN
    } else {
      const std::size_t t = n % static_cast<std::size_t>(seq_len);
      const Pack<T, kVec> w =
          *reinterpret_cast<const Pack<T, kVec>*>(wte + static_cast<std::size_t>(tok) * C + c);
      const Pack<T, kVec> q = *reinterpret_cast<const Pack<T, kVec>*>(wpe + t * C + c);
#pragma unroll
      for (int k = 0; k < kVec; ++k)
        o.v[k] = from_float<T>(to_float(w.v[k]) + to_float(q.v[k]));
    }
    *reinterpret_cast<Pack<T, kVec>*>(out + n * C + c) = o;
  }
}

// dwpe (T, C) += sum over b of dout (B, T, C).
template <typename T, int kVec>
__global__ void __launch_bounds__(kEmbeddingThreads)
    embedding_dwpe_kernel(T* __restrict__ dwpe, const T* __restrict__ dout, int B, int seq_len,
                          int C) {
  using namespace embedding_detail;
  const std::size_t row_packs = static_cast<std::size_t>(C / kVec);
  const std::size_t total = static_cast<std::size_t>(seq_len) * row_packs;
  const std::size_t batch_stride = static_cast<std::size_t>(seq_len) * C;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t p = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < total;
       p += stride) {
    const std::size_t t = p / row_packs;
    const std::size_t c = (p - t * row_packs) * kVec;
    T* dst = dwpe + t * C + c;
    float acc[kVec];
    load_pack<T, kVec>(acc, dst);
    for (int b = 0; b < B; ++b)
      add_pack<T, kVec>(acc, dout + static_cast<std::size_t>(b) * batch_stride + t * C + c);
    store_pack<T, kVec>(dst, acc);
  }
}

// rows[i] = i (N): the values the token sort carries along. One thread per row.
template <typename Index>
__global__ void __launch_bounds__(kEmbeddingThreads) embedding_iota_kernel(Index* rows, Index N) {
  const Index i =
      static_cast<Index>(blockIdx.x) * kEmbeddingThreads + static_cast<Index>(threadIdx.x);
  if (i < N) rows[i] = i;
}

// dwte (V, C) += dout rows grouped by token. sorted_tokens/sorted_rows (N): the (token, row)
// pairs stable-sorted by token.
template <typename T, int kVec>
__global__ void __launch_bounds__(kEmbeddingThreads)
    embedding_dwte_kernel(T* __restrict__ dwte, const T* __restrict__ dout,
                          const std::int32_t* __restrict__ sorted_tokens,
                          const std::int32_t* __restrict__ sorted_rows, int N, int C) {
  using namespace embedding_detail;
  const std::size_t row_packs = static_cast<std::size_t>(C / kVec);
  const std::size_t total = static_cast<std::size_t>(N) * row_packs;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t p = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < total;
       p += stride) {
    const int i = static_cast<int>(p / row_packs);
    const std::size_t c = (p - static_cast<std::size_t>(i) * row_packs) * kVec;
    const std::int32_t tok = sorted_tokens[i];
    if (tok < 0 || (i > 0 && sorted_tokens[i - 1] == tok)) continue;  // not the head of a run
    T* dst = dwte + static_cast<std::size_t>(tok) * C + c;
    float acc[kVec];
    load_pack<T, kVec>(acc, dst);
    for (int j = i; j < N && sorted_tokens[j] == tok; ++j)
      add_pack<T, kVec>(acc, dout + static_cast<std::size_t>(sorted_rows[j]) * C + c);
    store_pack<T, kVec>(dst, acc);
  }
}

}  // namespace zo::gpu
