// libFuzzer target: a sharded Hugging Face checkpoint's model.safetensors.index.json, beside the
// micro model's real shards (fixtures.h). SafetensorsSet::open checks it against the shards, every
// tensor it accepts is read, and the directory is imported as the trainer's --init-from would.
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "checkpoint/safetensors_set.h"
#include "fixtures.h"
#include "fuzz_common.h"
#include "model/hf_weights.h"
#include "model/layout.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::filesystem::path dir = zo::fuzz::scratch_dir() / "hf";
  static const std::string fixture_index = zo::fuzz::make_hf_index_fixture(dir);
  (void)fixture_index;  // made once; each input replaces it
  static const zo::model::ParameterLayout layout(zo::fuzz::micro_spec());
  const std::filesystem::path index = dir / "model.safetensors.index.json";
  zo::fuzz::write_file(index, std::span(data, size));
  zo::fuzz::expect_clear_error([&] {
    const auto set = zo::ckpt::SafetensorsSet::open(index);
    for (const zo::ckpt::TensorInfo& t : set.tensors()) {
      zo::fuzz::require(set.file_of(t.name).contains(t.name),
                        "an accepted tensor is not in the file it is read from");
      if (!t.dtype) continue;
      std::vector<float> f32(t.numel);
      zo::fuzz::expect_clear_error([&] { set.read_f32(t.name, f32); });
    }
  });
  zo::fuzz::expect_clear_error([&] {
    std::vector<float> params(layout.size());
    zo::model::import_hf_weights(dir, layout, params);
  });
  return 0;
}
