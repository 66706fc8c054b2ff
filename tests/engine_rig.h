// What the offload engine's tests share (test_offload on the host backend, test_offload_cuda on
// a GPU or the SIMT emulator): a model with odd sizes, seeded batches, one step through the
// engine, and a gradient store that corrupts one element of one micro-batch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "device/device.h"
#include "model/gpt.h"
#include "model/spec.h"
#include "offload/engine.h"

namespace zo::test {

// Odd sizes everywhere: 3 heads of 16, a 97-token vocabulary, 3 blocks.
inline const model::ModelSpec& odd_spec() {
  static const auto s = model::model_spec_from_json(
      {{"n_layer", 3}, {"n_head", 3}, {"n_embd", 48}, {"vocab_size", 97}, {"block_size", 16}},
      "engine-test");
  return s;
}

// `count` micro-batches of BT random tokens and targets below odd_spec()'s vocabulary.
struct Batches {
  std::vector<std::vector<std::int32_t>> tokens, targets;
  Batches(int count, int BT, std::uint64_t seed) {
    std::mt19937 rng(static_cast<std::uint32_t>(seed));
    std::uniform_int_distribution<int> tok(0, 96);
    for (int k = 0; k < count; ++k) {
      tokens.emplace_back(BT);
      targets.emplace_back(BT);
      for (auto& t : tokens.back())
        t = tok(rng);
      for (auto& t : targets.back())
        t = tok(rng);
    }
  }
};

// One step's gradients: begin_step, per micro-batch a forward (through the engine's read hook)
// and a backward into `grads` (the engine itself when null), then finish_gradients.
inline offload::GradStats engine_gradients(dev::Stream& s, offload::Engine& e, model::Gpt& gpt,
                                           const Batches& b, int T, float dloss, bool dpu = false,
                                           model::ParameterStore* grads = nullptr) {
  e.begin_step(dpu);
  for (std::size_t k = 0; k < b.tokens.size(); ++k) {
    gpt.set_batch(b.tokens[k], b.targets[k], s);
    gpt.forward(e, T, true, dloss, s);
    e.begin_micro_batch(static_cast<int>(k));
    gpt.backward(grads ? *grads : e, s);
  }
  return e.finish_gradients();
}

// engine_gradients, then the update with learning rate lr.
inline offload::GradStats engine_step(dev::Stream& s, offload::Engine& e, model::Gpt& gpt,
                                      const Batches& b, int T, float dloss, float lr,
                                      bool dpu = false) {
  const offload::GradStats st = engine_gradients(s, e, gpt, b, T, dloss, dpu);
  e.start_update(lr, 1.0f);
  return st;
}

// The engine's gradient side, except that in backward number `micro` (counted from 0 over the
// store's life; -1: every one) element `offset` of the gradient is overwritten with `value`
// (bytes of the act dtype) just before the op that finishes it is reported: what an overflow
// in that micro-batch's backward leaves behind.
class CorruptOneGradient final : public model::ParameterStore {
 public:
  CorruptOneGradient(offload::Engine& e, dev::Device& d, dev::Stream& s, std::size_t offset,
                     std::vector<char> value, int micro)
      : e_(e), d_(d), s_(s), offset_(offset), value_(std::move(value)), micro_(micro) {}
  const void* param(std::size_t offset) override { return e_.param(offset); }
  const void* params() override { return e_.params(); }
  void before_read(std::size_t group) override { e_.before_read(group); }
  void* grad(std::size_t offset) override { return e_.grad(offset); }
  void complete_from(std::size_t offset) override {
    if ((micro_ < 0 || backward_ == micro_) && !done_ && offset <= offset_) {
      // value_ outlives the copy: the step synchronises before this store goes.
      d_.copy_to_device(static_cast<char*>(e_.grad(offset_)), value_.data(), value_.size(), s_);
      done_ = true;
    }
    e_.complete_from(offset);
    if (offset == 0) {  // this backward is over
      ++backward_;
      done_ = false;
    }
  }

 private:
  offload::Engine& e_;
  dev::Device& d_;
  dev::Stream& s_;
  std::size_t offset_;
  std::vector<char> value_;
  int micro_, backward_ = 0;
  bool done_ = false;
};

// Bytes of a float as element type t (fp32, or rounded to fp16 / bf16).
inline std::vector<char> element_bytes(float v, DType t) {
  std::vector<char> out(dtype_size(t));
  if (t == DType::kF32) {
    std::memcpy(out.data(), &v, 4);
  } else {
    const std::uint16_t h = t == DType::kF16 ? float_to_half(v) : float_to_bf16(v);
    std::memcpy(out.data(), &h, 2);
  }
  return out;
}

inline std::vector<float> download(dev::Device& d, const void* p, std::size_t n) {
  auto s = d.create_stream();
  std::vector<float> out(n);
  d.copy_to_host(out.data(), p, n * 4, *s);
  s->synchronize();
  return out;
}

}  // namespace zo::test
