#include "optim/host_optimizer.h"

#include "model/hf_weights.h"
#include "optim/state_pager.h"

#include <tbb/parallel_for.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
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
  if (!config.state_dir.empty()) {
    std::vector<SegmentSpan> spans;
    for (const Segment& s : segments_)
      spans.push_back({s.begin, s.end, s.block});
    StatePager::Options o;
    o.dir = config.state_dir;
    o.slots = config.state_slots;
    o.queue = config.state_queue;
    // A chunk never written starts as the zero state: q8's m code of 0 is not the byte 0.
    auto fresh = [q8](const ChunkSpan&, const StatePager::View& v) {
      if (q8) std::fill_n(static_cast<std::uint8_t*>(v.m), v.n, cpu_adam::q8_quantize(0, true));
    };
    pager_ = std::make_unique<StatePager>(
        plan_chunks(spans, config.state_chunk_elements),
        StateShape{dtype_size(config.master_dtype), state_bytes, q8}, fresh, o);
  }
  // First touch in the optimizer's own threads so pages sit on the updating thread's node.
  if (!pager_)
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
  if (q8 && !pager_)
    std::fill_n(static_cast<std::uint8_t*>(m_.data()), n_, cpu_adam::q8_quantize(0, true));
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
      const DType moment = config_.state_format == StateFormat::kF32 ? DType::kF32 : DType::kBF16;
      visit(b, e, true, [&](const StateSpan& s) {
        const std::size_t n = s.end - s.begin;
        cpu_adam::AdamBuffers buf;
        set_master(buf, s, lb + (s.begin - b));
        buf.exp_avg = {s.m, n, moment};
        buf.exp_avg_sq = {s.v, n, moment};
        buf.grads = slice(grads, s.begin, s.end);
        const auto r = update_piece(buf, s, t, grad_multiplier, params_out);
        result.found_nonfinite = result.found_nonfinite || r.found_nonfinite;
      });
    }
  }
  return result;
}

cpu_adam::StepResult HostOptimizer::update_q8(std::size_t begin, std::size_t end,
                                              cpu_adam::ConstArrayView grads, std::int64_t t,
                                              float lr, float grad_multiplier,
                                              cpu_adam::ArrayView params_out) {
  cpu_adam::StepResult result{false, true};
  for (const Segment& seg : segments_) {
    const std::size_t len = seg.end - seg.begin;
    if (seg.layout + len <= begin || seg.layout >= end) continue;
    if (seg.layout < begin || seg.layout + len > end) {
      throw std::logic_error("HostOptimizer: q8 state updates whole tensors; the range cuts one");
    }
    AdamConfig c = config_.adam;
    c.lr = lr;
    if (!seg.decay) c.weight_decay = 0.0f;
    adam_.set_config(c);
    // On a drive a chunk may end inside the segment, always at a block boundary.
    visit(seg.begin, seg.end, true, [&](const StateSpan& s) {
      const std::size_t n = s.end - s.begin;
      const std::size_t block = seg.block + (s.begin - seg.begin) / cpu_adam::kQ8Block - s.block0;
      cpu_adam::AdamBuffers buf;
      set_master(buf, s, seg.layout + (s.begin - seg.begin));
      buf.grads = slice(grads, s.begin, s.end);
      buf.q8 = {reinterpret_cast<std::uint8_t*>(s.m), reinterpret_cast<std::uint8_t*>(s.v),
                s.m_absmax + block, s.v_absmax + block, cpu_adam::q8_blocks(n)};
      const auto r = update_piece(buf, s, t, grad_multiplier, params_out);
      result.found_nonfinite = result.found_nonfinite || r.found_nonfinite;
    });
  }
  return result;
}

