// Checked cuBLAS / cuBLASLt calls and introspection of a MatmulContext (gpu/src/matmul.cpp).
// Every failing status becomes a zo::gpu::CublasError naming the call, file:line, the current
// device and the status (name and description).
#pragma once

#include <cublas_api.h>

#include <cstddef>
#include <stdexcept>
#include <string>

#include "gpu/ops.h"

namespace zo::gpu {

class CublasError : public std::runtime_error {
 public:
  CublasError(cublasStatus_t status, const std::string& message)
      : std::runtime_error(message), status_(status) {}

  cublasStatus_t status() const noexcept { return status_; }

 private:
  cublasStatus_t status_;
};

// "CUBLAS_STATUS_NOT_SUPPORTED (the requested functionality is not supported)".
std::string cublas_status_text(cublasStatus_t status);

namespace detail {
[[noreturn]] void throw_cublas_error(cublasStatus_t status, const char* expr, const char* file,
                                     int line);
}  // namespace detail

// Number of cached matmul plans (descriptors + heuristic choice), one per distinct (shapes, dtype,
// op, operand alignments); for tests, to see that steady-state calls hit the cache.
std::size_t matmul_plan_count(const MatmulContext* ctx);

}  // namespace zo::gpu

#define ZO_CUBLAS_CHECK(expr)                                                                    \
  do {                                                                                           \
    const cublasStatus_t zo_cublas_check_status_ = (expr);                                       \
    if (zo_cublas_check_status_ != CUBLAS_STATUS_SUCCESS) {                                      \
      ::zo::gpu::detail::throw_cublas_error(zo_cublas_check_status_, #expr, __FILE__, __LINE__); \
    }                                                                                            \
  } while (0)
