// CPU Adam throughput against a STREAM-style triad measured by the same program in the same run.
//
// Bytes moved per parameter by one update (counted as useful traffic, no write-allocate):
//   grad in (2 B for fp16/bf16, 4 B for fp32) + master read+write (8 B fp32 / 4 B bf16) + m, v
//   read+write (16 B fp32 / 8 B bf16 / 4 B q8, whose block maxima add 16 B per 2048) + 16-bit
//   params out (2 B)  =  28 B for fp16 grads, fp32 master and state; 16 B with q8; 12 B with a
//   bf16 master and q8.
// Host bytes per parameter are what the optimizer keeps: master, m and v (q8: with the maxima);
// the gradient and upload buffers (2 + 2 B with 16-bit gradients and copy out) come on top.
// Each case's parameters/s is also given over the fp32 master with fp32 state's, measured in
// the same run just before it (same size, path and gradient dtype).
// Triad a[i] = b[i] + s*c[i] over doubles is counted with write-allocate: 32 B per element (read
// b, c; read-for-ownership and write a), which is what the memory system really moves.
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/partitioner.h>
#include <tbb/task_arena.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cpu_adam/cpu_adam.h"
#include "pinned_memory/host_buffer.h"

namespace {

using zo::DType;
using zo::cpu_adam::Isa;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct Timing {
  double best_s = 0.0, median_s = 0.0;
};

template <class Fn>
Timing time_reps(int reps, Fn&& fn) {
  fn();  // warm-up: page faults, caches, thread start
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    fn();
    t.push_back(seconds_since(t0));
  }
  std::sort(t.begin(), t.end());
  return {t.front(), t[t.size() / 2]};
}

// Restrict-qualified and vectorised (-O3 on this file) so that the triad is limited by memory,
// not by a scalar loop.
void triad_range(double* __restrict a, const double* __restrict b, const double* __restrict c,
                 double s, std::size_t lo, std::size_t hi) {
  for (std::size_t i = lo; i < hi; ++i)
    a[i] = b[i] + s * c[i];
}

// STREAM triad with the same threads and static partitioning as the optimizer.
double triad_gbytes_per_s(int threads, std::size_t n, int reps) {
  tbb::task_arena arena(threads);
  std::vector<zo::pinned::HostBuffer> bufs;
  for (int k = 0; k < 3; ++k) {
    bufs.push_back(zo::pinned::HostBuffer::allocate_array<double>(n));
  }
  double* a = bufs[0].span<double>().data();
  double* b = bufs[1].span<double>().data();
  double* c = bufs[2].span<double>().data();
  auto par = [&](auto&& body) {
    arena.execute([&] {
      tbb::parallel_for(
          tbb::blocked_range<std::size_t>(0, n, 1 << 16),
          [&](const tbb::blocked_range<std::size_t>& r) { body(r.begin(), r.end()); },
          tbb::static_partitioner());
    });
  };
  par([&](std::size_t lo, std::size_t hi) {  // first touch by the threads that use the pages
    for (std::size_t i = lo; i < hi; ++i) {
      a[i] = 0.0;
      b[i] = 1.0 + double(i % 7);
      c[i] = 2.0 - double(i % 5);
    }
  });
  const double s = 3.0;
  const Timing t = time_reps(
      reps, [&] { par([&](std::size_t lo, std::size_t hi) { triad_range(a, b, c, s, lo, hi); }); });
  return 32.0 * double(n) / t.best_s * 1e-9;
}

struct AdamCase {
  std::size_t params;
  Isa isa;
  DType grad;
  std::string state;  // fp32, bf16 or q8 (8-bit codes and a block absmax)
  bool out;
  std::string master;  // fp32, or bf16 rounded stochastically
};

// Bytes of m or v per parameter: 4, 2, or 1 for q8 (its absmax adds 4 per 2048: not counted).
std::size_t state_bytes(const std::string& state) {
  return state == "fp32" ? 4 : state == "bf16" ? 2 : 1;
}

