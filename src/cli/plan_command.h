// `offload_train plan` on the command line: the memory plan of a run, without running it.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "common_options.h"
#include "optim/state_pager.h"

namespace zo::cli {

struct PlanCommand {
  CLI::App* app = nullptr;
  std::string model = "tiny", optimizer_state = "fp32", precision = "fp32", mode = "auto";
  std::string grad_accum_on = "auto", master_weights = "fp32", state_dir;
  int micro_batch = 4, seq_len = 0, grad_accum = 1, ranks = 1, param_window = 0;
  bool recompute = false, dpu = false, json = false;
  double link_gb_per_s = 55.0, device_tflops = 400.0;      // train::PlanInput's
  double drive_gb_per_s = 0.0;                             // --state-dir's drive, each way
  std::size_t state_chunk = optim::kDefaultChunkElements;  // --state-chunk
  ByteSize device_memory, host_memory, bucket;
};

// Declares the subcommand and its flags on `app`; model_help describes --model.
void add_plan_command(CLI::App& app, PlanCommand& cmd, const std::string& model_help);

// Checks the flags as `train` does, prints the plan of each mode asked for (and, for auto, the
// recommended one); 0 when it fits, 3 when it does not.
int run_plan(const PlanCommand& cmd);

// `info`: the machine's report, and the host bytes per parameter of each master-weight and
// optimizer-state combination with the parameters each admits in the memory available here
// (reckoned for Llama 3.1 8B's shapes in bf16 on a GPU, offload mode, 1 x 4096 tokens).
// state_dir non-empty: also the drive's sequential rates there (state_io::measure_drive).
int run_info(bool json, const std::string& state_dir = "");

}  // namespace zo::cli
