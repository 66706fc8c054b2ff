// Damaged checkpoints and bad numbers for the trainer's readers: trainer_state.json values of the
// wrong type, out of range or inconsistent, optimizer shard ranges that overlap, wrap or leave the
// layout, tensors nothing reads, FIFOs in a checkpoint; non-finite flags; sampling edge cases;
// weights that are not finite, or whose logits are not, in sample and eval.
#include <gtest/gtest.h>
#include <oneapi/tbb/info.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmath>
#include <csignal>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "checkpoint/atomic_io.h"
#include "checkpoint/safetensors.h"
#include "checkpoint_edit.h"
#include "cpu_adam/cpu_adam.h"
#include "file_size_limit.h"
#include "input_test.h"
#include "optim/host_optimizer.h"
#include "thread_comm.h"
#include "train/checkpoint_io.h"
#include "train/evaluate.h"
#include "train/export.h"
#include "train/finite_weights.h"
#include "train/run_outputs.h"
#include "train/sample.h"
#include "train/trainer.h"

namespace {

namespace fs = std::filesystem;
using zo::test::error_of;
using zo::test::file_bytes;
using zo::test::reseal;
using zo::test::Scratch;
using zo::test::set_weights;
using Json = nlohmann::json;
using zo::train::read_trainer_state;

void edit_state(const fs::path& dir, const std::function<void(Json&)>& edit) {
  Json s = Json::parse(file_bytes(dir / "trainer_state.json"));
  edit(s);
  reseal(dir, "trainer_state.json", s.dump());
}

zo::train::TrainConfig tiny(std::int64_t steps) {
  zo::train::TrainConfig c;
  c.model = "tiny";
  c.steps = steps;
  c.lr.total_steps = steps;
  c.micro_batch = 2;
  c.seq_len = 32;
  c.quiet = true;
  return c;
}

// A two-step tiny run's checkpoint, copied afresh for every test.
const fs::path& trained_checkpoint() {
  static Scratch keep;
  static const fs::path dir = [] {
    zo::train::TrainConfig c = tiny(2);
    c.checkpoint_dir = keep.path.string();
    zo::train::Trainer(c).run();
    return keep.path / "step_00000002";
  }();
  return dir;
}

class TrainerState : public ::testing::Test {
 protected:
  void SetUp() override { fs::copy(trained_checkpoint(), dir_, fs::copy_options::recursive); }
  // read_trainer_state's error after `edit`, restoring nothing: each call starts from the last.
  std::string error_after(const std::function<void(Json&)>& edit) {
    const std::string before = file_bytes(dir_ / "trainer_state.json");
    edit_state(dir_, edit);
    std::string e = error_of([&] { read_trainer_state(dir_); });
    reseal(dir_, "trainer_state.json", before);
    return e;
  }
  Scratch tmp_;
  fs::path dir_ = tmp_.path / "step_00000002";
};

TEST_F(TrainerState, CountsMustBeIntegersInRangeAndConsistent) {
  const Json bad_counts[] = {
      -1, std::numeric_limits<std::uint64_t>::max(), 1.5, "2", nullptr, Json::array()};
  for (const auto& [name, max] : {std::pair{"step", "2^40"}, {"tokens", "2^53"}}) {
    const std::string key = name;  // (a copy: clang 14 cannot capture a structured binding)
    for (const Json& v : bad_counts) {
      const std::string e = error_after([&](Json& s) { s[key] = v; });
      EXPECT_HAS(e, "trainer_state.json: \"" + key + "\" is " + v.dump());
      EXPECT_HAS(e, "expected an integer in [0, " + std::string(max) + "]");
    }
  }
  EXPECT_HAS(error_after([](Json& s) { s.erase("step"); }), "\"step\" is missing");
  EXPECT_HAS(error_after([](Json& s) { s["adam_step"] = 3; }),
             "\"adam_step\" is 3; expected an integer in [0, step = 2]");
  EXPECT_HAS(error_after([](Json& s) { s["adam_step"] = -1; }), "\"adam_step\" is -1");
  for (const Json& v : {Json(1.0), Json("1"), Json(0), Json(3)})
    EXPECT_HAS(error_after([&](Json& s) { s["format_version"] = v; }),
               "\"format_version\" is " + v.dump() + ", an unsupported format version");
  EXPECT_NO_THROW(read_trainer_state(dir_));
}

TEST_F(TrainerState, SectionsAreCheckedByKey) {
  // 1e-46 is 0 as a float: resuming with it failed mid-step, and the unwinding freed buffers
  // the streams still used.
  for (const Json& v : {Json(0), Json(-2.0), Json(1e300), Json("big"), Json(1e-46), Json(1e-39)}) {
    EXPECT_HAS(error_after([&](Json& s) { s["loss_scaler"]["scale"] = v; }),
               "\"loss_scaler.scale\" is " + v.dump() + "; expected a positive finite float");
  }
  EXPECT_HAS(error_after([](Json& s) { s["loss_scaler"]["good_steps"] = -1; }),
             "\"loss_scaler.good_steps\" is -1");
  EXPECT_HAS(error_after([](Json& s) { s["loss_scaler"]["dynamic"] = "yes"; }),
             "\"loss_scaler.dynamic\"");
  EXPECT_HAS(error_after([](Json& s) { s.erase("model_spec"); }), "\"model_spec\" is missing");
  // The same shapes with another head count: not the model the weights were trained as.
  EXPECT_HAS(error_after([](Json& s) { s["model_spec"]["n_head"] = 4; }),
             "is not the spec its weights were saved with");
  // Weights that do not record their spec: refused from format 2 on, where every save records
  // it (a check to bypass else); read as they are in a format-1 checkpoint, which may lack it.
  {
    const std::string weights = file_bytes(dir_ / "model.safetensors");
    std::uint64_t n = 0;
    std::memcpy(&n, weights.data(), 8);
    Json header = Json::parse(weights.substr(8, n));
    ASSERT_TRUE(header["__metadata__"].contains("offload_train_model_spec"));
    header.erase("__metadata__");
    std::string text = header.dump();
    text.resize((text.size() + 7) / 8 * 8, ' ');
    const std::uint64_t m = text.size();
    reseal(dir_, "model.safetensors",
           std::string(reinterpret_cast<const char*>(&m), 8) + text + weights.substr(8 + n));
    EXPECT_HAS(error_of([&] { read_trainer_state(dir_); }), "does not record the model spec");
    edit_state(dir_, [](Json& s) { s["format_version"] = 1; });
    EXPECT_NO_THROW(read_trainer_state(dir_));
    reseal(dir_, "model.safetensors", weights);
    edit_state(dir_, [](Json& s) { s["format_version"] = 2; });
  }
  EXPECT_HAS(error_after([](Json& s) { s["model_spec"]["n_layer"] = 0; }),
             "\"model_spec\" is refused: model spec checkpoint: n_layer = 0");
  EXPECT_HAS(error_after([](Json& s) { s["data"] = 5; }), "\"data\" is not an object");
  EXPECT_HAS(error_after([](Json& s) { s["config"] = Json::array(); }),
             "\"config\" is not an object");
  EXPECT_HAS(error_after([](Json& s) { s.erase("config"); }), "\"config\" is missing");
  EXPECT_HAS(error_after([](Json& s) { s["run_id"] = 7; }), "\"run_id\" is 7; expected a string");
  EXPECT_HAS(error_after([](Json& s) { s["gemm_choices"] = Json::array(); }),
             "\"gemm_choices\" is []; expected a string");
  EXPECT_HAS(error_after([](Json& s) { s["saved_at_ns"] = -1; }), "\"saved_at_ns\" is -1");
  EXPECT_HAS(error_after([](Json& s) { s["rng"]["seed"] = -1; }), "\"rng.seed\" is -1");
  EXPECT_HAS(error_after([](Json& s) { s["optimizer_state_dtype"] = "fp64"; }),
             "\"optimizer_state_dtype\" is \"fp64\"");
  EXPECT_HAS(error_after([](Json& s) { s["master_weights_dtype"] = "fp16"; }),
             "\"master_weights_dtype\" is \"fp16\"; expected \"fp32\" or \"bf16\"");
}

// What the files hold must be what trainer_state.json says: its step is its folder's, the
// weights are in the master's dtype, the moments are where it places them.
TEST_F(TrainerState, TheStepTheWeightsAndTheMomentFilesAgreeWithIt) {
  EXPECT_HAS(error_after([](Json& s) { s["step"] = 5; }),
             "\"step\" is 5, but the checkpoint's folder is step_00000002, saved at step 2");
  EXPECT_HAS(error_after([](Json& s) { s.erase("optimizer_state_dtype"); }),
             "\"optimizer_state_dtype\" is missing");
  EXPECT_HAS(error_after([](Json& s) { s.erase("master_weights_dtype"); }),
             "\"master_weights_dtype\" is missing");
  const std::string e = error_after([](Json& s) { s["master_weights_dtype"] = "bf16"; });
  EXPECT_HAS(e, "model.safetensors holds ");
  EXPECT_HAS(e, " as F32, but trainer_state.json says the master weights are bf16 (BF16)");
  reseal(dir_, "optimizer.rank0-of1.safetensors", file_bytes(dir_ / "optimizer.safetensors"));
  EXPECT_HAS(error_of([&] { read_trainer_state(dir_); }),
             "holds optimizer.rank0-of1.safetensors, but trainer_state.json names no optimizer "
             "shards, so no load would read it");
  reseal(dir_, "optimizer.rank0-of1.safetensors", std::nullopt);
  EXPECT_NO_THROW(read_trainer_state(dir_));
  // A copy under a name of its own (a save's would be step_00000005) keeps whatever step it holds.
  const fs::path copy = tmp_.path / "step_5";
  fs::rename(dir_, copy);
  EXPECT_NO_THROW(read_trainer_state(copy));
  edit_state(copy, [](Json& s) { s["step"] = 3; });
  EXPECT_NO_THROW(read_trainer_state(copy));
}

TEST_F(TrainerState, DeepOrRepeatedJsonIsRefused) {
  const std::string text = file_bytes(dir_ / "trainer_state.json");
  // A second "step" after the real one: nlohmann would keep the later silently.
  reseal(dir_, "trainer_state.json", text.substr(0, text.rfind('}')) + ", \"step\": 0}");
  EXPECT_HAS(error_of([&] { read_trainer_state(dir_); }), "key \"step\" appears twice");
  // A million levels where the spec wants an integer: the old reader printed it.
  Json s = Json::parse(text);
  s["model_spec"]["n_layer"] = "DEEP";
  std::string deep = s.dump();
  deep.replace(deep.find("\"DEEP\""), 6, std::string(1 << 20, '[') + std::string(1 << 20, ']'));
  reseal(dir_, "trainer_state.json", deep);
  EXPECT_HAS(error_of([&] { read_trainer_state(dir_); }), "deeper than 64 levels");
}

TEST_F(TrainerState, ResumeRefusesADamagedDataCursor) {
  edit_state(dir_, [](Json& s) { s["data"]["batches_served"] = -1; });
  zo::train::TrainConfig c = tiny(4);
  c.resume = dir_.string();
  const std::string e = error_of([&] { zo::train::Trainer t(c); });
  EXPECT_HAS(e, "batches_served = -1 is not an integer in [0, ");
  edit_state(dir_, [](Json& s) {
    s["data"]["batches_served"] = 2;
    s["data"].erase("data");
  });
  const std::string missing = error_of([&] { zo::train::Trainer t(c); });
  EXPECT_HAS(missing, "checkpoint '" + dir_.string() + "': malformed data loader state");
  EXPECT_HAS(missing, "key 'data' not found; the checkpoint is damaged");
  EXPECT_EQ(missing.find("json.exception"), std::string::npos) << missing;
}

TEST_F(TrainerState, AFifoInTheCheckpointIsRefusedWithoutBlocking) {
  fs::remove(dir_ / "model.safetensors");
  ASSERT_EQ(::mkfifo((dir_ / "model.safetensors").c_str(), 0600), 0);
  EXPECT_HAS(zo::test::error_without_blocking(dir_ / "model.safetensors",
                                              [&] { read_trainer_state(dir_); }),
             "'model.safetensors' is a FIFO (named pipe), not a regular file");
}

TEST_F(TrainerState, TensorsNothingReadsAreRefused) {
  const zo::model::ParameterLayout layout(zo::model::load_model_spec("tiny"));
  zo::optim::HostOptimizer opt(layout, {});
  const auto f = zo::ckpt::SafetensorsFile::open(dir_ / "optimizer.safetensors");
  zo::ckpt::SafetensorsWriter w;
  std::vector<std::vector<float>> keep;
  for (const auto& t : f.tensors()) {
    keep.emplace_back(t.numel);
    f.read_f32(t.name, keep.back());
    w.add(t.name, t.shape, keep.back());
  }
  const std::vector<float> junk(3, 1.0f);
  w.add("exp_avg.h.9.mlp.c_fc.weight", {3}, junk);
  std::string bytes;
  w.stream([&](std::span<const std::byte> b) {
    bytes.append(reinterpret_cast<const char*>(b.data()), b.size());
  });
  reseal(dir_, "optimizer.safetensors", bytes);
  const std::string e = error_of([&] { zo::train::load_checkpoint(dir_, layout, opt); });
  EXPECT_HAS(e, "optimizer.safetensors");
  EXPECT_HAS(e, "'exp_avg.h.9.mlp.c_fc.weight' are not part of this checkpoint format");
}

// Saves a checkpoint of `layout` from 3 ranks (threads) that own interleaved pieces, as the
// offload engine's bucket shards do; master[i] = f(i). Returns each rank's error ("" if none).
std::vector<std::string> save_three_ranks(const zo::model::ParameterLayout& layout,
                                          const fs::path& parent,
                                          zo::StateFormat format = zo::StateFormat::kF32,
                                          zo::DType master = zo::DType::kF32) {
  const std::size_t L = layout.size(), step = 4099;  // pieces cut tensors anywhere
  std::vector<std::vector<zo::optim::OwnedRange>> parts(3);
  std::vector<std::size_t> local(3, 0);
  for (std::size_t b = 0, k = 0; b < L; b += step, ++k) {
    const std::size_t e = std::min(L, b + step), r = k % 3;
    parts[r].push_back({b, e, local[r]});
    local[r] += e - b;
  }
  auto hub = std::make_shared<zo::test::ThreadCommHub>(3);
  std::vector<std::string> errors(3);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 3; ++r) {
    ranks.emplace_back([&, r] {
      zo::test::ThreadComm comm(hub, r);
      zo::optim::OptimizerConfig oc;
      oc.state_format = format;
      oc.master_dtype = master;
      zo::optim::HostOptimizer opt(layout, oc, parts[std::size_t(r)]);
      for (const auto& o : parts[std::size_t(r)]) {
        std::vector<float> w(o.end - o.begin);
        for (std::size_t i = o.begin; i < o.end; ++i)
          w[i - o.begin] = std::sin(float(i)) * float(i % 97);
        opt.write_master(o.local, w);
      }
      for (const auto& seg : opt.segments()) {  // moments m[i] = f(i) / 100, v = |m|
        for (int k = 0; k < 2; ++k) {
          std::vector<float> v(seg.end - seg.begin);
          for (std::size_t j = 0; j < v.size(); ++j)
            v[j] = std::sin(float(seg.layout + j) * 0.37f) * (k == 0 ? 0.01f : 0.0001f);
          if (k == 1)
            for (float& x : v)
              x = std::fabs(x);
          opt.write_moment(k, seg.begin, v);
        }
      }
      const Json state = {{"step", 1},
                          {"tokens", 64},
                          {"data", Json::object()},
                          {"config", Json::object()},
                          {"optimizer_state_dtype", std::string(zo::state_format_name(format))}};
      errors[std::size_t(r)] =
          error_of([&] { zo::train::save_checkpoint(parent, layout, opt, state, 0, comm, parts); });
    });
  }
  for (auto& t : ranks)
    t.join();
  return errors;
}

