#include "offload/param_window.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace zo::offload {
namespace {

constexpr std::size_t kAlign = 256;  // cuBLASLt's largest alignment class, in bytes

std::size_t largest_streamed(const model::ParameterLayout& layout) {
  std::size_t most = 0;
  for (std::size_t g = 0; g < layout.groups().size(); ++g)
    if (!ParamWindow::resident(layout, g)) most = std::max(most, layout.groups()[g].size());
  return most;
}

std::size_t round_up(std::size_t x) {
  return (x + kAlign - 1) / kAlign * kAlign;
}

// The bytes resident group g takes (with room to keep its alignment) and one slot's bytes: what
// the window allocates and device_bytes counts.
std::size_t resident_bytes(const model::ParameterLayout& layout, std::size_t g, std::size_t esize) {
  return round_up(layout.groups()[g].size() * esize + kAlign);
}
std::size_t slot_bytes(const model::ParameterLayout& layout, std::size_t esize) {
  return largest_streamed(layout) * esize + kAlign;
}

}  // namespace

bool ParamWindow::resident(const model::ParameterLayout& layout, std::size_t g) {
  return g == 0 || g + 1 == layout.groups().size();
}

std::size_t ParamWindow::device_bytes(const model::ParameterLayout& layout, std::size_t esize,
                                      int slots) {
  std::size_t bytes = 0;
  for (std::size_t g = 0; g < layout.groups().size(); ++g)
    if (resident(layout, g)) bytes += resident_bytes(layout, g, esize);
  return bytes + std::size_t(slots) * slot_bytes(layout, esize);
}

ParamWindow::ParamWindow(dev::Device& device, dev::Stream& compute, dev::Stream& h2d,
                         const model::ParameterLayout& layout, int slots, bool poison,
                         bool forward_only)
    : dev_(device),
      compute_(compute),
      h2d_(h2d),
      layout_(layout),
      esize_(dtype_size(device.act_dtype())),
      slot_count_(slots),
      forward_only_(forward_only) {
  if (slots < 2) {
    throw std::invalid_argument("a parameter window needs at least 2 slots, not " +
                                std::to_string(slots));
  }
  const std::size_t groups = layout.groups().size();
  res_offset_.assign(groups, kNone);
  std::size_t bytes = 0;
  for (std::size_t g = 0; g < groups; ++g) {
    if (!resident(layout, g)) continue;
    res_offset_[g] = bytes + skew(g);
    bytes += resident_bytes(layout, g, esize_);
  }
  resident_ = dev_.alloc(bytes, "resident parameter groups");
  const std::size_t slot = slot_bytes(layout, esize_);
  for (int i = 0; i < slots; ++i) {
    Slot s;
    s.memory = dev_.alloc(slot, "parameter window slot");
    s.filled = dev_.create_event();
    s.released = dev_.create_event();
    slots_.push_back(std::move(s));
  }
  if (poison) {
    nans_ = dev_.alloc(slot, "NaN for released parameter slots");
    const std::vector<unsigned char> ones(slot, 0xFF);  // NaN in fp32, bf16 and fp16
    dev_.copy_to_device(nans_.data(), ones.data(), slot, h2d_);
    h2d_.synchronize();
  }
}

std::size_t ParamWindow::skew(std::size_t g) const {
  return layout_.groups()[g].begin * esize_ % kAlign;
}

ParamWindow::Slot* ParamWindow::slot_of(std::size_t g) {
  for (Slot& s : slots_)
    if (s.group == g) return &s;
  return nullptr;
}

const ParamWindow::Slot* ParamWindow::slot_of(std::size_t g) const {
  return const_cast<ParamWindow*>(this)->slot_of(g);
}

const void* ParamWindow::param(std::size_t offset) const {
  const std::size_t g = layout_.group_of(offset);
  const std::size_t at = (offset - layout_.groups()[g].begin) * esize_;
  if (res_offset_[g] != kNone) return resident_.as<char>() + res_offset_[g] + at;
  const Slot* s = slot_of(g);
  if (s == nullptr || !s->current) {
    throw std::logic_error("parameter window: " + layout_.group_name(g) +
                           " read while not in the window (not announced with before_read)");
  }
  return s->memory.as<char>() + skew(g) + at;
}

void* ParamWindow::resident_base(std::size_t g) const {
  if (res_offset_[g] == kNone) throw std::logic_error("parameter window: a streamed group");
  return resident_.as<char>() + res_offset_[g];
}

bool ParamWindow::held(std::size_t g) const {
  const Slot* s = slot_of(g);
  return s != nullptr && s->current;
}

void ParamWindow::invalidate(std::size_t g) {
  if (Slot* s = slot_of(g)) s->current = false;
}

