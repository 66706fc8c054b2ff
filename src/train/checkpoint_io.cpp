#include "train/checkpoint_io.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "checkpoint/atomic_io.h"
#include "checkpoint/json_input.h"
#include "checkpoint/safetensors.h"
#include "core/error.h"
#include "model/hf_weights.h"
#include "train/moments_io.h"
#include "train/run_lineage.h"
#include "train/trainer_state.h"

namespace zo::train {
namespace fs = std::filesystem;
namespace {

std::string shard_file_name(int rank, int ranks) {
  return "optimizer.rank" + std::to_string(rank) + "-of" + std::to_string(ranks) + ".safetensors";
}

void load_master(const fs::path& dir, const model::ParameterLayout& layout,
                 optim::HostOptimizer& opt) {
  model::import_hf_weights(dir / "model.safetensors", layout,
                           [&opt](std::size_t offset, std::span<const float> values) {
                             opt.put_master(offset, values);
                           });
}

// model.safetensors: the master weights in HF names and shapes, in their own dtype (fp32 or
// bf16, so that a resume reads them back exactly), and the model spec.
void add_model_metadata(ckpt::SafetensorsWriter& w, const model::ParameterLayout& layout,
                        const model::HfSource& source, DType master) {
  model::add_hf_weights(w, layout, source, master);
  w.set_metadata("format", "pt");
  // The spec again, beside the weights it shapes: read_trainer_state checks the two agree.
  w.set_metadata(std::string(kSpecMetadataKey), layout.spec().to_json().dump());
}

// The whole master weights of a single process as a source.
model::HfSource master_source(optim::HostOptimizer& opt) {
  if (opt.on_drive()) {
    auto read = std::make_shared<model::RangedHfReader<float>>(
        [&opt](std::size_t offset, std::size_t n, float* out) {
          opt.read_master(offset, {out, n});
        });
    return [read](const model::TensorInfo& t, std::uint64_t first, std::span<float> out) {
      (*read)(t, first, out.size(), out.data());
    };
  }
  if (opt.master_dtype() == DType::kF32) return model::hf_source(opt.master());
  const auto* bits = static_cast<const std::uint16_t*>(opt.master_data());
  return [bits](const model::TensorInfo& t, std::uint64_t first, std::span<float> out) {
    for (std::size_t k = 0; k < out.size(); ++k)
      out[k] = bf16_to_float(bits[t.offset + model::ours_index(t, first + k)]);
  };
}

void add_model_file(ckpt::AtomicDirectory& dir, const model::ParameterLayout& layout,
                    optim::HostOptimizer& opt) {
  ckpt::SafetensorsWriter w;
  add_model_metadata(w, layout, master_source(opt), opt.master_dtype());
  dir.write_file("model.safetensors", [&](const ckpt::ByteSink& sink) { w.stream(sink); });
}

// The spec model.safetensors was saved with (its metadata; checkpoints written before it was
// recorded have none) must be trainer_state.json's: the same shapes with another n_head, say,
// would otherwise train, export and sample another model without a word. Its tensors hold the
// master weights in their own dtype: bf16 weights under an fp32 master would resume at a
// precision the run never had.
void check_weights_spec(const fs::path& dir, const nlohmann::json& state) {
  const auto file = ckpt::SafetensorsFile::open(
      dir / "model.safetensors",
      ckpt::safetensors_header_limit(
          4 * model::ParameterLayout(checkpoint_spec(state)).tensors().size()));
  const std::string master = state.value("master_weights_dtype", std::string("fp32"));
  const std::string_view want =
      ckpt::safetensors_dtype_name(master == "bf16" ? DType::kBF16 : DType::kF32);
  for (const ckpt::TensorInfo& t : file.tensors()) {
    if (t.dtype_name == want) continue;
    throw CheckpointError("checkpoint '" + dir.string() + "': model.safetensors holds " + t.name +
                          " as " + t.dtype_name + ", but trainer_state.json says the master " +
                          "weights are " + master + " (" + std::string(want) + "); one of the " +
                          "files was changed after the save. Resume from an earlier checkpoint");
  }
  const auto it = file.metadata().find(std::string(kSpecMetadataKey));
  if (it == file.metadata().end()) {
    if (state.at("format_version").get<std::int64_t>() < 2) return;  // not recorded then
    throw CheckpointError("checkpoint '" + dir.string() +
                          "': model.safetensors does not record the model spec its weights were "
                          "saved with (metadata " +
                          std::string(kSpecMetadataKey) +
                          "), which every checkpoint of format_version 2 does; the file was "
                          "changed after the save. Resume from an earlier checkpoint");
  }
  std::string saved;
  try {
    saved = model::model_spec_from_json(ckpt::parse_json(it->second), "model.safetensors")
                .to_json()
                .dump();
  } catch (const std::exception& e) {
    throw CheckpointError("checkpoint '" + dir.string() + "': model.safetensors' metadata " +
                          std::string(kSpecMetadataKey) + " is not a model spec (" + e.what() +
                          "); the file is damaged. Resume from an earlier checkpoint");
  }
  const std::string stated = checkpoint_spec(state).to_json().dump();
  if (saved != stated) {
    throw CheckpointError("checkpoint '" + dir.string() + "': trainer_state.json's model_spec " +
                          stated + " is not the spec its weights were saved with " + saved +
                          " (model.safetensors); one of the files was changed after the save. "
                          "Resume from an earlier checkpoint");
  }
}

// The moments are in optimizer.safetensors, or in the shards trainer_state.json names: a file of
// the other kind is one no load reads, so the checkpoint is not the one saved.
void check_moment_files(const fs::path& dir, const nlohmann::json& state,
                        const ckpt::Manifest& manifest) {
  const bool sharded = state.contains("optimizer_shards");
  for (const ckpt::ManifestEntry& e : manifest.files) {
    const bool shard = e.path.starts_with("optimizer.rank");
    if ((sharded && e.path == "optimizer.safetensors") || (!sharded && shard)) {
      throw CheckpointError("checkpoint '" + dir.string() + "' holds " + e.path + ", but " +
                            (sharded ? "trainer_state.json places the optimizer state in shards "
                                       "(optimizer_shards)"
                                     : "trainer_state.json names no optimizer shards") +
                            ", so no load would read it: the checkpoint was changed after the "
                            "save. Resume from an earlier checkpoint");
    }
  }
}

nlohmann::json full_state(const nlohmann::json& trainer_state, const model::ParameterLayout& layout,
                          optim::HostOptimizer& opt) {
  nlohmann::json state = trainer_state;
  state["format_version"] = kCheckpointFormatVersion;
  state["adam_step"] = opt.state().step;
  state["optimizer_state_dtype"] = state_format_name(opt.state_format());
  state["master_weights_dtype"] = dtype_name(opt.master_dtype());
  state["model_spec"] = layout.spec().to_json();
  return state;
}

// The model file of a data-parallel checkpoint, which no rank holds whole: rank 0 writes it
// (`dir`, null elsewhere) while every rank takes part in the same all-gathers, one per piece of
// SafetensorsWriter::kFillElements of each tensor in the writer's order (by name). Each rank
// gives the piece's layout elements it owns; rank 0 takes each from its owner. A transposed
// (GPT-2 Conv1D) tensor is gathered whole at its first fill and then served from that copy (at
// most 4 C^2 values). No rank holds more than `ranks` pieces besides. Every collective runs on
// every rank whatever fails, so a failed write on rank 0 leaves no rank waiting; returns this
// rank's failure ("" if none).
class GatheredModelFile {
 public:
  GatheredModelFile(const model::ParameterLayout& layout, optim::HostOptimizer& opt,
                    comm::Communicator& c,
                    const std::vector<std::vector<optim::OwnedRange>>& partitions)
      : layout_(layout), opt_(opt), c_(c) {
    for (int r = 0; r < c.size(); ++r)
      for (const optim::OwnedRange& o : partitions[std::size_t(r)])
        owners_.push_back({o.begin, o.end, r});
    std::sort(owners_.begin(), owners_.end(),
              [](const Owner& a, const Owner& b) { return a.begin < b.begin; });
    for (const auto& t : layout.tensors())
      by_name_.push_back(&t);
    std::sort(
        by_name_.begin(), by_name_.end(),
        [](const model::TensorInfo* a, const model::TensorInfo* b) { return a->name < b->name; });
  }

