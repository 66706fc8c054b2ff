#include "train/sample.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <numeric>
#include <random>
#include <stdexcept>

#include "core/dtype.h"
#include "device/device.h"
#include "model/model.h"
#include "train/inference.h"

namespace zo::train {

namespace {

// A sampler given NaN or Inf has no distribution to draw from (std::discrete_distribution's
// precondition): the weights hold Inf or NaN, or a finite value overflows the act dtype.
void check_finite_logits(const std::vector<float>& logits, int k, int pos, DType act) {
  const auto bad =
      std::count_if(logits.begin(), logits.end(), [](float x) { return !std::isfinite(x); });
  if (bad == 0) return;
  throw std::runtime_error("new token " + std::to_string(k + 1) + " (position " +
                           std::to_string(pos) + "): the model's logits hold " +
                           std::to_string(bad) + " non-finite values (Inf or NaN) of " +
                           std::to_string(logits.size()) + ": " + nonfinite_logits_advice(act));
}

}  // namespace

std::vector<std::int32_t> generate(const SampleConfig& c, int* vocab_size, SampleTimes* times,
                                   const TokenSink& on_token) {
  if (c.new_tokens < 0) throw std::invalid_argument("--tokens must be >= 0");
  TokenSampler pick(c.temperature, c.top_k, c.top_p, c.seed);  // checks them
  if (c.context < 0) throw std::invalid_argument("--context must be >= 1 (or 0 for the default)");
  if (c.prompt.empty())
    throw std::invalid_argument("the prompt is empty: give --prompt or --prompt-tokens");
  dev::DeviceRequest request;
  request.device = c.device;
  request.precision = c.precision;
  request.threads = c.threads;
  request.capacity_bytes = c.device_memory;
  dev::check_device_request(request);
  const WeightsSource weights = pin_checkpoint(c.weights);
  const model::ModelSpec spec = load_spec(weights);
  if (vocab_size) *vocab_size = spec.vocab_size;
  if (c.top_k > spec.vocab_size) {
    throw std::invalid_argument("--top-k " + std::to_string(c.top_k) +
                                " exceeds the model's vocabulary of " +
                                std::to_string(spec.vocab_size) + " tokens; use 0 for all");
  }
  for (std::int32_t t : c.prompt) {
    if (t < 0 || t >= spec.vocab_size) {
      throw std::invalid_argument("prompt token " + std::to_string(t) +
                                  " is outside the model's "
                                  "vocabulary [0, " +
                                  std::to_string(spec.vocab_size) + ")");
    }
  }
  if (c.context > spec.block_size) {
    throw std::invalid_argument("--context " + std::to_string(c.context) +
                                " exceeds the model's block_size " +
                                std::to_string(spec.block_size));
  }
  const int T = c.context > 0 ? c.context : std::min(spec.block_size, kDefaultSampleContext);

  InferenceModel m(weights, spec, request, {1, T, false}, "a smaller --context", c.param_window);
  if (times) {
    times->device = m.device().name();
    if (m.param_window() != 0)
      times->device += ", " + std::to_string(m.param_window()) + "-block window";
  }
  return generate_with(
      m.model(), m.parameters(), m.device(), m.stream(), c.prompt, c.new_tokens,
      [&](const std::vector<float>& logits) {
        const std::int32_t next = pick(logits);
        if (on_token) on_token(next);
        return next;
      },
      times);
}

TokenSampler::TokenSampler(float temperature, int top_k, float top_p, std::uint64_t seed)
    : temperature_(temperature), top_k_(top_k), top_p_(top_p), rng_(seed) {
  if (!(temperature >= 0.0f) || !std::isfinite(temperature)) {
    throw std::invalid_argument("--temperature must be finite and >= 0 (0 = greedy)");
  }
  if (top_k < 0) throw std::invalid_argument("--top-k must be >= 0 (0 = all)");
  if (!(top_p > 0.0f && top_p <= 1.0f)) {
    throw std::invalid_argument("--top-p must be in (0, 1] (1 = no nucleus cut)");
  }
}

std::int32_t TokenSampler::operator()(const std::vector<float>& logits) {
  const int V = static_cast<int>(logits.size());
  if (temperature_ == 0.0f) {
    return static_cast<std::int32_t>(std::max_element(logits.begin(), logits.end()) -
                                     logits.begin());
  }
  order_.resize(logits.size());
  std::iota(order_.begin(), order_.end(), 0);
  const int keep = top_k_ > 0 && top_k_ < V ? top_k_ : V;
  if (keep < V || top_p_ < 1.0f) {  // the kept tokens, most likely first
    std::partial_sort(order_.begin(), order_.begin() + keep, order_.end(),
                      [&](int a, int b) { return logits[a] > logits[b]; });
  }
  double mx = -INFINITY;
  for (int i = 0; i < keep; ++i)
    mx = std::max(mx, double(logits[order_[i]]));
  weights_.resize(static_cast<std::size_t>(keep));
  double total = 0.0;
  for (int i = 0; i < keep; ++i) {
    weights_[i] = std::exp((logits[order_[i]] - mx) / temperature_);
    total += weights_[i];
  }
  if (top_p_ < 1.0f) {  // the shortest prefix whose probability reaches top_p
    double mass = 0.0;
    std::size_t n = 0;
    while (n < weights_.size() && mass < double(top_p_) * total)
      mass += weights_[n++];
    weights_.resize(std::max<std::size_t>(n, 1));
  }
  if (!(total > 0.0) || !std::isfinite(total)) {  // discrete_distribution's precondition
    throw std::invalid_argument("sampling: the logits are not finite; no token can be drawn");
  }
  std::discrete_distribution<int> choose(weights_.begin(), weights_.end());
  return order_[static_cast<std::size_t>(choose(rng_))];
}

std::vector<std::int32_t> generate_with(model::Model& model, model::ParameterStore& params,
                                        dev::Device& dev, dev::Stream& s,
                                        std::vector<std::int32_t> seq, int new_tokens,
                                        const TokenPicker& pick, SampleTimes* times) {
  const int T = model.shape().T, V = model.layout().spec().vocab_size;
  const int stride = model.logits_stride();
  const DType act = dev.act_dtype();
  const std::size_t esize = dtype_size(act);
  std::vector<std::int32_t> window(static_cast<std::size_t>(T));
  std::vector<std::uint8_t> row(std::size_t(V) * esize);  // one logits row, act dtype
  std::vector<float> logits(static_cast<std::size_t>(V));
  std::size_t start = seq.size() > std::size_t(T) ? seq.size() - std::size_t(T) : 0;
  int pos = 0;  // the cache position of the last token, whose logits row comes next
  auto prefill = [&] {
    std::fill(window.begin(), window.end(), 0);
    std::copy(seq.begin() + std::ptrdiff_t(start), seq.end(), window.begin());
    model.set_batch(window, {}, s);
    pos = static_cast<int>(seq.size() - start) - 1;
    model.forward(params, pos + 1, false, 0.0f, s);
  };
  using Clock = std::chrono::steady_clock;
  const auto seconds_since = [](Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  const auto t0 = Clock::now();
  auto t1 = t0;
  if (new_tokens > 0) prefill();
  for (int k = 0; k < new_tokens; ++k) {
    dev.copy_to_host(row.data(),
                     static_cast<const char*>(model.logits()) + std::size_t(pos) * stride * esize,
                     row.size(), s);
    s.synchronize();
    if (k == 0) {
      t1 = Clock::now();
      if (times) times->prompt_tokens = pos + 1;
    }
    convert_to_float(row.data(), act, logits.data(), logits.size());
    check_finite_logits(logits, k, pos, act);
    const std::int32_t next = pick(logits);
    seq.push_back(next);
    if (k + 1 == new_tokens) break;
    if (pos + 1 == T) {  // the context is full: keep its second half
      start = seq.size() - std::size_t(std::max(1, T / 2));
      prefill();
    } else {
      model.set_token(++pos, next, s);
      model.decode(params, pos, s);
    }
  }
  if (times) {
    times->prefill_s = std::chrono::duration<double>(t1 - t0).count();
    times->decode_steps = std::max(new_tokens - 1, 0);
    times->decode_s = new_tokens > 0 ? seconds_since(t1) : 0.0;
  }
  return seq;
}

}  // namespace zo::train
