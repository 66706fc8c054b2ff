// The threaded driver: validates arguments, derives per-step constants, picks the kernel for the
// dtype combination and runs it over fixed chunks on a oneTBB arena.
#include "cpu_adam/cpu_adam.h"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/partitioner.h>
#include <tbb/task_arena.h>

#include <atomic>
#include <cmath>
#include <sstream>
#include <stdexcept>
#include <string>

#include "kernel_table.h"

namespace zo::cpu_adam {
namespace {

constexpr const char* kWho = "cpu_adam";

[[noreturn]] void bad_argument(const char* who, const std::string& what) {
  throw std::invalid_argument(std::string(who) + ": " + what);
}

const detail::KernelTable& kernels_for(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return detail::kernels_scalar();
    case Isa::kAvx2:
      return detail::kernels_avx2();
    case Isa::kAvx512:
      return detail::kernels_avx512();
    case Isa::kAvx512Bf16:
      return detail::kernels_avx512_bf16();
  }
  bad_argument(kWho, "invalid ISA value");
}

int dtype_index(DType t) {
  return static_cast<int>(t);
}

// Runs fn(begin, end) over [0, n) in kChunkElements pieces; returns the OR of the results.
// Static partitioning gives each thread one contiguous run of chunks, the same split a
// static-partitioned first touch of the arrays used, so pages stay on the updating thread's node.
template <class Fn>
bool parallel_chunks(tbb::task_arena& arena, std::size_t n, Fn&& fn) {
  const std::size_t chunks = (n + kChunkElements - 1) / kChunkElements;
  if (chunks <= 1 || arena.max_concurrency() == 1) return fn(std::size_t{0}, n);
  std::atomic<bool> any{false};
  arena.execute([&] {
    tbb::parallel_for(
        tbb::blocked_range<std::size_t>(0, chunks, 1),
        [&](const tbb::blocked_range<std::size_t>& r) {
          bool found = false;
          for (std::size_t c = r.begin(); c != r.end(); ++c) {
            const std::size_t begin = c * kChunkElements;
            const std::size_t end = std::min(n, begin + kChunkElements);
            found = fn(begin, end) || found;
          }
          if (found) any.store(true, std::memory_order_relaxed);
        },
        tbb::static_partitioner());
  });
  return any.load(std::memory_order_relaxed);
}

void check_dtype(DType t, const char* name) {
  if (static_cast<int>(t) > static_cast<int>(DType::kBF16)) {
    bad_argument(kWho, std::string(name) + " has an invalid dtype value " +
                           std::to_string(static_cast<int>(t)));
  }
}

// Thread chunks keep the 8-bit state's blocks whole.
static_assert(kChunkElements % kQ8Block == 0);

// The element count: of params, or of the gradients with bf16 master weights.
std::size_t element_count(const AdamBuffers& b) {
  return b.bf16_master.params != nullptr ? b.grads.size : b.params.size();
}

void validate_q8(const AdamBuffers& b) {
  const Q8Moments& q = b.q8;
  if (b.exp_avg.data != nullptr || b.exp_avg_sq.data != nullptr) {
    bad_argument(kWho, "8-bit state (q8) replaces exp_avg and exp_avg_sq; leave those unset");
  }
  if (q.v == nullptr || q.m_absmax == nullptr || q.v_absmax == nullptr) {
    bad_argument(kWho, "8-bit state (q8) needs codes of m and v and both absmax arrays");
  }
  const std::size_t n = element_count(b);
  if (q.blocks != q8_blocks(n)) {
    bad_argument(kWho, "8-bit state (q8) has " + std::to_string(q.blocks) + " blocks for " +
                           std::to_string(n) + " elements; it needs " +
                           std::to_string(q8_blocks(n)));
  }
}

void validate_bf16_master(const AdamBuffers& b) {
  if (!b.params.empty()) {
    bad_argument(kWho, "bf16 master weights replace params; leave params empty");
  }
  const std::uint64_t n = element_count(b);
  if (n > ~std::uint64_t{0} - b.bf16_master.first_index) {
    bad_argument(kWho, "bf16 master weights: first_index " +
                           std::to_string(b.bf16_master.first_index) + " plus " +
                           std::to_string(n) + " elements overflows 64 bits");
  }
}

void validate_buffers(const AdamBuffers& b) {
  const std::size_t n = element_count(b);
  const bool bf16_master = b.bf16_master.params != nullptr;
  if (bf16_master) validate_bf16_master(b);
  if (b.q8.m != nullptr) validate_q8(b);
  check_dtype(b.exp_avg.dtype, "exp_avg");
  check_dtype(b.exp_avg_sq.dtype, "exp_avg_sq");
  check_dtype(b.grads.dtype, "grads");
  check_dtype(b.params_out.dtype, "params_out");
  // n comes from params, or from grads with bf16 master weights (which have no size).
  const char* const n_from = bf16_master ? "grads" : "params";
  auto check_array = [n, n_from](const void* data, std::size_t size, const char* name) {
    if (size != n) {
      bad_argument(kWho, std::string(name) + " has " + std::to_string(size) + " elements but " +
                             n_from + " has " + std::to_string(n) + "; all arrays must match");
    }
    if (n > 0 && data == nullptr) bad_argument(kWho, std::string(name) + " is a null pointer");
  };
  if (!bf16_master) check_array(b.params.data(), n, "params");
  check_array(b.grads.data, b.grads.size, "grads");
  if (b.params_out.data != nullptr) check_array(b.params_out.data, b.params_out.size, "params_out");
  if (b.params_out.data != nullptr && b.params_out.dtype == DType::kF32) {
    bad_argument(
        kWho, "params_out must be fp16 or bf16 (the master params are already updated in place)");
  }
  if (b.q8.m != nullptr) return;
  check_array(b.exp_avg.data, b.exp_avg.size, "exp_avg");
  check_array(b.exp_avg_sq.data, b.exp_avg_sq.size, "exp_avg_sq");

  if (b.exp_avg.dtype != b.exp_avg_sq.dtype) {
    bad_argument(kWho, "exp_avg is " + std::string(dtype_name(b.exp_avg.dtype)) +
                           " but exp_avg_sq is " + std::string(dtype_name(b.exp_avg_sq.dtype)) +
                           "; both must be fp32 or both bf16");
  }
  if (b.exp_avg.dtype == DType::kF16) {
    bad_argument(kWho,
                 "fp16 optimizer state is not supported (its range is too small for v): use fp32, "
                 "bf16 or q8");
  }
}

}  // namespace