  std::string write(ckpt::AtomicDirectory* dir) {
    std::string failure;
    if (dir != nullptr) {
      try {
        ckpt::SafetensorsWriter w;
        add_model_metadata(
            w, layout_,
            [this](const model::TensorInfo& t, std::uint64_t first, std::span<float> out) {
              fill(t, first, out);
            },
            opt_.master_dtype());
        dir->write_file("model.safetensors", [&](const ckpt::ByteSink& sink) { w.stream(sink); });
      } catch (const CommError&) {
        throw;
      } catch (const std::exception& e) {
        failure = e.what();
      }
    }
    // The pieces rank 0 did not gather (all of them on the other ranks), in the same order.
    std::size_t step = 0;
    for (const model::TensorInfo* t : by_name_) {
      for (std::uint64_t first = 0; first < t->numel; first += kPiece, ++step) {
        if (step >= steps_) gather(t->offset + first, piece(*t, first), nullptr);
      }
    }
    return failure;
  }

 private:
  static constexpr std::size_t kPiece = ckpt::SafetensorsWriter::kFillElements;
  struct Owner {
    std::size_t begin, end;
    int rank;
  };
  static std::size_t piece(const model::TensorInfo& t, std::uint64_t first) {
    return static_cast<std::size_t>(std::min<std::uint64_t>(kPiece, t.numel - first));
  }

