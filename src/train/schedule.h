// Learning-rate schedules: linear warmup, then cosine, linear or constant decay to min_lr.
#pragma once

#include <cstdint>
#include <string>

namespace zo::train {

enum class DecayKind { kCosine, kLinear, kConstant };
DecayKind parse_decay(const std::string& name);  // "cosine", "linear", "constant"; throws
const char* decay_name(DecayKind k);

struct LrSchedule {
  float max_lr = 6e-4f;
  float min_lr_fraction = 0.1f;  // min_lr = max_lr * fraction
  std::int64_t warmup_steps = 0;
  std::int64_t total_steps = 1;
  DecayKind decay = DecayKind::kCosine;

  void validate() const;
  // lr for step `step` (0-based): warmup (step+1)/warmup * max_lr, then decay over the rest.
  float at(std::int64_t step) const;
};

}  // namespace zo::train
