// AdamW for the GPU-resident mode (arXiv 1711.05101, Algorithm 2; decoupled weight decay only),
// with the element math of cpu_adam (docs/cpu_adam.md, cpu_adam/src/adam_kernel.h) operation for
// operation. With g = grad * grad_mult:
//   m = fma(1 - b1, g, b1 * m)
//   v = fma(1 - b2, g * g, b2 * v)
//   p = fma(-lr / (1 - b1^t), m / fma(sqrt(v), 1 / sqrt(1 - b2^t), eps), p * (1 - lr * wd))
// The per-step constants are zo::adam_scalars (core/adam.h), as cpu_adam's, and every operation is
// a round-to-nearest intrinsic (__fmul_rn,
// __fmaf_rn, __fdiv_rn, __fsqrt_rn), which the compiler neither contracts into other FMAs nor
// approximates (whatever -fmad or -prec-div say), so the results equal cpu_adam's scalar path bit
// for bit. Subnormals are kept as on the host as long as the build does not flush them
// (-ftz=false, the nvcc default; -use_fast_math would turn it on).
//
// Launch shape: 1-D grid-stride, kAdamWThreads per block, grid = min(packs / threads, one full
// GPU); each thread updates packs of kVec = 4 elements (16 B of fp32 state, 8 B of 16-bit
// grads/params), then the tail one element per thread. kVec == 1 when a pointer is not aligned
// to its pack. params_out may be null, and may equal master (fp32): each element is read before
// it is written, by the same thread.
//
// Weight decay by run (a run table, core/adam.h): one launch updates a whole layout whose
// tensors differ in weight decay, instead of one launch per run (a GPT-2 has about nine runs
// per block). Each element finds its run by binary search in the table (a few hundred entries,
// cached) and takes the decaying or the plain constants; with no table every element decays.
//
// A gate (core/adam.h step_gate, written on the device from the step's gradient norm) supplies
// the gradient multiplier and may skip the update: the resident step enqueues AdamW before the
// host has read the norm, so the device does not idle while the host decides.

#include <cstddef>
#include <cstdint>
#include <string>

#include "cast.cuh"
#include "core/adam.h"
#include "dispatch.cuh"
#include "gpu/check.h"
#include "gpu/ops.h"
#include "launch_util.h"

