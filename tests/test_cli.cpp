// The offload_train binary as a user runs it: --help agrees with the README, a train / resume /
// export / eval / sample session works, and bad input exits non-zero with a clear message.
#include <gtest/gtest.h>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/safetensors.h"
#include "checkpoint_edit.h"
#include "file_size_limit.h"
#include "model/layout.h"
#include "model/spec.h"
#include "run_binary.h"

namespace {

namespace fs = std::filesystem;

using zo::test::Result;

Result run(const std::string& args) {
  return zo::test::run_command(std::string(ZO_OFFLOAD_TRAIN_BIN) + " " + args);
}

std::set<std::string> flags_in(const std::string& text) {
  std::set<std::string> out;
  const std::regex re("--[a-z][a-z0-9-]*");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), re); it != std::sregex_iterator();
       ++it) {
    out.insert(it->str());
  }
  out.erase("--help");
  return out;
}

// The code block after the README heading "### `offload_train <sub>`".
std::string readme_block(const std::string& sub) {
  std::ifstream in(std::string(ZO_SOURCE_DIR) + "/README.md");
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  const std::string heading = "### `offload_train " + sub + "`";
  const auto h = text.find(heading);
  if (h == std::string::npos) return {};
  const auto b = text.find("```", h);
  const auto e = text.find("```", b + 3);
  return text.substr(b + 3, e - b - 3);
}

struct TempDir : zo::test::TempDir {
  TempDir() : zo::test::TempDir("zo_cli_") {}
};

TEST(Cli, HelpMatchesTheReadme) {
  for (const std::string sub : {"train", "plan", "export", "eval", "sample", "tokenize", "info"}) {
    const std::string block = readme_block(sub);
    ASSERT_FALSE(block.empty()) << "README has no section for " << sub;
    const Result r = run(sub + " --help");
    EXPECT_EQ(r.code, 0);
    EXPECT_EQ(flags_in(r.out), flags_in(block)) << "offload_train " << sub << " --help vs README";
  }
  const Result top = run("--help");
  for (const char* sub : {"train", "plan", "export", "eval", "sample", "tokenize", "info"}) {
    EXPECT_NE(top.out.find(sub), std::string::npos);
  }
}

TEST(Cli, TrainResumeExportSample) {
  TempDir d;
  const std::string ckpt = (d.path / "ckpt").string(), metrics = (d.path / "m.jsonl").string();
  Result r = run("train --steps 3 --seq-len 32 -b 2 --checkpoint-dir " + ckpt + " --metrics " +
                 metrics + " --eval-batches 1");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("step      3/3"), std::string::npos) << r.out;
  {
    std::ifstream in(metrics);
    std::string line;
    int n = 0;
    while (std::getline(in, line)) {
      const auto j = nlohmann::json::parse(line);
      ++n;
      EXPECT_EQ(j["step"], n);
      for (const char* k : {"loss", "lr", "grad_norm", "tokens", "tokens_per_s", "step_ms",
                            "forward_ms", "backward_ms", "d2h_ms", "adam_ms", "h2d_ms",
                            "d2h_exposed_ms", "adam_exposed_ms", "h2d_exposed_ms"}) {
        EXPECT_TRUE(j.contains(k)) << k;
      }
    }
    EXPECT_EQ(n, 3);
  }
  r = run("train --steps 5 --seq-len 32 -b 2 --checkpoint-dir " + ckpt + " --resume latest " +
          "--metrics " + metrics + " --eval-batches 1");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("resumed from"), std::string::npos) << r.out;
  EXPECT_TRUE(fs::exists(fs::path(ckpt) / "step_00000005" / "MANIFEST.json"));

  const std::string out = (d.path / "w.safetensors").string();
  r = run("export --checkpoint latest --checkpoint-dir " + ckpt + " -o " + out + " --dtype bf16");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto size = fs::file_size(out);
  r = run("export --checkpoint latest --checkpoint-dir " + ckpt + " -o " + out);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("--force"), std::string::npos) << r.out;
  EXPECT_EQ(fs::file_size(out), size) << "refused export must not touch the file";

  r = run("sample --checkpoint latest --checkpoint-dir " + ckpt +
          " --ids -n 5 --prompt-tokens 1,2");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex("^[0-9]+(,[0-9]+){4}\n$"))) << r.out;
  r = run("sample --init-from " + out +
          " --model tiny --temperature 0 -n 4 --ids --prompt-tokens 3");
  ASSERT_EQ(r.code, 0) << r.out;
  // A lone weights file has no config.json beside it to take the model from.
  for (const std::string cmd : {"sample --ids -n 1 --prompt-tokens 3", "train --steps 1"}) {
    r = run(cmd + " --init-from " + out);
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_NE(r.out.find("no config.json beside the weights"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("pass --model"), std::string::npos) << r.out;
  }
  // A path that is not there is named as such, not as a missing config.json.
  r = run("train --steps 1 --init-from " + out + ".missing");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find(out + ".missing' does not exist"), std::string::npos) << r.out;
}

// Trains two steps of the tiny model into `ckpt`; the export command that reads its newest.
std::string export_of_a_tiny_run(const std::string& ckpt) {
  const Result r =
      run("train --model tiny --steps 2 --seq-len 32 -b 2 -q --checkpoint-dir " + ckpt);
  EXPECT_EQ(r.code, 0) << r.out;
  return "export --checkpoint latest --checkpoint-dir " + ckpt + " ";
}

