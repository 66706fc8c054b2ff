// Per-step metrics: a JSONL file (one object per step) and the live progress line.
#pragma once

#include <cstdint>
#include <fstream>
#include <map>
#include <optional>
#include <string>

namespace zo::report {

struct StepMetrics {
  std::int64_t step = 0;  // 1-based, after the update
  double loss = 0.0;      // mean training loss over the step's micro-batches
  float lr = 0.0f;
  double grad_norm = 0.0;   // global L2 norm before clipping
  bool skipped = false;     // non-finite gradients: no update
  float loss_scale = 1.0f;  // the scale used for this step\'s backward
  std::int64_t tokens = 0;  // tokens processed so far
  double tokens_per_s = 0.0;
  double tflops = 0.0;  // achieved model FLOP/s (6N + attention, PaLM appendix B) / 1e12
  double step_ms = 0.0;
  std::map<std::string, double> phase_ms;    // busy time: forward, backward, adam, d2h, h2d, ...
  std::map<std::string, double> exposed_ms;  // offload: the part of d2h, adam, h2d not hidden
  std::optional<double> val_loss;
};

// Model FLOPs per trained token: 6 N for the matmuls over parameters plus 12 L (H hs) T for
// attention scores and values, forward and backward (Chowdhery et al. 2022, arXiv 2204.02311,
// App. B). q_width = H hs: the query heads' width (C for GPT-2; grouped-query attention shares
// keys and values but computes as many scores).
double flops_per_token(std::size_t num_params, int n_layer, int q_width, int seq_len);

class MetricsWriter {
 public:
  MetricsWriter() = default;
  // A new file unless `append` (a resumed run continues the same file): an existing regular file
  // is unlinked first, so that another name of it (a hard link) keeps its contents. Every line
  // names the run (`run_id`), so that a resume can tell its own file from another run's.
  MetricsWriter(const std::string& path, bool append, std::string run_id);
  void write(const StepMetrics& m);  // one line, flushed
  bool enabled() const { return out_.is_open(); }

 private:
  std::string path_, run_id_;
  std::ofstream out_;
};

std::string progress_line(const StepMetrics& m, std::int64_t total_steps, double eta_s);
std::string format_duration(double seconds);  // "1h02m", "3m05s", "12.3s"

}  // namespace zo::report
