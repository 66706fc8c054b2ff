// The optimizer update with its state on a drive (--state-dir) against that drive's rates,
// measured by the same program in the same run: a sequential write and read of a file the size of
// the state (O_DIRECT, 16 MiB transfers, 8 in flight, through the same queue the pager uses),
// then CPU Adam steps over a model's layout with the state in memory and on the drive.
//
// A step on the drive reads every chunk record once and writes it once: its drive-bound time is
// file / read_rate + file / write_rate (one queue, reads and writes interleaved); the update
// cannot run faster than that or than the same update in memory. The figure of merit is the drive
// rate the update achieves, (2 x file / step time), over the rate the probe measured,
// 2 x file / (file / read + file / write): 1.0 means the update runs at the drive's speed.
//   bench_state_dir --dir DIR [--model gpt2-124m] [--state fp32,q8] [--steps 3] [--json]
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/half_bits.h"
#include "core/state_format.h"
#include "model/layout.h"
#include "model/spec.h"
#include "optim/host_optimizer.h"
#include "state_io/drive_probe.h"

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Median seconds of `steps` full updates (after one warm-up) of an optimizer over `layout`.
double step_seconds(const zo::model::ParameterLayout& layout, const zo::optim::OptimizerConfig& c,
                    int steps) {
  zo::optim::HostOptimizer opt(layout, c);
  const std::size_t n = layout.size();
  std::vector<std::uint16_t> grads(n), params(n);
  std::mt19937 rng(1);
  std::normal_distribution<float> g(0.0f, 1e-2f);
  for (auto& x : grads)
    x = zo::f32_to_bf16_bits(g(rng));
  std::vector<float> w(std::min<std::size_t>(n, std::size_t{1} << 22));
  for (auto& x : w)
    x = g(rng);
  for (std::size_t b = 0; b < n; b += w.size())
    opt.write_master(b, {w.data(), std::min(w.size(), n - b)});
  std::vector<double> t;
  for (int s = 0; s <= steps; ++s) {
    const auto t0 = Clock::now();
    opt.step({grads.data(), n, zo::DType::kBF16}, 1e-4f, 1.0f,
             {params.data(), n, zo::DType::kBF16});
    if (s > 0) t.push_back(seconds_since(t0));
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"CPU Adam with the optimizer state on a drive, against the drive's own rates"};
  std::string dir, model = "gpt2-124m", states = "fp32,q8";
  int steps = 3;
  bool json = false;
  app.add_option("--dir", dir, "a directory on the drive to measure")->required();
  app.add_option("--model", model, "preset or JSON spec whose layout is updated")
      ->capture_default_str();
  app.add_option("--state", states, "optimizer-state formats, comma-separated")
      ->capture_default_str();
  app.add_option("--steps", steps, "timed updates per case (after one warm-up)")
      ->capture_default_str();
  app.add_flag("--json", json, "one JSON object per line");
  CLI11_PARSE(app, argc, argv);
  try {
    const zo::model::ParameterLayout layout(zo::model::load_model_spec(model));
    std::stringstream list(states);
    for (std::string name; std::getline(list, name, ',');) {
      zo::optim::OptimizerConfig c;
      c.state_format = zo::parse_state_format(name);
      c.state_dir = dir;
      std::uint64_t file = 0;
      {
        const zo::optim::HostOptimizer sizing(layout, c);
        file = sizing.pager()->file_bytes();
      }
      const zo::state_io::DriveRates r = zo::state_io::measure_drive(dir, file);
      const double drive_s = step_seconds(layout, c, steps);
      c.state_dir.clear();
      const double memory_s = step_seconds(layout, c, steps);
      const double probe_gbps = 2.0 / (1.0 / r.read_gbps + 1.0 / r.write_gbps);
      const double achieved_gbps = 2.0 * double(file) / drive_s * 1e-9;
      nlohmann::json j = {{"name", "state_dir"},
                          {"model", model},
                          {"parameters", layout.size()},
                          {"state_dtype", name},
                          {"file_bytes", file},
                          {"queue", r.queue},
                          {"io", r.io},
                          {"read_gbps", r.read_gbps},
                          {"write_gbps", r.write_gbps},
                          {"step_s_drive", drive_s},
                          {"step_s_memory", memory_s},
                          {"drive_gbps_in_update", achieved_gbps},
                          {"ratio_to_drive", achieved_gbps / probe_gbps}};
      if (json) {
        std::printf("%s\n", j.dump().c_str());
      } else {
        std::printf(
            "%s, %s state: file %.2f GiB; drive read %.2f GB/s, write %.2f GB/s (%s, %s); step "
            "%.3f s on the drive, %.3f s in memory; the update moves %.2f GB/s = %.2f of the "
            "drive's read+write rate\n",
            model.c_str(), name.c_str(), double(file) / (1 << 30), r.read_gbps, r.write_gbps,
            r.queue.c_str(), r.io.c_str(), drive_s, memory_s, achieved_gbps,
            achieved_gbps / probe_gbps);
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_state_dir: %s\n", e.what());
    return 1;
  }
  return 0;
}
