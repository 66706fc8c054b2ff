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
// bf16 master weights enter exactly and are stored rounded stochastically.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kernel_table.h"
#include "q8_codec.h"
#include "q8_tables.h"
#include "sr_bits.h"

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

// The master weights of lanes i..: fp32, or bf16 (exact in fp32).
template <class V, bool kB16, class W>
inline typename V::F load_master(const detail::AdamArrays& a, std::size_t i, W w) {
  if constexpr (kB16) {
    return V::load_bf16(a.p16 + i, w);
  } else {
    return V::load(a.p + i, w);
  }
}

// Stores the new master weights and their 16-bit copy for the GPU. A bf16 master is rounded
// stochastically with each element's random bits, which keeps small updates alive in
// expectation (stochastic rounding for low-precision training: Gupta et al., arXiv 1502.02551;
// bf16 master weights with it: Zamirai et al., arXiv 2010.06192); its copy is the stored value.
// (Always inlined: GCC 12 warns falsely about _mm512_undefined_* in an out-of-line copy.)
template <class V, bool kB16, int O, class W>
[[gnu::always_inline]] inline void store_master(const detail::AdamArrays& a, SrStream<V>& sr,
                                                std::size_t i, typename V::F p, W w) {
  if constexpr (kB16) {
    const typename V::F stored = V::bf16_stochastic(p, sr.bits(i));
    V::store_bf16_exact(a.p16 + i, stored, w);
    if constexpr (O == detail::kOutBF16) {
      V::store_bf16_exact(static_cast<std::uint16_t*>(a.out) + i, stored, w);
    }
    if constexpr (O == detail::kOutF16) store_as<V, DType::kF16>(a.out, i, stored, w);
  } else {
    V::store(a.p + i, p, w);
    if constexpr (O == detail::kOutF16) store_as<V, DType::kF16>(a.out, i, p, w);
    if constexpr (O == detail::kOutBF16) store_as<V, DType::kBF16>(a.out, i, p, w);
  }
}

// One vector of elements starting at i; `w` is V::Full or a tail mask.
template <class V, DType G, DType S, int O, bool kL2, bool kB16, class W>
inline void adam_lanes(const detail::AdamArrays& a, std::size_t i, const VecScalars<V>& k,
                       SrStream<V>& sr, typename V::F& nonfinite, W w) {
  using F = typename V::F;
  F g = V::mul(load_as<V, G>(a.g, i, w), k.grad_mult);
  nonfinite = V::add(nonfinite, V::sub(g, g));  // 0 for finite g, NaN (sticky) otherwise
  F p = load_master<V, kB16>(a, i, w);
  if constexpr (kL2) g = V::fma(k.l2, p, g);
  const F m = V::fma(k.one_minus_beta1, g, V::mul(k.beta1, load_as<V, S>(a.m, i, w)));
  const F v = V::fma(k.one_minus_beta2, V::mul(g, g), V::mul(k.beta2, load_as<V, S>(a.v, i, w)));
  const F denom = V::fma(V::sqrt(v), k.bc2_rsqrt, k.eps);
  p = V::fma(k.neg_step_size, V::div(m, denom), V::mul(p, k.decay));
  store_master<V, kB16, O>(a, sr, i, p, w);
  store_as<V, S>(a.m, i, m, w);
  store_as<V, S>(a.v, i, v, w);
}

