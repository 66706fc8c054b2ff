// Softmax cross-entropy over V classes per row, fused with its gradient. Shapes: logits and
// dlogits (N,V) with rows ld >= V elements apart (the LM head pads them to a multiple of 128, so
// that they start 16-byte aligned; the columns past V are neither read nor written), targets (N)
// int32, losses (N) fp32. Formulas as the host reference
// (src/device/host_ops_loss_reduce_cast.cpp): loss = logsumexp(x) - x[target];
// dlogits = dloss_scale * (softmax(x) - onehot(target)).
//
// Launch shape: one block of kCrossEntropyThreads threads per row (grid = N); V up to ~50k.
//   Pass 1: each thread keeps an online (max, sum of exp(x - max)) pair over its strided
//   elements in fp32, raising the max once per pack and taking one exp2 per element; the block
//   combines the pairs with a fixed shuffle tree (deterministic) into the row's log-sum-exp.
//   Pass 2 (only when dlogits is non-null): each thread re-reads its own elements and writes
//   dloss_scale * (exp(x - lse) - onehot).
//   kStaged: pass 1 also keeps the row's packs in shared memory, where pass 2 reads them, so the
//   logits cross HBM once. Chosen when two rows fit an SM's shared memory (GPT-2's bf16 rows on
//   an H100); otherwise pass 2 counts on L2, which a few hundred 100 KB rows in flight overrun.
//   The row is walked as a scalar head up to the first 16-byte boundary, whole packs of kVec
//   (16 B), then a scalar tail, so odd V (e.g. GPT-2's 50257) still moves most bytes in packs
//   when its rows are not 16-byte aligned. kVec == 1 when dlogits and logits are not at the same
//   offset modulo 16 bytes.
//
// Aliasing: dlogits may equal logits. Every read of pass 1 (and of logits[target]) happens before
// the block-wide barriers of the reduction, and in pass 2 each thread writes only the elements
// it has just read itself, so no thread overwrites a logit another thread still needs.
//
// A target outside [0, V) (the host backend throws; a kernel cannot) gives a NaN loss for that
// row, and its dlogits row is written as dloss_scale * softmax without the onehot term.

#include <cstddef>
#include <cstdint>
#include <string>

#include "cast.cuh"
#include "dispatch.cuh"
#include "gpu/check.h"
#include "gpu/ops.h"
#include "launch_util.h"