// q8 state's block maxima are bytes of optimizer.safetensors like any other: one flipped is
// caught by the manifest's checksum before anything is read; a NaN maximum written with a
// matching checksum (a damaged writer) reads as NaN moments, which the resume refuses naming the
// tensor; a negative, infinite or subnormal one, which no update writes, is refused as read.
TEST(Q8Checkpoint, DamagedScalesAreCaughtByTheChecksumOrTheCheck) {
  Scratch tmp;
  zo::train::TrainConfig c = tiny(2);
  c.optimizer_state = zo::StateFormat::kQ8;
  c.checkpoint_dir = tmp.path.string();
  zo::train::Trainer(c).run();
  const fs::path dir = tmp.path / "step_00000002", file = dir / "optimizer.safetensors";
  const auto f = zo::ckpt::SafetensorsFile::open(file);
  const zo::ckpt::TensorInfo* scale = nullptr;
  for (const auto& t : f.tensors())
    if (t.name == "exp_avg_absmax.wte.weight") scale = &t;
  ASSERT_NE(scale, nullptr);
  const std::uint64_t at = 8 + f.header_size() + scale->data_begin;
  const std::string good = file_bytes(file);
  std::string bad = good;
  bad[at] = static_cast<char>(bad[at] ^ 0x10);
  std::ofstream(file, std::ios::binary) << bad;
  zo::train::TrainConfig r = tiny(3);
  r.resume = dir.string();
  r.checkpoint_dir = tmp.path.string();
  std::string e = error_of([&] { zo::train::Trainer t(r); });
  EXPECT_HAS(e, "'optimizer.safetensors' is corrupted: CRC-32C");

  const float nan = std::numeric_limits<float>::quiet_NaN();
  bad = good;
  std::memcpy(bad.data() + at, &nan, 4);
  reseal(dir, "optimizer.safetensors", bad);
  e = error_of([&] { zo::train::Trainer t(r); });
  EXPECT_HAS(e,
             "Adam m of wte.weight [0, 0]: nan (the first element of a q8 block of 2048 that "
             "is NaN as a whole)");
  EXPECT_HAS(e, "cannot be trained from");
  // Maxima of another dtype: the message says what q8's are.
  bad = good;
  const std::size_t dtype = bad.find("\"F32\"", bad.find("\"exp_avg_absmax.wte.weight\""));
  ASSERT_NE(dtype, std::string::npos);
  bad.replace(dtype, 5, "\"I32\"");
  reseal(dir, "optimizer.safetensors", bad);
  EXPECT_HAS(error_of([&] { zo::train::Trainer t(r); }),
             "tensor 'exp_avg_absmax.wte.weight' is I32, but trainer_state.json says the "
             "optimizer state is q8, whose block maxima are F32");

  // Maxima no update writes, resealed: a negative one would flip the block's m silently.
  for (const float x : {-0.5f, -0.0f, std::numeric_limits<float>::infinity(), 1e-40f}) {
    bad = good;
    std::memcpy(bad.data() + at, &x, 4);
    reseal(dir, "optimizer.safetensors", bad);
    e = error_of([&] { zo::train::Trainer t(r); });
    EXPECT_HAS(e, "tensor 'exp_avg_absmax.wte.weight' holds");
    EXPECT_HAS(e, "as the maximum of block 0");
    EXPECT_HAS(e, "changed after it was saved");
  }
  reseal(dir, "optimizer.safetensors", good);
  EXPECT_EQ(error_of([&] { zo::train::Trainer t(r); }), "(no error)");
}

