#include "report/metrics.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <utility>

namespace zo::report {

double flops_per_token(std::size_t num_params, int n_layer, int q_width, int seq_len) {
  return 6.0 * double(num_params) + 12.0 * n_layer * double(q_width) * seq_len;
}

MetricsWriter::MetricsWriter(const std::string& path, bool append, std::string run_id)
    : path_(path), run_id_(std::move(run_id)) {
  // A regular file is unlinked first, so that another hard link keeps its contents; a symlink
  // (/dev/stdout, say) is written through.
  std::error_code ec;
  if (!append &&
      std::filesystem::symlink_status(path, ec).type() == std::filesystem::file_type::regular)
    std::filesystem::remove(path, ec);  // (open reports what fails)
  out_.open(path, append ? std::ios::app : std::ios::trunc);
  if (!out_) {
    throw std::runtime_error("cannot open metrics file '" + path +
                             "' for writing; choose a writable --metrics path");
  }
}

void MetricsWriter::write(const StepMetrics& m) {
  if (!out_.is_open()) return;
  nlohmann::json j = {{"step", m.step},       {"loss", m.loss},
                      {"lr", m.lr},           {"grad_norm", m.grad_norm},
                      {"skipped", m.skipped}, {"loss_scale", m.loss_scale},
                      {"tokens", m.tokens},   {"tokens_per_s", m.tokens_per_s},
                      {"tflops", m.tflops},   {"step_ms", m.step_ms},
                      {"run_id", run_id_}};
  for (const auto& [k, v] : m.phase_ms)
    j[k + "_ms"] = v;
  for (const auto& [k, v] : m.exposed_ms)
    j[k + "_exposed_ms"] = v;
  if (m.val_loss) j["val_loss"] = *m.val_loss;
  out_ << j.dump() << '\n';
  out_.flush();
  if (!out_) throw std::runtime_error("writing metrics file '" + path_ + "' failed (disk full?)");
}

std::string format_duration(double s) {
  char buf[32];
  if (!std::isfinite(s) || s < 0) return "?";
  if (s < 60) {
    std::snprintf(buf, sizeof buf, "%.1fs", s);
  } else if (s < 3600) {
    std::snprintf(buf, sizeof buf, "%dm%02ds", int(s) / 60, int(s) % 60);
  } else {
    std::snprintf(buf, sizeof buf, "%dh%02dm", int(s) / 3600, (int(s) % 3600) / 60);
  }
  return buf;
}

namespace {

// " (a 1.0, b 12)": milliseconds, one decimal below 10 ms.
void append_phases(std::string& s, const char* open, const std::map<std::string, double>& ms) {
  if (ms.empty()) return;
  s += open;
  char buf[96];
  bool first = true;
  for (const auto& [k, v] : ms) {
    std::snprintf(buf, sizeof buf, v < 10.0 ? "%s%s %.1f" : "%s%s %.0f", first ? "" : ", ",
                  k.c_str(), v);
    s += buf;
    first = false;
  }
  s += ")";
}

}  // namespace

std::string progress_line(const StepMetrics& m, std::int64_t total_steps, double eta_s) {
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "step %6lld/%lld | loss %.4f | lr %.2e | norm %.3f | %.0f tok/s | %.3f TFLOPS | "
                "%.0f ms",
                static_cast<long long>(m.step), static_cast<long long>(total_steps), m.loss, m.lr,
                m.grad_norm, m.tokens_per_s, m.tflops, m.step_ms);
  std::string s = buf;
  append_phases(s, " (", m.phase_ms);
  append_phases(s, " exposed (", m.exposed_ms);
  if (m.skipped) s += " | SKIPPED (non-finite gradients)";
  if (m.val_loss) {
    std::snprintf(buf, sizeof buf, " | val %.4f", *m.val_loss);
    s += buf;
  }
  s += " | ETA " + format_duration(eta_s);
  return s;
}

}  // namespace zo::report
