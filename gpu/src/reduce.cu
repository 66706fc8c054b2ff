// Reductions over gradient buckets on the GPU: the sum of squares behind the global gradient norm
// and the Inf/NaN flag behind fp16 overflow detection (launch_sum_squares, launch_nonfinite_flag).
//
// sum_squares, deterministic in two kernels:
//   1. sum_squares_partial_kernel: a grid fixed by n alone (sum_squares_blocks(n), at most
//      kSumSquaresMaxBlocks blocks of kReduceThreads threads), grid-stride. Each thread adds the
//      squares of its elements, one Pack (16 B) at a time in fp32, each pack sum into an fp64
//      accumulator; the block reduces its threads with a fixed shuffle tree and writes one fp64
//      partial per block. No atomics.
//   2. sum_squares_finish_kernel: one block adds the partials in a fixed order and does
//      *out = float(double(*out) + total), the host reference's rounding (one rounding at the end).
//   Same n, same data, same pointer alignment -> the same bits on every run. (The vectorised and
//   the scalar path group elements differently, so bits may differ between buffers of the same
//   contents at different alignments; the value agrees to fp64 rounding.)
//
// nonfinite_flag: grid-stride over packs; a thread that sees Inf/NaN stores 1.0f to *flag. All
//   writers store the same value, so the race is benign and the result deterministic; *flag is
//   left untouched when everything is finite.
#include <cstddef>

#include "block_reduce.cuh"
#include "cast.cuh"
#include "dispatch.cuh"
#include "gpu/check.h"
#include "gpu/ops.h"
#include "launch_util.h"

namespace zo::gpu {

constexpr int kReduceThreads = 256;
constexpr int kSumSquaresMaxBlocks = 1024;
constexpr std::size_t kSumSquaresElementsPerThread = 16;  // at least, before the grid caps

// Blocks of sum_squares_partial_kernel: a function of n only, so the summation tree is too.
inline int sum_squares_blocks(std::size_t n) {
  const std::size_t per_block = kReduceThreads * kSumSquaresElementsPerThread;
  const std::size_t blocks = (n + per_block - 1) / per_block;
  return static_cast<int>(
      blocks < 1 ? 1 : (blocks > kSumSquaresMaxBlocks ? kSumSquaresMaxBlocks : blocks));
}

// Sum of squares of the pack: fp32 is exact per square for 16-bit inputs; the pack sum rounds.
template <typename T, int kVec>
__device__ __forceinline__ float pack_sum_squares(const Pack<T, kVec>& p) {
  float s = 0.0f;
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    const float x = to_float(p.v[k]);
    s = fmaf(x, x, s);
  }
  return s;
}

