#include "train/loss_scaler.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace zo::train {

LossScaler::LossScaler(const LossScalerConfig& c) : c_(c), scale_(c.initial) {
  if (!(c.initial > 0.0f) || !std::isfinite(c.initial)) {
    throw std::invalid_argument("--loss-scale must be a positive finite number");
  }
  if (c.growth_interval < 1) throw std::invalid_argument("--loss-scale-window must be >= 1");
}

void LossScaler::update(bool overflow) {
  if (!c_.dynamic) return;
  if (overflow) {
    scale_ = std::max(c_.min_scale, scale_ * c_.backoff);
    good_steps_ = 0;
  } else if (++good_steps_ >= c_.growth_interval) {
    scale_ = std::min(c_.max_scale, scale_ * c_.growth);
    good_steps_ = 0;
  }
}

nlohmann::json LossScaler::state() const {
  return {{"scale", scale_}, {"good_steps", good_steps_}, {"dynamic", c_.dynamic}};
}

void LossScaler::restore(const nlohmann::json& s) {
  scale_ = s.at("scale").get<float>();
  good_steps_ = s.at("good_steps").get<std::int64_t>();
}

}  // namespace zo::train
