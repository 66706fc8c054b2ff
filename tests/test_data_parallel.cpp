// Data-parallel training as a user launches it: `mpiexec -np N offload_train train`
// on the host backend against one process with the same global batch, resume bit for bit and
// across rank counts, and clear refusals. Skips when the build has no MPI.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "run_binary.h"

namespace {

namespace fs = std::filesystem;
using zo::test::Result;
using zo::test::run_command;

struct TempDir : zo::test::TempDir {
  TempDir() : zo::test::TempDir("zo_dp_") {}
};

#ifdef ZO_MPIEXEC
#define NEED_MPI()
const std::string kMpiexec = std::string(ZO_MPIEXEC) + " --allow-run-as-root --oversubscribe";
#else
#define NEED_MPI() GTEST_SKIP() << "this build has no MPI (libopenmpi-dev, openmpi-bin)"
const std::string kMpiexec;
#endif

const std::string kBin = ZO_OFFLOAD_TRAIN_BIN;
// Small buckets (odd size: shards of unequal length, padding) and --grad-accum 2 (summed on the
// device by default: the host backend's device memory is unlimited). One compute thread per rank
// on a 2-core machine.
const std::string kCommon =
    " train --device host --mode offload --seq-len 32 --steps 6 --grad-accum 2"
    " --bucket-size 30011 --threads 1 --adam-threads 1 --eval-batches 2 -q";

Result ranks(int n, const std::string& args, const std::string& model = "tiny") {
  return run_command(kMpiexec + " -np " + std::to_string(n) + " " + kBin + kCommon + " --model " +
                     model + " --comm-timeout 120 " + args);
}
Result single(const std::string& args, const std::string& model = "tiny") {
  return run_command(kBin + kCommon + " --model " + model + " " + args);
}

std::string bytes_of(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Same losses and norms up to fp32 rounding: the sums over the global batch run in another order.
void expect_close(const std::vector<nlohmann::json>& a, const std::vector<nlohmann::json>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i]["step"], b[i]["step"]);
    EXPECT_EQ(a[i]["tokens"], b[i]["tokens"]) << "the global batch is the same";
    for (const char* k : {"loss", "grad_norm"}) {
      const double x = a[i][k], y = b[i][k];
      EXPECT_NEAR(x, y, 2e-5 * std::abs(x)) << k << " at step " << a[i]["step"];
    }
  }
}

TEST(DataParallel, TwoRanksTrainLikeOneProcessWithTheSameGlobalBatch) {
  NEED_MPI();
  TempDir d;
  for (const std::string extra : {"", "--dpu --dpu-warmup 2"}) {
    SCOPED_TRACE(extra.empty() ? "plain" : extra);
    const fs::path one = d.path / "one.jsonl", two = d.path / "two.jsonl";
    fs::remove(one);
    fs::remove(two);
    const Result s =
        single("--micro-batch 4 --eval-every 3 --metrics " + one.string() + " " + extra);
    ASSERT_EQ(s.code, 0) << s.out;
    const Result r =
        ranks(2, "--micro-batch 2 --eval-every 3 --metrics " + two.string() + " " + extra);
    ASSERT_EQ(r.code, 0) << r.out;
    const auto a = zo::test::read_jsonl(one), b = zo::test::read_jsonl(two);
    expect_close(a, b);
    ASSERT_EQ(a.size(), 6u);
    for (std::size_t i : {2u, 5u}) {  // validation over the same windows
      const double x = a[i]["val_loss"], y = b[i]["val_loss"];
      EXPECT_NEAR(x, y, 2e-5 * x);
    }
    EXPECT_LT(b.back()["loss"].get<double>(), b.front()["loss"].get<double>()) << "it learns";
  }
}

// The Llama family the same way: Qwen2-shaped (q/k/v biases, one kv head, tied head), the fused
// q|k|v and gate|up gradients cut into shards of unequal length by the odd bucket size.
TEST(DataParallel, LlamaFamilyTwoRanksTrainLikeOneProcess) {
  NEED_MPI();
  TempDir d;
  const fs::path one = d.path / "one.jsonl", two = d.path / "two.jsonl";
  const Result s = single("--micro-batch 4 --metrics " + one.string(), "tiny-qwen2");
  ASSERT_EQ(s.code, 0) << s.out;
  const Result r = ranks(2, "--micro-batch 2 --metrics " + two.string(), "tiny-qwen2");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto a = zo::test::read_jsonl(one), b = zo::test::read_jsonl(two);
  expect_close(a, b);
  EXPECT_LT(b.back()["loss"].get<double>(), b.front()["loss"].get<double>()) << "it learns";
}

