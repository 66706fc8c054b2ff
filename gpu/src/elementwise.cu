// Launchers of gelu_forward, gelu_backward, residual_forward and accumulate (kernel and launch
// shape in gpu/elementwise.cuh).
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>

#include "gpu/check.h"
#include "gpu/dispatch.cuh"
#include "gpu/elementwise.cuh"
#include "gpu/ops.h"

namespace zo::gpu {
namespace {

struct Named {
  const void* p;
  const char* name;
};

// False when n == 0 (nothing to launch). Throws for an invalid dtype or a null pointer.
bool check_args(const char* op, std::size_t n, DType t, std::initializer_list<Named> ptrs) {
  if (t != DType::kF32 && t != DType::kF16 && t != DType::kBF16) {
    throw std::invalid_argument(std::string(op) + ": invalid DType value " +
                                std::to_string(static_cast<int>(t)));
  }
  if (n == 0) return false;
  for (const Named& p : ptrs) {
    if (p.p == nullptr) {
      throw std::invalid_argument(std::string(op) + ": " + p.name + " is null (" +
                                  std::to_string(n) + " elements)");
    }
  }
  return true;
}

bool aligned(const void* p, std::size_t alignment) {
  return reinterpret_cast<std::uintptr_t>(p) % alignment == 0;
}

// Enough blocks to fill the GPU once; the grid-stride loop covers the rest.
int fill_grid(std::size_t threads_needed) {
  int device = 0;
  int sms = 0;
  ZO_CUDA_CHECK(cudaGetDevice(&device));
  ZO_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const std::size_t wanted = (threads_needed + kElementwiseThreads - 1) / kElementwiseThreads;
  const std::size_t cap = static_cast<std::size_t>(std::max(sms, 1)) * (2048 / kElementwiseThreads);
  return static_cast<int>(std::clamp<std::size_t>(wanted, 1, cap));
}

template <typename T, typename Op>
void launch_typed(void* dst, const void* a, const void* b, std::size_t n, cudaStream_t s) {
  constexpr int kVec = 16 / sizeof(T);
  auto* d = static_cast<T*>(dst);
  const auto* x = static_cast<const T*>(a);
  const auto* y = static_cast<const T*>(b);
  if (aligned(dst, 16) && aligned(a, 16) && (!Op::kUsesB || aligned(b, 16))) {
    elementwise_kernel<T, kVec, Op><<<fill_grid(n / kVec), kElementwiseThreads, 0, s>>>(d, x, y, n);
  } else {
    elementwise_kernel<T, 1, Op><<<fill_grid(n), kElementwiseThreads, 0, s>>>(d, x, y, n);
  }
  ZO_CUDA_CHECK_LAUNCH();
}

template <typename Op>
void launch(void* dst, const void* a, const void* b, std::size_t n, DType t, cudaStream_t s) {
  ZO_DISPATCH_DTYPE(t, T, launch_typed<T, Op>(dst, a, b, n, s));
}

}  // namespace

void launch_gelu_forward(void* out, const void* inp, std::size_t n, DType t, cudaStream_t s) {
  if (!check_args("launch_gelu_forward", n, t, {{out, "out"}, {inp, "inp"}})) return;
  launch<GeluForwardOp>(out, inp, nullptr, n, t, s);
}

void launch_gelu_backward(void* dinp, const void* inp, const void* dout, std::size_t n, DType t,
                          cudaStream_t s) {
  if (!check_args("launch_gelu_backward", n, t, {{dinp, "dinp"}, {inp, "inp"}, {dout, "dout"}})) {
    return;
  }
  launch<GeluBackwardOp>(dinp, inp, dout, n, t, s);
}

void launch_residual_forward(void* out, const void* a, const void* b, std::size_t n, DType t,
                             cudaStream_t s) {
  if (!check_args("launch_residual_forward", n, t, {{out, "out"}, {a, "a"}, {b, "b"}})) return;
  launch<AddOp>(out, a, b, n, t, s);
}

void launch_accumulate(void* dst, const void* src, std::size_t n, DType t, cudaStream_t s) {
  if (!check_args("launch_accumulate", n, t, {{dst, "dst"}, {src, "src"}})) return;
  launch<AccumulateOp>(dst, src, nullptr, n, t, s);
}

}  // namespace zo::gpu