namespace zo::gpu {

constexpr int kAdamWThreads = 256;

// Updates p, m, v in place from the raw gradient g_raw.
__device__ __forceinline__ void adamw_element(float& p, float& m, float& v, float g_raw,
                                              const AdamScalars& k) {
  const float g = __fmul_rn(g_raw, k.grad_mult);
  m = __fmaf_rn(k.one_minus_beta1, g, __fmul_rn(k.beta1, m));
  v = __fmaf_rn(k.one_minus_beta2, __fmul_rn(g, g), __fmul_rn(k.beta2, v));
  const float denom = __fmaf_rn(__fsqrt_rn(v), k.bc2_rsqrt, k.eps);
  p = __fmaf_rn(k.neg_step_size, __fdiv_rn(m, denom), __fmul_rn(p, k.decay));
}

// The constants by element: the decaying ones unless the element's run in the table (if any)
// has no weight decay.
struct AdamWRuns {
  const std::uint64_t* starts;  // device run table, or null
  int count;
  AdamScalars decay, plain;
  // The index of the run holding element i: the last one starting at or before i (0 without a
  // table).
  __device__ __forceinline__ int run(std::size_t i) const {
    if (starts == nullptr) return 0;
    int lo = 0, hi = count - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if ((starts[mid] & ~kAdamRunDecays) <= i) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    return lo;
  }
  __device__ __forceinline__ AdamScalars of_run(int r) const {
    return starts == nullptr || (starts[r] & kAdamRunDecays) != 0 ? decay : plain;
  }
  __device__ __forceinline__ AdamScalars at(std::size_t i) const { return of_run(run(i)); }
};

// master, m, v (n) fp32 updated; params_out (n) written when non-null. No __restrict__ on master
// and params_out: they may be the same array.
template <typename GT, typename PT, int kVec>
__global__ void __launch_bounds__(kAdamWThreads)
    adamw_kernel(float* master, float* __restrict__ m, float* __restrict__ v,
                 const GT* __restrict__ grads, PT* params_out, std::size_t n, AdamWRuns k,
                 const StepGate* gate) {
  if (gate != nullptr) {
    const StepGate g = *gate;
    if (g.skip != 0) return;
    k.decay.grad_mult = k.plain.grad_mult = g.grad_mult;
  }
  const std::size_t tid = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  const std::size_t packs = n / kVec;
  for (std::size_t q = tid; q < packs; q += stride) {
    const std::size_t i = q * kVec;
    Pack<float, kVec> p = *reinterpret_cast<const Pack<float, kVec>*>(master + i);
    Pack<float, kVec> mm = *reinterpret_cast<const Pack<float, kVec>*>(m + i);
    Pack<float, kVec> vv = *reinterpret_cast<const Pack<float, kVec>*>(v + i);
    const Pack<GT, kVec> g = *reinterpret_cast<const Pack<GT, kVec>*>(grads + i);
    // A pack inside one run (all but a few) takes its constants once.
    const int r = k.run(i);
    const bool one_run = kVec == 1 || k.run(i + kVec - 1) == r;
    const AdamScalars first = k.of_run(r);
#pragma unroll
    for (int e = 0; e < kVec; ++e)
      adamw_element(p.v[e], mm.v[e], vv.v[e], to_float(g.v[e]), one_run ? first : k.at(i + e));
    *reinterpret_cast<Pack<float, kVec>*>(master + i) = p;
    *reinterpret_cast<Pack<float, kVec>*>(m + i) = mm;
    *reinterpret_cast<Pack<float, kVec>*>(v + i) = vv;
    if (params_out != nullptr) {
      Pack<PT, kVec> out;
#pragma unroll
      for (int e = 0; e < kVec; ++e)
        out.v[e] = from_float<PT>(p.v[e]);
      *reinterpret_cast<Pack<PT, kVec>*>(params_out + i) = out;
    }
  }
  const std::size_t i = packs * kVec + tid;  // the tail, fewer than kVec elements
  if (i < n) {
    float p = master[i];
    float mm = m[i];
    float vv = v[i];
    adamw_element(p, mm, vv, to_float(grads[i]), k.at(i));
    master[i] = p;
    m[i] = mm;
    v[i] = vv;
    if (params_out != nullptr) params_out[i] = from_float<PT>(p);
  }
}

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
                  std::size_t n, const AdamWRuns& k, const StepGate* gate, cudaStream_t s) {
  constexpr int kVec = 4;
  const auto* g = static_cast<const GT*>(grads);
  auto* out = static_cast<PT*>(params_out);
  if (aligned(master, 16) && aligned(m, 16) && aligned(v, 16) &&
      aligned(grads, sizeof(GT) * kVec) && aligned(params_out, sizeof(PT) * kVec)) {
    ZO_LAUNCH(fill_grid(n / kVec), kAdamWThreads, 0, s, adamw_kernel<GT, PT, kVec>)
    (master, m, v, g, out, n, k, gate);
  } else {
    ZO_LAUNCH(fill_grid(n), kAdamWThreads, 0, s, adamw_kernel<GT, PT, 1>)
    (master, m, v, g, out, n, k, gate);
  }
  ZO_CUDA_CHECK_LAUNCH();
}

}  // namespace

void launch_adamw(float* master, float* m, float* v, const void* grads, DType gt, void* params_out,
                  DType pt, std::size_t n, const AdamConfig& c, std::int64_t t, float grad_mult,
                  cudaStream_t s, const std::uint64_t* run_starts, int num_runs,
                  const StepGate* gate) {
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
  if (run_starts != nullptr && num_runs <= 0)
    bad_argument("a run table needs num_runs >= 1, got " + std::to_string(num_runs));
  if (!aligned(run_starts, sizeof(std::uint64_t)))
    bad_argument("the run table is not 8-byte aligned");
  if (!aligned(gate, alignof(StepGate))) bad_argument("the gate is not 4-byte aligned");
  AdamConfig plain = c;
  plain.weight_decay = 0.0f;
  const AdamWRuns k{run_starts, num_runs, adam_scalars(c, t, grad_mult),
                    adam_scalars(plain, t, grad_mult)};
  ZO_DISPATCH_DTYPE(
      gt, G,
      ZO_DISPATCH_DTYPE(pt, P, launch_typed<G, P>(master, m, v, grads, params_out, n, k, gate, s)));
}

}  // namespace zo::gpu
