// Launcher of adamw (kernel, math and launch shape in gpu/adamw.cuh).
#include <cmath>
#include <string>

#include "cpu_adam/adam_checks.h"
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

void check_hyperparameters(const AdamWArgs& a) {
  cpu_adam::check_adam_hyperparameters(kOp, a.lr, a.beta1, a.beta2, a.eps, a.weight_decay);
  cpu_adam::check_adam_step(kOp, a.t, a.grad_mult);
}

// cpu_adam's detail::derive_scalars for decoupled weight decay: double, then rounded to float.
AdamWScalars derive_scalars(const AdamWArgs& a) {
  const double b1 = a.beta1, b2 = a.beta2, lr = a.lr, wd = a.weight_decay;
  const double bc1 = a.bias_correction ? 1.0 - std::pow(b1, static_cast<double>(a.t)) : 1.0;
  const double bc2 = a.bias_correction ? 1.0 - std::pow(b2, static_cast<double>(a.t)) : 1.0;
  AdamWScalars k{};
  k.beta1 = a.beta1;
  k.one_minus_beta1 = static_cast<float>(1.0 - b1);
  k.beta2 = a.beta2;
  k.one_minus_beta2 = static_cast<float>(1.0 - b2);
  k.neg_step_size = static_cast<float>(-lr / bc1);
  k.bc2_rsqrt = static_cast<float>(1.0 / std::sqrt(bc2));
  k.eps = a.eps;
  k.decay = static_cast<float>(1.0 - lr * wd);
  k.grad_mult = a.grad_mult;
  return k;
}

int fill_grid(std::size_t threads_needed) {
  return detail::fill_grid(threads_needed, kAdamWThreads);
}

template <typename GT, typename PT>
void launch_typed(float* master, float* m, float* v, const void* grads, void* params_out,
                  std::size_t n, const AdamWScalars& k, cudaStream_t s) {
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
                  DType pt, std::size_t n, const AdamWArgs& a, cudaStream_t s) {
  if (!detail::valid_dtype(gt) || !detail::valid_dtype(pt)) {
    bad_argument("invalid DType value (grads " + std::to_string(static_cast<int>(gt)) +
                 ", params_out " + std::to_string(static_cast<int>(pt)) + ")");
  }
  check_hyperparameters(a);
  if (n == 0) return;
  detail::check_not_null(kOp, {{master, "master"}, {m, "m"}, {v, "v"}, {grads, "grads"}},
                         [n] { return detail::elements(n); });
  const AdamWScalars k = derive_scalars(a);
  ZO_DISPATCH_DTYPE(
      gt, G,
      ZO_DISPATCH_DTYPE(pt, P, launch_typed<G, P>(master, m, v, grads, params_out, n, k, s)));
}

}  // namespace zo::gpu
