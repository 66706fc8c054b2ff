#include "train/run_outputs.h"

#include <unistd.h>

#include <fstream>
#include <system_error>

#include "core/error.h"

namespace zo::train {
namespace fs = std::filesystem;

void ensure_writable_dir(const fs::path& dir, const char* flag) {
  const std::string where = std::string(flag) + " '" + dir.string() + "'";
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir)) {
    throw CheckpointError(where + " cannot be created as a directory (" +
                          (ec ? ec.message() : std::string("a file is in the way")) +
                          "); choose another path");
  }
  const fs::path probe = dir / (".offload_train-write-test-" + std::to_string(::getpid()));
  {
    std::ofstream out(probe);
    if (!out || !(out << "x") || !out.flush()) {
      fs::remove(probe, ec);
      throw CheckpointError(where +
                            " is not writable; fix its permissions or choose another "
                            "path");
    }
  }
  fs::remove(probe, ec);
}

void refuse_inside_checkpoint(const fs::path& path, const char* flag) {
  std::error_code ec;
  fs::path dir = fs::weakly_canonical(fs::absolute(path, ec), ec).parent_path();
  for (; !dir.empty(); dir = dir.parent_path()) {
    if (fs::is_regular_file(dir / "MANIFEST.json", ec)) {
      throw CheckpointError(std::string(flag) + " '" + path.string() +
                            "' is inside the checkpoint directory '" + dir.string() +
                            "'; writing there would damage the checkpoint. Choose a path "
                            "outside it");
    }
    if (dir == dir.root_path()) break;
  }
}

void check_output_file(const fs::path& path, const char* flag, bool keep_existing, bool overwrite) {
  refuse_inside_checkpoint(path, flag);
  const fs::path folder = path.parent_path().empty() ? fs::path(".") : path.parent_path();
  ensure_writable_dir(folder, flag);
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (st.type() == fs::file_type::not_found) return;
  const std::string where = std::string(flag) + " '" + path.string() + "'";
  if (!fs::is_regular_file(st)) {
    throw CheckpointError(where + " exists and is not a regular file; choose another path");
  }
  if (keep_existing && !overwrite && fs::file_size(path, ec) > 0) {
    throw CheckpointError(where + " already exists (another run's output?); choose another " +
                          "path, or pass --overwrite to replace it");
  }
  std::ofstream probe(path, std::ios::app);  // opens without truncating
  if (!probe) throw CheckpointError(where + " is not writable; fix its permissions");
}

}  // namespace zo::train
