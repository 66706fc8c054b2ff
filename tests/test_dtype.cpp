// The scalar 16-bit conversions against independent references (ref_16bit.h: rounding in exact
// double arithmetic for both formats), and that reference against the compiler's _Float16 (IEEE
// conversions done by libgcc) where the compiler has one.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "ref_16bit.h"

namespace {

using zo::test::ref_from_f16;
using zo::test::ref_to_bf16;
using zo::test::ref_to_f16;

bool is_nan_half(std::uint16_t h) {
  return (h & 0x7c00u) == 0x7c00u && (h & 0x03ffu) != 0;
}
bool is_nan_bf16(std::uint16_t b) {
  return (b & 0x7f80u) == 0x7f80u && (b & 0x007fu) != 0;
}

// Random fp32 bit patterns, biased towards the interesting exponent ranges of the 16-bit types.
float random_float(std::mt19937& rng) {
  std::uniform_int_distribution<std::uint32_t> bits;
  std::uniform_int_distribution<int> pick(0, 3);
  const std::uint32_t u = bits(rng);
  switch (pick(rng)) {
    case 0:
      return std::bit_cast<float>(u);  // anything, NaN and Inf included
    case 1: {                          // around the fp16 range, subnormals and overflow included
      const std::uint32_t e = 100 + (u >> 27) % 45;
      return std::bit_cast<float>((u & 0x807fffffu) | (e << 23));
    }
    case 2:
      return std::bit_cast<float>(u & 0x807fffffu);  // fp32 subnormals
    default: {  // exact ties for both formats: low bits 1000...0
      const std::uint32_t base = u & 0xffffe000u;
      return std::bit_cast<float>((u & 1u) ? (base | 0x1000u) : ((u & 0xffff0000u) | 0x8000u));
    }
  }
}

TEST(DType, NamesAndSizes) {
  EXPECT_EQ(zo::dtype_size(zo::DType::kF32), 4u);
  EXPECT_EQ(zo::dtype_size(zo::DType::kF16), 2u);
  EXPECT_EQ(zo::dtype_size(zo::DType::kBF16), 2u);
  EXPECT_EQ(zo::parse_dtype("bfloat16"), zo::DType::kBF16);
  EXPECT_EQ(zo::parse_dtype(zo::dtype_name(zo::DType::kF16)), zo::DType::kF16);
  EXPECT_THROW(zo::parse_dtype("fp8"), std::invalid_argument);
}

TEST(DType, HalfToFloatExhaustive) {
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const auto bits = static_cast<std::uint16_t>(h);
    const float got = zo::half_to_float(bits);
    const float want = ref_from_f16(bits);
    if (is_nan_half(bits)) {
      ASSERT_TRUE(std::isnan(got)) << h;
      ASSERT_EQ(zo::float_to_half(got), bits | 0x0200u) << "NaN payload kept, made quiet: " << h;
    } else {
      ASSERT_EQ(std::bit_cast<std::uint32_t>(got), std::bit_cast<std::uint32_t>(want)) << h;
      ASSERT_EQ(zo::float_to_half(got), bits) << "round trip " << h;
    }
  }
}

TEST(DType, Bf16ToFloatExhaustive) {
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    const float f = zo::bf16_to_float(bits);
    ASSERT_EQ(std::bit_cast<std::uint32_t>(f), b << 16);
    if (!is_nan_bf16(bits)) {
      ASSERT_EQ(zo::float_to_bf16(f), bits) << "round trip " << b;
    }
  }
}

