#include "train/trainer_state.h"

#include <algorithm>
#include <cfloat>
#include <limits>
#include <optional>
#include <stdexcept>

#include "checkpoint/atomic_io.h"
#include "core/error.h"
#include "train/checkpoint_io.h"
#include "train/config.h"

namespace zo::train {
namespace fs = std::filesystem;
namespace {

using Json = nlohmann::json;

std::string brief(const Json& v) {
  const std::string s = v.dump();  // safe: the parser bounds the depth
  return s.size() > 60 ? s.substr(0, 57) + "..." : s;
}

[[noreturn]] void refuse(const fs::path& dir, const std::string& key, const std::string& problem) {
  throw CheckpointError("checkpoint '" + dir.string() + "': trainer_state.json: \"" + key + "\" " +
                        problem +
                        ". The file is damaged or was not written by this version of "
                        "offload_train; resume from another checkpoint");
}

const Json& member(const Json& obj, const std::string& path, const std::string& key,
                   const fs::path& dir) {
  const std::string name = path.empty() ? key : path + "." + key;
  if (!obj.contains(key)) refuse(dir, name, "is missing");
  return obj[key];
}

const Json& object_member(const Json& obj, const std::string& path, const std::string& key,
                          const fs::path& dir) {
  const Json& v = member(obj, path, key, dir);
  if (!v.is_object()) refuse(dir, path.empty() ? key : path + "." + key, "is not an object");
  return v;
}

// A non-negative integer no larger than max (described as max_text in the message).
std::uint64_t count(const Json& v, const std::string& key, std::uint64_t max,
                    const std::string& max_text, const fs::path& dir) {
  const bool ok = v.is_number_unsigned() || (v.is_number_integer() && v.get<std::int64_t>() >= 0);
  if (!ok || v.get<std::uint64_t>() > max) {
    refuse(dir, key, "is " + brief(v) + "; expected an integer in [0, " + max_text + "]");
  }
  return v.get<std::uint64_t>();
}

std::uint64_t count_member(const Json& obj, const std::string& path, const std::string& key,
                           std::uint64_t max, const std::string& max_text, const fs::path& dir) {
  return count(member(obj, path, key, dir), path.empty() ? key : path + "." + key, max, max_text,
               dir);
}

void check_loss_scaler(const Json& s, const fs::path& dir) {
  const std::string k = "loss_scaler";
  if (!s.is_object()) refuse(dir, k, "is not an object");
  const Json& scale = member(s, k, "scale", dir);
  // As a float it must be normal: 1e-46 reads as 0, and 1 / scale (the unscaling) must be finite.
  if (!scale.is_number() || !(scale.get<double>() >= FLT_MIN) || scale.get<double>() > FLT_MAX) {
    refuse(dir, k + ".scale",
           "is " + brief(scale) + "; expected a positive finite float (at least 1.2e-38)");
  }
  count_member(s, k, "good_steps", kMaxCount, "2^53", dir);
  if (s.contains("dynamic") && !s["dynamic"].is_boolean()) {
    refuse(dir, k + ".dynamic", "is " + brief(s["dynamic"]) + "; expected true or false");
  }
}

// N of a folder named as a save names step N's (ckpt::checkpoint_dir_name); none for other
// names.
std::optional<std::uint64_t> step_in_name(const std::string& name) {
  const std::string prefix = kCheckpointPrefix;
  if (name.size() <= prefix.size() || name.size() > prefix.size() + 19 ||
      name.compare(0, prefix.size(), prefix) != 0)
    return {};
  const std::string digits = name.substr(prefix.size());
  if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return {};
  const std::uint64_t n = std::stoull(digits);
  if (ckpt::checkpoint_dir_name(prefix, n) != name) return {};  // a user's copy, e.g. step_2
  return n;
}

}  // namespace

void validate_trainer_state(const Json& state, const fs::path& dir) {
  if (!state.is_object()) {
    throw CheckpointError("checkpoint '" + dir.string() +
                          "': trainer_state.json is not a JSON object; the file is damaged, "
                          "resume from another checkpoint");
  }
  const Json& version = member(state, "", "format_version", dir);
  if (!version.is_number_integer() ||
      version.get<std::int64_t>() < kOldestCheckpointFormatVersion ||
      version.get<std::int64_t>() > kCheckpointFormatVersion) {
    refuse(dir, "format_version",
           "is " + brief(version) + ", an unsupported format version (this offload_train reads " +
               std::to_string(kOldestCheckpointFormatVersion) + " to " +
               std::to_string(kCheckpointFormatVersion) +
               "); the checkpoint was written by another version of offload_train");
  }
  const std::uint64_t step = count_member(state, "", "step", kMaxSteps, "2^40", dir);
  // The folder a save names after its step (a copy under another name is not checked).
  const fs::path folder = dir.filename().empty() ? dir.parent_path() : dir;
  if (const std::optional<std::uint64_t> named = step_in_name(folder.filename().string());
      named && *named != step) {
    refuse(dir, "step",
           "is " + std::to_string(step) + ", but the checkpoint's folder is " +
               folder.filename().string() + ", saved at step " + std::to_string(*named));
  }
  count_member(state, "", "adam_step", step, "step = " + std::to_string(step), dir);
  count_member(state, "", "tokens", kMaxCount, "2^53", dir);
  if (state.contains("gemm_choices") && !state["gemm_choices"].is_string()) {
    refuse(dir, "gemm_choices", "is " + brief(state["gemm_choices"]) + "; expected a string");
  }
  if (state.contains("run_id") && !state["run_id"].is_string()) {
    refuse(dir, "run_id", "is " + brief(state["run_id"]) + "; expected a string");
  }
  if (state.contains("saved_at_ns")) {
    count(state["saved_at_ns"], "saved_at_ns", std::numeric_limits<std::int64_t>::max(), "2^63 - 1",
          dir);
  }

  model::ModelSpec spec;
  try {
    object_member(state, "", "model_spec", dir);
    spec = checkpoint_spec(state);
  } catch (const std::invalid_argument& e) {
    refuse(dir, "model_spec", std::string("is refused: ") + e.what());
  }
  if (version.get<std::int64_t>() >= 2) {  // every save of format 2 records both
    member(state, "", "optimizer_state_dtype", dir);
    member(state, "", "master_weights_dtype", dir);
  }
  if (state.contains("optimizer_state_dtype")) {
    const Json& d = state["optimizer_state_dtype"];
    if (d != "fp32" && d != "bf16" && d != "q8")
      refuse(dir, "optimizer_state_dtype",
             "is " + brief(d) + "; expected \"fp32\", \"bf16\" or \"q8\"");
  }
  if (state.contains("master_weights_dtype")) {
    const Json& d = state["master_weights_dtype"];
    if (d != "fp32" && d != "bf16")
      refuse(dir, "master_weights_dtype", "is " + brief(d) + "; expected \"fp32\" or \"bf16\"");
  }
  // The loader checks its own state against this run's data when it restores it.
  object_member(state, "", "data", dir);
  if (state.contains("loss_scaler")) check_loss_scaler(state["loss_scaler"], dir);
  object_member(state, "", "config", dir);  // its values: restore_run_settings
  if (state.contains("rng")) {
    count_member(object_member(state, "", "rng", dir), "rng", "seed",
                 std::numeric_limits<std::uint64_t>::max(), "2^64 - 1", dir);
  }
  if (state.contains("optimizer_shards")) {
    shard_files(state["optimizer_shards"], spec.num_parameters(), dir);
  }
}

std::vector<ShardFile> shard_files(const Json& shards, std::size_t layout_size,
                                   const fs::path& dir) {
  const std::string k = "optimizer_shards";
  if (!shards.is_object()) refuse(dir, k, "is not an object");
  const std::uint64_t ranks = count_member(shards, k, "ranks", 1u << 20, "2^20", dir);
  const Json& files = member(shards, k, "files", dir);
  if (ranks == 0 || !files.is_array() || files.size() != ranks) {
    refuse(dir, k + ".files",
           "is not an array of one entry per rank (ranks = " + std::to_string(ranks) + ")");
  }
  const std::string L = std::to_string(layout_size);
  std::vector<ShardFile> out(ranks);
  std::vector<std::pair<std::size_t, std::size_t>> all;  // every range of every file
  for (std::size_t r = 0; r < ranks; ++r) {
    const std::string fk = k + ".files[" + std::to_string(r) + "]";
    const Json& f = files[r];
    if (!f.is_object()) refuse(dir, fk, "is not an object");
    if (count_member(f, fk, "rank", ranks, std::to_string(ranks), dir) != r) {
      refuse(dir, fk + ".rank", "is " + brief(f["rank"]) + "; expected " + std::to_string(r));
    }
    // The one name the writer gives rank r's shard: nothing else in the directory can be named.
    ShardFile& s = out[r];
    s.name = "optimizer.rank" + std::to_string(r) + "-of" + std::to_string(ranks) + ".safetensors";
    if (member(f, fk, "file", dir) != s.name) {
      refuse(dir, fk + ".file", "is " + brief(f["file"]) + "; expected \"" + s.name + "\"");
    }
    const Json& ranges = member(f, fk, "ranges", dir);
    if (!ranges.is_array()) refuse(dir, fk + ".ranges", "is not an array");
    for (std::size_t i = 0; i < ranges.size(); ++i) {
      const std::string rk = fk + ".ranges[" + std::to_string(i) + "]";
      const Json& range = ranges[i];
      if (!range.is_array() || range.size() != 2) refuse(dir, rk, "is not [begin, end]");
      const std::size_t b = count(range[0], rk, layout_size, "the layout's " + L, dir);
      const std::size_t e = count(range[1], rk, layout_size, "the layout's " + L, dir);
      if (b >= e || (!s.ranges.empty() && b < s.ranges.back().second)) {
        refuse(dir, rk,
               "is " + brief(range) + "; expected a non-empty range after the file's previous one");
      }
      s.ranges.emplace_back(b, e);
      s.local_size += e - b;
      all.emplace_back(b, e);
    }
  }
  std::sort(all.begin(), all.end());
  std::size_t next = 0;  // the ranges must tile the layout
  for (const auto& [b, e] : all) {
    if (b != next) {
      refuse(dir, k,
             b < next ? "has ranges that overlap at parameter " + std::to_string(b)
                      : "gives parameters [" + std::to_string(next) + ", " + std::to_string(b) +
                            ") to no shard");
    }
    next = e;
  }
  if (next != layout_size) {
    refuse(dir, k, "covers " + std::to_string(next) + " of the layout's " + L + " parameters");
  }
  return out;
}

void expect_only(const ckpt::SafetensorsFile& file, const std::set<std::string>& expected) {
  std::string extra;
  std::size_t n = 0;
  for (const ckpt::TensorInfo& t : file.tensors()) {
    if (expected.count(t.name)) continue;
    if (++n <= 5) extra += (extra.empty() ? "'" : ", '") + t.name + "'";
  }
  if (n == 0) return;
  if (n > 5) extra += ", ... (" + std::to_string(n) + " in all)";
  throw CheckpointError("safetensors file '" + file.path().string() + "': tensor(s) " + extra +
                        " are not part of this checkpoint format, so nothing would read them; "
                        "the file is damaged or not from offload_train. Resume from another "
                        "checkpoint");
}

}  // namespace zo::train
