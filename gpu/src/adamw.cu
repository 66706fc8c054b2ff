// Launcher of adamw (kernel, math and launch shape in gpu/adamw.cuh).
#include <cstdint>
#include <string>

#include "gpu/adamw.cuh"
#include "gpu/check.h"
#include "gpu/dispatch.cuh"
#include "gpu/ops.h"
#include "launch_util.h"

namespace zo::gpu {
namespace {

using detail::aligned;

constexpr const char* kOp = "launch_adamw";

[[noreturn]] void bad_argument(const std::string& what) {
  detail::bad_arg(kOp, what);
}

int fill_grid(std::size_t threads_needed) {
  return detail::fill_grid(threads_needed, kAdamWThreads);
}

template <typename GT, typename PT>
void launch_typed(float* master, float* m, float* v, const void* grads, void* params_out,
                  std::size_t n, const AdamScalars& k, cudaStream_t s) {
  constexpr int kVec = 4;
  const auto* g = static_cast<const GT*>(grads);
  auto* out = static_cast<PT*>(params_out);
  if (aligned(master, 16) && aligned(m, 16) && aligned(v, 16) &&
      aligned(grads, sizeof(GT) * kVec) && aligned(params_out, sizeof(PT) * kVec)) {
    ZO_LAUNCH(fill_grid(n / kVec), kAdamWThreads, 0, s, adamw_kernel<GT, PT, kVec>)
    (master, m, v, g, out, n, k);
  } else {
    ZO_LAUNCH(fill_grid(n), kAdamWThreads, 0, s, adamw_kernel<GT, PT, 1>)
    (master, m, v, g, out, n, k);
  }
  ZO_CUDA_CHECK_LAUNCH();
}

}  // namespace

void launch_adamw(float* master, float* m, float* v, const void* grads, DType gt, void* params_out,
                  DType pt, std::size_t n, const AdamConfig& c, std::int64_t t, float grad_mult,
                  cudaStream_t s) {
  if (!detail::valid_dtype(gt) || !detail::valid_dtype(pt)) {
    bad_argument("invalid DType value (grads " + std::to_string(static_cast<int>(gt)) +
                 ", params_out " + std::to_string(static_cast<int>(pt)) + ")");
  }
  if (!c.decoupled_weight_decay)
    bad_argument("only AdamW (decoupled weight decay) runs on the GPU");
  c.validate(kOp);
  check_adam_step(kOp, t, grad_mult);
  if (n == 0) return;
  detail::check_not_null(kOp, {{master, "master"}, {m, "m"}, {v, "v"}, {grads, "grads"}},
                         [n] { return detail::elements(n); });
  const AdamScalars k = adam_scalars(c, t, grad_mult);
  ZO_DISPATCH_DTYPE(
      gt, G,
      ZO_DISPATCH_DTYPE(pt, P, launch_typed<G, P>(master, m, v, grads, params_out, n, k, s)));
}

}  // namespace zo::gpu