TEST(DType, FloatToHalfMatchesTheReference) {
  std::mt19937 rng(1234);
  const float specials[] = {0.0f,
                            -0.0f,
                            65504.0f,
                            65519.99f,
                            65520.0f,
                            -65520.0f,
                            0x1p-24f,
                            0x1p-25f,
                            0x1.000002p-25f,
                            0x1.8p-24f,
                            0x1p-14f,
                            0x1.ffcp-15f,
                            std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::denorm_min(),
                            1.0f / 3.0f};
  for (float x : specials)
    EXPECT_EQ(zo::float_to_half(x), ref_to_f16(x)) << x;
  for (int i = 0; i < 4'000'000; ++i) {
    const float x = random_float(rng);
    const std::uint16_t got = zo::float_to_half(x);
    if (std::isnan(x)) {
      ASSERT_TRUE(is_nan_half(got));
      ASSERT_EQ(got & 0x8000u, (std::bit_cast<std::uint32_t>(x) >> 16) & 0x8000u);
    } else {
      ASSERT_EQ(got, ref_to_f16(x)) << std::hexfloat << x;
    }
  }
}

// The fp16 reference itself, against the compiler's conversions (gcc; clang has no _Float16 on
// x86-64 before version 15, and the ASan + fuzz build is clang 14).
TEST(DType, HalfReferenceMatchesTheCompilersFloat16) {
#if defined(__FLT16_MANT_DIG__)
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const auto bits = static_cast<std::uint16_t>(h);
    const float want = static_cast<float>(std::bit_cast<_Float16>(bits));
    if (is_nan_half(bits))
      ASSERT_TRUE(std::isnan(ref_from_f16(bits))) << h;
    else
      ASSERT_EQ(std::bit_cast<std::uint32_t>(ref_from_f16(bits)),
                std::bit_cast<std::uint32_t>(want))
          << h;
  }
  std::mt19937 rng(4321);
  for (int i = 0; i < 1'000'000; ++i) {
    const float x = random_float(rng);
    const auto want = std::bit_cast<std::uint16_t>(static_cast<_Float16>(x));
    if (std::isnan(x))
      ASSERT_TRUE(is_nan_half(ref_to_f16(x)) && is_nan_half(want));
    else
      ASSERT_EQ(ref_to_f16(x), want) << std::hexfloat << x;
  }
#else
  GTEST_SKIP() << "this compiler has no _Float16 here; the gcc build runs this check";
#endif
}

TEST(DType, FloatToBf16MatchesNearestNeighbour) {
  std::mt19937 rng(99);
  const float specials[] = {0.0f,
                            -0.0f,
                            std::numeric_limits<float>::max(),
                            -std::numeric_limits<float>::max(),
                            std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::denorm_min(),
                            std::bit_cast<float>(0x3f808000u),
                            std::bit_cast<float>(0x3f818000u),
                            std::bit_cast<float>(0x7f7f8000u),
                            std::bit_cast<float>(0x7f7f7fffu)};
  for (float x : specials)
    EXPECT_EQ(zo::float_to_bf16(x), ref_to_bf16(x)) << x;
  for (int i = 0; i < 4'000'000; ++i) {
    const float x = random_float(rng);
    const std::uint16_t got = zo::float_to_bf16(x);
    if (std::isnan(x)) {
      ASSERT_TRUE(is_nan_bf16(got));
    } else {
      ASSERT_EQ(got, ref_to_bf16(x)) << std::hexfloat << x;
    }
  }
}

// The bulk conversion used for parameter uploads equals the scalar converters element by element.
TEST(DType, BulkConversionMatchesScalar) {
  std::mt19937 rng(77);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  std::vector<float> in(1237);
  for (float& x : in)
    x = dist(rng);
  in[5] = INFINITY;
  in[6] = 1e-42f;  // subnormal
  std::vector<std::uint16_t> h(in.size()), b(in.size());
  std::vector<float> f(in.size());
  zo::convert_from_float(in.data(), h.data(), zo::DType::kF16, in.size());
  zo::convert_from_float(in.data(), b.data(), zo::DType::kBF16, in.size());
  zo::convert_from_float(in.data(), f.data(), zo::DType::kF32, in.size());
  for (std::size_t i = 0; i < in.size(); ++i) {
    ASSERT_EQ(h[i], zo::float_to_half(in[i])) << i;
    ASSERT_EQ(b[i], zo::float_to_bf16(in[i])) << i;
    ASSERT_EQ(std::memcmp(&f[i], &in[i], 4), 0) << i;
  }
}

}  // namespace