template <class F>
void HostOptimizer::visit(std::size_t begin, std::size_t end, bool write, F&& f) const {
  if (begin >= end) return;
  const std::size_t ms = dtype_size(config_.master_dtype);
  const std::size_t sb = state_element_bytes(config_.state_format);
  if (!pager_) {
    auto* master = static_cast<char*>(const_cast<void*>(master_.data()));
    auto* m = static_cast<char*>(const_cast<void*>(m_.data()));
    auto* v = static_cast<char*>(const_cast<void*>(v_.data()));
    auto* m_absmax = static_cast<float*>(const_cast<void*>(m_absmax_.data()));
    auto* v_absmax = static_cast<float*>(const_cast<void*>(v_absmax_.data()));
    f(StateSpan{begin, end, master + begin * ms, m + begin * sb, v + begin * sb, m_absmax, v_absmax,
                0});
    return;
  }
  const std::vector<ChunkSpan>& chunks = pager_->chunks();
  auto c =
      std::size_t(std::upper_bound(chunks.begin(), chunks.end(), begin,
                                   [](std::size_t i, const ChunkSpan& k) { return i < k.end; }) -
                  chunks.begin());
  for (; c < chunks.size() && chunks[c].begin < end; ++c) {
    const StatePager::View view = pager_->acquire(c);
    for (std::size_t ahead = 1; ahead <= pager_->read_ahead(); ++ahead)
      pager_->prefetch(c + ahead);  // read ahead while this chunk is worked on
    const ChunkSpan& k = chunks[c];
    const std::size_t lb = std::max(begin, k.begin), le = std::min(end, k.end), off = lb - k.begin;
    try {
      f(StateSpan{lb, le, static_cast<char*>(view.master) + off * ms,
                  static_cast<char*>(view.m) + off * sb, static_cast<char*>(view.v) + off * sb,
                  view.m_absmax, view.v_absmax, k.block_begin});
    } catch (...) {
      pager_->release(c, false);
      throw;
    }
    pager_->release(c, write);
  }
}

HostOptimizer::~HostOptimizer() = default;

void HostOptimizer::read_ahead_first_chunks() {
  if (!pager_) return;
  for (std::size_t c = 0; c < pager_->read_ahead(); ++c)
    pager_->prefetch(c);
}

cpu_adam::StepResult HostOptimizer::update_piece(cpu_adam::AdamBuffers& buf, const StateSpan& s,
                                                 std::int64_t t, float grad_multiplier,
                                                 cpu_adam::ArrayView params_out) {
  const bool fp32_out = params_out.data != nullptr && params_out.dtype == DType::kF32;
  buf.params_out = fp32_out ? cpu_adam::ArrayView{} : slice(params_out, s.begin, s.end);
  const auto r = adam_.update(buf, t, {grad_multiplier, cpu_adam::NonFinitePolicy::kReport});
  if (fp32_out) {
    convert_to_float(s.master, config_.master_dtype, static_cast<float*>(params_out.data) + s.begin,
                     s.end - s.begin);
  }
  return r;
}

void HostOptimizer::refuse_whole_arrays(const char* what) const {
  if (pager_) {
    throw std::logic_error(std::string("HostOptimizer: ") + what +
                           " of a state on a drive (--state-dir); read and write it by range");
  }
}

void HostOptimizer::set_master(cpu_adam::AdamBuffers& buf, const StateSpan& s,
                               std::size_t layout) const {
  if (config_.master_dtype == DType::kF32) {
    buf.params = {reinterpret_cast<float*>(s.master), s.end - s.begin};
    return;
  }
  buf.bf16_master = {reinterpret_cast<std::uint16_t*>(s.master), config_.seed, layout};
}

void* HostOptimizer::master_data() {
  refuse_whole_arrays("master_data()");
  return master_.data();
}

std::span<float> HostOptimizer::master() {
  refuse_whole_arrays("master()");
  if (config_.master_dtype != DType::kF32) {
    throw std::logic_error("HostOptimizer: master() of bf16 master weights; use read_master");
  }
  return master_.span<float>();
}

void HostOptimizer::read_master(std::size_t begin, std::span<float> out) const {
  if (begin > n_ || out.size() > n_ - begin) throw std::out_of_range("read_master: bad range");
  visit(begin, begin + out.size(), false, [&](const StateSpan& s) {
    convert_to_float(s.master, config_.master_dtype, out.data() + (s.begin - begin),
                     s.end - s.begin);
  });
}

void HostOptimizer::write_master(std::size_t begin, std::span<const float> values) {
  if (begin > n_ || values.size() > n_ - begin) throw std::out_of_range("write_master: bad range");
  visit(begin, begin + values.size(), true, [&](const StateSpan& s) {
    convert_from_float(values.data() + (s.begin - begin), s.master, config_.master_dtype,
                       s.end - s.begin);
  });
}

