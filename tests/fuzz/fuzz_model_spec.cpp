// libFuzzer target: a model spec or Hugging Face config.json file, as `--model FILE` reads it
// (load_model_spec), then what the trainer asks of a spec it accepted.
#include <cstddef>
#include <cstdint>
#include <span>

#include "fuzz_common.h"
#include "model/spec.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::filesystem::path file = zo::fuzz::scratch_dir() / "spec.json";
  zo::fuzz::write_file(file, std::span(data, size));
  zo::fuzz::expect_clear_error([&] {
    const zo::model::ModelSpec spec = zo::model::load_model_spec(file.string());
    spec.validate();
    (void)spec.num_parameters();
    // A checkpoint stores the spec as JSON and reads it back as the same architecture.
    const zo::model::ModelSpec again = zo::model::model_spec_from_json(spec.to_json(), "again");
    if (!again.same_architecture(spec)) __builtin_trap();
  });
  return 0;
}
