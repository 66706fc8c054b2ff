#include "data/synthetic.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "data/shuffle.h"
#include "data/token_source.h"

namespace zo::data {
namespace {

// Salts that separate the independent random sub-streams of one seed.
constexpr uint64_t kSaltChain = 1, kSaltSteps = 2, kSaltRestarts = 3;

constexpr double kTwo53 = 9007199254740992.0;  // 2^53

}  // namespace

SyntheticTask::SyntheticTask(const SyntheticConfig& config) : config_(config) {
  vocab_ = config.vocab_size;
  k_ = config.branching;
  if (vocab_ < 2 || vocab_ > (int64_t{1} << 30)) {
    throw DataError("synthetic task: vocab_size " + std::to_string(vocab_) +
                    " is out of range; use 2 .. 2^30 (the model's vocab_size by default)");
  }
  if (k_ < 1 || k_ > vocab_ || k_ > 64) {
    throw DataError("synthetic task: branching " + std::to_string(k_) +
                    " must be in [1, min(64, vocab_size)]");
  }
  if (config.block_len < 2) {
    throw DataError("synthetic task: block_len must be >= 2 (got " +
                    std::to_string(config.block_len) + ")");
  }
  if (config.num_tokens < 2) {
    throw DataError("synthetic task: num_tokens must be >= 2 (got " +
                    std::to_string(config.num_tokens) + ")");
  }
  const uint64_t chain_key = derive_key(config.seed, kSaltChain);
  step_key_ = derive_key(config.seed, kSaltSteps);
  restart_key_ = derive_key(config.seed, kSaltRestarts);
  const auto V = static_cast<size_t>(vocab_);
  const auto K = static_cast<size_t>(k_);
  uint64_t draw = 0;
  auto next_random = [&] { return counter_random(chain_key, draw++); };

  // Successor 0 follows one random cycle through every token, so the chain is irreducible and
  // has a unique stationary distribution with pi > 0 everywhere; the rest are random and distinct.
  std::vector<int32_t> order(V);
  std::iota(order.begin(), order.end(), 0);
  for (size_t i = V - 1; i > 0; --i)
    std::swap(order[i], order[scale_random(next_random(), i + 1)]);
  successors_.assign(V * K, 0);
  for (size_t i = 0; i < V; ++i)
    successors_[order[i] * K] = order[(i + 1) % V];
  for (size_t t = 0; t < V; ++t) {
    int32_t* row = &successors_[t * K];
    for (size_t j = 1; j < K; ++j) {
      int32_t s;
      do {
        s = static_cast<int32_t>(scale_random(next_random(), V));
      } while (std::find(row, row + j, s) != row + j);
      row[j] = s;
    }
  }
  // Integer weights 1 + u^2, u uniform in 0..255: skewed rows (mean row entropy ~1.0 nat for
  // k = 4). Integers keep the stream bit-identical on every platform.
  cumulative_.assign(V * K, 0);
  std::vector<double> row_entropy(V, 0.0);
  for (size_t t = 0; t < V; ++t) {
    uint32_t sum = 0;
    for (size_t j = 0; j < K; ++j) {
      const uint32_t u = static_cast<uint32_t>(next_random() >> 56);
      sum += 1 + u * u;
      cumulative_[t * K + j] = sum;
    }
    double h = 0;
    uint32_t prev = 0;
    for (size_t j = 0; j < K; ++j) {
      const double p = static_cast<double>(cumulative_[t * K + j] - prev) / sum;
      prev = cumulative_[t * K + j];
      h -= p * std::log(p);
    }
    row_entropy[t] = h;
  }

  // Stationary distribution by power iteration on the lazy chain (P + I) / 2: same fixed point,
  // and aperiodic, so it converges even if P is periodic.
  std::vector<double> pi(V, 1.0 / static_cast<double>(V)), next(V);
  for (int iter = 0; iter < 1000000; ++iter) {
    for (size_t t = 0; t < V; ++t)
      next[t] = 0.5 * pi[t];
    for (size_t t = 0; t < V; ++t) {
      const double total = cumulative_[t * K + K - 1];
      uint32_t prev = 0;
      for (size_t j = 0; j < K; ++j) {
        const uint32_t c = cumulative_[t * K + j];
        next[successors_[t * K + j]] += 0.5 * pi[t] * (c - prev) / total;
        prev = c;
      }
    }
    double norm = 0, delta = 0;
    for (size_t t = 0; t < V; ++t)
      norm += next[t];
    for (size_t t = 0; t < V; ++t) {
      next[t] /= norm;
      delta += std::fabs(next[t] - pi[t]);
    }
    pi.swap(next);
    if (delta < 1e-15) break;
  }
  stationary_ = pi;
  stationary_cdf_.resize(V);
  double cum = 0;
  for (size_t t = 0; t < V; ++t) {
    entropy_rate_ += pi[t] * row_entropy[t];
    if (pi[t] > 0) stationary_entropy_ -= pi[t] * std::log(pi[t]);
    cum += pi[t];
    stationary_cdf_[t] = static_cast<uint64_t>(std::min(cum, 1.0) * kTwo53);
  }
  stationary_cdf_[V - 1] = static_cast<uint64_t>(kTwo53);
}

double SyntheticTask::expected_loss() const {
  const double L = config_.block_len;
  return ((L - 1) * entropy_rate_ + stationary_entropy_) / L;
}

double SyntheticTask::uniform_loss() const {
  return std::log(static_cast<double>(vocab_));
}

std::span<const int32_t> SyntheticTask::successors(int64_t token) const {
  return {successors_.data() + token * k_, static_cast<size_t>(k_)};
}

std::vector<double> SyntheticTask::transition_probabilities(int64_t token) const {
  std::vector<double> p(static_cast<size_t>(k_));
  const uint32_t* c = cumulative_.data() + token * k_;
  uint32_t prev = 0;
  for (int32_t j = 0; j < k_; ++j) {
    p[j] = static_cast<double>(c[j] - prev) / c[k_ - 1];
    prev = c[j];
  }
  return p;
}

int32_t SyntheticTask::restart_token(uint64_t block) const {
  const uint64_t u = counter_random(restart_key_, block) >> 11;  // 53 bits
  const auto it = std::upper_bound(stationary_cdf_.begin(), stationary_cdf_.end(), u);
  return static_cast<int32_t>(std::min<ptrdiff_t>(it - stationary_cdf_.begin(), vocab_ - 1));
}

int32_t SyntheticTask::step(int32_t token, uint64_t position) const {
  const uint32_t* c = cumulative_.data() + static_cast<size_t>(token) * k_;
  const uint64_t r = scale_random(counter_random(step_key_, position), c[k_ - 1]);
  int32_t j = 0;
  while (r >= c[j])
    ++j;
  return successors_[static_cast<size_t>(token) * k_ + j];
}

void SyntheticTask::generate(uint64_t position, std::span<int32_t> out) const {
  if (out.empty()) return;
  const uint64_t L = config_.block_len;
  const uint64_t end = position + out.size();
  uint64_t p = position / L * L;  // replay from the start of the block
  int32_t token = 0;
  for (; p < end; ++p) {
    token = p % L == 0 ? restart_token(p / L) : step(token, p);
    if (p >= position) out[p - position] = token;
  }
}

namespace {

class SyntheticSource final : public TokenSource {
 public:
  explicit SyntheticSource(const SyntheticConfig& config)
      : task_(config), name_("synthetic(seed=" + std::to_string(config.seed) + ")") {}

