#include "optim/host_optimizer.h"

#include <tbb/parallel_for.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
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
  if (config.master_dtype != DType::kF32 && config.master_dtype != DType::kBF16) {
    throw std::invalid_argument("HostOptimizer: master weights are fp32 or bf16");
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
  for (const OwnedRange& o : owned_) {
    for (const auto& t : layout.tensors()) {
      const std::size_t lb = std::max(o.begin, t.offset), le = std::min(o.end, t.offset + t.numel);
      if (lb >= le) continue;
      const std::size_t b = o.local + (lb - o.begin);
      segments_.push_back({b, b + (le - lb), lb, blocks_, config.decay_policy.applies_to(t)});
      blocks_ += cpu_adam::q8_blocks(le - lb);
    }
  }
  const std::size_t state_bytes = state_element_bytes(config.state_format);
  const bool q8 = config.state_format == StateFormat::kQ8;
  // First touch in the optimizer's own threads so pages sit on the updating thread's node.
  adam_.execute([&] {
    const std::size_t mb = dtype_size(config.master_dtype);
    pinned::PinOptions pin = config.master_pin;
    pin.placement = {};
    pin.first_touch_chunk_bytes = cpu_adam::kChunkElements * mb;
    master_ = pinned::PinnedBuffer(n_ * mb, pin);
    m_ = pinned::HostBuffer(n_ * state_bytes);
    v_ = pinned::HostBuffer(n_ * state_bytes);
    m_.first_touch(cpu_adam::kChunkElements * state_bytes);
    v_.first_touch(cpu_adam::kChunkElements * state_bytes);
    if (q8) {
      m_absmax_ = pinned::HostBuffer::allocate_array<float>(blocks_);
      v_absmax_ = pinned::HostBuffer::allocate_array<float>(blocks_);
    }
  });
  // q8 zero: every block's absmax 0 (zero-filled), and m's code of 0 (v's is 0 already).
  if (q8) std::fill_n(static_cast<std::uint8_t*>(m_.data()), n_, cpu_adam::q8_quantize(0, true));
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
  if (config_.state_format == StateFormat::kQ8) {
    return update_q8(begin, end, grads, t, lr, grad_multiplier, params_out);
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
      set_master(buf, b, e - b, lb);
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

cpu_adam::StepResult HostOptimizer::update_q8(std::size_t begin, std::size_t end,
                                              cpu_adam::ConstArrayView grads, std::int64_t t,
                                              float lr, float grad_multiplier,
                                              cpu_adam::ArrayView params_out) {
  cpu_adam::StepResult result{false, true};
  const Q8Arrays q = q8();
  for (const Segment& s : segments_) {
    const std::size_t len = s.end - s.begin;
    if (s.layout + len <= begin || s.layout >= end) continue;
    if (s.layout < begin || s.layout + len > end) {
      throw std::logic_error("HostOptimizer: q8 state updates whole tensors; the range cuts one");
    }
    AdamConfig c = config_.adam;
    c.lr = lr;
    if (!s.decay) c.weight_decay = 0.0f;
    adam_.set_config(c);
    cpu_adam::AdamBuffers buf;
    set_master(buf, s.begin, len, s.layout);
    buf.grads = slice(grads, s.begin, s.end);
    buf.params_out = slice(params_out, s.begin, s.end);
    buf.q8 = {q.m.data() + s.begin, q.v.data() + s.begin, q.m_absmax.data() + s.block,
              q.v_absmax.data() + s.block, cpu_adam::q8_blocks(len)};
    const auto r = adam_.update(buf, t, {grad_multiplier, cpu_adam::NonFinitePolicy::kReport});
    result.found_nonfinite = result.found_nonfinite || r.found_nonfinite;
  }
  return result;
}

void HostOptimizer::set_master(cpu_adam::AdamBuffers& buf, std::size_t b, std::size_t n,
                               std::size_t layout) {
  if (config_.master_dtype == DType::kF32) {
    buf.params = master().subspan(b, n);
    return;
  }
  buf.bf16_master = {static_cast<std::uint16_t*>(master_.data()) + b, config_.seed, layout};
}

std::span<float> HostOptimizer::master() {
  if (config_.master_dtype != DType::kF32) {
    throw std::logic_error("HostOptimizer: master() of bf16 master weights; use read_master");
  }
  return master_.span<float>();
}

void HostOptimizer::read_master(std::size_t begin, std::span<float> out) const {
  if (begin > n_ || out.size() > n_ - begin) throw std::out_of_range("read_master: bad range");
  const auto* base = static_cast<const char*>(master_.data());
  convert_to_float(base + begin * dtype_size(config_.master_dtype), config_.master_dtype,
                   out.data(), out.size());
}

void HostOptimizer::write_master(std::size_t begin, std::span<const float> values) {
  if (begin > n_ || values.size() > n_ - begin) throw std::out_of_range("write_master: bad range");
  auto* base = static_cast<char*>(master_.data());
  convert_from_float(values.data(), base + begin * dtype_size(config_.master_dtype),
                     config_.master_dtype, values.size());
}

void HostOptimizer::copy_master_as(std::size_t begin, std::size_t end, DType dtype, void* out) {
  const std::size_t ms = dtype_size(config_.master_dtype), os = dtype_size(dtype);
  const auto* master = static_cast<const char*>(master_.data());
  auto* dst = static_cast<char*>(out);
  // In chunks across the optimizer's threads: the whole model at initialisation and resume.
  for_owned(begin, end - begin, [&](std::size_t, std::size_t to, std::size_t n) {
    const std::size_t chunks = (n + cpu_adam::kChunkElements - 1) / cpu_adam::kChunkElements;
    adam_.execute([&] {
      tbb::parallel_for(std::size_t{0}, chunks, [&](std::size_t c) {
        const std::size_t b = to + c * cpu_adam::kChunkElements;
        const std::size_t k = std::min(to + n, b + cpu_adam::kChunkElements) - b;
        if (dtype == config_.master_dtype) {
          std::copy_n(master + b * ms, k * ms, dst + b * os);
          return;
        }
        float tmp[cpu_adam::kChunkElements];
        convert_to_float(master + b * ms, config_.master_dtype, tmp, k);
        convert_from_float(tmp, dst + b * os, dtype, k);
      });
    });
  });
}

cpu_adam::ArrayView HostOptimizer::moment_view(pinned::HostBuffer& b) {
  if (config_.state_format == StateFormat::kQ8) {
    throw std::logic_error("HostOptimizer: q8 state has no fp32 or bf16 view; use q8()");
  }
  return {b.data(), n_, config_.state_format == StateFormat::kF32 ? DType::kF32 : DType::kBF16};
}

HostOptimizer::Q8Arrays HostOptimizer::q8() {
  if (config_.state_format != StateFormat::kQ8) {
    throw std::logic_error("HostOptimizer: q8() of " +
                           std::string(state_format_name(config_.state_format)) + " state");
  }
  return {{static_cast<std::uint8_t*>(m_.data()), n_},
          {static_cast<std::uint8_t*>(v_.data()), n_},
          m_absmax_.span<float>(),
          v_absmax_.span<float>()};
}

const HostOptimizer::Segment& HostOptimizer::segment_of(std::size_t i) const {
  const auto it = std::upper_bound(segments_.begin(), segments_.end(), i,
                                   [](std::size_t v, const Segment& s) { return v < s.begin; });
  if (it == segments_.begin() || i >= (it - 1)->end) {
    throw std::out_of_range("HostOptimizer: local element beyond the owned ones");
  }
  return *(it - 1);
}

void HostOptimizer::read_moment(int k, std::size_t begin, std::span<float> out) {
  if (begin > n_ || out.size() > n_ - begin) throw std::out_of_range("read_moment: bad range");
  const void* data = (k == 0 ? m_ : v_).data();
  switch (config_.state_format) {
    case StateFormat::kF32:
      std::copy_n(static_cast<const float*>(data) + begin, out.size(), out.data());
      return;
    case StateFormat::kBF16:
      convert_to_float(static_cast<const std::uint16_t*>(data) + begin, DType::kBF16, out.data(),
                       out.size());
      return;
    case StateFormat::kQ8:
      break;
  }
  const auto map = cpu_adam::q8_map(k == 0);
  const float* absmax = (k == 0 ? m_absmax_ : v_absmax_).span<float>().data();
  const auto* codes = static_cast<const std::uint8_t*>(data);
  for (std::size_t i = begin, done = 0; done < out.size();) {
    const Segment& s = segment_of(i);
    for (; i < s.end && done < out.size(); ++i, ++done) {
      const std::size_t c = codes[i];
      const float a = absmax[s.block + (i - s.begin) / cpu_adam::kQ8Block];
      out[done] = (c < map.size() ? map[c] : std::numeric_limits<float>::quiet_NaN()) * a;
    }
  }
}

void HostOptimizer::write_moment(int k, std::size_t begin, std::span<const float> values) {
  if (begin > n_ || values.size() > n_ - begin) throw std::out_of_range("write_moment: bad range");
  void* data = (k == 0 ? m_ : v_).data();
  switch (config_.state_format) {
    case StateFormat::kF32:
      std::copy(values.begin(), values.end(), static_cast<float*>(data) + begin);
      return;
    case StateFormat::kBF16:
      convert_from_float(values.data(), static_cast<std::uint16_t*>(data) + begin, DType::kBF16,
                         values.size());
      return;
    case StateFormat::kQ8:
      break;
  }
  if (values.empty()) return;
  const Segment& s = segment_of(begin);
  const std::size_t end = begin + values.size();
  if ((begin - s.begin) % cpu_adam::kQ8Block != 0 || end > s.end ||
      (end != s.end && (end - s.begin) % cpu_adam::kQ8Block != 0)) {
    throw std::logic_error("write_moment: q8 values must cover whole blocks of one segment");
  }
  float* absmax = (k == 0 ? m_absmax_ : v_absmax_).span<float>().data();
  auto* codes = static_cast<std::uint8_t*>(data);
  for (std::size_t b = begin; b < end; b += cpu_adam::kQ8Block) {
    const std::size_t e = std::min(end, b + cpu_adam::kQ8Block);
    float a = 0.0f;
    for (std::size_t i = b; i < e; ++i) {
      const float x = std::fabs(values[i - begin]);
      a = x > a || x != x ? x : a;  // NaN sticks
    }
    if (a < std::numeric_limits<float>::min()) a = 0.0f;  // as the kernels: 1/a could overflow
    absmax[s.block + (b - s.begin) / cpu_adam::kQ8Block] = a;
    const float inv = a > 0.0f ? 1.0f / a : 0.0f;
    for (std::size_t i = b; i < e; ++i)
      codes[i] = cpu_adam::q8_quantize(values[i - begin] * inv, k == 0);
  }
}

std::size_t q8_block_count(const model::ParameterLayout& layout,
                           const std::vector<OwnedRange>& owned) {
  std::size_t blocks = 0;
  for (const OwnedRange& o : owned) {
    for (const auto& t : layout.tensors()) {
      const std::size_t lb = std::max(o.begin, t.offset), le = std::min(o.end, t.offset + t.numel);
      if (lb < le) blocks += cpu_adam::q8_blocks(le - lb);
    }
  }
  return blocks;
}

std::string HostOptimizer::find_invalid(const model::ParameterLayout& layout) {
  // Before the first update (Adam step 0) the moments are zero: any other value is state of
  // another run, or damage.
  const bool fresh = state().step == 0;
  auto bad = [&](int array, float x) {
    return !std::isfinite(x) || (array == 2 && x < 0.0f) || (array > 0 && fresh && x != 0.0f);
  };
  // Lowest bad local index per array, found in parallel over chunks (moments read as fp32).
  constexpr std::size_t kNone = ~std::size_t{0};
  for (int array = 0; array < 3; ++array) {
    const std::size_t chunks = (n_ + cpu_adam::kChunkElements - 1) / cpu_adam::kChunkElements;
    std::atomic<std::size_t> first{kNone};
    adam_.execute([&] {
      tbb::parallel_for(std::size_t{0}, chunks, [&](std::size_t c) {
        const std::size_t b = c * cpu_adam::kChunkElements;
        const std::size_t e = std::min(n_, b + cpu_adam::kChunkElements);
        std::vector<float> values(e - b);
        if (array == 0) {
          read_master(b, values);
        } else {
          read_moment(array - 1, b, values);
        }
        for (std::size_t i = b; i < e; ++i) {
          if (!bad(array, values[i - b])) continue;
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
    float x = 0.0f;
    if (array == 0) {
      read_master(local, {&x, 1});
    } else {
      read_moment(array - 1, local, {&x, 1});
    }
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