void HostOptimizer::copy_master_as(std::size_t begin, std::size_t end, DType dtype, void* out) {
  const std::size_t ms = dtype_size(config_.master_dtype), os = dtype_size(dtype);
  auto* dst = static_cast<char*>(out);
  // In pieces across the optimizer's threads: the whole model at initialisation and resume.
  for_owned(begin, end - begin, [&](std::size_t, std::size_t to, std::size_t n) {
    visit(to, to + n, false, [&](const StateSpan& s) {
      const std::size_t len = s.end - s.begin;
      const std::size_t pieces = (len + cpu_adam::kChunkElements - 1) / cpu_adam::kChunkElements;
      adam_.execute([&] {
        tbb::parallel_for(std::size_t{0}, pieces, [&](std::size_t p) {
          const std::size_t b = p * cpu_adam::kChunkElements;
          const std::size_t k = std::min(len, b + cpu_adam::kChunkElements) - b;
          const char* src = s.master + b * ms;
          char* to_out = dst + (s.begin + b) * os;
          if (dtype == config_.master_dtype) {
            std::copy_n(src, k * ms, to_out);
            return;
          }
          float tmp[cpu_adam::kChunkElements];
          convert_to_float(src, config_.master_dtype, tmp, k);
          convert_from_float(tmp, to_out, dtype, k);
        });
      });
    });
  });
}

cpu_adam::ArrayView HostOptimizer::moment_view(pinned::HostBuffer& b) {
  refuse_whole_arrays("exp_avg() or exp_avg_sq()");
  if (config_.state_format == StateFormat::kQ8) {
    throw std::logic_error("HostOptimizer: q8 state has no fp32 or bf16 view; use q8()");
  }
  return {b.data(), n_, config_.state_format == StateFormat::kF32 ? DType::kF32 : DType::kBF16};
}

HostOptimizer::Q8Arrays HostOptimizer::q8() {
  refuse_whole_arrays("q8()");
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
  const auto map = cpu_adam::q8_map(k == 0);
  visit(begin, begin + out.size(), false, [&](const StateSpan& s) {
    const char* data = k == 0 ? s.m : s.v;
    float* to = out.data() + (s.begin - begin);
    const std::size_t n = s.end - s.begin;
    switch (config_.state_format) {
      case StateFormat::kF32:
        std::copy_n(reinterpret_cast<const float*>(data), n, to);
        return;
      case StateFormat::kBF16:
        convert_to_float(data, DType::kBF16, to, n);
        return;
      case StateFormat::kQ8:
        break;
    }
    const float* absmax = k == 0 ? s.m_absmax : s.v_absmax;
    const auto* codes = reinterpret_cast<const std::uint8_t*>(data);
    for (std::size_t i = s.begin; i < s.end;) {
      const Segment& seg = segment_of(i);
      for (; i < s.end && i < seg.end; ++i) {
        const std::size_t c = codes[i - s.begin];
        const float a = absmax[seg.block + (i - seg.begin) / cpu_adam::kQ8Block - s.block0];
        to[i - s.begin] = (c < map.size() ? map[c] : std::numeric_limits<float>::quiet_NaN()) * a;
      }
    }
  });
}

void HostOptimizer::read_moment_stored(int k, std::size_t begin, std::size_t n, void* out) const {
  if (begin > n_ || n > n_ - begin) throw std::out_of_range("read_moment_stored: bad range");
  const std::size_t sb = state_element_bytes(config_.state_format);
  visit(begin, begin + n, false, [&](const StateSpan& s) {
    std::memcpy(static_cast<char*>(out) + (s.begin - begin) * sb, k == 0 ? s.m : s.v,
                (s.end - s.begin) * sb);
  });
}

void HostOptimizer::read_q8_absmax(int k, std::size_t i, std::size_t first,
                                   std::span<float> out) const {
  const Segment& seg = segments_.at(i);
  const std::size_t blocks = cpu_adam::q8_blocks(seg.end - seg.begin);
  if (config_.state_format != StateFormat::kQ8 || first > blocks || out.size() > blocks - first) {
    throw std::logic_error("read_q8_absmax: q8 state and blocks of one segment only");
  }
  const std::size_t begin = seg.begin + first * cpu_adam::kQ8Block;
  const std::size_t end = std::min(seg.end, begin + out.size() * cpu_adam::kQ8Block);
  visit(begin, end, false, [&](const StateSpan& s) {
    const std::size_t from = (s.begin - seg.begin) / cpu_adam::kQ8Block;  // in the segment
    const float* absmax = (k == 0 ? s.m_absmax : s.v_absmax) + seg.block + from - s.block0;
    std::copy_n(absmax, cpu_adam::q8_blocks(s.end - s.begin), out.data() + (from - first));
  });
}

