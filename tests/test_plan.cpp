// The planner's host bytes per parameter of every master-weight and optimizer-state combination
// against the formula written out term by term, and the largest model each admits against the
// plan of a model that size.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "core/bytes.h"
#include "cpu_adam/cpu_adam.h"
#include "model/layout.h"
#include "model/spec.h"
#include "offload/engine_config.h"
#include "optim/host_optimizer.h"
#include "train/plan.h"

namespace {

using zo::DType;
using zo::StateFormat;

zo::train::PlanInput gpt2_input(DType act) {
  zo::train::PlanInput in;
  in.spec = zo::model::load_model_spec("gpt2-124m");
  in.shape = {2, 512, false};
  in.act_dtype = act;
  return in;
}

// q8's block maxima: 4 bytes for each of m and v per block of 2048 of every tensor.
double q8_scale_bytes(const zo::model::ModelSpec& spec) {
  std::size_t blocks = 0;
  const zo::model::ParameterLayout layout(spec);
  for (const auto& t : layout.tensors())
    blocks += (t.numel + 2047) / 2048;
  return 8.0 * double(blocks) / double(spec.num_parameters());
}

// Master, m, v, the gradient landing buffer (act dtype) and the upload buffer (act dtype, none
// when the master is already in it).
double expected_bytes(DType act, DType master, StateFormat state, double scales) {
  const double moment = state == StateFormat::kF32 ? 4 : state == StateFormat::kBF16 ? 2 : 1;
  const double a = double(zo::dtype_size(act));
  return double(zo::dtype_size(master)) + 2 * moment + (state == StateFormat::kQ8 ? scales : 0) +
         a + (act == master ? 0 : a);
}

TEST(PlanCosts, HostBytesPerParameterOfEachCombination) {
  for (const DType act : {DType::kBF16, DType::kF16, DType::kF32}) {
    const auto in = gpt2_input(act);
    const auto costs = zo::train::host_costs(in);
    ASSERT_EQ(costs.size(), 6u);
    const double scales = q8_scale_bytes(in.spec);
    for (const auto& c : costs) {
      SCOPED_TRACE(std::string(zo::dtype_name(act)) + " " + std::string(zo::dtype_name(c.master)) +
                   " " + std::string(zo::state_format_name(c.state)));
      EXPECT_NEAR(c.bytes_per_parameter, expected_bytes(act, c.master, c.state, scales), 1e-9);
      EXPECT_GT(c.fixed_bytes, 0u);
    }
  }
  // The headline: bf16 on the GPU, bf16 master and q8 state hold 6 bytes per parameter.
  const auto costs = zo::train::host_costs(gpt2_input(DType::kBF16));
  EXPECT_NEAR(costs.front().bytes_per_parameter, 16.0, 1e-9);
  EXPECT_NEAR(costs.back().bytes_per_parameter, 6.0, 0.01);
}

// A budget equal to a combination's plan admits that model (and not a larger one); a byte less
// does not admit it.
TEST(PlanCosts, TheLargestModelAdmittedIsTheOneThatFillsTheBudget) {
  for (const char* model : {"gpt2-124m", "llama3.1-8b"}) {
    auto in = gpt2_input(DType::kBF16);
    in.spec = zo::model::load_model_spec(model);
    const std::size_t n = in.spec.num_parameters();
    for (const auto& c : zo::train::host_costs(in)) {
      auto one = in;
      one.engine.master = c.master;
      one.optimizer_state = c.state;
      const std::size_t total = zo::train::plan_memory(one).host_total;
      const std::size_t admitted = c.largest_parameters(total);
      EXPECT_LE(admitted, n) << model;
      EXPECT_GE(admitted + 1, n) << model;
      EXPECT_LT(c.largest_parameters(total - 64), n) << model;
      EXPECT_EQ(c.largest_parameters(c.fixed_bytes), 0u);
    }
  }
}

TEST(PlanCosts, TheDeviceLimitCountsEverythingButTheWeights) {
  auto in = gpt2_input(DType::kBF16);
  in.device_capacity = std::size_t(80) << 30;
  const auto p = zo::train::plan_memory(in);
  const std::size_t limit = zo::train::largest_on_device(in, p);
  const std::size_t weights = p.device.front().bytes;
  EXPECT_EQ(limit, (in.device_capacity - (p.device_total - weights)) / 2);
  in.device_capacity = 0;
  EXPECT_EQ(zo::train::largest_on_device(in, p), 0u);
}

TEST(PlanCosts, TheTableNamesEveryCombinationAndTheBudget) {
  const auto costs = zo::train::host_costs(gpt2_input(DType::kBF16));
  const std::string text =
      zo::train::format_host_costs(costs, std::size_t(128) << 30, "128.00 GiB (--host-memory)");
  EXPECT_NE(text.find("128.00 GiB (--host-memory)"), std::string::npos) << text;
  for (const char* master : {"fp32", "bf16"})
    for (const char* state : {"fp32 ", "bf16 ", "q8  "})
      EXPECT_NE(
          text.find(std::string("--master-weights ") + master + " --optimizer-state " + state),
          std::string::npos)
          << text;
  const auto j = zo::train::host_costs_json(costs, std::size_t(128) << 30);
  ASSERT_EQ(j.at("combinations").size(), 6u);
  EXPECT_EQ(j.at("budget").get<std::size_t>(), std::size_t(128) << 30);
  EXPECT_EQ(j.at("combinations").back().at("largest_parameters").get<std::size_t>(),
            costs.back().largest_parameters(std::size_t(128) << 30));
}

}  // namespace