// Reference losses of a 2-rank job, pinned bit for bit like Trainer.ReferenceLossesArePinned
// (test_train.cpp): restructuring must not change what the ranks compute. Written from what this
// test printed when it was added. Summing the micro-batches on the device (the default) gives the
// gradients of summing them on the host bit for bit; only the norm is summed in another order
// (per bucket), which moved the clip coefficient and these losses in their last digits: the host
// path keeps the values pinned before.
TEST(DataParallel, ReferenceLossesArePinned) {
  NEED_MPI();
  TempDir d;
  const std::vector<std::pair<std::string, std::vector<double>>> cases = {
      {"",
       {5.563388504087925, 5.501355078071356, 5.442388080060482, 5.418829530477524,
        5.454415205866098, 5.4298959374427795}},
      {"--dpu --dpu-warmup 1",
       {5.563388504087925, 5.501355078071356, 5.474414058029652, 5.44677285477519,
        5.467759147286415, 5.437365993857384}},
      {"--grad-accum-on host",
       {5.563388504087925, 5.501355085521936, 5.442388065159321, 5.418829541653395,
        5.454415198415518, 5.4298959374427795}},
      {"--grad-accum-on host --dpu --dpu-warmup 1",
       {5.563388504087925, 5.501355085521936, 5.4744140431284904, 5.446772858500481,
        5.467759162187576, 5.437365997582674}},
  };
  for (const auto& [extra, want] : cases) {
    const fs::path m = d.path / "m.jsonl";
    fs::remove(m);
    const Result r = ranks(2, "--micro-batch 1 --metrics " + m.string() + " " + extra);
    ASSERT_EQ(r.code, 0) << r.out;
    std::vector<double> got;
    std::string text;
    for (const auto& j : zo::test::read_jsonl(m)) {
      got.push_back(j["loss"].get<double>());
      text += j["loss"].dump() + ", ";
    }
    EXPECT_EQ(got, want) << "'" << extra << "': got {" << text << "}";
  }
}

// With fp32 state, and with q8 state (its blocks follow each rank's segments, the same again on
// resume with the same rank count) and a bf16 master (each rank rounds its part stochastically).
TEST(DataParallel, TwoRankResumeEqualsUninterruptedBitForBit) {
  NEED_MPI();
  for (const std::string state : {"fp32", "q8"}) {
    SCOPED_TRACE(state);
    TempDir d;
    const fs::path full = d.path / "full", part = d.path / "part";
    const std::string master = state == "q8" ? "bf16" : "fp32";
    const std::string common =
        "--micro-batch 2 --optimizer-state " + state + " --master-weights " + master;
    Result r =
        ranks(2, common + " --checkpoint-dir " + full.string() +
                     " --checkpoint-every 3 --keep 0 --metrics " + (d.path / "a.jsonl").string());
    ASSERT_EQ(r.code, 0) << r.out;
    const fs::path step3 = full / "step_00000003";
    for (const char* f :
         {"model.safetensors", "optimizer.rank0-of2.safetensors", "optimizer.rank1-of2.safetensors",
          "trainer_state.json", "MANIFEST.json"}) {
      EXPECT_TRUE(fs::exists(step3 / f)) << f;
    }
    const auto manifest = nlohmann::json::parse(bytes_of(step3 / "MANIFEST.json")).dump();
    EXPECT_NE(manifest.find("optimizer.rank1-of2.safetensors"), std::string::npos) << manifest;
    const auto st = nlohmann::json::parse(bytes_of(step3 / "trainer_state.json"));
    EXPECT_EQ(st["optimizer_shards"]["ranks"], 2);
    EXPECT_EQ(st["optimizer_state_dtype"], state);
    EXPECT_EQ(st["master_weights_dtype"], master);

    fs::create_directories(part);
    fs::copy(step3, part / "step_00000003", fs::copy_options::recursive);
    r = ranks(2, "--micro-batch 2 --checkpoint-dir " + part.string() +
                     " --resume latest --metrics " + (d.path / "b.jsonl").string());
    ASSERT_EQ(r.code, 0) << r.out;
    const auto a = zo::test::read_jsonl(d.path / "a.jsonl"),
               b = zo::test::read_jsonl(d.path / "b.jsonl");
    ASSERT_EQ(a.size(), 6u);
    ASSERT_EQ(b.size(), 3u);
    for (std::size_t i = 0; i < 3; ++i) {
      EXPECT_EQ(a[3 + i]["loss"], b[i]["loss"]) << "step " << b[i]["step"];
      EXPECT_EQ(a[3 + i]["grad_norm"], b[i]["grad_norm"]);
    }
    for (const char* f : {"model.safetensors", "optimizer.rank0-of2.safetensors",
                          "optimizer.rank1-of2.safetensors"}) {
      EXPECT_EQ(bytes_of(full / "step_00000006" / f), bytes_of(part / "step_00000006" / f)) << f;
    }
  }
}

