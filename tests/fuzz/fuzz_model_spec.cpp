// libFuzzer target: a model spec or Hugging Face config.json file, as `--model FILE` reads it
// (load_model_spec), then what the trainer does with a spec it accepted: count its parameters,
// store it in a checkpoint, lay out its parameters.
#include <cstddef>
#include <cstdint>
#include <span>

#include "fuzz_common.h"
#include "model/layout.h"
#include "model/spec.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::filesystem::path file = zo::fuzz::scratch_dir() / "spec.json";
  zo::fuzz::write_file(file, std::span(data, size));
  zo::fuzz::expect_clear_error([&] {
    const zo::model::ModelSpec spec = zo::model::load_model_spec(file.string());
    spec.validate();
    // The parameter count that plans and layouts are sized by, without 64-bit wrap-around.
    const long double C = spec.n_embd, L = spec.n_layer, V = spec.vocab_size;
    long double exact = (V + spec.block_size) * C + L * (12 * C * C + 13 * C) + 2 * C;
    if (spec.llama()) {
      const long double D = spec.head_dim, Q = spec.n_head * D, KV = spec.n_kv_head * D;
      const long double I = spec.intermediate_size;
      const long double per_layer = 2 * C + (Q + 2 * KV) * C + (spec.qkv_bias ? Q + 2 * KV : 0) +
                                    Q * C + (spec.o_bias ? C : 0) + 3 * I * C;
      exact = V * C * (spec.tie_word_embeddings ? 1 : 2) + L * per_layer + C;
    }
    zo::fuzz::require(exact < 0x1p63L && static_cast<long double>(spec.num_parameters()) == exact,
                      "an accepted spec's num_parameters() is not its parameter count");
    // A checkpoint stores the spec as JSON and reads it back as the same architecture.
    const zo::model::ModelSpec again = zo::model::model_spec_from_json(spec.to_json(), "again");
    zo::fuzz::require(again.same_architecture(spec), "the spec's JSON reads back differently");
    // What `plan` and `train` build next from it.
    const zo::model::ParameterLayout layout(spec);
    zo::fuzz::require(layout.size() == spec.num_parameters(), "layout size != num_parameters()");
  });
  return 0;
}
