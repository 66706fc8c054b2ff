#include "data/loader.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <utility>

#include "data/shuffle.h"

namespace zo::data {
namespace {

constexpr const char* kStateFormat = "zo.data_loader/1";
constexpr uint64_t kSaltEpoch = 0x65706f6368ULL;  // "epoch"

const char* split_name(Split s) {
  return s == Split::kTrain ? "train" : "val";
}

std::string with_commas(uint64_t n) {
  const std::string digits = std::to_string(n);
  std::string s;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) s += ',';
    s += digits[i];
  }
  return s;
}

std::string fmt(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

nlohmann::json config_json(const LoaderConfig& c) {
  return {{"batch_size", c.batch_size},     {"seq_len", c.seq_len},         {"seed", c.seed},
          {"val_fraction", c.val_fraction}, {"split", split_name(c.split)}, {"rank", c.rank},
          {"world_size", c.world_size}};
}

// Human-readable differences between the checkpointed data fingerprint and this run's.
void diff_data(const nlohmann::json& was, const nlohmann::json& now,
               std::vector<std::string>& diffs) {
  if (was.value("kind", "") != now.value("kind", "")) {
    diffs.push_back("data kind: checkpoint " + was.value("kind", "?") + ", this run " +
                    now.value("kind", "?"));
    return;
  }
  if (now.value("kind", "") == "synthetic") {
    for (const auto& [key, value] : now.items()) {
      if (!was.contains(key) || was[key] != value) {
        diffs.push_back("synthetic " + key + ": checkpoint " +
                        (was.contains(key) ? was[key].dump() : "missing") + ", this run " +
                        value.dump());
      }
    }
    return;
  }
  const nlohmann::json& a = was.at("files");
  const nlohmann::json& b = now.at("files");
  if (a.size() != b.size()) {
    diffs.push_back("data files: checkpoint has " + std::to_string(a.size()) + ", this run " +
                    std::to_string(b.size()));
  }
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    if (a[i] != b[i]) {
      // The checkpoint's entry may lack any key: contains() before reading (const [] would not).
      const auto field = [](const nlohmann::json& f, const char* key) {
        return f.is_object() && f.contains(key) ? f[key].dump() : std::string("?");
      };
      diffs.push_back("data file #" + std::to_string(i) + ": checkpoint " + field(a[i], "name") +
                      " (" + field(a[i], "tokens") + " tokens, hash " + field(a[i], "hash") +
                      "), this run " + field(b[i], "name") + " (" + field(b[i], "tokens") +
                      " tokens, hash " + field(b[i], "hash") + ")");
      break;  // the first difference is enough to act on
    }
  }
}

// Batch counts beyond 2^53 (exact in a double) and batch rows or ranks beyond 2^31 are refused.
constexpr uint64_t kMaxBatches = uint64_t{1} << 53;
constexpr uint64_t kMaxRows = uint64_t{1} << 31;

// state[key] as a count in [0, max]; DataError naming the key otherwise.
uint64_t count_in(const nlohmann::json& state, const char* key, uint64_t max) {
  const nlohmann::json& v = state.at(key);
  if (!(v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0)) ||
      v.get<uint64_t>() > max) {
    throw DataError(std::string("malformed data loader state in the checkpoint: ") + key + " = " +
                    v.dump() + " is not an integer in [0, " + std::to_string(max) +
                    "]; the checkpoint is damaged, resume from another one");
  }
  return v.get<uint64_t>();
}

}  // namespace

