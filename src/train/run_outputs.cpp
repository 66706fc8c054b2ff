#include "train/run_outputs.h"

#include <unistd.h>

#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <span>
#include <system_error>

#include "checkpoint/atomic_io.h"
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

std::string drop_metrics_after(const fs::path& path, std::int64_t step) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return "";
  // Calls line(text, keep) for every line; false when the file's last line lacks its newline.
  const auto read = [&](const std::function<void(const std::string&, bool)>& line) {
    std::ifstream in(path, std::ios::binary);
    std::string text;
    bool newline = true;
    while (std::getline(in, text)) {
      newline = !in.eof();
      const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
      line(text, j.is_object() && j.contains("step") && j["step"].is_number_integer() &&
                     j["step"].get<std::int64_t>() <= step);
    }
    if (in.bad() || !in.eof()) {
      throw CheckpointError("--metrics '" + path.string() +
                            "' cannot be read to continue it; fix its permissions or choose "
                            "another path");
    }
    return newline;
  };
  std::int64_t kept = 0, dropped = 0;
  const bool ends_whole = read([&](const std::string&, bool keep) { ++(keep ? kept : dropped); });
  if (dropped == 0 && ends_whole) return "";
  ckpt::write_file_atomic(path, [&](const ckpt::ByteSink& sink) {
    read([&](const std::string& text, bool keep) {
      if (!keep) return;
      sink(std::as_bytes(std::span(text.data(), text.size())));
      sink(std::as_bytes(std::span("\n", 1)));
    });
  });
  if (dropped == 0) return "";  // only the last line's newline was missing
  return "--metrics '" + path.string() + "': dropped " + std::to_string(dropped) + " line" +
         (dropped == 1 ? "" : "s") + " after step " + std::to_string(step) +
         " (steps this run repeats from its checkpoint, or a line cut short); kept " +
         std::to_string(kept);
}

}  // namespace zo::train
