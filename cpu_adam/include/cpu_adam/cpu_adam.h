// CPU Adam / AdamW over host arrays: one fused, vectorized, multithreaded pass that reads the
// gradients (fp32, fp16 or bf16), updates the master weights (fp32, or bf16 rounded
// stochastically) and the moments m and v (fp32, bf16 or 8-bit), and optionally writes a 16-bit
// copy of the new weights for upload to the GPU.
//
// Adam: Kingma & Ba, arXiv 1412.6980. AdamW (decoupled weight decay): arXiv 1711.05101.
// ZeRO-Offload's CPU Adam: arXiv 2101.06840 §4.2.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "core/adam.h"
#include "core/dtype.h"

namespace zo::cpu_adam {

// ---- instruction-set paths --------------------------------------------------------------------
// Chosen once at run time from cpuid (and the OS's saved-state mask), never at compile time.
enum class Isa : std::uint8_t {
  kScalar,      // portable C++, the reference every other path equals bit for bit
  kAvx2,        // AVX2 + FMA + F16C
  kAvx512,      // AVX-512 F/DQ/BW/VL (+F16C)
  kAvx512Bf16,  // as kAvx512, with AVX512-BF16 conversions for bf16 stores
};

std::string_view isa_name(Isa isa);
Isa parse_isa(std::string_view name);  // "scalar", "avx2", "avx512", "avx512bf16"; throws
bool isa_supported(Isa isa);           // this CPU and OS can run it
std::vector<Isa> supported_isas();     // ascending
Isa best_isa();                        // the fastest supported path
// The path to use unless told otherwise: $ZO_CPU_ADAM_ISA if set (throws if the CPU lacks it),
// else best_isa().
Isa default_isa();

// ---- state --------------------------------------------------------------------------------------
// Hyperparameters: zo::AdamConfig (core/adam.h), shared with the GPU AdamW.
// Caller-owned so that checkpoints save and restore it.
struct AdamState {
  std::int64_t step = 0;  // updates applied so far
};

// ---- arrays -------------------------------------------------------------------------------------
struct ArrayView {
  void* data = nullptr;
  std::size_t size = 0;  // elements
  DType dtype = DType::kF32;
};
struct ConstArrayView {
  const void* data = nullptr;
  std::size_t size = 0;  // elements
  DType dtype = DType::kF32;
};
inline ArrayView view(std::span<float> s) {
  return {s.data(), s.size(), DType::kF32};
}
inline ArrayView view(std::span<std::uint16_t> s, DType t) {
  return {s.data(), s.size(), t};
}
inline ConstArrayView view(std::span<const float> s) {
  return {s.data(), s.size(), DType::kF32};
}
inline ConstArrayView view(std::span<const std::uint16_t> s, DType t) {
  return {s.data(), s.size(), t};
}

// ---- 8-bit state -------------------------------------------------------------------------------
// m and v as 8-bit codes of a dynamic (non-linear) map, with one fp32 absmax per block of
// kQ8Block elements: a moment is map[code] * absmax (block-wise quantization, Dettmers et al.,
// arXiv 2110.02861). m uses the signed map, v the unsigned one. An update dequantizes a block,
// runs Adam in fp32 with the unrounded new moments, finds the new absmax and requantizes.
// Blocks start at element 0 of each call's arrays: a caller keeps every call to one tensor's
// elements (of one rank), so that no block straddles two. A block whose new moments are not all
// finite gets a NaN absmax and every code q8_nan_code (so that every one reads NaN); one whose
// largest is below FLT_MIN is flushed to zero.
inline constexpr std::size_t kQ8Block = 2048;
inline constexpr std::size_t q8_blocks(std::size_t n) {
  return (n + kQ8Block - 1) / kQ8Block;
}
struct Q8Moments {
  std::uint8_t* m = nullptr;  // (n) codes of m
  std::uint8_t* v = nullptr;  // (n) codes of v
  float* m_absmax = nullptr;  // (q8_blocks(n))
  float* v_absmax = nullptr;  // (q8_blocks(n))
  std::size_t blocks = 0;     // entries of m_absmax and v_absmax
};
// The maps, ascending: signed 255 values from -1 to 1 (0 is code 127), unsigned 256 from 0 to 1.
// A magnitude code c (v's code; |code - 127| for m) of b bits (8 for v, 7 for m) with
// F = floor(log2 c) lies in decade E = b - 1 - F and is worth fmaf(c, S, C) in float, with
// S = 10^-E * 0.9 / 2^F and C = 10^-E - (2^(F + 1) - 1) * S (each rounded to float once): 2^F
// steps from about 10^-E * (0.1 + 0.9 / 2^F) up to 10^-E. docs/cpu_adam.md has the details.
std::span<const float> q8_map(bool is_signed);
// The code every path gives x (a moment over its block's absmax): a decade's linear map, chosen by
// the decade tops, rounded to an integer. That is the nearest map value, except next to a midpoint
// (within about 2^-15 of the step between the two values), where it may be the other neighbour;
// every map value gives its own code. Unsigned: the code of |x|.
std::uint8_t q8_quantize(float x, bool is_signed);
// The code of every element of a block whose absmax is NaN: the map's top one (254 for m, 255 for
// v), which reads NaN there, as no code 0 would under a decoder scaled by the block's absmax.
inline constexpr std::uint8_t q8_nan_code(bool is_signed) {
  return is_signed ? 254 : 255;
}

// ---- bf16 master weights -----------------------------------------------------------------------
// bf16 master weights rounded stochastically (instead of AdamBuffers::params, which is then
// empty): each new value rounds up with probability equal to its distance from the bf16 below,
// from random bits that depend only on (seed, t, index), so results are reproducible, the same on
// every ISA path, thread count and bucket split, and bit for bit across a resume.
struct Bf16Master {
  std::uint16_t* params = nullptr;  // (n) bf16 master weights, updated in place; nullptr: none
  std::uint64_t seed = 0;           // the run's seed
  std::uint64_t first_index = 0;    // index of element 0 in the whole model (the layout)
};
// The 16 random bits (low half of the result) that round parameter `index` at update t.
std::uint32_t sr_bits(std::uint64_t seed, std::int64_t t, std::uint64_t index);
// x rounded to bf16 with random bits r (low 16 used): add r to the low 16 bits of x's pattern and
// truncate; NaN stays a quiet NaN; Inf stays Inf.
std::uint16_t bf16_round_stochastic(float x, std::uint32_t r);

// Element i of every array belongs to parameter i; all sizes must be equal.
struct AdamBuffers {
  std::span<float> params;  // (n) fp32 master weights, updated in place (empty with bf16_master)
  ArrayView exp_avg;        // (n) m: kF32 or kBF16 (unset with q8)
  ArrayView exp_avg_sq;     // (n) v: same dtype as exp_avg (unset with q8)
  ConstArrayView grads;     // (n) kF32, kF16 or kBF16
  ArrayView params_out;  // optional (n) kF16 or kBF16 copy of the new params; data == nullptr: none
  Q8Moments q8;          // 8-bit m and v instead of exp_avg and exp_avg_sq; q8.m == nullptr: none
  Bf16Master bf16_master;  // bf16 master weights instead of params; params == nullptr: none
};

// ---- one update ---------------------------------------------------------------------------------
enum class NonFinitePolicy : std::uint8_t {
  // Update in the same pass and report whether any scaled gradient was Inf/NaN. Costs nothing
  // extra; the arrays hold whatever the non-finite values produced. For callers that already
  // know the gradients are finite (the offload engine reduces overflow flags on the GPU).
  kReport,
  // Check-then-update: a read-only pre-pass over the gradients (2-4 of the update's 28 bytes per
  // parameter); if any is non-finite nothing is written and the step is not counted.
  kSkipStep,
};

struct StepOptions {
  // Applied to every gradient before anything else: 1/loss_scale times the clip coefficient, so
  // unscaling and clipping cost no extra pass. Must be finite and >= 0.
  float grad_multiplier = 1.0f;
  NonFinitePolicy nonfinite = NonFinitePolicy::kReport;
};

struct StepResult {
  bool found_nonfinite = false;  // some grad * grad_multiplier was Inf or NaN
  bool applied = false;          // the arrays were updated
};

// Elements per work item. The split never changes results (every element is independent and all
// paths are bit-identical), it only sets parallel granularity; NUMA first touch uses the same
// chunks so that pages land where their updating thread runs.
inline constexpr std::size_t kChunkElements = 16384;

class CpuAdam {
 public:
  struct Options {
    Isa isa;          // defaults to default_isa()
    int threads = 0;  // 0: one per available core
    Options();
  };