DataLoader::DataLoader(std::shared_ptr<const TokenSource> source, const LoaderConfig& config)
    : source_(std::move(source)), config_(config) {
  const LoaderConfig& c = config_;
  if (!source_) throw DataError("DataLoader needs a token source (got null)");
  if (c.batch_size < 1 || c.seq_len < 1) {
    throw DataError("data loader: batch size " + std::to_string(c.batch_size) +
                    " and sequence length " + std::to_string(c.seq_len) + " must both be >= 1");
  }
  if (c.world_size < 1 || c.rank < 0 || c.rank >= c.world_size) {
    throw DataError("data loader: rank " + std::to_string(c.rank) + " is not in [0, world_size " +
                    std::to_string(c.world_size) + ")");
  }
  if (!(c.val_fraction >= 0.0 && c.val_fraction <= 1.0)) {
    throw DataError("val_fraction " + fmt(c.val_fraction) +
                    " must be in [0, 1] (e.g. 0.05; 0 disables validation)");
  }
  if (c.split == Split::kTrain && c.val_fraction >= 1.0) {
    throw DataError("val_fraction 1 leaves no training data; use e.g. 0.05, or --val-data");
  }
  if (c.split == Split::kVal && c.val_fraction <= 0.0) {
    throw DataError("a validation loader needs val_fraction > 0 (or a separate --val-data)");
  }

  const auto T = static_cast<uint64_t>(c.seq_len);
  const size_t docs = source_->num_documents();
  if (docs == 0) throw DataError("the data source has no documents: " + source_->describe());
  first_window_.assign(docs + 1, 0);
  region_start_.assign(docs, 0);
  for (size_t d = 0; d < docs; ++d) {
    const uint64_t n = source_->document_tokens(d);
    if (n < T + 1) {
      throw DataError("'" + source_->document_name(d) + "' has " + std::to_string(n) +
                      " tokens, fewer than seq_len + 1 = " + std::to_string(T + 1) +
                      " needed for one training window: remove it from the data set or use a "
                      "shorter --seq-len");
    }
    const auto held =
        c.val_fraction >= 1.0
            ? n
            : std::min<uint64_t>(
                  n, static_cast<uint64_t>(std::floor(static_cast<double>(n) * c.val_fraction)));
    const uint64_t begin = c.split == Split::kTrain ? 0 : n - held;
    const uint64_t end = c.split == Split::kTrain ? n - held : n;
    region_start_[d] = begin;
    const uint64_t len = end - begin;
    first_window_[d + 1] = first_window_[d] + (len >= T + 1 ? (len - 1) / T : 0);
  }
  total_windows_ = first_window_[docs];
  const auto global_batch = static_cast<uint64_t>(c.batch_size) * c.world_size;
  batches_per_epoch_ = total_windows_ / global_batch;
  if (batches_per_epoch_ == 0) {
    std::string msg =
        std::string("the ") + split_name(c.split) + " split has " + std::to_string(total_windows_) +
        " windows of seq_len + 1 = " + std::to_string(T + 1) +
        " tokens, fewer than one batch needs (" + std::to_string(c.batch_size) + " rows x " +
        std::to_string(c.world_size) + " ranks); data: " + source_->describe() +
        ". Fix: more data, a smaller " + "--micro-batch or --seq-len";
    if (c.split == Split::kVal && c.val_fraction < 1.0) {
      msg += ", a larger --val-fraction (now " + fmt(c.val_fraction) +
             "), or, when training, a separate --val-data or --val-fraction 0 to skip "
             "validation";
    } else if (c.split == Split::kVal) {  // the whole source is validation data
      msg += " (when training, --val-fraction 0 skips validation)";
    } else if (c.val_fraction > 0) {
      msg += ", or a smaller --val-fraction (now " + fmt(c.val_fraction) + ")";
    }
    throw DataError(msg);
  }
  window_buf_.resize(T + 1);
}

WindowRef DataLoader::locate(uint64_t w) const {
  if (w >= total_windows_) {
    throw DataError("window " + std::to_string(w) + " is out of range (" +
                    std::to_string(total_windows_) + " windows)");
  }
  // Last document whose first window is <= w (documents with no window are skipped over).
  const auto it = std::upper_bound(first_window_.begin(), first_window_.end(), w);
  const auto doc = static_cast<size_t>(it - first_window_.begin() - 1);
  return {doc, region_start_[doc] + (w - first_window_[doc]) * config_.seq_len};
}

WindowRef DataLoader::window(uint64_t batch, int64_t row) const {
  const uint64_t epoch = batch / batches_per_epoch_;
  const uint64_t slot = (batch % batches_per_epoch_) * config_.batch_size + row;
  const uint64_t global = slot * config_.world_size + config_.rank;
  if (config_.split == Split::kVal) return locate(global);
  const Permutation order(total_windows_, derive_key(config_.seed ^ kSaltEpoch, epoch));
  return locate(order(global));
}

void DataLoader::next_batch(std::vector<int32_t>& inputs, std::vector<int32_t>& targets) {
  const auto B = static_cast<size_t>(config_.batch_size);
  const auto T = static_cast<size_t>(config_.seq_len);
  inputs.resize(B * T);
  targets.resize(B * T);
  const int64_t vocab = source_->vocab_size();
  for (size_t b = 0; b < B; ++b) {
    const WindowRef ref = window(cursor_, static_cast<int64_t>(b));
    source_->read(ref.doc, ref.offset, window_buf_);
    for (size_t i = 0; i <= T; ++i) {
      const int32_t t = window_buf_[i];
      if (t < 0 || t >= vocab) {
        throw DataError("token " + std::to_string(t) + " at position " +
                        std::to_string(ref.offset + i) + " of '" + source_->document_name(ref.doc) +
                        "' is outside the model's vocabulary (vocab_size " + std::to_string(vocab) +
                        "): the data was tokenized for another vocabulary, or the model needs a "
                        "larger vocab_size");
      }
    }
    std::copy(window_buf_.begin(), window_buf_.begin() + T, inputs.begin() + b * T);  // (B, T)
    std::copy(window_buf_.begin() + 1, window_buf_.end(), targets.begin() + b * T);   // (B, T)
  }
  ++cursor_;
}

void DataLoader::reset() {
  cursor_ = 0;
}

nlohmann::json DataLoader::state() const {
  return {{"format", kStateFormat},
          {"batches_served", cursor_},
          {"epoch", epoch()},
          {"batch_in_epoch", batch_in_epoch()},
          {"config", config_json(config_)},
          {"data", source_->fingerprint()}};
}