namespace {

// The optimizer state on a drive: the host keeps staging chunks instead of master, m and v, and
// the drive holds exactly the file a real pager of the layout makes.
TEST(PlanDrive, TheFileAndTheStagingAreThePagersOwn) {
  std::string t = (std::filesystem::temp_directory_path() / "zo_plan_drive_XXXXXX").string();
  const std::filesystem::path dir = ::mkdtemp(t.data());
  for (const StateFormat f : {StateFormat::kF32, StateFormat::kQ8}) {
    zo::train::PlanInput in;
    in.spec = zo::model::load_model_spec("tiny");
    in.shape = {2, 32, false};
    in.optimizer_state = f;
    in.engine.state_on_drive = true;
    in.state_chunk_elements = 3 * 2048;
    const zo::train::MemoryPlan p = zo::train::plan_memory(in);
    std::size_t staging = 0;
    for (const auto& l : p.host) {
      EXPECT_EQ(l.what.find("master weights"), std::string::npos) << l.what;
      EXPECT_EQ(l.what.find("Adam"), std::string::npos) << l.what;
      if (l.what == "optimizer state staging (4 chunks)") staging = l.bytes;
    }
    zo::optim::OptimizerConfig c;
    c.state_format = f;
    c.state_dir = dir;
    c.state_chunk_elements = in.state_chunk_elements;
    const zo::model::ParameterLayout layout(in.spec);
    const zo::optim::HostOptimizer opt(layout, c);
    EXPECT_EQ(p.drive_total, opt.pager()->file_bytes());
    EXPECT_EQ(staging, 4 * opt.pager()->slot_bytes());
    const std::string file = zo::format_bytes(opt.pager()->file_bytes());
    EXPECT_EQ(p.drive_traffic,
              "per step: " + file + " read and " + file + " written (each chunk once each way)");
    EXPECT_NE(p.format(in).find("drive (--state-dir):"), std::string::npos);
    // With the drive's rate: read and write of the file at 2 GB/s each way, and the tokens whose
    // 6 N flop a token at 400 TFLOP/s take as long.
    in.drive_gb_per_s = 2.0;
    const std::string timed = zo::train::plan_memory(in).drive_traffic;
    const double seconds = 2.0 * double(opt.pager()->file_bytes()) / 2e9;
    char want[64];
    std::snprintf(want, sizeof want, "; %.2f s at 2 GB/s each way", seconds);
    EXPECT_NE(timed.find(want), std::string::npos) << timed;
    std::snprintf(want, sizeof want, "from %.0f tokens per step at 400 TFLOP/s",
                  std::ceil(seconds * 400e12 / (6.0 * double(in.spec.num_parameters()))));
    EXPECT_NE(timed.find(want), std::string::npos) << timed;
    // Data parallel: each rank's file holds its share, as a pager over rank 1's partition makes.
    in.engine.ranks = 2;
    in.engine.rank = 1;
    const zo::train::MemoryPlan two = zo::train::plan_memory(in);
    const zo::optim::HostOptimizer share(
        layout, c, zo::offload::engine_partition(layout, in.act_dtype, in.engine));
    EXPECT_EQ(two.drive_total, share.pager()->file_bytes());
    EXPECT_LT(two.drive_total, p.drive_total * 3 / 4);
    EXPECT_NE(two.drive.front().what.find("(1/2)"), std::string::npos) << two.drive.front().what;
    // A host too small for the state in memory: the advice gives the host bytes with the drive.
    zo::train::PlanInput mem = in;
    mem.engine.ranks = 1;
    mem.engine.rank = 0;
    mem.engine.state_on_drive = false;
    mem.host_available = p.host_total;
    const zo::train::MemoryPlan short_host = zo::train::plan_memory(mem);
    ASSERT_FALSE(short_host.host_fits);
    EXPECT_NE(short_host.advice.find("--state-dir DIR (master, m and v on a drive: the host then "
                                     "needs " +
                                     zo::format_bytes(p.host_total) + ", which fits)"),
              std::string::npos)
        << short_host.advice;
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
