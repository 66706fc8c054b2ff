#include "train/run_report.h"

#include <algorithm>
#include <iomanip>
#include <sstream>

namespace zo::train {

std::string run_banner(const Session& s, std::size_t step_tokens) {
  const model::ModelSpec& spec = s.spec;
  const int B = s.cfg.micro_batch, A = s.cfg.grad_accum, R = s.ranks;
  std::ostringstream os;
  os << "model " << spec.name << ": " << s.layout->size() << " parameters (";
  if (spec.llama()) os << spec.model_type << ", ";
  os << "n_layer " << spec.n_layer << ", n_head " << spec.n_head;
  if (spec.llama()) os << ", kv heads " << spec.n_kv_head << ", head_dim " << spec.head_dim;
  os << ", n_embd " << spec.n_embd;
  if (spec.llama()) os << ", intermediate " << spec.intermediate_size;
  os << ", vocab " << spec.vocab_size << ", block " << spec.block_size << ")\n"
     << "device " << s.dev->name() << "; batch " << B << " x " << s.T << " x " << A << " accum";
  if (R > 1) os << " x " << R << " ranks";
  os << " = " << step_tokens << " tokens/step\n";
  if (R > 1) {
    os << "data parallel: " << R << " ranks over " << s.comm->name() << ", each holding 1/" << R
       << " of the optimizer state (" << s.opt->size() << " parameters on rank 0)\n";
  }
  os << s.updater->describe() << "\n"
     << "data: " << s.loaders.train->describe();
  if (s.loaders.val) os << "\n      " << s.loaders.val->describe();
  if (s.start_step > 0)
    os << "\nresumed from " << s.resume_dir.string() << " at step " << s.start_step;
  for (const std::string& note : s.notes)
    os << "\n" << note;
  return os.str();
}

std::string run_summary(const TrainSummary& summary, double run_s) {
  std::ostringstream os;
  os.precision(4);
  os << "done: " << summary.steps_done << " steps in " << report::format_duration(run_s) << ", "
     << std::fixed << std::setprecision(0) << summary.tokens_per_s << " tokens/s";
  os << std::setprecision(4) << ", loss " << summary.first_loss << " -> " << summary.final_loss;
  if (summary.final_val_loss) os << ", val loss " << *summary.final_val_loss;
  if (summary.skipped_steps) os << ", " << summary.skipped_steps << " skipped";
  return os.str();
}

void PhaseTotals::add(const report::StepMetrics& m) {
  for (const auto& [k, v] : m.phase_ms)
    busy[k] += v;
  for (const auto& [k, v] : m.exposed_ms)
    exposed[k] += v;
  step_ms += m.step_ms;
}

std::string PhaseTotals::format(std::int64_t steps) const {
  std::ostringstream os;
  os << std::fixed << std::setprecision(1) << "per step (ms):";
  for (const auto& [k, v] : busy) {
    os << " " << k << " " << v / double(steps);
    if (auto it = exposed.find(k); it != exposed.end())
      os << " (exposed " << it->second / double(steps) << ")";
  }
  // The largest component: the compute stream, or one of the offload pipeline's stages.
  double compute = 0.0, largest = 0.0;
  for (const char* k : {"forward", "backward"})
    if (auto it = busy.find(k); it != busy.end()) compute += it->second;
  largest = compute;
  for (const char* k : {"d2h", "adam", "h2d"})
    if (auto it = busy.find(k); it != busy.end()) largest = std::max(largest, it->second);
  if (largest > 0.0) {
    os << "; step " << step_ms / double(steps) << " = " << std::setprecision(2) << step_ms / largest
       << " x max(component)";
  }
  return os.str();
}

}  // namespace zo::train
