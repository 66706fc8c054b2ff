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

#include <cub/device/device_radix_sort.cuh>

#include <climits>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "cast.cuh"
#include "dispatch.cuh"
#include "gpu/check.h"
#include "gpu/ops.h"
#include "launch_util.h"

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
      if (wpe == nullptr) {  // no learned positions (Llama): the embedding row itself
        o = w;
      } else {
        const Pack<T, kVec> q = *reinterpret_cast<const Pack<T, kVec>*>(wpe + t * C + c);
#pragma unroll
        for (int k = 0; k < kVec; ++k)
          o.v[k] = from_float<T>(to_float(w.v[k]) + to_float(q.v[k]));
      }
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
    store_floats<T, kVec>(dst, acc);
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
    store_floats<T, kVec>(dst, acc);
  }
}

namespace {

using detail::aligned;
using detail::bad_arg;

std::string shape(int B, int T, int C) {
  return "B = " + std::to_string(B) + ", T = " + std::to_string(T) + ", C = " + std::to_string(C);
}

// False when there is nothing to do (B, T or C is 0). Throws for an invalid dtype, negative
// sizes, B*T beyond int or a null pointer.
bool check_args(const char* op, int B, int T, int C, DType t,
                std::initializer_list<detail::Named> ptrs) {
  detail::check_dtype(op, t);
  if (B < 0 || T < 0 || C < 0) bad_arg(op, "negative size (" + shape(B, T, C) + ")");
  if (B == 0 || T == 0 || C == 0) return false;
  if (static_cast<long long>(B) * T > INT_MAX) {
    bad_arg(op, "B * T exceeds " + std::to_string(INT_MAX) + " rows (" + shape(B, T, C) + ")");
  }
  detail::check_not_null(op, ptrs, [&] { return shape(B, T, C); });
  return true;
}

int fill_grid(std::size_t threads_needed) {
  return detail::fill_grid(threads_needed, kEmbeddingThreads);
}

template <typename T>
void forward_typed(T* out, const std::int32_t* tokens, const T* wte, const T* wpe, int B, int T_,
                   int C, cudaStream_t s) {
  constexpr int kVec = 16 / sizeof(T);
  const std::size_t N = static_cast<std::size_t>(B) * T_;
  if (C % kVec == 0 && aligned(out, 16) && aligned(wte, 16) && aligned(wpe, 16)) {
    ZO_LAUNCH(fill_grid(N * (C / kVec)), kEmbeddingThreads, 0, s, embedding_forward_kernel<T, kVec>)
    (out, tokens, wte, wpe, N, T_, C);
  } else {
    ZO_LAUNCH(fill_grid(N * C), kEmbeddingThreads, 0, s, embedding_forward_kernel<T, 1>)
    (out, tokens, wte, wpe, N, T_, C);
  }
  ZO_CUDA_CHECK_LAUNCH();
}

// One (N) int32 array of the sort, padded so the next one starts 256-aligned.
std::size_t sorted_ints_bytes(int N) {
  return detail::round_up(sizeof(std::int32_t) * static_cast<std::size_t>(N), 256);
}

// cub's temporary storage for sorting N (token, row) pairs (a query: nothing runs).
std::size_t radix_sort_bytes(int N) {
  std::size_t bytes = 0;
  ZO_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
      nullptr, bytes, static_cast<const std::int32_t*>(nullptr),
      static_cast<std::int32_t*>(nullptr), static_cast<const std::int32_t*>(nullptr),
      static_cast<std::int32_t*>(nullptr), N, 0, static_cast<int>(sizeof(std::int32_t) * 8)));
  return bytes;
}

