// Internals shared by the host backend's op files (host_ops_*.cpp): fixed-block partitioning on
// the arena, row-major Eigen maps, the bad-id error. The ops are fp32 reference implementations of
// the GPT ops (formulas as in GPT-2 / llm.c): GEMMs go through Eigen on row-major maps, one
// single-threaded Eigen call per fixed block; everything else is plain loops. Row statistics and
// reductions accumulate in double, so this backend is a tight reference for the CUDA one.
#pragma once

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <Eigen/Core>
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "device/host_ops.h"

namespace zo::dev::host {

using Idx = Eigen::Index;
using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using Stride = Eigen::OuterStride<>;
using MatMap = Eigen::Map<RowMat, Eigen::Unaligned, Stride>;
using ConstMatMap = Eigen::Map<const RowMat, Eigen::Unaligned, Stride>;

// Block sizes depend on the shapes only; see the determinism note in host_ops.h.
inline constexpr std::size_t kGemmRows = 64;   // rows of one GEMM block
inline constexpr std::size_t kQueryRows = 64;  // attention query rows per block
inline constexpr std::size_t kChannels = 64;   // channels per block for reductions over rows
// Elements per block for elementwise ops and sums.
inline constexpr std::size_t kElements = 1u << 14;

inline std::size_t ceil_div(std::size_t a, std::size_t b) {
  return (a + b - 1) / b;
}

struct Range {
  std::size_t begin, end;
  std::size_t size() const { return end - begin; }
};
inline Range block_range(std::size_t blk, std::size_t block_size, std::size_t total) {
  const std::size_t begin = blk * block_size;
  return {begin, std::min(total, begin + block_size)};
}
// Rows per block so that a block holds about kElements values of a row length `cols`.
inline std::size_t rows_per_block(std::size_t cols) {
  return std::max<std::size_t>(1, kElements / cols);
}

inline Idx ix(std::size_t v) {
  return static_cast<Idx>(v);
}
inline ConstMatMap cmap(const float* p, std::size_t rows, std::size_t cols, std::size_t ld) {
  return ConstMatMap(p, ix(rows), ix(cols), Stride(ix(ld)));
}
inline MatMap map(float* p, std::size_t rows, std::size_t cols, std::size_t ld) {
  return MatMap(p, ix(rows), ix(cols), Stride(ix(ld)));
}

// Runs fn(block) for block in [0, nblocks) on the arena. Which thread runs a block never
// changes what it computes, so the partition is free to follow the scheduler.
template <class Fn>
void for_blocks(Arena& arena, std::size_t nblocks, const Fn& fn) {
  if (nblocks == 0) return;
  if (nblocks == 1 || arena.max_concurrency() == 1) {
    for (std::size_t b = 0; b < nblocks; ++b)
      fn(b);
    return;
  }
  arena.execute([&] {
    tbb::parallel_for(tbb::blocked_range<std::size_t>(0, nblocks, 1),
                      [&](const tbb::blocked_range<std::size_t>& r) {
                        for (std::size_t b = r.begin(); b != r.end(); ++b)
                          fn(b);
                      });
  });
}

[[noreturn]] inline void bad_id(const char* op, const char* kind, std::size_t row, std::int32_t id,
                                int limit) {
  std::string m = std::string(op) + ": " + kind + " id " + std::to_string(id) + " at row " +
                  std::to_string(row) + " is outside [0, ";
  m += limit > 0 ? std::to_string(limit) + ")" : "vocabulary size)";
  throw std::out_of_range(m + "; check that the data was tokenized for this model's vocabulary");
}

template <class Fn>
void for_elements(Arena& arena, std::size_t n, const Fn& fn) {
  for_blocks(arena, ceil_div(n, kElements), [&](std::size_t blk) {
    const Range r = block_range(blk, kElements, n);
    for (std::size_t i = r.begin; i < r.end; ++i)
      fn(i);
  });
}

}  // namespace zo::dev::host