  // Rank 0's fill: HF-order elements [first, first + out.size()) of t.
  void fill(const model::TensorInfo& t, std::uint64_t first, std::span<float> out) {
    if (!t.hf_transposed) {
      gather(t.offset + first, out.size(), out.data());
      return;
    }
    if (whole_of_ != &t) {  // its first fill: the whole tensor, in its pieces
      whole_.resize(t.numel);
      for (std::uint64_t f = 0; f < t.numel; f += kPiece)
        gather(t.offset + f, piece(t, f), whole_.data() + f);
      whole_of_ = &t;
    }
    model::to_hf(t, whole_.data(), first, out.size(), out.data());
  }

  // Layout elements [begin, begin + n): this rank's, all ranks' gathered, rank 0's out.
  void gather(std::size_t begin, std::size_t n, float* out) {
    ++steps_;
    mine_.assign(n, 0.0f);
    opt_.for_owned(begin, n, [&](std::size_t from, std::size_t to, std::size_t k) {
      opt_.read_master(to, {mine_.data() + from, k});
    });
    all_.resize(std::size_t(c_.size()) * n);
    c_.all_gather(mine_.data(), all_.data(), n * sizeof(float));
    if (out == nullptr) return;
    auto it = std::upper_bound(owners_.begin(), owners_.end(), begin,
                               [](std::size_t v, const Owner& o) { return v < o.begin; });
    for (--it; it != owners_.end() && it->begin < begin + n; ++it) {
      const std::size_t lo = std::max(begin, it->begin), hi = std::min(begin + n, it->end);
      std::copy_n(all_.data() + std::size_t(it->rank) * n + (lo - begin), hi - lo,
                  out + (lo - begin));
    }
  }