// export -o DIR: a Hugging Face model directory, sharded at --shard-size, that --init-from and
// --model read back; an existing directory is written into only with --force, which replaces the
// previous export's weights and keeps other files.
TEST(Cli, ExportWritesAHuggingFaceDirectory) {
  TempDir d;
  const std::string ckpt = (d.path / "ckpt").string();
  const std::string exp = export_of_a_tiny_run(ckpt);
  const fs::path out = d.path / "hf";
  Result r = run(exp + "-o " + out.string() + " --shard-size 100KB --dtype bf16");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("model.safetensors.index.json"), std::string::npos) << r.out;
  std::ifstream index_in(out / "model.safetensors.index.json");
  const auto index = nlohmann::json::parse(index_in);
  std::set<std::string> shards;
  for (const auto& [tensor, file] : index.at("weight_map").items())
    shards.insert(file.get<std::string>());
  EXPECT_GT(shards.size(), 1u);
  for (const auto& f : shards)
    EXPECT_TRUE(fs::exists(out / f)) << f;
  std::ifstream config_in(out / "config.json");
  EXPECT_EQ(nlohmann::json::parse(config_in).at("torch_dtype"), "bfloat16");

  // The directory, its index and its config.json are accepted where weights and specs go.
  r = run("train --model " + (out / "config.json").string() + " --init-from " + out.string() +
          " --steps 1 --seq-len 32 -b 2 -q");
  EXPECT_EQ(r.code, 0) << r.out;
  r = run("sample --model tiny --init-from " + (out / "model.safetensors.index.json").string() +
          " -n 2 --ids --prompt-tokens 1");
  EXPECT_EQ(r.code, 0) << r.out;
  // Without --model, the model comes from the config.json beside the weights.
  r = run("train --init-from " + out.string() + " --steps 1 --seq-len 32 -b 2");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("model from " + (out / "config.json").string()), std::string::npos) << r.out;
  r = run("sample --init-from " + (out / "model.safetensors.index.json").string() +
          " -n 2 --ids --prompt-tokens 1");
  EXPECT_EQ(r.code, 0) << r.out;

  // Not again without --force; nothing changes.
  std::ofstream(out / "tokenizer.json") << "{}";
  const auto first = fs::last_write_time(out / "config.json");
  r = run(exp + "-o " + out.string());
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("is a directory that is not empty; pass --force"), std::string::npos)
      << r.out;
  EXPECT_EQ(fs::last_write_time(out / "config.json"), first);
  // With --force, one model.safetensors replaces the shards and the index.
  r = run(exp + "-o " + out.string() + " --force");
  ASSERT_EQ(r.code, 0) << r.out;
  std::set<std::string> now;
  for (const auto& e : fs::directory_iterator(out))
    now.insert(e.path().filename().string());
  EXPECT_EQ(now, (std::set<std::string>{"config.json", "model.safetensors", "tokenizer.json"}));

  const std::pair<std::string, std::string> refused[] = {
      {"-o " + (d.path / "w.safetensors").string() + " --shard-size 1MB",
       "--shard-size applies to a directory output"},
      {"-o " + (d.path / "dir2").string() + " --shard-size 0",
       "--shard-size '0' is not positive: a size is 1 byte to below 16 EiB"},
      {"-o " + (out / "model.safetensors").string() + "x", "exists and is not a directory"},
      {"-o " + (fs::path(ckpt) / "step_00000002").string() + " --force",
       "inside the checkpoint directory"},
  };
  std::ofstream(out / "model.safetensorsx") << "a file";
  for (const auto& [args, want] : refused) {
    r = run(exp + args);
    EXPECT_EQ(r.code, 1) << args << "\n" << r.out;
    EXPECT_NE(r.out.find(want), std::string::npos) << args << "\n" << r.out;
  }
  EXPECT_FALSE(fs::exists(fs::path(ckpt) / "step_00000002" / "config.json"));
}

// An export that fails half way (a full disk: here a file-size limit) leaves the previous export
// in the directory whole, and a fresh directory is not left behind half written.
TEST(Cli, AFailedExportLeavesThePreviousOneWhole) {
  TempDir d;
  const std::string ckpt = (d.path / "ckpt").string();
  const std::string exp = export_of_a_tiny_run(ckpt);
  const fs::path out = d.path / "hf", fresh = d.path / "fresh";
  Result r = run(exp + "-o " + out.string() + " --shard-size 100KB");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto contents = [](const fs::path& dir) {
    std::map<std::string, std::string> files;
    for (const auto& e : fs::directory_iterator(dir)) {
      std::ifstream in(e.path(), std::ios::binary);
      files[e.path().filename().string()] = {std::istreambuf_iterator<char>(in), {}};
    }
    return files;
  };
  const auto before = contents(out);
  {
    // One model.safetensors of the tiny model in fp32 (~480 KB) cannot be written; its shards
    // of 100 KB and the config could.
    zo::test::FileSizeLimit limit(300 << 10);
    if (!limit.active()) GTEST_SKIP() << "cannot lower RLIMIT_FSIZE here";
    r = run(exp + "-o " + out.string() + " --force");
    EXPECT_EQ(r.code, 1) << r.out;
    r = run(exp + "-o " + fresh.string());
    EXPECT_EQ(r.code, 1) << r.out;
  }
  EXPECT_EQ(contents(out), before);
  EXPECT_FALSE(fs::exists(fresh));
  r = run("eval --init-from " + out.string() + " --data synthetic --batches 1 --seq-len 32 -b 2");
  EXPECT_EQ(r.code, 0) << r.out;
}

// A Llama-family checkpoint exports as the directory transformers loads, and trains on from it.
TEST(Cli, LlamaCheckpointsExportToADirectoryAndTrainOnFromIt) {
  TempDir d;
  for (const std::string model : {"tiny-llama", "tiny-qwen2"}) {
    const fs::path ckpt = d.path / (model + "_ckpt"), out = d.path / model;
    Result r = run("train --model " + model + " --steps 1 --seq-len 16 -b 2 -q --checkpoint-dir " +
                   ckpt.string());
    ASSERT_EQ(r.code, 0) << r.out;
    r = run("export --checkpoint latest --checkpoint-dir " + ckpt.string() + " -o " + out.string() +
            " --shard-size 100KB");
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_TRUE(fs::exists(out / "model.safetensors.index.json")) << model;
    std::ifstream config_in(out / "config.json");
    const auto config = nlohmann::json::parse(config_in);
    EXPECT_EQ(config.at("model_type"), model == "tiny-llama" ? "llama" : "qwen2");
    EXPECT_FALSE(config.contains("name"));
    r = run("train --model " + (out / "config.json").string() + " --init-from " + out.string() +
            " --steps 1 --seq-len 16 -b 2 -q");
    EXPECT_EQ(r.code, 0) << model << "\n" << r.out;
    r = run("train --init-from " + out.string() + " --steps 1 --seq-len 16 -b 2");  // no --model
    EXPECT_EQ(r.code, 0) << model << "\n" << r.out;
    EXPECT_NE(r.out.find(config.at("model_type").get<std::string>() + ", n_layer"),
              std::string::npos)
        << r.out;
  }
}

