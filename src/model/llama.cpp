#include "model/llama.h"

#include <stdexcept>
#include <string>

#include "model/rope.h"

namespace zo::model {
namespace {

// The widths of one block: q heads, q|k|v, the MLP.
struct Widths {
  std::size_t C, Q, QKV, I;
  explicit Widths(const ModelSpec& s)
      : C(std::size_t(s.n_embd)),
        Q(std::size_t(s.n_head) * s.head_dim),
        QKV(s.qkv_width()),
        I(std::size_t(s.intermediate_size)) {}
};

// The activation layout, walked once for sizing and once for carving (activation_arena.h).
template <class Place>
void walk_activations(const ModelSpec& spec, const ModelShape& sh, std::size_t esize,
                      std::size_t Vp, Place&& place) {
  const Widths w(spec);
  const std::size_t BT = std::size_t(sh.B) * sh.T, L = spec.n_layer;
  place(BT * 4);  // tokens
  place(BT * 4);  // targets
  for (std::size_t i = 0; i <= L; ++i)
    place(BT * w.C * esize);  // residual stream, L+1 points
  for (std::size_t l = 0; l < (sh.recompute ? 1 : L); ++l) {
    for (std::size_t n : {w.C, w.QKV, w.Q, w.C, w.C, 2 * w.I, w.I})
      place(BT * n * esize);                            // ln1 qkv atty res2 ln2 gate_up h
    place(BT * 4);                                      // rstd1
    place(BT * 4);                                      // rstd2
    place(std::size_t(sh.B) * spec.n_head * sh.T * 4);  // lse
  }
  place(BT * w.C * esize);  // attn_out
  place(BT * w.C * esize);  // mlp_out
  place(BT * w.C * esize);  // lnf
  place(BT * 4);            // lnf rstd
  place(BT * Vp * esize);   // logits / dlogits
  place(BT * 4);            // losses
  for (std::size_t n : {w.C, w.I, w.C, w.Q, w.QKV})
    place(BT * n * esize);  // backward: dres dh dln datty dqkv
}

}  // namespace

std::size_t llama_activation_bytes(const ModelSpec& spec, const ModelShape& shape,
                                   std::size_t act_elem_bytes, int logits_stride) {
  return arena_bytes([&](auto&& place) {
    walk_activations(spec, shape, act_elem_bytes, std::size_t(logits_stride), place);
  });
}

Llama::Llama(dev::Device& device, const ParameterLayout& layout, const ModelShape& shape)
    : Model(device, layout, shape), eps_(static_cast<float>(layout.spec().norm_eps)) {
  const ModelSpec& spec = layout.spec();
  if (!spec.llama()) throw std::logic_error("Llama: a GPT-2 spec (make_model chooses)");
  carve([&](auto&& place) { walk_activations(spec, shape, esize_, std::size_t(Vp_), place); });
  CarvedArena& a = arena();
  layers_.resize(shape.recompute ? 1 : static_cast<std::size_t>(spec.n_layer));
  for (auto& l : layers_) {
    l.ln1 = a.next(), l.qkv = a.next(), l.atty = a.next(), l.res2 = a.next(), l.ln2 = a.next();
    l.gate_up = a.next(), l.h = a.next();
    l.rstd1 = a.next_f32(), l.rstd2 = a.next_f32(), l.lse = a.next_f32();
  }
  attn_out_ = a.next(), mlp_out_ = a.next(), lnf_ = a.next();
  lnf_rstd_ = a.next_f32();
  logits_ = a.next();
  losses_ = a.next_f32();
  dres_ = a.next(), dh_ = a.next(), dln_ = a.next(), datty_ = a.next(), dqkv_ = a.next();
  dlnf_ = dln_;
  // RoPE's table: computed once on the host in double (model/rope.h), kept on the device.
  const std::vector<float> inv_freq =
      rope_inv_freq({spec.head_dim, spec.rope_theta, spec.rope_scaling});
  inv_freq_ = device.alloc(inv_freq.size() * 4, "RoPE inverse frequencies");
  const auto stream = device.create_stream();
  device.copy_to_device(inv_freq_.data(), inv_freq.data(), inv_freq.size() * 4, *stream);
  stream->synchronize();
}

dev::AttentionArgs Llama::attention(int B, int T, int pos0) const {
  const ModelSpec& s = layout_.spec();
  return {B, T, s.n_embd, s.n_head, s.n_kv_head, s.head_dim, pos0};
}

void Llama::block_forward(ParameterStore& store, int l, const RowSpan& r, bool recomputing,
                          dev::Stream& s) {
  const ModelSpec& spec = layout_.spec();
  const Widths w(spec);
  const int N = r.rows(), C = int(w.C), Q = int(w.Q), QKV = int(w.QKV), I = int(w.I);
  const LlamaBlockParams& bp = layout_.llama_block(l);
  auto p = [&](std::size_t off) { return store.param(off); };
  auto bias = [&](std::size_t off) { return off == LlamaBlockParams::kNone ? nullptr : p(off); };
  auto row = [&](const void* buf, int width) { return at(buf, std::size_t(r.row0) * width); };
  LayerActs& a = acts(l);
  const void* x = row(residuals_[static_cast<std::size_t>(l)], C);
  void *ln1 = row(a.ln1, C), *qkv = row(a.qkv, QKV), *atty = row(a.atty, Q);
  void *res2 = row(a.res2, C), *ln2 = row(a.ln2, C), *gate_up = row(a.gate_up, 2 * I);
  void* h = row(a.h, I);
  device_.rmsnorm_forward(ln1, a.rstd1 + r.row0, x, p(bp.attn_norm), N, C, eps_, s);
  device_.matmul_forward(qkv, ln1, p(bp.qkv_w), bias(bp.qkv_b), {N, C, QKV}, s);
  device_.rope_forward(qkv, inv_freq_.as<float>(), attention(r.B, r.T, r.row0), s);
  if (r.decode()) {
    device_.attention_decode(atty, a.qkv, r.pos, attention(1, shape_.T), s);
  } else {
    device_.attention_forward(atty, a.lse, a.qkv, attention(r.B, r.T), s);
  }
  device_.matmul_forward(attn_out_, atty, p(bp.o_w), bias(bp.o_b), {N, Q, C}, s);
  device_.residual_forward(res2, x, attn_out_, std::size_t(N) * C, s);
  device_.rmsnorm_forward(ln2, a.rstd2 + r.row0, res2, p(bp.mlp_norm), N, C, eps_, s);
  device_.matmul_forward(gate_up, ln2, p(bp.gate_up_w), nullptr, {N, C, 2 * I}, s);
  device_.swiglu_forward(h, gate_up, N, I, s);
  if (recomputing) return;  // backward reads nothing later
  device_.matmul_forward(mlp_out_, h, p(bp.down_w), nullptr, {N, I, C}, s);
  device_.residual_forward(row(residuals_[std::size_t(l) + 1], C), res2, mlp_out_,
                           std::size_t(N) * C, s);
}

void Llama::embed_forward(ParameterStore& store, const RowSpan& r, dev::Stream& s) {
  const int C = layout_.spec().n_embd;
  device_.embedding_forward(at(residuals_[0], std::size_t(r.row0) * C), tokens() + r.row0,
                            store.param(layout_.wte()), nullptr, r.B, r.T, C, s);
}

void Llama::final_norm_forward(ParameterStore& store, const RowSpan& r, dev::Stream& s) {
  const int N = r.rows(), C = layout_.spec().n_embd;
  auto row = [&](const void* buf, int width) { return at(buf, std::size_t(r.row0) * width); };
  device_.rmsnorm_forward(row(lnf_, C), lnf_rstd_ + r.row0, row(residuals_.back(), C),
                          store.param(layout_.lnf_w()), N, C, eps_, s);
}

// dres_ carries dL/d(residual stream) down through the blocks, each RMSNorm backward adding its
// input gradient to it in place.
void Llama::final_norm_backward(ParameterStore& store, int t, dev::Stream& s) {
  const int N = shape_.B * t, C = layout_.spec().n_embd;
  device_.rmsnorm_backward(dres_, nullptr, store.grad(layout_.lnf_w()), dlnf_, residuals_.back(),
                           store.param(layout_.lnf_w()), lnf_rstd_, N, C, s);
}

void Llama::block_backward(ParameterStore& store, int l, int t, dev::Stream& s) {
  const Widths w(layout_.spec());
  const int N = shape_.B * t, C = int(w.C), Q = int(w.Q), QKV = int(w.QKV), I = int(w.I);
  auto p = [&](std::size_t off) { return store.param(off); };
  auto g = [&](std::size_t off) { return store.grad(off); };
  auto gbias = [&](std::size_t off) { return off == LlamaBlockParams::kNone ? nullptr : g(off); };
  auto done = [&](std::size_t off) { store.complete_from(off); };
  const dev::AttentionArgs att = attention(shape_.B, t);
  const LlamaBlockParams& bp = layout_.llama_block(l);
  LayerActs& a = acts(l);
  // MLP. SwiGLU's gradient overwrites gate_up in place (nothing reads gate_up after it).
  device_.matmul_backward(dh_, g(bp.down_w), nullptr, dres_, a.h, p(bp.down_w), {N, I, C}, s);
  done(bp.down_w);
  device_.swiglu_backward(a.gate_up, dh_, a.gate_up, N, I, s);
  device_.matmul_backward(dln_, g(bp.gate_up_w), nullptr, a.gate_up, a.ln2, p(bp.gate_up_w),
                          {N, C, 2 * I}, s);
  done(bp.gate_up_w);
  device_.rmsnorm_backward(dres_, dres_, g(bp.mlp_norm), dln_, a.res2, p(bp.mlp_norm), a.rstd2, N,
                           C, s);
  done(bp.mlp_norm);
  // Attention: the transpose rotation turns the rotated q, k's gradient into the projection's.
  device_.matmul_backward(datty_, g(bp.o_w), gbias(bp.o_b), dres_, a.atty, p(bp.o_w), {N, Q, C}, s);
  done(bp.o_w);
  device_.attention_backward(dqkv_, datty_, a.qkv, a.atty, a.lse, att, s);
  device_.rope_backward(dqkv_, inv_freq_.as<float>(), att, s);
  device_.matmul_backward(dln_, g(bp.qkv_w), gbias(bp.qkv_b), dqkv_, a.ln1, p(bp.qkv_w),
                          {N, C, QKV}, s);
  done(bp.qkv_w);
  device_.rmsnorm_backward(dres_, dres_, g(bp.attn_norm), dln_,
                           residuals_[static_cast<std::size_t>(l)], p(bp.attn_norm), a.rstd1, N, C,
                           s);
  done(bp.attn_norm);
}

void Llama::embed_backward(ParameterStore& store, int t, dev::Stream& s) {
  device_.embedding_backward(store.grad(layout_.wte()), nullptr, dres_, tokens(), shape_.B, t,
                             layout_.spec().n_embd, s);
}

}  // namespace zo::model
