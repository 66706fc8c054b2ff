// Training throughput (tokens/s) for GPT configs on the host or CUDA backend, next to the same
// device's matmul throughput measured in the same run (the roofline for a GEMM-dominated step).
//
// Model FLOPs per token: 6 N + 12 L C T (PaLM, arXiv 2204.02311 App. B). MFU = achieved model
// FLOP/s / measured matmul FLOP/s: on the host a (B*T, C) x (C, 4C) product, on a GPU a large
// square product (--gemm-size, 8192 by default) in the training dtype.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "device/device.h"
#include "device/make_device.h"
#include "report/metrics.h"
#include "train/trainer.h"

namespace {

using Clock = std::chrono::steady_clock;

double matmul_gflops(const zo::train::TrainConfig& cfg, int N, int C, int OC, int reps) {
  zo::dev::DeviceRequest request;
  request.device = cfg.device;
  request.precision = cfg.precision;
  request.threads = cfg.threads;
  auto dev = zo::dev::make_device(request);
  const std::size_t es = zo::dtype_size(dev->act_dtype());
  auto s = dev->create_stream();
  auto inp = dev->alloc(std::size_t(N) * C * es, "inp");
  auto w = dev->alloc(std::size_t(OC) * C * es, "w");
  auto b = dev->alloc(std::size_t(OC) * es, "b");
  auto out = dev->alloc(std::size_t(N) * OC * es, "out");
  // Non-zero inputs (zeros can run faster than real data), converted on the device.
  auto upload = [&](zo::dev::Buffer& dst, std::size_t count, int mod, float step, float shift) {
    std::vector<float> host(count);
    for (std::size_t i = 0; i < count; ++i)
      host[i] = float(i % mod) * step - shift;
    auto staging = dev->alloc(count * 4, "staging");
    dev->copy_to_device(staging.data(), host.data(), count * 4, *s);
    dev->cast(dst.data(), dev->act_dtype(), staging.data(), zo::DType::kF32, count, *s);
    s->synchronize();  // host and staging die here
  };
  upload(w, std::size_t(OC) * C, 17, 0.01f, 0.08f);
  upload(inp, std::size_t(N) * C, 13, 0.02f, 0.1f);
  dev->fill_zero(b.data(), b.bytes(), *s);
  s->synchronize();
  double best = 1e30;
  for (int r = 0; r < reps + 1; ++r) {
    const auto t0 = Clock::now();
    dev->matmul_forward(out.data(), inp.data(), w.data(), b.data(), {N, C, OC}, *s);
    s->synchronize();
    const double sec = std::chrono::duration<double>(Clock::now() - t0).count();
    if (r > 0) best = std::min(best, sec);
  }
  return 2.0 * N * double(C) * OC / best * 1e-9;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Training throughput vs. the same device's matmul rate measured in the same run"};
  std::vector<std::string> models = {"tiny", "small-test"};
  int steps = 12, batch = 4, threads = 0, seq_len = 0, gemm_size = 8192;
  std::string device = "host", precision = "auto", mode = "auto";
  bool json = false;
  app.add_option("--device", device, "host or cuda")->capture_default_str();
  app.add_option("--precision", precision, "auto, fp32, bf16, fp16")->capture_default_str();
  app.add_option("--mode", mode, "auto, resident or offload")->capture_default_str();
  app.add_option("--seq-len", seq_len, "T (default: block_size)");
  app.add_option("--gemm-size", gemm_size, "square matmul size for the GPU peak")
      ->capture_default_str();
  app.add_option("--models", models, "presets or spec files")->delimiter(',');
  app.add_option("--steps", steps, "timed steps (after 2 warm-up steps)");
  app.add_option("--micro-batch", batch, "B");
  app.add_option("--threads", threads, "host backend threads (0 = all)");
  app.add_flag("--json", json, "one JSON object per model");
  CLI11_PARSE(app, argc, argv);
  try {
    if (steps < 1 || batch < 1)
      throw std::invalid_argument("--steps and --micro-batch must be >= 1");
    for (const auto& name : models) {
      zo::train::TrainConfig c;
      c.model = name;
      c.micro_batch = batch;
      c.steps = steps + 2;
      c.lr.total_steps = c.steps;
      c.threads = threads;
      c.device = device;
      c.precision = precision;
      c.mode = mode;
      c.seq_len = seq_len;
      c.quiet = true;
      c.val_fraction = 0.0;
      zo::train::Trainer t(c);
      const auto s = t.run();
      // Steady state: the mean over steps after the first two.
      const auto& spec = t.spec();
      const int T = seq_len > 0 ? seq_len : spec.block_size;
      const double fpt = zo::report::flops_per_token(spec.num_parameters(), spec.n_layer,
                                                     spec.n_head * spec.head_size(), T);
      double ms = 0.0;
      for (std::size_t i = 2; i < s.step_ms.size(); ++i)
        ms += s.step_ms[i];
      const double tok_s = double(batch) * T * double(s.step_ms.size() - 2) / (ms * 1e-3);
      const bool gpu = device == "cuda";
      const double gemm = gpu ? matmul_gflops(c, gemm_size, gemm_size, gemm_size, 20)
                              : matmul_gflops(c, batch * T, spec.n_embd, 4 * spec.n_embd, 5);
      const double achieved = fpt * tok_s * 1e-9;
      if (json) {
        std::printf("%s\n", nlohmann::json{{"name", "train"},
                                           {"device", device},
                                           {"precision", precision},
                                           {"model", name},
                                           {"params", spec.num_parameters()},
                                           {"micro_batch", batch},
                                           {"seq_len", T},
                                           {"timed_steps", steps},
                                           {"tokens_per_s", tok_s},
                                           {"model_gflops", achieved},
                                           {"matmul_gflops", gemm},
                                           {"ratio_to_matmul", achieved / gemm}}
                                .dump()
                                .c_str());
      } else {
        std::printf(
            "%-12s %10zu params  B=%d T=%d  %9.0f tokens/s  %7.2f model GFLOP/s  "
            "(matmul %8.2f GFLOP/s, ratio %.3f)\n",
            name.c_str(), spec.num_parameters(), batch, T, tok_s, achieved, gemm, achieved / gemm);
      }
      std::fflush(stdout);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_train: %s\n", e.what());
    return 1;
  }
  return 0;
}