// The README's worked example, command for command, in a scratch directory: every line
// succeeds, and the resumed run is the same run (its lr and warmup come from the checkpoint).
TEST(Cli, ReadmeWorkedExampleRuns) {
  std::ifstream in(std::string(ZO_SOURCE_DIR) + "/README.md");
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  const auto h = text.find("## A worked example");
  ASSERT_NE(h, std::string::npos);
  std::string script;
  std::istringstream lines(text.substr(h));
  std::string line;
  std::getline(lines, line);  // the heading
  std::getline(lines, line);  // the blank line before the block
  while (std::getline(lines, line) && line.rfind("    ", 0) == 0)
    script += line.substr(4) + "\n";
  ASSERT_NE(script.find("--resume latest"), std::string::npos) << script;
  TempDir d;
  const std::string binary = ZO_OFFLOAD_TRAIN_BIN;
  const auto at = script.find("B=build/src/offload_train");
  ASSERT_NE(at, std::string::npos) << script;
  script.replace(at, std::string("B=build/src/offload_train").size(), "B=" + binary);
  std::ofstream(d.path / "example.sh") << "set -e\n" << script;
  const Result r = zo::test::run_command("cd " + d.path.string() + " && bash example.sh");
  ASSERT_EQ(r.code, 0) << script << "\n" << r.out;
  const fs::path last = d.path / "runs" / "demo" / "step_00000350";
  ASSERT_TRUE(fs::exists(last / "MANIFEST.json")) << r.out;
  std::ifstream state(last / "trainer_state.json");
  const auto config = nlohmann::json::parse(state).at("config");
  EXPECT_FLOAT_EQ(config.at("lr").get<float>(), 3e-3f);
  EXPECT_EQ(config.at("warmup"), 20);
  EXPECT_EQ(config.at("lr_schedule_steps"), 300);
  EXPECT_TRUE(fs::exists(d.path / "tiny.safetensors"));
  EXPECT_NE(r.out.find("eval: loss "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("; weights runs/demo/step_00000350/model.safetensors"), std::string::npos)
      << r.out;
}

// A mistyped flag or subcommand names the nearest valid one; every mistake is one line starting
// "offload_train: error:" and exits 2.
TEST(Cli, MistakesSuggestTheNearestFlagOrSubcommand) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"train --lrr 3e-3", "unknown flag '--lrr', did you mean --lr?"},
      {"train --gradaccum 2", "did you mean --grad-accum?"},
      {"plan --modle tiny", "did you mean --model?"},
      {"info --jsn", "did you mean --json?"},
      {"tran --steps 1", "unknown subcommand 'tran', did you mean train?"},
      {"train --wholly-unknown",
       "unknown flag '--wholly-unknown' (see offload_train train --help)"},
      {"train --steps x", "--steps"},
      {"train -b 1 --micro-batch 2", "--micro-batch"},
  };
  for (const auto& [args, want] : cases) {
    const Result r = run(args);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.out;
    EXPECT_EQ(r.out.rfind("offload_train: error: ", 0), 0u) << args << "\n" << r.out;
    EXPECT_NE(r.out.find(want), std::string::npos) << args << "\n" << r.out;
  }
  EXPECT_EQ(run("train --help").code, 0);
}

