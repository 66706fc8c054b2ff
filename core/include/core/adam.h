// Adam / AdamW hyperparameters and the per-step constants every implementation derives from them
// (cpu_adam on the host, the GPU AdamW kernel, the host backend's device AdamW), written once so
// that all of them round identically. Plain C++17: nvcc includes it too.
//
// Adam: Kingma & Ba, arXiv 1412.6980. AdamW (decoupled weight decay): arXiv 1711.05101,
// Algorithm 2. Per element, with g = grad * grad_multiplier:
//   g  += l2 * p                                      (L2-style Adam only)
//   m   = b1 * m + (1 - b1) * g
//   v   = b2 * v + (1 - b2) * g^2
//   p   = p * (1 - lr * wd) - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
#pragma once

#include <cstdint>

namespace zo {

struct AdamConfig {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  bool decoupled_weight_decay = true;  // AdamW; false adds weight_decay * p to the gradient (L2)
  bool bias_correction = true;

  // Throws std::invalid_argument "<who>: <field> = <value> ..." naming the bad field and what is
  // allowed: lr and weight_decay finite and >= 0, betas in [0, 1), eps finite and > 0.
  void validate(const char* who) const;
};

// Step numbers count from 1; the gradient multiplier (1/loss_scale x clip) is finite and >= 0.
// Throws std::invalid_argument naming `who` otherwise.
void check_adam_step(const char* who, std::int64_t t, float grad_multiplier);

// The constants of update number t, computed in double and rounded to float once per call; every
// element then runs the same float operations in the same order (docs/cpu_adam.md).
struct AdamScalars {
  float beta1, one_minus_beta1;
  float beta2, one_minus_beta2;
  float neg_step_size;  // -lr / (1 - beta1^t), or -lr without bias correction
  float bc2_rsqrt;      // 1 / sqrt(1 - beta2^t), or 1 without bias correction
  float eps;
  float decay;      // 1 - lr * weight_decay for AdamW, else 1
  float l2;         // weight_decay for L2-style Adam, else 0
  float grad_mult;  // 1/loss_scale x clip coefficient
};
AdamScalars adam_scalars(const AdamConfig& c, std::int64_t t, float grad_multiplier);

// A weight-decay run table, for one AdamW launch over a whole layout: entry r is the first
// element of run r, ascending from 0, with kAdamRunDecays set where weight decay applies; run r
// ends where run r + 1 starts, the last at the array's end.
inline constexpr std::uint64_t kAdamRunDecays = std::uint64_t{1} << 63;

}  // namespace zo
