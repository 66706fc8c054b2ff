// libFuzzer target: a safetensors file. SafetensorsFile::open checks the header against the
// file; then every tensor is read in each conversion, and the file is imported as Hugging Face
// GPT-2 weights of the micro model (--init-from), as the trainer would.
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "checkpoint/safetensors.h"
#include "fuzz_common.h"
#include "model/hf_weights.h"
#include "model/layout.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::filesystem::path file = zo::fuzz::scratch_dir() / "in.safetensors";
  static const zo::model::ParameterLayout layout(zo::fuzz::micro_spec());
  zo::fuzz::write_file(file, std::span(data, size));
  zo::fuzz::expect_clear_error([&] {
    const auto st = zo::ckpt::SafetensorsFile::open(file);
    for (const zo::ckpt::TensorInfo& t : st.tensors()) {
      // The header was checked against the file: a tensor's bytes lie inside it.
      zo::fuzz::require(
          8 + st.header_size() + t.data_end <= st.file_size() && st.info(t.name).numel == t.numel,
          "an accepted tensor lies outside the file");
      st.expect_shape(t.name, t.shape);
      if (!t.dtype) continue;
      std::vector<float> f32(t.numel);
      std::vector<std::uint16_t> u16(t.numel);
      zo::fuzz::expect_clear_error([&] { st.read_f32(t.name, f32); });
      zo::fuzz::expect_clear_error([&] { st.read_u16(t.name, u16, zo::DType::kBF16); });
      zo::fuzz::expect_clear_error([&] { st.read_u16(t.name, u16, zo::DType::kF16); });
    }
  });
  zo::fuzz::expect_clear_error([&] {
    std::vector<float> params(layout.size());
    zo::model::import_hf_weights(file, layout, params);
  });
  return 0;
}
