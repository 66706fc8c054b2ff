// libFuzzer target: the data loader's cursor as a checkpoint stores it (trainer_state.json's
// "data"), restored into a loader over two token shards and into one over the synthetic stream,
// each then serving a batch from the restored position.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <vector>

#include "data/loader.h"
#include "fixtures.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::unique_ptr<zo::data::DataLoader> loaders[2] = {
      zo::fuzz::shard_loader(zo::fuzz::make_shard_fixture(zo::fuzz::scratch_dir() / "shards")),
      zo::fuzz::synthetic_loader()};
  zo::fuzz::expect_clear_error([&] {
    const nlohmann::json state = nlohmann::json::parse(data, data + size);
    for (const auto& loader : loaders) {
      zo::fuzz::expect_clear_error([&] {
        loader->reset();
        loader->restore(state);
        std::vector<std::int32_t> in, tgt;
        loader->next_batch(in, tgt);
      });
    }
  });
  return 0;
}
