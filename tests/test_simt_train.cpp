// The whole CUDA path in CI: `offload_train_simt train --device cuda` is the real trainer linked
// against the SIMT emulator's build of gpu/ (its kernels on the CPU, a fake runtime whose streams
// are threads, a reference cuBLASLt), compared with `offload_train --device host` on the same
// weights and data. Tolerances, per step, relative to the host's value:
//   fp32 loss 1e-5, gradient norm 1e-4 (the same arithmetic in another order);
//   bf16/fp16 loss 2e-2, gradient norm 1e-1 (activations and gradients rounded to 8 or 11 bits);
//   resuming a checkpoint gives the uninterrupted run's losses exactly.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "run_binary.h"

namespace {

namespace fs = std::filesystem;
using zo::test::run_command;
using zo::test::TempDir;

struct Steps {
  std::vector<double> loss, grad_norm, loss_scale;
  std::vector<bool> skipped;
};

// A short run of `model` (the `tiny` GPT-2 by default) on the synthetic task; `extra` picks
// device, dtype and mode.
Steps train(const char* binary, const std::string& extra, const fs::path& dir,
            const std::string& name, const std::string& model = "tiny") {
  const fs::path metrics = dir / (name + ".jsonl");
  fs::remove(metrics);  // runs of the same name replace each other's metrics
  const std::string cmd = std::string(binary) + " train --model " + model +
                          " -b 2 --seq-len 32 --seed 5 --lr 3e-3 --warmup 2"
                          " --eval-batches 1 -q --metrics " +
                          metrics.string() + " " + extra;
  const auto r = run_command(cmd);
  EXPECT_EQ(r.code, 0) << cmd << "\n" << r.out;
  Steps run;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    run.loss.push_back(j.at("loss").get<double>());
    // A skipped step's norm is not finite, which JSON writes as null.
    const auto& norm = j.at("grad_norm");
    run.grad_norm.push_back(norm.is_null() ? std::nan("") : norm.get<double>());
    run.loss_scale.push_back(j.at("loss_scale").get<double>());
    run.skipped.push_back(j.at("skipped").get<bool>());
  }
  return run;
}

Steps emulated(const std::string& extra, const fs::path& dir, const std::string& name,
               const std::string& model = "tiny") {
  return train(ZO_OFFLOAD_TRAIN_SIMT_BIN, "--device cuda " + extra, dir, name, model);
}

Steps host(const std::string& extra, const fs::path& dir, const std::string& name,
           const std::string& model = "tiny") {
  return train(ZO_OFFLOAD_TRAIN_BIN, "--device host --precision fp32 " + extra, dir, name, model);
}

void expect_close(const std::vector<double>& got, const std::vector<double>& want, double rel,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  ASSERT_FALSE(got.empty()) << what;
  for (std::size_t i = 0; i < got.size(); ++i) {
    EXPECT_TRUE(std::isfinite(got[i])) << what << " step " << i + 1;
    EXPECT_LE(std::abs(got[i] - want[i]), rel * std::abs(want[i]))
        << what << " step " << i + 1 << ": " << got[i] << " vs host " << want[i];
  }
}

void expect_matches_host(const Steps& gpu, const Steps& ref, double loss_rel, double norm_rel,
                         const std::string& what) {
  expect_close(gpu.loss, ref.loss, loss_rel, what + " loss");
  expect_close(gpu.grad_norm, ref.grad_norm, norm_rel, what + " grad norm");
}

class SimtTrain : public ::testing::Test {
 protected:
  TempDir dir_{"zo_simt_train_"};
};

TEST_F(SimtTrain, ResidentFp32MatchesTheHostBackend) {
  const std::string args = "--steps 5 --mode resident";
  expect_matches_host(emulated(args + " --precision fp32", dir_.path, "gpu"),
                      host(args, dir_.path, "host"), 1e-5, 1e-4, "fp32 resident");
}

