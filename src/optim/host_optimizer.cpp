#include "optim/host_optimizer.h"

#include <tbb/parallel_for.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <stdexcept>
#include <string>

namespace zo::optim {
namespace {

cpu_adam::CpuAdam::Options adam_options(int threads) {
  cpu_adam::CpuAdam::Options o;
  o.threads = threads;
  return o;
}

cpu_adam::ArrayView slice(cpu_adam::ArrayView a, std::size_t b, std::size_t e) {
  if (a.data == nullptr) return a;
  return {static_cast<char*>(a.data) + b * dtype_size(a.dtype), e - b, a.dtype};
}

cpu_adam::ConstArrayView slice(cpu_adam::ConstArrayView a, std::size_t b, std::size_t e) {
  return {static_cast<const char*>(a.data) + b * dtype_size(a.dtype), e - b, a.dtype};
}

}  // namespace

HostOptimizer::HostOptimizer(const model::ParameterLayout& layout, const OptimizerConfig& config,
                             std::vector<OwnedRange> owned)
    : n_(0),
      layout_n_(layout.size()),
      owned_(std::move(owned)),
      config_(config),
      adam_(config.adam, adam_options(config.threads)) {
  if (config.state_dtype != DType::kF32 && config.state_dtype != DType::kBF16) {
    throw std::invalid_argument("--optimizer-state must be fp32 or bf16");
  }
  if (owned_.empty()) owned_.push_back({0, layout_n_, 0});
  std::size_t prev_end = 0;
  for (const OwnedRange& o : owned_) {
    if (o.begin >= o.end || o.begin < prev_end || o.end > layout_n_ || o.local != n_) {
      throw std::invalid_argument(
          "HostOptimizer: owned ranges must be ascending, disjoint, "
          "non-empty, inside the layout and stored back to back");
    }
    prev_end = o.end;
    n_ += o.end - o.begin;
  }
  const std::size_t state_bytes = dtype_size(config.state_dtype);
  // First touch in the optimizer's own threads so pages sit on the updating thread's node.
  adam_.execute([&] {
    master_ = pinned::HostBuffer::allocate_array<float>(n_, {}, cpu_adam::kChunkElements);
    m_ = pinned::HostBuffer(n_ * state_bytes);
    v_ = pinned::HostBuffer(n_ * state_bytes);
    m_.first_touch(cpu_adam::kChunkElements * state_bytes);
    v_.first_touch(cpu_adam::kChunkElements * state_bytes);
  });
  for (const auto& t : layout.tensors()) {
    const bool decay = config.decay_policy.applies_to(t);
    if (!runs_.empty() && runs_.back().decay == decay && runs_.back().end == t.offset) {
      runs_.back().end = t.offset + t.numel;
    } else {
      runs_.push_back({t.offset, t.offset + t.numel, decay});
    }
  }
}

cpu_adam::StepResult HostOptimizer::step(cpu_adam::ConstArrayView grads, float lr,
                                         float grad_multiplier, cpu_adam::ArrayView params_out) {
  const std::int64_t t = state_.step + 1;
  const auto result = update_range(0, layout_n_, grads, t, lr, grad_multiplier, params_out);
  state_.step = t;
  return result;
}

cpu_adam::StepResult HostOptimizer::update_range(std::size_t begin, std::size_t end,
                                                 cpu_adam::ConstArrayView grads, std::int64_t t,
                                                 float lr, float grad_multiplier,
                                                 cpu_adam::ArrayView params_out) {
  if (grads.size != n_ || (params_out.data != nullptr && params_out.size != n_)) {
    throw std::invalid_argument("HostOptimizer: gradient or output size differs from the model's");
  }
  if (begin > end || end > layout_n_) {
    throw std::out_of_range("HostOptimizer::update_range: bad range");
  }
  cpu_adam::StepResult result{false, true};
  for (const OwnedRange& o : owned_) {
    if (o.end <= begin) continue;
    if (o.begin >= end) break;
    for (const Run& run : runs_) {
      const std::size_t lb = std::max({run.begin, begin, o.begin});
      const std::size_t le = std::min({run.end, end, o.end});
      if (lb >= le) continue;
      const std::size_t b = o.local + (lb - o.begin), e = b + (le - lb);  // local elements
      AdamConfig c = config_.adam;
      c.lr = lr;
      if (!run.decay) c.weight_decay = 0.0f;
      adam_.set_config(c);
      cpu_adam::AdamBuffers buf;
      buf.params = master().subspan(b, e - b);
      buf.exp_avg = slice(exp_avg(), b, e);
      buf.exp_avg_sq = slice(exp_avg_sq(), b, e);
      buf.grads = slice(grads, b, e);
      buf.params_out = slice(params_out, b, e);
      const auto r = adam_.update(buf, t, {grad_multiplier, cpu_adam::NonFinitePolicy::kReport});
      result.found_nonfinite = result.found_nonfinite || r.found_nonfinite;
    }
  }
  return result;
}

std::string HostOptimizer::find_invalid(const model::ParameterLayout& layout) {
  const cpu_adam::ArrayView moments[2] = {exp_avg(), exp_avg_sq()};
  auto value = [&](int array, std::size_t i) -> float {
    if (array == 0) return master()[i];
    const cpu_adam::ArrayView& a = moments[array - 1];
    return a.dtype == DType::kF32 ? static_cast<const float*>(a.data)[i]
                                  : bf16_to_float(static_cast<const std::uint16_t*>(a.data)[i]);
  };
  // Before the first update (Adam step 0) the moments are zero: any other value is state of
  // another run, or damage.
  const bool fresh = state().step == 0;
  auto bad = [&](int array, std::size_t i) {
    const float x = value(array, i);
    return !std::isfinite(x) || (array == 2 && x < 0.0f) || (array > 0 && fresh && x != 0.0f);
  };
  // Lowest bad local index per array, found in parallel over chunks.
  constexpr std::size_t kNone = ~std::size_t{0};
  for (int array = 0; array < 3; ++array) {
    const std::size_t chunks = (n_ + cpu_adam::kChunkElements - 1) / cpu_adam::kChunkElements;
    std::atomic<std::size_t> first{kNone};
    adam_.execute([&] {
      tbb::parallel_for(std::size_t{0}, chunks, [&](std::size_t c) {
        const std::size_t b = c * cpu_adam::kChunkElements;
        const std::size_t e = std::min(n_, b + cpu_adam::kChunkElements);
        for (std::size_t i = b; i < e; ++i) {
          if (!bad(array, i)) continue;
          std::size_t cur = first.load();
          while (i < cur && !first.compare_exchange_weak(cur, i)) {
          }
          return;
        }
      });
    });
    const std::size_t local = first.load();
    if (local == kNone) continue;
    std::size_t offset = local;  // local index -> layout offset
    for (const OwnedRange& o : owned_)
      if (local >= o.local && local < o.local + (o.end - o.begin))
        offset = o.begin + local - o.local;
    const model::TensorInfo* t = &layout.tensor_at(offset);
    const float x = value(array, local);
    static const char* const kNames[3] = {"weights", "Adam m", "Adam v"};
    const std::string what = !std::isfinite(x) ? std::to_string(x)
                             : x < 0.0f && array == 2
                                 ? "negative (" + std::to_string(x) + ")"
                                 : std::to_string(x) + " before any update (adam_step 0)";
    return std::string(kNames[array]) + " of " + t->name + " [" +
           std::to_string(offset - t->offset) + "]: " + what;
  }
  return {};
}

}  // namespace zo::optim
