// The optimizer state on a drive (OptimizerConfig::state_dir) against the same state in memory:
// the same updates over several steps give the same master weights, moments and 16-bit
// parameters bit for bit, in every state format, on both I/O queues, with chunks small enough
// that tensors and q8 segments are cut at chunk boundaries.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "core/half_bits.h"
#include "engine_rig.h"
#include "optim/host_optimizer.h"
#include "optim/state_pager.h"
#include "run_binary.h"

namespace {

namespace fs = std::filesystem;
using zo::DType;
using zo::StateFormat;
using zo::optim::HostOptimizer;

struct Format {
  StateFormat state;
  DType master;
};

void compare_runs(Format f, zo::state_io::QueueKind kind) {
  const zo::model::ParameterLayout layout(zo::test::odd_spec());
  const zo::test::TempDir d{"zo_state_drive_"};
  zo::optim::OptimizerConfig c;
  c.adam.weight_decay = 0.1f;
  c.threads = 2;
  c.state_format = f.state;
  c.master_dtype = f.master;
  c.seed = 9;
  HostOptimizer mem(layout, c);
  c.state_dir = d.path;
  c.state_chunk_elements = 3 * zo::cpu_adam::kQ8Block;
  c.state_slots = 3;
  c.state_queue.kind = kind;
  HostOptimizer drive(layout, c);
  ASSERT_TRUE(drive.on_drive());
  ASSERT_GT(drive.pager()->chunks().size(), 10u);
  const std::size_t n = layout.size();

  std::mt19937 rng(4);
  std::normal_distribution<float> g(0.0f, 0.02f);
  std::vector<float> w(n);
  for (float& x : w)
    x = g(rng);
  // Written in pieces that cross chunk boundaries.
  for (std::size_t b = 0; b < n; b += 5000) {
    const std::size_t e = std::min(n, b + 5000);
    mem.write_master(b, {w.data() + b, e - b});
    drive.write_master(b, {w.data() + b, e - b});
  }
  std::vector<std::uint16_t> grads(n), out_mem(n), out_drive(n);
  for (int step = 1; step <= 4; ++step) {
    for (auto& x : grads)
      x = zo::f32_to_bf16_bits(g(rng));
    const zo::cpu_adam::ConstArrayView gv{grads.data(), n, DType::kBF16};
    for (const auto& r : layout.groups()) {  // group by group, as the offload engine updates
      const auto a = mem.update_range(r.begin, r.end, gv, step, 1e-3f, 0.5f,
                                      {out_mem.data(), n, DType::kBF16});
      const auto b = drive.update_range(r.begin, r.end, gv, step, 1e-3f, 0.5f,
                                        {out_drive.data(), n, DType::kBF16});
      ASSERT_EQ(a.found_nonfinite, b.found_nonfinite);
    }
  }
  EXPECT_EQ(out_mem, out_drive) << "16-bit parameters";
  std::vector<float> x(n), y(n);
  mem.read_master(0, x);
  drive.read_master(0, y);
  ASSERT_EQ(std::memcmp(x.data(), y.data(), n * 4), 0) << "master";
  for (int k = 0; k < 2; ++k) {
    mem.read_moment(k, 0, x);
    drive.read_moment(k, 0, y);
    ASSERT_EQ(std::memcmp(x.data(), y.data(), n * 4), 0) << "moment " << k;
  }
  std::vector<std::uint16_t> as_bf16_mem(n), as_bf16_drive(n);
  mem.copy_master_as(0, n, DType::kBF16, as_bf16_mem.data());
  drive.copy_master_as(0, n, DType::kBF16, as_bf16_drive.data());
  EXPECT_EQ(as_bf16_mem, as_bf16_drive);
  mem.state().step = drive.state().step = 4;
  EXPECT_EQ(drive.find_invalid(layout), "");
  // Damage found on the drive as in memory: a NaN master weight late in the layout.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  mem.write_master(n - 3, {&nan, 1});
  drive.write_master(n - 3, {&nan, 1});
  EXPECT_EQ(drive.find_invalid(layout), mem.find_invalid(layout));
  EXPECT_GT(drive.pager()->bytes_written(), 0u);
  EXPECT_GT(drive.pager()->bytes_read(), 0u);
  EXPECT_THROW(drive.master_data(), std::logic_error) << "no whole array of a state on a drive";
}

TEST(HostOptimizerOnDrive, EqualsMemoryBitForBitInEveryFormatAndQueue) {
  for (const auto kind : {zo::state_io::QueueKind::kThreads, zo::state_io::QueueKind::kAuto}) {
    for (const Format f : {Format{StateFormat::kF32, DType::kF32},
                           {StateFormat::kBF16, DType::kF32},
                           {StateFormat::kQ8, DType::kF32},
                           {StateFormat::kQ8, DType::kBF16}}) {
      SCOPED_TRACE(std::string(zo::state_format_name(f.state)) + " state, " +
                   std::string(zo::dtype_name(f.master)) + " master, queue " +
                   std::to_string(int(kind)));
      compare_runs(f, kind);
    }
  }
}

TEST(HostOptimizerOnDrive, AStateDirThatCannotHoldTheStateIsNamed) {
  const zo::model::ParameterLayout layout(zo::test::odd_spec());
  zo::optim::OptimizerConfig c;
  c.state_dir = "/nonexistent/state";
  try {
    HostOptimizer opt(layout, c);
    ADD_FAILURE() << "no error";
  } catch (const zo::state_io::IoError& e) {
    EXPECT_NE(std::string(e.what()).find("--state-dir /nonexistent/state does not exist"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
