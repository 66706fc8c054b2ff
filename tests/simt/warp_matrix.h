// The warp-level matrix instructions of sm_80+ on the SIMT emulator (simt.h): mma.sync
// m16n8k16 with bf16/fp16 inputs and fp32 accumulators, ldmatrix m8n8 .b16 (.x1/.x2/.x4,
// .trans) and cp.async (.ca 4/8/16 bytes, .cg 16 bytes, with zero fill) with its commit and wait
// groups. gpu/src/mma.cuh maps its device wrappers onto these functions under the emulator and
// onto inline PTX under nvcc, with the same signatures (the emulator's take the call site too).
//
// mma and ldmatrix are warp collectives: all 32 lanes must call them from the same site (a lane
// that has exited, is past the block, or waits at another site is a SimtError, as for shuffles);
// the instruction then runs once for the warp, reading every lane's operands. The fragment
// layouts are in warp_matrix.cpp, each table citing the PTX ISA section it comes from.
//
// cp.async is per thread: issuing a copy poisons its destination (all bits set: NaN) and the
// copy is performed when a cp.async.wait_group that covers it runs in the issuing thread, so a
// kernel that reads the destination without waiting, reads another thread's copies without a
// barrier after their wait, or copies into a buffer another warp still reads, sees NaN.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <source_location>
#include <type_traits>

namespace zo::simt {

enum class MmaInput { kF16, kBF16 };

// d = a * b + d for one m16n8k16 tile: a (16x16, row) in four .b32 registers of two elements,
// b (16x8, col) in two, d (16x8 fp32) in four, all in the PTX fragment layouts.
void mma_m16n8k16(MmaInput input, float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                  std::uint32_t b1, const std::source_location& where);

// `num` (1, 2, 4) 8x8 matrices of 16-bit elements: lane 8 i + r gives the shared-memory address
// of row r of matrix i; r[i] receives this lane's two elements of matrix i.
void ldmatrix(int num, bool trans, std::uint32_t* r, const void* row,
              const std::source_location& where);

// cp.async.{ca,cg}.shared.global: `bytes` (4, 8, 16; .cg: 16) from src to dst in shared memory,
// of which the last bytes - src_bytes are written as zeros and not read.
enum class CacheOp { kCa, kCg };
void cp_async(CacheOp op, void* dst, const void* src, int bytes, int src_bytes,
              const std::source_location& where);
void cp_async_commit_group();
// Performs this thread's copies of every committed group but the `pending` most recent.
void cp_async_wait_group(int pending);

// ---- the device wrappers' emulated forms (gpu/src/mma.cuh)
// ---------------------------------------

template <typename T>
void mma_m16n8k16(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1,
                  const std::source_location& where = std::source_location::current()) {
  static_assert(std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>,
                "mma inputs are fp16 or bf16");
  mma_m16n8k16(std::is_same_v<T, __half> ? MmaInput::kF16 : MmaInput::kBF16, d, a, b0, b1, where);
}

template <bool kTrans = false>
void ldmatrix_x4(std::uint32_t (&r)[4], const void* row,
                 const std::source_location& where = std::source_location::current()) {
  ldmatrix(4, kTrans, r, row, where);
}

template <int kBytes>
void cp_async_ca(void* dst, const void* src, int src_bytes,
                 const std::source_location& where = std::source_location::current()) {
  cp_async(CacheOp::kCa, dst, src, kBytes, src_bytes, where);
}
inline void cp_async_cg16(void* dst, const void* src, int src_bytes,
                          const std::source_location& where = std::source_location::current()) {
  cp_async(CacheOp::kCg, dst, src, 16, src_bytes, where);
}
inline void cp_async_commit() {
  cp_async_commit_group();
}
template <int kPending>
void cp_async_wait() {
  cp_async_wait_group(kPending);
}

}  // namespace zo::simt