// --state-dir with 2 ranks: each rank pages its own share of the state through its own file,
// bit for bit as in memory (losses, norms, the checkpoint's model file and both shards, byte for
// byte), and a resume onto the drives continues the uninterrupted run exactly.
TEST(DataParallel, StateOnADriveTrainsAsInMemory) {
  NEED_MPI();
  for (const std::string flags :
       {"--optimizer-state fp32",
        "--optimizer-state q8 --master-weights bf16 --dpu --dpu-warmup 2"}) {
    SCOPED_TRACE(flags);
    TempDir d;
    const fs::path state = d.path / "state";
    fs::create_directories(state);
    const std::string common = "--micro-batch 2 --checkpoint-every 3 --keep 0 " + flags;
    auto run = [&](const std::string& name, const std::string& extra) {
      const Result r =
          ranks(2, common + " --checkpoint-dir " + (d.path / name).string() + " --metrics " +
                       (d.path / (name + ".jsonl")).string() + " " + extra);
      EXPECT_EQ(r.code, 0) << r.out;
      return zo::test::read_jsonl(d.path / (name + ".jsonl"));
    };
    // Chunks of 3 q8 blocks: 10 or more per rank, more than the 4 staging slots, so every step
    // reads and writes each rank's file (its trace shows the transfers).
    const fs::path trace = d.path / "trace.json";
    const auto mem = run("mem", ""),
               on_drive = run("drive", "--state-dir " + state.string() +
                                           " --state-chunk 6144 --trace " + trace.string());
    for (const fs::path& t : {trace, d.path / "trace.rank1.json"}) {
      const std::string events = bytes_of(t);
      EXPECT_NE(events.find("\"read chunk 9\""), std::string::npos) << t;
      EXPECT_NE(events.find("\"write chunk 9\""), std::string::npos) << t;
    }
    ASSERT_EQ(mem.size(), 6u);
    ASSERT_EQ(on_drive.size(), 6u);
    for (std::size_t i = 0; i < 6; ++i) {
      EXPECT_EQ(mem[i]["loss"], on_drive[i]["loss"]) << "step " << i + 1;
      EXPECT_EQ(mem[i]["grad_norm"], on_drive[i]["grad_norm"]) << "step " << i + 1;
    }
    for (const char* f : {"model.safetensors", "optimizer.rank0-of2.safetensors",
                          "optimizer.rank1-of2.safetensors"}) {
      for (const char* step : {"step_00000003", "step_00000006"}) {
        EXPECT_EQ(bytes_of(d.path / "mem" / step / f), bytes_of(d.path / "drive" / step / f))
            << step << "/" << f;
      }
    }
    fs::create_directories(d.path / "resumed");
    fs::copy(d.path / "drive" / "step_00000003", d.path / "resumed" / "step_00000003",
             fs::copy_options::recursive);
    const auto resumed =
        run("resumed", "--resume latest --state-chunk 6144 --state-dir " + state.string());
    ASSERT_EQ(resumed.size(), 3u);
    for (std::size_t i = 0; i < 3; ++i)
      EXPECT_EQ(resumed[i]["loss"], on_drive[3 + i]["loss"]) << "step " << i + 4;
    EXPECT_TRUE(fs::is_empty(state)) << "nothing left in --state-dir";
  }
}

TEST(DataParallel, ResumesWithAnotherRankCountAtTheSameGlobalBatch) {
  NEED_MPI();
  TempDir d;
  // Reference: one process throughout.
  Result r = single("--micro-batch 4 --checkpoint-dir " + (d.path / "one").string() +
                    " --checkpoint-every 3 --keep 0 --metrics " + (d.path / "ref.jsonl").string());
  ASSERT_EQ(r.code, 0) << r.out;
  r = ranks(2, "--micro-batch 2 --checkpoint-dir " + (d.path / "two").string() +
                   " --checkpoint-every 3 --keep 0 --metrics " + (d.path / "two.jsonl").string());
  ASSERT_EQ(r.code, 0) << r.out;
  const auto ref = zo::test::read_jsonl(d.path / "ref.jsonl");
  // 2 ranks -> 1 process (shards re-partitioned) and 1 process -> 2 ranks (whole file split).
  const struct {
    const char* from;
    int n;
    const char* mb;
  } cases[] = {{"two", 1, "4"}, {"one", 2, "2"}};
  for (const auto& c : cases) {
    SCOPED_TRACE(std::string("from ") + c.from + " to " + std::to_string(c.n));
    const fs::path dir = d.path / (std::string("resume_") + c.from);
    fs::create_directories(dir);
    fs::copy(d.path / c.from / "step_00000003", dir / "step_00000003", fs::copy_options::recursive);
    const std::string m = (dir / "m.jsonl").string();
    const std::string args = std::string("--micro-batch ") + c.mb + " --checkpoint-dir " +
                             dir.string() + " --resume latest --metrics " + m;
    r = c.n == 1 ? single(args) : ranks(c.n, args);
    ASSERT_EQ(r.code, 0) << r.out;
    expect_close(std::vector<nlohmann::json>(ref.begin() + 3, ref.end()), zo::test::read_jsonl(m));
  }
  // A different global batch would read other windows: refused, naming both.
  const fs::path dir = d.path / "resume_bad";
  fs::create_directories(dir);
  fs::copy(d.path / "two" / "step_00000003", dir / "step_00000003", fs::copy_options::recursive);
  r = ranks(2, "--micro-batch 1 --checkpoint-dir " + dir.string() + " --resume latest");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("global batch"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(dir / "step_00000006"));
}

