// Launcher of cross_entropy (kernel and launch shape in gpu/cross_entropy.cuh).
#include <cstdint>
#include <stdexcept>
#include <string>

#include "gpu/check.h"
#include "gpu/cross_entropy.cuh"
#include "gpu/dispatch.cuh"
#include "gpu/ops.h"

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
    cross_entropy_kernel<T, kVec>
        <<<N, kCrossEntropyThreads, 0, s>>>(losses, dlogits, logits, targets, V, dloss_scale);
  } else {
    cross_entropy_kernel<T, 1>
        <<<N, kCrossEntropyThreads, 0, s>>>(losses, dlogits, logits, targets, V, dloss_scale);
  }
  ZO_CUDA_CHECK_LAUNCH();
}

}  // namespace

void launch_cross_entropy(float* losses, void* dlogits, const void* logits,
                          const std::int32_t* targets, int N, int V, float dloss_scale, DType t,
                          cudaStream_t s) {
  constexpr const char* op = "launch_cross_entropy";
  if (t != DType::kF32 && t != DType::kF16 && t != DType::kBF16) {
    throw std::invalid_argument(std::string(op) + ": invalid DType value " +
                                std::to_string(static_cast<int>(t)));
  }
  const std::string shape = "N = " + std::to_string(N) + ", V = " + std::to_string(V);
  if (N < 0) throw std::invalid_argument(std::string(op) + ": negative row count (" + shape + ")");
  if (N == 0) return;
  if (V <= 0) {
    throw std::invalid_argument(std::string(op) + ": V must be > 0, a softmax needs classes (" +
                                shape + ")");
  }
  const char* null_name = losses == nullptr    ? "losses"
                          : logits == nullptr  ? "logits"
                          : targets == nullptr ? "targets"
                                               : nullptr;
  if (null_name != nullptr) {
    throw std::invalid_argument(std::string(op) + ": " + null_name + " is null (" + shape + ")");
  }
  ZO_DISPATCH_DTYPE(t, T,
                    launch_typed<T>(losses, static_cast<T*>(dlogits), static_cast<const T*>(logits),
                                    targets, N, V, dloss_scale, s));
}

}  // namespace zo::gpu
