// Text/token generation from a trained model (offload_train sample).
#pragma once

#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "device/device.h"
#include "model/model.h"
#include "train/inference.h"

namespace zo::train {

struct SampleConfig {
  WeightsSource weights;
  std::vector<std::int32_t> prompt;  // token ids (the CLI turns text into bytes)
  int new_tokens = 64;
  float temperature = 1.0f;  // 0 = greedy
  int top_k = 0;             // 0 = all
  float top_p = 1.0f;        // nucleus: 1 = all
  std::uint64_t seed = 1;
  std::string device = "auto";     // auto (cuda if a GPU is usable), host or cuda
  std::string precision = "auto";  // auto (bf16 on cuda, fp32 on host), fp32, bf16 or fp16
  int threads = 0;
  std::size_t device_memory = 0;  // bytes the device may use; 0 = all
  int param_window = 0;           // InferenceModel's: 0 = every weight on the device if it fits
  // Positions the model holds (activations and KV cache); 0: the model's block_size, at most
  // kDefaultSampleContext (a Llama 3's 131072 positions would need its logits alone in 67 GB).
  int context = 0;
};
inline constexpr int kDefaultSampleContext = 2048;

// Where generation's time went (sample --timing): the prompt's forward, whose logits give the
// first new token, then one step per further token, each a decode step (or a refill when the
// context is full), its logits read back and sampled.
struct SampleTimes {
  int prompt_tokens = 0;   // positions in the first prefill
  double prefill_s = 0.0;  // until its logits row is on the host
  int decode_steps = 0;    // new tokens - 1
  double decode_s = 0.0;   // from there to the last token picked
  std::string device;      // Device::name(): which device, in which dtype
};

// Receives each generated token as soon as it is picked (sample prints as it goes).
using TokenSink = std::function<void(std::int32_t token)>;

// Returns the prompt followed by the generated tokens (generate_with's context policy). The
// flags, prompt and weights are checked, and *vocab_size set, before the first token reaches
// `on_token`; a logits row that is not finite stops generation at its token.
std::vector<std::int32_t> generate(const SampleConfig& config, int* vocab_size = nullptr,
                                   SampleTimes* times = nullptr, const TokenSink& on_token = {});

// Picks the next token from one row of logits (V fp32).
using TokenPicker = std::function<std::int32_t(const std::vector<float>& logits)>;

// The sampler `sample` uses, as Hugging Face's generate with do_sample: greedy (the first
// largest logit) at temperature 0; else softmax(logits / temperature) over the top_k most likely
// tokens (0: all), cut to the smallest set of the most likely whose probability reaches top_p
// (nucleus sampling, arXiv 1904.09751; 1: no cut), renormalised, drawn with a seeded generator.
class TokenSampler {
 public:
  // Throws std::invalid_argument for temperature < 0 or not finite, top_k < 0, top_p outside
  // (0, 1].
  TokenSampler(float temperature, int top_k, float top_p, std::uint64_t seed);
  std::int32_t operator()(const std::vector<float>& logits);

 private:
  float temperature_;
  int top_k_;
  float top_p_;
  std::mt19937_64 rng_;
  std::vector<int> order_;
  std::vector<double> weights_;
};

// The generation loop with the KV cache (Model::decode): a forward over the context (prefill),
// then one decode step per new token, each reading one logits row. `model` was made with
// micro-batch 1, no recompute and T = the context length; params (its layout, act dtype) on dev;
// each logits row is read in the act dtype and widened to fp32 for `pick`. Context policy: a prompt
// longer than T keeps its last T tokens; when the context is full, the last max(1, T/2) tokens are
// prefilled again and decoding goes on from there (the KV cache holds absolute positions, so it
// cannot slide by one).
std::vector<std::int32_t> generate_with(model::Model& model, model::ParameterStore& params,
                                        dev::Device& dev, dev::Stream& s,
                                        std::vector<std::int32_t> prompt, int new_tokens,
                                        const TokenPicker& pick, SampleTimes* times = nullptr);

}  // namespace zo::train
