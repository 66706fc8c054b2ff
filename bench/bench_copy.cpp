// Host <-> device copy bandwidth through the device interface, pinned and pageable, at sizes
// around the offload engine's bucket: the roofline the engine's achieved D2H/H2D bandwidth
// (`d2h_ms` / `h2d_ms` in its per-phase report) is compared with in docs/performance.md.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/bytes.h"
#include "device/device.h"
#include "device/make_device.h"
#include "pinned_memory/pinned_buffer.h"

namespace {

using Clock = std::chrono::steady_clock;

// Best of `reps` timed copies of `bytes` in one direction, GB/s.
double bandwidth(zo::dev::Device& d, zo::dev::Stream& s, void* host, void* dev, std::size_t bytes,
                 bool to_host, int reps) {
  double best = 1e30;
  for (int r = 0; r <= reps; ++r) {  // the first is a warm-up
    const auto t0 = Clock::now();
    if (to_host) {
      d.copy_to_host(host, dev, bytes, s);
    } else {
      d.copy_to_device(dev, host, bytes, s);
    }
    s.synchronize();
    const double sec = std::chrono::duration<double>(Clock::now() - t0).count();
    if (r > 0) best = std::min(best, sec);
  }
  return double(bytes) / best * 1e-9;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("Host <-> device copy bandwidth, pinned and pageable");
  std::string device = "host";
  std::vector<std::string> sizes = {"1MiB", "8MiB", "32MiB", "128MiB"};
  int reps = 10;
  bool json = false;
  app.add_option("--device", device, "host or cuda")->capture_default_str();
  app.add_option("--sizes", sizes, "copy sizes")->delimiter(',');
  app.add_option("--reps", reps, "timed copies per size (best is reported)");
  app.add_flag("--json", json, "one JSON object per size and memory kind");
  CLI11_PARSE(app, argc, argv);
  try {
    zo::dev::DeviceRequest request;
    request.device = device;
    auto d = zo::dev::make_device(request);
    auto s = d->create_stream();
    for (const auto& text : sizes) {
      const std::size_t bytes = zo::parse_bytes(text);
      auto dev = d->alloc(bytes, "copy target");
      for (const bool pin : {true, false}) {
        zo::pinned::PinOptions o = zo::dev::staging_pin_options(*d, pin);
        o.warn = false;
        zo::pinned::PinnedBuffer host(bytes, o);
        std::memset(host.data(), 0x5a, bytes);  // resident pages, non-zero data
        const double d2h = bandwidth(*d, *s, host.data(), dev.data(), bytes, true, reps);
        const double h2d = bandwidth(*d, *s, host.data(), dev.data(), bytes, false, reps);
        const char* kind = host.is_pinned() ? "pinned" : "pageable";
        if (json) {
          std::printf("%s\n", nlohmann::json{{"device", d->name()},
                                             {"bytes", bytes},
                                             {"memory", kind},
                                             {"d2h_gbps", d2h},
                                             {"h2d_gbps", h2d}}
                                  .dump()
                                  .c_str());
        } else {
          std::printf("%-10s %-9s D2H %7.2f GB/s  H2D %7.2f GB/s\n", text.c_str(), kind, d2h, h2d);
        }
        if (!pin || d->backend() != zo::dev::Backend::kCuda) break;  // host: one kind only
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_copy: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
