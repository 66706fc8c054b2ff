// reseal_checkpoint DIR: rewrites DIR's MANIFEST.json over the files DIR holds now, as a writer
// that wrote damaged content would have: the checksums pass and the readers behind them see what
// a test put there. tests/run_asan_inputs.sh uses it on the checkpoints it damages.
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/atomic_io.h"

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  if (argc != 2) {
    std::cerr << "usage: reseal_checkpoint DIR\n";
    return 2;
  }
  try {
    const fs::path dir = argv[1];
    std::vector<std::pair<std::string, std::string>> files;
    for (const auto& e : fs::recursive_directory_iterator(dir)) {
      const std::string rel = e.path().lexically_relative(dir).generic_string();
      if (!e.is_regular_file() || rel == zo::ckpt::kManifestName) continue;
      std::ifstream in(e.path(), std::ios::binary);
      files.emplace_back(rel, std::string(std::istreambuf_iterator<char>(in), {}));
    }
    zo::ckpt::AtomicDirectory out(dir, zo::ckpt::IfExists::kReplace);
    for (const auto& [rel, content] : files)
      out.write_file(rel, content);
    out.commit();
  } catch (const std::exception& e) {
    std::cerr << "reseal_checkpoint: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