// No rank holds the model whole: rank 0 writes model.safetensors as every rank all-gathers it
// piece by piece. The file is byte for byte that of one process holding the same master, for
// GPT-2 (transposed tensors) and a Llama, with an fp32 and a bf16 master.
TEST(ShardedSave, TheGatheredModelFileIsTheWholeModels) {
  for (const auto master : {zo::DType::kF32, zo::DType::kBF16})
    for (const char* name : {"tiny", "tiny-llama"}) {
      Scratch tmp;
      const zo::model::ParameterLayout layout(zo::model::load_model_spec(name));
      for (const std::string& e :
           save_three_ranks(layout, tmp.path / "three", zo::StateFormat::kF32, master))
        EXPECT_EQ(e, "(no error)");
      zo::optim::OptimizerConfig oc;
      oc.master_dtype = master;
      zo::optim::HostOptimizer whole(layout, oc);
      std::vector<float> w(layout.size());
      for (std::size_t i = 0; i < layout.size(); ++i)
        w[i] = std::sin(float(i)) * float(i % 97);
      whole.write_master(0, w);
      const Json state = {
          {"step", 1}, {"tokens", 64}, {"data", Json::object()}, {"config", Json::object()}};
      zo::train::save_checkpoint(tmp.path / "one", layout, whole, state, 0);
      EXPECT_EQ(file_bytes(tmp.path / "three/step_00000001/model.safetensors"),
                file_bytes(tmp.path / "one/step_00000001/model.safetensors"))
          << name;
    }
}

