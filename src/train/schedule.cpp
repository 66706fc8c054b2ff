#include "train/schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <stdexcept>

namespace zo::train {

DecayKind parse_decay(const std::string& name) {
  if (name == "cosine") return DecayKind::kCosine;
  if (name == "linear") return DecayKind::kLinear;
  if (name == "constant") return DecayKind::kConstant;
  throw std::invalid_argument("--lr-decay '" + name + "': use cosine, linear or constant");
}

const char* decay_name(DecayKind k) {
  switch (k) {
    case DecayKind::kCosine:
      return "cosine";
    case DecayKind::kLinear:
      return "linear";
    case DecayKind::kConstant:
      return "constant";
  }
  return "?";
}

void LrSchedule::validate() const {
  if (!(max_lr >= 0.0f) || !std::isfinite(max_lr)) {
    throw std::invalid_argument("--lr must be finite and >= 0");
  }
  if (!(min_lr_fraction >= 0.0f && min_lr_fraction <= 1.0f)) {
    throw std::invalid_argument("--min-lr-fraction must be in [0, 1]");
  }
  if (warmup_steps < 0) throw std::invalid_argument("--warmup must be >= 0");
  if (total_steps < 1) throw std::invalid_argument("--lr-schedule-steps must be >= 1");
}

float LrSchedule::at(std::int64_t step) const {
  if (step < warmup_steps) {
    return max_lr * static_cast<float>(double(step + 1) / double(warmup_steps));
  }
  const double min_lr = double(max_lr) * min_lr_fraction;
  const std::int64_t span = std::max<std::int64_t>(1, total_steps - warmup_steps);
  const double progress = std::clamp(double(step - warmup_steps) / double(span), 0.0, 1.0);
  double coeff = 1.0;  // 1 at the start of decay, 0 at the end
  switch (decay) {
    case DecayKind::kCosine:
      coeff = 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
      break;
    case DecayKind::kLinear:
      coeff = 1.0 - progress;
      break;
    case DecayKind::kConstant:
      return max_lr;
  }
  return static_cast<float>(min_lr + coeff * (double(max_lr) - min_lr));
}

}  // namespace zo::train
