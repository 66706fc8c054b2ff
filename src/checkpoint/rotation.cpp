// Checkpoint directories by step: naming, listing complete ones, deleting all but the newest,
// and finding leftovers of interrupted writes.
#include "checkpoint/atomic_io.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <optional>
#include <system_error>

#include "checkpoint/atomic_io_internal.h"

namespace zo::ckpt {
namespace fs = std::filesystem;

std::string checkpoint_dir_name(std::string_view prefix, std::uint64_t step) {
  char digits[32];
  std::snprintf(digits, sizeof digits, "%08llu", static_cast<unsigned long long>(step));
  return std::string(prefix) + digits;
}

namespace {

// The step of a directory entry named exactly checkpoint_dir_name(prefix, step); none for every
// other name (temporary ".x.tmp-", ".old-", a user's copy such as step_2 or step_0000000002,
// unrelated), which nothing here lists, rotates or refuses.
std::optional<std::uint64_t> step_of(std::string_view name, std::string_view prefix) {
  if (name.size() <= prefix.size() || name.substr(0, prefix.size()) != prefix) return {};
  const std::string_view digits = name.substr(prefix.size());
  if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return {};
  std::uint64_t step = 0;
  const auto [ptr, err] = std::from_chars(digits.data(), digits.data() + digits.size(), step);
  if (err != std::errc() || ptr != digits.data() + digits.size()) return {};
  if (checkpoint_dir_name(prefix, step) != name) return {};
  return step;
}

bool is_complete(const fs::path& dir) {
  std::error_code ec;
  return fs::is_directory(dir, ec) && fs::is_regular_file(dir / kManifestName, ec);
}

// Every entry of `parent` named <prefix><digits>, complete checkpoint or not.
std::vector<CheckpointDir> step_entries(const fs::path& parent, std::string_view prefix) {
  std::vector<CheckpointDir> out;
  std::error_code ec;
  const fs::file_status st = fs::status(parent, ec);
  if (st.type() == fs::file_type::not_found) return out;
  if (!fs::is_directory(st)) {
    throw CheckpointError("checkpoint directory " + quoted(parent) +
                          " is not a directory. Choose another --checkpoint-dir.");
  }
  for (auto it = fs::directory_iterator(parent, ec); !ec && it != fs::end(it); it.increment(ec)) {
    if (const auto step = step_of(it->path().filename().string(), prefix))
      out.push_back({it->path(), *step});
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

}  // namespace

std::vector<CheckpointDir> list_checkpoints(const fs::path& parent, std::string_view prefix) {
  std::vector<CheckpointDir> out = step_entries(parent, prefix);
  std::erase_if(out, [](const CheckpointDir& d) { return !is_complete(d.path); });
  return out;
}

std::vector<CheckpointDir> list_incomplete(const fs::path& parent, std::string_view prefix) {
  std::vector<CheckpointDir> out = step_entries(parent, prefix);
  std::erase_if(out, [](const CheckpointDir& d) { return is_complete(d.path); });
  return out;
}

fs::path enclosing_checkpoint(const fs::path& dir) {
  std::error_code ec;
  fs::path d = fs::weakly_canonical(fs::absolute(dir, ec), ec);
  for (; !d.empty(); d = d.parent_path()) {
    if (fs::is_regular_file(d / kManifestName, ec)) return d;
    if (d == d.root_path()) break;
  }
  return {};
}

std::vector<fs::path> rotate_checkpoints(const fs::path& parent, std::string_view prefix,
                                         std::size_t keep_last_n,
                                         const std::function<bool(const CheckpointDir&)>& belongs,
                                         const fs::path& protect) {
  std::vector<fs::path> deleted;
  if (keep_last_n == 0) return deleted;
  std::vector<CheckpointDir> ours;
  for (const CheckpointDir& c : list_checkpoints(parent, prefix)) {
    if (!belongs || belongs(c)) ours.push_back(c);
  }
  // Newest first; the protected one is kept whatever its step.
  std::size_t kept = 0;
  for (auto it = ours.rbegin(); it != ours.rend(); ++it) {
    if (!protect.empty() && it->path == protect) ++kept;
  }
  for (auto it = ours.rbegin(); it != ours.rend(); ++it) {
    const fs::path& dir = it->path;
    if (!protect.empty() && dir == protect) continue;
    if (kept < keep_last_n) {
      ++kept;
      continue;
    }
    std::error_code ec;
    // Renamed to a hidden name first (one atomic step), then deleted: a crash midway leaves a
    // hidden ".<name>.del-" directory that nothing lists, never a half-deleted one under its name.
    const fs::path doomed =
        parent / ("." + dir.filename().native() + std::string(kDeletingMarker) + unique_suffix());
    fs::rename(dir, doomed, ec);
    if (!ec) fs::remove_all(doomed, ec);
    if (ec) {
      throw CheckpointError("cannot delete old checkpoint " + quoted(dir) + ": " + ec.message() +
                            ". Delete it by hand, or check the permissions of " + quoted(parent) +
                            ".");
    }
    deleted.push_back(dir);
  }
  std::reverse(deleted.begin(), deleted.end());  // oldest first
  return deleted;
}

std::vector<fs::path> move_checkpoints_aside(const fs::path& parent,
                                             const std::vector<CheckpointDir>& dirs,
                                             const std::string& folder) {
  std::vector<fs::path> moved;
  if (dirs.empty()) return moved;
  const fs::path to = parent / folder;
  std::error_code ec;
  fs::create_directories(to, ec);
  if (ec) {
    throw CheckpointError("cannot create " + quoted(to) + " to move abandoned checkpoints into: " +
                          ec.message() + ". Check the permissions of " + quoted(parent) + ".");
  }
  for (const CheckpointDir& d : dirs) {
    const fs::path target = to / d.path.filename();
    fs::rename(d.path, target, ec);
    if (ec) {
      throw CheckpointError("cannot move " + quoted(d.path) + " to " + quoted(target) + ": " +
                            ec.message() + ". Move it by hand, or check the permissions of " +
                            quoted(parent) + ".");
    }
    moved.push_back(target);
  }
  fsync_dir(to);
  fsync_dir(parent);
  return moved;
}

std::vector<fs::path> list_temporary_dirs(const fs::path& parent) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (auto it = fs::directory_iterator(parent, ec); !ec && it != fs::end(it); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.size() > 1 && name[0] == '.' &&
        (name.find(".tmp-") != std::string::npos ||
         name.find(kSetAsideMarker) != std::string::npos ||
         name.find(kDeletingMarker) != std::string::npos)) {
      out.push_back(it->path());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<CheckpointDir> list_set_aside(const fs::path& parent, std::string_view prefix,
                                          std::string_view marker) {
  std::vector<CheckpointDir> out;
  std::error_code ec;
  for (auto it = fs::directory_iterator(parent, ec); !ec && it != fs::end(it); it.increment(ec)) {
    // ".<name><marker><pid>-<hex>", as unique_suffix() makes them.
    const std::string name = it->path().filename().string();
    const std::size_t at = name.find(marker);
    if (name.size() < 2 || name[0] != '.' || at == std::string::npos) continue;
    const std::string_view suffix = std::string_view(name).substr(at + marker.size());
    if (suffix.empty() || suffix.find_first_not_of("0123456789abcdef-") != std::string::npos)
      continue;
    if (const auto step = step_of(std::string_view(name).substr(1, at - 1), prefix))
      out.push_back({it->path(), *step});
  }
  std::sort(out.begin(), out.end(), [](const CheckpointDir& a, const CheckpointDir& b) {
    return a.step != b.step ? a.step < b.step : a.path < b.path;
  });
  return out;
}

std::optional<fs::path> latest_checkpoint(const fs::path& parent, std::string_view prefix) {
  const std::vector<CheckpointDir> all = list_checkpoints(parent, prefix);
  if (all.empty()) return std::nullopt;
  return all.back().path;
}

}  // namespace zo::ckpt