// q8 state saved by three ranks (their blocks start where their ranges cut tensors) reads into
// one process as the same moments to within a code: its blocks are quantized anew. Read by three
// ranks again, they are the same bits.
TEST(ShardedSave, Q8StateResumesWithAnotherRankCountRequantized) {
  Scratch tmp;
  const zo::model::ParameterLayout layout(zo::model::load_model_spec("tiny"));
  for (const std::string& e : save_three_ranks(layout, tmp.path, zo::StateFormat::kQ8))
    ASSERT_EQ(e, "(no error)");
  const fs::path dir = tmp.path / "step_00000001";
  zo::optim::OptimizerConfig oc;
  oc.state_format = zo::StateFormat::kQ8;
  zo::optim::HostOptimizer whole(layout, oc);
  zo::train::load_checkpoint(dir, layout, whole);
  std::vector<float> m(layout.size()), v(layout.size());
  whole.read_moment(0, 0, m);
  whole.read_moment(1, 0, v);
  for (std::size_t i = 0; i < layout.size(); ++i) {
    // A code of the dynamic map is at most 1.4% of its block's maximum away (0.9 / 64).
    const float want_m = std::sin(float(i) * 0.37f) * 0.01f;
    const float want_v = std::fabs(std::sin(float(i) * 0.37f) * 0.0001f);
    ASSERT_NEAR(m[i], want_m, 0.03f * 0.01f) << i;
    ASSERT_NEAR(v[i], want_v, 0.03f * 0.0001f) << i;
  }
  // Saved by one process and loaded again: the same bits.
  const Json state = {
      {"step", 1}, {"tokens", 64}, {"data", Json::object()}, {"config", Json::object()}};
  const fs::path again = zo::train::save_checkpoint(tmp.path / "one", layout, whole, state, 0);
  zo::optim::HostOptimizer back(layout, oc);
  zo::train::load_checkpoint(again, layout, back);
  const auto a = whole.q8(), b = back.q8();
  EXPECT_TRUE(std::equal(a.m.begin(), a.m.end(), b.m.begin()));
  EXPECT_TRUE(std::equal(a.v.begin(), a.v.end(), b.v.begin()));
  EXPECT_EQ(std::memcmp(a.m_absmax.data(), b.m_absmax.data(), a.m_absmax.size() * 4), 0);
  EXPECT_EQ(std::memcmp(a.v_absmax.data(), b.v_absmax.data(), a.v_absmax.size() * 4), 0);

  // A negative block maximum in a shard, resealed, is refused naming the parameter it belongs to.
  const std::string shard = "optimizer.rank1-of3.safetensors";
  const auto f = zo::ckpt::SafetensorsFile::open(dir / shard);
  const zo::ckpt::TensorInfo* scale = nullptr;
  for (const auto& t : f.tensors())
    if (t.name == "exp_avg_sq_absmax") scale = &t;
  ASSERT_NE(scale, nullptr);
  std::string bad = file_bytes(dir / shard);
  const float negative = -0.25f;
  std::memcpy(bad.data() + 8 + f.header_size() + scale->data_begin, &negative, 4);
  reseal(dir, shard, bad);
  zo::optim::HostOptimizer refused(layout, oc);
  const std::string e = error_of([&] { zo::train::load_checkpoint(dir, layout, refused); });
  EXPECT_HAS(e, shard);
  EXPECT_HAS(e, "tensor 'exp_avg_sq_absmax' (the blocks of '");
  EXPECT_HAS(e, "holds -0.25 as the maximum of block 0");
}