  explicit CpuAdam(const AdamConfig& config, const Options& options = Options());
  ~CpuAdam();
  CpuAdam(CpuAdam&&) noexcept;
  CpuAdam& operator=(CpuAdam&&) noexcept;
  CpuAdam(const CpuAdam&) = delete;
  CpuAdam& operator=(const CpuAdam&) = delete;

  const AdamConfig& config() const { return config_; }
  void set_config(const AdamConfig& config);  // validates; e.g. a new lr each step
  void set_lr(float lr);
  Isa isa() const { return isa_; }
  int threads() const;

  // Applies update number state.step + 1 and, if applied, increments state.step.
  StepResult step(const AdamBuffers& buffers, AdamState& state, const StepOptions& options = {});

  // Applies update number `t` (>= 1) to these arrays without touching any step counter: the
  // offload engine updates a model bucket by bucket, every bucket with the same t.
  StepResult update(const AdamBuffers& buffers, std::int64_t t,
                    const StepOptions& options = {}) const;

  // True if any grads[i] * multiplier is Inf or NaN (read-only, parallel).
  bool has_nonfinite(ConstArrayView grads, float multiplier = 1.0f) const;

  // Runs fn inside this optimizer's thread arena, so that parallel work in fn (for example
  // pinned::HostBuffer::first_touch with kChunkElements-sized chunks) uses the worker threads that
  // will later update the same pages.
  void execute(const std::function<void()>& fn) const;

 private:
  struct Pool;
  AdamConfig config_;
  Isa isa_;
  std::unique_ptr<Pool> pool_;
};

}  // namespace zo::cpu_adam
