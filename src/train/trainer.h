// The training loop: forward and backward on the device, then the optimizer either on the device
// (resident mode) or on the host through the offload engine (offload/engine.h), which streams
// gradient buckets during backward and overlaps CPU Adam and the parameter upload with compute
// (train/updater.h is the seam between the loop and the two).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "device/device.h"
#include "model/spec.h"
#include "train/config.h"

namespace zo::train {

struct Session;  // train/session.h

struct TrainSummary {
  std::int64_t first_step = 0;  // 0, or the resumed step
  std::int64_t steps_done = 0;  // optimizer steps taken by this run (skipped ones included)
  std::int64_t skipped_steps = 0;
  double first_loss = 0.0, final_loss = 0.0;
  std::optional<double> final_val_loss;
  double tokens_per_s = 0.0;
  std::vector<double> losses;   // per step, for tests
  std::vector<double> step_ms;  // per step, wall time
  std::string last_checkpoint;
  // Why the run ended before --steps ("" when it did not): a stop request (a signal) or too many
  // consecutive non-finite steps. The CLI exits non-zero with it (exit_status).
  std::string stopped;
  int exit_status = 0;  // 128 + signal after a signal, 1 after non-finite steps
};

class Trainer {
 public:
  // Resolves the model spec, opens the data and checks the memory plan: bad input is refused
  // here, before any large allocation.
  explicit Trainer(const TrainConfig& config);
  ~Trainer();

  const model::ModelSpec& spec() const;
  int rank() const;  // this process's rank in a data-parallel job (0 alone)
  // Runs until config.steps, or until stopped (TrainSummary::stopped); `log` receives progress
  // lines (stderr in the CLI).
  TrainSummary run(const std::function<void(const std::string&)>& log = {});

 private:
  std::unique_ptr<Session> impl_;
};

}  // namespace zo::train