std::size_t master_bytes(const std::string& master) {
  return master == "fp32" ? 4 : 2;
}

// Memory traffic of one update: grad in, master, m and v read and written, 16-bit params out.
std::size_t bytes_per_param(const AdamCase& c) {
  return zo::dtype_size(c.grad) + 2 * master_bytes(c.master) + 4 * state_bytes(c.state) +
         (c.out ? 2 : 0);
}

// Host bytes the optimizer holds per parameter: master, m and v (q8: with the block maxima).
double host_bytes_per_param(const AdamCase& c) {
  return double(master_bytes(c.master)) + 2.0 * double(state_bytes(c.state)) +
         (c.state == "q8" ? 8.0 / double(zo::cpu_adam::kQ8Block) : 0.0);
}

struct AdamResult {
  Timing t;
  double gparams_per_s, gbytes_per_s;
};

AdamResult run_adam(const AdamCase& c, int threads, int reps) {
  zo::cpu_adam::CpuAdam::Options opt;
  opt.isa = c.isa;
  opt.threads = threads;
  zo::AdamConfig cfg;
  cfg.weight_decay = 0.1f;
  zo::cpu_adam::CpuAdam adam(cfg, opt);

  using zo::pinned::HostBuffer;
  HostBuffer p, m, v, g, out, m_absmax, v_absmax;
  const std::size_t blocks = zo::cpu_adam::q8_blocks(c.params);
  adam.execute([&] {  // NUMA first touch in the optimizer's own threads and chunks
    const std::size_t chunk = zo::cpu_adam::kChunkElements;
    p = c.master == "fp32" ? HostBuffer::allocate_array<float>(c.params, {}, chunk)
                           : HostBuffer::allocate_array<std::uint16_t>(c.params, {}, chunk);
    const auto state_alloc = [&] {
      return c.state == "fp32"   ? HostBuffer::allocate_array<float>(c.params, {}, chunk)
             : c.state == "bf16" ? HostBuffer::allocate_array<std::uint16_t>(c.params, {}, chunk)
                                 : HostBuffer::allocate_array<std::uint8_t>(c.params, {}, chunk);
    };
    m = state_alloc();
    v = state_alloc();
    if (c.state == "q8") {
      m_absmax = HostBuffer::allocate_array<float>(blocks);
      v_absmax = HostBuffer::allocate_array<float>(blocks);
    }
    g = c.grad == DType::kF32 ? HostBuffer::allocate_array<float>(c.params, {}, chunk)
                              : HostBuffer::allocate_array<std::uint16_t>(c.params, {}, chunk);
    out = HostBuffer::allocate_array<std::uint16_t>(c.params, {}, chunk);
  });
  // Non-trivial values: params ~ U(-1, 1), gradients ~ U(-0.01, 0.01) (exactly representable).
  for (std::size_t i = 0; i < c.params; ++i) {
    const float x = float(int(i % 2001) - 1000) * 1e-3f;
    if (c.master == "fp32") {
      p.span<float>()[i] = x;
    } else {
      p.span<std::uint16_t>()[i] = zo::float_to_bf16(x);
    }
  }
  std::vector<float> gsrc(c.params);
  for (std::size_t i = 0; i < c.params; ++i)
    gsrc[i] = float(int(i % 199) - 99) * 1e-4f;
  if (c.grad == DType::kF32) {
    std::copy(gsrc.begin(), gsrc.end(), g.span<float>().begin());
  } else {
    auto gs = g.span<std::uint16_t>();
    for (std::size_t i = 0; i < c.params; ++i) {
      gs[i] = c.grad == DType::kF16 ? zo::float_to_half(gsrc[i]) : zo::float_to_bf16(gsrc[i]);
    }
  }
  gsrc = {};

  zo::cpu_adam::AdamBuffers b;
  if (c.master == "fp32") {
    b.params = p.span<float>();
  } else {
    b.bf16_master = {p.span<std::uint16_t>().data(), 1, 0};
  }
  if (c.state == "q8") {
    b.q8 = {static_cast<std::uint8_t*>(m.data()), static_cast<std::uint8_t*>(v.data()),
            m_absmax.span<float>().data(), v_absmax.span<float>().data(), blocks};
  } else {
    const DType sd = zo::parse_dtype(c.state);
    b.exp_avg = {m.data(), c.params, sd};
    b.exp_avg_sq = {v.data(), c.params, sd};
  }
  b.grads = {g.data(), c.params, c.grad};
  if (c.out) b.params_out = {out.data(), c.params, DType::kF16};
  zo::cpu_adam::AdamState st;
  AdamResult r;
  r.t = time_reps(reps, [&] { adam.step(b, st); });
  r.gparams_per_s = double(c.params) / r.t.best_s * 1e-9;
  r.gbytes_per_s = double(bytes_per_param(c) * c.params) / r.t.best_s * 1e-9;
  return r;
}