// --device-memory and --host-memory take binary and decimal units; the plan prints both.
TEST(Cli, PlanTakesHostMemoryAndPrintsBothUnits) {
  const Result r =
      run("plan --model gpt-6.7b --precision bf16 --mode offload --device-memory 80GB "
          "--host-memory 64GiB");
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_NE(r.out.find("of 74.51 GiB (80.00 GB)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("of 64.00 GiB (68.72 GB) available  DOES NOT FIT"), std::string::npos)
      << r.out;
  EXPECT_EQ(run("plan --model gpt-6.7b --precision bf16 --mode offload --device-memory 80GB "
                "--host-memory 1TB")
                .code,
            0);
}

// The planner's table of host bytes per parameter, for a named budget: what a 128 GiB
// workstation trains in each format (8.6 billion parameters at 16 bytes, 22.9 at 6).
TEST(Cli, PlanShowsWhatEachFormatAdmitsInANamedBudget) {
  Result r =
      run("plan --model llama3.1-8b --precision bf16 -b 1 --seq-len 4096 --mode offload "
          "--host-memory 128GiB --device-memory 80GiB");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("in 128.00 GiB (--host-memory)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--master-weights fp32 --optimizer-state fp32  16.00 bytes  up to 8.59 "
                       "billion"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("--master-weights bf16 --optimizer-state q8     6.00 bytes  up to 22.89 "
                       "billion"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("device: offload mode keeps every weight there (bf16)"), std::string::npos)
      << r.out;
  // A device too small for every weight: auto shows stream mode's plan and picks it.
  r =
      run("plan --model llama3.1-8b --precision bf16 -b 1 --seq-len 4096 --recompute "
          "--host-memory 128GiB --device-memory 16GiB --json");
  EXPECT_EQ(r.code, 0) << r.out;
  const auto s = nlohmann::json::parse(r.out);
  EXPECT_EQ(s["recommended"]["mode"], "stream") << r.out;
  EXPECT_FALSE(s["offload"]["device"]["fits"].get<bool>()) << r.out;
  EXPECT_TRUE(s["stream"]["device"]["fits"].get<bool>()) << r.out;
  const std::string window = s["stream"]["parameter_window"];
  EXPECT_NE(window.find("3 slots of 416.02 MiB"), std::string::npos) << r.out;
  // bf16: 2 bytes x 400 TFLOP/s / (2 x 55 GB/s) = 7272.7 tokens.
  EXPECT_NE(window.find("hidden (predicted) from 7273 tokens per micro-batch (now 4096)"),
            std::string::npos)
      << r.out;
  r = run("plan --model gpt2-124m --precision bf16 --host-memory 128GiB --json");
  EXPECT_EQ(r.code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["host_costs"]["combinations"].size(), 6u) << r.out;
  // The table of host bytes per parameter is the plan's own arithmetic: the row of the run's
  // formats gives its host total, with --grad-accum summed where that mode sums it (offload: on
  // the device, here with the state on a drive; stream: on the host).
  for (const std::string mode : {"offload", "stream"}) {
    const std::string formats = mode == "offload"
                                    ? "--optimizer-state q8 --master-weights bf16 --state-dir ."
                                    : "--optimizer-state fp32 --master-weights fp32";
    r = run("plan --model gpt2-350m --precision bf16 -b 2 --seq-len 256 --grad-accum 4 --mode " +
            mode + " " + formats + " --json");
    EXPECT_EQ(r.code, 0) << r.out;
    const auto d = nlohmann::json::parse(r.out);
    const double n = double(d[mode]["parameters"].get<std::size_t>());
    int rows = 0;
    for (const auto& row : d["host_costs"]["combinations"]) {
      if (formats.find("--optimizer-state " + row["optimizer_state"].get<std::string>()) ==
              std::string::npos ||
          formats.find("--master-weights " + row["master_weights"].get<std::string>()) ==
              std::string::npos) {
        continue;
      }
      ++rows;
      EXPECT_NEAR(row["bytes_per_parameter"].get<double>() * n +
                      double(row["fixed_bytes"].get<std::size_t>()),
                  double(d[mode]["host"]["total"].get<std::size_t>()), 1.0)
          << mode << "\n"
          << r.out;
    }
    EXPECT_EQ(rows, 1) << mode;
  }
  r = run("plan --model gpt2-124m --precision bf16 --mode offload --state-dir .");
  EXPECT_NE(r.out.find("(--state-dir: master, m and v are on the drive"), std::string::npos)
      << r.out;
  r = run("plan --model gpt2-124m --precision bf16 --master-weights bf16 --optimizer-state q8");
  EXPECT_NE(r.out.find("bf16 master weights"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("upload buffer"), std::string::npos) << "uploads read the master";
  r = run("info");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("--master-weights bf16 --optimizer-state q8     6.00 bytes"),
            std::string::npos)
      << r.out;
}

TEST(Cli, BadInputExitsNonZeroWithAMessage) {
  Result r = run("train --no-such-flag");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("no-such-flag"), std::string::npos);
  EXPECT_EQ(run("").code, 2) << "a subcommand is required";
  // Integers are plain decimal in their type's range (CLI11 alone read "010" as 8 and took "-1"
  // for an unsigned flag as 2^64 - 1).
  for (const auto& [flags, why] :
       {std::pair{"train -b 010", "'010' is a number with a leading zero (read as octal)"},
        {"plan --seq-len 064", "'064' is a number with a leading zero"},
        {"train --seq-len 0x20", "'0x20' is not a whole number in decimal"},
        {"train --seed -1", "'-1' is not a whole number from 0 in decimal"},
        {"train --seed 18446744073709551616", "'18446744073709551616' is out of range"}}) {
    r = run(flags);
    EXPECT_EQ(r.code, 2) << flags << "\n" << r.out;
    EXPECT_NE(r.out.find(why), std::string::npos) << flags << "\n" << r.out;
  }
  EXPECT_EQ(run("plan --seq-len +64 -b 1").code, 0) << "a plus sign is still decimal";
  r = run("train --model gpt2-9000m");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("offload_train: error:"), std::string::npos);
  EXPECT_NE(r.out.find("presets"), std::string::npos);
  r = run("train --lr-decay sometimes");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("cosine"), std::string::npos);
  r = run("train --device-memory lots");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("MiB"), std::string::npos);
  r = run("plan --model gpt2-1558m -b 8 --precision bf16 --device-memory 8GiB");
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_NE(r.out.find("DOES NOT FIT"), std::string::npos);
  r = run("plan --model gpt2-124m -b 1 --seq-len 256 --precision bf16 --device-memory 80GiB");
  EXPECT_EQ(r.code, 0) << r.out;
  r = run("plan --model gpt2-124m --precision bf16 --ranks 4");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("fp32 master weights (1/4)"), std::string::npos) << r.out;
  for (const char* rate : {"--link-rate 0", "--device-tflops inf", "--link-rate nan"}) {
    r = run(std::string("plan --mode stream ") + rate);
    EXPECT_EQ(r.code, 1) << rate;
    EXPECT_NE(r.out.find("must be positive and finite"), std::string::npos) << r.out;
  }
  for (const char* m : {"resident", "stream"}) {
    r = run(std::string("plan --ranks 2 --mode ") + m);
    EXPECT_EQ(r.code, 1);
    EXPECT_NE(r.out.find("--mode offload"), std::string::npos) << r.out;
  }
  // plan checks its flags with train's own code: what it plans, train runs.
  for (const char* flags :
       {"--bucket-size 1", "-b 0", "--grad-accum 0", "--seq-len 100000", "--mode resident --dpu",
        "--precision fp8", "--grad-accum-on nowhere", "--master-weights fp16",
        "--mode resident --master-weights bf16", "--mode resident --optimizer-state q8",
        "--mode stream --dpu", "--param-window 2", "--mode stream --param-window 9",
        "--mode stream --grad-accum 2 --grad-accum-on device"}) {
    const Result p = run(std::string("plan ") + flags);
    const Result t = run(std::string("train --steps 1 ") + flags);
    EXPECT_EQ(p.code, 1) << flags << "\n" << p.out;
    EXPECT_EQ(t.code, 1) << flags << "\n" << t.out;
    EXPECT_EQ(p.out, t.out) << flags;
  }
  r = run("sample --prompt-tokens 1,x --init-from a --model tiny");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("'x'"), std::string::npos);
}

