// Launchers of layernorm_forward and layernorm_backward (kernels and launch shapes in
// gpu/layernorm.cuh).
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>

#include "gpu/check.h"
#include "gpu/dispatch.cuh"
#include "gpu/layernorm.cuh"
#include "gpu/ops.h"

namespace zo::gpu {
namespace {

struct Named {
  const void* p;
  const char* name;
};

// False when N is 0 (nothing to do). Throws for an invalid dtype, N < 0, C <= 0 (a row needs a
// mean) or a null pointer.
bool check_args(const char* op, int N, int C, DType t, std::initializer_list<Named> ptrs) {
  if (t != DType::kF32 && t != DType::kF16 && t != DType::kBF16) {
    throw std::invalid_argument(std::string(op) + ": invalid DType value " +
                                std::to_string(static_cast<int>(t)));
  }
  const std::string shape = "N = " + std::to_string(N) + ", C = " + std::to_string(C);
  if (N < 0) throw std::invalid_argument(std::string(op) + ": negative row count (" + shape + ")");
  if (N == 0) return false;
  if (C <= 0) {
    throw std::invalid_argument(std::string(op) + ": C must be > 0, a row needs a mean (" + shape +
                                ")");
  }
  for (const Named& p : ptrs) {
    if (p.p == nullptr) {
      throw std::invalid_argument(std::string(op) + ": " + p.name + " is null (" + shape + ")");
    }
  }
  return true;
}

bool aligned(const void* p, std::size_t alignment) {
  return reinterpret_cast<std::uintptr_t>(p) % alignment == 0;
}

int row_blocks(int N) {
  return (N + kLayerNormRowsPerBlock - 1) / kLayerNormRowsPerBlock;
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
  float* floats() const { return static_cast<float*>(ptr_); }

 private:
  void* ptr_ = nullptr;
  cudaStream_t stream_;
};

template <typename T>
void forward_typed(T* out, float* mean, float* rstd, const T* inp, const T* weight, const T* bias,
                   int N, int C, cudaStream_t s) {
  constexpr int kVec = 16 / sizeof(T);
  if (C % kVec == 0 && aligned(out, 16) && aligned(inp, 16) && aligned(weight, 16) &&
      aligned(bias, 16)) {
    layernorm_forward_kernel<T, kVec>
        <<<row_blocks(N), kLayerNormThreads, 0, s>>>(out, mean, rstd, inp, weight, bias, N, C);
  } else {
    layernorm_forward_kernel<T, 1>
        <<<row_blocks(N), kLayerNormThreads, 0, s>>>(out, mean, rstd, inp, weight, bias, N, C);
  }
  ZO_CUDA_CHECK_LAUNCH();
}

template <typename T>
void backward_typed(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                    const float* mean, const float* rstd, int N, int C, cudaStream_t s) {
  constexpr int kVec = 16 / sizeof(T);
  // 1. dinp, row by row.
  if (C % kVec == 0 && aligned(dinp, 16) && aligned(dout, 16) && aligned(inp, 16) &&
      aligned(weight, 16)) {
    layernorm_backward_dinp_kernel<T, kVec>
        <<<row_blocks(N), kLayerNormThreads, 0, s>>>(dinp, dout, inp, weight, mean, rstd, N, C);
  } else {
    layernorm_backward_dinp_kernel<T, 1>
        <<<row_blocks(N), kLayerNormThreads, 0, s>>>(dinp, dout, inp, weight, mean, rstd, N, C);
  }
  ZO_CUDA_CHECK_LAUNCH();

  // 2. Column partial sums per chunk of rows, 3. their fixed-order sum into dweight/dbias.
  const int rows_per_chunk = layernorm_backward_rows_per_chunk(N, C);
  const int chunks = (N + rows_per_chunk - 1) / rows_per_chunk;
  const std::size_t partial_elements = static_cast<std::size_t>(chunks) * C;
  StreamScratch scratch(2 * partial_elements * sizeof(float), s);
  float* partial_w = scratch.floats();
  float* partial_b = scratch.floats() + partial_elements;
  const dim3 block(kLnPartialX, kLnPartialY);
  const dim3 grid((C + kLnPartialX - 1) / kLnPartialX, chunks);
  layernorm_backward_partials_kernel<T>
      <<<grid, block, 0, s>>>(partial_w, partial_b, dout, inp, mean, rstd, N, C, rows_per_chunk);
  ZO_CUDA_CHECK_LAUNCH();
  layernorm_backward_finish_kernel<T>
      <<<(C + kLayerNormThreads - 1) / kLayerNormThreads, kLayerNormThreads, 0, s>>>(
          dweight, dbias, partial_w, partial_b, chunks, C);
  ZO_CUDA_CHECK_LAUNCH();
}

}  // namespace

void launch_layernorm_forward(void* out, float* mean, float* rstd, const void* inp,
                              const void* weight, const void* bias, int N, int C, DType t,
                              cudaStream_t s) {
  if (!check_args("launch_layernorm_forward", N, C, t,
                  {{out, "out"},
                   {mean, "mean"},
                   {rstd, "rstd"},
                   {inp, "inp"},
                   {weight, "weight"},
                   {bias, "bias"}})) {
    return;
  }
  ZO_DISPATCH_DTYPE(
      t, T,
      forward_typed<T>(static_cast<T*>(out), mean, rstd, static_cast<const T*>(inp),
                       static_cast<const T*>(weight), static_cast<const T*>(bias), N, C, s));
}

void launch_layernorm_backward(void* dinp, void* dweight, void* dbias, const void* dout,
                               const void* inp, const void* weight, const float* mean,
                               const float* rstd, int N, int C, DType t, cudaStream_t s) {
  if (!check_args("launch_layernorm_backward", N, C, t,
                  {{dinp, "dinp"},
                   {dweight, "dweight"},
                   {dbias, "dbias"},
                   {dout, "dout"},
                   {inp, "inp"},
                   {weight, "weight"},
                   {mean, "mean"},
                   {rstd, "rstd"}})) {
    return;
  }
  ZO_DISPATCH_DTYPE(
      t, T,
      backward_typed<T>(static_cast<T*>(dinp), static_cast<T*>(dweight), static_cast<T*>(dbias),
                        static_cast<const T*>(dout), static_cast<const T*>(inp),
                        static_cast<const T*>(weight), mean, rstd, N, C, s));
}

}  // namespace zo::gpu