// One case as a JSON line or a table row; fp32_gparams is its group's fp32 master and state
// result (0: not run).
void report(const AdamCase& c, const std::string& size, int threads, const AdamResult& r,
            double fp32_gparams, double triad, bool json) {
  const double ratio = r.gbytes_per_s / triad;
  const double vs_fp32 = fp32_gparams > 0.0 ? r.gparams_per_s / fp32_gparams : 0.0;
  const std::string isa(zo::cpu_adam::isa_name(c.isa));
  if (json) {
    std::printf("%s\n", nlohmann::json{{"name", "cpu_adam"},
                                       {"params", c.params},
                                       {"isa", isa},
                                       {"threads", threads},
                                       {"grad_dtype", zo::dtype_name(c.grad)},
                                       {"state_dtype", c.state},
                                       {"master_dtype", c.master},
                                       {"host_bytes_per_param", host_bytes_per_param(c)},
                                       {"out_dtype", c.out ? "fp16" : "none"},
                                       {"bytes_per_param", bytes_per_param(c)},
                                       {"ms_per_step", r.t.best_s * 1e3},
                                       {"ms_per_step_median", r.t.median_s * 1e3},
                                       {"gparams_per_s", r.gparams_per_s},
                                       {"params_per_s_vs_fp32", vs_fp32},
                                       {"gbytes_per_s", r.gbytes_per_s},
                                       {"triad_gbytes_per_s", triad},
                                       {"ratio_to_triad", ratio}}
                            .dump()
                            .c_str());
  } else {
    char vs[16] = "-";
    if (vs_fp32 > 0.0) std::snprintf(vs, sizeof vs, "%.3f", vs_fp32);
    std::printf("%-11s %-8s %-5s %-6s %-5s %6.2f %6zu %9.2f %9.2f %9.3f %8s %8.2f %7.3f\n",
                isa.c_str(), size.c_str(), std::string(zo::dtype_name(c.grad)).c_str(),
                c.master.c_str(), c.state.c_str(), host_bytes_per_param(c), bytes_per_param(c),
                r.t.best_s * 1e3, r.t.median_s * 1e3, r.gparams_per_s, vs, r.gbytes_per_s, ratio);
  }
  std::fflush(stdout);
}