// Sizes are whole bytes from 1 to below 2^64, refused naming the flag otherwise: 0 means "not
// given" or "unlimited", so a size that rounded or wrapped to it used to run without a limit.
// plan refuses what train refuses.
TEST(Cli, SizesOutOfRangeAreRefusedNamingTheFlag) {
  const std::pair<std::string, std::string> bad[] = {
      {"--host-memory 0.5B", "--host-memory '0.5B' is not a whole number of bytes"},
      {"--host-memory 0.0001KiB", "--host-memory '0.0001KiB' is less than one byte"},
      {"--host-memory 99999999999TiB", "--host-memory '99999999999TiB' is too large"},
      {"--device-memory 16777216TiB", "--device-memory '16777216TiB' is too large"},
      {"--bucket-size 99999999999TiB", "--bucket-size '99999999999TiB' is too large"},
  };
  for (const auto& [flags, want] : bad) {
    const Result p = run("plan " + flags);
    const Result t = run("train --steps 1 " + flags);
    EXPECT_EQ(p.code, 1) << flags << "\n" << p.out;
    EXPECT_EQ(t.code, 1) << flags << "\n" << t.out;
    EXPECT_NE(p.out.find("offload_train: error: " + want), std::string::npos) << p.out;
    EXPECT_EQ(p.out, t.out) << flags;
  }
  const Result r = run("plan --host-memory 16777215TiB --json");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find(std::to_string(((std::uint64_t{1} << 24) - 1) << 40)), std::string::npos)
      << "the largest size plans as given";
}

// A sequence length below 1 is refused as such (0 is the default: the model's block_size).
TEST(Cli, SeqLenBelowOneIsRefused) {
  const Result p = run("plan --seq-len -5");
  const Result t = run("train --steps 1 --seq-len -5");
  EXPECT_EQ(p.code, 1) << p.out;
  EXPECT_EQ(t.code, 1) << t.out;
  EXPECT_NE(p.out.find("--seq-len -5 must be >= 1 (or 0 for the model's block_size 64)"),
            std::string::npos)
      << p.out;
  EXPECT_EQ(p.out, t.out);
}

// What eval and sample would ignore is refused: --model beside a checkpoint (which names its
// own model), and a second prompt.
TEST(Cli, EvalAndSampleRefuseFlagsTheyWouldIgnore) {
  TempDir d;
  const std::string ckpt = (d.path / "ckpt").string();
  Result r = run("train --steps 1 --seq-len 32 -b 2 -q --checkpoint-dir " + ckpt);
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string from = " --checkpoint latest --checkpoint-dir " + ckpt;
  for (const std::string& cmd : {"sample -n 2 --model small-test" + from,
                                 "eval --data synthetic --batches 1 --model small-test" + from}) {
    r = run(cmd);
    EXPECT_EQ(r.code, 1) << cmd << "\n" << r.out;
    EXPECT_NE(r.out.find("--model applies to --init-from only; drop --model"), std::string::npos)
        << r.out;
  }
  r = run("sample -n 2 --prompt hi --prompt-tokens 1" + from);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("--prompt and --prompt-tokens both give the prompt: give one"),
            std::string::npos)
      << r.out;
}

// export checks its -o before any work and names -o in its advice: a directory where one file
// goes, a file where a folder must be made; missing folders are made, but only for an export
// that is not refused.
TEST(Cli, ExportChecksItsOutputBeforeWriting) {
  TempDir d;
  const std::string ckpt = (d.path / "ckpt").string();
  Result r = run("train --steps 1 --seq-len 32 -b 2 -q --checkpoint-dir " + ckpt);
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string exp = "export --checkpoint latest --checkpoint-dir " + ckpt + " ";
  const fs::path dir = d.path / "existing.safetensors";
  fs::create_directories(dir);
  r = run(exp + "-o " + dir.string() + " --force");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("-o '" + dir.string() +
                       "' is a directory; a path ending in .safetensors is written as one file"),
            std::string::npos)
      << r.out;
  EXPECT_TRUE(fs::is_empty(dir));
  const fs::path file = d.path / "a_file";
  std::ofstream(file) << "user data";
  for (const fs::path& out : {file / "y.safetensors", file / "x" / "hf_dir"}) {
    r = run(exp + "-o " + out.string());
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_NE(r.out.find("'" + file.string() +
                         "' is not a directory, so the output cannot be made under it; choose "
                         "another -o"),
              std::string::npos)
        << r.out;
    EXPECT_EQ(r.out.find("--checkpoint-dir"), std::string::npos) << r.out;
  }
  std::set<std::string> left;
  for (const auto& e : fs::directory_iterator(d.path))
    left.insert(e.path().filename().string());
  EXPECT_EQ(left, (std::set<std::string>{"a_file", "ckpt", "existing.safetensors"}))
      << "no temporary file is left";
  const fs::path nested = d.path / "nope" / "x" / "y.safetensors";
  r = run(exp + "-o " + nested.string());
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(fs::is_regular_file(nested));
  r = run("export --checkpoint " + (d.path / "no_ckpt").string() + " -o " +
          (d.path / "new" / "y.safetensors").string());
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_FALSE(fs::exists(d.path / "new"));
}

// sample's weights of a model far beyond any host's memory (13 TB in fp32): the advice is about
// the model and the host, not an optimizer state that sample does not have.
TEST(Cli, SampleOutOfHostMemoryGivesSamplesAdvice) {
  TempDir d;
  const std::string ckpt = (d.path / "ckpt").string();
  Result r = run("train --steps 1 --seq-len 32 -b 2 -q --checkpoint-dir " + ckpt);
  ASSERT_EQ(r.code, 0) << r.out;
  const fs::path weights = d.path / "w.safetensors";
  r = run("export --checkpoint latest --checkpoint-dir " + ckpt + " -o " + weights.string());
  ASSERT_EQ(r.code, 0) << r.out;
  const fs::path huge = d.path / "huge.json";
  std::ofstream(huge) << R"({"n_layer": 4096, "n_head": 64, "n_embd": 8192, "vocab_size": 256,
                             "block_size": 64})";
  r = run("sample -n 2 --device host --init-from " + weights.string() + " --model " +
          huge.string());
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("out of host memory for the weights of " + huge.string() + " in fp32"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("Use a smaller model"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("optimizer"), std::string::npos) << r.out;
}