struct CpuAdam::Pool {
  explicit Pool(int threads) : arena(threads > 0 ? threads : tbb::task_arena::automatic) {}
  tbb::task_arena arena;
};

CpuAdam::Options::Options() : isa(default_isa()) {}

CpuAdam::CpuAdam(const AdamConfig& config, const Options& options)
    : config_(config), isa_(options.isa) {
  config_.validate(kWho);
  if (!isa_supported(isa_)) {
    bad_argument(kWho, "ISA '" + std::string(isa_name(isa_)) +
                           "' is not supported by this CPU; best "
                           "available is '" +
                           std::string(isa_name(best_isa())) + "'");
  }
  if (options.threads < 0) {
    bad_argument(kWho, "threads = " + std::to_string(options.threads) +
                           " is invalid: use 0 (all cores) or a positive count");
  }
  pool_ = std::make_unique<Pool>(options.threads);
}

CpuAdam::~CpuAdam() = default;
CpuAdam::CpuAdam(CpuAdam&&) noexcept = default;
CpuAdam& CpuAdam::operator=(CpuAdam&&) noexcept = default;

void CpuAdam::set_config(const AdamConfig& config) {
  config.validate(kWho);
  config_ = config;
}

void CpuAdam::set_lr(float lr) {
  AdamConfig c = config_;
  c.lr = lr;
  set_config(c);
}

int CpuAdam::threads() const {
  return pool_->arena.max_concurrency();
}

void CpuAdam::execute(const std::function<void()>& fn) const {
  pool_->arena.execute(fn);
}

StepResult CpuAdam::step(const AdamBuffers& buffers, AdamState& state, const StepOptions& options) {
  const StepResult r = update(buffers, state.step + 1, options);
  if (r.applied) ++state.step;
  return r;
}

StepResult CpuAdam::update(const AdamBuffers& b, std::int64_t t, const StepOptions& options) const {
  check_adam_step(kWho, t, options.grad_multiplier);
  validate_buffers(b);
  const std::size_t n = element_count(b);
  if (n == 0) return {false, true};

  const detail::KernelTable& table = kernels_for(isa_);
  if (options.nonfinite == NonFinitePolicy::kSkipStep &&
      has_nonfinite(b.grads, options.grad_multiplier)) {
    return {true, false};
  }

  const int out = b.params_out.data == nullptr        ? detail::kOutNone
                  : b.params_out.dtype == DType::kF16 ? detail::kOutF16
                                                      : detail::kOutBF16;
  const int l2 = config_.decoupled_weight_decay || config_.weight_decay == 0.0f ? 0 : 1;
  const int g = dtype_index(b.grads.dtype);
  const bool q8 = b.q8.m != nullptr;
  const int master = b.bf16_master.params != nullptr ? 1 : 0;
  const detail::AdamRangeFn fn =
      q8 ? table.adam_q8[g][out][l2][master]
         : table.adam[g][b.exp_avg.dtype == DType::kBF16 ? 1 : 0][out][l2][master];
  const AdamScalars scalars = adam_scalars(config_, t, options.grad_multiplier);
  const detail::AdamArrays arrays{master ? nullptr : b.params.data(),
                                  q8 ? b.q8.m : b.exp_avg.data,
                                  q8 ? b.q8.v : b.exp_avg_sq.data,
                                  b.grads.data,
                                  b.params_out.data,
                                  b.q8.m_absmax,
                                  b.q8.v_absmax,
                                  b.bf16_master.params,
                                  b.bf16_master.seed,
                                  b.bf16_master.first_index,
                                  t};
  const bool found = parallel_chunks(pool_->arena, n, [&](std::size_t begin, std::size_t end) {
    return fn(arrays, scalars, begin, end);
  });
  return {found, true};
}

bool CpuAdam::has_nonfinite(ConstArrayView grads, float multiplier) const {
  if (!std::isfinite(multiplier) || multiplier < 0.0f) {
    std::ostringstream os;
    os << "grad multiplier = " << multiplier << " is invalid: it must be finite and >= 0";
    bad_argument(kWho, os.str());
  }
  if (grads.size > 0 && grads.data == nullptr) bad_argument(kWho, "grads is a null pointer");
  check_dtype(grads.dtype, "grads");
  const detail::NonFiniteRangeFn fn = kernels_for(isa_).nonfinite[dtype_index(grads.dtype)];
  return parallel_chunks(pool_->arena, grads.size, [&](std::size_t begin, std::size_t end) {
    return fn(grads.data, multiplier, begin, end);
  });
}

}  // namespace zo::cpu_adam
