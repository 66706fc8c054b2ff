// The Llama family end to end on the host backend, as test_train.cpp does for GPT-2: offload
// equals resident, resume bit for bit, the synthetic task is learned, exported weights import
// back and export again byte for byte, and sampling runs.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"
#include "input_test.h"
#include "model/hf_weights.h"
#include "model/layout.h"
#include "train/checkpoint_io.h"
#include "train/trainer.h"

namespace {

namespace fs = std::filesystem;
using zo::test::Scratch;
using zo::train::TrainConfig;
using zo::train::Trainer;

TrainConfig llama_config(const std::string& model, std::int64_t steps) {
  TrainConfig c;
  c.model = model;
  c.steps = steps;
  c.micro_batch = 2;
  c.seq_len = 32;
  c.lr.max_lr = 3e-3f;
  c.lr.warmup_steps = 2;
  c.lr.total_steps = steps;
  c.eval_batches = 2;
  c.quiet = true;
  return c;
}

std::string bytes_of(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

void expect_same_state(const fs::path& a, const fs::path& b) {
  for (const char* f : {"model.safetensors", "optimizer.safetensors"})
    EXPECT_EQ(bytes_of(a / f), bytes_of(b / f)) << f;
}

class LlamaTraining : public ::testing::TestWithParam<const char*> {};

// Clipping off, as in Trainer.ResidentModeEqualsOffloadModeOnTheHost: with it the norm is summed
// per bucket in offload mode and the clip coefficient may differ in the last bit.
TEST_P(LlamaTraining, OffloadEqualsResident) {
  Scratch a, b;
  TrainConfig off = llama_config(GetParam(), 5);
  off.grad_clip = 0.0f;
  off.mode = "offload";
  off.bucket_size = 4099;  // cuts the layout everywhere but inside fused q|k|v and gate|up
  off.checkpoint_dir = a.path.string();
  TrainConfig res = off;
  res.mode = "resident";
  res.checkpoint_dir = b.path.string();
  const auto s1 = Trainer(off).run();
  const auto s2 = Trainer(res).run();
  EXPECT_EQ(s1.losses, s2.losses);
  expect_same_state(a.path / "step_00000005", b.path / "step_00000005");
}

// Stream mode (the default window: both blocks of these models, filled again after every
// update) trains like offload mode, bit for bit; tiny-llama's head is untied, tiny-qwen2's tied.
TEST_P(LlamaTraining, StreamEqualsOffload) {
  Scratch a, b;
  TrainConfig off = llama_config(GetParam(), 4);
  off.mode = "offload";
  off.checkpoint_dir = a.path.string();
  TrainConfig st = off;
  st.mode = "stream";
  st.checkpoint_dir = b.path.string();
  EXPECT_EQ(Trainer(st).run().losses, Trainer(off).run().losses);
  expect_same_state(a.path / "step_00000004", b.path / "step_00000004");
}

TEST_P(LlamaTraining, ResumeContinuesBitForBit) {
  Scratch a, b;
  TrainConfig c = llama_config(GetParam(), 6);
  c.checkpoint_dir = a.path.string();
  c.checkpoint_interval = 3;
  c.keep_last = 0;
  c.mode = "offload";
  const auto full = Trainer(c).run();
  fs::copy(a.path / "step_00000003", b.path / "step_00000003", fs::copy_options::recursive);
  TrainConfig r = c;
  r.checkpoint_dir = b.path.string();
  r.resume = "latest";
  r.model.clear();  // the checkpoint's Llama spec
  const auto resumed = Trainer(r).run();
  ASSERT_EQ(resumed.losses.size(), 3u);
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(resumed.losses[std::size_t(i)], full.losses[std::size_t(3 + i)]) << "step " << 4 + i;
  expect_same_state(a.path / "step_00000006", b.path / "step_00000006");
}

INSTANTIATE_TEST_SUITE_P(Models, LlamaTraining, ::testing::Values("tiny-llama", "tiny-qwen2"),
                         [](const auto& test) {
                           std::string n = test.param;
                           for (char& ch : n)
                             if (ch == '-') ch = '_';
                           return n;
                         });

// The synthetic Markov chain (entropy rate about 1.0 nats for vocabulary 256) is learned.
TEST(LlamaTraining, LearnsTheSyntheticTask) {
  TrainConfig c = llama_config("tiny-llama", 120);
  c.micro_batch = 4;
  c.lr.warmup_steps = 10;
  c.eval_interval = 0;
  const auto s = Trainer(c).run();
  ASSERT_TRUE(s.final_val_loss.has_value());
  EXPECT_NEAR(s.first_loss, std::log(256.0), 0.3);
  EXPECT_LT(*s.final_val_loss, 2.5) << "from " << s.first_loss;
}

// Weights leave with Hugging Face Llama names and come back exactly; exporting what was
// imported gives the same file.
TEST(LlamaTraining, ExportImportExportIsByteIdentical) {
  Scratch d;
  TrainConfig c = llama_config("tiny-llama", 2);
  c.checkpoint_dir = (d.path / "ck").string();
  Trainer(c).run();
  const fs::path ckpt = d.path / "ck" / "step_00000002";
  const auto spec = zo::train::checkpoint_spec(zo::train::read_trainer_state(ckpt));
  EXPECT_EQ(spec.model_type, "llama");
  const zo::model::ParameterLayout layout(spec);
  std::vector<float> w(layout.size());
  zo::model::import_hf_weights(ckpt / "model.safetensors", layout, w);
  for (zo::DType dt : {zo::DType::kF32, zo::DType::kBF16}) {
    const fs::path first = d.path / "first.safetensors", second = d.path / "second.safetensors";
    zo::model::export_hf_weights(first, layout, zo::model::hf_source(w), dt);
    const auto f = zo::ckpt::SafetensorsFile::open(first);
    EXPECT_EQ(f.info("model.layers.1.self_attn.k_proj.weight").shape,
              (std::vector<std::uint64_t>{32, 64}));  // nn.Linear (out, in): 2 kv heads of 16
    EXPECT_EQ(f.info("lm_head.weight").shape, (std::vector<std::uint64_t>{256, 64}));
    std::vector<float> back(layout.size());
    zo::model::import_hf_weights(first, layout, back);
    zo::model::export_hf_weights(second, layout, zo::model::hf_source(back), dt);
    EXPECT_EQ(bytes_of(first), bytes_of(second)) << zo::dtype_name(dt);
    if (dt == zo::DType::kF32) {
      EXPECT_EQ(back, w);
    }
  }
  // Fine-tuning starts from imported Llama weights.
  TrainConfig f = llama_config("tiny-llama", 1);
  f.init_from = (d.path / "first.safetensors").string();
  EXPECT_NO_THROW(Trainer(f).run());
}

}  // namespace
