#include "train/sample.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <stdexcept>

#include "device/device.h"
#include "model/model.h"
#include "model/hf_weights.h"
#include "train/checkpoint_io.h"

namespace zo::train {

std::vector<std::int32_t> generate(const SampleConfig& c, int* vocab_size) {
  if (c.checkpoint.empty() == c.init_from.empty()) {
    throw std::invalid_argument("sample needs exactly one of --checkpoint or --init-from");
  }
  if (c.new_tokens < 0) throw std::invalid_argument("--tokens must be >= 0");
  if (!(c.temperature >= 0.0f) || !std::isfinite(c.temperature)) {
    throw std::invalid_argument("--temperature must be finite and >= 0 (0 = greedy)");
  }
  if (c.top_k < 0) throw std::invalid_argument("--top-k must be >= 0 (0 = all)");
  if (c.prompt.empty())
    throw std::invalid_argument("the prompt is empty: give --prompt or --prompt-tokens");
  model::ModelSpec spec;
  std::vector<float> weights;
  if (!c.checkpoint.empty()) {
    const auto dir = resolve_checkpoint(c.checkpoint, c.checkpoint_dir);
    spec = checkpoint_spec(read_trainer_state(dir));
    weights.resize(model::ParameterLayout(spec).size());
    model::import_hf_weights(dir / "model.safetensors", model::ParameterLayout(spec), weights);
  } else {
    if (c.model.empty()) throw std::invalid_argument("--init-from needs --model");
    spec = model::load_model_spec(c.model);
    weights.resize(model::ParameterLayout(spec).size());
    model::import_hf_weights(c.init_from, model::ParameterLayout(spec), weights);
  }
  if (vocab_size) *vocab_size = spec.vocab_size;
  if (c.top_k > spec.vocab_size) {
    throw std::invalid_argument("--top-k " + std::to_string(c.top_k) +
                                " exceeds the model's vocabulary of " +
                                std::to_string(spec.vocab_size) + " tokens; use 0 for all");
  }
  const model::ParameterLayout layout(spec);
  for (std::int32_t t : c.prompt) {
    if (t < 0 || t >= spec.vocab_size) {
      throw std::invalid_argument("prompt token " + std::to_string(t) +
                                  " is outside the model's "
                                  "vocabulary [0, " +
                                  std::to_string(spec.vocab_size) + ")");
    }
  }

  dev::HostDeviceOptions ho;
  ho.threads = c.threads;
  auto dev = dev::make_host_device(ho);
  auto stream = dev->create_stream();
  dev::Buffer params = dev->alloc(weights.size() * 4, "parameters");
  dev->copy_to_device(params.data(), weights.data(), weights.size() * 4, *stream);
  const int T = spec.block_size, V = spec.vocab_size;
  const auto model = model::make_model(*dev, layout, {1, T, false});
  // Whatever was enqueued finishes before the buffers it uses are freed, on every way out
  // (with no tokens to generate the upload above would otherwise outlive `params`).
  struct Drain {
    dev::Stream& s;
    ~Drain() {
      try {
        s.synchronize();
      } catch (const std::exception&) {  // the error was (or will be) reported by its op
      }
    }
  } drain{*stream};

  std::mt19937_64 rng(c.seed);
  std::vector<std::int32_t> seq = c.prompt, window(static_cast<std::size_t>(T));
  std::vector<float> logits(static_cast<std::size_t>(V));
  std::vector<int> order(static_cast<std::size_t>(V));
  for (int k = 0; k < c.new_tokens; ++k) {
    const int t = std::min<int>(T, static_cast<int>(seq.size()));
    std::fill(window.begin(), window.end(), 0);
    std::copy(seq.end() - t, seq.end(), window.begin());
    model->set_batch(window, {}, *stream);
    model->forward(params.data(), t, false, 0.0f, *stream);
    dev->copy_to_host(logits.data(),
                      static_cast<const float*>(model->logits()) + std::size_t(t - 1) * V,
                      std::size_t(V) * 4, *stream);
    stream->synchronize();
    std::int32_t next = 0;
    if (c.temperature == 0.0f) {
      next = static_cast<std::int32_t>(std::max_element(logits.begin(), logits.end()) -
                                       logits.begin());
    } else {
      for (int i = 0; i < V; ++i)
        order[i] = i;
      int keep = V;
      if (c.top_k > 0 && c.top_k < V) {
        keep = c.top_k;
        std::partial_sort(order.begin(), order.begin() + keep, order.end(),
                          [&](int a, int b) { return logits[a] > logits[b]; });
      }
      double mx = -INFINITY;
      for (int i = 0; i < keep; ++i)
        mx = std::max(mx, double(logits[order[i]]));
      std::vector<double> p(static_cast<std::size_t>(keep));
      for (int i = 0; i < keep; ++i)
        p[i] = std::exp((logits[order[i]] - mx) / c.temperature);
      std::discrete_distribution<int> pick(p.begin(), p.end());
      next = order[pick(rng)];
    }
    seq.push_back(next);
  }
  return seq;
}

}  // namespace zo::train
