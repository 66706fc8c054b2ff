// The KV cache's check, shared by the host suite (test_sample_cache.cpp) and the CUDA backend's
// (test_cuda_ops.cpp, on the emulator too): the logits of every position of one sequence two
// ways on one device, a forward over all of them (the reference) and a forward over the first
// `prefill` positions followed by one Model::decode step per position.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "device/device.h"
#include "model/model.h"

namespace zo::test {

struct DecodeLogits {
  std::vector<float> forward, decoded;  // (T, V) each, fp32
};

// params: the layout's parameters in dev's act dtype on dev; tokens: T = tokens.size() ids.
inline DecodeLogits decode_vs_forward(dev::Device& dev, const model::ParameterLayout& layout,
                                      const void* params, const std::vector<std::int32_t>& tokens,
                                      int prefill) {
  const int T = static_cast<int>(tokens.size()), V = layout.spec().vocab_size;
  const auto stream = dev.create_stream();
  // Two models: the decoded one's cache holds nothing past the rows it has written.
  const auto full = model::make_model(dev, layout, {1, T, false});
  const auto m = model::make_model(dev, layout, {1, T, false});
  dev::Buffer row = dev.alloc(std::size_t(V) * 4, "one logits row");
  // Row t of the model's logits, as fp32 on the host.
  auto logits_row = [&](const model::Model& from, int t, std::vector<float>& out) {
    const auto* base = static_cast<const char*>(from.logits());
    const std::size_t at = std::size_t(t) * from.logits_stride() * dtype_size(dev.act_dtype());
    dev.cast(row.data(), DType::kF32, base + at, dev.act_dtype(), std::size_t(V), *stream);
    out.resize(out.size() + std::size_t(V));
    dev.copy_to_host(out.data() + out.size() - std::size_t(V), row.data(), std::size_t(V) * 4,
                     *stream);
    stream->synchronize();
  };
  DecodeLogits r;
  full->set_batch(tokens, {}, *stream);
  full->forward(params, T, false, 0.0f, *stream);
  for (int t = 0; t < T; ++t)
    logits_row(*full, t, r.forward);

  // The decoded model's batch holds only the prompt: nothing later can leak in.
  std::vector<std::int32_t> prompt(tokens.size(), 0);
  std::copy(tokens.begin(), tokens.begin() + prefill, prompt.begin());
  m->set_batch(prompt, {}, *stream);
  m->forward(params, prefill, false, 0.0f, *stream);
  for (int t = 0; t < prefill; ++t)
    logits_row(*m, t, r.decoded);
  for (int t = prefill; t < T; ++t) {
    m->set_token(t, tokens[std::size_t(t)], *stream);
    m->decode(params, t, *stream);
    logits_row(*m, t, r.decoded);
  }
  return r;
}

}  // namespace zo::test