TEST_F(SimtTrain, ResidentBf16MatchesTheHostBackend) {
  const std::string args = "--steps 5 --mode resident";
  expect_matches_host(emulated(args + " --precision bf16", dir_.path, "gpu"),
                      host(args, dir_.path, "host"), 2e-2, 1e-1, "bf16 resident");
  // Several micro-batches: their bf16 gradients summed in fp32 on the device.
  const std::string accum = args + " --grad-accum 3";
  expect_matches_host(emulated(accum + " --precision bf16", dir_.path, "gpu"),
                      host(accum, dir_.path, "host"), 2e-2, 1e-1, "bf16 resident, accumulation");
}

// CUDA Graphs (on by default) change no result: resident runs replaying the recordings equal runs
// launching kernel by kernel, bit for bit, for both families, with micro-batches summed in fp32,
// and with an fp16 loss scale that doubles every two steps (each new scale a new recording).
TEST_F(SimtTrain, CudaGraphsChangeNoResult) {
  for (const std::string model : {"tiny", "tiny-llama"}) {
    for (const std::string args :
         {"--mode resident --precision bf16 --grad-accum 2 --steps 5",
          "--mode resident --precision fp16 --loss-scale dynamic --loss-scale-window 2 "
          "--steps 6"}) {
      SCOPED_TRACE(model + " " + args);
      const Steps graphs = emulated(args, dir_.path, "graphs", model);
      const Steps eager = emulated(args + " --no-cuda-graphs", dir_.path, "eager", model);
      ASSERT_FALSE(graphs.loss.empty());
      EXPECT_EQ(graphs.loss, eager.loss);
      EXPECT_EQ(graphs.grad_norm, eager.grad_norm);
      EXPECT_EQ(graphs.loss_scale, eager.loss_scale);
    }
  }
}

// The Llama family through the same binary: GQA, RoPE, RMSNorm and SwiGLU on the emulated GPU,
// resident and offloaded.
TEST_F(SimtTrain, LlamaFamilyMatchesTheHostBackend) {
  for (const std::string model : {"tiny-llama", "tiny-qwen2"}) {
    for (const std::string mode : {"--mode resident", "--mode offload --dpu --dpu-warmup 2"}) {
      const std::string args = "--steps 4 " + mode;
      expect_matches_host(emulated(args + " --precision bf16", dir_.path, "gpu", model),
                          host(args, dir_.path, "host", model), 2e-2, 1e-1,
                          model + " bf16 " + mode);
    }
  }
}

TEST_F(SimtTrain, OffloadMatchesTheHostBackendWithAndWithoutDpuAndAccumulation) {
  for (const std::string mode :
       {"--mode offload", "--mode offload --dpu --dpu-warmup 2", "--mode offload --grad-accum 2"}) {
    const std::string args = "--steps 5 " + mode;
    expect_matches_host(emulated(args + " --precision bf16", dir_.path, "gpu"),
                        host(args, dir_.path, "host"), 2e-2, 1e-1, "bf16 " + mode);
  }
}

// Stream mode on the emulated GPU (a window of 2 of a 4-block model's blocks, each copied into a
// slot ahead of the pass that reads it) trains like offload mode bit for bit: GPT-2 (tied head)
// and Llama (untied), bf16, recompute, micro-batches summed on the host.
TEST_F(SimtTrain, StreamModeEqualsOffloadBitForBit) {
  const fs::path gpt = dir_.path / "gpt_4_blocks.json", llama = dir_.path / "llama_4_blocks.json";
  std::ofstream(gpt) << R"({"n_layer": 4, "n_head": 2, "n_embd": 64, "vocab_size": 256,
                            "block_size": 64})";
  std::ofstream(llama) << R"({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 4,
      "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 96,
      "vocab_size": 256, "max_position_embeddings": 64, "tie_word_embeddings": false})";
  for (const fs::path& model : {gpt, llama}) {
    SCOPED_TRACE(model.filename().string());
    const std::string args =
        "--steps 3 --precision bf16 --recompute --grad-accum 2 --grad-accum-on host";
    const Steps offload = emulated(args + " --mode offload", dir_.path, "offload", model.string());
    const Steps stream =
        emulated(args + " --mode stream --param-window 2", dir_.path, "stream", model.string());
    ASSERT_EQ(offload.loss.size(), 3u);
    EXPECT_EQ(stream.loss, offload.loss);
    EXPECT_EQ(stream.grad_norm, offload.grad_norm);
  }
}

