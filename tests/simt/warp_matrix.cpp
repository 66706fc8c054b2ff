// The warp-level matrix instructions on the SIMT emulator (warp_matrix.h). The fragment layouts
// below are written from the PTX ISA sections each names; test_simt checks them against plain
// triple loops fed by fragments built in the test from the same sections.
#include "warp_matrix.h"

#include <bit>
#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "simt.h"

namespace zo::simt {
namespace {

constexpr int kWarp = 32;

// ---- PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type" -------------------
// groupID = lane / 4, threadID_in_group = lane % 4; a lane's element i lies in its register i / 2,
// in the low 16 bits for even i.
// A (16x16, .row, .f16/.bf16): row groupID + kARow[i], column 2 threadID_in_group + kACol[i].
constexpr int kARow[8] = {0, 0, 8, 8, 0, 0, 8, 8};
constexpr int kACol[8] = {0, 1, 0, 1, 8, 9, 8, 9};
// B (16x8, .col, .f16/.bf16): row 2 threadID_in_group + kBRow[i], column groupID.
constexpr int kBRow[4] = {0, 1, 8, 9};
// C and D (16x8, .f32, one element per register): row groupID + kCRow[i], column
// 2 threadID_in_group + kCCol[i].
constexpr int kCRow[4] = {0, 0, 8, 8};
constexpr int kCCol[4] = {0, 1, 0, 1};

struct MmaOperands {
  std::uint32_t a[4], b[2];
  float c[4];
};
static_assert(sizeof(MmaOperands) <= kWarpOperandBytes);

// Every fp16 value, decoded once (a launch runs many thousands of mma).
const std::vector<float>& half_values() {
  static const std::vector<float> values = [] {
    std::vector<float> v(65536);
    for (std::size_t h = 0; h < v.size(); ++h)
      v[h] = half_to_float(static_cast<std::uint16_t>(h));
    return v;
  }();
  return values;
}

double element(const float* halves, std::uint32_t reg, int i) {
  const std::uint32_t bits = i % 2 == 0 ? reg & 0xffffu : reg >> 16;
  return halves != nullptr ? halves[bits] : std::bit_cast<float>(bits << 16);
}

void mma_op(const unsigned char* const* in, unsigned char* const* out, int variant) {
  const float* halves =
      static_cast<MmaInput>(variant) == MmaInput::kF16 ? half_values().data() : nullptr;
  double a[16][16], b[16][8], d[16][8];
  for (int lane = 0; lane < kWarp; ++lane) {
    MmaOperands o;
    std::memcpy(&o, in[lane], sizeof o);
    const int g = lane / 4, t = lane % 4;
    for (int i = 0; i < 8; ++i)
      a[g + kARow[i]][2 * t + kACol[i]] = element(halves, o.a[i / 2], i);
    for (int i = 0; i < 4; ++i) {
      b[2 * t + kBRow[i]][g] = element(halves, o.b[i / 2], i);
      d[g + kCRow[i]][2 * t + kCCol[i]] = o.c[i];
    }
  }
  // Products of 16-bit inputs are exact in double; each sum is rounded to fp32 once (PTX leaves
  // the order and precision of the accumulation to the hardware).
  for (int m = 0; m < 16; ++m) {
    for (int k = 0; k < 16; ++k) {
      for (int n = 0; n < 8; ++n)
        d[m][n] += a[m][k] * b[k][n];
    }
  }
  for (int lane = 0; lane < kWarp; ++lane) {
    const int g = lane / 4, t = lane % 4;
    float r[4];
    for (int i = 0; i < 4; ++i)
      r[i] = static_cast<float>(d[g + kCRow[i]][2 * t + kCCol[i]]);
    std::memcpy(out[lane], r, sizeof r);
  }
}

// ---- PTX ISA, "Warp-level matrix load instruction: ldmatrix" ---------------------------------
// Lane 8 i + r holds the address of row r of matrix i (8 contiguous 16-bit elements, 16-byte
// aligned, in shared memory); on sm_80+ the addresses of lanes past 8 num are not used. Lane l
// receives in register i the elements of row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1 of
// matrix i, the first in the low half; with .trans, of the transposed matrix.
void ldmatrix_op(const unsigned char* const* in, unsigned char* const* out, int variant) {
  const int num = variant & 7;
  const bool trans = (variant & 8) != 0;
  std::uint16_t m[4][8][8];
  for (int i = 0; i < num; ++i) {
    for (int r = 0; r < 8; ++r) {
      const void* row = nullptr;
      std::memcpy(&row, in[8 * i + r], sizeof row);
      const char* bad = reinterpret_cast<std::uintptr_t>(row) % 16 != 0 ? "is not 16-byte aligned"
                        : !in_dynamic_shared(row, 16)
                            ? "is outside the block's dynamic shared memory"
                            : nullptr;
      if (bad != nullptr) {
        throw SimtError("ldmatrix: lane " + std::to_string(8 * i + r) + "'s row address " + bad);
      }
      std::memcpy(m[i][r], row, 16);
    }
  }
  for (int lane = 0; lane < kWarp; ++lane) {
    const int row = lane / 4, col = 2 * (lane % 4);
    std::uint32_t r[4];
    for (int i = 0; i < num; ++i) {
      const std::uint16_t lo = trans ? m[i][col][row] : m[i][row][col];
      const std::uint16_t hi = trans ? m[i][col + 1][row] : m[i][row][col + 1];
      r[i] = lo | static_cast<std::uint32_t>(hi) << 16;
    }
    std::memcpy(out[lane], r, sizeof(std::uint32_t) * num);
  }
}

void perform(const AsyncCopy& c) {
  std::memcpy(c.dst, c.src, c.src_bytes);
  std::memset(static_cast<char*>(c.dst) + c.src_bytes, 0, c.bytes - c.src_bytes);
}

}  // namespace

void mma_m16n8k16(MmaInput input, float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                  std::uint32_t b1, const std::source_location& where) {
  MmaOperands o{{a[0], a[1], a[2], a[3]}, {b0, b1}, {d[0], d[1], d[2], d[3]}};
  warp_collective(&mma_op, static_cast<int>(input), &o, sizeof o, d, sizeof d, where);
}

void ldmatrix(int num, bool trans, std::uint32_t* r, const void* row,
              const std::source_location& where) {
  if (num != 1 && num != 2 && num != 4) thread_error("ldmatrix .x" + std::to_string(num), where);
  warp_collective(&ldmatrix_op, num | (trans ? 8 : 0), &row, sizeof row, r,
                  sizeof(std::uint32_t) * num, where);
}

// ---- PTX ISA, "Data Movement and Conversion Instructions: cp.async" --------------------------
// cp-size 4, 8 or 16 bytes (.cg: 16 only), both addresses aligned to it; src-size <= cp-size
// bytes are read and the rest of the destination is zero-filled.
void cp_async(CacheOp op, void* dst, const void* src, int bytes, int src_bytes,
              const std::source_location& where) {
  const std::string what = op == CacheOp::kCg ? "cp.async.cg" : "cp.async.ca";
  if (bytes != 4 && bytes != 8 && bytes != 16) {
    thread_error(what + " of " + std::to_string(bytes) + " bytes (4, 8 or 16)", where);
  }
  if (op == CacheOp::kCg && bytes != 16) thread_error(what + " copies 16 bytes only", where);
  if (src_bytes < 0 || src_bytes > bytes) {
    thread_error(what + " with src-size " + std::to_string(src_bytes) + " > cp-size", where);
  }
  if (reinterpret_cast<std::uintptr_t>(dst) % bytes != 0 ||
      reinterpret_cast<std::uintptr_t>(src) % bytes != 0) {
    thread_error(what + " addresses not aligned to its " + std::to_string(bytes) + " bytes", where);
  }
  if (!in_dynamic_shared(dst, bytes)) {
    thread_error(what + " destination outside the block's dynamic shared memory", where);
  }
  // The destination is undefined until the wait: poisoned (NaN in every float type), so that
  // reading it early, or issuing into a buffer another warp still reads, gives NaN.
  std::memset(dst, 0xff, bytes);
  async_copies().copies.push_back(AsyncCopy{dst, src, bytes, src_bytes});
}

// ---- PTX ISA, "cp.async.commit_group" and "cp.async.wait_group" ------------------------------
// commit_group closes the thread's copies issued since the last one into a group (possibly
// empty); wait_group N returns once at most the N most recent groups are pending. Copies not yet
// committed are not waited for.
void cp_async_commit_group() {
  AsyncCopies& q = async_copies();
  q.group_ends.push_back(q.copies.size());
}

void cp_async_wait_group(int pending) {
  AsyncCopies& q = async_copies();
  const auto groups = static_cast<std::ptrdiff_t>(q.group_ends.size());
  const std::ptrdiff_t finished = groups - pending;
  if (finished <= 0) return;
  const std::size_t done = q.group_ends[finished - 1];
  for (std::size_t i = 0; i < done; ++i)
    perform(q.copies[i]);
  q.copies.erase(q.copies.begin(), q.copies.begin() + static_cast<std::ptrdiff_t>(done));
  q.group_ends.erase(q.group_ends.begin(), q.group_ends.begin() + finished);
  for (std::size_t& end : q.group_ends)
    end -= done;
}

}  // namespace zo::simt
