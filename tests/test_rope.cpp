// model/rope.h: the RoPE inverse-frequency table, plain and with Llama 3.1's rope_scaling, against
// a float64 formula written here (in log space, bands chosen by frequency rather than wavelength)
// and a few numbers worked by hand.
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <vector>

#include "model/rope.h"

namespace {

using zo::model::rope_inv_freq;
using zo::model::RopeConfig;
using zo::model::RopeScaling;

// inv_freq[i] = exp(-(2i / hs) ln theta); with scaling, by the frequency bands
// f > 2 pi high / original (kept), f < 2 pi low / original (divided by factor), and between them
// f (s + (1 - s) / factor) with s = (original f / (2 pi) - low) / (high - low).
std::vector<double> reference(int hs, double theta, const RopeScaling* s) {
  const double two_pi = 2.0 * std::acos(-1.0);
  std::vector<double> r(std::size_t(hs) / 2);
  for (std::size_t i = 0; i < r.size(); ++i) {
    const double f = std::exp(-(2.0 * double(i) / hs) * std::log(theta));
    r[i] = f;
    if (s == nullptr) continue;
    const double orig = s->original_max_position_embeddings;
    if (f > two_pi * s->high_freq_factor / orig) continue;
    if (f < two_pi * s->low_freq_factor / orig) {
      r[i] = f / s->factor;
      continue;
    }
    const double t =
        (orig * f / two_pi - s->low_freq_factor) / (s->high_freq_factor - s->low_freq_factor);
    r[i] = f * (t + (1.0 - t) / s->factor);
  }
  return r;
}

void expect_matches(const std::vector<float>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    // The fp32 rounding of the same real number (half an ulp, 6e-8 relative), up to a tie.
    EXPECT_NEAR(got[i], want[i], 1.2e-7 * want[i]) << "inv_freq[" << i << "]";
  }
}

TEST(Rope, PlainInverseFrequenciesMatchFloat64) {
  for (const int hs : {2, 10, 64, 128}) {
    for (const double theta : {1e4, 5e5}) {
      expect_matches(rope_inv_freq({hs, theta, {}}), reference(hs, theta, nullptr));
    }
  }
}

TEST(Rope, Llama3ScalingMatchesFloat64) {
  const RopeScaling llama31{true, 8.0, 1.0, 4.0, 8192};   // Llama 3.1
  const RopeScaling llama32{true, 32.0, 1.0, 4.0, 8192};  // Llama 3.2
  const RopeScaling narrow{true, 4.0, 2.0, 3.0, 1000};    // other bands
  for (const RopeScaling& s : {llama31, llama32, narrow}) {
    for (const int hs : {64, 128}) {
      expect_matches(rope_inv_freq({hs, 5e5, s}), reference(hs, 5e5, &s));
    }
  }
}

// hs 128, theta 5e5, Llama 3.1's scaling, worked by hand: i = 0 has f = 1 (wavelength 2 pi, far
// below 8192 / 4: kept); i = 63 has f = 5e5^(-126/128) = 2.45514e-6 (wavelength 2.56e6 > 8192:
// divided by 8); i = 32 has f = 5e5^(-1/2) = 1/707.107 = 1.414214e-3, wavelength 4442.88, so
// s = (8192 / 4442.88 - 1) / 3 = 0.281284 and f (s + (1 - s) / 8) = 5.248462e-4.
TEST(Rope, Llama3ScalingHandCheckedValues) {
  const std::vector<float> f = rope_inv_freq({128, 5e5, RopeScaling{true, 8.0, 1.0, 4.0, 8192}});
  ASSERT_EQ(f.size(), 64u);
  EXPECT_EQ(f[0], 1.0f);
  EXPECT_NEAR(f[32], 5.248462e-4, 1e-9);
  EXPECT_NEAR(f[63], 2.455141e-6 / 8.0, 1e-12);
  // Without scaling, i = 32 is theta^(-1/2) itself.
  EXPECT_NEAR(rope_inv_freq({128, 5e5, {}})[32], 1.4142136e-3, 1e-9);
  // Scaling never raises a frequency and keeps the table decreasing.
  for (std::size_t i = 1; i < f.size(); ++i)
    EXPECT_LT(f[i], f[i - 1]) << i;
}

TEST(Rope, BadConfigsAreRefused) {
  EXPECT_THROW(rope_inv_freq({63, 1e4, {}}), std::invalid_argument);
  EXPECT_THROW(rope_inv_freq({0, 1e4, {}}), std::invalid_argument);
  EXPECT_THROW(rope_inv_freq({64, 1.0, {}}), std::invalid_argument);
  EXPECT_THROW(rope_inv_freq({64, 1e4, RopeScaling{true, 0.5, 1.0, 4.0, 8192}}),
               std::invalid_argument);
  EXPECT_THROW(rope_inv_freq({64, 1e4, RopeScaling{true, 8.0, 4.0, 4.0, 8192}}),
               std::invalid_argument);
  EXPECT_THROW(rope_inv_freq({64, 1e4, RopeScaling{true, 8.0, 1.0, 4.0, 0}}),
               std::invalid_argument);
}

}  // namespace
