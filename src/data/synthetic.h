// The built-in synthetic task: a random sparse Markov chain over the vocabulary. Each token has
// `branching` successors with fixed random probabilities drawn from the seed, so the best
// achievable loss is the chain's entropy rate H (nats/token), computed exactly here. A model
// starts near ln(V) and a tiny GPT visibly learns its way down towards H.
//
// The stream is a pure function of (seed, position): successor choices come from a counter-based
// RNG, and the chain restarts every `block_len` tokens from a token drawn from its stationary
// distribution, so reading any range costs at most block_len + length steps and needs no storage.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace zo::data {

struct SyntheticConfig {
  uint64_t seed = 1;                 // which chain and which stream
  int64_t vocab_size = 0;            // states V; 0 = the model's vocab_size
  int32_t branching = 4;             // successors per token (k)
  uint64_t num_tokens = 1ULL << 24;  // virtual stream length (nothing is stored)
  uint32_t block_len = 4096;         // restart period; a power of two that T divides keeps every
                                     // restart at a window start, where it is never a target
};

class SyntheticTask {
 public:
  // DataError on a bad config (vocab_size < 2, branching outside [1, vocab_size], ...).
  explicit SyntheticTask(const SyntheticConfig& config);

  const SyntheticConfig& config() const { return config_; }
  int64_t vocab_size() const { return vocab_; }

  // H = sum_i pi_i * H(P[i, :]) in nats: the loss floor of a next-token predictor.
  double entropy_rate() const { return entropy_rate_; }
  // H(pi): the loss on a restart token (it does not depend on the previous token).
  double stationary_entropy() const { return stationary_entropy_; }
  // Mean optimal loss over all positions, counting one restart per block:
  // ((block_len - 1) * H + H(pi)) / block_len. Equal to H for windows aligned with blocks.
  double expected_loss() const;
  // Loss of a model that predicts uniformly: ln(V), where training starts.
  double uniform_loss() const;

  // Tokens [position, position + out.size()) of the stream.
  void generate(uint64_t position, std::span<int32_t> out) const;

  // The chain, for tests and documentation.
  std::span<const int32_t> successors(int64_t token) const;
  std::vector<double> transition_probabilities(int64_t token) const;  // aligned with successors
  const std::vector<double>& stationary() const { return stationary_; }

 private:
  int32_t restart_token(uint64_t block) const;
  int32_t step(int32_t token, uint64_t position) const;

  SyntheticConfig config_;
  int64_t vocab_ = 0;
  int32_t k_ = 0;
  uint64_t step_key_ = 0, restart_key_ = 0;
  std::vector<int32_t> successors_;   // (V, k)
  std::vector<uint32_t> cumulative_;  // (V, k) integer cumulative weights: exact, portable picks
  std::vector<double> stationary_;    // (V)
  std::vector<uint64_t> stationary_cdf_;  // (V) cumulative pi scaled to 2^53
  double entropy_rate_ = 0, stationary_entropy_ = 0;
};

}  // namespace zo::data
