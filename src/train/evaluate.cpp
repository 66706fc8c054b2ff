#include "train/evaluate.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "data/token_source.h"
#include "device/make_device.h"
#include "pinned_memory/pinned_buffer.h"
#include "train/config.h"

namespace zo::train {

LossSum sum_losses(model::Model& model, model::ParameterStore& params, data::DataLoader& loader,
                   int batches, dev::Device& dev, dev::Stream& s) {
  const std::size_t BT = std::size_t(model.shape().B) * std::size_t(model.shape().T);
  // Page-locked, so that each batch's loss copy stays asynchronous and the next batch is
  // enqueued while the device still runs this one.
  constexpr int kWindow = kEvalWindow;
  pinned::PinnedBuffer buffer(BT * std::size_t(std::min(std::max(batches, 1), kWindow)) * 4,
                              dev::staging_pin_options(dev, true));
  const std::span<float> l = buffer.span<float>();
  // Copies into `buffer` finish before it is freed, also when a launch or the data throws.
  const dev::StreamDrain drain(s);
  std::vector<std::int32_t> inputs, targets;
  LossSum out{0.0, double(BT) * batches};
  for (int b = 0; b < batches; ++b) {
    loader.next_batch(inputs, targets);
    model.set_batch(inputs, targets, s);
    model.forward(params, model.shape().T, true, 0.0f, s);
    dev.copy_to_host(l.data() + (b % kWindow) * BT, model.losses(), BT * 4, s);
    if (b % kWindow == kWindow - 1 || b + 1 == batches) {
      s.synchronize();
      const auto end = l.begin() + std::ptrdiff_t((b % kWindow + 1) * BT);
      out.sum = std::accumulate(l.begin(), end, out.sum);
      const auto bad = std::find_if(l.begin(), end, [](float x) { return !std::isfinite(x); });
      if (bad != end && out.nonfinite_batch < 0) {
        const auto at = static_cast<std::int64_t>(bad - l.begin());
        out.nonfinite_batch = b - b % kWindow + at / std::int64_t(BT);
        out.nonfinite_row = at % std::int64_t(BT);
      }
    }
  }
  return out;
}

EvalResult evaluate(const EvalConfig& c) {
  if (c.micro_batch < 1 || c.micro_batch > kMaxMicroBatch)
    throw std::invalid_argument("--micro-batch must be in 1.." + std::to_string(kMaxMicroBatch));
  if (c.seq_len < 0) throw std::invalid_argument("--seq-len must be >= 1 (or 0 for block_size)");
  if (c.batches < 0 || c.batches > kMaxEvalBatches) {
    throw std::invalid_argument("--batches must be in 0.." + std::to_string(kMaxEvalBatches) +
                                " (0: one pass over the scored tokens)");
  }
  if (!(c.val_fraction > 0.0 && c.val_fraction <= 1.0)) {
    throw std::invalid_argument(
        "--val-fraction must be in (0, 1]: the tail of each document that is scored (1: all "
        "of it)");
  }
  if (c.data.empty()) throw std::invalid_argument("eval needs --data: the tokens to score");
  dev::DeviceRequest request;
  request.device = c.device;
  request.precision = c.precision;
  request.threads = c.threads;
  request.capacity_bytes = c.device_memory;
  dev::check_device_request(request);
  // The spec (for a checkpoint, its files checksummed), then the data, then the weights: a bad
  // data path or token fails before gigabytes of weights are loaded.
  const WeightsSource weights = pin_checkpoint(c.weights);
  const model::ModelSpec spec = load_spec(weights);
  if (c.seq_len > spec.block_size) {
    throw std::invalid_argument("--seq-len " + std::to_string(c.seq_len) +
                                " exceeds the model's block_size " +
                                std::to_string(spec.block_size));
  }
  const int T = c.seq_len > 0 ? c.seq_len : std::min(spec.block_size, kDefaultEvalSeqLen);
  data::SourceConfig sc;
  sc.path = c.data;
  sc.format = data::parse_data_format(c.data_format);
  sc.vocab_size = spec.vocab_size;
  data::LoaderConfig lc;
  lc.batch_size = c.micro_batch;
  lc.seq_len = T;
  lc.val_fraction = c.val_fraction;
  lc.split = data::Split::kVal;
  data::DataLoader loader(data::open_token_source(sc), lc);
  const std::uint64_t pass = loader.batches_per_epoch();
  if (std::uint64_t(c.batches) > pass) {
    throw std::invalid_argument("--batches " + std::to_string(c.batches) + " is more than one " +
                                "pass over the scored tokens (" + loader.describe() +
                                "): give at most " + std::to_string(pass) + ", or 0 for one pass");
  }
  const int batches =
      c.batches > 0
          ? c.batches
          : static_cast<int>(std::min<std::uint64_t>(pass, std::uint64_t(kMaxEvalBatches)));

  InferenceModel m(weights, spec, request, {c.micro_batch, T, false},
                   "a smaller --micro-batch or --seq-len", c.param_window);
  const LossSum s = sum_losses(m.model(), m.parameters(), loader, batches, m.device(), m.stream());

  EvalResult r;
  r.loss = s.sum / s.count;
  if (s.nonfinite_batch >= 0 || !std::isfinite(r.loss)) {
    const std::string where = s.nonfinite_batch < 0
                                  ? "the mean loss over " + std::to_string(batches) + " batches"
                                  : "batch " + std::to_string(s.nonfinite_batch + 1) + " of " +
                                        std::to_string(batches) + ", sequence " +
                                        std::to_string(s.nonfinite_row / T + 1) + " token " +
                                        std::to_string(s.nonfinite_row % T + 1) + ",";
    throw std::runtime_error(where + " has a non-finite loss (its logits hold Inf or NaN): " +
                             nonfinite_logits_advice(m.device().act_dtype()));
  }
  r.batches = batches;
  r.tokens = static_cast<std::int64_t>(s.count);
  r.split = loader.describe();
  r.device = m.device().name();
  r.weights = m.weights_file().string();
  return r;
}

}  // namespace zo::train