// A write that fails on rank 0 halfway through the model file (the file-size limit stands in for
// a full disk) ends the save on every rank with an error, none left waiting in a gather, and no
// checkpoint published.
TEST(ShardedSave, AFailedModelFileOnRankZeroFailsEveryRank) {
  Scratch tmp;
  const zo::model::ParameterLayout layout(zo::model::load_model_spec("tiny"));
  std::vector<std::string> errors;
  {
    // Each rank's shard holds 2 x 4 B x L / 3, the model file 4 B x L: the limit is between.
    const zo::test::FileSizeLimit limit(layout.size() * 10 / 3);
    if (!limit.active()) GTEST_SKIP() << "cannot lower RLIMIT_FSIZE here";
    errors = save_three_ranks(layout, tmp.path);
  }
  EXPECT_HAS(errors[0], "File too large");
  for (int r : {1, 2})
    EXPECT_HAS(errors[std::size_t(r)], "other rank(s) could not write their checkpoint shard");
  EXPECT_FALSE(fs::exists(tmp.path / "step_00000001"));
}

// A checkpoint of two ranks (threads) owning [0, L/2) and [L/2, L); every moment is its index.
class ShardedCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::size_t L = layout_.size(), h = L / 2;
    const std::vector<std::vector<zo::optim::OwnedRange>> parts = {{{0, h, 0}}, {{h, L, 0}}};
    auto hub = std::make_shared<zo::test::ThreadCommHub>(2);
    std::vector<std::thread> ranks;
    for (int r = 0; r < 2; ++r) {
      ranks.emplace_back([&, r] {
        zo::test::ThreadComm comm(hub, r);
        zo::optim::HostOptimizer opt(layout_, {}, parts[std::size_t(r)]);
        for (std::size_t i = 0; i < opt.size(); ++i) {
          static_cast<float*>(opt.exp_avg().data)[i] = float(parts[std::size_t(r)][0].begin + i);
          static_cast<float*>(opt.exp_avg_sq().data)[i] = 1.0f;
        }
        const Json state = {
            {"step", 1}, {"tokens", 64}, {"data", Json::object()}, {"config", Json::object()}};
        zo::train::save_checkpoint(tmp_.path, layout_, opt, state, 0, comm, parts);
      });
    }
    for (auto& t : ranks)
      t.join();
  }
  std::string load_error() {
    zo::optim::HostOptimizer opt(layout_, {});
    return error_of([&] { zo::train::load_checkpoint(dir_, layout_, opt); });
  }
  std::string error_with_ranges(const Json& r0, const Json& r1) {
    edit_state(dir_, [&](Json& s) {
      s["optimizer_shards"]["files"][0]["ranges"] = r0;
      s["optimizer_shards"]["files"][1]["ranges"] = r1;
    });
    return load_error();
  }
  Scratch tmp_;
  const zo::model::ParameterLayout layout_{zo::model::load_model_spec("tiny")};
  fs::path dir_ = tmp_.path / "step_00000001";
};

