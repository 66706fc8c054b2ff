// Launchers of sum_squares and nonfinite_flag (kernels and launch shapes in gpu/reduce.cuh).
#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "gpu/check.h"
#include "gpu/dispatch.cuh"
#include "gpu/ops.h"
#include "gpu/reduce.cuh"

namespace zo::gpu {
namespace {

bool valid(DType t) {
  return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16;
}

bool aligned(const void* p, std::size_t alignment) {
  return reinterpret_cast<std::uintptr_t>(p) % alignment == 0;
}

void check_args(const char* op, const void* out, const char* out_name, const void* data,
                std::size_t n, DType t) {
  if (!valid(t)) {
    throw std::invalid_argument(std::string(op) + ": invalid DType value " +
                                std::to_string(static_cast<int>(t)));
  }
  if (n == 0) return;
  if (out == nullptr || data == nullptr) {
    throw std::invalid_argument(std::string(op) + ": " + (out == nullptr ? out_name : "data") +
                                " is null (" + std::to_string(n) + " elements)");
  }
}

// Enough blocks to fill the GPU once; the grid-stride loops cover the rest.
int fill_grid(std::size_t threads_needed) {
  int device = 0;
  int sms = 0;
  ZO_CUDA_CHECK(cudaGetDevice(&device));
  ZO_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const std::size_t wanted = (threads_needed + kReduceThreads - 1) / kReduceThreads;
  const std::size_t cap = static_cast<std::size_t>(std::max(sms, 1)) * (2048 / kReduceThreads);
  return static_cast<int>(std::clamp<std::size_t>(wanted, 1, cap));
}

// Stream-ordered scratch: freed on the stream after the kernels that use it, even when a launch
// check throws in between.
class StreamScratch {
 public:
  StreamScratch(std::size_t bytes, cudaStream_t s) : stream_(s) {
    ZO_CUDA_CHECK(cudaMallocAsync(&ptr_, bytes, s));
  }
  ~StreamScratch() {
    if (ptr_ != nullptr) (void)cudaFreeAsync(ptr_, stream_);
  }
  StreamScratch(const StreamScratch&) = delete;
  StreamScratch& operator=(const StreamScratch&) = delete;
  template <typename U>
  U* as() const {
    return static_cast<U*>(ptr_);
  }

 private:
  void* ptr_ = nullptr;
  cudaStream_t stream_;
};

template <typename T>
void sum_squares_typed(float* out, const T* data, std::size_t n, cudaStream_t s) {
  constexpr int kVec = 16 / sizeof(T);
  const int blocks = sum_squares_blocks(n);
  StreamScratch partial(sizeof(double) * static_cast<std::size_t>(blocks), s);
  if (aligned(data, 16)) {
    sum_squares_partial_kernel<T, kVec>
        <<<blocks, kReduceThreads, 0, s>>>(partial.as<double>(), data, n);
  } else {
    sum_squares_partial_kernel<T, 1>
        <<<blocks, kReduceThreads, 0, s>>>(partial.as<double>(), data, n);
  }
  ZO_CUDA_CHECK_LAUNCH();
  sum_squares_finish_kernel<double><<<1, kReduceThreads, 0, s>>>(out, partial.as<double>(), blocks);
  ZO_CUDA_CHECK_LAUNCH();
}

template <typename T>
void nonfinite_flag_typed(float* flag, const T* data, std::size_t n, cudaStream_t s) {
  constexpr int kVec = 16 / sizeof(T);
  if (aligned(data, 16)) {
    nonfinite_flag_kernel<T, kVec><<<fill_grid(n / kVec), kReduceThreads, 0, s>>>(flag, data, n);
  } else {
    nonfinite_flag_kernel<T, 1><<<fill_grid(n), kReduceThreads, 0, s>>>(flag, data, n);
  }
  ZO_CUDA_CHECK_LAUNCH();
}

}  // namespace

void launch_sum_squares(float* out, const void* data, std::size_t n, DType t, cudaStream_t s) {
  check_args("launch_sum_squares", out, "out", data, n, t);
  if (n == 0) return;
  ZO_DISPATCH_DTYPE(t, T, sum_squares_typed<T>(out, static_cast<const T*>(data), n, s));
}

void launch_nonfinite_flag(float* flag, const void* data, std::size_t n, DType t, cudaStream_t s) {
  check_args("launch_nonfinite_flag", flag, "flag", data, n, t);
  if (n == 0) return;
  ZO_DISPATCH_DTYPE(t, T, nonfinite_flag_typed<T>(flag, static_cast<const T*>(data), n, s));
}

}  // namespace zo::gpu
