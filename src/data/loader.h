// DataLoader: cuts a TokenSource into windows of T+1 tokens and serves (B, T) batches of inputs
// and next-token targets, in a seeded order that is a pure function of (seed, epoch, position),
// so a resumed run and every data-parallel rank see exactly the batches they should.
//
// Windows: in each document the window starts are 0, T, 2T, ...; a window is T+1 tokens (inputs
// are its first T, targets its last T), so inputs tile the document and every token but the
// first is a target exactly once per epoch. Windows never cross documents (shards, files).
// Validation split: the last floor(n * val_fraction) tokens of each document (n its length)
// belong to the val split, the rest to train; windows lie wholly inside one split.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/token_source.h"

namespace zo::data {

enum class Split {
  kTrain,  // shuffled: each epoch a seeded permutation of the train windows; runs forever
  kVal,    // sequential: the val windows in document order; reset() before each evaluation
};

struct LoaderConfig {
  int64_t batch_size = 4;      // B: rows per batch on this rank
  int64_t seq_len = 1024;      // T
  uint64_t seed = 1337;        // shuffle order (epoch e uses a key derived from seed and e)
  double val_fraction = 0.05;  // per-document tail held out for validation; 0 = none (no val
                               // loader), 1 = the whole source is validation (--val-data)
  Split split = Split::kTrain;
  // Data parallelism: rank r takes windows r, r + world_size, r + 2 * world_size, ... of the
  // global order, so the ranks' batches together are the world_size * B single-process batch.
  int rank = 0;
  int world_size = 1;
};

// Where one window lies: tokens [offset, offset + T + 1) of document `doc`.
struct WindowRef {
  size_t doc = 0;
  uint64_t offset = 0;
  bool operator==(const WindowRef&) const = default;
};

// Not thread-safe (next_batch advances a cursor); the TokenSource underneath is.
class DataLoader {
 public:
  // DataError on a bad config, a document shorter than T+1 tokens, or fewer windows in the
  // split than one global batch (B * world_size) needs.
  DataLoader(std::shared_ptr<const TokenSource> source, const LoaderConfig& config);

  // Fills inputs and targets with B*T tokens each, row-major (B, T); targets[i] is the token
  // after inputs[i]. Advances the cursor. DataError if a token is >= the source's vocab_size.
  // Both loaders wrap around at the end: train into a reshuffled next epoch, val to its start.
  void next_batch(std::vector<int32_t>& inputs, std::vector<int32_t>& targets);

  void reset();  // back to the first batch of epoch 0

  // Cursor for checkpoints: restore(state()) on a loader built from the same data and config
  // continues with exactly the batches this one would have served next. restore() throws a
  // DataError naming every difference if the state came from other data or another config.
  nlohmann::json state() const;
  void restore(const nlohmann::json& state);

  const LoaderConfig& config() const { return config_; }
  const TokenSource& source() const { return *source_; }
  uint64_t num_windows() const { return total_windows_; }            // in this split, all ranks
  uint64_t batches_per_epoch() const { return batches_per_epoch_; }  // same on every rank
  uint64_t tokens_per_batch() const { return config_.batch_size * config_.seq_len; }
  uint64_t batches_served() const { return cursor_; }
  uint64_t epoch() const { return cursor_ / batches_per_epoch_; }
  uint64_t batch_in_epoch() const { return cursor_ % batches_per_epoch_; }

  // The window row `row` of batch number `batch` (counted from the start, across epochs) reads.
  WindowRef window(uint64_t batch, int64_t row) const;
  // The window with index w in this split's document order (0 <= w < num_windows()).
  WindowRef locate(uint64_t w) const;

  std::string describe() const;  // e.g. "train: 12,345 windows of 1025 tokens, 385 batches/epoch"

 private:
  std::shared_ptr<const TokenSource> source_;
  LoaderConfig config_;
  std::vector<uint64_t> region_start_;  // per document: first token of this split
  std::vector<uint64_t> first_window_;  // per document: prefix sum of windows, plus the total
  uint64_t total_windows_ = 0;
  uint64_t batches_per_epoch_ = 0;
  uint64_t cursor_ = 0;              // batches served since epoch 0 began
  std::vector<int32_t> window_buf_;  // T+1 tokens
};

// The usual pair for a run. With no val source, validation is the val_fraction tail of each
// train document (val is null when val_fraction == 0). With a val source (--val-data), train
// uses all of `train` and val all of `val`, and config.val_fraction is ignored.
struct Loaders {
  std::unique_ptr<DataLoader> train;
  std::unique_ptr<DataLoader> val;
};
Loaders make_loaders(std::shared_ptr<const TokenSource> train,
                     std::shared_ptr<const TokenSource> val, const LoaderConfig& config);

}  // namespace zo::data
