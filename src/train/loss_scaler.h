// Dynamic loss scaling for fp16 training (Micikevicius et al., arXiv 1710.03740 §3.2), with
// DeepSpeed-like defaults: start at 2^16, halve on overflow (the step is skipped before any
// state changes), double after `growth_interval` overflow-free steps, within [min, max].
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>

namespace zo::train {

struct LossScalerConfig {
  bool dynamic = true;
  float initial = 65536.0f;  // 2^16; the fixed scale when !dynamic
  float growth = 2.0f;
  float backoff = 0.5f;
  std::int64_t growth_interval = 1000;
  float min_scale = 1.0f;
  float max_scale = 16777216.0f;  // 2^24
};

class LossScaler {
 public:
  explicit LossScaler(const LossScalerConfig& c = {});
  float scale() const { return scale_; }
  // Call once per step with whether the (scaled) gradients overflowed.
  void update(bool overflow);
  nlohmann::json state() const;
  void restore(const nlohmann::json& s);

 private:
  LossScalerConfig c_;
  float scale_;
  std::int64_t good_steps_ = 0;
};

}  // namespace zo::train