void HostOptimizer::write_moment(int k, std::size_t begin, std::span<const float> values) {
  if (begin > n_ || values.size() > n_ - begin) throw std::out_of_range("write_moment: bad range");
  if (values.empty()) return;
  const std::size_t end = begin + values.size();
  if (config_.state_format == StateFormat::kQ8) {
    const Segment& seg = segment_of(begin);
    if ((begin - seg.begin) % cpu_adam::kQ8Block != 0 || end > seg.end ||
        (end != seg.end && (end - seg.begin) % cpu_adam::kQ8Block != 0)) {
      throw std::logic_error("write_moment: q8 values must cover whole blocks of one segment");
    }
  }
  visit(begin, end, true, [&](const StateSpan& s) {
    char* data = k == 0 ? s.m : s.v;
    const float* from = values.data() + (s.begin - begin);
    const std::size_t n = s.end - s.begin;
    switch (config_.state_format) {
      case StateFormat::kF32:
        std::copy_n(from, n, reinterpret_cast<float*>(data));
        return;
      case StateFormat::kBF16:
        convert_from_float(from, data, DType::kBF16, n);
        return;
      case StateFormat::kQ8:
        break;
    }
    // Whole blocks of one segment: a chunk boundary inside it is a block boundary.
    const Segment& seg = segment_of(s.begin);
    float* absmax = k == 0 ? s.m_absmax : s.v_absmax;
    auto* codes = reinterpret_cast<std::uint8_t*>(data);
    for (std::size_t b = s.begin; b < s.end; b += cpu_adam::kQ8Block) {
      const std::size_t e = std::min(s.end, b + cpu_adam::kQ8Block);
      float a = 0.0f;
      for (std::size_t i = b; i < e; ++i) {
        const float x = std::fabs(from[i - s.begin]);
        a = x > a || x != x ? x : a;  // NaN sticks
      }
      float& block_max = absmax[seg.block + (b - seg.begin) / cpu_adam::kQ8Block - s.block0];
      if (!(a <= std::numeric_limits<float>::max())) {  // Inf or NaN: as the kernels leave one
        block_max = std::numeric_limits<float>::quiet_NaN();
        std::fill(codes + (b - s.begin), codes + (e - s.begin), cpu_adam::q8_nan_code(k == 0));
        continue;
      }
      if (a < std::numeric_limits<float>::min()) a = 0.0f;  // as the kernels: 1/a could overflow
      block_max = a;
      const float inv = a > 0.0f ? 1.0f / a : 0.0f;
      for (std::size_t i = b; i < e; ++i)
        codes[i - s.begin] = cpu_adam::q8_quantize(from[i - s.begin] * inv, k == 0);
    }
  });
}

std::vector<SegmentSpan> state_segments(const model::ParameterLayout& layout,
                                        const std::vector<OwnedRange>& owned) {
  std::vector<SegmentSpan> out;
  std::size_t blocks = 0;
  for (const OwnedRange& o : owned) {
    for (const auto& t : layout.tensors()) {
      const std::size_t lb = std::max(o.begin, t.offset), le = std::min(o.end, t.offset + t.numel);
      if (lb >= le) continue;
      const std::size_t b = o.local + (lb - o.begin);
      out.push_back({b, b + (le - lb), blocks});
      blocks += cpu_adam::q8_blocks(le - lb);
    }
  }
  return out;
}

std::size_t q8_block_count(const model::ParameterLayout& layout,
                           const std::vector<OwnedRange>& owned) {
  const std::vector<SegmentSpan> s = state_segments(layout, owned);
  return s.empty() ? 0 : s.back().block + cpu_adam::q8_blocks(s.back().end - s.back().begin);
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
    auto scan = [&](std::size_t b, std::size_t e) {
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
    };
    if (pager_) {  // one thread reads the drive, chunk by chunk, until something is found
      // In pieces of a chunk (each read from its cached slot): a piece's fp32 copy stays small
      // whatever --state-chunk is.
      for (const ChunkSpan& c : pager_->chunks()) {
        for (std::size_t b = c.begin; b < c.end && first.load() == kNone;
             b += cpu_adam::kChunkElements)
          scan(b, std::min(c.end, b + cpu_adam::kChunkElements));
        if (first.load() != kNone) break;
      }
    } else {
      adam_.execute([&] {
        tbb::parallel_for(std::size_t{0}, chunks, [&](std::size_t c) {
          const std::size_t b = c * cpu_adam::kChunkElements;
          scan(b, std::min(n_, b + cpu_adam::kChunkElements));
        });
      });
    }
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
    // A q8 block with a NaN anywhere reads NaN as a whole: its first element is named.
    const bool q8_block = array > 0 && state_format() == StateFormat::kQ8 && std::isnan(x);
    return std::string(kNames[array]) + " of " + t->name + " " +
           model::hf_index(*t, offset - t->offset) + ": " + what +
           (q8_block ? " (the first element of a q8 block of " +
                           std::to_string(cpu_adam::kQ8Block) + " that is NaN as a whole)"
                     : std::string());
  }
  return {};
}

}  // namespace zo::optim