void ParamWindow::enter(std::size_t g, const void* host,
                        const std::function<bool(std::size_t)>& ready,
                        const std::function<FillEvents(std::size_t)>& events) {
  release();
  if (res_offset_[g] == kNone && !held(g)) {
    const FillEvents e = events(g);
    fill(g, host, {g}, e.begin, e.end);
  }
  acquire(g);
  std::vector<std::size_t> keep = ahead(g, std::size_t(slot_count_) - 1);
  keep.push_back(g);
  for (std::size_t i = 0; i + 1 < keep.size(); ++i) {
    const std::size_t h = keep[i];
    if (held(h)) continue;
    if (!ready(h)) break;
    const FillEvents e = events(h);
    fill(h, host, keep, e.begin, e.end);
  }
}

void ParamWindow::release() {
  if (reading_ == nullptr) return;
  dev_.record(*reading_->released, compute_);
  reading_ = nullptr;
}

void ParamWindow::fill(std::size_t g, const void* host, const std::vector<std::size_t>& keep,
                       dev::Event& begin, dev::Event& end) {
  Slot* s = slot_of(g);
  if (s == nullptr) {
    for (Slot& c : slots_) {
      if (&c == reading_ || std::find(keep.begin(), keep.end(), c.group) != keep.end()) continue;
      if (s == nullptr || c.last_use < s->last_use) s = &c;
    }
  }
  if (s == nullptr || s == reading_) {
    throw std::logic_error("parameter window: no free slot for " + layout_.group_name(g));
  }
  const model::Range& r = layout_.groups()[g];
  Logged* log = nullptr;
  if (!forward_only_ && logged_ < kCopyLog) {  // the engine's timings read the log
    if (logged_ == log_.size()) log_.push_back({g, dev_.create_event(), dev_.create_event()});
    log = &log_[logged_++];
    log->group = g;
  }
  dev_.wait(h2d_, *s->released);  // the kernels that read the slot's last group are done
  dev_.record(begin, h2d_);
  if (log != nullptr) dev_.record(*log->begin, h2d_);
  if (nans_.data() != nullptr)
    dev_.copy_on_device(s->memory.data(), nans_.data(), nans_.bytes(), h2d_);
  dev_.copy_to_device(s->memory.as<char>() + skew(g),
                      static_cast<const char*>(host) + r.begin * esize_, r.size() * esize_, h2d_);
  dev_.record(end, h2d_);
  if (log != nullptr) dev_.record(*log->end, h2d_);
  dev_.record(*s->filled, h2d_);
  s->group = g;
  s->current = true;
  s->last_use = ++uses_;
}

void ParamWindow::acquire(std::size_t g) {
  const std::size_t top = layout_.groups().size() - 1;  // n_layer + 1
  const bool streamed = res_offset_[g] == kNone;
  // The direction of the pass, from the announcement before: forward runs 0, 1, ..., top (then
  // 0 again for a tied head), backward top, ..., 1 (after the head's group).
  // A group announced again (the tied head's in forward, then in backward) says nothing new.
  if (last_ != kNone && g != last_) {
    if (streamed) {
      if (last_ == 0) {
        phase_ = Phase::kAscending;
      } else if (last_ == top) {
        phase_ = Phase::kDescending;
      } else {
        phase_ = g > last_ ? Phase::kAscending : Phase::kDescending;
      }
    } else if (g == 0) {  // a tied head after the final norm, or the start of a forward
      phase_ = last_ == top ? Phase::kIdle : Phase::kAscending;
    } else {  // top: the end of a forward, or (after a tied head) the start of a backward
      phase_ = last_ == 0 ? Phase::kDescending : Phase::kIdle;
    }
  }
  last_ = g;
  if (!streamed) return;
  Slot* s = slot_of(g);
  if (s == nullptr || !s->current) {
    throw std::logic_error("parameter window: " + layout_.group_name(g) + " acquired unfilled");
  }
  dev_.wait(compute_, *s->filled);
  s->last_use = ++uses_;
  reading_ = s;
}

std::vector<ParamWindow::Copy> ParamWindow::take_copies() {
  std::vector<Copy> out;
  for (std::size_t i = 0; i < logged_; ++i)
    out.push_back({log_[i].group, log_[i].begin.get(), log_[i].end.get()});
  logged_ = 0;
  return out;
}

std::vector<std::size_t> ParamWindow::ahead(std::size_t g, std::size_t count) const {
  const std::size_t top = layout_.groups().size() - 1;
  std::vector<std::size_t> next;
  if (phase_ == Phase::kAscending) {
    for (std::size_t h = g + 1; h < top && next.size() < count; ++h)
      next.push_back(h);
  } else if (phase_ == Phase::kDescending) {
    for (std::size_t h = std::min(g, top); h > 1 && next.size() < count; --h)
      next.push_back(h - 1);
  } else if (forward_only_) {  // after the head: the next forward's first blocks
    for (std::size_t h = 1; h < top && next.size() < count; ++h)
      next.push_back(h);
  }
  return next;
}

}  // namespace zo::offload