TEST_F(ShardedCheckpoint, RangesAreCheckedAsASetBeforeAnythingIsRead) {
  zo::optim::HostOptimizer whole(layout_, {});
  zo::train::load_checkpoint(dir_, layout_, whole);
  EXPECT_EQ(static_cast<float*>(whole.exp_avg().data)[layout_.size() - 1],
            float(layout_.size() - 1));

  const std::uint64_t L = layout_.size(), h = L / 2,
                      max = std::numeric_limits<std::uint64_t>::max();
  const std::string k = "\"optimizer_shards.files[";
  EXPECT_HAS(error_with_ranges({{-1, h}}, {{h, L}}), k + "0].ranges[0]\" is -1;");
  EXPECT_HAS(error_with_ranges({{0, h}}, {{max, L}}),
             k + "1].ranges[0]\" is 18446744073709551615;");
  EXPECT_HAS(error_with_ranges({{0, h}}, {{h, L + 5}}), "expected an integer in [0, the layout's");
  EXPECT_HAS(error_with_ranges({{0, h}}, {{h - 1, L}}), "has ranges that overlap at parameter");
  // Overlapping, yet every file's size matches its tensors: the old reader copied garbage.
  EXPECT_HAS(error_with_ranges({{0, h}}, {{h - 5, L - 5}}),
             "has ranges that overlap at parameter " + std::to_string(h - 5));
  EXPECT_HAS(error_with_ranges({{0, h}}, {{h + 1, L}}), "to no shard");
  EXPECT_HAS(error_with_ranges({{0, h}}, {{h, L - 1}}), "covers " + std::to_string(L - 1));
  EXPECT_HAS(error_with_ranges({{h / 2, h}, {0, h / 2}}, {{h, L}}),
             "a non-empty range after the file's previous one");
  EXPECT_HAS(error_with_ranges({{0, h}, {h, h}}, {{h, L}}), "a non-empty range");
  // Tiling ranges whose sizes disagree with the shards' tensors.
  EXPECT_HAS(error_with_ranges({{0, h + 1}}, {{h + 1, L}}),
             "holds " + std::to_string(h) + " elements, but trainer_state.json gives this shard " +
                 std::to_string(h + 1) +
                 " (its optimizer_shards ranges); the shard files were "
                 "swapped or changed after the save");
  edit_state(dir_, [&](Json& s) {
    s["optimizer_shards"]["files"][0]["ranges"] = {{0, h}};
    s["optimizer_shards"]["files"][1]["ranges"] = {{h, L}};
    s["optimizer_shards"]["files"][1]["file"] = "../model.safetensors";
  });
  EXPECT_HAS(load_error(), "expected \"optimizer.rank1-of2.safetensors\"");
  edit_state(dir_, [](Json& s) { s["optimizer_shards"]["ranks"] = 3; });
  EXPECT_HAS(load_error(), "one entry per rank (ranks = 3)");
  edit_state(dir_, [](Json& s) {
    s["optimizer_shards"]["ranks"] = 2;
    s["optimizer_shards"]["files"][1]["file"] = "optimizer.rank1-of2.safetensors";
  });
  reseal(dir_, "optimizer.rank1-of2.safetensors", std::nullopt);
  EXPECT_HAS(load_error(),
             "lacks optimizer.rank1-of2.safetensors, the optimizer shard "
             "trainer_state.json names");
}

TEST(TrainFlags, NonFiniteOrOutOfRangeNumbersAreRefusedNamingTheFlag) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::nanf("");
  const std::pair<std::function<void(zo::train::TrainConfig&)>, const char*> cases[] = {
      {[&](auto& c) { c.eps = inf; }, "--adam-eps"},
      {[&](auto& c) { c.weight_decay = inf; }, "--weight-decay"},
      {[&](auto& c) { c.beta2 = nan; }, "--beta2"},
      {[&](auto& c) { c.grad_clip = inf; }, "--grad-clip"},
      {[&](auto& c) { c.val_fraction = nan; }, "--val-fraction"},
      {[&](auto& c) { c.loss_scale_backoff = nan; }, "--loss-scale-backoff"},
      {[&](auto& c) { c.loss_scale_max = inf; }, "--loss-scale-max"},
      {[&](auto& c) { c.comm_timeout = inf; }, "--comm-timeout"},
      {[&](auto& c) { c.comm_timeout = 1e300; }, "--comm-timeout"},
      {[&](auto& c) { c.comm_timeout = nan; }, "--comm-timeout"},
      {[&](auto& c) { c.state_chunk_elements = 2047; }, "--state-chunk must be a multiple of 2048"},
      {[&](auto& c) { c.state_chunk_elements = 3000; }, "--state-chunk must be a multiple of 2048"},
      {[&](auto& c) { c.adam_threads = 16777216; }, "--adam-threads must be 0 (all cores) to 4096"},
      {[&](auto& c) { c.adam_threads = -3; }, "--adam-threads must be 0 (all cores) to 4096"},
      {[&](auto& c) { c.threads = 1 << 30; }, "--threads must be 0 (all cores) to 4096"},
      {[&](auto& c) { c.state_chunk_elements = std::size_t{1} << 31; }, "--state-chunk"},
      {[&](auto& c) { c.state_chunk_elements = 8192; },
       "add --state-dir DIR or drop --state-chunk"},
  };
  for (const auto& [set, flag] : cases) {
    zo::train::TrainConfig c = tiny(1);
    set(c);
    EXPECT_HAS(error_of([&] { c.validate_flags(); }), flag);
  }
}

