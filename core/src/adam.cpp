#include "core/adam.h"

#include <cmath>
#include <sstream>
#include <stdexcept>
#include <string>

namespace zo {
namespace {

[[noreturn]] void bad_argument(const char* who, const std::string& what) {
  throw std::invalid_argument(std::string(who) + ": " + what);
}

void check_finite_nonneg(const char* who, float x, const char* name) {
  if (!std::isfinite(x) || x < 0.0f) {
    std::ostringstream os;
    os << name << " = " << x << " is invalid: it must be finite and >= 0";
    bad_argument(who, os.str());
  }
}

void check_beta(const char* who, float b, const char* name) {
  if (!(b >= 0.0f && b < 1.0f)) {
    std::ostringstream os;
    os << name << " = " << b << " is outside [0, 1); typical values are 0.9 (beta1), 0.95-0.999 "
       << "(beta2)";
    bad_argument(who, os.str());
  }
}

}  // namespace

void AdamConfig::validate(const char* who) const {
  check_finite_nonneg(who, lr, "lr");
  check_beta(who, beta1, "beta1");
  check_beta(who, beta2, "beta2");
  if (!std::isfinite(eps) || eps <= 0.0f) {
    std::ostringstream os;
    os << "eps = " << eps << " is invalid: it must be finite and > 0 (typically 1e-8)";
    bad_argument(who, os.str());
  }
  check_finite_nonneg(who, weight_decay, "weight_decay");
}

void check_adam_step(const char* who, std::int64_t t, float grad_multiplier) {
  if (t < 1)
    bad_argument(who, "step t = " + std::to_string(t) + " is invalid: updates count from 1");
  check_finite_nonneg(who, grad_multiplier, "grad_multiplier");
}

AdamScalars adam_scalars(const AdamConfig& c, std::int64_t t, float grad_multiplier) {
  const double b1 = c.beta1, b2 = c.beta2, lr = c.lr, wd = c.weight_decay;
  const double bc1 = c.bias_correction ? 1.0 - std::pow(b1, static_cast<double>(t)) : 1.0;
  const double bc2 = c.bias_correction ? 1.0 - std::pow(b2, static_cast<double>(t)) : 1.0;
  AdamScalars s{};
  s.beta1 = c.beta1;
  s.one_minus_beta1 = static_cast<float>(1.0 - b1);
  s.beta2 = c.beta2;
  s.one_minus_beta2 = static_cast<float>(1.0 - b2);
  s.neg_step_size = static_cast<float>(-lr / bc1);
  s.bc2_rsqrt = static_cast<float>(1.0 / std::sqrt(bc2));
  s.eps = c.eps;
  s.decay = c.decoupled_weight_decay ? static_cast<float>(1.0 - lr * wd) : 1.0f;
  s.l2 = c.decoupled_weight_decay ? 0.0f : c.weight_decay;
  s.grad_mult = grad_multiplier;
  return s;
}

}  // namespace zo