// --grad-accum 3 in offload mode, bf16: micro-batches summed on the device (the fp32 sum rounded
// once) and on the host (fp32 sums read by CPU Adam), each against the host backend, and against
// each other: the first step's loss is the same computation, then the updates differ by Adam of
// gradients one rounding apart (2^-8 relative per element).
TEST_F(SimtTrain, OffloadAccumulationOnTheDeviceMatchesTheHostPath) {
  const std::string args = "--steps 4 --mode offload --grad-accum 3";
  const Steps on_device =
      emulated(args + " --precision bf16 --grad-accum-on device", dir_.path, "device");
  const Steps on_host =
      emulated(args + " --precision bf16 --grad-accum-on host", dir_.path, "host_accum");
  const Steps ref = host(args, dir_.path, "host");
  expect_matches_host(on_device, ref, 2e-2, 1e-1, "bf16, summed on the device");
  expect_matches_host(on_host, ref, 2e-2, 1e-1, "bf16, summed on the host");
  ASSERT_FALSE(on_device.loss.empty());
  EXPECT_EQ(on_device.loss[0], on_host.loss[0]);
  expect_matches_host(on_device, on_host, 1e-3, 1e-2, "summed on the device vs on the host");
}

// The dynamic scale doubles after every clean step until an fp16 gradient overflows: that step
// is skipped (nothing changes, the scale halves) and training goes on. `args` picks the mode.
void expect_fp16_overflow_skipped(const std::string& args, const fs::path& dir) {
  const Steps gpu =
      emulated(args + " --precision fp16 --loss-scale-window 1 --loss-scale-max 1e30", dir, "gpu");
  const Steps ref = host(args, dir, "host");
  ASSERT_EQ(gpu.loss.size(), 10u);
  std::size_t first_skip = gpu.skipped.size();
  for (std::size_t i = 0; i < gpu.skipped.size(); ++i) {
    if (gpu.skipped[i] && first_skip == gpu.skipped.size()) first_skip = i;
  }
  ASSERT_LT(first_skip, gpu.skipped.size()) << "no fp16 overflow in 10 doublings of the scale";
  ASSERT_GT(first_skip, 0u) << "the first step overflowed at the initial scale";
  EXPECT_EQ(gpu.loss_scale[first_skip], 2.0 * gpu.loss_scale[first_skip - 1])
      << "the scale doubles after every clean step";
  if (first_skip + 1 < gpu.loss_scale.size()) {
    EXPECT_EQ(gpu.loss_scale[first_skip + 1], gpu.loss_scale[first_skip] / 2)
        << "the scale halves after the overflow";
  }
  for (std::size_t i = 0; i < first_skip; ++i) {  // identical schedule up to the overflow
    EXPECT_LE(std::abs(gpu.loss[i] - ref.loss[i]), 2e-2 * ref.loss[i]) << "step " << i + 1;
  }
  EXPECT_TRUE(std::isfinite(gpu.loss.back()));
  EXPECT_LT(gpu.loss.back(), gpu.loss.front());
}

TEST_F(SimtTrain, Fp16OverflowStepIsSkippedAndTrainingContinues) {
  expect_fp16_overflow_skipped("--steps 10 --mode resident", dir_.path);
}

// The same with offload mode summing --grad-accum 3 on the device: the overflow of any micro-
// batch, or of the rounded sum, skips the step.
TEST_F(SimtTrain, Fp16OverflowIsSkippedWithOffloadAccumulationOnTheDevice) {
  expect_fp16_overflow_skipped("--steps 10 --mode offload --grad-accum 3 --grad-accum-on device",
                               dir_.path);
}

