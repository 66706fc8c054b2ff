// Hyperparameter checks shared by every Adam implementation (cpu_adam, the GPU AdamW kernel and
// the device backends). Plain C++17, so CUDA translation units can include it.
#pragma once

#include <cstdint>

namespace zo::cpu_adam {

// Throws std::invalid_argument "<who>: <field> = <value> ..." naming the bad field and what is
// allowed: lr and weight_decay finite and >= 0, betas in [0, 1), eps finite and > 0.
void check_adam_hyperparameters(const char* who, float lr, float beta1, float beta2, float eps,
                                float weight_decay);
// Step numbers count from 1; the gradient multiplier must be finite and >= 0.
void check_adam_step(const char* who, std::int64_t t, float grad_multiplier);

}  // namespace zo::cpu_adam
