// libFuzzer target: MANIFEST.json, checked by verify_directory against a checkpoint directory
// of a few files (fixtures.h) before anything of a checkpoint is read.
#include <cstddef>
#include <cstdint>
#include <span>

#include "checkpoint/atomic_io.h"
#include "fixtures.h"
#include "fuzz_common.h"

namespace {

const std::filesystem::path& fixture_dir() {
  static const std::filesystem::path dir = [] {
    const std::filesystem::path d = zo::fuzz::scratch_dir() / "ckpt";
    for (const auto& [name, text] : zo::fuzz::manifest_fixture_files()) {
      std::filesystem::create_directories((d / name).parent_path());
      zo::fuzz::write_file(d / name, text);
    }
    return d;
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::filesystem::path& dir = fixture_dir();
  zo::fuzz::write_file(dir / zo::ckpt::kManifestName, std::span(data, size));
  zo::fuzz::expect_clear_error([&] {
    const zo::ckpt::Manifest m = zo::ckpt::verify_directory(dir);
    for (const zo::ckpt::ManifestEntry& e : m.files) {
      // Every file it vouches for lies inside the directory.
      const auto rel = std::filesystem::relative(std::filesystem::canonical(dir / e.path), dir);
      zo::fuzz::require(!rel.empty() && *rel.begin() != "..",
                        "a manifest entry leaves the directory");
    }
  });
  return 0;
}
