// Philox4x32-10, the counter-based generator of Salmon et al., "Parallel random numbers: as easy
// as 1, 2, 3" (SC 2011): output = bijection(counter, key), so element i of a stream is computed
// without the i - 1 before it, and a parallel fill gives the same bits on any number of threads.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>

namespace zo::model {

using Philox4x32 = std::array<std::uint32_t, 4>;

// Ten rounds of Philox4x32 on `counter` under the 64-bit `key` (the paper's constants).
constexpr Philox4x32 philox4x32_10(Philox4x32 c, std::uint32_t k0, std::uint32_t k1) {
  constexpr std::uint64_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr std::uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const std::uint64_t p0 = kM0 * c[0], p1 = kM1 * c[2];
    c = {std::uint32_t(p1 >> 32) ^ c[1] ^ k0, std::uint32_t(p1),
         std::uint32_t(p0 >> 32) ^ c[3] ^ k1, std::uint32_t(p0)};
    k0 += kW0;
    k1 += kW1;
  }
  return c;
}

// Four standard normals from one Philox block: two Box-Muller pairs, computed in double so that
// the float results do not depend on the float libm's rounding.
inline std::array<double, 4> philox_normals(const Philox4x32& bits) {
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  constexpr double kInv2_32 = 1.0 / 4294967296.0;
  std::array<double, 4> z{};
  for (int pair = 0; pair < 2; ++pair) {
    const double u1 = (double(bits[2 * pair]) + 1.0) * kInv2_32;  // (0, 1]: log(u1) is finite
    const double u2 = double(bits[2 * pair + 1]) * kInv2_32;
    const double r = std::sqrt(-2.0 * std::log(u1));
    z[2 * pair] = r * std::cos(kTwoPi * u2);
    z[2 * pair + 1] = r * std::sin(kTwoPi * u2);
  }
  return z;
}

}  // namespace zo::model