// scratch: sorted tokens, rows, sorted rows (N each), then cub's sort storage.
template <typename T>
void backward_typed(T* dwte, T* dwpe, const T* dout, const std::int32_t* tokens, int B, int T_,
                    int C, std::int32_t* scratch, cudaStream_t s) {
  constexpr int kVec = 16 / sizeof(T);
  const bool packs = C % kVec == 0 && aligned(dout, 16);

  // dwpe (T, C) += sum over the batch; none without learned positions.
  const std::size_t wpe_elements = static_cast<std::size_t>(T_) * C;
  if (dwpe == nullptr) {
    // nothing
  } else if (packs && aligned(dwpe, 16)) {
    ZO_LAUNCH(fill_grid(wpe_elements / kVec), kEmbeddingThreads, 0, s,
              embedding_dwpe_kernel<T, kVec>)
    (dwpe, dout, B, T_, C);
  } else {
    ZO_LAUNCH(fill_grid(wpe_elements), kEmbeddingThreads, 0, s, embedding_dwpe_kernel<T, 1>)
    (dwpe, dout, B, T_, C);
  }
  if (dwpe != nullptr) ZO_CUDA_CHECK_LAUNCH();

  // dwte (V, C): sort (token, row) pairs by token, then one walk per run of equal tokens.
  const int N = B * T_;
  const std::size_t ints = sorted_ints_bytes(N);
  auto* sorted_tokens = scratch;
  auto* rows = sorted_tokens + ints / sizeof(std::int32_t);
  auto* sorted_rows = rows + ints / sizeof(std::int32_t);
  void* sort_temp = sorted_rows + ints / sizeof(std::int32_t);
  std::size_t sort_bytes = radix_sort_bytes(N);

  ZO_LAUNCH(detail::ceil_div(N, kEmbeddingThreads), kEmbeddingThreads, 0, s,
            embedding_iota_kernel<std::int32_t>)
  (rows, N);
  ZO_CUDA_CHECK_LAUNCH();
  ZO_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
      sort_temp, sort_bytes, tokens, sorted_tokens, static_cast<const std::int32_t*>(rows),
      sorted_rows, N, 0, static_cast<int>(sizeof(std::int32_t) * 8), s));
  const std::size_t wte_work = static_cast<std::size_t>(N) * C;
  if (packs && aligned(dwte, 16)) {
    ZO_LAUNCH(fill_grid(wte_work / kVec), kEmbeddingThreads, 0, s, embedding_dwte_kernel<T, kVec>)
    (dwte, dout, sorted_tokens, sorted_rows, N, C);
  } else {
    ZO_LAUNCH(fill_grid(wte_work), kEmbeddingThreads, 0, s, embedding_dwte_kernel<T, 1>)
    (dwte, dout, sorted_tokens, sorted_rows, N, C);
  }
  ZO_CUDA_CHECK_LAUNCH();
}

}  // namespace

void launch_embedding_forward(void* out, const std::int32_t* tokens, const void* wte,
                              const void* wpe, int B, int T, int C, DType t, cudaStream_t s) {
  if (!check_args("launch_embedding_forward", B, T, C, t,
                  {{out, "out"}, {tokens, "tokens"}, {wte, "wte"}})) {
    return;
  }
  ZO_DISPATCH_DTYPE(t, S,
                    forward_typed<S>(static_cast<S*>(out), tokens, static_cast<const S*>(wte),
                                     static_cast<const S*>(wpe), B, T, C, s));
}

std::size_t embedding_backward_scratch_bytes(int B, int T) {
  if (B <= 0 || T <= 0) return 0;
  const int N = B * T;
  return 3 * sorted_ints_bytes(N) + radix_sort_bytes(N);
}

void launch_embedding_backward(void* dwte, void* dwpe, const void* dout, const std::int32_t* tokens,
                               int B, int T, int C, DType t, void* scratch, cudaStream_t s) {
  if (!check_args("launch_embedding_backward", B, T, C, t,
                  {{dwte, "dwte"}, {dout, "dout"}, {tokens, "tokens"}, {scratch, "scratch"}})) {
    return;
  }
  ZO_DISPATCH_DTYPE(
      t, S,
      backward_typed<S>(static_cast<S*>(dwte), static_cast<S*>(dwpe), static_cast<const S*>(dout),
                        tokens, B, T, C, static_cast<std::int32_t*>(scratch), s));
}

}  // namespace zo::gpu