namespace zo::gpu {

constexpr int kCrossEntropyThreads = 512;
constexpr float kLog2e = 1.4426950408889634f;

// Adds exp(x - m) to s, raising m first if x is larger. -inf logits add nothing (also when m is
// still -inf); NaN makes s NaN; exp(inf - inf) = NaN as in the host reference.
__device__ __forceinline__ void online_logsumexp_add(float& m, float& s, float x) {
  if (x > m) {
    s = s * expf(m - x) + 1.0f;
    m = x;
  } else if (x != -INFINITY) {
    s += expf(x - m);
  }
}

// Adds a pack of logits: m raised once to the pack's max, then s += exp2(x log2e - m log2e) per
// element (-inf adds 0, NaN makes s NaN). A non-finite max (+inf, or m still -inf) takes the
// element-wise path, whose edge cases are the host reference's.
template <int kVec>
__device__ __forceinline__ void online_logsumexp_add_pack(float& m, float& s,
                                                          const float (&x)[kVec]) {
  float top = m;
#pragma unroll
  for (int k = 0; k < kVec; ++k)
    top = fmaxf(top, x[k]);  // ignores NaN
  if (!isfinite(top)) {
#pragma unroll
    for (int k = 0; k < kVec; ++k)
      online_logsumexp_add(m, s, x[k]);
    return;
  }
  if (top > m) s *= exp2f((m - top) * kLog2e);  // 0 * s while m is -inf
  m = top;
  const float mb = m * kLog2e;
#pragma unroll
  for (int k = 0; k < kVec; ++k)
    s += exp2f(fmaf(x[k], kLog2e, -mb));
}

// (m1, s1) := (m1, s1) combined with (m2, s2). Symmetric in its operands (bit for bit), so an xor
// butterfly leaves every lane with the same result. m is never NaN (only raised by x > m).
__device__ __forceinline__ void online_logsumexp_combine(float& m1, float& s1, float m2, float s2) {
  const float m = fmaxf(m1, m2);
  const float a = m1 == m ? s1 : s1 * expf(m1 - m);
  const float b = m2 == m ? s2 : s2 * expf(m2 - m);
  m1 = m;
  s1 = a + b;
}

// Row walk: elements [0, head) one by one, then packs of kVec starting at `head` (16-byte
// aligned), then the tail [head + packs * kVec, V). fn(j, x_j) for every element this thread owns.
template <typename T, int kVec>
struct RowSplit {
  int head, packs, tail_begin;
  __device__ __forceinline__ RowSplit(const T* row, int V) {
    head = 0;
    if constexpr (kVec > 1) {
      const int misaligned =
          static_cast<int>((reinterpret_cast<std::uintptr_t>(row) % 16) / sizeof(T));
      if (misaligned != 0) head = min(V, kVec - misaligned);
    }
    packs = (V - head) / kVec;
    tail_begin = head + packs * kVec;
  }
};

// losses (N) written; dlogits (N,V) written when non-null (may alias logits); grid = N.
template <typename T, int kVec, bool kStaged>
__global__ void __launch_bounds__(kCrossEntropyThreads)
    cross_entropy_kernel(float* __restrict__ losses, T* dlogits, const T* logits,
                         const std::int32_t* __restrict__ targets, int V, std::size_t ld,
                         float dloss_scale) {
  ZO_DYNAMIC_SHARED(float4, cross_entropy_smem);
  auto* staged = reinterpret_cast<Pack<T, kVec>*>(cross_entropy_smem);  // (packs) when kStaged
  __shared__ float shared_m[32];
  __shared__ float shared_s[32];
  const std::size_t row = blockIdx.x;
  const T* x = logits + row * ld;
  const RowSplit<T, kVec> split(x, V);
  const auto* x_packs = reinterpret_cast<const Pack<T, kVec>*>(x + split.head);

  // Pass 1: per-thread online log-sum-exp.
  float m = -INFINITY;
  float s = 0.0f;
  for (int j = threadIdx.x; j < split.head; j += blockDim.x)
    online_logsumexp_add(m, s, to_float(x[j]));
#pragma unroll 4  // several 16-byte loads in flight per thread
  for (int p = threadIdx.x; p < split.packs; p += blockDim.x) {
    const Pack<T, kVec> v = x_packs[p];
    if constexpr (kStaged) staged[p] = v;
    float f[kVec];
#pragma unroll
    for (int k = 0; k < kVec; ++k)
      f[k] = to_float(v.v[k]);
    online_logsumexp_add_pack(m, s, f);
  }
  for (int j = split.tail_begin + threadIdx.x; j < V; j += blockDim.x)
    online_logsumexp_add(m, s, to_float(x[j]));

  const std::int32_t target = targets[row];
  const bool valid = target >= 0 && target < V;
  float x_target = 0.0f;
  if (threadIdx.x == 0 && valid) x_target = to_float(x[target]);  // before any write below

  // Block combine: warps, then every warp combines the per-warp results in the same order.
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, offset);
    const float s2 = __shfl_xor_sync(0xffffffffu, s, offset);
    online_logsumexp_combine(m, s, m2, s2);
  }
  if (lane == 0) {
    shared_m[warp] = m;
    shared_s[warp] = s;
  }
  __syncthreads();  // also orders every read of pass 1 before any write of pass 2
  const int warps = blockDim.x / 32;
  m = lane < warps ? shared_m[lane] : -INFINITY;
  s = lane < warps ? shared_s[lane] : 0.0f;
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, offset);
    const float s2 = __shfl_xor_sync(0xffffffffu, s, offset);
    online_logsumexp_combine(m, s, m2, s2);
  }
  const float lse = m + logf(s);
  if (threadIdx.x == 0) losses[row] = valid ? lse - x_target : __int_as_float(0x7fc00000);
  if (dlogits == nullptr) return;

  // Pass 2: each thread rewrites exactly the elements it read in pass 1.
  T* d = dlogits + row * ld;
  auto* d_packs = reinterpret_cast<Pack<T, kVec>*>(d + split.head);
  const float lse2 = lse * kLog2e;
  auto grad = [&](int j, float xj) {
    return from_float<T>(dloss_scale *
                         (exp2f(fmaf(xj, kLog2e, -lse2)) - (j == target ? 1.0f : 0.0f)));
  };
  for (int j = threadIdx.x; j < split.head; j += blockDim.x)
    d[j] = grad(j, to_float(x[j]));
  for (int p = threadIdx.x; p < split.packs; p += blockDim.x) {
    const Pack<T, kVec> v = kStaged ? staged[p] : x_packs[p];  // staged by this thread
    Pack<T, kVec> out;
#pragma unroll
    for (int k = 0; k < kVec; ++k)
      out.v[k] = grad(split.head + p * kVec + k, to_float(v.v[k]));
    d_packs[p] = out;
  }
  for (int j = split.tail_begin + threadIdx.x; j < V; j += blockDim.x)
    d[j] = grad(j, to_float(x[j]));
}

