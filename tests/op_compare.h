// Helpers shared by the tests that compare a device's results with a reference (the op-case
// table, op_cases.h; the GPT comparison in test_cuda_ops; test_simt's launcher tests): exact
// storage conversions and the error bounds.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace zo::test {

inline bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Storage conversions (exact, from core/dtype.h).
inline std::vector<std::uint8_t> encode(const std::vector<float>& x, zo::DType t) {
  const std::size_t es = zo::dtype_size(t);
  std::vector<std::uint8_t> out(x.size() * es);
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (t == zo::DType::kF32) {
      std::memcpy(&out[i * es], &x[i], 4);
    } else {
      const std::uint16_t h =
          t == zo::DType::kF16 ? zo::float_to_half(x[i]) : zo::float_to_bf16(x[i]);
      std::memcpy(&out[i * es], &h, 2);
    }
  }
  return out;
}

inline std::vector<float> decode(const std::vector<std::uint8_t>& bytes, zo::DType t) {
  const std::size_t es = zo::dtype_size(t);
  std::vector<float> out(bytes.size() / es);
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (t == zo::DType::kF32) {
      std::memcpy(&out[i], &bytes[i * es], 4);
    } else {
      std::uint16_t h = 0;
      std::memcpy(&h, &bytes[i * es], 2);
      out[i] = t == zo::DType::kF16 ? zo::half_to_float(h) : zo::bf16_to_float(h);
    }
  }
  return out;
}

inline std::vector<float> round_to(const std::vector<float>& x, zo::DType t) {
  return decode(encode(x, t), t);
}

// Comparison: a relative error norm plus an elementwise bound scaled by the data's rms.
struct Tol {
  double norm;  // ||got - want|| / ||want||
  double elem;  // |got - want| <= elem * (|want| + rms(want)) for every element
};

inline Tol act_tol(zo::DType t) {
  return t == zo::DType::kF32 ? Tol{1e-5, 1e-4} : Tol{1e-2, 3e-2};
}
// fp32 outputs computed from identical inputs (statistics, losses, optimizer state).
constexpr Tol kStatsTol{1e-5, 1e-4};

inline void expect_close(const std::vector<float>& got, const std::vector<float>& want, Tol tol,
                         const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  ASSERT_FALSE(want.empty()) << what;
  double diff2 = 0.0, want2 = 0.0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double d = double(got[i]) - double(want[i]);
    diff2 += d * d;
    want2 += double(want[i]) * double(want[i]);
  }
  ASSERT_GT(want2, 0.0) << what << ": the reference is all zeros; test on non-trivial data";
  const double rms = std::sqrt(want2 / double(want.size()));
  const double rel = std::sqrt(diff2 / want2);
  EXPECT_LE(rel, tol.norm) << what << ": relative error norm over " << want.size() << " elements";
  std::size_t bad = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double err = std::fabs(double(got[i]) - double(want[i]));
    if (!(err <= tol.elem * (std::fabs(double(want[i])) + rms))) {
      if (bad < 5) {
        ADD_FAILURE() << what << "[" << i << "] = " << got[i] << ", host " << want[i]
                      << " (rms of the reference " << rms << ")";
      }
      ++bad;
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": elements outside the elementwise bound";
}

// Base of the per-op fixtures, parameterised by the storage dtype under test: random inputs that
// are already representable in that dtype, so every backend sees identical values.
class DtypeOpTest : public ::testing::TestWithParam<zo::DType> {
 protected:
  zo::DType t() const { return GetParam(); }
  Tol tol() const { return act_tol(GetParam()); }

  // Normal(shift, scale) values rounded to the dtype under test.
  std::vector<float> rand(std::size_t n, float scale = 1.0f, float shift = 0.0f) {
    std::normal_distribution<float> normal(shift, scale);
    std::vector<float> x(n);
    for (float& v : x)
      v = normal(rng_);
    return round_to(x, t());
  }
  std::vector<std::int32_t> tokens(std::size_t n, int V) {
    std::uniform_int_distribution<int> pick(0, V - 1);
    std::vector<std::int32_t> x(n);
    for (auto& v : x)
      v = pick(rng_);
    return x;
  }

  std::mt19937 rng_{20240520};
};

inline std::string dtype_param_name(const ::testing::TestParamInfo<zo::DType>& info) {
  return std::string(zo::dtype_name(info.param));
}

}  // namespace zo::test