// Thread counts above the CPUs the process may use run at that count (oneTBB's limit): the
// banner says so.
TEST(TrainFlags, MoreThreadsThanTheMachineHasAreNamedInTheBanner) {
  const int hw = tbb::info::default_concurrency();
  if (hw <= 0 || hw >= zo::train::kMaxThreads) GTEST_SKIP() << "CPUs: " << hw;
  zo::train::TrainConfig c = tiny(1);
  c.quiet = false;
  c.eval_batches = 1;
  c.adam_threads = zo::train::kMaxThreads;
  std::string out;
  zo::train::Trainer(c).run([&](const std::string& s) { out += s + "\n"; });
  EXPECT_HAS(out, "--adam-threads 4096: this process may use " + std::to_string(hw) +
                      " CPUs, so at most " + std::to_string(hw) + " run");
  EXPECT_EQ(out.find("--threads "), std::string::npos) << out;
}

// q8 state on a CPU Adam path without AVX-512 is slower than fp32 state: the banner says so, and
// only there.
TEST(TrainFlags, Q8StateWithoutAvx512IsNamedInTheBanner) {
  const auto banner = [](zo::cpu_adam::Isa isa) {
    struct ForcedIsa {  // restored however the run ends
      std::optional<std::string> was;
      explicit ForcedIsa(zo::cpu_adam::Isa isa) {
        if (const char* v = std::getenv("ZO_CPU_ADAM_ISA")) was = v;
        setenv("ZO_CPU_ADAM_ISA", std::string(zo::cpu_adam::isa_name(isa)).c_str(), 1);
      }
      ~ForcedIsa() {
        if (was) {
          setenv("ZO_CPU_ADAM_ISA", was->c_str(), 1);
        } else {
          unsetenv("ZO_CPU_ADAM_ISA");
        }
      }
    } forced(isa);
    zo::train::TrainConfig c = tiny(1);
    c.quiet = false;
    c.eval_batches = 1;
    c.mode = "offload";
    c.optimizer_state = zo::StateFormat::kQ8;
    std::string out;
    zo::train::Trainer(c).run([&](const std::string& s) { out += s + "\n"; });
    return out;
  };
  const std::string note = "--optimizer-state q8 on CPU Adam's ";
  EXPECT_HAS(banner(zo::cpu_adam::Isa::kScalar), note + "scalar path (no AVX-512)");
  if (zo::cpu_adam::isa_supported(zo::cpu_adam::Isa::kAvx2)) {
    EXPECT_HAS(banner(zo::cpu_adam::Isa::kAvx2), note + "avx2 path (no AVX-512)");
  }
  if (zo::cpu_adam::isa_supported(zo::cpu_adam::Isa::kAvx512)) {
    const std::string out = banner(zo::cpu_adam::Isa::kAvx512);
    EXPECT_EQ(out.find(note), std::string::npos) << out;
  }
}

TEST(Sample, NoTokensAndBadNumbers) {
  zo::train::SampleConfig s;
  s.weights.checkpoint = trained_checkpoint().string();
  s.prompt = {1, 2, 3};
  s.new_tokens = 0;  // returned with the upload still pending, freeing its buffer under it
  EXPECT_EQ(zo::train::generate(s), s.prompt);
  s.new_tokens = 2;
  for (float t : {std::numeric_limits<float>::infinity(), std::nanf(""), -1.0f}) {
    s.temperature = t;
    EXPECT_HAS(error_of([&] { zo::train::generate(s); }), "--temperature must be finite and >= 0");
  }
  s.temperature = 1.0f;
  s.top_k = 257;
  EXPECT_HAS(error_of([&] { zo::train::generate(s); }),
             "--top-k 257 exceeds the model's vocabulary of 256");
  s.top_k = 256;
  EXPECT_EQ(zo::train::generate(s).size(), 5u);
  // Each new token reaches the sink as it is picked, after the vocabulary is known.
  int vocab = 0;
  std::vector<std::int32_t> streamed;
  const auto seq = zo::train::generate(s, &vocab, nullptr, [&](std::int32_t id) {
    EXPECT_EQ(vocab, 256);
    streamed.push_back(id);
  });
  ASSERT_EQ(seq.size(), 5u);
  EXPECT_EQ(streamed, std::vector<std::int32_t>(seq.begin() + 3, seq.end()));
}

// NaN or Inf weights are refused by sample and eval before they run, naming the first, as
// train refuses them. Finite weights that overflow fp32 in use (3e38 in an MLP) give logits with
// no distribution to sample from: sample and eval stop with an error naming the token or batch,
// where sample used to reach std::discrete_distribution with NaN weights.
TEST(Sample, NonFiniteWeightsOrLogitsAreAnErrorNamingTheTensorOrToken) {
  const float inf = std::numeric_limits<float>::infinity();
  for (const float v : {std::nanf(""), inf, 3e38f}) {
    Scratch tmp;
    const fs::path dir = tmp.path / "step_00000002";
    fs::copy(trained_checkpoint(), dir, fs::copy_options::recursive);
    set_weights(dir, v == 3e38f ? "h.1.mlp.c_fc.weight" : "h.0.attn.c_attn.bias", v);
    zo::train::SampleConfig s;
    s.weights.checkpoint = dir.string();
    s.prompt = {1, 2, 3};
    s.new_tokens = 4;
    zo::train::EvalConfig c;
    c.weights.checkpoint = dir.string();
    c.data = "synthetic";
    c.micro_batch = 2;
    c.seq_len = 16;
    c.batches = 3;
    if (v != 3e38f) {
      const std::string named = "checkpoint '" + dir.string() +
                                "' holds weights that are not finite in fp32: "
                                "h.0.attn.c_attn.bias [0] = " +
                                (std::isnan(v) ? "nan" : "inf");
      EXPECT_HAS(error_of([&] { zo::train::generate(s); }), named);
      EXPECT_HAS(error_of([&] { zo::train::evaluate(c); }), named);
      continue;
    }
    for (const float temperature : {1.0f, 0.0f}) {
      s.temperature = temperature;
      const std::string e = error_of([&] { zo::train::generate(s); });
      EXPECT_HAS(e, "new token 1 (position 2): the model's logits hold 256 non-finite values");
      EXPECT_HAS(e, "weights hold Inf or NaN, or overflow in fp32");
    }
    const std::string e = error_of([&] { zo::train::evaluate(c); });
    EXPECT_HAS(e, "batch 1 of 3, sequence 1 token 1, has a non-finite loss");
  }
}

