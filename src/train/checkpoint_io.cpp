#include "train/checkpoint_io.h"

#include "checkpoint/atomic_io.h"
#include "checkpoint/error.h"
#include "checkpoint/safetensors.h"
#include "model/hf_weights.h"

namespace zo::train {
namespace fs = std::filesystem;

fs::path save_checkpoint(const fs::path& parent, const model::ParameterLayout& layout,
                         offload::HostOptimizer& opt, const nlohmann::json& trainer_state,
                         int keep_last) {
  const auto step = trainer_state.at("step").get<std::uint64_t>();
  ckpt::AtomicDirectory dir(parent / ckpt::checkpoint_dir_name(kCheckpointPrefix, step),
                            ckpt::IfExists::kReplace);
  {
    ckpt::SafetensorsWriter w;
    std::vector<float> scratch;
    model::add_hf_weights(w, layout, opt.master(), DType::kF32, scratch);
    w.set_metadata("format", "pt");
    dir.write_file("model.safetensors", [&](const ckpt::ByteSink& sink) { w.stream(sink); });
  }
  {
    // Moments in HF shapes too, in the state dtype, bit for bit.
    ckpt::SafetensorsWriter w;
    const DType sd = opt.config().state_dtype;
    std::vector<float> f32[2];
    std::vector<std::uint16_t> u16[2];
    const cpu_adam::ArrayView arrays[2] = {opt.exp_avg(), opt.exp_avg_sq()};
    const char* prefixes[2] = {"exp_avg.", "exp_avg_sq."};
    for (int k = 0; k < 2; ++k) {
      (sd == DType::kF32 ? f32[k].resize(layout.size()) : u16[k].resize(layout.size()));
      for (const auto& t : layout.tensors()) {
        if (sd == DType::kF32) {
          model::to_hf(t, static_cast<const float*>(arrays[k].data) + t.offset,
                       f32[k].data() + t.offset);
          w.add(prefixes[k] + t.name, model::hf_shape(t),
                std::span<const float>(f32[k].data() + t.offset, t.numel));
        } else {
          model::to_hf(t, static_cast<const std::uint16_t*>(arrays[k].data) + t.offset,
                       u16[k].data() + t.offset);
          w.add_u16(prefixes[k] + t.name, model::hf_shape(t),
                    std::span<const std::uint16_t>(u16[k].data() + t.offset, t.numel), sd);
        }
      }
    }
    dir.write_file("optimizer.safetensors", [&](const ckpt::ByteSink& sink) { w.stream(sink); });
  }
  nlohmann::json state = trainer_state;
  state["format_version"] = kCheckpointFormatVersion;
  state["adam_step"] = opt.state().step;
  state["optimizer_state_dtype"] = dtype_name(opt.config().state_dtype);
  state["model_spec"] = layout.spec().to_json();
  dir.write_file("trainer_state.json", state.dump(2));
  dir.commit();
  ckpt::rotate_checkpoints(parent, kCheckpointPrefix, static_cast<std::size_t>(keep_last));
  return dir.final_path();
}

fs::path resolve_checkpoint(const std::string& resume, const fs::path& parent) {
  if (resume != "latest") return resume;
  const auto latest = ckpt::latest_checkpoint(parent, kCheckpointPrefix);
  if (!latest) {
    throw ckpt::CheckpointError("--resume latest: no complete checkpoint in '" + parent.string() +
                                "'; start without --resume or point --checkpoint-dir at the "
                                "right directory");
  }
  return *latest;
}

nlohmann::json read_trainer_state(const fs::path& dir) {
  if (!fs::is_directory(dir)) {
    throw ckpt::CheckpointError("checkpoint '" + dir.string() + "' is not a directory");
  }
  ckpt::verify_directory(dir);
  const std::string text = ckpt::read_file(dir / "trainer_state.json");
  nlohmann::json state;
  try {
    state = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw ckpt::CheckpointError("checkpoint '" + dir.string() +
                                "': trainer_state.json is not "
                                "valid JSON (" +
                                e.what() + ")");
  }
  if (!state.contains("format_version") || state["format_version"] != kCheckpointFormatVersion) {
    throw ckpt::CheckpointError("checkpoint '" + dir.string() +
                                "' has an unsupported format "
                                "version; it was written by another version of offload_train");
  }
  return state;
}

model::ModelSpec checkpoint_spec(const nlohmann::json& trainer_state) {
  return model::model_spec_from_json(trainer_state.at("model_spec"), "checkpoint");
}

nlohmann::json load_checkpoint(const fs::path& dir, const model::ParameterLayout& layout,
                               offload::HostOptimizer& opt) {
  nlohmann::json state = read_trainer_state(dir);
  const model::ModelSpec spec = checkpoint_spec(state);
  if (!spec.same_architecture(layout.spec())) {
    throw ckpt::CheckpointError("checkpoint '" + dir.string() + "' is for model " +
                                spec.to_json().dump() + ", but this run builds " +
                                layout.spec().to_json().dump() +
                                "; pass the matching --model or start a new --checkpoint-dir");
  }
  model::import_hf_weights(dir / "model.safetensors", layout, opt.master());
  const auto file = ckpt::SafetensorsFile::open(dir / "optimizer.safetensors");
  const DType sd = opt.config().state_dtype;
  const cpu_adam::ArrayView arrays[2] = {opt.exp_avg(), opt.exp_avg_sq()};
  const char* prefixes[2] = {"exp_avg.", "exp_avg_sq."};
  std::vector<float> f32;
  std::vector<std::uint16_t> u16;
  for (int k = 0; k < 2; ++k) {
    for (const auto& t : layout.tensors()) {
      const std::string name = prefixes[k] + t.name;
      file.expect_shape(name, model::hf_shape(t));
      if (sd == DType::kF32) {
        f32.resize(t.numel);
        file.read_f32(name, f32);
        model::from_hf(t, f32.data(), static_cast<float*>(arrays[k].data) + t.offset);
      } else {
        u16.resize(t.numel);
        file.read_u16(name, u16, sd);
        model::from_hf(t, u16.data(), static_cast<std::uint16_t*>(arrays[k].data) + t.offset);
      }
    }
  }
  opt.state().step = state.at("adam_step").get<std::int64_t>();
  return state;
}

}  // namespace zo::train