TEST(DataParallel, MismatchedFlagsAreRefusedOnEveryRank) {
  NEED_MPI();
  TempDir d;
  const std::string ck = " --micro-batch 2 --checkpoint-dir " + (d.path / "ck").string();
  const Result r = run_command(kMpiexec + " -np 1 " + kBin + kCommon + ck + " --lr 1e-3 : -np 1 " +
                               kBin + kCommon + ck + " --lr 2e-3");
  EXPECT_NE(r.code, 0);
  std::size_t errors = 0;
  for (std::size_t p = r.out.find("ranks disagree"); p != std::string::npos;
       p = r.out.find("ranks disagree", p + 1))
    ++errors;
  EXPECT_EQ(errors, 2u) << "both ranks say why:\n" << r.out;
  EXPECT_NE(r.out.find("\"lr\""), std::string::npos) << "names the field:\n" << r.out;
  EXPECT_FALSE(fs::exists(d.path / "ck")) << "nothing written";
}

// Each rank checks its own --trace file; one refused (another run's file) stops every rank
// before the first step, with no hang, and that file keeps its bytes.
TEST(DataParallel, ATraceFileRefusedOnOneRankStopsEveryRank) {
  NEED_MPI();
  TempDir d;
  const fs::path rank1 = d.path / "trace.rank1.json";
  { std::ofstream(rank1) << "another run's trace"; }
  const Result r = run_command("timeout 120 " + kMpiexec + " -np 2 " + kBin + kCommon +
                               " --micro-batch 2 --trace " + (d.path / "trace.json").string());
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.code, 124) << "the job hung:\n" << r.out;
  EXPECT_NE(r.out.find("trace.rank1.json' already exists"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("another rank's --trace file was refused"), std::string::npos) << r.out;
  EXPECT_EQ(bytes_of(rank1), "another run's trace");
  EXPECT_FALSE(fs::exists(d.path / "trace.json"));
}

// A rank that stops responding (ZO_TEST_STALL=<rank>:<step> sleeps for 4 x --comm-timeout):
// the other ends the whole job after about one timeout, naming the cause; the checkpoints
// written before stay complete and resumable.
TEST(DataParallel, AHungRankEndsTheJobWithAClearMessage) {
  NEED_MPI();
  TempDir d;
  const std::string ck = " --micro-batch 2 --checkpoint-dir " + (d.path / "ck").string();
  const Result r =
      run_command("ZO_TEST_STALL=1:3 timeout 120 " + kMpiexec + " -x ZO_TEST_STALL -np 2 " + kBin +
                  kCommon + ck + " --checkpoint-every 1 --comm-timeout 3");
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.code, 124) << "the job hung:\n" << r.out;
  EXPECT_NE(r.out.find("did not complete within 3"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("another rank has died, stopped"), std::string::npos) << r.out;
  EXPECT_TRUE(fs::exists(d.path / "ck" / "step_00000002" / "MANIFEST.json"));
  EXPECT_FALSE(fs::exists(d.path / "ck" / "step_00000003"));
  const Result resumed = ranks(2, ck + " --resume latest");
  EXPECT_EQ(resumed.code, 0) << resumed.out;
  EXPECT_TRUE(fs::exists(d.path / "ck" / "step_00000006" / "MANIFEST.json"));
}

TEST(DataParallel, RankEnvironmentWithoutMpirunIsRefused) {
  NEED_MPI();
  TempDir d;
  const Result r = run_command("env ZO_RANK=0 ZO_WORLD_SIZE=2 " + kBin + kCommon +
                               " --micro-batch 2 --checkpoint-dir " + (d.path / "ck").string());
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("mpirun -np 2"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(d.path / "ck"));
}

}  // namespace
