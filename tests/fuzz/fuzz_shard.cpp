// libFuzzer target: an llm.c token shard, as `--data FILE` opens it (header checks, the
// vocabulary scan), then a data loader serving a few batches from it.
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "data/loader.h"
#include "data/shard.h"
#include "data/token_source.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::filesystem::path file = zo::fuzz::scratch_dir() / "in.bin";
  zo::fuzz::write_file(file, std::span(data, size));
  zo::fuzz::expect_clear_error([&] { (void)zo::data::has_shard_magic(file.string()); });
  zo::fuzz::expect_clear_error([&] {
    const zo::data::ShardInfo info = zo::data::validate_shard(file.string());
    zo::fuzz::require(zo::data::kShardHeaderBytes + info.token_bytes * info.num_tokens == size,
                      "an accepted shard's token count does not match its size");
  });
  zo::fuzz::expect_clear_error([&] {
    zo::data::SourceConfig sc;
    sc.path = file.string();
    sc.format = zo::data::DataFormat::kAuto;
    sc.vocab_size = 300;  // some uint16 tokens are out of range
    std::shared_ptr<const zo::data::TokenSource> src = zo::data::open_token_source(sc);
    (void)src->fingerprint().dump();
    zo::data::LoaderConfig lc;
    lc.batch_size = 2;
    lc.seq_len = 3;
    lc.val_fraction = 0.25;
    zo::data::Loaders loaders = zo::data::make_loaders(src, nullptr, lc);
    std::vector<std::int32_t> in, tgt;
    for (int i = 0; i < 3; ++i) {
      loaders.train->next_batch(in, tgt);
      loaders.val->next_batch(in, tgt);
    }
  });
  return 0;
}
