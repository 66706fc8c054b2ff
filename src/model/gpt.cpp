#include "model/gpt.h"

#include <stdexcept>
#include <string>

namespace zo::model {
namespace {

// Walks the activation layout once; `place(bytes)` either counts or hands out memory, so that
// the size estimate and the real allocation cannot disagree. Vp: the logits' row stride.
template <class Place>
void walk_activations(const ModelSpec& spec, const ModelShape& sh, std::size_t esize,
                      std::size_t Vp, Place&& place) {
  const std::size_t BT = std::size_t(sh.B) * sh.T, C = spec.n_embd;
  const std::size_t L = spec.n_layer, NH = spec.n_head;
  const std::size_t sets = sh.recompute ? 1 : L;
  place(BT * 4);  // tokens
  place(BT * 4);  // targets
  for (std::size_t i = 0; i <= L; ++i)
    place(BT * C * esize);  // residual stream, L+1 points
  for (std::size_t l = 0; l < sets; ++l) {
    for (std::size_t n : {C, 3 * C, C, C, C, 4 * C, 4 * C})
      place(BT * n * esize);  // acts
    for (int k = 0; k < 4; ++k)
      place(BT * 4);                           // LN stats
    place(std::size_t(sh.B) * NH * sh.T * 4);  // lse
  }
  place(BT * C * esize);  // attproj scratch
  place(BT * C * esize);  // fcproj scratch
  place(BT * C * esize);  // lnf
  place(BT * 4);
  place(BT * 4);           // lnf mean, rstd
  place(BT * Vp * esize);  // logits / dlogits
  place(BT * 4);           // losses
  for (std::size_t n : {C, 4 * C, C, C, 3 * C, C})
    place(BT * n * esize);  // backward
}

}  // namespace

std::size_t gpt_activation_bytes(const ModelSpec& spec, const ModelShape& shape,
                                 std::size_t act_elem_bytes, int logits_stride) {
  return arena_bytes([&](auto&& place) {
    walk_activations(spec, shape, act_elem_bytes, std::size_t(logits_stride), place);
  });
}

Gpt::Gpt(dev::Device& device, const ParameterLayout& layout, const ModelShape& shape)
    : Model(device, layout, shape) {
  const ModelSpec& spec = layout.spec();
  if (spec.llama()) throw std::logic_error("Gpt: a Llama-family spec (make_model chooses)");
  carve([&](auto&& place) { walk_activations(spec, shape, esize_, std::size_t(Vp_), place); });
  CarvedArena& a = arena();
  layers_.resize(shape.recompute ? 1 : static_cast<std::size_t>(spec.n_layer));
  for (auto& l : layers_) {
    l.ln1 = a.next(), l.qkv = a.next(), l.atty = a.next(), l.res2 = a.next(), l.ln2 = a.next();
    l.fch = a.next(), l.fch_gelu = a.next();
    l.ln1_mean = a.next_f32(), l.ln1_rstd = a.next_f32(), l.ln2_mean = a.next_f32();
    l.ln2_rstd = a.next_f32(), l.lse = a.next_f32();
  }
  attproj_ = a.next(), fcproj_ = a.next(), lnf_ = a.next();
  lnf_mean_ = a.next_f32(), lnf_rstd_ = a.next_f32();
  logits_ = a.next();
  losses_ = a.next_f32();
  dres_ = a.next(), dfch_ = a.next(), dln2_ = a.next(), datty_ = a.next(), dqkv_ = a.next();
  dln1_ = a.next();
  dlnf_ = dln1_;  // the LM head's input gradient, before the blocks need dln1_
}

void Gpt::embed_forward(ParameterStore& store, const RowSpan& r, dev::Stream& s) {
  const int C = layout_.spec().n_embd;
  // A decode step's row is at position row0: wpe's row of that position.
  device_.embedding_forward(
      at(residuals_[0], std::size_t(r.row0) * C), tokens() + r.row0, store.param(layout_.wte()),
      at(store.param(layout_.wpe()), std::size_t(r.row0) * C), r.B, r.T, C, s);
}

// Block l from its first LayerNorm to the MLP's projection into fcproj_, over the rows of r. In
// forward, the LayerNorm comes with the residual add that ends the previous block (fused; the
// last block's add comes with the final LayerNorm); recomputing for backward, the block computes
// the LayerNorm from residuals_[l] and stops after the GELU: backward reads nothing later, and
// residuals_[l + 1] still holds the block's output (and acts(l + 1), shared with this block under
// recompute, must not be written). A decode step writes its qkv row into the cache (a.qkv) and
// attends to the cached rows.
void Gpt::block_forward(ParameterStore& store, int l, const RowSpan& r, bool recomputing,
                        dev::Stream& s) {
  const ModelSpec& spec = layout_.spec();
  const int N = r.rows(), C = spec.n_embd;
  const BlockParams& bp = layout_.block(l);
  auto p = [&](std::size_t off) { return store.param(off); };
  auto row = [&](const void* buf, int width) { return at(buf, std::size_t(r.row0) * width); };
  LayerActs& a = acts(l);
  void* in = row(residuals_[static_cast<std::size_t>(l)], C);
  void *ln1 = row(a.ln1, C), *atty = row(a.atty, C), *res2 = row(a.res2, C), *ln2 = row(a.ln2, C);
  void *fch = row(a.fch, 4 * C), *fch_gelu = row(a.fch_gelu, 4 * C);
  if (recomputing || l == 0) {
    device_.layernorm_forward(ln1, a.ln1_mean + r.row0, a.ln1_rstd + r.row0, in, p(bp.ln1_w),
                              p(bp.ln1_b), N, C, s);
  } else {  // in = the previous block's res2 + fcproj_
    device_.residual_layernorm_forward(in, ln1, a.ln1_mean + r.row0, a.ln1_rstd + r.row0,
                                       row(acts(l - 1).res2, C), fcproj_, p(bp.ln1_w), p(bp.ln1_b),
                                       N, C, s);
  }
  device_.matmul_forward(row(a.qkv, 3 * C), ln1, p(bp.qkv_w), p(bp.qkv_b), {N, C, 3 * C}, s);
  if (r.decode()) {
    device_.attention_decode(atty, a.qkv, r.pos, {1, shape_.T, C, spec.n_head}, s);
  } else {
    device_.attention_forward(atty, a.lse, a.qkv, {r.B, r.T, C, spec.n_head}, s);
  }
  device_.matmul_forward(attproj_, atty, p(bp.attproj_w), p(bp.attproj_b), {N, C, C}, s);
  device_.residual_layernorm_forward(res2, ln2, a.ln2_mean + r.row0, a.ln2_rstd + r.row0, in,
                                     attproj_, p(bp.ln2_w), p(bp.ln2_b), N, C, s);
  device_.matmul_gelu_forward(fch_gelu, fch, ln2, p(bp.fc_w), p(bp.fc_b), {N, C, 4 * C}, s);
  if (recomputing) return;
  device_.matmul_forward(fcproj_, fch_gelu, p(bp.fcproj_w), p(bp.fcproj_b), {N, 4 * C, C}, s);
}

void Gpt::final_norm_forward(ParameterStore& store, const RowSpan& r, dev::Stream& s) {
  const ModelSpec& spec = layout_.spec();
  const int N = r.rows(), C = spec.n_embd, f = r.row0;
  auto row = [&](const void* buf, int width) { return at(buf, std::size_t(f) * width); };
  // The last block's residual add, fused with the final LayerNorm.
  device_.residual_layernorm_forward(row(residuals_.back(), C), row(lnf_, C), lnf_mean_ + f,
                                     lnf_rstd_ + f, row(acts(spec.n_layer - 1).res2, C), fcproj_,
                                     store.param(layout_.lnf_w()), store.param(layout_.lnf_b()), N,
                                     C, s);
}

void Gpt::final_norm_backward(ParameterStore& store, int t, dev::Stream& s) {
  const int N = shape_.B * t, C = layout_.spec().n_embd;
  device_.layernorm_backward(dres_, nullptr, store.grad(layout_.lnf_w()),
                             store.grad(layout_.lnf_b()), dlnf_, residuals_.back(),
                             store.param(layout_.lnf_w()), lnf_mean_, lnf_rstd_, N, C, s);
}

// dres_ carries dL/d(residual stream) down through the blocks: each LayerNorm backward adds its
// input gradient to it in place.
void Gpt::block_backward(ParameterStore& store, int l, int t, dev::Stream& s) {
  const ModelSpec& spec = layout_.spec();
  const int N = shape_.B * t, C = spec.n_embd;
  auto p = [&](std::size_t off) { return store.param(off); };
  auto g = [&](std::size_t off) { return store.grad(off); };
  auto done = [&](std::size_t off) { store.complete_from(off); };
  const BlockParams& bp = layout_.block(l);
  LayerActs& a = acts(l);
  const void* in = residuals_[static_cast<std::size_t>(l)];
  device_.matmul_dgelu_backward(dfch_, g(bp.fcproj_w), g(bp.fcproj_b), dres_, a.fch_gelu,
                                p(bp.fcproj_w), a.fch, {N, 4 * C, C}, s);
  done(bp.fcproj_w);
  device_.matmul_backward(dln2_, g(bp.fc_w), g(bp.fc_b), dfch_, a.ln2, p(bp.fc_w), {N, C, 4 * C},
                          s);
  done(bp.fc_w);
  device_.layernorm_backward(dres_, dres_, g(bp.ln2_w), g(bp.ln2_b), dln2_, a.res2, p(bp.ln2_w),
                             a.ln2_mean, a.ln2_rstd, N, C, s);
  done(bp.ln2_w);
  device_.matmul_backward(datty_, g(bp.attproj_w), g(bp.attproj_b), dres_, a.atty, p(bp.attproj_w),
                          {N, C, C}, s);
  done(bp.attproj_w);
  device_.attention_backward(dqkv_, datty_, a.qkv, a.atty, a.lse, {shape_.B, t, C, spec.n_head}, s);
  device_.matmul_backward(dln1_, g(bp.qkv_w), g(bp.qkv_b), dqkv_, a.ln1, p(bp.qkv_w), {N, C, 3 * C},
                          s);
  done(bp.qkv_w);
  device_.layernorm_backward(dres_, dres_, g(bp.ln1_w), g(bp.ln1_b), dln1_, in, p(bp.ln1_w),
                             a.ln1_mean, a.ln1_rstd, N, C, s);
  done(bp.ln1_w);
}

void Gpt::embed_backward(ParameterStore& store, int t, dev::Stream& s) {
  device_.embedding_backward(store.grad(layout_.wte()), store.grad(layout_.wpe()), dres_, tokens(),
                             shape_.B, t, layout_.spec().n_embd, s);
}

}  // namespace zo::model