std::size_t parse_count(const std::string& s) {
  std::size_t pos = 0;
  const double x = std::stod(s, &pos);
  const std::string unit = s.substr(pos);
  const double mult = unit.empty()  ? 1.0
                      : unit == "K" ? 1e3
                      : unit == "M" ? 1048576.0
                      : unit == "G" ? 1073741824.0
                                    : -1.0;
  if (mult < 0 || x <= 0)
    throw std::invalid_argument("bad size '" + s + "': use e.g. 16M, 1G, 5000");
  return static_cast<std::size_t>(x * mult);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"CPU Adam throughput vs. a STREAM triad measured in the same run"};
  std::vector<std::string> sizes = {"16M", "64M", "256M"};
  std::vector<std::string> isas;
  std::vector<std::string> grad_dtypes = {"fp16"};
  std::vector<std::string> state_dtypes = {"fp32", "bf16", "q8"};
  std::vector<std::string> masters = {"fp32"};
  int threads = 0, reps = 0;
  bool json = false, no_out = false;
  app.add_option("--sizes", sizes, "parameter counts (K = 1e3, M = 2^20, G = 2^30)")
      ->delimiter(',');
  app.add_option("--isa", isas, "paths to run (default: every path this CPU supports)")
      ->delimiter(',');
  app.add_option("--grad-dtype", grad_dtypes, "fp32, fp16, bf16")->delimiter(',');
  app.add_option("--state-dtype", state_dtypes, "fp32, bf16, q8")->delimiter(',');
  app.add_option("--master", masters, "master weights: fp32, bf16 (rounded stochastically)")
      ->delimiter(',');
  app.add_option("--threads", threads, "threads (0: all cores)")->check(CLI::NonNegativeNumber);
  app.add_option("--reps", reps, "timed repetitions per case (default: by size)")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--no-out", no_out, "do not write 16-bit params out");
  app.add_flag("--json", json, "one JSON object per measurement on stdout");
  CLI11_PARSE(app, argc, argv);

  try {
    if (threads == 0) threads = tbb::info::default_concurrency();
    std::vector<Isa> isa_list;
    if (isas.empty()) {
      isa_list = zo::cpu_adam::supported_isas();
    } else {
      for (const auto& s : isas) {
        const Isa isa = zo::cpu_adam::parse_isa(s);
        if (!zo::cpu_adam::isa_supported(isa)) {
          throw std::invalid_argument("--isa " + s + ": this CPU cannot run it");
        }
        isa_list.push_back(isa);
      }
    }
    for (const auto& sd : state_dtypes) {
      if (sd != "fp32" && sd != "bf16" && sd != "q8") {
        throw std::invalid_argument("--state-dtype " + sd + ": use fp32, bf16 or q8");
      }
    }
    for (const auto& md : masters) {
      if (md != "fp32" && md != "bf16") {
        throw std::invalid_argument("--master " + md + ": use fp32 or bf16");
      }
    }
    const std::size_t triad_n = std::size_t{1} << 25;  // 3 x 256 MiB, far beyond any cache
    const double triad = triad_gbytes_per_s(threads, triad_n, 10);
    if (json) {
      std::printf("%s\n", nlohmann::json{{"name", "triad"},
                                         {"threads", threads},
                                         {"elements", triad_n},
                                         {"bytes_per_element", 32},
                                         {"triad_gbytes_per_s", triad}}
                              .dump()
                              .c_str());
    } else {
      std::printf(
          "STREAM triad (double, %d threads, counting write-allocate, 32 B/elem): %.2f GB/s\n\n",
          threads, triad);
      std::printf("%-11s %-8s %-5s %-6s %-5s %6s %6s %9s %9s %9s %8s %8s %7s\n", "isa", "params",
                  "grad", "master", "state", "host B", "moved", "ms/step", "median", "Gparam/s",
                  "vs fp32", "GB/s", "/triad");
    }
    for (const auto& size : sizes) {
      const std::size_t n = parse_count(size);
      for (Isa isa : isa_list) {
        for (const auto& gd : grad_dtypes) {
          double fp32_gparams = 0.0;  // this group's fp32 master and state result; 0: not run
          for (const auto& md : masters) {
            for (const auto& sd : state_dtypes) {
              const AdamCase c{n, isa, zo::parse_dtype(gd), sd, !no_out, md};
              const int r_count = reps > 0 ? reps : (n >= (std::size_t{128} << 20) ? 4 : 10);
              const AdamResult r = run_adam(c, threads, r_count);
              if (sd == "fp32" && md == "fp32") fp32_gparams = r.gparams_per_s;
              report(c, size, threads, r, fp32_gparams, triad, json);
            }
          }
        }
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cpu_adam: %s\n", e.what());
    return 1;
  }
  return 0;
}
