// Warp-level matrix instructions of sm_80+ for the tensor-core kernels, private to gpu/src:
// mma.sync m16n8k16 (bf16 or fp16 inputs, fp32 accumulators), ldmatrix m8n8 .b16 and cp.async
// with its commit and wait groups. Under nvcc each wrapper is one inline PTX instruction; under
// the SIMT emulator the same names are its implementations (tests/simt/warp_matrix.h, which the
// emulator's prelude includes), so g++ never sees the asm. Fragment layouts: PTX ISA, "Matrix
// Fragments for mma.m16n8k16 with floating point type" and "Warp-level matrix load instruction:
// ldmatrix"; mma and ldmatrix must be reached by all 32 lanes of the warp.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace zo::gpu::mma {

#ifdef ZO_SIMT_EMULATION

using ::zo::simt::cp_async_ca;
using ::zo::simt::cp_async_cg16;
using ::zo::simt::cp_async_commit;
using ::zo::simt::cp_async_wait;
using ::zo::simt::ldmatrix_x4;
using ::zo::simt::mma_m16n8k16;

#else

__device__ __forceinline__ unsigned smem_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// d (16x8 fp32) += a (16x16, row) * b (16x8, col; registers b0, b1), T = __nv_bfloat16 or __half.
template <typename T>
__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], const std::uint32_t (&a)[4],
                                             std::uint32_t b0, std::uint32_t b1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    static_assert(std::is_same_v<T, __half>, "mma inputs are bf16 or fp16");
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Four 8x8 matrices: `row` is this lane's row address (lanes 8 i .. 8 i + 7: rows of matrix i),
// r[i] receives matrix i (transposed with kTrans).
template <bool kTrans = false>
__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], const void* row) {
  if constexpr (kTrans) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_address(row)));
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_address(row)));
  }
}

// kBytes (4, 8, 16) from global src to shared dst, both aligned to kBytes; only src_bytes are
// read, the rest of dst is zero-filled. .ca caches in L1, .cg (16 bytes) in L2 only.
template <int kBytes>
__device__ __forceinline__ void cp_async_ca(void* dst, const void* src, int src_bytes) {
  static_assert(kBytes == 4 || kBytes == 8 || kBytes == 16, "cp.async copies 4, 8 or 16 bytes");
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(smem_address(dst)), "l"(src),
               "n"(kBytes), "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_cg16(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_address(dst)), "l"(src),
               "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Returns once at most kPending of this thread's most recent groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

#endif  // ZO_SIMT_EMULATION

// Two fp32 values rounded to T and packed as one fragment register, `lo` in the low half.
template <typename T>
__device__ __forceinline__ std::uint32_t pack2(float lo, float hi) {
  std::uint32_t r;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    std::memcpy(&r, &v, sizeof r);
  } else {
    static_assert(std::is_same_v<T, __half>, "fragments hold bf16 or fp16");
    const __half2 v = __floats2half2_rn(lo, hi);
    std::memcpy(&r, &v, sizeof r);
  }
  return r;
}

}  // namespace zo::gpu::mma