// partial (gridDim.x) fp64 written. kVec == 1 for data not aligned to a pack.
template <typename T, int kVec>
__global__ void __launch_bounds__(kReduceThreads)
    sum_squares_partial_kernel(double* __restrict__ partial, const T* __restrict__ data,
                               std::size_t n) {
  __shared__ double shared[32];
  const std::size_t tid = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  const std::size_t packs = n / kVec;
  const auto* data_packs = reinterpret_cast<const Pack<T, kVec>*>(data);
  double acc = 0.0;
  for (std::size_t p = tid; p < packs; p += stride)
    acc += static_cast<double>(pack_sum_squares<T, kVec>(data_packs[p]));
  const std::size_t i = packs * kVec + tid;  // the tail, fewer than kVec elements
  if (i < n) {
    const float x = to_float(data[i]);
    acc += static_cast<double>(x * x);
  }
  acc = block_sum(acc, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

// *out += sum of partial[0, count) in a fixed order. One block of kReduceThreads threads.
// (A template, like every kernel in these headers, so that including the header from several
// translation units defines nothing twice.)
template <typename Acc>
__global__ void __launch_bounds__(kReduceThreads)
    sum_squares_finish_kernel(float* __restrict__ out, const Acc* __restrict__ partial, int count) {
  __shared__ Acc shared[32];
  Acc acc = 0;
  for (int i = threadIdx.x; i < count; i += blockDim.x)
    acc += partial[i];
  acc = block_sum(acc, shared);
  if (threadIdx.x == 0) *out = static_cast<float>(static_cast<Acc>(*out) + acc);
}

template <typename T, int kVec>
__global__ void nonfinite_flag_kernel(float* __restrict__ flag, const T* __restrict__ data,
                                      std::size_t n) {
  const std::size_t tid = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  const std::size_t packs = n / kVec;
  const auto* data_packs = reinterpret_cast<const Pack<T, kVec>*>(data);
  bool bad = false;
  for (std::size_t p = tid; p < packs; p += stride) {
    const Pack<T, kVec> in = data_packs[p];
#pragma unroll
    for (int k = 0; k < kVec; ++k)
      bad |= !isfinite(to_float(in.v[k]));
  }
  const std::size_t i = packs * kVec + tid;
  if (i < n) bad |= !isfinite(to_float(data[i]));
  if (bad) *flag = 1.0f;
}

namespace {

using detail::aligned;
using detail::check_flat_args;

int fill_grid(std::size_t threads_needed) {
  return detail::fill_grid(threads_needed, kReduceThreads);
}

template <typename T>
void sum_squares_typed(float* out, const T* data, std::size_t n, double* partial, cudaStream_t s) {
  constexpr int kVec = 16 / sizeof(T);
  const int blocks = sum_squares_blocks(n);
  if (aligned(data, 16)) {
    ZO_LAUNCH(blocks, kReduceThreads, 0, s, sum_squares_partial_kernel<T, kVec>)
    (partial, data, n);
  } else {
    ZO_LAUNCH(blocks, kReduceThreads, 0, s, sum_squares_partial_kernel<T, 1>)
    (partial, data, n);
  }
  ZO_CUDA_CHECK_LAUNCH();
  ZO_LAUNCH(1, kReduceThreads, 0, s, sum_squares_finish_kernel<double>)
  (out, partial, blocks);
  ZO_CUDA_CHECK_LAUNCH();
}

template <typename T>
void nonfinite_flag_typed(float* flag, const T* data, std::size_t n, cudaStream_t s) {
  constexpr int kVec = 16 / sizeof(T);
  if (aligned(data, 16)) {
    ZO_LAUNCH(fill_grid(n / kVec), kReduceThreads, 0, s, nonfinite_flag_kernel<T, kVec>)
    (flag, data, n);
  } else {
    ZO_LAUNCH(fill_grid(n), kReduceThreads, 0, s, nonfinite_flag_kernel<T, 1>)(flag, data, n);
  }
  ZO_CUDA_CHECK_LAUNCH();
}

}  // namespace

std::size_t sum_squares_scratch_bytes(std::size_t n) {
  return sizeof(double) * static_cast<std::size_t>(sum_squares_blocks(n));
}

void launch_sum_squares(float* out, const void* data, std::size_t n, DType t, void* scratch,
                        cudaStream_t s) {
  if (!check_flat_args("launch_sum_squares", n, t,
                       {{out, "out"}, {data, "data"}, {scratch, "scratch"}})) {
    return;
  }
  ZO_DISPATCH_DTYPE(
      t, T,
      sum_squares_typed<T>(out, static_cast<const T*>(data), n, static_cast<double*>(scratch), s));
}

void launch_nonfinite_flag(float* flag, const void* data, std::size_t n, DType t, cudaStream_t s) {
  if (!check_flat_args("launch_nonfinite_flag", n, t, {{flag, "flag"}, {data, "data"}})) return;
  ZO_DISPATCH_DTYPE(t, T, nonfinite_flag_typed<T>(flag, static_cast<const T*>(data), n, s));
}

}  // namespace zo::gpu