void DataLoader::restore(const nlohmann::json& state) {
  constexpr const char* kFix =
      ". Resume with the same --data, --val-data / --val-fraction, --seq-len, --micro-batch, "
      "--seed and data-parallel size as the checkpointed run, or start a new run";
  uint64_t cursor = 0;
  std::vector<std::string> diffs;
  try {
    if (!state.is_object() || state.value("format", "") != kStateFormat) {
      throw DataError(std::string("not a data loader state (expected an object with format \"") +
                      kStateFormat + "\"): the checkpoint is damaged or from another program");
    }
    cursor = count_in(state, "batches_served", kMaxBatches);
    const nlohmann::json& was = state.at("config");
    const nlohmann::json now = config_json(config_);  // named: items() must not outlive it
    // The cursor counts global batches: it means the same windows for any split of the global
    // batch into ranks x rows (window(): global index = batch * B * ranks + row * ranks + rank),
    // so a job may resume with another number of ranks if B x ranks is unchanged. The rank is
    // this process's own; the state is the job's.
    const auto global = [](const nlohmann::json& c) {
      return count_in(c, "batch_size", kMaxRows) * count_in(c, "world_size", kMaxRows);
    };
    if (global(was) != global(now)) {
      diffs.push_back("global batch (micro-batch x ranks): checkpoint " +
                      was.at("batch_size").dump() + " x " + was.at("world_size").dump() +
                      ", this run " + now.at("batch_size").dump() + " x " +
                      now.at("world_size").dump());
    }
    for (const auto& [key, value] : now.items()) {
      if (key == "rank" || key == "batch_size" || key == "world_size") continue;
      if (!was.contains(key) || was[key] != value) {
        diffs.push_back(key + ": checkpoint " + (was.contains(key) ? was[key].dump() : "missing") +
                        ", this run " + value.dump());
      }
    }
    diff_data(state.at("data"), source_->fingerprint(), diffs);
    // With the same data and settings, the saved epoch and position follow from the cursor.
    for (const auto& [key, value] : {std::pair{"epoch", cursor / batches_per_epoch_},
                                     std::pair{"batch_in_epoch", cursor % batches_per_epoch_}}) {
      if (diffs.empty() && state.contains(key) && count_in(state, key, kMaxBatches) != value) {
        throw DataError(std::string("the checkpoint's data loader state is inconsistent: ") + key +
                        " = " + state[key].dump() + " does not follow from batches_served " +
                        std::to_string(cursor) +
                        "; the checkpoint is damaged, resume from another one");
      }
    }
  } catch (const nlohmann::json::exception& e) {
    // Its text without the library's "[json.exception.<kind>.<id>] " tag.
    const std::string what = e.what();
    const std::size_t tag = what.starts_with('[') ? what.find("] ") : std::string::npos;
    throw DataError(
        "malformed data loader state in the checkpoint (trainer_state.json's "
        "\"data\"): " +
        (tag == std::string::npos ? what : what.substr(tag + 2)) +
        "; the checkpoint is damaged, resume from another one");
  }
  if (!diffs.empty()) {
    std::string msg =
        "the checkpoint's data loader state does not match this run's data and settings: ";
    for (size_t i = 0; i < diffs.size(); ++i)
      msg += (i ? "; " : "") + diffs[i];
    throw DataError(msg + kFix);
  }
  cursor_ = cursor;
}

std::string DataLoader::describe() const {
  std::string s = std::string(split_name(config_.split)) + ": " + with_commas(total_windows_) +
                  " windows of " + std::to_string(config_.seq_len + 1) + " tokens, " +
                  with_commas(batches_per_epoch_) +
                  (batches_per_epoch_ == 1 ? " batch" : " batches") + " of " +
                  std::to_string(config_.batch_size) + "x" + std::to_string(config_.seq_len) +
                  (config_.split == Split::kTrain ? " per epoch" : " per pass");
  if (config_.world_size > 1) {
    s += " (rank " + std::to_string(config_.rank) + " of " + std::to_string(config_.world_size) +
         ")";
  }
  return s;
}

Loaders make_loaders(std::shared_ptr<const TokenSource> train,
                     std::shared_ptr<const TokenSource> val, const LoaderConfig& config) {
  Loaders out;
  LoaderConfig tc = config, vc = config;
  tc.split = Split::kTrain;
  vc.split = Split::kVal;
  if (val) {
    tc.val_fraction = 0.0;
    vc.val_fraction = 1.0;
    out.train = std::make_unique<DataLoader>(std::move(train), tc);
    out.val = std::make_unique<DataLoader>(std::move(val), vc);
    return out;
  }
  if (config.val_fraction > 0.0) out.val = std::make_unique<DataLoader>(train, vc);
  out.train = std::make_unique<DataLoader>(std::move(train), tc);
  return out;
}

}  // namespace zo::data