  const model::ParameterLayout& layout_;
  optim::HostOptimizer& opt_;
  comm::Communicator& c_;
  std::vector<Owner> owners_;  // every rank's ranges, by begin: they tile the layout
  std::vector<const model::TensorInfo*> by_name_;
  std::vector<float> mine_, all_, whole_;
  const model::TensorInfo* whole_of_ = nullptr;  // the transposed tensor in whole_
  std::size_t steps_ = 0;                        // gathers done
};

}  // namespace

fs::path save_checkpoint(const fs::path& parent, const model::ParameterLayout& layout,
                         optim::HostOptimizer& opt, const nlohmann::json& trainer_state,
                         int keep_last) {
  const auto step = trainer_state.at("step").get<std::uint64_t>();
  if (!opt.owns_all())
    throw std::logic_error("save_checkpoint: a partitioned optimizer needs comm");
  const std::string run_id = trainer_state.value("run_id", std::string());
  ckpt::AtomicDirectory dir(parent / ckpt::checkpoint_dir_name(kCheckpointPrefix, step),
                            ckpt::IfExists::kReplace, run_id);
  add_model_file(dir, layout, opt);
  {
    // Moments in HF shapes too, in the state format, bit for bit (moments_io.h).
    ckpt::SafetensorsWriter w;
    add_whole_moments(w, layout, opt);
    dir.write_file("optimizer.safetensors", [&](const ckpt::ByteSink& sink) { w.stream(sink); });
  }
  dir.write_file("trainer_state.json", full_state(trainer_state, layout, opt).dump(2));
  dir.commit();
  rotate_run_checkpoints(parent, run_id, keep_last, dir.final_path());
  return dir.final_path();
}

fs::path save_checkpoint(const fs::path& parent, const model::ParameterLayout& layout,
                         optim::HostOptimizer& opt, const nlohmann::json& trainer_state,
                         int keep_last, comm::Communicator& c,
                         const std::vector<std::vector<optim::OwnedRange>>& partitions) {
  if (c.size() == 1) return save_checkpoint(parent, layout, opt, trainer_state, keep_last);
  const int R = c.size(), r = c.rank();
  if (partitions.size() != std::size_t(R) || partitions[std::size_t(r)] != opt.owned()) {
    throw std::logic_error("save_checkpoint: partitions do not match the ranks");
  }
  const auto step = trainer_state.at("step").get<std::uint64_t>();
  const fs::path final_path = parent / ckpt::checkpoint_dir_name(kCheckpointPrefix, step);

  // Rank 0 makes the temporary directory; every rank writes its shard into it.
  std::optional<ckpt::AtomicDirectory> dir;
  std::string temp, failure;
  if (r == 0) {
    try {
      dir.emplace(final_path, ckpt::IfExists::kReplace,
                  trainer_state.value("run_id", std::string()));
      temp = dir->temp_path().string();
    } catch (const std::exception& e) {
      failure = e.what();
    }
  }
  temp = comm::broadcast_string(c, temp, 0);
  if (temp.empty()) {
    throw CheckpointError(r == 0 ? failure
                                 : "rank 0 could not create the checkpoint directory "
                                   "(its message says why); no checkpoint was written");
  }
  try {
    ckpt::SafetensorsWriter w;
    add_shard_moments(w, opt);
    ckpt::write_file_atomic(fs::path(temp) / shard_file_name(r, R),
                            [&](const ckpt::ByteSink& sink) { w.stream(sink); });
  } catch (const std::exception& e) {
    failure = e.what();
  }
  // Every rank, whatever failed so far: rank 0 writes the gathered model file.
  const std::string model_failure = GatheredModelFile(layout, opt, c, partitions)
                                        .write(r == 0 && failure.empty() ? &*dir : nullptr);
  if (failure.empty()) failure = model_failure;
  try {
    if (r == 0 && failure.empty()) {
      nlohmann::json state = full_state(trainer_state, layout, opt);
      nlohmann::json files = nlohmann::json::array();
      for (int k = 0; k < R; ++k) {
        nlohmann::json ranges = nlohmann::json::array();
        for (const optim::OwnedRange& o : partitions[std::size_t(k)])
          ranges.push_back({o.begin, o.end});
        files.push_back({{"rank", k}, {"file", shard_file_name(k, R)}, {"ranges", ranges}});
      }
      state["optimizer_shards"] = {{"ranks", R}, {"files", files}};
      dir->write_file("trainer_state.json", state.dump(2));
    }
  } catch (const std::exception& e) {
    failure = e.what();
  }
  // Publish only what every rank completed.
  double failed = failure.empty() ? 0.0 : 1.0;
  c.all_reduce(&failed, 1, comm::ReduceOp::kSum);
  if (failed != 0.0) {
    throw CheckpointError(!failure.empty()
                              ? failure
                              : std::to_string(int(failed)) +
                                    " other rank(s) could not write their checkpoint shard (their "
                                    "messages say why); the previous checkpoints are unchanged");
  }
  if (r == 0) {
    try {
      dir->commit();
      rotate_run_checkpoints(parent, trainer_state.value("run_id", std::string()), keep_last,
                             dir->final_path());
    } catch (const std::exception& e) {
      failure = e.what();
    }
  }
  const std::string result = comm::broadcast_string(c, failure.empty() ? "ok" : "", 0);
  if (result.empty()) {
    throw CheckpointError(r == 0 ? failure
                                 : "rank 0 could not publish the checkpoint (its message "
                                   "says why)");
  }
  return final_path;
}

std::size_t checkpoint_buffer_bytes(const model::ParameterLayout& layout, int ranks) {
  std::size_t transposed = 0;
  for (const auto& t : layout.tensors())
    if (t.hf_transposed) transposed = std::max<std::size_t>(transposed, t.numel);
  constexpr std::size_t kFill = ckpt::SafetensorsWriter::kFillElements;
  // Import: a piece (or a transposed tensor) and its pair; a gathered save adds its transposed
  // tensor and ranks + 1 pieces; a writer's piece and its conversion; 8 MiB of file buffers.
  const std::size_t piece = std::max(model::kImportPieceElements, transposed);
  return 4 * (2 * piece + transposed + (std::size_t(ranks) + 3) * kFill) + (std::size_t{8} << 20);
}

std::size_t checkpoint_file_bytes(const model::ParameterLayout& layout, DType master,
                                  StateFormat state) {
  const std::size_t n = layout.size();
  const std::size_t scales =
      state == StateFormat::kQ8 ? 2 * 4 * optim::q8_block_count(layout, {{0, n, 0}}) : 0;
  // Headers: a few hundred bytes of JSON per tensor in each file; trainer_state.json and the
  // manifest are a few KiB.
  const std::size_t headers = 3 * 512 * layout.tensors().size() + (std::size_t{1} << 20);
  return n * (dtype_size(master) + 2 * state_element_bytes(state)) + scales + headers;
}

fs::path resolve_checkpoint(const std::string& value, const fs::path& parent,
                            std::string_view flag) {
  const std::string f(flag);
  if (value != "latest") {
    // A folder of checkpoints rather than one: say how to take its newest.
    std::error_code ec;
    if (fs::is_directory(value, ec) &&
        !fs::exists(fs::path(value) / std::string(ckpt::kManifestName), ec) &&
        !ckpt::list_checkpoints(value, kCheckpointPrefix).empty()) {
      throw CheckpointError("'" + value +
                            "' is a folder of checkpoints, not one; give one of them, or 'latest' "
                            "with --checkpoint-dir " +
                            value + " for its newest");
    }
    return value;
  }
  if (parent.empty()) {
    throw CheckpointError(f +
                          " latest needs --checkpoint-dir, the folder whose newest checkpoint "
                          "to take; or give " +
                          f + " a checkpoint's path");
  }
  std::error_code ec;
  if (fs::exists(parent / std::string(ckpt::kManifestName), ec)) {
    fs::path folder = fs::absolute(parent, ec).lexically_normal();
    if (folder.filename().empty()) folder = folder.parent_path();
    folder = folder.parent_path();
    throw CheckpointError(f + " latest: --checkpoint-dir '" + parent.string() +
                          "' is one checkpoint, not a folder of them; give --checkpoint-dir " +
                          folder.string() + " (its folder) for the newest there" +
                          (f == "--resume"
                               ? ", or --resume " + parent.string() + " with it"
                               : ", or " + f + " " + parent.string() + " for this one"));
  }
  const std::vector<RunCheckpoint> all = run_checkpoints(parent);
  const RunCheckpoint* latest = latest_saved(all);
  if (latest == nullptr) {
    throw CheckpointError(f + " latest: no complete checkpoint in '" + parent.string() + "'; " +
                          (f == "--resume" ? "start without --resume or point " : "point ") +
                          "--checkpoint-dir at the right directory");
  }
  // One whose trainer_state.json cannot be read has no save time: it may be the latest, so an
  // older one is not taken in its place without a word.
  for (const RunCheckpoint& c : all) {
    if (c.unreadable.empty() || c.step < latest->step || &c == latest) continue;
    throw CheckpointError(f + " latest: " + c.path.filename().string() + " in '" + parent.string() +
                          "' is no older than " + latest->path.filename().string() +
                          ", the newest that can be read, but its trainer_state.json cannot be "
                          "read (" +
                          c.unreadable + "), so which one is the latest is unknown. Give " + f +
                          " the checkpoint's path, or move the damaged one out of '" +
                          parent.string() + "'");
  }
  return latest->path;
}

nlohmann::json read_trainer_state(const fs::path& dir, CheckpointUse use) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    throw CheckpointError("checkpoint '" + dir.string() + "' is not a directory");
  }
  static const std::string kWeightFiles[] = {"trainer_state.json", "model.safetensors"};
  const ckpt::Manifest manifest = ckpt::verify_directory(
      dir, use == CheckpointUse::kWeights ? std::span<const std::string>(kWeightFiles)
                                          : std::span<const std::string>());
  const std::string text = ckpt::read_file(dir / "trainer_state.json");
  nlohmann::json state;
  try {
    state = ckpt::parse_json(text);
  } catch (const ckpt::JsonError& e) {
    throw CheckpointError("checkpoint '" + dir.string() +
                          "': trainer_state.json is not valid JSON (" + e.what() + ")");
  }
  validate_trainer_state(state, dir);
  check_weights_spec(dir, state);
  check_moment_files(dir, state, manifest);
  return state;
}

