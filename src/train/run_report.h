// What the training loop tells the user: the banner before the first step, and the summary
// lines after the last (the per-step progress line and metrics are report/metrics.h).
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "report/metrics.h"
#include "train/session.h"
#include "train/trainer.h"

namespace zo::train {

// Model, device, batch, data-parallel layout, how updates run, the data, and the resume point.
std::string run_banner(const Session& s, std::size_t step_tokens);

// "done: N steps in 1m02s, 1234 tokens/s, loss a -> b, val loss c, k skipped".
std::string run_summary(const TrainSummary& summary, double run_s);

// Per-phase sums over a run: the mean busy and exposed time per step, and the step time over its
// largest component (1.0 = perfect overlap).
struct PhaseTotals {
  std::map<std::string, double> busy, exposed;
  double step_ms = 0.0;
  void add(const report::StepMetrics& m);
  std::string format(std::int64_t steps) const;
};

}  // namespace zo::train