// A spec file's path is quoted once in its errors.
TEST(Cli, SpecErrorsQuoteThePathOnce) {
  TempDir d;
  const fs::path spec = d.path / "odd_heads.json";
  std::ofstream(spec) << R"({"n_layer": 2, "n_head": 3, "n_embd": 64, "vocab_size": 256,
                             "block_size": 64})";
  const Result r = run("plan --model " + spec.string());
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("model spec '" + spec.string() + "': n_embd = 64 is not divisible"),
            std::string::npos)
      << r.out;
}

// A spec's limits as they are (n_layer: 4096), not the 2^30 every key is first read within.
TEST(Cli, SpecErrorsStateTheRealLimit) {
  TempDir d;
  const fs::path spec = d.path / "no_layers.json";
  std::ofstream(spec) << R"({"n_layer": 0, "n_head": 2, "n_embd": 64, "vocab_size": 256,
                             "block_size": 64, "name": "no_layers"})";
  const Result r = run("plan --model " + spec.string());
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("n_layer = 0 is out of range (1 .. 4096)"), std::string::npos) << r.out;
}

// plan checks --state-dir with train's own check, and --drive-rate is the --state-dir drive's.
TEST(Cli, PlanChecksTheStateDirAsTrainDoes) {
  TempDir d;
  const fs::path file = d.path / "a_file";
  std::ofstream(file) << "user data";
  for (const std::string& dir : {file.string(), (d.path / "missing").string()}) {
    const std::string flags = "--mode offload --state-dir " + dir;
    const Result p = run("plan " + flags);
    const Result t = run("train --steps 1 " + flags);
    EXPECT_EQ(p.code, 1) << p.out;
    EXPECT_EQ(t.code, 1) << t.out;
    EXPECT_NE(p.out.find("--state-dir " + dir), std::string::npos) << p.out;
    EXPECT_EQ(p.out, t.out);
  }
  Result r = run("plan --drive-rate 3");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("--drive-rate is the rate of the --state-dir drive"), std::string::npos)
      << r.out;
  r = run("plan --mode offload --drive-rate 3 --state-dir " + d.path.string());
  EXPECT_EQ(r.code, 0) << r.out;
  // A state file larger than the drive's free space (1.3 trillion parameters: 15 TB), which
  // train refuses when it makes the file.
  const fs::path big = d.path / "big.json";
  std::ofstream(big) << R"({"n_layer": 400, "n_head": 64, "n_embd": 16384, "vocab_size": 50304,
                           "block_size": 64})";
  r = run("plan --model " + big.string() + " --precision bf16 --mode offload --state-dir " +
          d.path.string());
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_NE(r.out.find("drive: DOES NOT FIT: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(" free under --state-dir " + d.path.string()), std::string::npos) << r.out;
}

// An empty value is an unset shell variable, not a choice: `train --init-from ""` trained from
// scratch and `--resume ""` started afresh, without a word. Every flag refuses one, by name.
TEST(Cli, EmptyValuesAreRefusedNamingTheFlag) {
  const std::pair<const char*, const char*> cases[] = {
      {"train --steps 1 --init-from ''", "--init-from: is empty"},
      {"train --steps 1 --resume ''", "--resume: is empty"},
      {"train --steps 1 --device-memory ''", "--device-memory: is empty"},
      {"plan --device-memory ''", "--device-memory: is empty"},
      {"info --state-dir ''", "--state-dir: is empty"},
      {"eval --data '' --init-from x", "--data: is empty"},
  };
  for (const auto& [args, want] : cases) {
    const Result r = run(args);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.out;
    EXPECT_NE(r.out.find(std::string(want) + "; give a value, or leave the flag out"),
              std::string::npos)
        << args << "\n"
        << r.out;
  }
}

// --mode auto picks resident only where nothing asks for offload mode's host side, and says why.
TEST(Cli, PlanAutoPicksOffloadForItsOwnFlags) {
  const std::pair<const char*, const char*> cases[] = {
      {"--dpu", "--mode offload (--dpu delays offload mode's CPU update)"},
      {"--grad-accum 2 --grad-accum-on host",
       "--mode offload (--grad-accum-on host sums offload mode's gradients on the host)"},
      {"--optimizer-state q8 --state-dir .",
       "--mode offload (--state-dir keeps the optimizer state on a drive)"},
      {"", "--mode resident (everything fits on the device"},
  };
  for (const auto& [flags, pick] : cases) {
    const Result r = run(std::string("plan --model tiny --precision bf16 ") + flags);
    EXPECT_EQ(r.code, 0) << flags << "\n" << r.out;
    EXPECT_NE(r.out.find(std::string("recommended: ") + pick), std::string::npos) << flags << "\n"
                                                                                  << r.out;
  }
}

// train --trace plans the trace's event buffer: a budget that holds the run without it does not
// hold it with it.
TEST(Cli, TrainPlansTheTraceBuffer) {
  TempDir d;
  const std::string train = "train --device host --steps 1 -q --host-memory 200MiB";
  Result r = run(train);
  EXPECT_EQ(r.code, 0) << r.out;
  r = run(train + " --trace " + (d.path / "t.json").string());
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("--trace events (at most 1000000)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("DOES NOT FIT"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(d.path / "t.json"));
}

// eval scores the held-out tail as training does: on the checkpoint it wrote, the same batches
// give the run's last validation loss, bit for bit; the exported weights give it again; and what
// cannot be scored is refused naming the flag.
TEST(Cli, EvalGivesTheRunsValidationLoss) {
  TempDir d;
  const std::string ckpt = (d.path / "ckpt").string(), metrics = (d.path / "m.jsonl").string();
  Result r = run("train --steps 3 --seq-len 32 -b 2 -q --eval-batches 5 --checkpoint-dir " + ckpt +
                 " --metrics " + metrics);
  ASSERT_EQ(r.code, 0) << r.out;
  std::ifstream in(metrics);
  std::string line, last;
  while (std::getline(in, line))
    last = line;
  const double val_loss = nlohmann::json::parse(last).at("val_loss").get<double>();
  const std::string eval = "eval --data synthetic -b 2 --seq-len 32 --batches 5 --json ";
  r = run(eval + "--checkpoint latest --checkpoint-dir " + ckpt);
  ASSERT_EQ(r.code, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("loss").get<double>(), val_loss);
  EXPECT_EQ(j.at("tokens").get<int>(), 5 * 2 * 32);
  EXPECT_NEAR(j.at("perplexity").get<double>(), std::exp(val_loss), 1e-9 * std::exp(val_loss));
  const std::string out = (d.path / "export").string();
  r = run("export --checkpoint latest --checkpoint-dir " + ckpt + " -o " + out);
  ASSERT_EQ(r.code, 0) << r.out;
  r = run(eval + "--init-from " + out);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(nlohmann::json::parse(r.out).at("loss").get<double>(), val_loss) << "HF weights";
  // All of the data, one pass is the default: the loss over more tokens differs.
  r =
      run("eval --data synthetic -b 2 --seq-len 32 --batches 3 --val-fraction 1 --checkpoint "
          "latest --checkpoint-dir " +
          ckpt);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex("^eval: loss [0-9.]+, perplexity [0-9.]+ over "
                                                  "192 tokens in 3 batches \\(val: ")))
      << r.out;
  const std::pair<std::string, std::string> bad[] = {
      {"eval --data synthetic", "give exactly one of --checkpoint or --init-from"},
      {"eval --checkpoint latest --checkpoint-dir " + ckpt, "--data is required"},
      {"eval --data synthetic --val-fraction 0 --checkpoint latest --checkpoint-dir " + ckpt,
       "--val-fraction must be in (0, 1]"},
      {"eval --data synthetic --seq-len 65 --checkpoint latest --checkpoint-dir " + ckpt,
       "--seq-len 65 exceeds the model's block_size 64"},
      {"eval --data synthetic --batches -1 --checkpoint latest --checkpoint-dir " + ckpt,
       "--batches must be in 0..1048576"},
      {"eval --data synthetic --batches 99999 --checkpoint latest --checkpoint-dir " + ckpt,
       "--batches 99999 is more than one pass over the scored tokens"},
      {"eval --data synthetic --precision fp8 --checkpoint latest --checkpoint-dir " + ckpt,
       "--precision must be auto, fp32, bf16 or fp16 (got 'fp8')"},
      {"eval --data /nonexistent/shards --checkpoint latest --checkpoint-dir " + ckpt,
       "/nonexistent/shards"},
  };
  for (const auto& [cmd, want] : bad) {
    r = run(cmd);
    EXPECT_NE(r.code, 0) << cmd;
    EXPECT_NE(r.out.find(want), std::string::npos) << cmd << "\n" << r.out;
  }
}