model::ModelSpec checkpoint_spec(const nlohmann::json& trainer_state) {
  return model::model_spec_from_json(trainer_state.at("model_spec"), "checkpoint");
}

std::string init_from_config(const std::string& init_from) {
  std::error_code ec;
  if (!fs::exists(init_from, ec)) {
    throw CheckpointError("--init-from '" + init_from +
                          "' does not exist; give a Hugging Face .safetensors file or model "
                          "directory");
  }
  if (const auto config = model::hf_config_beside(init_from)) return config->string();
  throw std::invalid_argument("--init-from '" + init_from +
                              "': no config.json beside the weights to take the model from; pass "
                              "--model (a preset, a JSON spec or the model's config.json)");
}

void check_checkpoint_model(const fs::path& dir, const nlohmann::json& state,
                            const model::ModelSpec& built) {
  const model::ModelSpec spec = checkpoint_spec(state);
  if (!spec.same_architecture(built)) {
    throw CheckpointError("checkpoint '" + dir.string() + "' is for model " +
                          spec.to_json().dump() + ", but this run builds " +
                          built.to_json().dump() +
                          "; pass the matching --model or start a new --checkpoint-dir");
  }
}

nlohmann::json load_checkpoint(const fs::path& dir, const model::ParameterLayout& layout,
                               optim::HostOptimizer& opt) {
  nlohmann::json state = read_trainer_state(dir);
  check_checkpoint_model(dir, state, layout.spec());
  // The moments first: their files are checked before any tensor is read.
  load_moments(dir, state, layout, opt);
  load_master(dir, layout, opt);
  opt.state().step = state.at("adam_step").get<std::int64_t>();
  return state;
}

}  // namespace zo::train
