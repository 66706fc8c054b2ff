// offload_train: the one binary users run.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>

#include "report/system_info.h"

#ifndef ZO_VERSION
#define ZO_VERSION "0.1.0"
#endif

int main(int argc, char** argv) {
  CLI::App app{"offload_train " ZO_VERSION
               ": train GPT-style models whose training state does not fit in GPU memory\n"
               "(ZeRO-Offload: 16-bit forward/backward on the GPU, fp32 Adam on the CPU)."};
  app.set_version_flag("--version", ZO_VERSION);
  app.require_subcommand(1);

  auto* info = app.add_subcommand("info", "Show what this machine offers: CPU Adam ISA paths, "
                                          "threads, host memory, NUMA nodes, GPUs");
  bool info_json = false;
  info->add_flag("--json", info_json, "print as one JSON object");

  CLI11_PARSE(app, argc, argv);
  try {
    if (info->parsed()) {
      const auto j = zo::report::system_info();
      std::fputs(info_json ? (j.dump(2) + "\n").c_str() : zo::report::format_system_info(j).c_str(),
                 stdout);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "offload_train: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