// Numbers a user can get wrong exit 1 naming the flag; sampling no tokens is not an error.
// eval and sample keep the weights in host memory and stream the blocks through a window of
// device slots when asked (--param-window) or when every weight would not fit --device-memory:
// the same loss and the same tokens as with every weight on the device.
TEST(Cli, EvalAndSampleStreamTheBlocksWhenAskedOrShortOfMemory) {
  TempDir d;
  const fs::path spec = d.path / "six_blocks.json";
  std::ofstream(spec) << R"({"n_layer": 6, "n_head": 2, "n_embd": 128, "vocab_size": 256,
                             "block_size": 32})";
  const std::string ckpt = (d.path / "ckpt").string();
  Result r = run("train --model " + spec.string() + " --steps 2 -b 2 -q --checkpoint-dir " + ckpt);
  ASSERT_EQ(r.code, 0) << r.out;
  const std::size_t weight_bytes =
      zo::model::ParameterLayout(zo::model::load_model_spec(spec.string())).size() * 4;
  const std::string from = " --checkpoint latest --checkpoint-dir " + ckpt;
  const std::string sample = "sample --ids -n 12 --temperature 0 --prompt-tokens 1,2,3" + from;
  const std::string eval = "eval --data synthetic -b 1 --seq-len 16 --batches 3 --json" + from;
  const Result want_tokens = run(sample), want_loss = run(eval);
  ASSERT_EQ(want_tokens.code, 0) << want_tokens.out;
  ASSERT_EQ(want_loss.code, 0) << want_loss.out;
  for (const std::string& flags :
       {std::string(" --param-window 2"), std::string(" --param-window 6"),
        " --device-memory " + std::to_string(weight_bytes) + "B"}) {
    r = run(sample + flags);
    EXPECT_EQ(r.code, 0) << flags << "\n" << r.out;
    EXPECT_EQ(r.out, want_tokens.out) << flags;
    r = run(eval + flags);
    EXPECT_EQ(r.code, 0) << flags << "\n" << r.out;
    EXPECT_EQ(nlohmann::json::parse(r.out).at("loss"),
              nlohmann::json::parse(want_loss.out).at("loss"))
        << flags;
  }
  r = run(sample + " --timing --device-memory " + std::to_string(weight_bytes) + "B");
  EXPECT_NE(r.out.find("3-block window"), std::string::npos) << r.out;
  for (const char* bad : {" --param-window 1", " --param-window 7"}) {
    r = run(sample + bad);
    EXPECT_EQ(r.code, 1) << bad << "\n" << r.out;
    EXPECT_NE(r.out.find("--param-window must be in 2..6"), std::string::npos) << r.out;
  }
  r = run(sample + " --device-memory 1MiB");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("out of device memory for a window of 3 blocks"), std::string::npos)
      << r.out;
}

