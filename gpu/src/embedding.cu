// Launchers of embedding_forward and embedding_backward (kernels and launch shapes in
// gpu/embedding.cuh).
#include <climits>
#include <cstdint>
#include <cub/device/device_radix_sort.cuh>
#include <initializer_list>
#include <string>

#include "gpu/check.h"
#include "gpu/dispatch.cuh"
#include "gpu/embedding.cuh"
#include "gpu/ops.h"
#include "launch_util.h"

namespace zo::gpu {
namespace {

using detail::aligned;
using detail::bad_arg;
using detail::StreamScratch;

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

template <typename T>
void backward_typed(T* dwte, T* dwpe, const T* dout, const std::int32_t* tokens, int B, int T_,
                    int C, cudaStream_t s) {
  constexpr int kVec = 16 / sizeof(T);
  const bool packs = C % kVec == 0 && aligned(dout, 16);

  // dwpe (T, C) += sum over the batch.
  const std::size_t wpe_elements = static_cast<std::size_t>(T_) * C;
  if (packs && aligned(dwpe, 16)) {
    ZO_LAUNCH(fill_grid(wpe_elements / kVec), kEmbeddingThreads, 0, s,
              embedding_dwpe_kernel<T, kVec>)
    (dwpe, dout, B, T_, C);
  } else {
    ZO_LAUNCH(fill_grid(wpe_elements), kEmbeddingThreads, 0, s, embedding_dwpe_kernel<T, 1>)
    (dwpe, dout, B, T_, C);
  }
  ZO_CUDA_CHECK_LAUNCH();

  // dwte (V, C): sort (token, row) pairs by token, then one walk per run of equal tokens.
  const int N = B * T_;
  std::size_t sort_bytes = 0;
  ZO_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
      nullptr, sort_bytes, tokens, static_cast<std::int32_t*>(nullptr),
      static_cast<const std::int32_t*>(nullptr), static_cast<std::int32_t*>(nullptr), N, 0,
      static_cast<int>(sizeof(std::int32_t) * 8), s));
  const std::size_t ints =
      detail::round_up(sizeof(std::int32_t) * static_cast<std::size_t>(N), 256);
  StreamScratch scratch(3 * ints + sort_bytes, s);
  auto* sorted_tokens = scratch.as<std::int32_t>();
  auto* rows = scratch.as<std::int32_t>(ints);
  auto* sorted_rows = scratch.as<std::int32_t>(2 * ints);
  void* sort_temp = scratch.as<char>(3 * ints);

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
                  {{out, "out"}, {tokens, "tokens"}, {wte, "wte"}, {wpe, "wpe"}})) {
    return;
  }
  ZO_DISPATCH_DTYPE(t, S,
                    forward_typed<S>(static_cast<S*>(out), tokens, static_cast<const S*>(wte),
                                     static_cast<const S*>(wpe), B, T, C, s));
}

void launch_embedding_backward(void* dwte, void* dwpe, const void* dout, const std::int32_t* tokens,
                               int B, int T, int C, DType t, cudaStream_t s) {
  if (!check_args("launch_embedding_backward", B, T, C, t,
                  {{dwte, "dwte"}, {dwpe, "dwpe"}, {dout, "dout"}, {tokens, "tokens"}})) {
    return;
  }
  ZO_DISPATCH_DTYPE(t, S,
                    backward_typed<S>(static_cast<S*>(dwte), static_cast<S*>(dwpe),
                                      static_cast<const S*>(dout), tokens, B, T, C, s));
}

}  // namespace zo::gpu
