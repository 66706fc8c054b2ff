// Launcher of cross_entropy (kernel and launch shape in gpu/cross_entropy.cuh).
#include <cstdint>
#include <string>

#include "gpu/check.h"
#include "gpu/cross_entropy.cuh"
#include "gpu/dispatch.cuh"
#include "gpu/ops.h"
#include "launch_util.h"

namespace zo::gpu {
namespace {

template <typename T>
void launch_typed(float* losses, T* dlogits, const T* logits, const std::int32_t* targets, int N,
                  int V, float dloss_scale, cudaStream_t s) {
  constexpr int kVec = 16 / sizeof(T);
  // Packs need dlogits at the same offset as logits modulo 16 B (always true when they alias).
  const auto gap =
      reinterpret_cast<std::uintptr_t>(dlogits) - reinterpret_cast<std::uintptr_t>(logits);
  if (dlogits == nullptr || gap % 16 == 0) {
    ZO_LAUNCH(N, kCrossEntropyThreads, 0, s, cross_entropy_kernel<T, kVec>)
    (losses, dlogits, logits, targets, V, dloss_scale);
  } else {
    ZO_LAUNCH(N, kCrossEntropyThreads, 0, s, cross_entropy_kernel<T, 1>)
    (losses, dlogits, logits, targets, V, dloss_scale);
  }
  ZO_CUDA_CHECK_LAUNCH();
}

}  // namespace

void launch_cross_entropy(float* losses, void* dlogits, const void* logits,
                          const std::int32_t* targets, int N, int V, float dloss_scale, DType t,
                          cudaStream_t s) {
  constexpr const char* op = "launch_cross_entropy";
  detail::check_dtype(op, t);
  const std::string shape = "N = " + std::to_string(N) + ", V = " + std::to_string(V);
  if (!detail::check_rows(op, N, V, "V", "a softmax needs classes", shape)) return;
  detail::check_not_null(op, {{losses, "losses"}, {logits, "logits"}, {targets, "targets"}},
                         [&] { return shape; });
  ZO_DISPATCH_DTYPE(t, T,
                    launch_typed<T>(losses, static_cast<T*>(dlogits), static_cast<const T*>(logits),
                                    targets, N, V, dloss_scale, s));
}

}  // namespace zo::gpu