// Stopping at step 3 and resuming gives the same steps 4..6 as the uninterrupted run.
// An error mid-step (ZO_TEST_ERROR_STEP, once the step is enqueued) unwinds while the emulated
// GPU's streams still run it: no device block goes back to the caching allocator, and no
// page-locked buffer is unregistered, while queued work still uses it (the emulator aborts,
// naming the work, if one does: streams.h, check_released).
TEST_F(SimtTrain, AnErrorMidStepWaitsForTheStreamsBeforeFreeing) {
  for (const std::string mode :
       {"--mode resident", "--mode resident --no-cuda-graphs", "--mode offload",
        "--mode offload --dpu --dpu-warmup 1", "--mode offload --grad-accum 2"}) {
    const auto r = run_command("ZO_TEST_ERROR_STEP=3 " + std::string(ZO_OFFLOAD_TRAIN_SIMT_BIN) +
                               " train --device cuda --model tiny -b 4 --seq-len 64 -q " +
                               "--steps 4 " + mode);
    EXPECT_EQ(r.code, 1) << mode << "\n" << r.out;
    EXPECT_NE(r.out.find("an error injected at step 3"), std::string::npos) << mode << r.out;
    EXPECT_EQ(r.out.find("SIMT emulator"), std::string::npos) << mode << "\n" << r.out;
  }
}

TEST_F(SimtTrain, CheckpointAndResumeAreExact) {
  for (const std::string mode : {"resident", "offload"}) {
    const std::string args = "--steps 6 --precision bf16 --mode " + mode;
    const fs::path ckpt = dir_.path / ("ckpt_" + mode);
    const Steps full = emulated(args, dir_.path, "full_" + mode);
    emulated(args + " --checkpoint-dir " + ckpt.string() + " --checkpoint-every 3", dir_.path,
             "first_" + mode);
    const Steps resumed = emulated(args + " --checkpoint-dir " + ckpt.string() + " --resume " +
                                       (ckpt / "step_00000003").string(),
                                   dir_.path, "resumed_" + mode);
    ASSERT_EQ(full.loss.size(), 6u) << mode;
    ASSERT_EQ(resumed.loss.size(), 3u) << mode;
    for (std::size_t i = 0; i < 3; ++i)
      EXPECT_EQ(resumed.loss[i], full.loss[i + 3]) << mode << " step " << i + 4;
  }
}

// The checkpoint keeps the timed GEMM algorithm choices and a resumed run takes them. The
// emulator's candidates compute the same bits, so the choices are compared, not the losses: the
// first run's timing is steered to candidate 2, the resumed run's to candidate 0.
TEST_F(SimtTrain, AResumedRunTakesTheCheckpointsGemmChoices) {
  const std::string args =
      " train --model tiny -b 2 --seq-len 32 --seed 5 --eval-batches 1 -q"
      " --device cuda --precision bf16 --mode resident --checkpoint-every 2";
  const fs::path first = dir_.path / "gemm_first", second = dir_.path / "gemm_resumed";
  const auto r1 = run_command("ZO_SIMT_CUBLASLT_ALGORITHMS=3 ZO_SIMT_CUBLASLT_FASTEST=2 " +
                              std::string(ZO_OFFLOAD_TRAIN_SIMT_BIN) + args +
                              " --steps 2 --checkpoint-dir " + first.string());
  ASSERT_EQ(r1.code, 0) << r1.out;
  auto choices = [](const fs::path& ckpt) {
    std::ifstream in(ckpt / "trainer_state.json");
    return nlohmann::json::parse(in).value("gemm_choices", std::string());
  };
  const std::string saved = choices(first / "step_00000002");
  ASSERT_NE(saved.find("offload_train matmul choices 1"), std::string::npos) << saved;

  const auto r2 =
      run_command("ZO_SIMT_CUBLASLT_ALGORITHMS=3 ZO_SIMT_CUBLASLT_FASTEST=0 " +
                  std::string(ZO_OFFLOAD_TRAIN_SIMT_BIN) +
                  std::regex_replace(args, std::regex(" -q"), "") + " --steps 4 --checkpoint-dir " +
                  second.string() + " --resume " + (first / "step_00000002").string());
  ASSERT_EQ(r2.code, 0) << r2.out;
  EXPECT_NE(r2.out.find("GEMM algorithms: the checkpointed run's timed choices"), std::string::npos)
      << r2.out;
  const std::string resumed = choices(second / "step_00000004");
  std::istringstream lines(saved);
  for (std::string line; std::getline(lines, line);)
    EXPECT_NE(resumed.find(line + "\n"), std::string::npos) << "not kept: " << line;
}

}  // namespace

