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

#include <cstddef>
#include <cstdint>

#include "kernel_table.h"

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
void fill_grad(detail::KernelTable& t) {
  fill_state<V, Tail, Gi, 0>(t);
  fill_state<V, Tail, Gi, 1>(t);
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