// export refuses weights that are not finite in the output dtype, naming the first, unless
// --allow-nonfinite: NaN in any dtype, 1e5 in fp16 only (above 65504).
TEST(Export, WeightsThatAreNotFiniteAreRefusedUnlessAllowed) {
  Scratch tmp;
  const fs::path dir = tmp.path / "step_00000002";
  fs::copy(trained_checkpoint(), dir, fs::copy_options::recursive);
  zo::train::ExportConfig c;
  c.checkpoint = dir.string();
  c.out = (tmp.path / "out.safetensors").string();
  set_weights(dir, "h.1.mlp.c_proj.bias", 1e5f);
  EXPECT_NO_THROW(zo::train::export_checkpoint(c));  // fp32
  c.force = true;
  c.dtype = zo::DType::kF16;
  std::string e = error_of([&] { zo::train::export_checkpoint(c); });
  EXPECT_HAS(e, "h.1.mlp.c_proj.bias [0] = 100000.000000, beyond fp16's range");
  EXPECT_HAS(e, "--dtype bf16 or fp32");
  c.dtype = zo::DType::kBF16;
  EXPECT_NO_THROW(zo::train::export_checkpoint(c));
  set_weights(dir, "h.0.attn.c_attn.bias", std::nanf(""));
  e = error_of([&] { zo::train::export_checkpoint(c); });
  EXPECT_HAS(e, "not finite in bf16: h.0.attn.c_attn.bias [0] = nan");
  EXPECT_HAS(e, "--allow-nonfinite");
  c.allow_nonfinite = true;
  EXPECT_NO_THROW(zo::train::export_checkpoint(c));
}

// The room a run asks of --checkpoint-dir's drive: one checkpoint, or it does not start; fewer
// than it keeps at once is said.
TEST(CheckpointRoom, OneCheckpointOrTheRunDoesNotStart) {
  using zo::train::check_checkpoint_room;
  EXPECT_HAS(error_of([] { check_checkpoint_room("ck", 999, 1000, 3, 2); }),
             "less than one checkpoint of this model");
  EXPECT_EQ(check_checkpoint_room("ck", 3000, 1000, 3, 2), "");
  EXPECT_HAS(check_checkpoint_room("ck", 2999, 1000, 3, 2),
             "free for 3 checkpoints of 1000 B at once (--keep 2 and the save in progress)");
  EXPECT_HAS(check_checkpoint_room("ck", 1000, 1000, 5, 0), "--keep 0 keeps every save");
  // Many saves of a large model: their product exceeds 2^64, the drive still falls short.
  EXPECT_HAS(check_checkpoint_room("ck", std::uint64_t{1} << 40, std::uint64_t{1} << 36,
                                   std::uint64_t{1} << 30, 0),
             "a later save may find the drive full");
}

// A bad element is named by its index in the file (Hugging Face's shape): a GPT-2 Conv1D weight
// is stored transposed, so element (out 5, in 2) of c_fc is [2, 5] there.
TEST(Export, ABadWeightIsNamedByItsIndexInTheFile) {
  const zo::model::ParameterLayout layout(zo::model::load_model_spec("tiny"));
  const auto& fc = *std::find_if(layout.tensors().begin(), layout.tensors().end(),
                                 [](const auto& t) { return t.name == "h.1.mlp.c_fc.weight"; });
  ASSERT_TRUE(fc.hf_transposed);
  const std::size_t in = fc.shape[1];
  std::vector<float> w(fc.numel, 0.5f);
  w[5 * in + 2] = std::nanf("");
  EXPECT_EQ(zo::train::first_nonfinite_weight(layout, fc.offset, w, zo::DType::kF32),
            "h.1.mlp.c_fc.weight [2, 5] = nan");
  const auto& bias = layout.tensor_at(fc.offset + fc.numel);
  std::vector<float> b(bias.numel, 0.5f);
  b[7] = std::numeric_limits<float>::infinity();
  EXPECT_EQ(zo::train::first_nonfinite_weight(layout, bias.offset, b, zo::DType::kF32),
            bias.name + " [7] = inf");
}

TEST(Sample, TheSamplerRefusesLogitsWithoutADistribution) {
  zo::train::TokenSampler pick(1.0f, 0, 1.0f, 3);
  const float inf = std::numeric_limits<float>::infinity();
  for (const std::vector<float>& row :
       {std::vector<float>{-inf, -inf, -inf}, std::vector<float>{0.0f, std::nanf(""), 1.0f},
        std::vector<float>{inf, 0.0f, 1.0f}}) {
    EXPECT_HAS(error_of([&] { pick(row); }), "the logits are not finite");
  }
  EXPECT_EQ(pick({-inf, 2.0f, -inf}), 1);  // -Inf alone is a zero probability
}

}  // namespace