namespace {

template <typename T>
void launch_typed(float* losses, T* dlogits, const T* logits, const std::int32_t* targets, int N,
                  int V, std::size_t ld, float dloss_scale, cudaStream_t s) {
  constexpr int kVec = 16 / sizeof(T);
  // Packs need dlogits at the same offset as logits modulo 16 B (always true when they alias).
  const auto gap =
      reinterpret_cast<std::uintptr_t>(dlogits) - reinterpret_cast<std::uintptr_t>(logits);
  if (dlogits == nullptr || gap % 16 == 0) {
    // The row's packs, staged when two such blocks fit an SM (no dlogits: nothing to re-read).
    const std::size_t staged = static_cast<std::size_t>(V / kVec) * 16;
    const int device = detail::current_device();
    if (dlogits != nullptr && 2 * staged <= static_cast<std::size_t>(detail::device_attribute(
                                                cudaDevAttrMaxSharedMemoryPerBlockOptin, device))) {
      auto* const kernel = &cross_entropy_kernel<T, kVec, true>;
      if (staged > 48 * 1024)
        detail::opt_in_shared_memory(device, reinterpret_cast<const void*>(kernel), staged);
      ZO_LAUNCH(N, kCrossEntropyThreads, staged, s, cross_entropy_kernel<T, kVec, true>)
      (losses, dlogits, logits, targets, V, ld, dloss_scale);
    } else {
      ZO_LAUNCH(N, kCrossEntropyThreads, 0, s, cross_entropy_kernel<T, kVec, false>)
      (losses, dlogits, logits, targets, V, ld, dloss_scale);
    }
  } else {
    ZO_LAUNCH(N, kCrossEntropyThreads, 0, s, cross_entropy_kernel<T, 1, false>)
    (losses, dlogits, logits, targets, V, ld, dloss_scale);
  }
  ZO_CUDA_CHECK_LAUNCH();
}

}  // namespace

void launch_cross_entropy(float* losses, void* dlogits, const void* logits,
                          const std::int32_t* targets, int N, int V, int ld, float dloss_scale,
                          DType t, cudaStream_t s) {
  constexpr const char* op = "launch_cross_entropy";
  detail::check_dtype(op, t);
  const std::string shape =
      "N = " + std::to_string(N) + ", V = " + std::to_string(V) + ", ld = " + std::to_string(ld);
  if (!detail::check_rows(op, N, V, "V", "a softmax needs classes", shape)) return;
  if (ld < V) detail::bad_arg(op, "the row stride is less than V (" + shape + ")");
  detail::check_not_null(op, {{losses, "losses"}, {logits, "logits"}, {targets, "targets"}},
                         [&] { return shape; });
  ZO_DISPATCH_DTYPE(t, T,
                    launch_typed<T>(losses, static_cast<T*>(dlogits), static_cast<const T*>(logits),
                                    targets, N, V, static_cast<std::size_t>(ld), dloss_scale, s));
}

}  // namespace zo::gpu