// Full vectors, then the tail: masked where the ISA has masks, else the scalar layer `Tail`,
// which computes the identical result. Never touches memory outside [begin, end).
template <class V, class Tail, DType G, DType S, int O, bool kL2, bool kB16>
bool adam_range(const detail::AdamArrays& a, const AdamScalars& s, std::size_t begin,
                std::size_t end) {
  const VecScalars<V> k(s);
  SrStream<V> sr(a.sr_seed, a.t, a.sr_first_index);
  typename V::F nonfinite = V::set1(0.0f);
  std::size_t i = begin;
  for (; i + V::kWidth <= end; i += V::kWidth) {
    adam_lanes<V, G, S, O, kL2, kB16>(a, i, k, sr, nonfinite, typename V::Full{});
  }
  if (i == end) return V::any_nan(nonfinite);
  if constexpr (V::kMaskedTail) {
    adam_lanes<V, G, S, O, kL2, kB16>(a, i, k, sr, nonfinite, V::tail_mask(end - i));
    return V::any_nan(nonfinite);
  } else {
    return adam_range<Tail, Tail, G, S, O, kL2, kB16>(a, s, i, end) || V::any_nan(nonfinite);
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

// ---- 8-bit state (q8) ---------------------------------------------------------------------------
// Pass 1 of a block of kQ8Block dequantizes m and v (q8_codec.h), runs the element math above with
// them and keeps the unrounded new moments in temporaries and the bits of their maxima; pass 2
// quantizes them over the new maxima. Pass 2 of a block runs interleaved with pass 1 of the next,
// so that memory streams steadily while the quantizing computes (where the ISA has the registers
// for both: V::kQ8Interleave). b1 * m_old is decoded directly:
// the map's coefficients are scaled by b1 * absmax once per block (Q8Decoder::times).

// Software prefetch ahead of pass 1, one hint per cache line of each stream. The q8 loop computes
// about 1.5 cycles per parameter, and the hardware prefetchers alone left it ~30% slower from
// DRAM than in cache (one thread: 1.52 against 2.19 Gparam/s; 2.06 with these hints). The fp32
// and bf16 kernels, memory-bound, ran slower with hints, so only this loop has them.
inline constexpr std::size_t kQ8PrefetchAhead = 1024;  // elements: 4 KiB of an fp32 master
// Pass 1 runs in groups of kQ8Group elements, one cache line of codes, so each group hints a
// fixed set of lines with no test per vector.
inline constexpr std::size_t kQ8Group = 64;

// Hints the lines of elements [f, f + kQ8Group) of `base` (elements of kSize bytes). Groups are
// consecutive, so the lines of every stream are covered whatever its alignment. (Always inlined:
// GCC 12 counts a prefetch as no side effect, finds an out-of-line wrapper `const` and deletes
// its calls.)
template <std::size_t kSize>
[[gnu::always_inline]] inline void prefetch_group(const void* base, std::size_t f) {
  const char* line = static_cast<const char*>(base) + f * kSize;
  for (std::size_t b = 0; b < kQ8Group * kSize; b += 64)
    __builtin_prefetch(line + b, 1, 3);
}

// Every stream of pass 1 at element f, when that is inside the range.
template <DType G, int O, bool kB16>
[[gnu::always_inline]] inline void q8_prefetch(const detail::AdamArrays& a, std::size_t f,
                                               std::size_t end) {
  if (f >= end) return;
  prefetch_group<G == DType::kF32 ? 4 : 2>(a.g, f);
  if constexpr (kB16) {
    prefetch_group<2>(a.p16, f);
  } else {
    prefetch_group<4>(a.p, f);
  }
  prefetch_group<1>(a.m, f);
  prefetch_group<1>(a.v, f);
  if constexpr (O != detail::kOutNone) prefetch_group<2>(a.out, f);
}

template <class V>
struct Q8Codecs {
  Q8Decoder<V> m_decoder, v_decoder;
  Q8Encoder<V> m_encoder, v_encoder;
  explicit Q8Codecs(const detail::Q8Maps& maps)
      : m_decoder(maps.m), v_decoder(maps.v), m_encoder(maps.m), v_encoder(maps.v) {}
};

// Block-wide accumulators of one layer: the bits of max |m| and max v. Maxima of non-negative
// floats are maxima of their bits, which also catch Inf and NaN, whatever the order.
template <class V>
struct Q8Maxima {
  typename V::I m = V::set1_i(0), v = V::set1_i(0);
};

// The decoders of one block: they read b1 * m_old and b2 * v_old.
template <class V>
struct Q8BlockDecoders {
  Q8Decoder<V> m, v;
  Q8BlockDecoders(const Q8Codecs<V>& q, float m_scale, float v_scale)
      : m(q.m_decoder.times(m_scale)), v(q.v_decoder.times(v_scale)) {}
};

template <class V, DType G, int O, bool kL2, bool kB16, class W>
inline void q8_update_lanes(const detail::AdamArrays& a, const Q8BlockDecoders<V>& d,
                            const VecScalars<V>& k, SrStream<V>& sr, std::size_t i, float* mt,
                            float* vt, Q8Maxima<V>& max, W w) {
  using F = typename V::F;
  F g = V::mul(load_as<V, G>(a.g, i, w), k.grad_mult);
  F p = load_master<V, kB16>(a, i, w);
  if constexpr (kL2) g = V::fma(k.l2, p, g);
  const auto* mc = static_cast<const std::uint8_t*>(a.m);
  const auto* vc = static_cast<const std::uint8_t*>(a.v);
  const F m_old = d.m.template value<true>(V::sub_i(V::load_u8(mc + i, w), V::set1_i(127)));
  const F v_old = d.v.template value<false>(V::load_u8(vc + i, w));
  const F m = V::fma(k.one_minus_beta1, g, m_old);  // m_old, v_old: times b1, b2 already
  const F v = V::fma(k.one_minus_beta2, V::mul(g, g), v_old);
  const F denom = V::fma(V::sqrt(v), k.bc2_rsqrt, k.eps);
  p = V::fma(k.neg_step_size, V::div(m, denom), V::mul(p, k.decay));
  store_master<V, kB16, O>(a, sr, i, p, w);
  V::store(mt, m, w);
  V::store(vt, v, w);
  max.m = V::max_bits(max.m, V::abs(m), w);
  max.v = V::max_bits(max.v, v, w);  // v >= 0: a sum of non-negative terms
}

// The codes of one moment's lanes: t (new moments) times inv (the reciprocal of their block's
// absmax), coded into `codes`.
template <class V, bool kSigned, class W>
inline void q8_code_lanes(std::uint8_t* codes, const Q8Encoder<V>& e, const float* t,
                          typename V::F inv, W w) {
  V::store_u8(codes, e.template code<kSigned>(V::mul(V::load(t, w), inv)), w);
}

template <class V, class W>
inline void q8_quantize_lanes(const detail::AdamArrays& a, const Q8Codecs<V>& q, std::size_t i,
                              const float* mt, const float* vt, typename V::F inv_m,
                              typename V::F inv_v, W w) {
  q8_code_lanes<V, true>(static_cast<std::uint8_t*>(a.m) + i, q.m_encoder, mt, inv_m, w);
  q8_code_lanes<V, false>(static_cast<std::uint8_t*>(a.v) + i, q.v_encoder, vt, inv_v, w);
}

// The codes of n elements (whole vectors) of one moment. Arguments by value: locals that the code
// stores cannot reach, so the loop keeps the pointers and the encoder's tables in registers.
template <class V, bool kSigned>
void q8_code_vectors(std::uint8_t* codes, const Q8Encoder<V> e, const float* t, typename V::F inv,
                     std::size_t n) {
  for (std::size_t k = 0; k < n; k += V::kWidth)
    q8_code_lanes<V, kSigned>(codes + k, e, t + k, inv, typename V::Full{});
}

// A block between its two passes: elements [b0, b1), new moments in mt and vt, and the
// reciprocals of its new maxima (q8_reciprocal).
struct Q8Pending {
  std::size_t b0 = 0, b1 = 0;
  const float* mt = nullptr;
  const float* vt = nullptr;
  float inv_m = 0.0f, inv_v = 0.0f;
};

// Pass 2 of `p` from element i on: m's codes, then v's, each loop holding one encoder's tables
// (AVX2's 16 registers do not hold both).
template <class V, class Tail>
void q8_quantize_rest(const detail::AdamArrays& a, const Q8Codecs<V>& q, const Q8Codecs<Tail>& qt,
                      const Q8Pending& p, std::size_t i) {
  const typename V::F inv_m = V::set1(p.inv_m), inv_v = V::set1(p.inv_v);
  const std::size_t whole = (p.b1 - i) / V::kWidth * V::kWidth;
  q8_code_vectors<V, true>(static_cast<std::uint8_t*>(a.m) + i, q.m_encoder, p.mt + (i - p.b0),
                           inv_m, whole);
  q8_code_vectors<V, false>(static_cast<std::uint8_t*>(a.v) + i, q.v_encoder, p.vt + (i - p.b0),
                            inv_v, whole);
  i += whole;
  if (i == p.b1) return;
  if constexpr (V::kMaskedTail) {
    q8_quantize_lanes<V>(a, q, i, p.mt + (i - p.b0), p.vt + (i - p.b0), inv_m, inv_v,
                         V::tail_mask(p.b1 - i));
  } else {
    for (; i < p.b1; ++i)
      q8_quantize_lanes<Tail>(a, qt, i, p.mt + (i - p.b0), p.vt + (i - p.b0), p.inv_m, p.inv_v,
                              typename Tail::Full{});
  }
}

// The new absmax of a block from the bits of its maxima. NaN where a moment was not finite; then
// every code becomes q8_nan_code and reads as NaN. 0 below FLT_MIN, whose reciprocal could
// overflow: such a block is flushed to zero.
inline float q8_absmax(std::uint32_t bits, bool bad) {
  if (bad) return __builtin_nanf("");
  return bits < 0x00800000u ? 0.0f : __builtin_bit_cast(float, bits);
}

// The reciprocal of a block's new absmax to quantize over: 0 for an all-zero block, whose codes
// all become 0. (A NaN block is not quantized: every code becomes q8_nan_code.)
inline float q8_reciprocal(float absmax) {
  return absmax > 0.0f ? 1.0f / absmax : 0.0f;
}

// Every code of the NaN block [b0, b1): q8_nan_code. (Out of line: the loop's registers.)
[[gnu::noinline, gnu::cold]] inline void q8_fill_nan_block(const detail::AdamArrays& a,
                                                           std::size_t b0, std::size_t b1) {
  std::fill_n(static_cast<std::uint8_t*>(a.m) + b0, b1 - b0, q8_nan_code(true));
  std::fill_n(static_cast<std::uint8_t*>(a.v) + b0, b1 - b0, q8_nan_code(false));
}

// Non-finite gradients make the block's m non-finite (with L2 too: the gradient is checked before
// l2 * p is added, and Inf or NaN survives the addition), so only blocks with a non-finite
// moment are searched for them: the same report as the other kernels', at no cost per element.
template <class V, class Tail, DType G, int O, bool kL2, bool kB16>
bool adam_range_q8(const detail::AdamArrays& a, const AdamScalars& s, std::size_t begin,
                   std::size_t end) {
  // The pointers as a local the loop's stores cannot reach: codes stored through uint8_t* may
  // alias anything else reachable, so `a`'s pointers would be read again after every store.
  const detail::AdamArrays local = a;
  const VecScalars<V> k(s);
  const VecScalars<Tail> kt(s);
  SrStream<V> sr(a.sr_seed, a.t, a.sr_first_index);
  SrStream<Tail> sr_tail(a.sr_seed, a.t, a.sr_first_index);
  const detail::Q8Maps& maps = detail::q8_maps();
  const Q8Codecs<V> q(maps);
  const Q8Codecs<Tail> qt(maps);
  bool nonfinite = false;
  alignas(64) float temps[2][2][kQ8Block];  // [block parity][m, v]: the new moments
  Q8Pending pending;
  for (std::size_t b0 = begin; b0 < end; b0 += kQ8Block) {
    const std::size_t b1 = std::min(end, b0 + kQ8Block), blk = b0 / kQ8Block;
    float* mt = temps[blk & 1][0];
    float* vt = temps[blk & 1][1];
    const float m_scale = s.beta1 * a.m_absmax[blk], v_scale = s.beta2 * a.v_absmax[blk];
    const Q8BlockDecoders<V> d(q, m_scale, v_scale);
    const typename V::F inv_m = V::set1(pending.inv_m), inv_v = V::set1(pending.inv_v);
    Q8Maxima<V> max;
    Q8Maxima<Tail> max_tail;
    // The pending block is whole: its pass 2 has at least as many vectors as this pass 1 (the
    // test only skips it in a range's first block, or after a NaN block, which have none). Not
    // interleaved, the whole pass 2 runs after this pass 1.
    const bool quantize = V::kQ8Interleave && pending.b1 > pending.b0;
    std::size_t i = b0, j = pending.b0;
    const auto lanes = [&](std::size_t e) {
      q8_update_lanes<V, G, O, kL2, kB16>(local, d, k, sr, e, mt + (e - b0), vt + (e - b0), max,
                                          typename V::Full{});
      if (quantize) {
        q8_quantize_lanes<V>(local, q, j, pending.mt + (j - pending.b0),
                             pending.vt + (j - pending.b0), inv_m, inv_v, typename V::Full{});
        j += V::kWidth;
      }
    };
    for (; i + kQ8Group <= b1; i += kQ8Group) {
      q8_prefetch<G, O, kB16>(local, i + kQ8PrefetchAhead, end);
      for (std::size_t u = 0; u < kQ8Group; u += V::kWidth)
        lanes(i + u);
    }
    for (; i + V::kWidth <= b1; i += V::kWidth)
      lanes(i);
    if constexpr (V::kMaskedTail) {
      if (i < b1) {
        q8_update_lanes<V, G, O, kL2, kB16>(a, d, k, sr, i, mt + (i - b0), vt + (i - b0), max,
                                            V::tail_mask(b1 - i));
      }
    } else {
      if (i < b1) {
        const Q8BlockDecoders<Tail> dt(qt, m_scale, v_scale);
        for (; i < b1; ++i) {
          q8_update_lanes<Tail, G, O, kL2, kB16>(a, dt, kt, sr_tail, i, mt + (i - b0),
                                                 vt + (i - b0), max_tail, typename Tail::Full{});
        }
      }
    }
    q8_quantize_rest(a, q, qt, pending, j);
    const std::uint32_t m_bits = std::max(V::hmax_bits(max.m), Tail::hmax_bits(max_tail.m));
    const std::uint32_t v_bits = std::max(V::hmax_bits(max.v), Tail::hmax_bits(max_tail.v));
    const bool bad = m_bits >= 0x7f800000u || v_bits >= 0x7f800000u;
    if (bad && !nonfinite) nonfinite = nonfinite_range<V, Tail, G>(a.g, s.grad_mult, b0, b1);
    const float new_m = q8_absmax(m_bits, bad), new_v = q8_absmax(v_bits, bad);
    a.m_absmax[blk] = new_m;
    a.v_absmax[blk] = new_v;
    if (bad) [[unlikely]]
      q8_fill_nan_block(a, b0, b1);
    // A NaN block has no pass 2: its codes are every path's, whatever the NaNs' signs.
    pending = {b0, bad ? b0 : b1, mt, vt, q8_reciprocal(new_m), q8_reciprocal(new_v)};
  }
  q8_quantize_rest(a, q, qt, pending, pending.b0);
  return nonfinite;
}

constexpr DType kDTypes[3] = {DType::kF32, DType::kF16, DType::kBF16};

// Every (out, L2, master) combination of one grad dtype and state format.
template <class V, class Tail, int Gi, int O, int L2, int B16>
void fill_one(detail::KernelTable& t) {
  constexpr DType G = kDTypes[Gi];
  t.adam[Gi][0][O][L2][B16] = &adam_range<V, Tail, G, DType::kF32, O, L2 != 0, B16 != 0>;
  t.adam[Gi][1][O][L2][B16] = &adam_range<V, Tail, G, DType::kBF16, O, L2 != 0, B16 != 0>;
  t.adam_q8[Gi][O][L2][B16] = &adam_range_q8<V, Tail, G, O, L2 != 0, B16 != 0>;
}

template <class V, class Tail, int Gi, int O>
void fill_out(detail::KernelTable& t) {
  fill_one<V, Tail, Gi, O, 0, 0>(t);
  fill_one<V, Tail, Gi, O, 0, 1>(t);
  fill_one<V, Tail, Gi, O, 1, 0>(t);
  fill_one<V, Tail, Gi, O, 1, 1>(t);
}

template <class V, class Tail, int Gi>
void fill_grad(detail::KernelTable& t) {
  fill_out<V, Tail, Gi, detail::kOutNone>(t);
  fill_out<V, Tail, Gi, detail::kOutF16>(t);
  fill_out<V, Tail, Gi, detail::kOutBF16>(t);
  t.nonfinite[Gi] = &nonfinite_range<V, Tail, kDTypes[Gi]>;
}

// Every (grad, state, out, L2, master) combination of one ISA layer.
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
