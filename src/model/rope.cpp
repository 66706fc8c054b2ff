#include "model/rope.h"

#include <cmath>
#include <numbers>
#include <stdexcept>
#include <string>

namespace zo::model {
namespace {

[[noreturn]] void bad(const std::string& what) {
  throw std::invalid_argument("rope: " + what);
}

void check(const RopeConfig& c) {
  if (c.head_size <= 0 || c.head_size % 2 != 0) {
    bad("head size " + std::to_string(c.head_size) + " must be positive and even");
  }
  if (!(c.theta > 1.0) || !std::isfinite(c.theta)) {
    bad("rope_theta " + std::to_string(c.theta) + " must be finite and > 1");
  }
  if (!c.scaling.llama3) return;
  const RopeScaling& s = c.scaling;
  if (!(s.factor >= 1.0)) bad("rope_scaling factor must be >= 1");
  if (!(s.low_freq_factor > 0.0) || !(s.high_freq_factor > s.low_freq_factor)) {
    bad("rope_scaling needs 0 < low_freq_factor < high_freq_factor");
  }
  if (s.original_max_position_embeddings <= 0) {
    bad("rope_scaling original_max_position_embeddings must be > 0");
  }
}

// Llama 3.1's rescaling of one frequency by its wavelength 2 pi / f against the original context:
// long wavelengths (low frequencies) are divided by `factor`, short ones kept, and those between
// original / high_freq_factor and original / low_freq_factor interpolated linearly in
// original / wavelength.
double llama3_scaled(double f, const RopeScaling& s) {
  const double original = s.original_max_position_embeddings;
  const double wavelength = 2.0 * std::numbers::pi / f;
  if (wavelength < original / s.high_freq_factor) return f;
  if (wavelength > original / s.low_freq_factor) return f / s.factor;
  const double smooth =
      (original / wavelength - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
  return (1.0 - smooth) * f / s.factor + smooth * f;
}

}  // namespace

std::vector<float> rope_inv_freq(const RopeConfig& c) {
  check(c);
  std::vector<float> inv_freq(static_cast<std::size_t>(c.head_size / 2));
  for (std::size_t i = 0; i < inv_freq.size(); ++i) {
    double f = std::pow(c.theta, -2.0 * static_cast<double>(i) / c.head_size);
    if (c.scaling.llama3) f = llama3_scaled(f, c.scaling);
    inv_freq[i] = static_cast<float>(f);
  }
  return inv_freq;
}

}  // namespace zo::model
