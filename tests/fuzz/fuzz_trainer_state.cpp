// libFuzzer target: trainer_state.json of a checkpoint directory, resumed as the trainer does:
// read_trainer_state (manifest, every value's type and range), the run settings it restores,
// checkpoint_spec, and for the micro model's architecture load_checkpoint (weights, whole or
// sharded optimizer state) and Session's reads of the step, tokens, data cursor and loss scaler.
// The directory holds a real checkpoint's other files (fixtures.h); MANIFEST.json is rewritten
// for each input so that it always verifies.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "checkpoint/atomic_io.h"
#include "checkpoint/atomic_io_internal.h"
#include "core/crc32c.h"
#include "fixtures.h"
#include "fuzz_common.h"
#include "train/config.h"
#include "train/resume_config.h"

namespace {

struct Fixture {
  std::filesystem::path dir = zo::fuzz::scratch_dir() / "step_00000003";
  zo::ckpt::Manifest manifest;  // of the fixed files; trainer_state.json is added per input
  zo::model::ParameterLayout layout{zo::fuzz::micro_spec()};
  std::unique_ptr<zo::optim::HostOptimizer> opt;
  std::unique_ptr<zo::data::DataLoader> loader = zo::fuzz::synthetic_loader();

  Fixture() {
    zo::fuzz::make_checkpoint_fixture(dir);
    for (const auto& f : std::filesystem::directory_iterator(dir)) {
      const std::string text = zo::ckpt::read_file(f.path());
      manifest.files.push_back({f.path().filename().string(), text.size(), zo::crc32c(text)});
    }
    zo::optim::OptimizerConfig oc;
    oc.threads = 1;
    opt = std::make_unique<zo::optim::HostOptimizer>(layout, oc);
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static Fixture fx;
  const std::string text(reinterpret_cast<const char*>(data), size);
  zo::ckpt::Manifest m = fx.manifest;
  m.files.push_back({"trainer_state.json", text.size(), zo::crc32c(text)});
  std::sort(m.files.begin(), m.files.end(),
            [](const auto& a, const auto& b) { return a.path < b.path; });
  zo::fuzz::write_file(fx.dir / "trainer_state.json", text);
  zo::fuzz::write_file(fx.dir / zo::ckpt::kManifestName, zo::ckpt::manifest_text(m));

  zo::fuzz::expect_clear_error([&] {
    // Session::resolve_model, resuming without --model.
    const nlohmann::json state = zo::train::read_trainer_state(fx.dir);
    zo::train::TrainConfig cfg;
    cfg.model.clear();
    (void)zo::train::restore_run_settings(cfg, state.at("config"));
    (void)state.value("run_id", std::string());
    const zo::model::ModelSpec spec = zo::train::checkpoint_spec(state);
    cfg.validate(spec);
    if (!spec.same_architecture(fx.layout.spec())) return;
    // Session::init_weights. An accepted checkpoint sets every weight and moment: NaN before
    // the load marks what it did not.
    const auto poison = [](float* p, std::size_t n) { std::fill_n(p, n, NAN); };
    const auto all_set = [](const float* p, std::size_t n) {
      return std::none_of(p, p + n, [](float x) { return std::isnan(x); });
    };
    const std::size_t n = fx.opt->size();
    auto* m = static_cast<float*>(fx.opt->exp_avg().data);
    auto* v = static_cast<float*>(fx.opt->exp_avg_sq().data);
    poison(fx.opt->master().data(), n);
    poison(m, n);
    poison(v, n);
    const nlohmann::json st = zo::train::load_checkpoint(fx.dir, fx.layout, *fx.opt);
    zo::fuzz::require(all_set(fx.opt->master().data(), n) && all_set(m, n) && all_set(v, n),
                      "an accepted checkpoint left weights or moments unset");
    (void)st.at("step").get<std::int64_t>();
    (void)st.at("tokens").get<std::int64_t>();
    fx.loader->reset();
    fx.loader->restore(st.at("data"));
    zo::train::LossScaler scaler;
    if (st.contains("loss_scaler")) scaler.restore(st.at("loss_scaler"));
  });
  return 0;
}