// eval, sample and export read the weights alone: a checkpoint whose optimizer file was deleted
// (to save space) or damaged still serves them, at no cost of reading it; a resume refuses it.
TEST(Cli, WeightReadersNeitherNeedNorReadTheOptimizerState) {
  for (const std::string state : {"", " --optimizer-state q8 --master-weights bf16"}) {
    TempDir d;
    const std::string ckpt = (d.path / "ckpt").string();
    Result r = run("train --steps 2 --seq-len 32 -b 2 -q --checkpoint-dir " + ckpt + state);
    ASSERT_EQ(r.code, 0) << r.out;
    const fs::path opt = fs::path(ckpt) / "step_00000002" / "optimizer.safetensors";
    const std::string from = " --checkpoint latest --checkpoint-dir " + ckpt;
    const std::string sample = "sample -n 4 --ids --temperature 0 --prompt-tokens 1,2" + from;
    const std::string eval = "eval --data synthetic --batches 1 --seq-len 32" + from;
    const Result sampled = run(sample), evaluated = run(eval);
    ASSERT_EQ(sampled.code, 0) << sampled.out;
    ASSERT_EQ(evaluated.code, 0) << evaluated.out;
    const std::uintmax_t opt_size = fs::file_size(opt);
    fs::resize_file(opt, 100);  // damaged: truncated
    EXPECT_EQ(run(sample).out, sampled.out) << state;
    fs::remove(opt);  // deleted
    EXPECT_EQ(run(sample).out, sampled.out) << state;
    EXPECT_EQ(run(eval).out, evaluated.out) << state;
    r = run("export -o " + (d.path / "w.safetensors").string() + from);
    EXPECT_EQ(r.code, 0) << state << "\n" << r.out;
    r = run("train --steps 3 --seq-len 32 -b 2 -q --resume latest --checkpoint-dir " + ckpt +
            state);
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_NE(r.out.find("'optimizer.safetensors' is missing"), std::string::npos) << r.out;
    EXPECT_GT(opt_size, 100u);
  }
}

TEST(Cli, SampleEdgesAndNonFiniteFlags) {
  TempDir d;
  const std::string ckpt = (d.path / "ckpt").string();
  Result r = run("train --steps 1 --seq-len 32 -b 2 -q --checkpoint-dir " + ckpt);
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string sample = "sample --checkpoint latest --checkpoint-dir " + ckpt + " ";
  r = run(sample + "-n 0 --ids --prompt-tokens 1,2");  // used to corrupt the heap
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out, "\n");
  // A byte-level model prints its tokens as bytes: the same tokens as --ids.
  r = run(sample + "-n 6 --temperature 0 --prompt ab");
  ASSERT_EQ(r.code, 0) << r.out;
  const Result ids = run(sample + "-n 6 --temperature 0 --prompt ab --ids");
  ASSERT_EQ(ids.code, 0) << ids.out;
  std::string bytes;
  std::stringstream list(ids.out);
  for (std::string id; std::getline(list, id, ',');)
    bytes += static_cast<char>(std::stoi(id));
  EXPECT_EQ(r.out, bytes + "\n");
  // A context of 4 positions: a 6-token prompt keeps its last 4, generation refills twice.
  r = run(sample + "--context 4 -n 7 --ids --prompt-tokens 1,2,3,4,5,6");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex("^[0-9]+(,[0-9]+){6}\n$"))) << r.out;
  // --timing: the tokens first, then one line on stderr counting the first prefill's positions
  // (the prompt's last 4) and the steps after it (one per new token but the first).
  r = run(sample + "--context 4 -n 7 --ids --prompt-tokens 1,2,3,4,5,6 --timing");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(std::regex_search(
      r.out, std::regex("^[0-9]+(,[0-9]+){6}\nsample: prefill of 4 tokens in [0-9.]+ ms; 6 decode "
                        "steps in [0-9.]+ s, [0-9.]+ tokens/s \\(host \\(fp32.*\\)\\)\n$")))
      << r.out;
  r = run(sample + "-n 1 --ids --prompt-tokens 1 --timing");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("; no decode steps (host"), std::string::npos) << r.out;
  const std::pair<std::string, std::string> bad[] = {
      {sample + "--temperature inf -n 2", "--temperature must be finite"},
      {sample + "--temperature nan -n 2", "--temperature must be finite"},
      {sample + "--top-k 1000 -n 2", "--top-k 1000 exceeds"},
      {sample + "--prompt-tokens 4294967297 -n 2", "'4294967297' is not a token id"},
      {sample + "--prompt-tokens 1, -n 2", "'1,' ends with a comma"},
      {sample + "--prompt-tokens ,1 -n 2", "'' is not a token id"},
      {sample + "--context 65 -n 2", "--context 65 exceeds the model's block_size 64"},
      {sample + "--context -1 -n 2", "--context must be >= 1"},
      {"train --steps 1 --comm-timeout inf", "--comm-timeout"},
      {"train --steps 1 --adam-eps inf", "--adam-eps"},
      {"train --steps 1 --weight-decay inf", "--weight-decay"},
  };
  for (const auto& [args, message] : bad) {
    r = run(args);
    EXPECT_EQ(r.code, 1) << args << "\n" << r.out;
    EXPECT_NE(r.out.find("offload_train: error: "), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(message), std::string::npos) << args << "\n" << r.out;
  }
}

// Logits that turn non-finite partway through stop sample after the tokens it printed: their line
// ends first, then the error names the token. Position 4 overflows fp32 (its position embedding
// is the largest float, to which block 0's attention adds 1e32); earlier ones never see it.
TEST(Cli, SampleEndsTheLineOfTokensBeforeAnErrorMidStream) {
  TempDir d;
  const fs::path ckpt = d.path / "ckpt", step = ckpt / "step_00000001";
  Result r = run("train --steps 1 --seq-len 32 -b 2 -q --checkpoint-dir " + ckpt.string());
  ASSERT_EQ(r.code, 0) << r.out;
  const std::uint64_t C =
      zo::ckpt::SafetensorsFile::open(step / "model.safetensors").info("wpe.weight").shape.at(1);
  zo::test::set_weights(step, "wpe.weight", std::numeric_limits<float>::max(), 4 * C, C);
  zo::test::set_weights(step, "h.0.attn.c_proj.bias", 1e32f);
  const std::string sample = "sample --checkpoint " + step.string() + " --temperature 0 ";
  r = run(sample + "--ids -n 2 --prompt-tokens 1,2,3");  // positions 2 and 3: finite
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex("^[0-9]+,[0-9]+\n$"))) << r.out;
  const std::string two = r.out.substr(0, r.out.size() - 1);
  r = run(sample + "--ids -n 4 --prompt-tokens 1,2,3");
  EXPECT_EQ(r.code, 1) << r.out;
  const std::string expected =
      two + "\noffload_train: error: new token 3 (position 4): the model's logits hold ";
  EXPECT_EQ(r.out.substr(0, expected.size()), expected) << r.out;
}

}  // namespace
