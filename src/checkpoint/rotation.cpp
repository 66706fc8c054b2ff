// Checkpoint directories by step: naming, listing complete ones, deleting all but the newest,
// and finding leftovers of interrupted writes.
#include "checkpoint/atomic_io.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <system_error>

#include "checkpoint/atomic_io_internal.h"

namespace zo::ckpt {
namespace fs = std::filesystem;

std::string checkpoint_dir_name(std::string_view prefix, std::uint64_t step) {
  char digits[32];
  std::snprintf(digits, sizeof digits, "%08llu", static_cast<unsigned long long>(step));
  return std::string(prefix) + digits;
}

std::vector<CheckpointDir> list_checkpoints(const fs::path& parent, std::string_view prefix) {
  std::vector<CheckpointDir> out;
  std::error_code ec;
  const fs::file_status st = fs::status(parent, ec);
  if (st.type() == fs::file_type::not_found) return out;
  if (!fs::is_directory(st)) {
    throw CheckpointError("checkpoint directory " + quoted(parent) +
                          " is not a directory. Choose another --checkpoint-dir.");
  }
  for (auto it = fs::directory_iterator(parent, ec); !ec && it != fs::end(it); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string_view digits = std::string_view(name).substr(prefix.size());
    if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      continue;  // temporary (".x.tmp-"), ".old-", or unrelated names
    }
    std::uint64_t step = 0;
    const auto [ptr, err] = std::from_chars(digits.data(), digits.data() + digits.size(), step);
    if (err != std::errc() || ptr != digits.data() + digits.size()) continue;
    std::error_code ec2;
    if (!fs::is_directory(it->path(), ec2)) continue;
    if (!fs::is_regular_file(it->path() / kManifestName, ec2)) continue;  // incomplete
    out.push_back({it->path(), step});
  }
  if (ec) {
    throw CheckpointError("cannot list checkpoint directory " + quoted(parent) + ": " +
                          ec.message() + ".");
  }
  std::sort(out.begin(), out.end(), [](const CheckpointDir& a, const CheckpointDir& b) {
    return a.step != b.step ? a.step < b.step : a.path < b.path;
  });
  return out;
}

std::vector<fs::path> rotate_checkpoints(const fs::path& parent, std::string_view prefix,
                                         std::size_t keep_last_n) {
  std::vector<fs::path> deleted;
  if (keep_last_n == 0) return deleted;
  const std::vector<CheckpointDir> all = list_checkpoints(parent, prefix);
  if (all.size() <= keep_last_n) return deleted;
  for (std::size_t i = 0; i + keep_last_n < all.size(); ++i) {
    const fs::path& dir = all[i].path;
    std::error_code ec;
    // Manifest first: from here on the directory counts as incomplete and is never resumed from.
    fs::remove(dir / kManifestName, ec);
    if (!ec) fs::remove_all(dir, ec);
    if (ec) {
      throw CheckpointError("cannot delete old checkpoint " + quoted(dir) + ": " + ec.message() +
                            ". Delete it by hand, or check the permissions of " + quoted(parent) +
                            ".");
    }
    deleted.push_back(dir);
  }
  return deleted;
}

std::vector<fs::path> list_temporary_dirs(const fs::path& parent) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (auto it = fs::directory_iterator(parent, ec); !ec && it != fs::end(it); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.size() > 1 && name[0] == '.' &&
        (name.find(".tmp-") != std::string::npos || name.find(".old-") != std::string::npos)) {
      out.push_back(it->path());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::optional<fs::path> latest_checkpoint(const fs::path& parent, std::string_view prefix) {
  const std::vector<CheckpointDir> all = list_checkpoints(parent, prefix);
  if (all.empty()) return std::nullopt;
  return all.back().path;
}

}  // namespace zo::ckpt
