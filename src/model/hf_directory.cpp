// A Hugging Face model directory: config.json and the weights, sharded as save_pretrained does.
#include <algorithm>
#include <map>
#include <system_error>

#include "checkpoint/atomic_io.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/safetensors_set.h"
#include "core/error.h"
#include "model/hf_weights.h"

namespace zo::model {
namespace fs = std::filesystem;

namespace {

const char* torch_dtype(DType t) {
  return t == DType::kF32 ? "float32" : t == DType::kF16 ? "float16" : "bfloat16";
}

// GPT2LMHeadModel's config: the values this trainer implements (spec_gpt2.cpp accepts exactly
// these) and no dropout, as it trained.
nlohmann::json gpt2_config(const ModelSpec& s) {
  nlohmann::json j = {{"architectures", {"GPT2LMHeadModel"}},
                      {"model_type", "gpt2"},
                      {"n_layer", s.n_layer},
                      {"n_head", s.n_head},
                      {"n_embd", s.n_embd},
                      {"vocab_size", s.vocab_size},
                      {"n_positions", s.block_size},
                      {"n_ctx", s.block_size},
                      {"n_inner", nullptr},
                      {"activation_function", "gelu_new"},
                      {"layer_norm_epsilon", 1e-5},
                      {"initializer_range", 0.02},
                      {"attn_pdrop", 0.0},
                      {"embd_pdrop", 0.0},
                      {"resid_pdrop", 0.0},
                      {"scale_attn_weights", true},
                      {"scale_attn_by_inverse_layer_idx", false},
                      {"reorder_and_upcast_attn", false},
                      {"tie_word_embeddings", true},
                      {"use_cache", true}};
  // <|endoftext|> of the GPT-2 tokenizer, where the vocabulary has it.
  if (s.vocab_size > 50256) j.update({{"bos_token_id", 50256}, {"eos_token_id", 50256}});
  return j;
}

void remove_file(const fs::path& p) {
  std::error_code ec;
  fs::remove(p, ec);
  if (ec) {
    throw CheckpointError("cannot remove " + p.string() + " of a previous export (" + ec.message() +
                          "); remove it by hand or export elsewhere");
  }
}

}  // namespace

std::optional<fs::path> hf_config_beside(const fs::path& path) {
  std::error_code ec;
  const fs::path dir = fs::is_directory(path, ec) ? path : path.parent_path();
  const fs::path config = (dir.empty() ? fs::path(".") : dir) / "config.json";
  if (fs::is_regular_file(config, ec)) return config;
  return std::nullopt;
}

nlohmann::json hf_config(const ModelSpec& spec, DType dtype) {
  nlohmann::json j = spec.llama() ? spec.to_json() : gpt2_config(spec);
  j.erase("name");
  j["torch_dtype"] = torch_dtype(dtype);
  return j;
}

std::vector<std::string> export_hf_directory(const fs::path& dir, const ParameterLayout& layout,
                                             const HfSource& source, DType dtype,
                                             std::uint64_t max_shard_bytes) {
  if (max_shard_bytes == 0) throw std::invalid_argument("export: shard size must be positive");
  // The directories made here go again if the export fails (unless something else was put in).
  struct RemoveIfEmpty {
    fs::path dir, top;  // dir and its parents up to top; empty: none made
    ~RemoveIfEmpty() {
      std::error_code ignored;
      for (fs::path p = dir; !top.empty(); p = p.parent_path()) {
        if (!fs::remove(p, ignored) || p == top) break;  // removes only an empty directory
      }
    }
  } made{dir, {}};
  std::error_code ec;
  for (fs::path a = dir; !a.empty() && fs::status(a, ec).type() == fs::file_type::not_found;
       a = a.parent_path()) {
    made.top = a;
  }
  fs::create_directories(dir, ec);
  if (!fs::is_directory(dir)) {
    throw CheckpointError("cannot make the directory " + dir.string() + " (" +
                          (ec ? ec.message() : std::string("a file is in the way")) +
                          "); choose another path");
  }
  const auto& tensors = layout.tensors();
  std::vector<std::uint64_t> bytes;
  for (const auto& t : tensors)
    bytes.push_back(t.numel * dtype_size(dtype));
  std::vector<std::size_t> starts = ckpt::plan_shards(bytes, max_shard_bytes);
  const std::size_t n = starts.size();
  starts.push_back(tensors.size());

  // Every new file is written whole into a hidden folder inside `dir` (removed on any failure,
  // a full disk included) before one of the previous export's is touched; then renames put them
  // in place. Never committed: the folder is only a staging area.
  ckpt::remove_abandoned_saves(dir, kExportOwner);  // a killed export's, once its process is gone
  const ckpt::AtomicDirectory stage(dir / "export", ckpt::IfExists::kReplace, kExportOwner);
  const fs::path& staged = stage.temp_path();
  std::vector<std::string> written = {"config.json"};
  ckpt::write_file_atomic(staged / "config.json", hf_config(layout.spec(), dtype).dump(2) + "\n");
  std::map<std::string, std::string> weight_map;
  std::uint64_t total = 0;
  for (std::size_t k = 0; k < n; ++k) {
    const std::string file =
        n == 1 ? std::string(ckpt::kSingleWeightsName) : ckpt::shard_file_name(k + 1, n);
    ckpt::SafetensorsWriter w;
    for (std::size_t i = starts[k]; i < starts[k + 1]; ++i) {
      const TensorInfo& t = tensors[i];
      w.add_filled(t.name, hf_shape(t), dtype, hf_fill(t, source, dtype));
      weight_map.emplace(t.name, file);
      total += bytes[i];
    }
    w.write(staged / file);
    written.push_back(file);
  }
  if (n > 1) {
    ckpt::write_file_atomic(staged / ckpt::kWeightsIndexName,
                            ckpt::weights_index_json(total, weight_map));
    written.emplace_back(ckpt::kWeightsIndexName);
  }
  // The old index goes first and the new one comes last, so that no index names a mix of shards;
  // a rename that fails puts everything back.
  const std::string old_index[] = {std::string(ckpt::kWeightsIndexName)};
  ckpt::replace_files(staged, written, dir, old_index);
  made.top.clear();
  // The rest of a previous export, which the new index (or model.safetensors) would contradict.
  std::vector<fs::path> stale;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    const bool ours = std::find(written.begin(), written.end(), name) != written.end();
    if (!ours && (ckpt::is_shard_file_name(name) || name == ckpt::kSingleWeightsName)) {
      stale.push_back(entry.path());
    }
  }
  for (const fs::path& p : stale)
    remove_file(p);
  return written;
}

}  // namespace zo::model