// eval on the GPU (the inference model, page-locked loss copies, the validation forward) scores
// what the host backend scores, in fp32 and bf16, for GPT-2 and Llama.
TEST_F(SimtTrain, EvalOnTheGpuMatchesTheHost) {
  for (const std::string model : {"tiny", "tiny-llama"}) {
    SCOPED_TRACE(model);
    const fs::path ckpt = dir_.path / ("eval_" + model);
    train(ZO_OFFLOAD_TRAIN_BIN,
          "--device host --precision fp32 --steps 4 --checkpoint-dir " + ckpt.string(), dir_.path,
          "eval_" + model, model);
    const std::string eval = " eval --checkpoint latest --checkpoint-dir " + ckpt.string() +
                             " --data synthetic -b 2 --seq-len 32 --batches 3 --json ";
    auto loss = [&](const char* binary, const std::string& device) {
      const auto r = run_command(std::string(binary) + eval + device);
      EXPECT_EQ(r.code, 0) << r.out;
      return r.code == 0 ? nlohmann::json::parse(r.out).at("loss").get<double>() : std::nan("");
    };
    const double host = loss(ZO_OFFLOAD_TRAIN_BIN, "--device host");
    const double fp32 = loss(ZO_OFFLOAD_TRAIN_SIMT_BIN, "--device cuda --precision fp32");
    const double bf16 = loss(ZO_OFFLOAD_TRAIN_SIMT_BIN, "--device cuda --precision bf16");
    EXPECT_NEAR(fp32, host, 1e-6 * host);
    EXPECT_NEAR(bf16, host, 1e-3 * host);
  }
}

// `sample --device cuda` on the emulated GPU: in fp32 its greedy tokens equal the host backend's
// (the same logits to rounding), for GPT-2 and the Llama family; in bf16 it generates from the
// same checkpoint too.
TEST_F(SimtTrain, SampleOnTheGpuMatchesTheHost) {
  for (const std::string model : {"tiny", "tiny-llama"}) {
    SCOPED_TRACE(model);
    const fs::path ckpt = dir_.path / ("sample_" + model);
    train(ZO_OFFLOAD_TRAIN_BIN,
          "--device host --precision fp32 --steps 8 --checkpoint-dir " + ckpt.string(), dir_.path,
          "sample_" + model, model);
    const std::string sample = " sample --checkpoint latest --checkpoint-dir " + ckpt.string() +
                               " --temperature 0 -n 12 --ids --prompt-tokens 5,9,2 ";
    const auto host = run_command(std::string(ZO_OFFLOAD_TRAIN_BIN) + sample + "--device host");
    const auto gpu = run_command(std::string(ZO_OFFLOAD_TRAIN_SIMT_BIN) + sample +
                                 "--device cuda --precision fp32");
    const auto bf16 = run_command(std::string(ZO_OFFLOAD_TRAIN_SIMT_BIN) + sample +
                                  "--device cuda --precision bf16 --context 8");
    ASSERT_EQ(host.code, 0) << host.out;
    ASSERT_EQ(gpu.code, 0) << gpu.out;
    ASSERT_EQ(bf16.code, 0) << bf16.out;
    EXPECT_EQ(gpu.out, host.out);
    const std::regex twelve_ids("^[0-9]+(,[0-9]+){11}\n$");
    EXPECT_TRUE(std::regex_search(host.out, twelve_ids)) << host.out;
    EXPECT_TRUE(std::regex_search(bf16.out, twelve_ids)) << bf16.out;
  }
}