  size_t num_documents() const override { return 1; }
  uint64_t document_tokens(size_t) const override { return task_.config().num_tokens; }
  const std::string& document_name(size_t) const override { return name_; }
  int64_t vocab_size() const override { return vocab_; }

  void read(size_t doc, uint64_t offset, std::span<int32_t> out) const override {
    const uint64_t n = task_.config().num_tokens;
    if (doc != 0 || offset > n || out.size() > n - offset) {
      throw DataError("read of tokens [" + std::to_string(offset) + ", " +
                      std::to_string(offset + out.size()) +
                      ") is outside the synthetic stream of " + std::to_string(n) + " tokens");
    }
    task_.generate(offset, out);
  }

  nlohmann::json fingerprint() const override {
    const SyntheticConfig& c = task_.config();
    return {{"kind", "synthetic"},        {"seed", c.seed},
            {"vocab_size", c.vocab_size}, {"branching", c.branching},
            {"num_tokens", c.num_tokens}, {"block_len", c.block_len}};
  }

  std::string describe() const override {
    const SyntheticConfig& c = task_.config();
    char buf[256];
    std::snprintf(buf, sizeof buf,
                  "synthetic Markov chain (seed %llu, %lld states, %d successors each), %llu "
                  "tokens; loss floor H = %.4f nats (uniform ln V = %.4f)",
                  static_cast<unsigned long long>(c.seed), static_cast<long long>(c.vocab_size),
                  c.branching, static_cast<unsigned long long>(c.num_tokens), task_.entropy_rate(),
                  task_.uniform_loss());
    return buf;
  }

  void set_vocab(int64_t v) { vocab_ = v; }
  const SyntheticTask& task() const { return task_; }

 private:
  SyntheticTask task_;
  std::string name_;
  int64_t vocab_ = 0;
};

}  // namespace

std::unique_ptr<TokenSource> make_synthetic_source(const SyntheticConfig& config,
                                                   int64_t vocab_size) {
  SyntheticConfig c = config;
  if (c.vocab_size == 0) c.vocab_size = vocab_size;
  if (c.vocab_size > vocab_size) {
    throw DataError("synthetic task has " + std::to_string(c.vocab_size) +
                    " token states but the model's vocab_size is " + std::to_string(vocab_size) +
                    "; use a synthetic vocab_size <= the model's (0 = the model's)");
  }
  auto source = std::make_unique<SyntheticSource>(c);
  source->set_vocab(vocab_size);
  return source;
}

}  // namespace zo::data
