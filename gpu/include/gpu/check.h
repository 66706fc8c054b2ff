// Checked CUDA runtime calls. Every failure becomes a zo::gpu::CudaError whose message names the
// call, file:line, the current device and the runtime's error name and description; a failing
// cuBLASLt call (gpu/src/matmul.cpp) becomes a zo::gpu::CublasError the same way.
#pragma once

#include <cublas_api.h>
#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>

namespace zo::gpu {

class CudaError : public std::runtime_error {
 public:
  CudaError(cudaError_t code, const std::string& message)
      : std::runtime_error(message), code_(code) {}

  cudaError_t code() const noexcept { return code_; }

 private:
  cudaError_t code_;
};

class CublasError : public std::runtime_error {
 public:
  CublasError(cublasStatus_t status, const std::string& message)
      : std::runtime_error(message), status_(status) {}

  cublasStatus_t status() const noexcept { return status_; }

 private:
  cublasStatus_t status_;
};

// "cudaErrorInvalidValue (invalid argument)".
std::string cuda_error_text(cudaError_t code);

namespace detail {
// What the user can do about `code`, or "" when the runtime's description says it all.
const char* cuda_error_hint(cudaError_t code);
// Out of line so each check site expands to one compare and one call.
[[noreturn]] void throw_cuda_error(cudaError_t code, const char* expr, const char* file, int line);
}  // namespace detail

}  // namespace zo::gpu

#define ZO_CUDA_CHECK(expr)                                                                  \
  do {                                                                                       \
    const cudaError_t zo_cuda_check_status_ = (expr);                                        \
    if (zo_cuda_check_status_ != cudaSuccess) {                                              \
      ::zo::gpu::detail::throw_cuda_error(zo_cuda_check_status_, #expr, __FILE__, __LINE__); \
    }                                                                                        \
  } while (0)

// After a <<<...>>> launch: catches bad launch configurations and missing kernel images. Errors
// raised while the kernel runs surface later, at the next synchronising call.
#define ZO_CUDA_CHECK_LAUNCH()                                                              \
  do {                                                                                      \
    const cudaError_t zo_cuda_check_status_ = cudaGetLastError();                           \
    if (zo_cuda_check_status_ != cudaSuccess) {                                             \
      ::zo::gpu::detail::throw_cuda_error(zo_cuda_check_status_, "kernel launch", __FILE__, \
                                          __LINE__);                                        \
    }                                                                                       \
  } while (0)
