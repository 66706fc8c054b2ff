// What the fuzz targets read next to the fuzzed input, made by the project's own writers: the
// targets build them once at start-up and make_corpus.cpp builds the same ones to take its seeds
// from, so a seed is a file that matches its target's fixture exactly.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "../thread_comm.h"
#include "checkpoint/atomic_io.h"
#include "data/loader.h"
#include "data/shard.h"
#include "fuzz_common.h"
#include "model/hf_weights.h"
#include "model/layout.h"
#include "optim/host_optimizer.h"
#include "train/checkpoint_io.h"
#include "train/config.h"
#include "train/loss_scaler.h"

namespace zo::fuzz {

namespace fs = std::filesystem;

// ---- data -----------------------------------------------------------------------------------

// Two token shards, <dir>/a.bin and <dir>/b.bin; returns dir.
inline fs::path make_shard_fixture(const fs::path& dir) {
  fs::create_directories(dir);
  data::write_token_shard((dir / "a.bin").string(), fixture_tokens(0));
  data::write_token_shard((dir / "b.bin").string(), fixture_tokens(1));
  return dir;
}

// The loader the fuzzed states are restored into: the fixture shards, 2 x 8 windows, 10 % val.
inline std::unique_ptr<data::DataLoader> shard_loader(const fs::path& shard_dir) {
  data::SourceConfig sc;
  sc.path = shard_dir.string();
  sc.format = data::DataFormat::kShards;
  sc.vocab_size = 256;
  data::LoaderConfig lc;
  lc.batch_size = 2;
  lc.seq_len = 8;
  lc.seed = 7;
  lc.val_fraction = 0.1;
  return std::make_unique<data::DataLoader>(data::open_token_source(sc), lc);
}

// The synthetic stream over the micro model's vocabulary, as a run with default data has it.
inline std::unique_ptr<data::DataLoader> synthetic_loader() {
  data::LoaderConfig lc;
  lc.batch_size = 1;
  lc.seq_len = micro_spec().block_size;
  lc.val_fraction = 0.0;
  return std::make_unique<data::DataLoader>(
      data::make_synthetic_source(data::SyntheticConfig{}, micro_spec().vocab_size), lc);
}

// ---- checkpoint directories -----------------------------------------------------------------

// The files of the MANIFEST.json target's directory (a manifest may name any of them).
inline std::vector<std::pair<std::string, std::string>> manifest_fixture_files() {
  return {{"model.safetensors", std::string(300, '\x01') + "weights"},
          {"trainer_state.json", "{\"step\": 1}\n"},
          {"empty", ""},
          {"sub/extra.bin", "0123456789abcdef"}};
}

struct CheckpointFixture {
  std::string whole_state;    // trainer_state.json of the single-process checkpoint
  std::string sharded_state;  // trainer_state.json of the two-rank checkpoint
};

// The micro model after 3 steps, checkpointed by save_checkpoint into <dir> (model.safetensors,
// optimizer.safetensors) and by a two-rank save_checkpoint whose shard files are copied next to
// them (optimizer.rank0-of2.safetensors, optimizer.rank1-of2.safetensors). MANIFEST.json and
// trainer_state.json are left for the fuzz target to write.
inline CheckpointFixture make_checkpoint_fixture(const fs::path& dir) {
  const model::ParameterLayout layout(micro_spec());
  const std::size_t n = layout.size();
  std::vector<float> whole(n), m(n), v(n);
  model::init_weights(layout, 5, whole.data());
  for (std::size_t i = 0; i < n; ++i) {
    m[i] = 1e-3f * static_cast<float>(i % 17) - 8e-3f;
    v[i] = 1e-6f * static_cast<float>(i % 13 + 1);
  }
  // What Session::trainer_state records, with a fixed run id and time.
  train::TrainConfig config;
  config.model = "micro.json";
  const nlohmann::json state = {{"step", 3},
                                {"run_id", "fuzz-fixture"},
                                {"saved_at_ns", 1800000000000000000},
                                {"tokens", 12},
                                {"data", synthetic_loader()->state()},
                                {"config", config.to_json()},
                                {"rng", {{"seed", config.seed}}},
                                {"loss_scaler", train::LossScaler().state()}};
  optim::OptimizerConfig oc;
  oc.threads = 1;

  const fs::path work = dir.parent_path() / (dir.filename().string() + ".work");
  fs::remove_all(work);
  CheckpointFixture out;
  {
    optim::HostOptimizer opt(layout, oc);
    opt.take_owned(whole.data(), opt.master().data());
    opt.take_owned(m.data(), static_cast<float*>(opt.exp_avg().data));
    opt.take_owned(v.data(), static_cast<float*>(opt.exp_avg_sq().data));
    opt.state().step = 3;
    const fs::path saved = train::save_checkpoint(work / "whole", layout, opt, state, 0);
    fs::remove_all(dir);
    fs::rename(saved, dir);
    out.whole_state = ckpt::read_file(dir / "trainer_state.json");
    fs::remove(dir / "trainer_state.json");
    fs::remove(dir / ckpt::kManifestName);
  }
  {
    // Rank 0 owns [0, n/3) and [2n/3, n), rank 1 the middle: several ranges per shard file.
    const std::size_t a = n / 3, b = 2 * n / 3;
    const std::vector<std::vector<optim::OwnedRange>> parts = {{{0, a, 0}, {b, n, a}}, {{a, b, 0}}};
    auto hub = std::make_shared<test::ThreadCommHub>(2);
    fs::path saved;
    std::vector<std::exception_ptr> errors(2);
    std::vector<std::thread> ranks;
    for (int r = 0; r < 2; ++r) {
      ranks.emplace_back([&, r] {
        try {
          test::ThreadComm comm(hub, r);
          optim::HostOptimizer opt(layout, oc, parts[std::size_t(r)]);
          opt.take_owned(whole.data(), opt.master().data());
          opt.take_owned(m.data(), static_cast<float*>(opt.exp_avg().data));
          opt.take_owned(v.data(), static_cast<float*>(opt.exp_avg_sq().data));
          opt.state().step = 3;
          const fs::path p =
              train::save_checkpoint(work / "sharded", layout, opt, state, 0, comm, parts);
          if (r == 0) saved = p;
        } catch (...) {
          errors[std::size_t(r)] = std::current_exception();
        }
      });
    }
    for (auto& t : ranks)
      t.join();
    for (const auto& e : errors)
      if (e) std::rethrow_exception(e);
    out.sharded_state = ckpt::read_file(saved / "trainer_state.json");
    for (int r = 0; r < 2; ++r) {
      const std::string shard = "optimizer.rank" + std::to_string(r) + "-of2.safetensors";
      fs::copy_file(saved / shard, dir / shard);
    }
  }
  fs::remove_all(work);
  return out;
}

// ---- Hugging Face weights ---------------------------------------------------------------------

// The micro model exported as a sharded Hugging Face directory into <dir> (config.json, three or
// more shards of at most 64 bytes of tensor data); returns its index, which the fuzz target
// replaces with its input.
inline std::string make_hf_index_fixture(const fs::path& dir) {
  const model::ParameterLayout layout(micro_spec());
  std::vector<float> params(layout.size());
  model::init_weights(layout, 11, params.data());
  fs::remove_all(dir);
  model::export_hf_directory(dir, layout, model::hf_source(params), DType::kBF16, 64);
  return ckpt::read_file(dir / "model.safetensors.index.json");
}

}  // namespace zo::fuzz
