// The Adam/AdamW element math, written once against an ISA layer `V` (simd_*.h). Every path runs
// the same IEEE operations in the same order, with explicit FMAs, so all paths agree bit for bit
// with the scalar one. Internal linkage: see core/half_bits.h.
//
// Per element, with g = grad * grad_mult (arXiv 1711.05101, Algorithm 2):
//   g  += l2 * p                                       (L2 Adam only)
//   m   = b1 * m + (1 - b1) * g
//   v   = b2 * v + (1 - b2) * g^2
//   p   = p * (1 - lr * wd) - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// m and v enter the update unrounded; with bf16 state they are stored rounded to nearest even.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kernel_table.h"
#include "q8_tables.h"

namespace zo::cpu_adam {
namespace {

template <class V, DType D, class W>
inline typename V::F load_as(const void* base, std::size_t i, W w) {
  if constexpr (D == DType::kF32) {
    return V::load(static_cast<const float*>(base) + i, w);
  } else if constexpr (D == DType::kF16) {
    return V::load_f16(static_cast<const std::uint16_t*>(base) + i, w);
  } else {
    return V::load_bf16(static_cast<const std::uint16_t*>(base) + i, w);
  }
}

template <class V, DType D, class W>
inline void store_as(void* base, std::size_t i, typename V::F x, W w) {
  if constexpr (D == DType::kF32) {
    V::store(static_cast<float*>(base) + i, x, w);
  } else if constexpr (D == DType::kF16) {
    V::store_f16(static_cast<std::uint16_t*>(base) + i, x, w);
  } else {
    V::store_bf16(static_cast<std::uint16_t*>(base) + i, x, w);
  }
}

// The constants broadcast once per range.
template <class V>
struct VecScalars {
  typename V::F beta1, one_minus_beta1, beta2, one_minus_beta2, neg_step_size, bc2_rsqrt, eps,
      decay, l2, grad_mult;
  explicit VecScalars(const AdamScalars& s)
      : beta1(V::set1(s.beta1)),
        one_minus_beta1(V::set1(s.one_minus_beta1)),
        beta2(V::set1(s.beta2)),
        one_minus_beta2(V::set1(s.one_minus_beta2)),
        neg_step_size(V::set1(s.neg_step_size)),
        bc2_rsqrt(V::set1(s.bc2_rsqrt)),
        eps(V::set1(s.eps)),
        decay(V::set1(s.decay)),
        l2(V::set1(s.l2)),
        grad_mult(V::set1(s.grad_mult)) {}
};

// One vector of elements starting at i; `w` is V::Full or a tail mask.
template <class V, DType G, DType S, int O, bool kL2, class W>
inline void adam_lanes(const detail::AdamArrays& a, std::size_t i, const VecScalars<V>& k,
                       typename V::F& nonfinite, W w) {
  using F = typename V::F;
  F g = V::mul(load_as<V, G>(a.g, i, w), k.grad_mult);
  nonfinite = V::add(nonfinite, V::sub(g, g));  // 0 for finite g, NaN (sticky) otherwise
  F p = V::load(a.p + i, w);
  if constexpr (kL2) g = V::fma(k.l2, p, g);
  const F m = V::fma(k.one_minus_beta1, g, V::mul(k.beta1, load_as<V, S>(a.m, i, w)));
  const F v = V::fma(k.one_minus_beta2, V::mul(g, g), V::mul(k.beta2, load_as<V, S>(a.v, i, w)));
  const F denom = V::fma(V::sqrt(v), k.bc2_rsqrt, k.eps);
  p = V::fma(k.neg_step_size, V::div(m, denom), V::mul(p, k.decay));
  V::store(a.p + i, p, w);
  store_as<V, S>(a.m, i, m, w);
  store_as<V, S>(a.v, i, v, w);
  if constexpr (O == detail::kOutF16) store_as<V, DType::kF16>(a.out, i, p, w);
  if constexpr (O == detail::kOutBF16) store_as<V, DType::kBF16>(a.out, i, p, w);
}

// Full vectors, then the tail: masked where the ISA has masks, else the scalar layer `Tail`,
// which computes the identical result. Never touches memory outside [begin, end).
template <class V, class Tail, DType G, DType S, int O, bool kL2>
bool adam_range(const detail::AdamArrays& a, const AdamScalars& s, std::size_t begin,
                std::size_t end) {
  const VecScalars<V> k(s);
  typename V::F nonfinite = V::set1(0.0f);
  std::size_t i = begin;
  for (; i + V::kWidth <= end; i += V::kWidth) {
    adam_lanes<V, G, S, O, kL2>(a, i, k, nonfinite, typename V::Full{});
  }
  if (i == end) return V::any_nan(nonfinite);
  if constexpr (V::kMaskedTail) {
    adam_lanes<V, G, S, O, kL2>(a, i, k, nonfinite, V::tail_mask(end - i));
    return V::any_nan(nonfinite);
  } else {
    return adam_range<Tail, Tail, G, S, O, kL2>(a, s, i, end) || V::any_nan(nonfinite);
  }
}

// ---- 8-bit state (q8) ---------------------------------------------------------------------------
// Per block of kQ8Block: pass 1 dequantizes m and v (map[code] * absmax), runs the element math
// above with them, keeps the unrounded new moments and their maxima; pass 2 quantizes them over
// the new maxima. A block whose new m or v is not finite gets a NaN absmax (every code then
// reads as NaN), found alike on every path; maxima of finite values do not depend on order.

// Block-wide accumulators of one layer.
template <class V>
struct Q8Block {
  typename V::F max_m = V::set1(0.0f), max_v = V::set1(0.0f), bad = V::set1(0.0f);
};

template <class V, DType G, int O, bool kL2, class W>
inline void q8_update_lanes(const detail::AdamArrays& a, const detail::Q8Tables& t, std::size_t i,
                            const VecScalars<V>& k, float m_absmax, float v_absmax, float* mt,
                            float* vt, std::size_t j, typename V::F& nonfinite, Q8Block<V>& acc,
                            W w) {
  using F = typename V::F;
  F g = V::mul(load_as<V, G>(a.g, i, w), k.grad_mult);
  nonfinite = V::add(nonfinite, V::sub(g, g));
  F p = V::load(a.p + i, w);
  if constexpr (kL2) g = V::fma(k.l2, p, g);
  const auto* mc = static_cast<const std::uint8_t*>(a.m);
  const auto* vc = static_cast<const std::uint8_t*>(a.v);
  const F m_old = V::mul(V::gather(t.signed_map, V::load_u8(mc + i, w)), V::set1(m_absmax));
  const F v_old = V::mul(V::gather(t.unsigned_map, V::load_u8(vc + i, w)), V::set1(v_absmax));
  const F m = V::fma(k.one_minus_beta1, g, V::mul(k.beta1, m_old));
  const F v = V::fma(k.one_minus_beta2, V::mul(g, g), V::mul(k.beta2, v_old));
  const F denom = V::fma(V::sqrt(v), k.bc2_rsqrt, k.eps);
  p = V::fma(k.neg_step_size, V::div(m, denom), V::mul(p, k.decay));
  V::store(a.p + i, p, w);
  if constexpr (O == detail::kOutF16) store_as<V, DType::kF16>(a.out, i, p, w);
  if constexpr (O == detail::kOutBF16) store_as<V, DType::kBF16>(a.out, i, p, w);
  V::store(mt + j, m, w);
  V::store(vt + j, v, w);
  acc.max_m = V::max(acc.max_m, V::abs(m), w);
  acc.max_v = V::max(acc.max_v, v, w);
  acc.bad = V::keep_nan(V::keep_nan(acc.bad, m, w), v, w);
}

template <class V, class W>
inline void q8_quantize_lanes(const detail::AdamArrays& a, const detail::Q8Tables& t, std::size_t i,
                              const float* mt, const float* vt, std::size_t j, float inv_m,
                              float inv_v, W w) {
  using F = typename V::F;
  const F x = V::mul(V::load(mt + j, w), V::set1(inv_m));
  const F ax = V::abs(x);
  const auto bm = V::bucket(ax);
  const auto qm =
      V::add_lt(V::gather_i(t.signed_magnitude.lo, bm), V::gather(t.signed_magnitude.mid, bm), ax);
  V::store_u8(static_cast<std::uint8_t*>(a.m) + i, V::signed_code(qm, x), w);
  const F y = V::abs(V::mul(V::load(vt + j, w), V::set1(inv_v)));
  const auto bv = V::bucket(y);
  V::store_u8(static_cast<std::uint8_t*>(a.v) + i,
              V::add_lt(V::gather_i(t.unsigned_magnitude.lo, bv),
                        V::gather(t.unsigned_magnitude.mid, bv), y),
              w);
}

// The new absmax of a block from the layers' accumulators; NaN where a moment was not finite.
template <class V, class Tail>
float q8_absmax(const typename V::F& vmax, const typename Tail::F& tmax, bool bad) {
  if (bad) return __builtin_nanf("");
  const float a = V::hmax(vmax), b = Tail::hmax(tmax);
  return a > b ? a : b;
}

template <class V, class Tail, DType G, int O, bool kL2>
bool adam_range_q8(const detail::AdamArrays& a, const AdamScalars& s, std::size_t begin,
                   std::size_t end) {
  const VecScalars<V> k(s);
  const VecScalars<Tail> kt(s);
  const detail::Q8Tables& t = detail::q8_tables();
  typename V::F nonfinite = V::set1(0.0f);
  typename Tail::F nonfinite_tail = Tail::set1(0.0f);
  alignas(64) float mt[kQ8Block], vt[kQ8Block];  // the block's unrounded new m and v
  for (std::size_t b0 = begin; b0 < end; b0 += kQ8Block) {
    const std::size_t b1 = std::min(end, b0 + kQ8Block), blk = b0 / kQ8Block;
    const float m_absmax = a.m_absmax[blk], v_absmax = a.v_absmax[blk];
    Q8Block<V> acc;
    Q8Block<Tail> acc_tail;
    std::size_t i = b0;
    for (; i + V::kWidth <= b1; i += V::kWidth) {
      q8_update_lanes<V, G, O, kL2>(a, t, i, k, m_absmax, v_absmax, mt, vt, i - b0, nonfinite, acc,
                                    typename V::Full{});
    }
    if constexpr (V::kMaskedTail) {
      if (i < b1) {
        q8_update_lanes<V, G, O, kL2>(a, t, i, k, m_absmax, v_absmax, mt, vt, i - b0, nonfinite,
                                      acc, V::tail_mask(b1 - i));
      }
    } else {
      for (std::size_t e = i; e < b1; ++e) {
        q8_update_lanes<Tail, G, O, kL2>(a, t, e, kt, m_absmax, v_absmax, mt, vt, e - b0,
                                         nonfinite_tail, acc_tail, typename Tail::Full{});
      }
    }
    const bool bad = V::any_nan(acc.bad) || Tail::any_nan(acc_tail.bad);
    const float new_m = q8_absmax<V, Tail>(acc.max_m, acc_tail.max_m, bad);
    const float new_v = q8_absmax<V, Tail>(acc.max_v, acc_tail.max_v, bad);
    a.m_absmax[blk] = new_m;
    a.v_absmax[blk] = new_v;
    // 0 for an all-zero block (every code then 0), and for NaN maxima.
    const float inv_m = new_m > 0.0f ? 1.0f / new_m : 0.0f;
    const float inv_v = new_v > 0.0f ? 1.0f / new_v : 0.0f;
    for (i = b0; i + V::kWidth <= b1; i += V::kWidth)
      q8_quantize_lanes<V>(a, t, i, mt, vt, i - b0, inv_m, inv_v, typename V::Full{});
    if constexpr (V::kMaskedTail) {
      if (i < b1) q8_quantize_lanes<V>(a, t, i, mt, vt, i - b0, inv_m, inv_v, V::tail_mask(b1 - i));
    } else {
      for (; i < b1; ++i)
        q8_quantize_lanes<Tail>(a, t, i, mt, vt, i - b0, inv_m, inv_v, typename Tail::Full{});
    }
  }
  return V::any_nan(nonfinite) || Tail::any_nan(nonfinite_tail);
}

template <class V, class Tail, DType G>
bool nonfinite_range(const void* grads, float grad_mult, std::size_t begin, std::size_t end) {
  using F = typename V::F;
  const F mult = V::set1(grad_mult);
  F acc = V::set1(0.0f);
  std::size_t i = begin;
  for (; i + V::kWidth <= end; i += V::kWidth) {
    const F g = V::mul(load_as<V, G>(grads, i, typename V::Full{}), mult);
    acc = V::add(acc, V::sub(g, g));
  }
  if (i < end) {
    if constexpr (V::kMaskedTail) {
      const F g = V::mul(load_as<V, G>(grads, i, V::tail_mask(end - i)), mult);
      acc = V::add(acc, V::sub(g, g));
    } else {
      if (nonfinite_range<Tail, Tail, G>(grads, grad_mult, i, end)) return true;
    }
  }
  return V::any_nan(acc);
}

constexpr DType kDTypes[3] = {DType::kF32, DType::kF16, DType::kBF16};

template <class V, class Tail, int Gi, int Si, int O, int L2>
void fill_one(detail::KernelTable& t) {
  constexpr DType S = Si == 0 ? DType::kF32 : DType::kBF16;
  t.adam[Gi][Si][O][L2] = &adam_range<V, Tail, kDTypes[Gi], S, O, L2 != 0>;
}

template <class V, class Tail, int Gi, int Si>
void fill_state(detail::KernelTable& t) {
  fill_one<V, Tail, Gi, Si, detail::kOutNone, 0>(t);
  fill_one<V, Tail, Gi, Si, detail::kOutNone, 1>(t);
  fill_one<V, Tail, Gi, Si, detail::kOutF16, 0>(t);
  fill_one<V, Tail, Gi, Si, detail::kOutF16, 1>(t);
  fill_one<V, Tail, Gi, Si, detail::kOutBF16, 0>(t);
  fill_one<V, Tail, Gi, Si, detail::kOutBF16, 1>(t);
}

template <class V, class Tail, int Gi>
void fill_q8(detail::KernelTable& t) {
  constexpr DType G = kDTypes[Gi];
  t.adam_q8[Gi][detail::kOutNone][0] = &adam_range_q8<V, Tail, G, detail::kOutNone, false>;
  t.adam_q8[Gi][detail::kOutNone][1] = &adam_range_q8<V, Tail, G, detail::kOutNone, true>;
  t.adam_q8[Gi][detail::kOutF16][0] = &adam_range_q8<V, Tail, G, detail::kOutF16, false>;
  t.adam_q8[Gi][detail::kOutF16][1] = &adam_range_q8<V, Tail, G, detail::kOutF16, true>;
  t.adam_q8[Gi][detail::kOutBF16][0] = &adam_range_q8<V, Tail, G, detail::kOutBF16, false>;
  t.adam_q8[Gi][detail::kOutBF16][1] = &adam_range_q8<V, Tail, G, detail::kOutBF16, true>;
}

template <class V, class Tail, int Gi>
void fill_grad(detail::KernelTable& t) {
  fill_state<V, Tail, Gi, 0>(t);
  fill_state<V, Tail, Gi, 1>(t);
  fill_q8<V, Tail, Gi>(t);
  t.nonfinite[Gi] = &nonfinite_range<V, Tail, kDTypes[Gi]>;
}

// Every (grad, state, out, L2) combination of one ISA layer.
template <class V, class Tail>
detail::KernelTable make_kernel_table() {
  detail::KernelTable t{};
  fill_grad<V, Tail, 0>(t);
  fill_grad<V, Tail, 1>(t);
  fill_grad<V, Tail, 2>(t);
  return t;
}

}  // namespace
}  // namespace zo::cpu_adam
